//! What an operator may ask (`OperatorRequest`), and the typed refusal every answer can be.

use super::*;

/// A refusal as operators see it: a category to count and script on, then prose; on the
/// answer to a mutating request, its key, and `state: unknown` when the request may or may
/// not have taken effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}{}", category.as_str(), unknown_hint(request_id.as_deref(), *state))]
pub struct OpError {
    pub category: Category,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RequestState>,
    /// On `not-leader`: the operator address of the coordinator that leads, if it
    /// advertises one (the CLI follows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// What is known of a request that got no definite answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RequestState {
    /// It may or may not have taken effect: repeat it with the same `--request-id` (which
    /// returns its outcome, carrying it out only if it had not been), or ask
    /// `mosaic request show ID`.
    Unknown,
}

fn unknown_hint(id: Option<&str>, state: Option<RequestState>) -> String {
    match (id, state) {
        (Some(id), Some(RequestState::Unknown)) => format!(
            " (request {id}: outcome unknown; `mosaic request show {id}` tells what became of it, and repeating the request with --request-id {id} finishes it without doing anything twice)"
        ),
        _ => String::new(),
    }
}

impl<'de> Deserialize<'de> for Category {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Category::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown category {s:?}")))
    }
}

impl OpError {
    pub fn new(category: Category, message: impl Into<String>) -> Self {
        Self {
            category,
            message: message.into(),
            request_id: None,
            state: None,
            leader: None,
        }
    }

    /// The answer to the request under `request_id`: its key, and `unknown` if the category
    /// leaves the outcome open.
    pub fn of_request(mut self, request_id: &str) -> Self {
        self.request_id = Some(request_id.to_string());
        if leaves_outcome_open(self.category) {
            self.state = Some(RequestState::Unknown);
        }
        self
    }
}

/// The categories of an answer that does not say whether the request took effect: the
/// database or the connection failed part-way (a commit may have happened), a bug, or a
/// wait that ran out while the work went on.
pub fn leaves_outcome_open(c: Category) -> bool {
    matches!(
        c,
        Category::Unavailable | Category::Internal | Category::Timeout
    )
}

impl From<AuthorityError> for OpError {
    fn from(e: AuthorityError) -> Self {
        OpError::new(e.operator_category(), e.to_string())
    }
}

