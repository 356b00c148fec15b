//! The wire between supervisors and the coordinator: a discriminated union of envelopes,
//! one canonical encoding, domain-separated proofs, a purpose-bound trust registry, queue
//! isolation, and the mutually authenticated WebSocket transport.
//!
//! **Owns:** everything a byte on the wire must satisfy before anyone acts on it.
//!
//! **Never:** interprets a field before the envelope's structure, key authority and proof
//! are verified; lets transport (TLS) identity stand in for message authority; carries a
//! raw fence or ownership token (only proofs or references).
//!
//! This is the only module both sides share.

pub mod artifact;
pub mod canonical;
pub mod effects;
pub mod envelope;
pub mod fence;
pub mod messages;
pub mod queue;
pub mod repo;
pub mod report;
pub mod schema;
pub mod task;
pub mod transport;
pub mod trust;
pub mod work;

pub use envelope::{verify, Envelope, EnvelopeError, Signer, Verified, VerifyContext};
pub use schema::{MessageType, Purpose, Role};
pub use trust::{KeyEntry, LiveRegistry, TrustRegistry};

/// Content address of a contract (task text, scope, holds): SHA-256 over its canonical
/// JSON. Computed identically by the coordinator that records it and the host that checks
/// what it delivers.
pub fn contracts_digest(task_text: &str, scope_digest: &str, holds_digest: &str) -> String {
    use canonical::{encode, Value};
    use sha2::{Digest, Sha256};
    let v = Value::Object(vec![
        ("holds_digest".into(), Value::Str(holds_digest.into())),
        ("scope_digest".into(), Value::Str(scope_digest.into())),
        ("task_text".into(), Value::Str(task_text.into())),
    ]);
    format!("sha256:{}", hex::encode(Sha256::digest(encode(&v))))
}
