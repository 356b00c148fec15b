//! `mosaic init coordinator`, `mosaic enroll host|operator`, `mosaic keys show`: every file
//! a fleet needs, made by Mosaic itself — the private CA, certificates with the names
//! peers dial, Ed25519 signing keys and the coordinator secret (0600), the trust registry
//! that names every key, and each daemon's config.
//!
//! **Owns:** the layout of a coordinator's directory (the CA lives there; enrolment runs
//! there) and of the bundles copied to hosts and operators; the trust registry's writer.
//!
//! **Never:** overwrites a key, a secret or a config without `force`; writes a registry it
//! has not parsed back as valid; puts the CA's private key in a bundle; prints a secret.
//!
//! Layout of `init coordinator --dir D`: `D/coordinator.toml`, `D/trust.toml`,
//! `D/pki/{ca,ca-key,coordinator-NAME,coordinator-NAME-key}.pem`,
//! `D/keys/{coordinator-session,coordinator-ordinary,coordinator-secret}`. A host bundle
//! (`D/hosts/ID/` unless `--out`): `supervisor.toml`, `trust.toml`,
//! `pki/{ca,host-ID,host-ID-key}.pem`, `keys/{host-session,host-ordinary}`; its config
//! names the files where they will be on the host (`--install-dir`, default /etc/mosaic).

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::coordinator::service::CoordinatorConfig;
use crate::pki::{self, Kind, ServerNames};
use crate::protocol::schema::{Purpose, Role, ALL_TYPES};
use crate::protocol::TrustRegistry;

#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    #[error("{}: {detail}", path.display())]
    File { path: PathBuf, detail: String },
    #[error("{0} already exists; pass --force to replace it")]
    Exists(PathBuf),
    #[error("{0}")]
    Usage(String),
    #[error("the trust registry would not be valid: {0}")]
    Registry(String),
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> EnrollError {
    EnrollError::File {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// How long registry entries and certificates made here are valid (days).
pub const DEFAULT_DAYS: i64 = 825;

/// Writes a fresh Ed25519 seed (64 hex digits, 0600) at `path`; refuses an existing file
/// unless `force`. Returns the public key.
pub fn new_seed(path: &Path, force: bool) -> Result<ed25519_dalek::VerifyingKey, EnrollError> {
    if path.exists() && !force {
        return Err(EnrollError::Exists(path.to_path_buf()));
    }
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| file_err(path, format!("random source: {e}")))?;
    if let Some(dir) = path.parent() {
        crate::util::durable::ensure_dir(dir, 0o700).map_err(|e| file_err(dir, e))?;
    }
    // write_atomic's temporary file is 0600 from its creation.
    crate::util::durable::write_atomic(path, hex::encode(b).as_bytes())
        .map_err(|e| file_err(path, e))?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&b).verifying_key())
}

/// The public half of the seed in `path` (`mosaic keys show`).
pub fn public_key(path: &Path) -> Result<ed25519_dalek::VerifyingKey, EnrollError> {
    let seed = crate::coordinator::service::read_seed(path).map_err(|e| file_err(path, e))?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key())
}

fn copy_private(from: &Path, to: &Path, force: bool) -> Result<(), EnrollError> {
    if to.exists() && !force {
        return Err(EnrollError::Exists(to.to_path_buf()));
    }
    let bytes = std::fs::read(from).map_err(|e| file_err(from, e))?;
    crate::util::durable::write_atomic(to, &bytes).map_err(|e| file_err(to, e))
}

fn copy_public(from: &Path, to: &Path) -> Result<(), EnrollError> {
    copy_private(from, to, true)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| file_err(to, e))
}

/// One key to add to the registry.
pub struct KeySpec<'a> {
    pub principal: &'a str,
    pub role: Role,
    pub purpose: Purpose,
    pub audiences: Vec<String>,
    pub trust_domain: &'a str,
    pub public_key: ed25519_dalek::VerifyingKey,
    pub days: i64,
}

