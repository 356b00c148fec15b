//! `mosaic pki`: a private CA and the certificates coordinators, hosts and operators use
//! for mutual TLS.
//!
//! **Owns:** key generation, certificate issuance, key-file permissions, and reading a
//! principal back out of a certificate.
//!
//! **Never:** overwrites an existing key or certificate without `force`, writes a private
//! key readable by anyone but its owner, or treats a certificate as message authority (it
//! only names the transport peer; envelopes carry their own proofs).
//!
//! Each certificate names its principal in a URI subject-alternative name,
//! `urn:mosaic:<kind>:<name>`; the transport maps that to `<kind>:<name>`, the principal
//! the trust registry knows.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{0} already exists; pass --force to replace it")]
    Exists(PathBuf),
    #[error("no CA in {0}; run `mosaic pki init --dir {0}` first")]
    NoCa(PathBuf),
    #[error("invalid {kind} name {name:?}: use 1-64 characters from a-z, A-Z, 0-9, '.', '-', '_'")]
    BadName { kind: &'static str, name: String },
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("validity must be between 1 and 3650 days")]
    BadValidity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Coordinator,
    Host,
    Operator,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Coordinator => "coordinator",
            Kind::Host => "host",
            Kind::Operator => "operator",
        }
    }
}

/// Paths of one issued identity.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub principal: String,
}

pub fn ca_cert_path(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}
fn ca_key_path(dir: &Path) -> PathBuf {
    dir.join("ca-key.pem")
}

fn check_name(kind: Kind, name: &str) -> Result<(), PkiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(PkiError::BadName {
            kind: kind.as_str(),
            name: name.into(),
        })
    }
}

fn refuse_existing(paths: &[&Path], force: bool) -> Result<(), PkiError> {
    if !force {
        if let Some(p) = paths.iter().find(|p| p.exists()) {
            return Err(PkiError::Exists(p.to_path_buf()));
        }
    }
    Ok(())
}

fn write(path: &Path, data: &str, mode: u32) -> Result<(), PkiError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |what, source| PkiError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| io("create", e))?;
    f.write_all(data.as_bytes()).map_err(|e| io("write", e))?;
    f.sync_all().map_err(|e| io("fsync", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("rename", e))?;
    crate::util::durable::sync_dir(path.parent().unwrap_or(Path::new(".")))
        .map_err(|e| io("fsync dir", std::io::Error::other(e.to_string())))
}

/// Creates a private CA in `dir` (`ca.pem`, `ca-key.pem`).
pub fn init(dir: &Path, force: bool) -> Result<PathBuf, PkiError> {
    let (cert, key) = (ca_cert_path(dir), ca_key_path(dir));
    refuse_existing(&[&cert, &key], force)?;
    std::fs::create_dir_all(dir).map_err(|source| PkiError::Io {
        what: "mkdir",
        path: dir.into(),
        source,
    })?;
    let kp = KeyPair::generate()?;
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::CommonName, "Mosaic private CA");
    p.distinguished_name
        .push(DnType::OrganizationName, "Mosaic");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    p.not_before = now - BACKDATE;
    p.not_after = now + Duration::days(3650);
    let c = p.self_signed(&kp)?;
    write(&key, &kp.serialize_pem(), 0o600)?;
    write(&cert, &c.pem(), 0o644)?;
    Ok(cert)
}

/// How far back a new certificate's validity starts. A peer whose clock is behind the
/// issuer's still completes TLS, so the session's own clock check (which measures the
/// offset against the coordinator's database time and names it) is what refuses a skew
/// beyond the transport tolerance — not an unexplained "certificate not valid yet".
pub const BACKDATE: Duration = Duration::days(1);

/// Issues a certificate for `kind:name`, valid for `days` from now.
pub fn issue(
    dir: &Path,
    kind: Kind,
    name: &str,
    days: i64,
    force: bool,
) -> Result<Issued, PkiError> {
    if !(1..=3650).contains(&days) {
        return Err(PkiError::BadValidity);
    }
    let now = OffsetDateTime::now_utc();
    issue_with_validity(
        dir,
        kind,
        name,
        now - BACKDATE,
        now + Duration::days(days),
        force,
    )
}

/// Issues with an explicit validity window (tests use it to make expired certificates).
pub fn issue_with_validity(
    dir: &Path,
    kind: Kind,
    name: &str,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    force: bool,
) -> Result<Issued, PkiError> {
    issue_to(
        dir,
        dir,
        kind,
        name,
        &ServerNames::default(),
        (not_before, not_after),
        force,
    )
}

