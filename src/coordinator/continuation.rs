//! Continuations (spec §14 rule 11): the coordinator decides that RUNNING work goes on with
//! a next action, and delivers it to the live generation exactly once.
//!
//! ```text
//! create  ─► PENDING ─claim─► CLAIMED ─(host: settled, accept)─► DELIVERY_ACCEPTED ─result─► RESULT_RECORDED
//!                                │  claim past its deadline or of an older epoch: reclaimed
//!                                │  (new claim reference, attempt + 1); attempts used up or
//!                                ▼  the continuation's deadline passed: EXPIRED
//!   the generation ends or is told to stop: PENDING/CLAIMED → EXPIRED, DELIVERY_ACCEPTED → ABANDONED
//! ```
//!
//! Delivery is at least once (the coordinator resends the offer of the current claim);
//! logical acceptance is exactly once: the `continuation-accept` CAS needs the current claim
//! reference, unexpired claim and continuation deadlines (database time), the generation
//! still the RUNNING one of its reservation, and a loop budget above zero, and it debits the
//! budget in the same commit. The host makes the prompt visible only after that commit, and
//! records locally that it did; a continuation whose visibility is unknown is never
//! re-injected (its generation is replaced by the inactivity watchdog; the trigger of
//! migration 0008 abandons it).
//!
//! **Never:** lets a harness compose a continuation (only an operator or the coordinator
//! creates one), accepts one for a stale claim, generation or fence, or re-injects.

use const_format::concatcp;
use serde_json::json;
use std::sync::LazyLock;

use super::cas::{self, Pred};
use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::rows::RowExt;
use super::states::{ContinuationState, GenState, LaneState, Lifecycle, WatchdogStep, WorkStatus};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

/// How long one claim may wait for its host's acceptance before it is reclaimed.
pub const CLAIM_TTL_MS: i64 = 5_000;
/// Claims (the first included) before an undelivered continuation expires.
pub const MAX_CLAIMS: i32 = 5;

/// A continuation as the driver sends it.
#[derive(Debug, Clone)]
pub struct ContinuationView {
    pub continuation_id: String,
    pub assignment_id: String,
    pub reservation_id: String,
    pub state: ContinuationState,
    pub next_action: String,
    pub next_action_digest: String,
    pub expires_at: String,
    pub claim_ref: Option<String>,
    pub claimant_epoch: Option<i64>,
    pub claim_expired: bool,
    pub expired: bool,
    pub attempts: i32,
    pub max_attempts: i32,
    pub budget: i32,
}

/// The host's acceptance, as its envelope bound it.
#[derive(Debug, Clone)]
pub struct AcceptClaim {
    pub continuation_id: String,
    pub claim_ref: String,
    pub reservation_id: String,
    pub lane_incarnation_id: String,
    pub generation: i64,
    pub next_action_digest: String,
}

/// Every expected value of a new continuation, in diagnosis order (over the assignment,
/// its open reservation on its lane, that lane and its generation); the CAS and its
/// refusal's explanation are both built from it. The predicates bind no parameter.
const CREATE_PREDS: &[Pred] = &[
    Pred {
        sql: concatcp!("NOT EXISTS (SELECT 1 FROM continuations oc WHERE oc.assignment_id = a.assignment_id AND oc.state IN (", ContinuationState::Pending.sql(), ", ", ContinuationState::Claimed.sql(), ", ", ContinuationState::DeliveryAccepted.sql(), "))"),
        category: Category::Conflict,
        detail: "the assignment already has an open continuation",
    },
    Pred {
        sql: "a.continuation_budget > 0",
        category: Category::WrongState,
        detail: "the assignment's loop budget is used up",
    },
    Pred {
        sql: concatcp!("a.lifecycle = ", Lifecycle::Active.sql(), " AND a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL"),
        category: Category::WrongState,
        detail: "continuations go to active work only (not blocked, handed off, in recovery or finishing)",
    },
    Pred {
        sql: "r.reservation_id IS NOT NULL",
        category: Category::WrongState,
        detail: "the work has no open reservation on its lane",
    },
    Pred {
        sql: concatcp!("li.state = ", LaneState::Running.sql()),
        category: Category::WrongState,
        detail: "continuations go to RUNNING work only: the lane is not RUNNING",
    },
    Pred {
        sql: concatcp!("g.state = ", GenState::Live.sql(), " AND g.stop_requested_at IS NULL"),
        category: Category::WrongState,
        detail: "the generation is not live, or is being stopped",
    },
];

