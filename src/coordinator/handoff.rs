//! Responsibility handoff (spec §8.1): a protocol separate from activation.
//!
//! 1. **offer** — RUNNING work, an idle target lane: the target gets a fresh chain of its own
//!    (attempt, reservation, generation, contract); the assignment keeps its execution owner
//!    (the source still runs) and names the target as pending. Both owner fields are set,
//!    which the database allows only while the work status is `handoff`.
//! 2. **challenge** — minted when the target generation's contract injection is recorded
//!    (`chain::record_injected`), never before: single-use, random, with a database deadline.
//! 3. **accept** — the target's ACK binds every §8.1 field; one compare-and-swap checks them
//!    all against the offer and current state, then sets `responsibility_owner = target`,
//!    clears the execution owner, keeps the pending target, and fences the source (leases
//!    revoked, reservation released, generation told to stop, lane draining).
//! 4. **activation** — only now does the target chain get its activation challenge; the
//!    activation compare-and-swap requires `execution_owner IS NULL AND pending_target =
//!    target`, which only an accepted handoff gives a target chain. The handoff receipt
//!    grants nothing: no READY, no RUNNING, no lease.
//!
//! An offer whose target chain ends before acceptance (expiry, a dead target generation) is
//! `EXPIRED`; one whose source ends first (or whose work leaves ACTIVE: the inactivity
//! watchdog replacing the source, which still watches offered work) is `WITHDRAWN`, and the
//! watchdog ends its target chain at once. Either way the work's owners are as they were
//! before the offer.
//!
//! **Never:** lets a handoff ACK stand in for an activation ACK or the reverse (separate
//! tables, message types and compare-and-swaps), or transfers anything on a message alone.

use const_format::concatcp;
use serde_json::json;
use std::sync::LazyLock;

use super::cas::{self, Pred};
use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::rows::RowExt;
use super::secret;
use super::states::{GenState, HandoffState, LaneState, Lifecycle, WorkStatus};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

/// What an operator asks: hand `assignment_id` to the lane incarnation `target`.
#[derive(Debug, Clone)]
pub struct OfferRequest {
    pub request_id: String,
    pub assignment_id: String,
    pub target_lane_incarnation_id: String,
    /// The target's task; `None` continues the last attempt's task.
    pub task_text: Option<String>,
    pub ttl_ms: i64,
}

/// The target's ACK, as its host signed it.
#[derive(Debug, Clone, PartialEq)]
pub struct HandoffAckClaim {
    pub handoff_challenge_id: String,
    pub sot_incarnation: String,
    pub coordinator_epoch: i64,
    pub assignment_id: String,
    pub source_assignment_attempt_id: String,
    pub target_assignment_attempt_id: String,
    pub responsibility_owner: String,
    pub execution_owner: String,
    pub pending_target: String,
    pub next_action_digest: String,
    pub scope_digest: String,
    pub holds_digest: String,
    pub contracts_digest: String,
    pub lane_incarnation_id: String,
    pub generation: i64,
    pub challenge_deadline: String,
    /// Work in a repository: the checkpoint the target's workspace was restored from.
    pub checkpoint_digest: Option<String>,
    pub ack_digest: String,
}

/// A handoff as the driver needs it to send the challenge.
#[derive(Debug, Clone)]
pub struct HandoffView {
    pub handoff_id: String,
    pub assignment_id: String,
    pub state: HandoffState,
    pub responsibility_owner: String,
    pub execution_owner: String,
    pub pending_target: String,
    pub source_attempt_id: String,
    pub target_attempt_id: String,
    pub target_reservation_id: String,
    pub next_action: String,
    pub next_action_digest: String,
    pub challenge_id: Option<String>,
    pub challenge_deadline: Option<String>,
    pub challenge_epoch: Option<i64>,
    pub source_reservation_id: String,
    /// The work has a workspace: nothing moves before its checkpoint is recorded.
    pub needs_checkpoint: bool,
    pub checkpoint_digest: Option<String>,
    pub checkpoint_error: Option<String>,
}

pub use crate::protocol::work::next_action_digest;

