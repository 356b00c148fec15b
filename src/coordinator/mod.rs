//! The coordinator: the only authority in Mosaic.
//!
//! **Owns:** every authority transition — leadership epochs, lanes and incarnations, the
//! reservation → challenge ACK → atomic activation chain, leases, termination-receipt
//! reconciliation, quarantine — each one compare-and-swap in PostgreSQL, decided at the
//! primary's database time, with its receipt in the same commit.
//!
//! **Never:** keeps authority state in memory, decides with a host clock, stores or logs
//! a raw fence token, or moves an assignment to a terminal outcome on a host's say-so.

pub mod chain;
pub mod error;
pub mod leader;
pub mod lifecycle;
pub mod secret;
pub mod service;
pub mod store;
pub mod txn;

pub use chain::{AckClaim, Activation, Chain, Outcome, ReserveRequest, Reserved};
pub use error::{AuthorityError, Category};
pub use leader::{Candidate, Leader};
pub use secret::{CoordinatorSecret, FenceToken};
pub use store::Store;
pub use txn::Receipt;
