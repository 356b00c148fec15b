//! Envelopes: verification of received bytes and signing of outgoing ones.
//!
//! Verification order (each step only after the previous passed; nothing is interpreted
//! before the proof verifies):
//! 1. size bound; strict parse; bytes must already be canonical;
//! 2. known `message_type`; exact field set (missing, unknown, prohibited); field kinds;
//! 3. protocol, profile, schema version and suite are ones this build knows;
//! 4. the verifier's own trust domain and audience;
//! 5. the key: known, unrevoked, inside its validity window, same suite and domain, purpose
//!    and role matching the variant, type allowed, issuer = the key's principal, audience
//!    allowed;
//! 6. the proof over `DOMAIN_SEPARATOR || CANONICAL(envelope without authentication_proof)`
//!    with Ed25519 `verify_strict`.
//!
//! **Never:** normalizes, restamps or re-signs anything; signs an empty proof; includes the
//! proof (or any representation of it) in its own preimage.

use std::marker::PhantomData;
use std::time::SystemTime;

use ed25519_dalek::{Signature, Signer as _, SigningKey};

use super::canonical::{self, CanonicalError, Value};
use super::schema::{Kind, MessageType, Schema, PROCESS_IDENTITY_KEYS};
use super::trust::{Suite, TrustRegistry};

pub const PROTOCOL_VERSION: i64 = 1;
/// Canonicalization + proof profile: RFC 8785 JSON, the domain separator below.
pub const PROFILE_VERSION: &str = "mosaic-jcs-v1";
pub const DOMAIN_LABEL: &[u8] = b"MOSAIC/session-envelope/v1";
pub const MAX_ENVELOPE_BYTES: usize = 256 * 1024;
/// The longest ordinary string field; task texts (`Kind::Text`) may be longer.
pub const MAX_STR_BYTES: usize = 64 * 1024;
const PROOF: &str = "authentication_proof";

/// Type-state markers: only `verify` produces `Envelope<Verified>`.
#[derive(Debug, Clone)]
pub struct Verified;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("envelope larger than {MAX_ENVELOPE_BYTES} bytes")]
    TooLarge,
    #[error("encoding: {0}")]
    Encoding(#[from] CanonicalError),
    #[error("envelope is not a JSON object")]
    NotObject,
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    #[error("missing field {0}")]
    Missing(&'static str),
    #[error("unknown field {0:?}")]
    Unknown(String),
    #[error("field {0:?} is prohibited for this message type")]
    Prohibited(String),
    #[error("field {field} has the wrong shape: {detail}")]
    BadField { field: String, detail: String },
    #[error("unsupported {what} {value:?}")]
    Unsupported { what: &'static str, value: String },
    #[error("authentication proof is empty or malformed")]
    BadProofEncoding,
    #[error("trust domain {0:?} is not this verifier's")]
    WrongDomain(String),
    #[error("audience {0:?} is not this verifier")]
    WrongAudience(String),
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    #[error("key {0:?} is revoked")]
    Revoked(String),
    #[error("key {0:?} is outside its validity window")]
    KeyNotValidNow(String),
    #[error("key {key_id:?} may not be used for this: {detail}")]
    KeyNotAuthorized { key_id: String, detail: String },
    #[error("issuer {issuer:?} is not the principal of key {key_id:?}")]
    WrongIssuer { issuer: String, key_id: String },
    #[error("proof does not verify")]
    BadProof,
}

impl EnvelopeError {
    /// A stable category for audit counts (spec §18: rejection reason categories).
    pub fn category(&self) -> &'static str {
        match self {
            Self::TooLarge => "too-large",
            Self::Encoding(CanonicalError::NotCanonical) => "non-canonical",
            Self::Encoding(CanonicalError::DuplicateKey(_)) => "duplicate-field",
            Self::Encoding(_) => "malformed",
            Self::NotObject => "malformed",
            Self::UnknownType(_) => "unknown-type",
            Self::Missing(_) => "missing-field",
            Self::Unknown(_) => "unknown-field",
            Self::Prohibited(_) => "prohibited-field",
            Self::BadField { .. } => "bad-field",
            Self::Unsupported { .. } => "unsupported-profile",
            Self::BadProofEncoding => "bad-proof-encoding",
            Self::WrongDomain(_) => "wrong-domain",
            Self::WrongAudience(_) => "wrong-audience",
            Self::UnknownKey(_) => "unknown-key",
            Self::Revoked(_) => "revoked-key",
            Self::KeyNotValidNow(_) => "key-not-valid-now",
            Self::KeyNotAuthorized { .. } => "key-not-authorized",
            Self::WrongIssuer { .. } => "wrong-issuer",
            Self::BadProof => "bad-proof",
        }
    }
}

/// The lane, incarnation and generation an envelope names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address<'e> {
    pub lane_id: Option<&'e str>,
    pub lane_incarnation_id: Option<&'e str>,
    pub generation: Option<u64>,
}