/// Every expected value of a handoff ACK (spec §8.1), in diagnosis order: the challenge
/// unused and unexpired (database time), every bound field equal to the offer and to
/// current state, the source still RUNNING on its open reservation, the target chain
/// AWAITING_ACK on its own. The CAS and its refusal's explanation are both built from it.
/// Parameters: $1 handoff challenge, $2 and $3 the timeline and epoch it was issued under,
/// $4 assignment, $5 source attempt, $6 target attempt, $7 responsibility owner, $8
/// execution owner, $9 pending target, $10 next-action digest, $11 scope, $12 holds, $13
/// target lane incarnation, $14 generation, $15 contracts, $16 challenge deadline, $17 the
/// checkpoint the target's workspace was restored from (null without a workspace).
const ACCEPT_PREDS: &[Pred] = &[
    Pred {
        sql: concatcp!("h.state <> ", HandoffState::Accepted.sql()),
        category: Category::ChallengeConsumed,
        detail: "the handoff challenge was already used",
    },
    Pred {
        sql: concatcp!("h.state = ", HandoffState::Challenged.sql()),
        category: Category::WrongState,
        detail: "the handoff is not CHALLENGED (withdrawn, expired or not yet challenged)",
    },
    Pred {
        sql: "h.challenge_deadline > clock_timestamp()",
        category: Category::Expired,
        detail: "the handoff challenge deadline has passed (database time; equality is expired)",
    },
    Pred {
        sql: "h.sot_incarnation = $2",
        category: Category::Mismatch,
        detail: "the challenge was issued under another timeline",
    },
    Pred {
        sql: "h.challenge_epoch = $3",
        category: Category::Mismatch,
        detail: "the challenge was issued under another coordinator epoch",
    },
    Pred {
        sql: "mosaic_ts(h.challenge_deadline) = $16",
        category: Category::Mismatch,
        detail: "challenge_deadline differs from the challenge's",
    },
    Pred {
        sql: "h.checkpoint_digest IS NOT DISTINCT FROM $17",
        category: Category::Mismatch,
        detail: "checkpoint_digest differs from the handoff's checkpoint",
    },
    Pred {
        sql: "a.assignment_id = $4",
        category: Category::Mismatch,
        detail: "assignment_id differs from the handoff's",
    },
    Pred {
        sql: concatcp!("a.lifecycle = ", Lifecycle::Active.sql(), " AND a.work_status = ", WorkStatus::Handoff.sql(), " AND a.requested_outcome IS NULL"),
        category: Category::WrongState,
        detail: "the work is no longer active and being handed off (it left the handoff, or an outcome was requested)",
    },
    Pred {
        sql: "h.source_attempt_id = $5",
        category: Category::Mismatch,
        detail: "source_assignment_attempt_id differs from the handoff's",
    },
    Pred {
        sql: "h.target_attempt_id = $6",
        category: Category::Mismatch,
        detail: "target_assignment_attempt_id differs from the handoff's",
    },
    Pred {
        sql: "h.responsibility_owner = $7",
        category: Category::Mismatch,
        detail: "responsibility_owner differs from the offer's",
    },
    Pred {
        sql: "a.responsibility_owner = h.responsibility_owner",
        category: Category::Conflict,
        detail: "the work's responsibility_owner changed since the offer",
    },
    Pred {
        sql: "h.execution_owner = $8",
        category: Category::Mismatch,
        detail: "execution_owner differs from the offer's",
    },
    Pred {
        sql: "a.execution_owner = h.execution_owner",
        category: Category::Conflict,
        detail: "the work's execution_owner changed since the offer",
    },
    Pred {
        sql: "h.pending_target = $9",
        category: Category::Mismatch,
        detail: "pending_target differs from the offer's",
    },
    Pred {
        sql: "a.pending_target = h.pending_target",
        category: Category::Conflict,
        detail: "the work's pending_target changed since the offer",
    },
    Pred {
        sql: "h.next_action_digest = $10",
        category: Category::Mismatch,
        detail: "next_action_digest differs from the offer's",
    },
    Pred {
        sql: "a.scope_digest = $11",
        category: Category::Mismatch,
        detail: "scope_digest differs from the work's",
    },
    Pred {
        sql: "a.holds_digest = $12",
        category: Category::Mismatch,
        detail: "holds_digest differs from the work's",
    },
    Pred {
        sql: "rs.released_at IS NULL AND rs.assignment_attempt_id = h.source_attempt_id",
        category: Category::WrongState,
        detail: "the source chain's reservation was released",
    },
    Pred {
        sql: concatcp!("ls.state = ", LaneState::Running.sql(), " AND ls.retired_at IS NULL"),
        category: Category::WrongState,
        detail: "the source lane is not RUNNING",
    },
    Pred {
        sql: "rt.released_at IS NULL AND rt.deadline > clock_timestamp() AND rt.assignment_attempt_id = h.target_attempt_id",
        category: Category::WrongState,
        detail: "the target chain's reservation was released or has expired",
    },
    Pred {
        sql: "rt.lane_incarnation_id = $13",
        category: Category::Mismatch,
        detail: "lane_incarnation_id differs from the target chain's",
    },
    Pred {
        sql: "rt.generation = $14",
        category: Category::Mismatch,
        detail: "generation differs from the target chain's",
    },
    Pred {
        sql: "rt.contracts_digest = $15",
        category: Category::Mismatch,
        detail: "contracts_digest differs from the target chain's",
    },
    Pred {
        sql: concatcp!("lt.state = ", LaneState::AwaitingAck.sql(), " AND lt.retired_at IS NULL"),
        category: Category::WrongState,
        detail: "the target lane is not AWAITING_ACK",
    },
    Pred {
        sql: concatcp!("gt.state = ", GenState::Staging.sql(), " AND gt.stop_requested_at IS NULL"),
        category: Category::WrongState,
        detail: "the target generation is not staging, or is being stopped",
    },
];

