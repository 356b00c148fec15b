//! The inactivity watchdog's transitions (spec §14): what is due (`due_work`), the warning
//! and escalation of one inactivity period, the replacement of a generation that stopped
//! making progress, and the work blocked once its attempts are used up — each by a fenced
//! compare-and-swap at database time, never a host clock.
//!
//! Work offered to another lane and not acknowledged stays its sender's and is watched the
//! same way (§17 Unacknowledged handoff): no progress can be recorded while the offer is
//! open, so an offer nobody takes ends, at the latest, when the deadline replaces its
//! source (the work leaving ACTIVE withdraws the offer, migration 0007).
//!
//! **Never:** counts anything but validated progress (`continuity::record_progress`) as
//! life, or replaces work before its deadline (equality is expired).

use const_format::concatcp;
use serde_json::json;

use super::error::{AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::rows::RowExt;
use super::states::{GenState, LaneState, Lifecycle, WatchdogStep, WorkStatus};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

/// What the watchdog found due for one assignment.
#[derive(Debug, Clone)]
pub struct DueWork {
    pub assignment_id: String,
    pub lifecycle: Lifecycle,
    pub step: WatchdogStep,
    pub lane_incarnation_id: String,
    pub lane_id: String,
    pub lane_state: LaneState,
    pub host_id: String,
    pub runtime_id: String,
    pub base_at: String,
    pub warn_due: bool,
    pub escalate_due: bool,
    pub deadline_due: bool,
    /// Attempts used against the current budget.
    pub attempts_used: i64,
    /// Attempts ever made (never reused as a request id).
    pub attempts_total: i64,
    pub max_attempts: i32,
    pub attempts_on_lane: i64,
    pub replacements_before_reassign: i32,
    /// The open chain of a RUNNING assignment.
    pub chain: Option<Chain>,
    /// A generation of the assignment is not ended yet.
    pub unended: bool,
}

/// What the watchdog needs to start the next attempt.
#[derive(Debug, Clone)]
pub struct NextAttempt {
    pub task_text: String,
    pub scope: Vec<String>,
    pub holds: Vec<String>,
    pub completion_policy: String,
    pub runtime_id: String,
}

impl Store {
    /// The watchdog's warning or escalation: one per inactivity period (the key names the
    /// period's base), only past its threshold by database time.
    pub async fn inactivity_notice(
        &self,
        l: &Leader,
        w: &DueWork,
        escalate: bool,
    ) -> Result<Receipt, AuthorityError> {
        let (op, from, to, column): (&'static str, WatchdogStep, WatchdogStep, &str) = if escalate {
            (
                "inactivity-escalate",
                WatchdogStep::Warned,
                WatchdogStep::Escalated,
                "escalate_after_ms",
            )
        } else {
            (
                "inactivity-warn",
                WatchdogStep::None,
                WatchdogStep::Warned,
                "warn_after_ms",
            )
        };
        let step = Step::new(
            op,
            l,
            format!("{op}/{}/{}", w.assignment_id, w.base_at),
            request_digest(op, &[&w.assignment_id, &w.base_at]),
        )
        .about(Some(&w.assignment_id), Some(&w.lane_incarnation_id));
        let sql = format!(
            "UPDATE assignments a SET watchdog_step = $3 FROM inactivity_policies pol, lane_incarnations li \
             WHERE a.assignment_id = $1 AND a.lifecycle = {active} AND a.work_status IN ({work_active}, {work_handoff}) AND a.requested_outcome IS NULL \
               AND a.watchdog_step = $2 AND mosaic_ts(a.inactivity_base_at) = $4 \
               AND pol.policy_id = a.inactivity_policy AND a.inactivity_base_at + pol.{column} * interval '1 millisecond' <= clock_timestamp() \
               AND li.lane_incarnation_id = a.lane_incarnation_id AND li.state = {running} \
             RETURNING mosaic_ts(a.inactivity_deadline) AS inactivity_deadline, a.responsibility_owner, a.next_action",
        active = Lifecycle::Active.sql(),
        work_active = WorkStatus::Active.sql(),
        work_handoff = WorkStatus::Handoff.sql(),
        running = LaneState::Running.sql()
        );
        let w = w.clone();
        // (The notice changes no authority; its CAS is the work row in its expected step.)
        self.transition(
            &step,
            body!([w, sql] |f| {
                let d = f.cas(&sql, &[&w.assignment_id, &from, &to, &w.base_at]).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, format!(
                        "not active RUNNING work {from} and past its threshold since {} (database time)", w.base_at)).await?),
                };
                let deadline: String = d.row().col("inactivity_deadline")?;
                let owner: String = d.row().col("responsibility_owner")?;
                let next: String = d.row().col("next_action")?;
                d.decide(json!({ "assignment_id": w.assignment_id, "lane_id": w.lane_id, "watchdog_step": to,
                    "no_progress_since": w.base_at, "inactivity_deadline": deadline, "responsibility_owner": owner, "next_action": next }))
            }),
        )
        .await
    }

    /// The inactivity deadline passed on a RUNNING generation: its leases are revoked, the
    /// host is told to stop it, and the assignment goes to recovery for the watchdog's next
    /// attempt. Of this and a concurrent progress receipt exactly one decides: this one
    /// needs `deadline <= now`, progress needs `deadline > now`, both on the same row.
    pub async fn inactivity_replace(
        &self,
        l: &Leader,
        c: &Chain,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "inactivity-replace";
        let step = Step::new(
            OP,
            l,
            format!("inactivity-replace/{}", c.reservation_id),
            request_digest(OP, &[&c.key()]),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let c = c.clone();
        self.transition(
            &step,
            body!([c] |f| {
                // The work row is the compare-and-swap (it is what progress updates too, so of
                // the two exactly one decides, whatever the interleaving); the lane follows.
                let d = f.cas(
                    concatcp!("UPDATE assignments a SET lifecycle = ", Lifecycle::Recovery.sql(), ", execution_owner = NULL, pending_target = NULL, watchdog_step = ", WatchdogStep::Replacing.sql(), ", \
                            next_action = 'the watchdog starts a fresh generation: no validated progress by the inactivity deadline' \
                     FROM reservations r, lane_incarnations li \
                     WHERE a.assignment_id = $3 AND a.lifecycle = ", Lifecycle::Active.sql(), " AND a.work_status IN (", WorkStatus::Active.sql(), ", ", WorkStatus::Handoff.sql(), ") AND a.requested_outcome IS NULL \
                       AND a.inactivity_deadline <= clock_timestamp() AND a.lane_incarnation_id = $1 \
                       AND r.reservation_id = $2 AND r.assignment_id = a.assignment_id AND r.released_at IS NULL \
                       AND li.lane_incarnation_id = r.lane_incarnation_id AND li.lane_incarnation_id = $1 AND li.state = ", LaneState::Running.sql(), " \
                       AND li.retired_at IS NULL \
                     RETURNING r.generation, mosaic_ts(a.inactivity_base_at) AS base_at"),
                    &[&c.lane_incarnation_id, &c.reservation_id, &c.assignment_id],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState,
                        "not active RUNNING work past its inactivity deadline (database time; equality is expired)").await?),
                };
                let g: Option<i64> = d.row().col("generation")?;
                let since: String = d.row().col("base_at")?;
                d.drain_running(&c.lane_incarnation_id, &c.reservation_id, g,
                    "no validated progress by the inactivity deadline").await?;
                d.decide(json!({ "chain": c, "to": LaneState::Draining, "generation_to_stop": g, "no_progress_since": since,
                    "assignment_to": Lifecycle::Recovery, "watchdog_step": WatchdogStep::Replacing }))
            }),
        )
        .await
    }

    /// Attempts are exhausted: the work is blocked for review with the digest of the
    /// receipts that led here. `mosaic unblock` is the way out.
    pub async fn inactivity_exhausted(
        &self,
        l: &Leader,
        w: &DueWork,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "inactivity-exhausted";
        let step = Step::new(
            OP,
            l,
            format!(
                "inactivity-exhausted/{}/{}",
                w.assignment_id, w.attempts_used
            ),
            request_digest(OP, &[&w.assignment_id, &w.attempts_used.to_string()]),
        )
        .about(Some(&w.assignment_id), Some(&w.lane_incarnation_id));
        let w = w.clone();
        self.transition(
            &step,
            body!([w] |f| {
                // The evidence: every inactivity receipt of the assignment, in order, digested
                // in the same statement that decides.
                let d = f.cas(
                    concatcp!("WITH ev AS (SELECT 'sha256:' || encode(sha256(convert_to(coalesce(string_agg(t.receipt_id || ':' || t.transition, ',' ORDER BY t.decided_at, t.receipt_id), ''), 'UTF8')), 'hex') AS digest \
                                 FROM transition_receipts t WHERE t.assignment_id = $1 AND t.transition LIKE 'inactivity-%') \
                     UPDATE assignments a SET work_status = ", WorkStatus::Blocked.sql(), ", blocker_code = 'inactivity-exhausted', blocker_evidence_digest = ev.digest, \
                            watchdog_step = ", WatchdogStep::None.sql(), ", \
                            next_action = 'operator review: mosaic unblock --assignment ' || a.assignment_id || ' grants a fresh attempt budget; mosaic stop ends it' \
                     FROM ev, inactivity_policies pol \
                     WHERE a.assignment_id = $1 AND a.lifecycle = ", Lifecycle::Recovery.sql(), " AND a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL \
                       AND pol.policy_id = a.inactivity_policy \
                       AND (SELECT count(*) FROM attempts t WHERE t.assignment_id = a.assignment_id) - a.attempts_before_budget >= pol.max_attempts \
                     RETURNING a.blocker_evidence_digest"),
                    &[&w.assignment_id],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "not active work in recovery with its attempts used up").await?),
                };
                let ev: String = d.row().col("blocker_evidence_digest")?;
                d.decide(json!({ "assignment_id": w.assignment_id, "work_status": WorkStatus::Blocked, "blocker_code": "inactivity-exhausted",
                    "blocker_evidence_digest": ev, "attempts_used": w.attempts_used }))
            }),
        )
        .await
    }

    /// Work the watchdog may have something to do for: active, unfinished, past its warning
    /// threshold or waiting for its next attempt (database time).
    pub async fn due_work(&self) -> Result<Vec<DueWork>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                concatcp!("SELECT a.assignment_id, a.lifecycle, a.watchdog_step, a.lane_incarnation_id, li.lane_id, li.state AS lane_state, ln.host_id, a.runtime_id, \
                        mosaic_ts(a.inactivity_base_at) AS base_at, \
                        a.inactivity_base_at + pol.warn_after_ms * interval '1 millisecond' <= clock_timestamp() AS warn_due, \
                        a.inactivity_base_at + pol.escalate_after_ms * interval '1 millisecond' <= clock_timestamp() AS escalate_due, \
                        a.inactivity_deadline <= clock_timestamp() AS deadline_due, \
                        (SELECT count(*) FROM attempts t WHERE t.assignment_id = a.assignment_id) - a.attempts_before_budget AS attempts_used, \
                        pol.max_attempts, \
                        (SELECT count(*) FROM reservations r WHERE r.assignment_id = a.assignment_id AND r.lane_incarnation_id = a.lane_incarnation_id) AS attempts_on_lane, \
                        pol.replacements_before_reassign, \
                        r.reservation_id, r.assignment_attempt_id, r.reservation_epoch, \
                        EXISTS (SELECT 1 FROM reservations r2 JOIN generations g2 ON g2.lane_incarnation_id = r2.lane_incarnation_id \
                                AND g2.generation = r2.generation WHERE r2.assignment_id = a.assignment_id AND g2.state <> ", GenState::Ended.sql(), ") AS unended, \
                        (SELECT count(*) FROM attempts t WHERE t.assignment_id = a.assignment_id) AS attempts_total \
                 FROM assignments a JOIN inactivity_policies pol ON pol.policy_id = a.inactivity_policy \
                 JOIN lane_incarnations li ON li.lane_incarnation_id = a.lane_incarnation_id JOIN lanes ln ON ln.lane_id = li.lane_id \
                 LEFT JOIN reservations r ON r.assignment_id = a.assignment_id AND r.released_at IS NULL AND r.lane_incarnation_id = a.lane_incarnation_id \
                 WHERE a.work_status IN (", WorkStatus::Active.sql(), ", ", WorkStatus::Handoff.sql(), ") AND a.requested_outcome IS NULL AND a.lifecycle IN (", Lifecycle::Active.sql(), ", ", Lifecycle::Recovery.sql(), ") \
                   AND a.inactivity_base_at IS NOT NULL \
                   AND (a.watchdog_step = ", WatchdogStep::Replacing.sql(), " OR a.inactivity_base_at + pol.warn_after_ms * interval '1 millisecond' <= clock_timestamp())"),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                // The open chain, when there is a reservation (the left join's side).
                let chain = match r.col::<Option<String>>("reservation_id")? {
                    Some(reservation_id) => Some(Chain {
                        lane_id: r.col("lane_id")?,
                        lane_incarnation_id: r.col("lane_incarnation_id")?,
                        assignment_id: r.col("assignment_id")?,
                        assignment_attempt_id: r
                            .col::<Option<String>>("assignment_attempt_id")?
                            .unwrap_or_default(),
                        reservation_id,
                        reservation_epoch: r.col::<Option<i64>>("reservation_epoch")?.unwrap_or(0),
                    }),
                    None => None,
                };
                Ok(DueWork {
                    assignment_id: r.col("assignment_id")?,
                    lifecycle: r.col("lifecycle")?,
                    step: r.col("watchdog_step")?,
                    lane_incarnation_id: r.col("lane_incarnation_id")?,
                    lane_id: r.col("lane_id")?,
                    lane_state: r.col("lane_state")?,
                    host_id: r.col("host_id")?,
                    runtime_id: r.col("runtime_id")?,
                    base_at: r.col::<Option<String>>("base_at")?.unwrap_or_default(),
                    warn_due: r.col::<Option<bool>>("warn_due")?.unwrap_or(false),
                    escalate_due: r.col::<Option<bool>>("escalate_due")?.unwrap_or(false),
                    deadline_due: r.col::<Option<bool>>("deadline_due")?.unwrap_or(false),
                    attempts_used: r.col("attempts_used")?,
                    max_attempts: r.col("max_attempts")?,
                    attempts_on_lane: r.col("attempts_on_lane")?,
                    replacements_before_reassign: r.col("replacements_before_reassign")?,
                    chain,
                    unended: r.col("unended")?,
                    attempts_total: r.col("attempts_total")?,
                })
            })
            .collect()
    }

    /// What the next attempt of an assignment carries: the last attempt's task, and what
    /// the operator supplied for scope, holds and completion.
    pub async fn next_attempt(
        &self,
        assignment_id: &str,
    ) -> Result<Option<NextAttempt>, AuthorityError> {
        let c = self.pool.get().await?;
        let row = c
            .query_opt(
                "SELECT (SELECT t.task_text FROM attempts t WHERE t.assignment_id = a.assignment_id ORDER BY t.created_at DESC LIMIT 1) AS task_text, \
                        a.scope, a.holds, a.completion_policy, a.runtime_id FROM assignments a WHERE a.assignment_id = $1",
                &[&assignment_id],
            )
            .await?;
        row.map(|r| {
            let list = |v: serde_json::Value| -> Vec<String> {
                v.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            };
            Ok(NextAttempt {
                task_text: r.col::<Option<String>>("task_text")?.unwrap_or_default(),
                scope: list(r.col("scope")?),
                holds: list(r.col("holds")?),
                completion_policy: r.col("completion_policy")?,
                runtime_id: r.col("runtime_id")?,
            })
        })
        .transpose()
    }
}
