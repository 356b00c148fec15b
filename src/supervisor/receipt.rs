//! Generation-bound termination receipts (spec §10.1), as far as a host can know them.
//!
//! A receipt is an observation, never a verdict: it says what the host saw end and how,
//! and the coordinator decides what that means. Fields only the coordinator can fill
//! (`sot_incarnation`, `coordinator_epoch`, assignment and owner fields) are present and
//! null until a coordinator stamps them.

use serde::{Deserialize, Serialize};

use super::identity::ProcessIdentity;
use crate::cgroup::KillMethod;
use crate::shim::proto::ExitStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObservationSource {
    /// The shim reaped the harness and reported its wait status.
    Shim,
    /// The supervisor saw it directly (pidfd, cgroup.events, restart reconciliation).
    Supervisor,
    /// The periodic liveness sweep noticed what no event reported.
    Watchdog,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TerminationReason {
    /// Exited by itself with status 0, or stopped gracefully within its grace period.
    Quit,
    /// Non-zero exit, or death by a signal other than SIGKILL.
    Crash,
    /// Killed by SIGKILL from outside the supervisor's stop path.
    Sigkill,
    /// Asked to stop, ignored it past its grace period, and was force-killed.
    Timeout,
    /// Stopped because a fresh generation replaced it on the lane.
    Replace,
    /// The shim never got the harness running.
    LaunchFailed,
    /// Nothing was ever started for this generation: the host refused its stage (or was
    /// told to end it before it began), and the number is fenced for good.
    NeverStarted,
    /// Nothing provable: it died while nobody could watch and left no record.
    Unknown,
}

/// Why a stop was requested (only for receipts of requested stops).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopCause {
    Operator,
    Replace,
    LaneDestroy,
    /// A generation the supervisor could not re-verify after a restart.
    Unverifiable,
    /// The coordinator asked for it to end.
    Coordinator,
    /// The lane's tmux server was lost (killed from outside): the generation could no
    /// longer be attached to or driven.
    LaneServerLost,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopDetail {
    pub cause: StopCause,
    pub graceful_signal: String,
    pub grace_period_ms: u64,
    /// The grace period ran out and the cgroup was killed with the harness still alive.
    pub forced: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cleanup {
    pub method: Option<KillMethod>,
    /// `cgroup.procs` empty and `populated 0`, both read after the kill.
    pub verified_empty: bool,
    pub cgroup_removed: bool,
    /// Processes in the cgroup when the kill began (shim and survivors included).
    pub members_killed: usize,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TerminationReceipt {
    pub receipt_id: String,
    pub idempotency_key: String,
    pub sot_incarnation: Option<String>,
    pub coordinator_epoch: Option<u64>,
    pub assignment_id: Option<String>,
    pub assignment_attempt_id: Option<String>,
    pub responsibility_owner: Option<String>,
    pub execution_owner: Option<String>,
    pub host_id: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub runtime: String,
    pub process_identity: Option<ProcessIdentity>,
    pub observation_source: ObservationSource,
    pub termination_reason: TerminationReason,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub core_dumped: bool,
    pub stop: Option<StopDetail>,
    pub cleanup: Cleanup,
    pub started_at: Option<String>,
    /// Host time the termination was observed (advisory; the coordinator uses its own).
    pub observed_at: String,
    pub written_at: String,
    pub unfinished_status: bool,
    pub next_action_digest: Option<String>,
    pub checkpoint_digest: Option<String>,
    /// What `checkpoint_digest` is the address of (work in a repository).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::protocol::repo::CheckpointRef>,
    /// The harness's own session, as its adapter exports it, captured once the
    /// generation's cgroup was verified empty: encrypted to the recovery recipients its
    /// stage named (never stored in the clear), uploaded to the coordinator's store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness_artifact: Option<crate::protocol::artifact::ArtifactRef>,
    pub handoff_state_digest: Option<String>,
    pub last_validated_progress_at: Option<String>,
    pub last_progress_receipt_digest: Option<String>,
    pub detail: Option<String>,
    /// What the broker observed of the generation's admitted effects that the coordinator
    /// had not recorded when the receipt was written (spec §5.5): settled with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<super::broker::EffectObservation>,
}

/// One receipt per generation: the key depends only on which generation ended, so a
/// retried write, a restart or a racing observer all land on the same key.
pub fn idempotency_key(lane_id: &str, lane_incarnation_id: &str, generation: u64) -> String {
    format!(
        "tr-{}",
        &crate::util::sha256_hex(
            "mosaic/termination-receipt/v1",
            &[
                lane_id.as_bytes(),
                lane_incarnation_id.as_bytes(),
                &generation.to_be_bytes()
            ],
        )[..40]
    )
}

/// The receipt of a generation that never started on this host: nothing was created for
/// it (no cgroup, no process), so there is nothing to clean and nothing that could still
/// run; `cleanup.verified_empty` states exactly that.
pub fn never_started(
    host_id: &str,
    lane_id: &str,
    lane_incarnation_id: &str,
    generation: u64,
    runtime: &str,
    why: &str,
) -> TerminationReceipt {
    let now = crate::util::now_rfc3339();
    TerminationReceipt {
        receipt_id: format!("rcpt-{}", uuid::Uuid::new_v4().simple()),
        idempotency_key: idempotency_key(lane_id, lane_incarnation_id, generation),
        sot_incarnation: None,
        coordinator_epoch: None,
        assignment_id: None,
        assignment_attempt_id: None,
        responsibility_owner: None,
        execution_owner: None,
        host_id: host_id.to_string(),
        lane_id: lane_id.to_string(),
        lane_incarnation_id: lane_incarnation_id.to_string(),
        generation,
        runtime: runtime.to_string(),
        process_identity: None,
        observation_source: ObservationSource::Supervisor,
        termination_reason: TerminationReason::NeverStarted,
        exit_code: None,
        signal: None,
        core_dumped: false,
        stop: None,
        cleanup: Cleanup {
            method: None,
            verified_empty: true,
            cgroup_removed: false,
            members_killed: 0,
            error: None,
        },
        started_at: None,
        observed_at: now.clone(),
        written_at: now,
        unfinished_status: true,
        next_action_digest: None,
        harness_artifact: None,
        checkpoint_digest: None,
        checkpoint: None,
        handoff_state_digest: None,
        last_validated_progress_at: None,
        last_progress_receipt_digest: None,
        detail: Some(format!("never started: {why}")),
        effects: vec![],
    }
}

/// Classifies a harness wait status (the shim's report) for a termination nobody asked for.
pub fn classify_exit(status: &ExitStatus) -> TerminationReason {
    match (status.code, status.signal) {
        (Some(0), _) => TerminationReason::Quit,
        (Some(_), _) => TerminationReason::Crash,
        (None, Some(9)) => TerminationReason::Sigkill,
        (None, Some(_)) => TerminationReason::Crash,
        (None, None) => TerminationReason::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_deterministic_and_distinct() {
        let a = idempotency_key("h:a", "li-1", 1);
        assert_eq!(a, idempotency_key("h:a", "li-1", 1));
        assert_ne!(a, idempotency_key("h:a", "li-1", 2));
        assert_ne!(a, idempotency_key("h:a", "li-2", 1));
        assert_ne!(a, idempotency_key("h:b", "li-1", 1));
    }

    #[test]
    fn exit_classification() {
        let s = |code, signal| ExitStatus {
            code,
            signal,
            core_dumped: false,
        };
        assert_eq!(classify_exit(&s(Some(0), None)), TerminationReason::Quit);
        assert_eq!(classify_exit(&s(Some(3), None)), TerminationReason::Crash);
        assert_eq!(classify_exit(&s(None, Some(9))), TerminationReason::Sigkill);
        assert_eq!(classify_exit(&s(None, Some(6))), TerminationReason::Crash);
    }
}