/// The registry's (kebab-case) name of a role or purpose.
fn name_of<T: serde::Serialize>(t: T) -> String {
    serde_json::to_value(t)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn role_str(r: Role) -> String {
    name_of(r)
}

fn purpose_str(p: Purpose) -> String {
    name_of(p)
}

/// The trust registry as a TOML document being edited: read, changed, parsed back as a
/// registry, then written atomically.
pub struct RegistryFile {
    path: PathBuf,
    keys: Vec<toml::Table>,
}

impl RegistryFile {
    /// The registry at `path`, or an empty one if there is none yet.
    pub fn open(path: &Path) -> Result<Self, EnrollError> {
        let keys = match std::fs::read_to_string(path) {
            Ok(t) => {
                TrustRegistry::from_toml(&t).map_err(|e| file_err(path, e))?;
                let doc: toml::Table = toml::from_str(&t).map_err(|e| file_err(path, e))?;
                match doc.get("key") {
                    Some(toml::Value::Array(a)) => {
                        a.iter().filter_map(|v| v.as_table().cloned()).collect()
                    }
                    _ => vec![],
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(e) => return Err(file_err(path, e)),
        };
        Ok(Self {
            path: path.to_path_buf(),
            keys,
        })
    }

    fn find(&self, key_id: &str) -> Option<usize> {
        self.keys
            .iter()
            .position(|k| k.get("key_id").and_then(|v| v.as_str()) == Some(key_id))
    }

    /// Adds (or with `force` replaces) the key `<principal>/<purpose>`.
    pub fn add(&mut self, k: &KeySpec<'_>, force: bool) -> Result<String, EnrollError> {
        let purpose = purpose_str(k.purpose);
        let key_id = format!("{}/{purpose}", k.principal);
        // A replaced key keeps whom it could address (a coordinator's new keys still
        // address every enrolled host).
        let mut audiences: Vec<String> = vec![];
        if let Some(i) = self.find(&key_id) {
            if !force {
                return Err(EnrollError::Usage(format!(
                    "{} already names key {key_id}; pass --force to replace it",
                    self.path.display()
                )));
            }
            let old = self.keys.remove(i);
            if let Some(toml::Value::Array(a)) = old.get("audiences") {
                audiences.extend(a.iter().filter_map(|v| v.as_str().map(String::from)));
            }
        }
        for a in &k.audiences {
            if !audiences.contains(a) {
                audiences.push(a.clone());
            }
        }
        let types: Vec<toml::Value> = ALL_TYPES
            .into_iter()
            .filter(|t| t.schema().origin == k.role && t.schema().purpose == k.purpose)
            .map(|t| toml::Value::String(t.as_str().into()))
            .collect();
        let now = std::time::SystemTime::now();
        let day = std::time::Duration::from_secs(86_400);
        let mut t = toml::Table::new();
        let s = |v: &str| toml::Value::String(v.to_string());
        t.insert("key_id".into(), s(&key_id));
        t.insert("principal".into(), s(k.principal));
        t.insert("role".into(), s(&role_str(k.role)));
        t.insert("purpose".into(), s(&purpose));
        t.insert("allowed_types".into(), toml::Value::Array(types));
        t.insert(
            "audiences".into(),
            toml::Value::Array(audiences.iter().map(|a| s(a)).collect()),
        );
        t.insert("trust_domain".into(), s(k.trust_domain));
        // A day back, like the certificates: a clock a little behind still verifies.
        t.insert(
            "not_before".into(),
            s(&humantime::format_rfc3339_seconds(now - day).to_string()),
        );
        t.insert(
            "not_after".into(),
            s(&humantime::format_rfc3339_seconds(now + day * k.days.max(1) as u32).to_string()),
        );
        t.insert("suite".into(), s("ed25519-v1"));
        t.insert(
            "public_key".into(),
            s(&hex::encode(k.public_key.to_bytes())),
        );
        self.keys.push(t);
        Ok(key_id)
    }

    /// Lets every key of `principal` address `audience` too (a newly enrolled host must be
    /// addressable by the coordinator's keys).
    pub fn add_audience(&mut self, principal: &str, audience: &str) -> usize {
        let mut n = 0;
        for k in &mut self.keys {
            if k.get("principal").and_then(|v| v.as_str()) != Some(principal) {
                continue;
            }
            if let Some(toml::Value::Array(a)) = k.get_mut("audiences") {
                if !a.iter().any(|v| v.as_str() == Some(audience)) {
                    a.push(toml::Value::String(audience.into()));
                    n += 1;
                }
            }
        }
        n
    }

    /// The document's text; refused if it would not load as a registry.
    pub fn render(&self) -> Result<String, EnrollError> {
        let mut doc = toml::Table::new();
        doc.insert(
            "key".into(),
            toml::Value::Array(self.keys.iter().cloned().map(toml::Value::Table).collect()),
        );
        let body = toml::to_string(&doc).map_err(|e| EnrollError::Registry(e.to_string()))?;
        let text = format!(
            "# Mosaic trust registry: every key that may sign envelopes (README: Trust registry).\n\
             # Written by `mosaic init` / `mosaic enroll`; coordinators reload it when it changes.\n\n{body}"
        );
        TrustRegistry::from_toml(&text).map_err(|e| EnrollError::Registry(e.to_string()))?;
        Ok(text)
    }

    pub fn save(&self) -> Result<(), EnrollError> {
        let text = self.render()?;
        crate::util::durable::write_atomic(&self.path, text.as_bytes())
            .map_err(|e| file_err(&self.path, e))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| file_err(&self.path, e))
    }
}

/// What `mosaic init coordinator` is told.
#[derive(Debug, Clone)]
pub struct InitCoordinator {
    pub dir: PathBuf,
    pub name: String,
    pub trust_domain: String,
    pub names: ServerNames,
    pub listen: String,
    pub database_url: String,
    pub operator_socket: PathBuf,
    pub operator_listen: Option<String>,
    pub advertise_operator: Option<String>,
    pub state_dir: PathBuf,
    pub days: i64,
    pub force: bool,
}

fn absolute(p: &Path) -> Result<PathBuf, EnrollError> {
    std::path::absolute(p).map_err(|e| file_err(p, e))
}

/// Writes a config: 0600 (a coordinator's `database_url` may hold a password) unless
/// `public`.
fn write_config(path: &Path, text: &str, force: bool, public: bool) -> Result<(), EnrollError> {
    if path.exists() && !force {
        return Err(EnrollError::Exists(path.to_path_buf()));
    }
    // write_atomic's temporary file is 0600 from its creation.
    crate::util::durable::write_atomic(path, text.as_bytes()).map_err(|e| file_err(path, e))?;
    if public {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| file_err(path, e))?;
    }
    Ok(())
}

fn coordinator_toml(c: &CoordinatorConfig) -> String {
    let q = |p: &Path| format!("{:?}", p.display().to_string());
    let mut t = format!(
        "# Written by `mosaic init coordinator` (README: Production). Unknown keys are refused.\n\
         name = {:?}\ntrust_domain = {:?}\nlisten = {:?}\ndatabase_url = {:?}\n\
         secret_file = {}\nstate_dir = {}\nca = {}\ncert = {}\nkey = {}\ntrust_registry = {}\n\
         session_key = {}\nordinary_key = {}\noperator_socket = {}\n",
        c.name,
        c.trust_domain,
        c.listen,
        c.database_url,
        q(&c.secret_file),
        q(c.state_dir.as_deref().unwrap_or(Path::new("."))),
        q(&c.ca),
        q(&c.cert),
        q(&c.key),
        q(&c.trust_registry),
        q(&c.session_key),
        q(&c.ordinary_key),
        q(&c.operator_socket),
    );
    if let Some(o) = &c.operator_listen {
        t.push_str(&format!("operator_listen = {o:?}\n"));
    }
    if let Some(o) = &c.advertise_operator {
        t.push_str(&format!("advertise_operator = {o:?}\n"));
    }
    t.push_str(
        "# Whom harness artifacts (session transcripts) are encrypted to: PRINCIPAL=age1…\n\
         # (`mosaic pki recovery-key --out FILE` makes a pair). None: none is captured.\n",
    );
    let list: Vec<String> = c
        .recovery_recipients
        .iter()
        .map(|r| format!("{r:?}"))
        .collect();
    t.push_str(&format!("recovery_recipients = [{}]\n", list.join(", ")));
    t
}

fn validity(days: i64) -> Result<(time::OffsetDateTime, time::OffsetDateTime), EnrollError> {
    if !(1..=3650).contains(&days) {
        return Err(EnrollError::Usage(
            "validity must be between 1 and 3650 days".into(),
        ));
    }
    let now = time::OffsetDateTime::now_utc();
    Ok((now - pki::BACKDATE, now + time::Duration::days(days)))
}

/// `mosaic init coordinator`: the CA (kept if there is one), this coordinator's
/// certificate, keys and secret, a trust registry with its two keys, and its config.
pub fn init_coordinator(o: &InitCoordinator) -> Result<serde_json::Value, EnrollError> {
    let dir = absolute(&o.dir)?;
    let cfg_path = dir.join("coordinator.toml");
    if cfg_path.exists() && !o.force {
        return Err(EnrollError::Exists(cfg_path));
    }
    let pki_dir = dir.join("pki");
    let keys = dir.join("keys");
    if !pki::ca_cert_path(&pki_dir).exists() {
        pki::init(&pki_dir, false)?;
    }
    let cert = pki::issue_to(
        &pki_dir,
        &pki_dir,
        Kind::Coordinator,
        &o.name,
        &o.names,
        validity(o.days)?,
        o.force,
    )?;
    let principal = format!("coordinator:{}", o.name);
    let session = new_seed(&keys.join("coordinator-session"), o.force)?;
    let ordinary = new_seed(&keys.join("coordinator-ordinary"), o.force)?;
    // The secret is kept even with --force: fence tokens of open reservations and every
    // standby depend on it.
    let secret = keys.join("coordinator-secret");
    if !secret.exists() {
        new_seed(&secret, false)?;
    }
    let trust = dir.join("trust.toml");
    let mut reg = RegistryFile::open(&trust)?;
    for (purpose, public_key) in [(Purpose::Session, session), (Purpose::Ordinary, ordinary)] {
        reg.add(
            &KeySpec {
                principal: &principal,
                role: Role::Coordinator,
                purpose,
                audiences: vec![],
                trust_domain: &o.trust_domain,
                public_key,
                days: o.days,
            },
            true,
        )?;
    }
    // No host is enrolled yet: a key must address someone, so the coordinator's keys
    // name themselves until the first `enroll host` adds it.
    reg.add_audience(&principal, &principal);
    reg.save()?;
    let cfg = CoordinatorConfig {
        name: o.name.clone(),
        trust_domain: o.trust_domain.clone(),
        listen: o.listen.clone(),
        database_url: o.database_url.clone(),
        allow_insecure_database: false,
        secret_file: secret,
        state_dir: Some(o.state_dir.clone()),
        ca: pki::ca_cert_path(&pki_dir),
        cert: cert.cert,
        key: cert.key,
        trust_registry: trust,
        session_key: keys.join("coordinator-session"),
        ordinary_key: keys.join("coordinator-ordinary"),
        recovery_key: None,
        operator_socket: o.operator_socket.clone(),
        lease_ms: None,
        reservation_ttl_ms: None,
        lease_ttl_ms: None,
        operator_listen: o.operator_listen.clone(),
        advertise_operator: o.advertise_operator.clone(),
        heartbeat_ms: None,
        max_clock_skew_ms: None,
        metrics_listen: None,
        checkpoint_store_max_bytes: None,
        checkpoint_retention_s: None,
        artifact_retention_s: None,
        recovery_recipients: vec![],
        notify_command: None,
        notify_webhook: None,
    };
    write_config(&cfg_path, &coordinator_toml(&cfg), o.force, false)?;
    Ok(json!({
        "config": cfg_path,
        "principal": principal,
        "trust_registry": cfg.trust_registry,
        "certificate": cfg.cert,
        "session_key": hex::encode(session.to_bytes()),
        "ordinary_key": hex::encode(ordinary.to_bytes()),
        "next": format!("mosaic enroll host HOST_ID --dir {} --coordinator ADDRESS", dir.display()),
    }))
}

/// The configuration of the coordinator in `dir` (made by `init coordinator`).
pub fn coordinator_of(dir: &Path) -> Result<(PathBuf, CoordinatorConfig), EnrollError> {
    let path = dir.join("coordinator.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| file_err(&path, e))?;
    let cfg = toml::from_str(&text).map_err(|e| file_err(&path, e))?;
    Ok((path, cfg))
}

/// What `init coordinator --standby-of` is told.
#[derive(Debug, Clone)]
pub struct InitStandby {
    pub dir: PathBuf,
    /// The leader's directory (its CA signs the standby's certificate).
    pub leader_dir: PathBuf,
    pub names: ServerNames,
    pub listen: String,
    pub operator_socket: PathBuf,
    pub operator_listen: Option<String>,
    pub advertise_operator: Option<String>,
    pub state_dir: PathBuf,
    pub days: i64,
    pub force: bool,
}

/// A standby of the coordinator in `leader_dir`: the same name, trust domain, database,
/// secret and signing keys (it acts as the same principal once it leads), its own
/// certificate (its own DNS names), and a copy of the trust registry.
pub fn init_standby(o: &InitStandby) -> Result<serde_json::Value, EnrollError> {
    let dir = absolute(&o.dir)?;
    let (_, leader) = coordinator_of(&o.leader_dir)?;
    let cfg_path = dir.join("coordinator.toml");
    if cfg_path.exists() && !o.force {
        return Err(EnrollError::Exists(cfg_path));
    }
    let ca_dir = leader
        .ca
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let (pki_dir, keys) = (dir.join("pki"), dir.join("keys"));
    crate::util::durable::ensure_dir(&keys, 0o700).map_err(|e| file_err(&keys, e))?;
    // Hosts check every coordinator they dial against one name (their `server_name`, the
    // leader's): the standby's certificate carries the leader's names besides its own.
    let leader_pem =
        std::fs::read_to_string(&leader.cert).map_err(|e| file_err(&leader.cert, e))?;
    let (dns, ips) = pki::server_names_of(&leader_pem).ok_or_else(|| {
        file_err(
            &leader.cert,
            "no subject alternative names could be read from it",
        )
    })?;
    let mut names = o.names.clone();
    for d in dns {
        if !names.dns.contains(&d) {
            names.dns.push(d);
        }
    }
    for i in ips {
        if !names.ips.contains(&i) {
            names.ips.push(i);
        }
    }
    let cert = pki::issue_to(
        &ca_dir,
        &pki_dir,
        Kind::Coordinator,
        &leader.name,
        &names,
        validity(o.days)?,
        o.force,
    )?;
    copy_public(&leader.ca, &pki::ca_cert_path(&pki_dir))?;
    let mut cfg = leader.clone();
    for (from, name) in [
        (&leader.secret_file, "coordinator-secret"),
        (&leader.session_key, "coordinator-session"),
        (&leader.ordinary_key, "coordinator-ordinary"),
    ] {
        copy_private(from, &keys.join(name), o.force)?;
    }
    let trust = dir.join("trust.toml");
    copy_public(&leader.trust_registry, &trust)?;
    cfg.secret_file = keys.join("coordinator-secret");
    cfg.session_key = keys.join("coordinator-session");
    cfg.ordinary_key = keys.join("coordinator-ordinary");
    cfg.ca = pki::ca_cert_path(&pki_dir);
    cfg.cert = cert.cert;
    cfg.key = cert.key;
    cfg.trust_registry = trust;
    cfg.listen = o.listen.clone();
    cfg.operator_socket = o.operator_socket.clone();
    cfg.operator_listen = o.operator_listen.clone();
    cfg.advertise_operator = o.advertise_operator.clone();
    cfg.state_dir = Some(o.state_dir.clone());
    cfg.metrics_listen = None;
    write_config(&cfg_path, &coordinator_toml(&cfg), o.force, false)?;
    Ok(json!({
        "config": cfg_path,
        "principal": format!("coordinator:{}", cfg.name),
        "standby_of": absolute(&o.leader_dir)?,
        "note": "the standby shares the leader's secret and signing keys: copy this directory to the standby's machine as it is (0600 files stay 0600), and copy the leader's trust.toml over its trust.toml after every enrolment",
    }))
}

/// What `mosaic enroll host` is told.
#[derive(Debug, Clone)]
pub struct EnrollHost {
    /// The coordinator's directory (`init coordinator --dir`).
    pub dir: PathBuf,
    pub host_id: String,
    /// Coordinator addresses, the leader's first (the rest become `fallback_addresses`).
    pub addresses: Vec<String>,
    /// The name the coordinator's certificate is checked against (default: the host part
    /// of the first address).
    pub server_name: Option<String>,
    pub out: Option<PathBuf>,
    /// Where the bundle's files will be on the host (default /etc/mosaic).
    pub install_dir: PathBuf,
    pub lanes: Vec<String>,
    pub state_dir: PathBuf,
    pub runtime_dir: PathBuf,
    pub cgroup_root: Option<PathBuf>,
    pub days: i64,
    pub force: bool,
}

/// `mosaic enroll host`: the host's certificate and keys, its keys in the registry (and it
/// an audience of the coordinator's), and a bundle with its supervisor config.
pub fn enroll_host(o: &EnrollHost) -> Result<serde_json::Value, EnrollError> {
    let dir = absolute(&o.dir)?;
    let (_, c) = coordinator_of(&dir)?;
    crate::supervisor::names::HostId::parse(&o.host_id)
        .map_err(|e| EnrollError::Usage(format!("host id {:?}: {e}", o.host_id)))?;
    let Some(first) = o.addresses.first() else {
        return Err(EnrollError::Usage(
            "give the coordinator's address (--coordinator HOST:PORT)".into(),
        ));
    };
    let server_name = match &o.server_name {
        Some(s) => s.clone(),
        None => first
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
            .ok_or_else(|| EnrollError::Usage(format!("{first:?} is not HOST:PORT")))?,
    };
    let out = absolute(
        &o.out
            .clone()
            .unwrap_or_else(|| dir.join("hosts").join(&o.host_id)),
    )?;
    let (pki_dir, keys) = (out.join("pki"), out.join("keys"));
    let ca_dir = c.ca.parent().map(Path::to_path_buf).unwrap_or_default();
    let principal = format!("host:{}", o.host_id);
    let coordinator = format!("coordinator:{}", c.name);
    let mut reg = RegistryFile::open(&c.trust_registry)?;
    let mut publics = vec![];
    for purpose in [Purpose::Session, Purpose::Ordinary] {
        let seed = keys.join(format!("host-{}", purpose_str(purpose)));
        publics.push((purpose, new_seed(&seed, o.force)?));
    }
    for (purpose, public_key) in &publics {
        reg.add(
            &KeySpec {
                principal: &principal,
                role: Role::Host,
                purpose: *purpose,
                audiences: vec![coordinator.clone()],
                trust_domain: &c.trust_domain,
                public_key: *public_key,
                days: o.days,
            },
            o.force,
        )?;
    }
    reg.add_audience(&coordinator, &principal);
    let cert = pki::issue_to(
        &ca_dir,
        &pki_dir,
        Kind::Host,
        &o.host_id,
        &ServerNames::default(),
        validity(o.days)?,
        o.force,
    )?;
    // The registry is written last: a failure before leaves it as it was.
    reg.save()?;
    copy_public(&c.ca, &pki::ca_cert_path(&pki_dir))?;
    copy_public(&c.trust_registry, &out.join("trust.toml"))?;
    let at = |p: &Path| -> PathBuf { o.install_dir.join(p.strip_prefix(&out).unwrap_or(p)) };
    let file = crate::supervisor::config::ConfigFile {
        host_id: Some(o.host_id.clone()),
        cgroup_root: o.cgroup_root.clone(),
        lanes: o.lanes.clone(),
        coordinator: Some(crate::supervisor::config::CoordinatorLink {
            address: first.clone(),
            fallback_addresses: o.addresses[1..].to_vec(),
            server_name,
            principal: coordinator.clone(),
            trust_domain: c.trust_domain.clone(),
            ca: at(&pki::ca_cert_path(&pki_dir)),
            cert: at(&cert.cert),
            key: at(&cert.key),
            trust_registry: at(&out.join("trust.toml")),
            session_key: at(&keys.join("host-session")),
            ordinary_key: at(&keys.join("host-ordinary")),
            recovery_key: None,
            heartbeat_ms: None,
            max_clock_skew_ms: None,
        }),
        ..crate::supervisor::config::ConfigFile::new(o.state_dir.clone(), o.runtime_dir.clone())
    };
    let text = toml::to_string(&file).map_err(|e| EnrollError::Usage(e.to_string()))?;
    let cfg_path = out.join("supervisor.toml");
    write_config(
        &cfg_path,
        &format!(
            "# Written by `mosaic enroll host {}` (README: Production).\n{text}",
            o.host_id
        ),
        true,
        true,
    )?;
    Ok(json!({
        "principal": principal,
        "bundle": out,
        "config": cfg_path,
        "install_dir": o.install_dir,
        "trust_registry": c.trust_registry,
        "session_key": hex::encode(publics[0].1.to_bytes()),
        "ordinary_key": hex::encode(publics[1].1.to_bytes()),
        "next": format!("copy {} to {} on the host, then: mosaic supervisor --config {}", out.display(), o.install_dir.display(), o.install_dir.join("supervisor.toml").display()),
    }))
}

/// `mosaic enroll operator`: an operator's client certificate and the CA, in a bundle.
pub fn enroll_operator(
    dir: &Path,
    name: &str,
    out: Option<&Path>,
    days: i64,
    force: bool,
) -> Result<serde_json::Value, EnrollError> {
    let dir = absolute(dir)?;
    let (_, c) = coordinator_of(&dir)?;
    let out = absolute(
        &out.map(Path::to_path_buf)
            .unwrap_or_else(|| dir.join("operators").join(name)),
    )?;
    let ca_dir = c.ca.parent().map(Path::to_path_buf).unwrap_or_default();
    let cert = pki::issue_to(
        &ca_dir,
        &out,
        Kind::Operator,
        name,
        &ServerNames::default(),
        validity(days)?,
        force,
    )?;
    let ca = pki::ca_cert_path(&out);
    copy_public(&c.ca, &ca)?;
    Ok(json!({
        "principal": format!("operator:{name}"),
        "bundle": out,
        "ca": ca,
        "cert": cert.cert,
        "key": cert.key,
        "next": format!("mosaic status --coordinator tls://COORDINATOR:PORT --ca {} --cert {} --key {}", ca.display(), cert.cert.display(), cert.key.display()),
    }))
}
