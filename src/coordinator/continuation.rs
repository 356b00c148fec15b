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
                    concatcp!("INSERT INTO continuations (continuation_id, assignment_id, assignment_attempt_id, reservation_id, lane_incarnation_id, generation, \
                                                next_action, next_action_digest, scope_digest, holds_digest, contracts_digest, sot_incarnation, \
                                                coordinator_epoch, expires_at, max_attempts) \
                     SELECT $1, a.assignment_id, r.assignment_attempt_id, r.reservation_id, r.lane_incarnation_id, r.generation, $3, $4, \
                            a.scope_digest, a.holds_digest, r.contracts_digest, $5, $6, clock_timestamp() + $7::text::interval, $8 \
                     FROM assignments a JOIN reservations r ON r.assignment_id = a.assignment_id AND r.released_at IS NULL \
                       AND r.lane_incarnation_id = a.lane_incarnation_id \
                     JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id AND li.state = ", LaneState::Running.sql(), " \
                     JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation AND g.state = ", GenState::Live.sql(), " \
                       AND g.stop_requested_at IS NULL \
                     WHERE a.assignment_id = $2 AND a.lifecycle = ", Lifecycle::Active.sql(), " AND a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL \
                       AND a.continuation_budget > 0 \
                       AND NOT EXISTS (SELECT 1 FROM continuations c WHERE c.assignment_id = a.assignment_id \
                                       AND c.state IN (", ContinuationState::Pending.sql(), ", ", ContinuationState::Claimed.sql(), ", ", ContinuationState::DeliveryAccepted.sql(), ")) \
                     RETURNING continuation_id, mosaic_ts(expires_at) AS expires_at, generation"),
                    &[&id, &asg, &next, &nad, &sot, &epoch, &ttl, &super::continuation::MAX_CLAIMS],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let r = u.read_opt(
                            concatcp!("SELECT a.lifecycle, a.work_status, a.continuation_budget, \
                                    EXISTS (SELECT 1 FROM continuations c WHERE c.assignment_id = a.assignment_id AND c.state IN (", ContinuationState::Pending.sql(), ", ", ContinuationState::Claimed.sql(), ", ", ContinuationState::DeliveryAccepted.sql(), ")) AS open \
                             FROM assignments a WHERE a.assignment_id = $1"),
                            &[&asg],
                        ).await?;
                        let r = match r {
                            None => None,
                            Some(r) => Some((
                                r.col::<Lifecycle>("lifecycle")?,
                                r.col::<WorkStatus>("work_status")?,
                                r.col::<i32>("continuation_budget")?,
                                r.col::<bool>("open")?,
                            )),
                        };
                        return Err(match r {
                            None => u.reject(Category::NotFound, format!("no assignment {asg}")).await?,
                            Some((.., true)) => u.reject(Category::Conflict, "the assignment already has an open continuation").await?,
                            Some((_, _, 0, _)) => u.reject(Category::WrongState, "the assignment's loop budget is used up").await?,
                            Some((life, work, ..)) => u.reject(Category::WrongState, format!("continuations go to RUNNING active work only (assignment {life}, work {work})")).await?,
                        });
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
                let d = f.cas(
                    concatcp!("WITH b AS (UPDATE assignments x SET continuation_budget = x.continuation_budget - 1 \
                                FROM continuations c, reservations r, lane_incarnations li, generations g \
                                WHERE c.continuation_id = $1 AND c.state = ", ContinuationState::Claimed.sql(), " AND c.claim_ref = $2 AND c.claimant_epoch = $7 \
                                  AND c.claim_deadline > clock_timestamp() AND c.expires_at > clock_timestamp() \
                                  AND c.reservation_id = $3 AND c.lane_incarnation_id = $4 AND c.generation = $5 AND c.next_action_digest = $6 \
                                  AND x.assignment_id = c.assignment_id AND x.lifecycle = ", Lifecycle::Active.sql(), " AND x.work_status = ", WorkStatus::Active.sql(), " \
                                  AND x.requested_outcome IS NULL AND x.continuation_budget > 0 \
                                  AND r.reservation_id = c.reservation_id AND r.released_at IS NULL AND r.generation = c.generation \
                                  AND li.lane_incarnation_id = r.lane_incarnation_id AND li.state = ", LaneState::Running.sql(), " \
                                  AND g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation AND g.state = ", GenState::Live.sql(), " \
                                  AND g.stop_requested_at IS NULL \
                                RETURNING x.assignment_id, x.continuation_budget) \
                     UPDATE continuations c SET state = ", ContinuationState::DeliveryAccepted.sql(), ", accepted_at = clock_timestamp(), budget_after = b.continuation_budget \
                     FROM b WHERE c.continuation_id = $1 AND c.state = ", ContinuationState::Claimed.sql(), " AND c.claim_ref = $2 AND c.claimant_epoch = $7 \
                       AND c.claim_deadline > clock_timestamp() AND c.expires_at > clock_timestamp() \
                     RETURNING c.assignment_id, c.next_action, b.continuation_budget"),
                    &[&a.continuation_id, &a.claim_ref, &a.reservation_id, &a.lane_incarnation_id, &a.generation, &a.next_action_digest, &epoch],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let r = u.read_opt(
                            "SELECT state, claim_ref = $2 AS same_claim, claim_deadline <= clock_timestamp() OR expires_at <= clock_timestamp() AS expired, \
                                    claimant_epoch = $3 AS same_epoch \
                             FROM continuations WHERE continuation_id = $1",
                            &[&a.continuation_id, &a.claim_ref, &epoch],
                        ).await?;
                        let r = match r {
                            None => None,
                            Some(r) => Some((
                                r.col::<ContinuationState>("state")?,
                                r.col::<Option<bool>>("same_claim")?.unwrap_or(false)
                                    && r.col::<Option<bool>>("same_epoch")?.unwrap_or(false),
                                r.col::<Option<bool>>("expired")?.unwrap_or(true),
                            )),
                        };
                        return Err(match r {
                            None => u.reject(Category::NotFound, "no such continuation").await?,
                            Some((state, ..)) if state != ContinuationState::Claimed => u.reject(Category::WrongState, format!("the continuation is {state}")).await?,
                            Some((_, false, _)) => u.reject(Category::Mismatch, "a stale claim: the continuation was reclaimed since").await?,
                            Some((_, _, true)) => u.reject(Category::Expired, "the claim or the continuation deadline has passed (database time)").await?,
                            Some(_) => u.reject(Category::WrongState, "the generation, its fence or the loop budget no longer allow this continuation").await?,
                        });
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
