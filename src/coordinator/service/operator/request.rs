//! What an operator may ask (`OperatorRequest`), and the typed refusal every answer can be.

use super::*;

/// A refusal as operators see it: a category to count and script on, then prose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", category.as_str())]
pub struct OpError {
    pub category: Category,
    pub message: String,
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
        }
    }
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
    },
    LaneRelease {
        lane_id: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    LaneRecreate {
        lane_id: String,
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
    },
    /// Makes blocked work active again, with a fresh inactivity period and attempt budget.
    Unblock {
        assignment_id: String,
        next_action: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Publishes an inactivity policy version (frozen once published).
    PolicyPublish {
        policy: crate::coordinator::continuity::InactivityPolicy,
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