/// The names a coordinator's certificate is reachable by, besides its own name,
/// `localhost` and 127.0.0.1: the DNS names and addresses hosts and operators dial.
#[derive(Debug, Clone, Default)]
pub struct ServerNames {
    pub dns: Vec<String>,
    pub ips: Vec<std::net::IpAddr>,
}

/// Issues `kind:name` from the CA in `ca_dir` into `out_dir` (`<kind>-<name>.pem` and
/// `-key.pem`), valid over `validity`; a coordinator's certificate also names `names`.
pub fn issue_to(
    ca_dir: &Path,
    out_dir: &Path,
    kind: Kind,
    name: &str,
    names: &ServerNames,
    validity: (OffsetDateTime, OffsetDateTime),
    force: bool,
) -> Result<Issued, PkiError> {
    let (not_before, not_after) = validity;
    let dir = ca_dir;
    check_name(kind, name)?;
    let stem = format!("{}-{name}", kind.as_str());
    let cert_path = out_dir.join(format!("{stem}.pem"));
    let key_path = out_dir.join(format!("{stem}-key.pem"));
    refuse_existing(&[&cert_path, &key_path], force)?;
    let ca_pem =
        std::fs::read_to_string(ca_cert_path(dir)).map_err(|_| PkiError::NoCa(dir.into()))?;
    let ca_key =
        std::fs::read_to_string(ca_key_path(dir)).map_err(|_| PkiError::NoCa(dir.into()))?;
    std::fs::create_dir_all(out_dir).map_err(|source| PkiError::Io {
        what: "mkdir",
        path: out_dir.into(),
        source,
    })?;
    let ca_kp = KeyPair::from_pem(&ca_key)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_kp)?;

    let kp = KeyPair::generate()?;
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::CommonName, format!("{}:{name}", kind.as_str()));
    p.subject_alt_names = vec![SanType::URI(
        format!("urn:mosaic:{}:{name}", kind.as_str()).try_into()?,
    )];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = match kind {
        Kind::Coordinator => {
            // The coordinator serves TLS: reachable by its name and on loopback.
            p.subject_alt_names.push(SanType::DnsName(name.try_into()?));
            p.subject_alt_names
                .push(SanType::DnsName("localhost".try_into()?));
            p.subject_alt_names
                .push(SanType::IpAddress([127, 0, 0, 1].into()));
            for d in &names.dns {
                if d != name && d != "localhost" {
                    p.subject_alt_names
                        .push(SanType::DnsName(d.as_str().try_into().map_err(|_| {
                            PkiError::BadName {
                                kind: "DNS",
                                name: d.clone(),
                            }
                        })?));
                }
            }
            for ip in &names.ips {
                if *ip != std::net::IpAddr::from([127, 0, 0, 1]) {
                    p.subject_alt_names.push(SanType::IpAddress(*ip));
                }
            }
            vec![ExtendedKeyUsagePurpose::ServerAuth]
        }
        Kind::Host | Kind::Operator => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    p.not_before = not_before;
    p.not_after = not_after;
    p.use_authority_key_identifier_extension = true;
    let c = p.signed_by(&kp, &issuer)?;
    write(&key_path, &kp.serialize_pem(), 0o600)?;
    write(&cert_path, &c.pem(), 0o644)?;
    Ok(Issued {
        cert: cert_path,
        key: key_path,
        principal: format!("{}:{name}", kind.as_str()),
    })
}

/// The DNS names and IP addresses a certificate (PEM) can be verified as.
pub fn server_names_of(pem: &str) -> Option<(Vec<String>, Vec<std::net::IpAddr>)> {
    use x509_parser::prelude::*;
    let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let (_, cert) = X509Certificate::from_der(&der.contents).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let (mut dns, mut ips) = (vec![], vec![]);
    for g in &san.value.general_names {
        match g {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(b) => match b.len() {
                4 => ips.push(std::net::IpAddr::from(<[u8; 4]>::try_from(*b).ok()?)),
                16 => ips.push(std::net::IpAddr::from(<[u8; 16]>::try_from(*b).ok()?)),
                _ => {}
            },
            _ => {}
        }
    }
    Some((dns, ips))
}

/// The Mosaic principal (`kind:name`) a DER certificate names in its URI SAN, if exactly
/// one such SAN is present.
pub fn principal_of(der: &[u8]) -> Option<String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let found: Vec<String> = san
        .value
        .general_names
        .iter()
        .filter_map(|g| match g {
            GeneralName::URI(u) => u.strip_prefix("urn:mosaic:").map(String::from),
            _ => None,
        })
        .collect();
    match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}
