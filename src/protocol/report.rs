//! The bodies of the host's lane report (in `hello`) and of the coordinator's `reconcile`:
//! what a host says it runs, and what the coordinator tells it to end. Both sides build and
//! read them through these types, so the shape is defined once.
//!
//! **Never:** carries authority by itself: a report is the host's observation, and a
//! reconcile can only end generations or ask for a lane to be recreated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::canonical::{self, Value};

/// One lane as its host sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneReport {
    pub lane_incarnation_id: String,
    /// `active`, `quarantined`, or `destroyed` (its teardown verified; the coordinator
    /// retires the incarnation).
    pub status: String,
    pub quarantine_reason: Option<String>,
    /// Generations with a live (or still starting) process tree.
    pub generations: Vec<GenReport>,
}

/// A live generation as its host sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenReport {
    pub generation: u64,
    /// The reservation the host staged it for (none for a host-local generation).
    pub reservation_id: Option<String>,
    /// The host was told it is RUNNING.
    pub activated: bool,
    /// The host still holds its half of the chain (false after a supervisor restart
    /// before activation: the harness's hand-off state died with the old process).
    pub chain_held: bool,
    /// Its workspace is held read-only because its work is offered to another lane.
    pub held: bool,
}

/// The `lane_states` field: lane name → report.
pub type HostReport = BTreeMap<String, LaneReport>;

/// One lane of a `reconcile`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneOrderWire {
    pub lane_incarnation_id: String,
    /// Generations to end: stop them if they run, fence them as never started if not.
    pub end: Vec<u64>,
    /// Generations whose work is offered to another lane: their workspace is closed while
    /// they run on (a handoff offer, spec §6.1 `RUNNING → HANDOFF_PENDING`).
    pub hold: Vec<u64>,
    /// Held generations whose work came back (the offer ended without moving it): their
    /// workspace is open again.
    pub release: Vec<u64>,
    /// Destroy the lane and create it again (a fresh incarnation).
    pub recreate: bool,
    /// Make the lane, which does not exist yet (an elastic lane's lease waits for it);
    /// `lane_incarnation_id` is empty.
    #[serde(default)]
    pub create: bool,
    /// Destroy `lane_incarnation_id` for good (an elastic lane whose lease ended).
    #[serde(default)]
    pub destroy: bool,
}

/// The `lanes` field of a `reconcile`: lane id → order.
pub type Reconcile = BTreeMap<String, LaneOrderWire>;

#[derive(Debug, thiserror::Error)]
#[error("malformed {what}: {detail}")]
pub struct ReportError {
    what: &'static str,
    detail: String,
}

/// Encodes a body for an envelope field.
pub fn to_value<T: Serialize>(v: &T) -> Result<Value, ReportError> {
    let json = serde_json::to_value(v).map_err(|e| ReportError {
        what: "report",
        detail: e.to_string(),
    })?;
    canonical::from_json(&json).map_err(|e| ReportError {
        what: "report",
        detail: e.to_string(),
    })
}

/// Decodes an envelope field (already verified) into its body type.
pub fn from_value<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    v: &Value,
) -> Result<T, ReportError> {
    serde_json::from_value(canonical::to_json(v)).map_err(|e| ReportError {
        what,
        detail: e.to_string(),
    })
}

/// Most lanes a host may report.
pub const MAX_LANES: usize = 256;
/// Most runtimes a host may advertise.
pub const MAX_RUNTIMES: usize = 64;

/// A lane name as hosts create them: 1–32 of `A-Z a-z 0-9 - _`.
pub fn lane_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A lane incarnation id: `li-` and 32 lower-case hex digits.
pub fn incarnation_ok(s: &str) -> bool {
    s.strip_prefix("li-").is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// An identifier as Mosaic mints them (reservation, assignment, attempt, challenge,
/// receipt key, session, host, lane id): at most 96 of `A-Z a-z 0-9 . _ : @ -`. Anything
/// else is refused before it is looked up, logged or echoed.
pub fn id_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:_@-".contains(&b))
}

#[cfg(test)]
mod names_tests {
    use super::*;

    #[test]
    fn names_and_ids_are_checked_before_use() {
        assert!(lane_name_ok("lane-1") && !lane_name_ok("../etc") && !lane_name_ok("a b"));
        assert!(!lane_name_ok(&"x".repeat(33)) && !lane_name_ok("lane:1"));
        assert!(incarnation_ok(&format!("li-{}", "a".repeat(32))));
        assert!(!incarnation_ok(&format!("li-{}", "A".repeat(32))) && !incarnation_ok("li-1"));
        assert!(id_ok("tr-0123abcd") && id_ok("vm-1:lane-2") && !id_ok("a\u{0}b"));
        assert!(!id_ok(&"k".repeat(97)) && !id_ok("key with space"));
    }
}