/// The rows `CREATE_PREDS` speak about, for the CAS (inner joins) and the diagnosis (left
/// joins from the assignment, `$1` there).
macro_rules! create_rows {
    ($join:literal, $asg:literal) => {
        concat!(
            "FROM assignments a ", $join, " reservations r ON r.assignment_id = a.assignment_id AND r.released_at IS NULL \
               AND r.lane_incarnation_id = a.lane_incarnation_id \
             ", $join, " lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
             ", $join, " generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
             WHERE a.assignment_id = ", $asg
        )
    };
}

/// A continuation for RUNNING active work with budget left and none open.
static CREATE_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO continuations (continuation_id, assignment_id, assignment_attempt_id, reservation_id, lane_incarnation_id, generation, \
                                    next_action, next_action_digest, scope_digest, holds_digest, contracts_digest, sot_incarnation, \
                                    coordinator_epoch, expires_at, max_attempts) \
         SELECT $1, a.assignment_id, r.assignment_attempt_id, r.reservation_id, r.lane_incarnation_id, r.generation, $3, $4, \
                a.scope_digest, a.holds_digest, r.contracts_digest, $5, $6, clock_timestamp() + $7::text::interval, $8 \
         {} AND {} \
         RETURNING continuation_id, mosaic_ts(expires_at) AS expires_at, generation",
        create_rows!("JOIN", "$2"),
        cas::conjunction(CREATE_PREDS)
    )
});

/// The refusal's explanation, from the assignment the request names (`$1`).
static CREATE_DIAGNOSIS: LazyLock<String> =
    LazyLock::new(|| cas::diagnosis(CREATE_PREDS, create_rows!("LEFT JOIN", "$1")));

/// Every expected value of a continuation's acceptance, in diagnosis order; the CAS and its
/// refusal's explanation are both built from it. Parameters: $1 continuation, $2 claim, $3
/// reservation, $4 lane incarnation, $5 generation, $6 next-action digest, $7 the
/// claimant's epoch.
const ACCEPT_PREDS: &[Pred] = &[
    Pred {
        sql: concatcp!("c.state = ", ContinuationState::Claimed.sql()),
        category: Category::WrongState,
        detail: "the continuation is not CLAIMED",
    },
    Pred {
        sql: "c.claim_ref = $2 AND c.claimant_epoch = $7",
        category: Category::Mismatch,
        detail: "a stale claim: the continuation was reclaimed since",
    },
    Pred {
        sql: "c.claim_deadline > clock_timestamp() AND c.expires_at > clock_timestamp()",
        category: Category::Expired,
        detail: "the claim or the continuation deadline has passed (database time)",
    },
    Pred {
        sql: "c.reservation_id = $3",
        category: Category::WrongState,
        detail: "reservation_id is not the continuation's",
    },
    Pred {
        sql: "c.lane_incarnation_id = $4",
        category: Category::WrongState,
        detail: "lane_incarnation_id is not the continuation's",
    },
    Pred {
        sql: "c.generation = $5",
        category: Category::WrongState,
        detail: "generation is not the continuation's",
    },
    Pred {
        sql: "c.next_action_digest = $6",
        category: Category::WrongState,
        detail: "next_action_digest is not the continuation's",
    },
    Pred {
        sql: concatcp!(
            "x.lifecycle = ",
            Lifecycle::Active.sql(),
            " AND x.work_status = ",
            WorkStatus::Active.sql(),
            " AND x.requested_outcome IS NULL"
        ),
        category: Category::WrongState,
        detail: "the work is no longer active (blocked, handed off, or an outcome was requested)",
    },
    Pred {
        sql: "x.continuation_budget > 0",
        category: Category::WrongState,
        detail: "the assignment's loop budget is used up",
    },
    Pred {
        sql: "r.released_at IS NULL AND r.generation = c.generation",
        category: Category::WrongState,
        detail: "the generation's reservation was released",
    },
    Pred {
        sql: concatcp!("li.state = ", LaneState::Running.sql()),
        category: Category::WrongState,
        detail: "the lane is not RUNNING",
    },
    Pred {
        sql: concatcp!(
            "g.state = ",
            GenState::Live.sql(),
            " AND g.stop_requested_at IS NULL"
        ),
        category: Category::WrongState,
        detail: "the generation is not live, or is being stopped",
    },
];

