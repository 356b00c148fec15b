//! Mosaic: fresh-process authority for fleets of AI coding agents.
//!
//! Layout (one sentence each; see ARCHITECTURE.md for the invariants):
//! - [`cgroup`] — discovers cgroup v2, owns every write under the cgroup mount, kills and
//!   verifies empty.
//! - [`supervisor`] — the per-host daemon: lanes, generations, identity, stop, receipts,
//!   restart re-adoption, the local control socket.
//! - [`shim`] — the tiny launcher that runs first in every generation's tmux pane.
//! - [`adapter`] — the runtime capability registry and per-family adapters.
//! - [`fake_harness`] — the stand-in harness used by tests and the demo.
//! - [`doctor`] / [`sysdeps`] — host capability checks and system package installation.
//! - [`util`] — durable file writes, hashing, time formatting.

pub mod adapter;
pub mod artifact_recovery;
pub mod cgroup;
pub mod checkpoint_restore;
pub mod confine;
pub mod coordinator;
pub mod doctor;
pub mod enroll;
pub mod fake_harness;
pub mod metrics;
pub mod pgcluster;
pub mod pki;
pub mod protocol;
pub mod shim;
pub mod supervisor;
pub mod sysdeps;
pub mod systemd;
pub mod testmodel;
pub mod tui;
pub mod up;
pub mod util;