/// The one statement an ACK must satisfy (`ACCEPT_PREDS` over the handoff's rows). It moves
/// responsibility and the assignment's lane in the same row update.
static ACCEPT_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE assignments a SET responsibility_owner = h.pending_target, execution_owner = NULL, \
                lane_incarnation_id = h.target_lane_incarnation_id, handoff_ack = h.handoff_id, \
                next_action = 'the target acknowledges its own activation challenge (mosaic lane ack); then activation' \
         FROM handoffs h, reservations rs, lane_incarnations ls, reservations rt, lane_incarnations lt, generations gt \
         WHERE h.challenge_id = $1 AND a.assignment_id = h.assignment_id \
           AND rs.reservation_id = h.source_reservation_id AND ls.lane_incarnation_id = rs.lane_incarnation_id \
           AND rt.reservation_id = h.target_reservation_id AND lt.lane_incarnation_id = rt.lane_incarnation_id \
           AND gt.lane_incarnation_id = rt.lane_incarnation_id AND gt.generation = rt.generation \
           AND {} \
         RETURNING h.handoff_id, rs.reservation_id, rs.lane_incarnation_id, rs.generation, h.pending_target",
        cas::conjunction(ACCEPT_PREDS)
    )
});

/// The refusal's explanation: each predicate over the same rows, reached from the
/// handoff challenge the ACK names.
static ACCEPT_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        ACCEPT_PREDS,
        "FROM handoffs h LEFT JOIN assignments a ON a.assignment_id = h.assignment_id \
         LEFT JOIN reservations rs ON rs.reservation_id = h.source_reservation_id \
         LEFT JOIN lane_incarnations ls ON ls.lane_incarnation_id = rs.lane_incarnation_id \
         LEFT JOIN reservations rt ON rt.reservation_id = h.target_reservation_id \
         LEFT JOIN lane_incarnations lt ON lt.lane_incarnation_id = rt.lane_incarnation_id \
         LEFT JOIN generations gt ON gt.lane_incarnation_id = rt.lane_incarnation_id AND gt.generation = rt.generation \
         WHERE h.challenge_id = $1",
    )
});

