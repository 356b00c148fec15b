//! Everything `mosaic up` makes before anything starts: the private CA and certificates,
//! each daemon's keys and secret (0600), and the trust registry naming them.

use super::*;

/// What `provision` made: the coordinator's config and the supervisor's link to it.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub coordinator: crate::coordinator::service::CoordinatorConfig,
    /// One link per host, in the order the host ids were given.
    pub links: Vec<crate::supervisor::config::CoordinatorLink>,
}

pub(super) fn write_secret_file(path: &std::path::Path) -> Result<(), UpError> {
    if path.exists() {
        return Ok(());
    }
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| UpError::Usage(format!("random source: {e}")))?;
    crate::util::durable::create_new(path, hex::encode(b).as_bytes())
        .map_err(|e| UpError::Usage(e.to_string()))
}

/// Where `mosaic up` keeps the local operator's recovery identity (decrypts harness
/// artifacts: `mosaic checkpoint artifact DIGEST --identity <this>`).
pub fn recovery_identity(dir: &std::path::Path) -> PathBuf {
    dir.join("keys").join("recovery-identity.txt")
}

/// Makes (once) the PKI, the signing keys, the coordinator secret and the trust registry
/// for one coordinator (`coordinator:main`) and the given hosts, under `dir`. Each host
/// has its own certificate and its own session and ordinary keys; the coordinator's keys
/// may address every one of them.
pub fn provision(
    dir: &std::path::Path,
    host_ids: &[String],
    database_url: &str,
    listen: &str,
) -> Result<Provisioned, UpError> {
    use crate::pki::{self, Kind};
    let usage = |e: &dyn std::fmt::Display| UpError::Usage(e.to_string());
    let pki_dir = dir.join("pki");
    if !pki::ca_cert_path(&pki_dir).exists() {
        pki::init(&pki_dir, false).map_err(|e| usage(&e))?;
    }
    let issue = |kind, name: &str| -> Result<(PathBuf, PathBuf), UpError> {
        let stem = format!("{}-{name}", kind_str(kind));
        let (cert, key) = (
            pki_dir.join(format!("{stem}.pem")),
            pki_dir.join(format!("{stem}-key.pem")),
        );
        if !cert.exists() {
            pki::issue(&pki_dir, kind, name, 3650, false).map_err(|e| usage(&e))?;
        }
        Ok((cert, key))
    };
    let (c_cert, c_key) = issue(Kind::Coordinator, "main")?;
    let keys = dir.join("keys");
    crate::util::durable::ensure_dir(&keys, 0o700).map_err(|e| usage(&e))?;
    for n in [
        "coordinator-session",
        "coordinator-ordinary",
        "coordinator-recovery",
        "coordinator-secret",
    ] {
        write_secret_file(&keys.join(n))?;
    }
    for h in host_ids {
        for purpose in ["session", "ordinary", "recovery"] {
            write_secret_file(&keys.join(format!("host-{h}-{purpose}")))?;
        }
    }
    // The local operator's recovery identity: harness artifacts are encrypted to it.
    let recovery = crate::artifact_recovery::recovery_key(&recovery_identity(dir), true)
        .map_err(|e| usage(&e))?;
    let coordinator = "coordinator:main".to_string();
    let hosts: Vec<String> = host_ids.iter().map(|h| format!("host:{h}")).collect();
    let domain = "mosaic.local".to_string();
    let mut trust = String::from(
        "# Written by `mosaic up`: the keys of this machine's coordinator and hosts.\n",
    );
    let mut entries: Vec<(String, String, &str, &str, Vec<String>)> = vec![
        (
            "coordinator-session".into(),
            coordinator.clone(),
            "coordinator",
            "session",
            hosts.clone(),
        ),
        (
            "coordinator-ordinary".into(),
            coordinator.clone(),
            "coordinator",
            "ordinary",
            hosts.clone(),
        ),
        // Recovery (spec §7.3/§7.4): its own keys, which sign nothing else.
        (
            "coordinator-recovery".into(),
            coordinator.clone(),
            "coordinator",
            "recovery",
            hosts.clone(),
        ),
    ];
    for (h, principal) in host_ids.iter().zip(&hosts) {
        for (purpose, role) in [
            ("session", "host"),
            ("ordinary", "host"),
            ("recovery", "candidate"),
        ] {
            entries.push((
                format!("host-{h}-{purpose}"),
                principal.clone(),
                role,
                purpose,
                vec![coordinator.clone()],
            ));
        }
    }
    for (file, principal, role, purpose, audiences) in entries {
        let seed =
            crate::coordinator::service::read_seed(&keys.join(file)).map_err(|e| usage(&e))?;
        let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
        let types: Vec<String> = crate::protocol::schema::ALL_TYPES
            .into_iter()
            .filter(|t| {
                format!("{:?}", t.schema().origin).to_lowercase() == role
                    && format!("{:?}", t.schema().purpose).to_lowercase() == purpose
            })
            .map(|t| format!("{:?}", t.as_str()))
            .collect();
        let audiences: Vec<String> = audiences.iter().map(|a| format!("{a:?}")).collect();
        trust.push_str(&format!(
            "\n[[key]]\nkey_id = \"{principal}/{purpose}\"\nprincipal = \"{principal}\"\nrole = \"{role}\"\npurpose = \"{purpose}\"\nallowed_types = [{}]\naudiences = [{}]\ntrust_domain = \"{domain}\"\nnot_before = \"2020-01-01T00:00:00Z\"\nnot_after = \"2100-01-01T00:00:00Z\"\nsuite = \"ed25519-v1\"\npublic_key = \"{}\"\n",
            types.join(", "),
            audiences.join(", "),
            hex::encode(public.to_bytes())
        ));
    }
    let trust_path = dir.join("trust.toml");
    crate::util::durable::write_atomic(&trust_path, trust.as_bytes()).map_err(|e| usage(&e))?;
    let ca = pki::ca_cert_path(&pki_dir);
    let mut links = Vec::new();
    for h in host_ids {
        let (h_cert, h_key) = issue(Kind::Host, h)?;
        links.push(crate::supervisor::config::CoordinatorLink {
            address: listen.into(),
            fallback_addresses: vec![],
            server_name: "localhost".into(),
            principal: coordinator.clone(),
            trust_domain: domain.clone(),
            ca: ca.clone(),
            cert: h_cert,
            key: h_key,
            trust_registry: trust_path.clone(),
            session_key: keys.join(format!("host-{h}-session")),
            ordinary_key: keys.join(format!("host-{h}-ordinary")),
            recovery_key: Some(keys.join(format!("host-{h}-recovery"))),
            heartbeat_ms: None,
            max_clock_skew_ms: None,
        });
    }
    Ok(Provisioned {
        coordinator: crate::coordinator::service::CoordinatorConfig {
            name: "main".into(),
            trust_domain: domain,
            listen: listen.into(),
            database_url: database_url.into(),
            allow_insecure_database: false,
            secret_file: keys.join("coordinator-secret"),
            state_dir: None,
            ca,
            cert: c_cert,
            key: c_key,
            trust_registry: trust_path,
            session_key: keys.join("coordinator-session"),
            ordinary_key: keys.join("coordinator-ordinary"),
            recovery_key: Some(keys.join("coordinator-recovery")),
            operator_socket: coordinator_socket(dir),
            lease_ms: Some(10_000),
            reservation_ttl_ms: None,
            lease_ttl_ms: None,
            operator_listen: None,
            advertise_operator: None,
            heartbeat_ms: None,
            max_clock_skew_ms: None,
            metrics_listen: None,
            checkpoint_store_max_bytes: None,
            checkpoint_retention_s: None,
            artifact_retention_s: None,
            recovery_recipients: vec![format!("operator:local={recovery}")],
            notify_command: None,
            notify_webhook: None,
        },
        links,
    })
}

pub(super) fn kind_str(k: crate::pki::Kind) -> &'static str {
    k.as_str()
}