/// A verified envelope: the only thing handlers accept.
#[derive(Debug, Clone)]
pub struct Envelope<S> {
    message_type: MessageType,
    fields: Value,
    bytes: Vec<u8>,
    _state: PhantomData<S>,
}

impl Envelope<Verified> {
    pub fn message_type(&self) -> MessageType {
        self.message_type
    }
    /// A field by name, for the protocol's own conversions (`protocol::messages`) only:
    /// handlers take typed messages, never fields.
    pub(in crate::protocol) fn get(&self, field: &str) -> Option<&Value> {
        self.fields.get(field)
    }
    fn text(&self, field: &str) -> Option<&str> {
        self.get(field).and_then(Value::as_str)
    }
    fn uint(&self, field: &str) -> Option<u64> {
        self.get(field).and_then(Value::as_int).map(|i| i as u64)
    }

    // The header: the fields every message type binds (spec §7.1), and the authority and
    // addressing fields the transport and the queue check before any handler sees the
    // message. Everything else is read through `protocol::messages`.

    /// Required in every message type (the schema guarantees it).
    pub fn message_id(&self) -> &str {
        self.text("message_id").unwrap_or("")
    }
    /// Required in every message type (the schema guarantees it).
    pub fn issuer(&self) -> &str {
        self.text("issuer").unwrap_or("")
    }
    /// Required in every message type (the schema guarantees it).
    pub fn key_id(&self) -> &str {
        self.text("key_id").unwrap_or("")
    }
    pub fn session_id(&self) -> Option<&str> {
        self.text("session_id")
    }
    pub fn issued_at(&self) -> Option<&str> {
        self.text("issued_at")
    }
    pub fn expires_at(&self) -> Option<&str> {
        self.text("expires_at")
    }
    /// `None` when absent or null (a session message before any assignment exists).
    pub fn sot_incarnation(&self) -> Option<&str> {
        self.text("sot_incarnation")
    }
    pub fn coordinator_epoch(&self) -> Option<u64> {
        self.uint("coordinator_epoch")
    }
    pub fn assignment_id(&self) -> Option<&str> {
        self.text("assignment_id")
    }
    /// Which lane, incarnation and generation the message is addressed to (each absent in a
    /// message that is not addressed to one).
    pub fn address(&self) -> Address<'_> {
        Address {
            lane_id: self.text("lane_id"),
            lane_incarnation_id: self.text("lane_incarnation_id"),
            generation: self.uint("generation"),
        }
    }
    /// The exact canonical bytes received.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// `sha256:` digest of the canonical envelope (for ACKs that bind a challenge digest).
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        format!("sha256:{}", hex::encode(Sha256::digest(&self.bytes)))
    }
}

/// Who is verifying: only envelopes for this audience in this trust domain are accepted.
#[derive(Debug, Clone, Copy)]
pub struct VerifyContext<'a> {
    pub registry: &'a TrustRegistry,
    pub audience: &'a str,
    pub trust_domain: &'a str,
    pub now: SystemTime,
}

