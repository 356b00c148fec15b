//! The trust registry: `key_id` → who may sign what, for whom, where, and when.
//!
//! **Owns:** key metadata and the load-time consistency rules (a key's allowed types must
//! all match its purpose and its role's side of the protocol).
//!
//! **Never:** lets a key's integrity stand in for authority: every envelope is checked
//! against its entry's principal, role, purpose, allowed types, audiences, trust domain,
//! validity window and revocation, before any field is used.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use ed25519_dalek::VerifyingKey;
use serde::Deserialize;

use super::schema::{MessageType, Purpose, Role};

/// Signature suites. The profile leaves room for more; each is named on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Suite {
    #[serde(rename = "ed25519-v1")]
    Ed25519,
}

impl Suite {
    pub fn id(self) -> &'static str {
        match self {
            Suite::Ed25519 => "ed25519-v1",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        (s == "ed25519-v1").then_some(Suite::Ed25519)
    }
}

#[derive(Debug, Clone)]
pub struct KeyEntry {
    pub key_id: String,
    pub principal: String,
    pub role: Role,
    pub purpose: Purpose,
    pub allowed_types: BTreeSet<MessageType>,
    pub audiences: BTreeSet<String>,
    pub trust_domain: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub revoked: bool,
    pub suite: Suite,
    pub public_key: VerifyingKey,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrustError {
    #[error("trust registry: {0}")]
    Parse(String),
    #[error("key {key_id}: {detail}")]
    Inconsistent { key_id: String, detail: String },
    #[error("key id {0} appears twice")]
    Duplicate(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    key_id: String,
    principal: String,
    role: Role,
    purpose: Purpose,
    allowed_types: Vec<MessageType>,
    audiences: Vec<String>,
    trust_domain: String,
    not_before: String,
    not_after: String,
    #[serde(default)]
    revoked: bool,
    suite: Suite,
    public_key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    key: Vec<FileEntry>,
}

#[derive(Debug, Clone, Default)]
pub struct TrustRegistry {
    entries: HashMap<String, KeyEntry>,
}

impl KeyEntry {
    /// Load-time consistency: a key can only ever be allowed types of its own purpose and
    /// from its own role's side; an entry that claims otherwise is refused whole.
    pub fn check(&self) -> Result<(), TrustError> {
        let bad = |detail: String| TrustError::Inconsistent {
            key_id: self.key_id.clone(),
            detail,
        };
        if self.allowed_types.is_empty() {
            return Err(bad("allows no message types".into()));
        }
        if self.audiences.is_empty() {
            return Err(bad("has no audience".into()));
        }
        for t in &self.allowed_types {
            let s = t.schema();
            if s.purpose != self.purpose {
                return Err(bad(format!(
                    "{} is a {:?} message but the key's purpose is {:?}",
                    t.as_str(),
                    s.purpose,
                    self.purpose
                )));
            }
            if s.origin != self.role {
                return Err(bad(format!(
                    "{} is sent by {:?}, not by a {:?} key",
                    t.as_str(),
                    s.origin,
                    self.role
                )));
            }
        }
        if self.not_after <= self.not_before {
            return Err(bad("validity window is empty".into()));
        }
        Ok(())
    }
}

impl TrustRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, e: KeyEntry) -> Result<(), TrustError> {
        e.check()?;
        if self.entries.contains_key(&e.key_id) {
            return Err(TrustError::Duplicate(e.key_id));
        }
        self.entries.insert(e.key_id.clone(), e);
        Ok(())
    }

    pub fn resolve(&self, key_id: &str) -> Option<&KeyEntry> {
        self.entries.get(key_id)
    }

    /// Revocation takes effect for every later verification.
    pub fn revoke(&mut self, key_id: &str) -> bool {
        match self.entries.get_mut(key_id) {
            Some(e) => {
                e.revoked = true;
                true
            }
            None => false,
        }
    }