/// Every expected value of a handoff offer, in diagnosis order (over the work, its open
/// reservation and lane, and the target lane); the CAS and its refusal's explanation are
/// both built from it. Parameters: $1 target lane incarnation, $2 assignment.
const OFFER_PREDS: &[Pred] = &[
    Pred {
        sql: "a.lane_incarnation_id IS DISTINCT FROM li.lane_incarnation_id",
        category: Category::BadInput,
        detail: "the target is the lane the work already runs on",
    },
    Pred {
        sql: concatcp!("a.lifecycle = ", Lifecycle::Active.sql(), " AND a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL"),
        category: Category::WrongState,
        detail: "only RUNNING active work is handed off: the work is not active (blocked, in recovery, being handed off, or finishing)",
    },
    Pred {
        sql: "a.execution_owner IS NOT NULL AND a.pending_target IS NULL",
        category: Category::WrongState,
        detail: "only RUNNING active work is handed off: it has no execution owner, or a handoff is already pending",
    },
    Pred {
        sql: concatcp!("rs.reservation_id IS NOT NULL AND ls.state = ", LaneState::Running.sql()),
        category: Category::WrongState,
        detail: "only RUNNING active work is handed off: its lane is not RUNNING on an open reservation",
    },
    Pred {
        sql: concatcp!("li.state = ", LaneState::IdleClean.sql(), " AND li.retired_at IS NULL"),
        category: Category::WrongState,
        detail: "the target lane is not IDLE_CLEAN",
    },
    Pred {
        sql: "li.recreate_requested_at IS NULL AND li.host_quarantine_reason IS NULL",
        category: Category::WrongState,
        detail: "the target lane is being recreated, or its host quarantined it",
    },
    Pred {
        sql: super::leases::LEASE_ADMITS_WORK,
        category: Category::WrongState,
        detail: "the target lane's lease has ended, or is being destroyed or quarantined",
    },
    Pred {
        sql: "NOT EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id AND t.reconciled_at IS NULL)",
        category: Category::WrongState,
        detail: "the target lane has a termination receipt not reconciled yet",
    },
    Pred {
        sql: concatcp!("NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> ", GenState::Ended.sql(), ")"),
        category: Category::WrongState,
        detail: "the target lane has a generation not ended yet",
    },
    Pred {
        sql: "a.repository IS NULL OR (SELECT t.host_id FROM lanes t WHERE t.lane_id = li.lane_id) \
              IS DISTINCT FROM (SELECT s.host_id FROM lanes s WHERE s.lane_id = ls.lane_id)",
        category: Category::BadInput,
        detail: "work in a repository is handed off only to a lane of another host (its workspace is one directory on its host, which two generations never share): stop it and resume it on that lane instead",
    },
];

/// The target lane is reserved for the work (the offer's rows follow in the same commit).
static OFFER_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE lane_incarnations li SET state = {reserved} \
         FROM assignments a JOIN reservations rs ON rs.assignment_id = a.assignment_id \
                AND rs.released_at IS NULL AND rs.lane_incarnation_id = a.lane_incarnation_id \
              JOIN lane_incarnations ls ON ls.lane_incarnation_id = rs.lane_incarnation_id \
         WHERE li.lane_incarnation_id = $1 AND a.assignment_id = $2 AND {} \
         RETURNING li.lane_id",
        cas::conjunction(OFFER_PREDS),
        reserved = LaneState::Reserved.sql()
    )
});

/// The offer of a pre-transfer retarget (§6.3.3): the same CAS, and the candidate's ACK
/// (`$3`) admitted by the recovery predicate under the leader's epoch (`$4`).
static OFFER_CAS_RETARGET: LazyLock<String> = LazyLock::new(|| {
    OFFER_CAS.replace(
        " RETURNING li.lane_id",
        &format!(
            " AND $3::jsonb->>'operation' = 'pre-transfer' AND {} RETURNING li.lane_id",
            super::recovery::ADMITS_OFFER
        ),
    )
});

/// The refusal's explanation, from the work the offer names.
static OFFER_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        OFFER_PREDS,
        "FROM assignments a LEFT JOIN reservations rs ON rs.assignment_id = a.assignment_id \
                AND rs.released_at IS NULL AND rs.lane_incarnation_id = a.lane_incarnation_id \
              LEFT JOIN lane_incarnations ls ON ls.lane_incarnation_id = rs.lane_incarnation_id \
              LEFT JOIN lane_incarnations li ON li.lane_incarnation_id = $1 \
         WHERE a.assignment_id = $2",
    )
});

/// Whether reservation `$1` is the target chain of a handoff still open (read before the
/// chain is released: the release itself expires the offer and hands the work back to its
/// source — migration 0009 — so such a chain's end must not move the work to recovery).
pub(crate) const IS_OPEN_TARGET: &str = concatcp!(
    "SELECT EXISTS (SELECT 1 FROM handoffs WHERE target_reservation_id = $1 \
        AND state IN (",
    HandoffState::Offered.sql(),
    ", ",
    HandoffState::Challenged.sql(),
    ")) AS open"
);

impl Store {
    /// Offers RUNNING work to an idle lane: the target chain is reserved in the same commit.
    pub async fn offer_handoff(
        &self,
        l: &Leader,
        req: &OfferRequest,
    ) -> Result<Chain, AuthorityError> {
        self.offer_handoff_as(l, req, None).await
    }