/// How long `assign --wait running` waits for RUNNING.
pub(super) const ASSIGN_WAIT: Duration = Duration::from_secs(60);
/// How long `stop` waits for the host's receipt before answering `pending`.
pub(super) const STOP_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum OperatorRequest {
    Lanes,
    Status,
    Assign {
        /// The lane; empty when `place` asks the placement policy to choose one.
        #[serde(default)]
        lane_id: String,
        runtime: String,
        task: String,
        /// Capabilities the assignment may use (one effect lease each); default: the lane.
        #[serde(default)]
        scope: Vec<String>,
        /// Capabilities it must not use, even where the scope names them.
        #[serde(default)]
        holds: Vec<String>,
        #[serde(default)]
        completion_policy: Option<String>,
        #[serde(default)]
        wait: bool,
        /// Resume this assignment (in recovery) instead of creating a new one.
        #[serde(default)]
        resume: Option<String>,
        /// Makes a retried request land on the same reservation.
        #[serde(default)]
        request_id: Option<String>,
        /// The inactivity policy (`name@version`) of a new assignment; `default@1` if absent.
        #[serde(default)]
        inactivity_policy: Option<String>,
        /// The declared repository a new assignment works in (its workspace: a clone on
        /// the branch `mosaic/<assignment_id>`); none: a private scratch directory.
        #[serde(default)]
        repo: Option<String>,
        /// The ref that branch starts at; `HEAD` (the repository's default) if absent.
        #[serde(default)]
        base: Option<String>,
        /// With `resume`: the task differs from the assignment's on purpose (a resume with
        /// another task is refused without it; an empty task resumes the assignment's own).
        #[serde(default)]
        replace_task: bool,
        /// A new assignment in `repo` whose workspace starts from this checkpoint of
        /// another assignment's work: its reservation makes the single-use grant (§11)
        /// its first stage consumes.
        #[serde(default)]
        from_checkpoint: Option<String>,
        /// How long that grant lives, seconds (default 600).
        #[serde(default)]
        grant_within_s: Option<u32>,
        /// No lane named: what the placement policy must find in one (labels, role).
        #[serde(default)]
        place: Option<Box<crate::coordinator::placement::PlacementAsk>>,
    },
    /// Declares a repository assignments can work in: a roster entry, not authority, and
    /// idempotent by its content (the same declaration again is a no-op; another source
    /// under the same name is refused), so it carries no request key.
    RepoAdd {
        name: String,
        /// A directory on `host_id`.
        #[serde(default)]
        path: Option<String>,
        /// A remote every host can fetch.
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        host_id: Option<String>,
        /// Files a fresh workspace gets from the source directory (paths relative to it).
        #[serde(default)]
        copy: Vec<String>,
        /// Commands run in a fresh workspace, in order, before its harness starts.
        #[serde(default)]
        setup: Vec<String>,
        /// Each command's time limit, seconds (default 300).
        #[serde(default)]
        setup_timeout_s: Option<u32>,
    },
    Repos,
    /// The recorded checkpoints (of one assignment).
    Checkpoints {
        #[serde(default)]
        assignment_id: Option<String>,
        /// Only the records of this checkpoint.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint_digest: Option<String>,
    },
    /// One stored checkpoint, opened read-only: what it binds, the files it changed
    /// against its base, and (`diff`) the patch.
    CheckpointShow {
        checkpoint_digest: String,
        #[serde(default)]
        diff: bool,
    },
    /// Bytes of one stored object of a checkpoint (its bundle, or its base's), from `offset`
    /// (whole parts), for `mosaic checkpoint restore`.
    CheckpointRead {
        checkpoint_digest: String,
        object_digest: String,
        #[serde(default)]
        offset: u64,
    },
    /// Harness artifacts (of one assignment): their digests, whom they are encrypted to,
    /// whether the store holds them.
    Artifacts {
        #[serde(default)]
        assignment_id: Option<String>,
    },
    /// Bytes of one stored harness artifact (encrypted), from `offset` (whole parts), for
    /// `mosaic checkpoint artifact`.
    ArtifactRead {
        artifact_digest: String,
        #[serde(default)]
        offset: u64,
    },
    /// The checkpoint grants (of one assignment, as source or target).
    CheckpointGrants {
        #[serde(default)]
        assignment_id: Option<String>,
    },
    /// Deletes (or with `dry_run` lists) the checkpoints their retention policy lets go:
    /// of done work, kept past the policy's time, named by no unspent grant.
    CheckpointGc {
        #[serde(default)]
        dry_run: bool,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Deletes the records of checkpoint `checkpoint_digest` of done work (whatever its
    /// policy), each with a deletion receipt.
    CheckpointDelete {
        checkpoint_digest: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// The deletion receipts (of one assignment).
    CheckpointDeletions {
        #[serde(default)]
        assignment_id: Option<String>,
    },
    /// What operators read of stored checkpoints (of one assignment): each `show` and each
    /// part of an object a `restore` read, with who read it.
    CheckpointReads {
        #[serde(default)]
        assignment_id: Option<String>,
    },
    /// Hosts' copies of done work released (of one assignment).
    WorkspaceReleases {
        #[serde(default)]
        assignment_id: Option<String>,
    },
    /// Revokes an unconsumed grant (again, under the same key: the same answer).
    CheckpointGrantRevoke {
        grant_id: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    Receipts {
        lane_id: Option<String>,
    },
    /// Ends an assignment: CANCELLED by default, COMPLETED with evidence, FAILED.
    Stop {
        assignment_id: String,
        #[serde(default)]
        outcome: Option<String>,
        #[serde(default)]
        evidence_digest: Option<String>,
        #[serde(default = "yes")]
        wait: bool,
        #[serde(default)]
        request_id: Option<String>,
    },
    LaneRelease {
        lane_id: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    LaneRecreate {
        lane_id: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    Audit {
        #[serde(default)]
        since: i64,
    },
    /// Blocks active work with a canonical code, the digest of its evidence and the action
    /// that would unblock it.
    Block {
        assignment_id: String,
        code: String,
        evidence_digest: String,
        next_action: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Makes blocked work active again, with a fresh inactivity period and attempt budget.
    Unblock {
        assignment_id: String,
        next_action: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Publishes the roster — what each host's lanes are for, a declaration and never
    /// authority — as its next version (the same declaration again changes nothing).
    RosterPublish {
        roster: crate::coordinator::placement::Roster,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// An elastic lane (spec §13): a lease on a new lane of a host, made by that host.
    LaneLease {
        ask: crate::coordinator::leases::LeaseAsk,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// A lease's deadline moved to now plus its TTL (never past its maximum lifetime).
    LaneRenew {
        lease_id: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Ends a lease now (and destroys its lane, if made and idle): also the way out of a
    /// quarantined lease.
    LaneUnlease {
        lease_id: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Every lease (and those destroyed in the last hour).
    Leases,
    /// Operator notifications, newest first: each event, the sinks that took it, the last
    /// error of one not yet taken.
    Notifications,
    /// Work in recovery whose start failed before activation offered to another lane
    /// through a recovery candidate (spec §6.3); answered once the candidate's ACK is
    /// consumed (or with the open candidate, if it is not within a few seconds).
    Retarget {
        assignment_id: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// The current roster version; with a reservation, how that reservation was placed.
    Roster {
        #[serde(default)]
        reservation_id: Option<String>,
    },
    /// Publishes an inactivity policy version (frozen once published).
    PolicyPublish {
        policy: crate::coordinator::continuity::InactivityPolicy,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Continues RUNNING work with a next action, delivered to the live generation at its
    /// next settled boundary and accepted exactly once.
    Continue {
        assignment_id: String,
        next_action: String,
        /// How long it may wait for delivery (default 10 min).
        #[serde(default)]
        within_ms: Option<i64>,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// One published policy, with its digest.
    Policy {
        policy_id: String,
    },
    /// Offers RUNNING work to an idle lane (spec §8.1): responsibility moves only by the
    /// target generation's handoff ACK, and the target still needs its own activation.
    Handoff {
        assignment_id: String,
        lane_id: String,
        /// The target's task; default: the current attempt's.
        #[serde(default)]
        task: Option<String>,
        /// How long the target has to acknowledge and activate (default: the reservation
        /// ttl); past it the offer expires and the work stays with its source.
        #[serde(default)]
        within_ms: Option<i64>,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Waits until anything changes after `version` (at most 20 s), then answers with the
    /// status, each lane's last receipt and the new version: a live view without polling.
    Watch {
        #[serde(default)]
        version: u64,
    },
    /// What became of the mutating request under this id (`mosaic request show`).
    Request {
        request_id: String,
    },
    /// Effect claims, newest first (of one assignment, or all), with digests only.
    Effects {
        #[serde(default)]
        assignment_id: Option<String>,
        #[serde(default)]
        limit: Option<i64>,
    },
    /// The reconciliation owner settles a claim whose outcome is unknown: `applied` or not,
    /// with the digest of the evidence that shows it (what the sink shows now).
    EffectResolve {
        effect_id: String,
        applied: bool,
        evidence_digest: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Revokes a key (`host:h/session`) or every key of a principal (`host:h`,
    /// `operator:o`) for good: its live session closes, its later envelopes and
    /// connections are refused and audited, and every coordinator applies it from the
    /// database from then on.
    TrustRevoke {
        subject: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// The trust registry in use: every key (revoked or not) and the revocations.
    Trust,
    /// Hands done work's final checkpoint on (`kind`: `push` to its own branch of the
    /// repository's remote, `merge` into a branch of it, `into` or the branch it was based
    /// on), made by host `host_id` (default: the host of its last chain) once the exact
    /// update is admitted; waits for what the host observed.
    WorkspaceEffect {
        assignment_id: String,
        kind: String,
        #[serde(default)]
        into: Option<String>,
        #[serde(default)]
        host_id: Option<String>,
        #[serde(default = "yes")]
        wait: bool,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// The pushes and merges of done work (of one assignment).
    WorkspaceEffects {
        #[serde(default)]
        assignment_id: Option<String>,
    },
    /// The operator settles a push or merge whose outcome nobody observed, with the digest
    /// of its evidence (what the remote shows now).
    WorkspaceResolve {
        effect_id: String,
        applied: bool,
        evidence_digest: String,
        #[serde(default)]
        request_id: Option<String>,
    },
}

/// `$then` with `$k` bound to the key field of a mutating request, else `$otherwise`: the
/// one list of which variants carry a key.
macro_rules! key_of {
    ($req:expr, $k:ident => $then:expr, $otherwise:expr) => {
        match $req {
            OperatorRequest::Assign { request_id: $k, .. }
            | OperatorRequest::Stop { request_id: $k, .. }
            | OperatorRequest::LaneRelease { request_id: $k, .. }
            | OperatorRequest::LaneRecreate { request_id: $k, .. }
            | OperatorRequest::Block { request_id: $k, .. }
            | OperatorRequest::Unblock { request_id: $k, .. }
            | OperatorRequest::PolicyPublish { request_id: $k, .. }
            | OperatorRequest::RosterPublish { request_id: $k, .. }
            | OperatorRequest::LaneLease { request_id: $k, .. }
            | OperatorRequest::LaneRenew { request_id: $k, .. }
            | OperatorRequest::LaneUnlease { request_id: $k, .. }
            | OperatorRequest::Retarget { request_id: $k, .. }
            | OperatorRequest::Continue { request_id: $k, .. }
            | OperatorRequest::Handoff { request_id: $k, .. }
            | OperatorRequest::EffectResolve { request_id: $k, .. }
            | OperatorRequest::WorkspaceEffect { request_id: $k, .. }
            | OperatorRequest::WorkspaceResolve { request_id: $k, .. }
            | OperatorRequest::TrustRevoke { request_id: $k, .. }
            | OperatorRequest::CheckpointGrantRevoke { request_id: $k, .. }
            | OperatorRequest::CheckpointGc { request_id: $k, .. }
            | OperatorRequest::CheckpointDelete { request_id: $k, .. } => $then,
            _ => $otherwise,
        }
    };
}

impl OperatorRequest {
    /// The operation's name if the request changes anything (and so is journaled under its
    /// idempotency key); `None` for reads.
    pub fn mutation(&self) -> Option<&'static str> {
        Some(match self {
            Self::Assign { .. } => "assign",
            Self::Stop { .. } => "stop",
            Self::LaneRelease { .. } => "lane-release",
            Self::LaneRecreate { .. } => "lane-recreate",
            Self::Block { .. } => "block",
            Self::Unblock { .. } => "unblock",
            Self::PolicyPublish { .. } => "policy-publish",
            Self::RosterPublish { .. } => "roster-publish",
            Self::LaneLease { .. } => "lane-lease",
            Self::LaneRenew { .. } => "lane-renew",
            Self::LaneUnlease { .. } => "lane-unlease",
            Self::Retarget { .. } => "retarget",
            Self::Continue { .. } => "continue",
            Self::Handoff { .. } => "handoff",
            Self::EffectResolve { .. } => "effect-resolve",
            Self::WorkspaceEffect { .. } => "workspace-effect",
            Self::WorkspaceResolve { .. } => "workspace-resolve",
            Self::TrustRevoke { .. } => "trust-revoke",
            Self::CheckpointGrantRevoke { .. } => "checkpoint-grant-revoke",
            Self::CheckpointGc { .. } => "checkpoint-gc",
            Self::CheckpointDelete { .. } => "checkpoint-delete",
            Self::Trust
            | Self::Lanes
            | Self::RepoAdd { .. }
            | Self::CheckpointGrants { .. }
            | Self::CheckpointDeletions { .. }
            | Self::WorkspaceReleases { .. }
            | Self::WorkspaceEffects { .. }
            | Self::CheckpointReads { .. }
            | Self::Repos
            | Self::Checkpoints { .. }
            | Self::CheckpointShow { .. }
            | Self::CheckpointRead { .. }
            | Self::Artifacts { .. }
            | Self::ArtifactRead { .. }
            | Self::Status
            | Self::Receipts { .. }
            | Self::Audit { .. }
            | Self::Policy { .. }
            | Self::Roster { .. }
            | Self::Leases
            | Self::Notifications
            | Self::Watch { .. }
            | Self::Request { .. }
            | Self::Effects { .. } => return None,
        })
    }

    /// A mutating request's idempotency key (`None` for reads, and for a mutating request
    /// whose sender left it to the coordinator).
    pub fn request_id(&self) -> Option<&str> {
        key_of!(self, request_id => request_id.as_deref(), None)
    }

    /// Gives a mutating request its key if it has none; returns the key.
    pub(super) fn keyed(&mut self) -> Option<String> {
        key_of!(self, slot => Some(slot.get_or_insert_with(|| self::request_id(None)).clone()), None)
    }

    /// Sets a mutating request's key (nothing, for a read).
    pub fn set_request_id(&mut self, id: String) {
        key_of!(self, slot => *slot = Some(id), ())
    }

    /// What the request asks, for telling a repeat from another request under the same key:
    /// every field but the key itself and `wait` (how long to wait for the answer changes
    /// nothing the request does). serde_json's maps are sorted, so the bytes are canonical.
    pub(super) fn digest(&self) -> String {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(m) = v.as_object_mut() {
            m.remove("request_id");
            m.remove("wait");
        }
        crate::util::sha256_hex("mosaic/operator-request", &[v.to_string().as_bytes()])
    }

    /// The ids the request names, to say later what became of them.
    pub(super) fn subject(&self) -> serde_json::Value {
        match self {
            Self::Assign {
                lane_id, resume, ..
            } => serde_json::json!({ "lane_id": lane_id, "assignment_id": resume }),
            Self::Stop { assignment_id, .. }
            | Self::Retarget { assignment_id, .. }
            | Self::Block { assignment_id, .. }
            | Self::Unblock { assignment_id, .. }
            | Self::Continue { assignment_id, .. } => {
                serde_json::json!({ "assignment_id": assignment_id })
            }
            Self::Handoff {
                assignment_id,
                lane_id,
                ..
            } => serde_json::json!({ "assignment_id": assignment_id, "lane_id": lane_id }),
            Self::LaneRelease { lane_id, .. } | Self::LaneRecreate { lane_id, .. } => {
                serde_json::json!({ "lane_id": lane_id })
            }
            Self::LaneLease { ask, .. } => serde_json::json!({ "host_id": ask.host_id }),
            Self::LaneRenew { lease_id, .. } | Self::LaneUnlease { lease_id, .. } => {
                serde_json::json!({ "lease_id": lease_id })
            }
            Self::PolicyPublish { policy, .. } => {
                serde_json::json!({ "policy_id": policy.policy_id })
            }
            Self::EffectResolve { effect_id, .. } | Self::WorkspaceResolve { effect_id, .. } => {
                serde_json::json!({ "effect_id": effect_id })
            }
            Self::WorkspaceEffect { assignment_id, .. } => {
                serde_json::json!({ "assignment_id": assignment_id })
            }
            Self::TrustRevoke { subject, .. } => serde_json::json!({ "subject": subject }),
            Self::CheckpointGrantRevoke { grant_id, .. } => {
                serde_json::json!({ "grant_id": grant_id })
            }
            _ => serde_json::Value::Null,
        }
    }
}

/// The inactivity policy of an assignment whose operator named none (migration 0006).
pub const DEFAULT_INACTIVITY_POLICY: &str = "default@1";

/// How long a `watch` waits for a change before answering anyway.
pub(super) const WATCH_WAIT: Duration = Duration::from_secs(20);

pub(super) fn yes() -> bool {
    true
}

pub(super) fn request_id(given: Option<String>) -> String {
    given.unwrap_or_else(|| format!("rq-{}", uuid::Uuid::new_v4().simple()))
}