    pub fn from_toml(text: &str) -> Result<Self, TrustError> {
        let f: File = toml::from_str(text).map_err(|e| TrustError::Parse(e.to_string()))?;
        let mut reg = Self::new();
        for fe in f.key {
            let time = |s: &str| {
                humantime::parse_rfc3339(s).map_err(|e| TrustError::Inconsistent {
                    key_id: fe.key_id.clone(),
                    detail: format!("time {s:?}: {e}"),
                })
            };
            let mut pk = [0u8; 32];
            hex::decode_to_slice(&fe.public_key, &mut pk).map_err(|_| {
                TrustError::Inconsistent {
                    key_id: fe.key_id.clone(),
                    detail: "public_key must be 64 hex digits".into(),
                }
            })?;
            let public_key =
                VerifyingKey::from_bytes(&pk).map_err(|_| TrustError::Inconsistent {
                    key_id: fe.key_id.clone(),
                    detail: "public_key is not a valid Ed25519 point".into(),
                })?;
            reg.insert(KeyEntry {
                not_before: time(&fe.not_before)?,
                not_after: time(&fe.not_after)?,
                key_id: fe.key_id,
                principal: fe.principal,
                role: fe.role,
                purpose: fe.purpose,
                allowed_types: fe.allowed_types.into_iter().collect(),
                audiences: fe.audiences.into_iter().collect(),
                trust_domain: fe.trust_domain,
                revoked: fe.revoked,
                suite: fe.suite,
                public_key,
            })?;
        }
        Ok(reg)
    }
}

impl TrustRegistry {
    /// Every key, for listings (`mosaic trust list`).
    pub fn entries(&self) -> impl Iterator<Item = &KeyEntry> {
        self.entries.values()
    }

    /// The public keys (hex) of every key whose id or principal is `subject`.
    pub fn keys_of(&self, subject: &str) -> std::collections::BTreeSet<String> {
        self.entries
            .values()
            .filter(|e| e.key_id == subject || e.principal == subject)
            .map(|e| hex::encode(e.public_key.to_bytes()))
            .collect()
    }

    /// Marks revoked every key whose public key (hex) is in `keys`, under whatever id; how
    /// many it marked.
    pub fn revoke_keys(&mut self, keys: &std::collections::BTreeSet<String>) -> usize {
        let mut n = 0;
        for e in self.entries.values_mut() {
            if keys.contains(&hex::encode(e.public_key.to_bytes())) {
                e.revoked = true;
                n += 1;
            }
        }
        n
    }

    /// A daemon's own key must be in the registry it loads, as itself: the same public
    /// key, principal and purpose, not revoked, valid now. A daemon whose key is missing
    /// would start and then be refused by every peer (or refuse its own signatures).
    pub fn check_own(
        &self,
        key_id: &str,
        principal: &str,
        purpose: Purpose,
        public: &VerifyingKey,
        now: SystemTime,
    ) -> Result<(), TrustError> {
        let bad = |detail: &str| TrustError::Inconsistent {
            key_id: key_id.to_string(),
            detail: detail.to_string(),
        };
        let Some(e) = self.entries.get(key_id) else {
            return Err(bad(
                "this daemon's own key is not in the trust registry it loads (mosaic init / mosaic enroll adds it)",
            ));
        };
        if e.principal != principal || e.purpose != purpose {
            return Err(bad(
                "the registry names another principal or purpose for it",
            ));
        }
        if e.public_key != *public {
            return Err(bad(
                "the registry holds another public key under this id than the key file's (mosaic keys show FILE prints it)",
            ));
        }
        if e.revoked {
            return Err(bad("it is revoked"));
        }
        if now < e.not_before || now >= e.not_after {
            return Err(bad("it is outside its validity window now"));
        }
        Ok(())
    }
}

/// A registry that can be replaced while sessions run (a reload of its file, a
/// revocation): every verification reads the one current at that moment.
#[derive(Debug, Clone, Default)]
pub struct LiveRegistry(std::sync::Arc<std::sync::RwLock<std::sync::Arc<TrustRegistry>>>);

impl LiveRegistry {
    pub fn new(r: TrustRegistry) -> Self {
        Self(std::sync::Arc::new(std::sync::RwLock::new(
            std::sync::Arc::new(r),
        )))
    }

    pub fn current(&self) -> std::sync::Arc<TrustRegistry> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub fn replace(&self, r: TrustRegistry) {
        let mut g = match self.0.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *g = std::sync::Arc::new(r);
    }
}

impl From<TrustRegistry> for LiveRegistry {
    fn from(r: TrustRegistry) -> Self {
        Self::new(r)
    }
}