fn lp(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// `DOMAIN_SEPARATOR || CANONICAL(object without the proof)`. `object` must not contain
/// the proof field.
pub fn preimage(schema: &Schema, suite_id: &str, trust_domain: &str, object: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(DOMAIN_LABEL);
    out.push(0);
    lp(&mut out, PROFILE_VERSION);
    lp(&mut out, schema.version);
    lp(&mut out, suite_id);
    lp(&mut out, schema.message_type.as_str());
    lp(&mut out, trust_domain);
    out.extend_from_slice(&schema.digest());
    out.extend_from_slice(&canonical::encode(object));
    out
}

fn check_kind(field: &str, kind: Kind, v: &Value) -> Result<(), EnvelopeError> {
    let bad = |detail: &str| EnvelopeError::BadField {
        field: field.to_string(),
        detail: detail.to_string(),
    };
    let nonempty =
        |v: &Value| matches!(v, Value::Str(s) if !s.is_empty() && s.len() <= MAX_STR_BYTES);
    let uint = |v: &Value| matches!(v, Value::Int(i) if *i >= 0);
    match kind {
        Kind::Str => nonempty(v)
            .then_some(())
            .ok_or_else(|| bad("expected a non-empty string of at most 64 KiB")),
        Kind::Text => {
            matches!(v, Value::Str(s) if !s.is_empty() && s.len() <= super::task::MAX_TASK_BYTES)
                .then_some(())
                .ok_or_else(|| bad("expected a non-empty text of at most 128 KiB"))
        }
        Kind::Uint => uint(v)
            .then_some(())
            .ok_or_else(|| bad("expected a non-negative integer")),
        Kind::NullableStr => (nonempty(v) || *v == Value::Null)
            .then_some(())
            .ok_or_else(|| bad("expected a string or null")),
        Kind::NullableUint => (uint(v) || *v == Value::Null)
            .then_some(())
            .ok_or_else(|| bad("expected an integer or null")),
        Kind::Digest => match v {
            Value::Str(s) if is_digest(s) => Ok(()),
            _ => Err(bad("expected sha256:<64 lower-case hex>")),
        },
        Kind::Time => match v {
            Value::Str(s) if s.ends_with('Z') && humantime::parse_rfc3339(s).is_ok() => Ok(()),
            _ => Err(bad("expected an RFC 3339 UTC time")),
        },
        Kind::Object => matches!(v, Value::Object(_))
            .then_some(())
            .ok_or_else(|| bad("expected an object")),
        Kind::StrList => match v {
            Value::Array(a) if a.iter().all(nonempty) => Ok(()),
            _ => Err(bad("expected a list of strings")),
        },
        Kind::ProcessIdentity => {
            let Value::Object(m) = v else {
                return Err(bad("expected the process identity object"));
            };
            let mut keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
            keys.sort_unstable();
            if keys != PROCESS_IDENTITY_KEYS {
                return Err(bad("process identity must have exactly its eight fields"));
            }
            for (k, x) in m {
                let ok = match k.as_str() {
                    "boot_id" | "cgroup_path" => nonempty(x),
                    "launch_nonce_digest" => {
                        matches!(x, Value::Str(s) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
                    }
                    _ => uint(x),
                };
                if !ok {
                    return Err(bad(&format!(
                        "process identity field {k} has the wrong shape"
                    )));
                }
            }
            Ok(())
        }
    }
}

pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Structural validation shared by signer and verifier. `with_proof` says whether the
/// proof field must be present (verifier) or absent (signer's preimage object).
fn check_structure(v: &Value, with_proof: bool) -> Result<&'static Schema, EnvelopeError> {
    let Value::Object(m) = v else {
        return Err(EnvelopeError::NotObject);
    };
    let t = match v.get("message_type") {
        Some(Value::Str(s)) => {
            MessageType::parse(s).ok_or_else(|| EnvelopeError::UnknownType(s.clone()))?
        }
        Some(_) => return Err(EnvelopeError::UnknownType("<not a string>".into())),
        None => return Err(EnvelopeError::Missing("message_type")),
    };
    let schema = t.schema();
    for (k, _) in m {
        if schema.is_prohibited(k) {
            return Err(EnvelopeError::Prohibited(k.clone()));
        }
        if schema.kind_of(k).is_none() || (!with_proof && k == PROOF) {
            return Err(EnvelopeError::Unknown(k.clone()));
        }
    }
    for (name, kind) in schema.required_fields() {
        if *name == PROOF && !with_proof {
            continue;
        }
        let x = v.get(name).ok_or(EnvelopeError::Missing(name))?;
        check_kind(name, *kind, x)?;
    }
    for (name, kind) in schema.optional {
        if let Some(x) = v.get(name) {
            check_kind(name, *kind, x)?;
        }
    }
    if v.get("protocol_version").and_then(Value::as_int) != Some(PROTOCOL_VERSION) {
        return Err(EnvelopeError::Unsupported {
            what: "protocol_version",
            value: format!("{:?}", v.get("protocol_version")),
        });
    }
    let s = |f: &str| v.get(f).and_then(Value::as_str).unwrap_or("").to_string();
    if s("authentication_profile_version") != PROFILE_VERSION {
        return Err(EnvelopeError::Unsupported {
            what: "authentication profile",
            value: s("authentication_profile_version"),
        });
    }
    if s("envelope_schema_version") != schema.version {
        return Err(EnvelopeError::Unsupported {
            what: "envelope schema version",
            value: s("envelope_schema_version"),
        });
    }
    if Suite::parse(&s("authentication_suite_id")).is_none() {
        return Err(EnvelopeError::Unsupported {
            what: "authentication suite",
            value: s("authentication_suite_id"),
        });
    }
    Ok(schema)
}

/// Verifies received bytes. See the module docs for the order of checks.
pub fn verify(bytes: &[u8], ctx: &VerifyContext<'_>) -> Result<Envelope<Verified>, EnvelopeError> {
    if bytes.len() > MAX_ENVELOPE_BYTES {
        return Err(EnvelopeError::TooLarge);
    }
    let v = canonical::parse_canonical(bytes)?;
    let schema = check_structure(&v, true)?;
    let s = |f: &str| v.get(f).and_then(Value::as_str).unwrap_or("");
    let proof_hex = s(PROOF);
    let mut sig = [0u8; 64];
    if proof_hex.len() != 128
        || proof_hex.bytes().any(|b| b.is_ascii_uppercase())
        || hex::decode_to_slice(proof_hex, &mut sig).is_err()
    {
        return Err(EnvelopeError::BadProofEncoding);
    }
    if s("trust_domain") != ctx.trust_domain {
        return Err(EnvelopeError::WrongDomain(s("trust_domain").into()));
    }
    if s("audience") != ctx.audience {
        return Err(EnvelopeError::WrongAudience(s("audience").into()));
    }
    let key_id = s("key_id");
    let key = ctx
        .registry
        .resolve(key_id)
        .ok_or_else(|| EnvelopeError::UnknownKey(key_id.into()))?;
    if key.revoked {
        return Err(EnvelopeError::Revoked(key_id.into()));
    }
    if ctx.now < key.not_before || ctx.now >= key.not_after {
        return Err(EnvelopeError::KeyNotValidNow(key_id.into()));
    }
    let unauthorized = |detail: String| EnvelopeError::KeyNotAuthorized {
        key_id: key_id.into(),
        detail,
    };
    if key.suite.id() != s("authentication_suite_id") {
        return Err(unauthorized(format!("key suite is {}", key.suite.id())));
    }
    if key.trust_domain != s("trust_domain") {
        return Err(unauthorized(format!(
            "key belongs to domain {:?}",
            key.trust_domain
        )));
    }
    if key.purpose != schema.purpose {
        return Err(unauthorized(format!(
            "a {:?} key cannot sign a {:?} message",
            key.purpose, schema.purpose
        )));
    }
    if key.role != schema.origin {
        return Err(unauthorized(format!(
            "a {:?} key cannot sign what a {:?} sends",
            key.role, schema.origin
        )));
    }
    if !key.allowed_types.contains(&schema.message_type) {
        return Err(unauthorized(format!(
            "type {} not allowed",
            schema.message_type.as_str()
        )));
    }
    if !key.audiences.contains(s("audience")) {
        return Err(unauthorized(format!(
            "audience {:?} not allowed",
            s("audience")
        )));
    }
    if key.principal != s("issuer") {
        return Err(EnvelopeError::WrongIssuer {
            issuer: s("issuer").into(),
            key_id: key_id.into(),
        });
    }
    let Value::Object(m) = &v else {
        return Err(EnvelopeError::NotObject);
    };
    let without: Vec<(String, Value)> = m.iter().filter(|(k, _)| k != PROOF).cloned().collect();
    let pre = preimage(
        schema,
        s("authentication_suite_id"),
        s("trust_domain"),
        &Value::Object(without),
    );
    key.public_key
        .verify_strict(&pre, &Signature::from_bytes(&sig))
        .map_err(|_| EnvelopeError::BadProof)?;
    Ok(Envelope {
        message_type: schema.message_type,
        fields: v,
        bytes: bytes.to_vec(),
        _state: PhantomData,
    })
}

/// A signing identity: the private key plus the registry facts it signs under.
pub struct Signer {
    pub key_id: String,
    pub principal: String,
    pub trust_domain: String,
    key: SigningKey,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({} as {})", self.key_id, self.principal)
    }
}

