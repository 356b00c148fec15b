//! What operators see of lanes and generations (identity, never the nonce).

use std::path::PathBuf;

use serde::Serialize;

use super::*;

/// A lane as shown to operators.
#[derive(Debug, Clone, Serialize)]
pub struct LaneView {
    pub lane: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub status: LaneStatus,
    pub quarantine_reason: Option<String>,
    pub current_generation: Option<u64>,
    pub generation: Option<GenView>,
    pub tmux_socket: PathBuf,
    pub attach: String,
    /// How the lane's generations run: `enforced`, or `none` (listed in unconfined_lanes).
    pub confinement: &'static str,
    /// The uid (and gid) its confined generations run as: this incarnation's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// A live generation as shown to operators: identity, never the nonce.
#[derive(Debug, Clone, Serialize)]
pub struct GenView {
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub runtime: String,
    pub started_at: String,
    pub process_identity: Option<ProcessIdentity>,
    /// Advisory observations from the harness's own hooks (settled turns, refused
    /// events); absent for a generation without a lane socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harness: Option<lanesock::Observed>,
    /// The conversation id a real harness was started with (hook events must name it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    /// What the provider gateway carried for it (requests, token usage); absent without
    /// one (an unconfined lane, a runtime with no provider).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<gateway::StatsView>,
    /// Whether the coordinator's activation of a coordinated generation is recorded here
    /// (its effects may then be claimed); absent for a local one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activated: Option<bool>,
}

impl GenView {
    pub(super) fn of(r: &GenRecord) -> Self {
        Self {
            lane_id: r.lane_id.clone(),
            lane_incarnation_id: r.lane_incarnation_id.clone(),
            generation: r.generation,
            runtime: r.runtime.clone(),
            started_at: r.started_at.clone(),
            process_identity: r.identity.clone(),
            harness: None,
            conversation_id: r.conversation_id.clone(),
            gateway: None,
            activated: r.coord.as_ref().map(|c| c.activated),
        }
    }

    pub(super) fn of_live(g: &LiveGen) -> Self {
        let v = Self::of(&g.record);
        Self {
            harness: g.session.as_ref().map(|s| s.observations()),
            conversation_id: g
                .session
                .as_ref()
                .and_then(|s| s.conversation())
                .or(v.conversation_id.clone()),
            gateway: g.gateway.as_ref().map(|h| h.view()),
            ..v
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    pub host_id: String,
    pub cgroup_root: PathBuf,
    pub kill_method: crate::cgroup::KillMethod,
    pub lanes: Vec<LaneView>,
    pub unacknowledged_receipts: usize,
    /// Ends observed but not yet durable (see `unwritten`), written again until they are.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub receipts_not_durable: Vec<super::unwritten::HeldView>,
    /// This host's clock against the coordinator's database time, at the last session
    /// start; absent before the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coordinator_clock: Option<metrics::ClockReading>,
}
