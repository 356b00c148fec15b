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

pub mod canonical;
pub mod envelope;
pub mod queue;
pub mod schema;
pub mod transport;
pub mod trust;

pub use envelope::{verify, Envelope, EnvelopeError, Signer, Verified, VerifyContext};
pub use schema::{MessageType, Purpose, Role};
pub use trust::{KeyEntry, TrustRegistry};