impl Signer {
    pub fn new(key_id: &str, principal: &str, trust_domain: &str, secret: [u8; 32]) -> Self {
        Self {
            key_id: key_id.into(),
            principal: principal.into(),
            trust_domain: trust_domain.into(),
            key: SigningKey::from_bytes(&secret),
        }
    }

    pub fn generate(
        key_id: &str,
        principal: &str,
        trust_domain: &str,
    ) -> Result<Self, EnvelopeError> {
        let mut secret = zeroize::Zeroizing::new([0u8; 32]);
        getrandom::fill(secret.as_mut()).map_err(|e| EnvelopeError::Unsupported {
            what: "random source",
            value: e.to_string(),
        })?;
        Ok(Self::new(key_id, principal, trust_domain, *secret))
    }

    pub fn public_key(&self) -> ed25519_dalek::VerifyingKey {
        self.key.verifying_key()
    }

    /// Builds, validates and signs an envelope. `fields` are the variant's own fields plus
    /// the authority fields; this fills in the common identity fields (type, key, issuer,
    /// domain, profile, schema, suite, protocol version). The proof is attached last,
    /// without touching any preimage field.
    pub fn sign(
        &self,
        t: MessageType,
        audience: &str,
        fields: Vec<(&str, Value)>,
    ) -> Result<Vec<u8>, EnvelopeError> {
        let schema = t.schema();
        let mut obj: Vec<(String, Value)> = vec![
            ("protocol_version".into(), Value::Int(PROTOCOL_VERSION)),
            ("message_type".into(), Value::Str(t.as_str().into())),
            ("issuer".into(), Value::Str(self.principal.clone())),
            ("audience".into(), Value::Str(audience.into())),
            ("key_id".into(), Value::Str(self.key_id.clone())),
            ("trust_domain".into(), Value::Str(self.trust_domain.clone())),
            (
                "authentication_profile_version".into(),
                Value::Str(PROFILE_VERSION.into()),
            ),
            (
                "envelope_schema_version".into(),
                Value::Str(schema.version.into()),
            ),
            (
                "authentication_suite_id".into(),
                Value::Str(Suite::Ed25519.id().into()),
            ),
        ];
        for (k, v) in fields {
            if obj.iter().any(|(x, _)| x == k) {
                return Err(EnvelopeError::Encoding(CanonicalError::DuplicateKey(
                    k.into(),
                )));
            }
            obj.push((k.to_string(), v));
        }
        let object = Value::Object(obj);
        check_structure(&object, false)?;
        let pre = preimage(schema, Suite::Ed25519.id(), &self.trust_domain, &object);
        let sig = self.key.sign(&pre);
        let Value::Object(mut obj) = object else {
            return Err(EnvelopeError::NotObject);
        };
        obj.push((PROOF.into(), Value::Str(hex::encode(sig.to_bytes()))));
        Ok(canonical::encode(&Value::Object(obj)))
    }
}

/// Convenience constructors for field values.
pub fn s(v: &str) -> Value {
    Value::Str(v.to_string())
}
pub fn n(v: u64) -> Value {
    Value::Int(v as i64)
}