    /// A pre-transfer retarget (§6.3.3): the offer to the candidate's lane, made by the CAS
    /// that consumes the candidate's recovery ACK — `(S,S,U)` with U's fresh target chain.
    pub async fn offer_handoff_retarget(
        &self,
        l: &Leader,
        req: &OfferRequest,
        c: &super::recovery::RecoveryConsume,
    ) -> Result<Chain, AuthorityError> {
        self.offer_handoff_as(l, req, Some(c)).await
    }

    async fn offer_handoff_as(
        &self,
        l: &Leader,
        req: &OfferRequest,
        recovery: Option<&super::recovery::RecoveryConsume>,
    ) -> Result<Chain, AuthorityError> {
        const OP: &str = "handoff-offer";
        if req.request_id.is_empty() || !(1000..=86_400_000).contains(&req.ttl_ms) {
            return Err(reject(
                OP,
                Category::BadInput,
                "a request id and a ttl of 1 s..24 h are required",
            ));
        }
        let step = Step::new(
            OP,
            l,
            format!("handoff-offer/{}", req.request_id),
            request_digest(
                OP,
                &[
                    &req.assignment_id,
                    &req.target_lane_incarnation_id,
                    req.task_text.as_deref().unwrap_or(""),
                    &req.ttl_ms.to_string(),
                    &recovery.map_or(String::new(), |c| c.param().to_string()),
                ],
            ),
        )
        .about(
            Some(&req.assignment_id),
            Some(&req.target_lane_incarnation_id),
        );
        let salt = secret::fence_salt().map_err(|e| AuthorityError::Entropy(e.to_string()))?;
        let (req, sec, epoch, sot) = (
            req.clone(),
            self.secret.clone(),
            l.epoch(),
            l.sot().to_string(),
        );
        let consume = recovery.cloned();
        let consume_param = recovery.map(|c| c.param());
        let r = self
            .transition(
                &step,
                body!([req, sec, salt, sot, consume, consume_param] |f| {
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
                        [&req.target_lane_incarnation_id, &req.assignment_id];
                    let d = match &consume {
                        None => f.cas(&OFFER_CAS, &params).await?,
                        Some(_) => {
                            // The work's row pinned before the snapshot is recomputed.
                            f.read("SELECT 1 FROM assignments WHERE assignment_id = $1 FOR UPDATE", &[&req.assignment_id]).await?;
                            f.cas(&OFFER_CAS_RETARGET, &[&req.target_lane_incarnation_id, &req.assignment_id, &consume_param, &epoch]).await?
                        }
                    };
                    let d = match d {
                        Ok(d) => d,
                        Err(u) => {
                            if let Some(c) = &consume {
                                if let Some(e) = super::recovery::why_not(u, c, &req.target_lane_incarnation_id, epoch).await? {
                                    return Err(e);
                                }
                                return Err(reject(OP, Category::WrongState, "the recovery candidate holds, but the work cannot be offered to its lane now (the source must be RUNNING with no handoff pending, the lane idle)"));
                            }
                            return Err(u.diagnose(&OFFER_DIAGNOSIS, &params, OFFER_PREDS, "no such assignment").await?);
                        }
                    };
                    let target_lane: String = d.row().col("lane_id")?;
                    let src = d.query(
                        "SELECT a.responsibility_owner, a.execution_owner, rs.assignment_attempt_id, rs.reservation_id, \
                                coalesce($2, (SELECT t.task_text FROM attempts t WHERE t.assignment_attempt_id = rs.assignment_attempt_id)) AS task_text, a.runtime_id \
                         FROM assignments a JOIN reservations rs ON rs.assignment_id = a.assignment_id AND rs.released_at IS NULL \
                           AND rs.lane_incarnation_id = a.lane_incarnation_id \
                         WHERE a.assignment_id = $1 FOR UPDATE OF a",
                        &[&req.assignment_id, &req.task_text],
                    ).await?;
                    let Some(src) = src.first() else {
                        return Err(reject(OP, Category::WrongState, "the work's source chain ended under the offer"));
                    };
                    // Re-checked under the row lock: the lane's CAS only read the assignment.
                    let exec: Option<String> = d.query(
                        concatcp!("SELECT a.execution_owner FROM assignments a WHERE a.assignment_id = $1 AND a.lifecycle = ", Lifecycle::Active.sql(), " \
                           AND a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL AND a.pending_target IS NULL \
                           AND a.execution_owner IS NOT NULL"),
                        &[&req.assignment_id],
                    ).await?.first().map(|r| r.col("execution_owner")).transpose()?;
                    let Some(exec) = exec else {
                        return Err(reject(OP, Category::WrongState, "the work changed under the offer; retry"));
                    };
                    let (resp, src_attempt, src_res, task, runtime): (String, String, String, String, String) =
                        (src.col("responsibility_owner")?, src.col("assignment_attempt_id")?, src.col("reservation_id")?,
                         src.col("task_text")?, src.col("runtime_id")?);
                    if let Err(e) = crate::adapter::validate_task(&runtime, &task) {
                        return Err(reject(OP, Category::BadInput, e.to_string()));
                    }
                    let handoff = format!("ho-{}", uuid::Uuid::new_v4().simple());
                    let attempt = format!("at-{}", uuid::Uuid::new_v4().simple());
                    let reservation = format!("rs-{}", uuid::Uuid::new_v4().simple());
                    let lease = format!("rl-{}", uuid::Uuid::new_v4().simple());
                    let ttl = format!("{} milliseconds", req.ttl_ms);
                    let fence_digest = sec.fence_digest(&sec.fence_token(&reservation, &salt));
                    let next_action = format!("continue on {target_lane}: its fresh generation acknowledges handoff {handoff}, then its own activation");
                    let nad = next_action_digest(&next_action);
                    let task_digest = crate::protocol::task::task_digest(&task);
                    let row = d.query_one(
                        "WITH t AS (INSERT INTO attempts (assignment_attempt_id, assignment_id, created_epoch, task_text, task_digest) \
                                    VALUES ($1, $2, $3, $4, $5) RETURNING 1), \
                              r AS (INSERT INTO reservations (reservation_id, reservation_epoch, reservation_lease_id, assignment_id, assignment_attempt_id, \
                                                              lane_incarnation_id, sot_incarnation, coordinator_epoch, deadline, fence_digest, fence_salt, handoff_id) \
                                    SELECT $6, (SELECT coalesce(max(px.reservation_epoch), 0) + 1 FROM reservations px WHERE px.lane_incarnation_id = $8), $7, $2, $1, $8, $9, $3, clock_timestamp() + $10::text::interval, $11, $12, $13 FROM t \
                                    RETURNING deadline, reservation_epoch) \
                         SELECT mosaic_ts(deadline) AS deadline, reservation_epoch FROM r",
                        &[&attempt, &req.assignment_id, &epoch, &task, &task_digest, &reservation, &lease, &req.target_lane_incarnation_id,
                          &sot, &ttl, &fence_digest, &salt, &handoff],
                    ).await?;
                    let deadline: String = row.col("deadline")?;
                    let reservation_epoch: i64 = row.col("reservation_epoch")?;
                    d.exec_one(
                        "INSERT INTO handoffs (handoff_id, assignment_id, responsibility_owner, execution_owner, pending_target, source_attempt_id, \
                                               source_reservation_id, target_attempt_id, target_reservation_id, target_lane_incarnation_id, \
                                               next_action, next_action_digest, sot_incarnation, coordinator_epoch, needs_checkpoint) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
                                 (SELECT repository IS NOT NULL FROM assignments WHERE assignment_id = $2))",
                        &[&handoff, &req.assignment_id, &resp, &exec, &target_lane, &src_attempt, &src_res, &attempt, &reservation,
                          &req.target_lane_incarnation_id, &next_action, &nad, &sot, &epoch],
                    ).await?;
                    d.exec_one(
                        concatcp!("UPDATE assignments SET pending_target = $2, work_status = ", WorkStatus::Handoff.sql(), ", next_action = $3 WHERE assignment_id = $1"),
                        &[&req.assignment_id, &target_lane, &next_action],
                    ).await?;
                    let retarget = match &consume {
                        Some(c) => Some(super::recovery::consume(&d, c, &reservation).await?),
                        None => None,
                    };
                    let chain = Chain {
                        lane_id: target_lane.clone(),
                        lane_incarnation_id: req.target_lane_incarnation_id.clone(),
                        assignment_id: req.assignment_id.clone(),
                        assignment_attempt_id: attempt,
                        reservation_id: reservation,
                        reservation_epoch,
                    };
                    d.decide(json!({ "handoff_id": handoff, "chain": chain, "reservation_lease_id": lease, "reservation_deadline": deadline,
                        "responsibility_owner": resp, "execution_owner": exec, "pending_target": target_lane,
                        "source_reservation_id": src_res, "next_action_digest": nad, "grants_effects": false, "retarget": retarget }))
                }),
            )
            .await?;
        serde_json::from_value(r.body["chain"].clone()).map_err(|e| AuthorityError::Invariant {
            op: "handoff-offer",
            detail: format!("its receipt has no chain: {e}"),
        })
    }

    /// The target's ACK: checked field by field against the offer and current state in one
    /// compare-and-swap; the source is fenced in the same commit. The identical ACK again
    /// returns the original receipt; any other ACK of a used challenge is refused.
    pub async fn accept_handoff(
        &self,
        l: &Leader,
        a: &HandoffAckClaim,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "handoff-accept";
        let step = Step::new(
            OP,
            l,
            format!("handoff-accept/{}", a.handoff_challenge_id),
            request_digest(
                OP,
                &[
                    &a.handoff_challenge_id,
                    &a.sot_incarnation,
                    &a.coordinator_epoch.to_string(),
                    &a.assignment_id,
                    &a.source_assignment_attempt_id,
                    &a.target_assignment_attempt_id,
                    &a.responsibility_owner,
                    &a.execution_owner,
                    &a.pending_target,
                    &a.next_action_digest,
                    &a.scope_digest,
                    &a.holds_digest,
                    &a.contracts_digest,
                    &a.lane_incarnation_id,
                    &a.generation.to_string(),
                    &a.challenge_deadline,
                    a.checkpoint_digest.as_deref().unwrap_or(""),
                    &a.ack_digest,
                ],
            ),
        )
        .about(Some(&a.assignment_id), Some(&a.lane_incarnation_id));
        let a = a.clone();
        self.transition(
            &step,
            body!([a] |f| {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 17] = [&a.handoff_challenge_id, &a.sot_incarnation,
                    &a.coordinator_epoch, &a.assignment_id, &a.source_assignment_attempt_id, &a.target_assignment_attempt_id,
                    &a.responsibility_owner, &a.execution_owner, &a.pending_target, &a.next_action_digest, &a.scope_digest,
                    &a.holds_digest, &a.lane_incarnation_id, &a.generation, &a.contracts_digest, &a.challenge_deadline, &a.checkpoint_digest];
                let d = match f.cas(&ACCEPT_CAS, &params).await? {
                    Ok(d) => d,
                    Err(u) => {
                        return Err(u.diagnose(&ACCEPT_DIAGNOSIS, &params, ACCEPT_PREDS, "no such handoff challenge").await?)
                    }
                };
                let handoff: String = d.row().col("handoff_id")?;
                let src_res: String = d.row().col("reservation_id")?;
                let src_inc: String = d.row().col("lane_incarnation_id")?;
                let src_gen: Option<i64> = d.row().col("generation")?;
                let target: String = d.row().col("pending_target")?;
                let body = json!({ "handoff_challenge_id": a.handoff_challenge_id, "assignment_id": a.assignment_id,
                    "target_assignment_attempt_id": a.target_assignment_attempt_id, "generation": a.generation,
                    "checkpoint_digest": a.checkpoint_digest });
                d.exec_one(
                    concatcp!("UPDATE handoffs SET state = ", HandoffState::Accepted.sql(), ", accepted_at = clock_timestamp(), ack_digest = $2, ack_body = $3 WHERE handoff_id = $1"),
                    &[&handoff, &a.ack_digest, &body],
                ).await?;
                // Fence the source: no lease, no reservation, its generation told to stop.
                let revoked = d.drain_running(&src_inc, &src_res, src_gen,
                    &format!("responsibility handed off to {target}")).await?;
                d.release_one(&src_res).await?;
                d.decide(json!({ "handoff_id": handoff, "assignment_id": a.assignment_id, "responsibility_owner": target,
                    "execution_owner": null, "pending_target": target, "source_reservation_id": src_res, "source_leases_revoked": revoked,
                    "source_generation_to_stop": src_gen, "grants": "responsibility only: no READY, RUNNING or lease" }))
            }),
        )
        .await
    }

    /// An accepted handoff's target chain, waiting in AWAITING_ACK without an activation
    /// challenge, gets its own (single-use, as every activation challenge).
    pub async fn issue_activation_challenge(
        &self,
        l: &Leader,
        c: &Chain,
        challenge_ttl_ms: i64,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "activation-challenge";
        let step = Step::new(
            OP,
            l,
            format!("activation-challenge/{}", c.reservation_id),
            request_digest(OP, &[&c.key()]),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let ttl = format!("{} milliseconds", challenge_ttl_ms.clamp(1000, 3_600_000));
        let (c, epoch) = (c.clone(), l.epoch());
        self.transition(
            &step,
            body!([c, ttl] |f| {
                let ch = format!("ch-{}", uuid::Uuid::new_v4().simple());
                let d = f.cas(
                    concatcp!("INSERT INTO challenges (challenge_id, reservation_id, sot_incarnation, coordinator_epoch, contracts_digest, expires_at) \
                     SELECT $1, r.reservation_id, r.sot_incarnation, $2, r.contracts_digest, LEAST(r.deadline, clock_timestamp() + $3::text::interval) \
                     FROM reservations r JOIN handoffs h ON h.handoff_id = r.handoff_id AND h.state = ", HandoffState::Accepted.sql(), " \
                     JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id AND li.state = ", LaneState::AwaitingAck.sql(), " \
                     JOIN assignments a ON a.assignment_id = r.assignment_id AND a.lifecycle = ", Lifecycle::Active.sql(), " AND a.execution_owner IS NULL \
                       AND a.responsibility_owner = h.pending_target AND a.pending_target = h.pending_target \
                     WHERE r.reservation_id = $4 AND r.released_at IS NULL AND r.deadline > clock_timestamp() AND r.coordinator_epoch = $2 \
                       AND NOT EXISTS (SELECT 1 FROM challenges c WHERE c.reservation_id = r.reservation_id) \
                     RETURNING challenge_id, mosaic_ts(expires_at) AS expires_at"),
                    &[&ch, &epoch, &ttl, &c.reservation_id],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "not an accepted handoff's target chain awaiting its activation challenge").await?),
                };
                let exp: String = d.row().col("expires_at")?;
                d.exec_one(
                    "UPDATE assignments SET next_action = 'the harness acknowledges challenge ' || $1 || ' (mosaic lane ack); then activation' WHERE assignment_id = $2",
                    &[&ch, &c.assignment_id],
                ).await?;
                d.decide(json!({ "chain": c, "challenge_id": ch, "challenge_kind": "activation", "challenge_expires_at": exp }))
            }),
        )
        .await
    }

    /// The handoff a target reservation belongs to.
    pub async fn handoff_of_reservation(
        &self,
        reservation_id: &str,
    ) -> Result<Option<HandoffView>, AuthorityError> {
        let c = self.pool.get().await?;
        let row = c
            .query_opt(
                "SELECT h.handoff_id, h.assignment_id, h.state, h.responsibility_owner, h.execution_owner, h.pending_target, h.source_attempt_id, \
                        h.target_attempt_id, h.target_reservation_id, h.next_action, h.next_action_digest, h.challenge_id, \
                        mosaic_ts(h.challenge_deadline) AS challenge_deadline, h.challenge_epoch, \
                        h.source_reservation_id, h.needs_checkpoint, h.checkpoint_digest, h.checkpoint_error \
                 FROM handoffs h JOIN reservations r ON r.handoff_id = h.handoff_id WHERE r.reservation_id = $1",
                &[&reservation_id],
            )
            .await?;
        row.map(|r| {
            Ok(HandoffView {
                handoff_id: r.col("handoff_id")?,
                assignment_id: r.col("assignment_id")?,
                state: r.col("state")?,
                responsibility_owner: r.col("responsibility_owner")?,
                execution_owner: r.col("execution_owner")?,
                pending_target: r.col("pending_target")?,
                source_attempt_id: r.col("source_attempt_id")?,
                target_attempt_id: r.col("target_attempt_id")?,
                target_reservation_id: r.col("target_reservation_id")?,
                next_action: r.col("next_action")?,
                next_action_digest: r.col("next_action_digest")?,
                challenge_id: r.col("challenge_id")?,
                challenge_deadline: r.col("challenge_deadline")?,
                challenge_epoch: r.col("challenge_epoch")?,
                source_reservation_id: r.col("source_reservation_id")?,
                needs_checkpoint: r.col("needs_checkpoint")?,
                checkpoint_digest: r.col("checkpoint_digest")?,
                checkpoint_error: r.col("checkpoint_error")?,
            })
        })
        .transpose()
    }
}