/// The acceptance: the loop budget debited (the work row decided first, so a concurrent
/// change leaves the continuation untouched), then the continuation moved on, in one
/// statement.
static ACCEPT_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH b AS (UPDATE assignments x SET continuation_budget = x.continuation_budget - 1 \
                    FROM continuations c, reservations r, lane_incarnations li, generations g \
                    WHERE c.continuation_id = $1 AND x.assignment_id = c.assignment_id AND r.reservation_id = c.reservation_id \
                      AND li.lane_incarnation_id = r.lane_incarnation_id \
                      AND g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
                      AND {} \
                    RETURNING x.assignment_id, x.continuation_budget) \
         UPDATE continuations c SET state = {accepted}, accepted_at = clock_timestamp(), budget_after = b.continuation_budget \
         FROM b WHERE c.continuation_id = $1 AND c.state = {claimed} AND c.claim_ref = $2 AND c.claimant_epoch = $7 \
           AND c.claim_deadline > clock_timestamp() AND c.expires_at > clock_timestamp() \
         RETURNING c.assignment_id, c.next_action, b.continuation_budget",
        cas::conjunction(ACCEPT_PREDS),
        accepted = ContinuationState::DeliveryAccepted.sql(),
        claimed = ContinuationState::Claimed.sql()
    )
});

/// The refusal's explanation: each predicate over the same rows, reached from the
/// continuation the acceptance names.
static ACCEPT_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        ACCEPT_PREDS,
        "FROM continuations c LEFT JOIN assignments x ON x.assignment_id = c.assignment_id \
         LEFT JOIN reservations r ON r.reservation_id = c.reservation_id \
         LEFT JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
         LEFT JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
         WHERE c.continuation_id = $1",
    )
});

