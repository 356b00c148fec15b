//! The coordinator: the only authority in Mosaic.
//!
//! **Owns:** every authority transition — leadership epochs, lanes and incarnations, the
//! reservation → challenge ACK → atomic activation chain, leases, the ends of chains,
//! termination-receipt reconciliation, quarantine — each one compare-and-swap in
//! PostgreSQL through the one transition primitive (`txn`), decided at the primary's
//! database time, with its receipt in the same commit.
//!
//! **Never:** keeps authority state in memory (a chain is rows; any coordinator process can
//! drive it on), decides with a host clock, stores or logs a raw fence token, or moves an
//! assignment to a terminal outcome on a host's say-so.
//!
//! Layout: `txn` (the frame), `model` (types and reads), `chain` (reserve … injected),
//! `activation` (ACK and activation), `ending` (stops, expiry, receipts, leases), `continuity`
//! (the work record: progress, inactivity watchdog steps, blocked and unblock), `handoff`
//! (responsibility transfer by its own ACK), `continuation` (durable, exactly-once accepted
//! continuations), `lanes`
//! (incarnations, quarantine), `leader`, `store`, `audit`, `secret`, `failpoint`, and
//! `service/` (the daemon around them).

pub mod activation;
pub mod artifacts;
pub mod audit;
mod cas;
pub mod chain;
mod chain_reads;
pub mod checkpoint_store;
pub mod checkpoint_view;
pub mod continuation;
pub mod continuity;
pub mod effects;
pub mod ending;
pub mod error;
pub mod failpoint;
mod followups;
pub mod grants;
pub mod handoff;
pub mod handoff_checkpoint;
pub mod inactivity;
pub mod lanes;
pub mod leader;
pub mod leases;
pub mod metrics;
pub mod model;
pub mod notify;
pub mod placement;
pub mod recovery;
pub mod repos;
pub mod requested_checkpoint;
pub mod requests;
mod reservable;
pub mod restore_binding;
pub mod resume;
pub mod retention;
pub mod roster;
pub mod rows;
pub mod secret;
pub mod service;
pub mod states;
pub mod store;
pub mod trust;
pub mod txn;
pub mod workspace_effects;
pub mod workspace_release;

pub use activation::{AckClaim, Activation};
pub use chain::{ReserveRequest, Reserved};
pub use effects::{Admission, ClaimView, EffectClaim, Observed, UsageView};
pub use ending::{EndCause, EndRequested, Reconciliation};
pub use error::{AuthorityError, Category};
pub use leader::{Candidate, Leader, LeadershipView};
pub use model::{
    AssignmentStatus, AssignmentView, Chain, ChainProgress, ChainRow, LaneView, Outcome,
};
pub use secret::{CoordinatorSecret, FenceToken};
pub use store::Store;
pub use txn::Receipt;