impl Store {
    /// Creates a continuation for RUNNING active work: bound to its reservation,
    /// generation and digests, with a database deadline. One open continuation per
    /// assignment; none without loop budget.
    pub async fn create_continuation(
        &self,
        l: &Leader,
        assignment_id: &str,
        next_action: &str,
        request_id: &str,
        ttl_ms: i64,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "continuation-create";
        if !crate::protocol::work::next_action_ok(next_action)
            || !(1000..=86_400_000).contains(&ttl_ms)
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "a continuation needs an executable next action (one line) and a ttl of 1 s..24 h",
            ));
        }
        let step = Step::new(
            OP,
            l,
            format!("continuation-create/{request_id}"),
            request_digest(OP, &[assignment_id, next_action, &ttl_ms.to_string()]),
        )
        .about(Some(assignment_id), None);
        let (asg, next, epoch, sot) = (
            assignment_id.to_string(),
            next_action.to_string(),
            l.epoch(),
            l.sot().to_string(),
        );
        let nad = super::handoff::next_action_digest(next_action);
        let ttl = format!("{ttl_ms} milliseconds");
        self.transition(
            &step,
            body!([asg, next, sot, nad, ttl] |f| {
                let id = format!("cn-{}", uuid::Uuid::new_v4().simple());
                let d = f.cas(
                    &CREATE_CAS,
                    &[&id, &asg, &next, &nad, &sot, &epoch, &ttl, &super::continuation::MAX_CLAIMS],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let not_found = "no such assignment";
                        return Err(u.diagnose(&CREATE_DIAGNOSIS, &[&asg], CREATE_PREDS, not_found).await?);
                    }
                };
                let exp: String = d.row().col("expires_at")?;
                let generation: i64 = d.row().col("generation")?;
                d.decide(json!({ "continuation_id": id, "assignment_id": asg, "generation": generation, "expires_at": exp,
                    "next_action_digest": nad, "state": ContinuationState::Pending }))
            }),
        )
        .await
    }

    /// Claims a continuation for delivery: from PENDING, or reclaims one whose claim is past
    /// its deadline or of another epoch. Each claim gets a fresh reference; the previous
    /// claimant's deliveries are refused at acceptance from now on.
    pub async fn claim_continuation(
        &self,
        l: &Leader,
        v: &ContinuationView,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "continuation-claim";
        let step = Step::new(
            OP,
            l,
            format!(
                "continuation-claim/{}/{}",
                v.continuation_id,
                v.attempts + 1
            ),
            request_digest(OP, &[&v.continuation_id, &(v.attempts + 1).to_string()]),
        )
        .about(Some(&v.assignment_id), None);
        let (id, attempts, epoch) = (v.continuation_id.clone(), v.attempts, l.epoch());
        let ttl = format!("{CLAIM_TTL_MS} milliseconds");
        self.transition(
            &step,
            body!([id, ttl] |f| {
                let claim = format!("cc-{}", crate::util::random_hex(32).map_err(AuthorityError::Entropy)?);
                let d = f.cas(
                    concatcp!("UPDATE continuations c SET state = ", ContinuationState::Claimed.sql(), ", claim_ref = $2, claimant_epoch = $3, \
                            claim_deadline = LEAST(c.expires_at, clock_timestamp() + $4::text::interval), attempts = c.attempts + 1 \
                     WHERE c.continuation_id = $1 AND c.attempts = $5 AND c.attempts < c.max_attempts AND c.expires_at > clock_timestamp() \
                       AND (c.state = ", ContinuationState::Pending.sql(), " OR (c.state = ", ContinuationState::Claimed.sql(), " AND (c.claim_deadline <= clock_timestamp() OR c.claimant_epoch <> $3))) \
                     RETURNING mosaic_ts(c.claim_deadline) AS claim_deadline"),
                    &[&id, &claim, &epoch, &ttl, &attempts],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState,
                        "not a pending continuation, nor a claimed one past its claim deadline or of another epoch, with attempts and time left").await?),
                };
                let until: String = d.row().col("claim_deadline")?;
                d.decide(json!({ "continuation_id": id, "claim_ref": claim, "claimant_epoch": epoch, "claim_deadline": until,
                    "attempt": attempts + 1 }))
            }),
        )
        .await
    }

    /// Logical acceptance, exactly once: the current claim, both deadlines unexpired, the
    /// generation still the RUNNING one it was bound to, loop budget left — and the budget
    /// debited in the same commit. The same acceptance again lands on its first receipt.
    pub async fn accept_continuation(
        &self,
        l: &Leader,
        a: &AcceptClaim,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "continuation-accept";
        let step = Step::new(
            OP,
            l,
            format!("continuation-accept/{}", a.continuation_id),
            request_digest(
                OP,
                &[
                    &a.continuation_id,
                    &a.claim_ref,
                    &a.reservation_id,
                    &a.lane_incarnation_id,
                    &a.generation.to_string(),
                    &a.next_action_digest,
                ],
            ),
        )
        .about(None, Some(&a.lane_incarnation_id));
        let (a, epoch) = (a.clone(), l.epoch());
        self.transition(
            &step,
            body!([a] |f| {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [&a.continuation_id, &a.claim_ref,
                    &a.reservation_id, &a.lane_incarnation_id, &a.generation, &a.next_action_digest, &epoch];
                let d = match f.cas(&ACCEPT_CAS, &params).await? {
                    Ok(d) => d,
                    Err(u) => {
                        return Err(u.diagnose(&ACCEPT_DIAGNOSIS, &params, ACCEPT_PREDS, "no such continuation").await?)
                    }
                };
                let asg: String = d.row().col("assignment_id")?;
                let next: String = d.row().col("next_action")?;
                let budget: i32 = d.row().col("continuation_budget")?;
                d.decide(json!({ "continuation_id": a.continuation_id, "assignment_id": asg, "generation": a.generation,
                    "state": ContinuationState::DeliveryAccepted, "loop_budget_left": budget, "next_action": next }))
            }),
        )
        .await
    }

    /// The harness finished the continuation: its result (evidence digest) is recorded, from
    /// the generation that accepted it.
    pub async fn record_continuation_result(
        &self,
        l: &Leader,
        continuation_id: &str,
        lane_incarnation_id: &str,
        generation: i64,
        evidence_digest: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "continuation-result";
        if !crate::protocol::envelope::is_digest(evidence_digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "a result needs an evidence digest",
            ));
        }
        let step = Step::new(
            OP,
            l,
            format!("continuation-result/{continuation_id}"),
            request_digest(
                OP,
                &[
                    continuation_id,
                    lane_incarnation_id,
                    &generation.to_string(),
                    evidence_digest,
                ],
            ),
        )
        .about(None, Some(lane_incarnation_id));
        let (id, inc, ev) = (
            continuation_id.to_string(),
            lane_incarnation_id.to_string(),
            evidence_digest.to_string(),
        );
        self.transition(
            &step,
            body!([id, inc, ev] |f| {
                let d = f.cas(
                    concatcp!("UPDATE continuations c SET state = ", ContinuationState::ResultRecorded.sql(), ", result_at = clock_timestamp(), result_evidence_digest = $4 \
                     WHERE c.continuation_id = $1 AND c.state = ", ContinuationState::DeliveryAccepted.sql(), " AND c.lane_incarnation_id = $2 AND c.generation = $3 \
                     RETURNING c.assignment_id"),
                    &[&id, &inc, &generation, &ev],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "no accepted continuation of this generation with that id").await?),
                };
                let asg: String = d.row().col("assignment_id")?;
                d.decide(json!({ "continuation_id": id, "assignment_id": asg, "state": ContinuationState::ResultRecorded, "result_evidence_digest": ev }))
            }),
        )
        .await
    }

    /// An undelivered continuation whose attempts or deadline ran out.
    pub async fn expire_continuation(
        &self,
        l: &Leader,
        v: &ContinuationView,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "continuation-expire";
        let step = Step::new(
            OP,
            l,
            format!("continuation-expire/{}", v.continuation_id),
            request_digest(OP, &[&v.continuation_id]),
        )
        .about(Some(&v.assignment_id), None);
        let id = v.continuation_id.clone();
        self.transition(
            &step,
            body!([id] |f| {
                let d = f.cas(
                    concatcp!("UPDATE continuations c SET state = ", ContinuationState::Expired.sql(), " WHERE c.continuation_id = $1 AND c.state IN (", ContinuationState::Pending.sql(), ", ", ContinuationState::Claimed.sql(), ") \
                       AND (c.expires_at <= clock_timestamp() \
                            OR (c.attempts >= c.max_attempts AND (c.state = ", ContinuationState::Pending.sql(), " OR c.claim_deadline <= clock_timestamp()))) \
                     RETURNING c.attempts"),
                    &[&id],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "not an undelivered continuation out of time or attempts").await?),
                };
                let attempts: i32 = d.row().col("attempts")?;
                d.decide(json!({ "continuation_id": id, "state": ContinuationState::Expired, "attempts": attempts }))
            }),
        )
        .await
    }

    /// An accepted continuation whose result did not come by its deadline: whether the
    /// harness ever saw it is unknown, so it is abandoned — never injected again — and its
    /// generation is replaced (a fresh one of the same assignment, by the watchdog).
    pub async fn abandon_continuation(
        &self,
        l: &Leader,
        v: &ContinuationView,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "continuation-abandon";
        let step = Step::new(
            OP,
            l,
            format!("continuation-abandon/{}", v.continuation_id),
            request_digest(OP, &[&v.continuation_id]),
        )
        .about(Some(&v.assignment_id), None);
        let id = v.continuation_id.clone();
        self.transition(
            &step,
            body!([id] |f| {
                let d = f.cas(
                    concatcp!("UPDATE continuations c SET state = ", ContinuationState::Abandoned.sql(), " WHERE c.continuation_id = $1 AND c.state = ", ContinuationState::DeliveryAccepted.sql(), " \
                       AND c.expires_at <= clock_timestamp() \
                     RETURNING c.assignment_id, c.reservation_id, c.lane_incarnation_id, c.generation"),
                    &[&id],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "not an accepted continuation past its deadline without a result").await?),
                };
                let (asg, res, inc, g): (String, String, String, i64) = (
                    d.row().col("assignment_id")?,
                    d.row().col("reservation_id")?,
                    d.row().col("lane_incarnation_id")?,
                    d.row().col("generation")?,
                );
                // Replace the generation if it still runs this work: the same moves as an
                // inactivity replacement.
                let replaced = d.exec(
                    concatcp!("UPDATE assignments a SET lifecycle = ", Lifecycle::Recovery.sql(), ", execution_owner = NULL, pending_target = NULL, watchdog_step = ", WatchdogStep::Replacing.sql(), ", \
                            next_action = 'the watchdog starts a fresh generation: a continuation''s delivery is ambiguous' \
                     FROM reservations r, lane_incarnations li \
                     WHERE a.assignment_id = $1 AND a.lifecycle = ", Lifecycle::Active.sql(), " AND a.requested_outcome IS NULL AND a.lane_incarnation_id = $3 \
                       AND r.reservation_id = $2 AND r.released_at IS NULL AND r.generation = $4 \
                       AND li.lane_incarnation_id = $3 AND li.state = ", LaneState::Running.sql()),
                    &[&asg, &res, &inc, &g],
                ).await?;
                if replaced == 1 {
                    d.drain_running(&inc, &res, Some(g), "a continuation's delivery is ambiguous").await?;
                }
                d.decide(json!({ "continuation_id": id, "assignment_id": asg, "state": ContinuationState::Abandoned, "generation_replaced": replaced == 1,
                    "generation": g }))
            }),
        )
        .await
    }

    /// Every open continuation, with what time says about it (database time).
    pub async fn open_continuations(&self) -> Result<Vec<ContinuationView>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                concatcp!("SELECT c.continuation_id, c.assignment_id, c.reservation_id, c.state, c.next_action, c.next_action_digest, \
                        mosaic_ts(c.expires_at) AS expires_at, c.claim_ref, c.claimant_epoch, c.claim_deadline <= clock_timestamp() AS claim_expired, \
                        c.expires_at <= clock_timestamp() AS expired, c.attempts, c.max_attempts, a.continuation_budget \
                 FROM continuations c JOIN assignments a USING (assignment_id) \
                 WHERE c.state IN (", ContinuationState::Pending.sql(), ", ", ContinuationState::Claimed.sql(), ", ", ContinuationState::DeliveryAccepted.sql(), ") ORDER BY c.created_at"),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ContinuationView {
                    continuation_id: r.col("continuation_id")?,
                    assignment_id: r.col("assignment_id")?,
                    reservation_id: r.col("reservation_id")?,
                    state: r.col("state")?,
                    next_action: r.col("next_action")?,
                    next_action_digest: r.col("next_action_digest")?,
                    expires_at: r.col("expires_at")?,
                    claim_ref: r.col("claim_ref")?,
                    claimant_epoch: r.col("claimant_epoch")?,
                    claim_expired: r.col::<Option<bool>>("claim_expired")?.unwrap_or(true),
                    expired: r.col("expired")?,
                    attempts: r.col("attempts")?,
                    max_attempts: r.col("max_attempts")?,
                    budget: r.col("continuation_budget")?,
                })
            })
            .collect()
    }
}
