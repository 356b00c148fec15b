//! Continuity (spec §14): the work record's transitions. Validated progress moves an
//! assignment's inactivity deadline; the watchdog warns, escalates and replaces by the same
//! fenced compare-and-swap at database time; blocked work carries an owner, a code, the
//! digest of its evidence and an executable next action; an operator's unblock grants a fresh
//! attempt budget.
//!
//! The database holds the rules that must hold whatever the code does (migration 0006):
//! unfinished work always has an owner and a next action, blocked work always has evidence,
//! a policy version is frozen and its digest computed from its body, and one piece of
//! evidence counts once per assignment.
//!
//! **Never:** counts a heartbeat, output or a claim without evidence as progress; extends a
//! deadline that has passed (equality is expired); decides with a host clock.

use const_format::concatcp;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::rows::RowExt;
use super::states::{GenState, LaneState, Lifecycle, WatchdogStep, WorkStatus};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

pub use crate::protocol::work::{code_ok, next_action_ok, EVIDENCE_KINDS};

/// An inactivity policy version, as published. Every threshold is counted from the
/// assignment's inactivity base: its activation, or its last validated progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InactivityPolicy {
    /// `name@version`; a version once published never changes.
    pub policy_id: String,
    pub warn_after_ms: i64,
    pub escalate_after_ms: i64,
    /// The inactivity deadline: the generation is replaced when it passes.
    pub replace_after_ms: i64,
    /// Replacements on the same lane before the next attempt goes to another lane.
    pub replacements_before_reassign: i32,
    /// Attempts (the first included) before the work is blocked for review.
    pub max_attempts: i32,
    /// What exhaustion does: `blocked` (explicit review; `mosaic unblock` is the way out).
    pub exhaustion: String,
    pub evidence_kinds: Vec<String>,
}

impl InactivityPolicy {
    /// Checks the policy before anything is written (the database checks it again).
    pub fn validate(&self) -> Result<(), String> {
        let (name, version) = self
            .policy_id
            .split_once('@')
            .ok_or("policy_id must be name@version")?;
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-');
        let version_ok = !version.is_empty()
            && version.len() <= 9
            && !version.starts_with('0')
            && version.bytes().all(|b| b.is_ascii_digit());
        if !name_ok || !version_ok {
            return Err(
                "policy_id must be name@version: a lower-case name, a version from 1".into(),
            );
        }
        if !(0 < self.warn_after_ms
            && self.warn_after_ms < self.escalate_after_ms
            && self.escalate_after_ms < self.replace_after_ms
            && self.replace_after_ms <= 7 * 86_400_000)
        {
            return Err("thresholds must rise: 0 < warn < escalate < replace ≤ 7 days".into());
        }
        if self.replacements_before_reassign < 0 || !(1..=100).contains(&self.max_attempts) {
            return Err("replacements_before_reassign ≥ 0 and max_attempts 1..100".into());
        }
        if self.exhaustion != WorkStatus::Blocked.as_str() {
            return Err("exhaustion must be \"blocked\"".into());
        }
        if self.evidence_kinds.is_empty()
            || self
                .evidence_kinds
                .iter()
                .any(|k| !EVIDENCE_KINDS.contains(&k.as_str()))
        {
            return Err(format!(
                "evidence_kinds must be a non-empty subset of {}",
                EVIDENCE_KINDS.join(", ")
            ));
        }
        Ok(())
    }

    /// The body stored (and digested by the database): every field but the id.
    fn body(&self) -> serde_json::Value {
        json!({
            "warn_after_ms": self.warn_after_ms, "escalate_after_ms": self.escalate_after_ms,
            "replace_after_ms": self.replace_after_ms,
            "replacements_before_reassign": self.replacements_before_reassign,
            "max_attempts": self.max_attempts, "exhaustion": self.exhaustion,
            "evidence_kinds": self.evidence_kinds,
        })
    }
}

/// A progress report as the host signed it, after the session's ownership checks.
#[derive(Debug, Clone)]
pub struct ProgressClaim {
    pub chain: Chain,
    pub generation: i64,
    pub evidence_kind: String,
    pub evidence_digest: String,
    pub next_action: Option<String>,
    pub message_id: String,
}

/// Who says work is blocked.
#[derive(Debug, Clone)]
pub enum Blocker {
    /// The RUNNING generation, through its host.
    Generation { chain: Chain, generation: i64 },
    /// An operator.
    Operator,
}

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
}

impl Store {
    /// Publishes an inactivity policy version. Publishing the same body again is a no-op
    /// answered with the original receipt; another body under a published id is refused.
    pub async fn publish_policy(
        &self,
        l: &Leader,
        p: &InactivityPolicy,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "policy-publish";
        p.validate()
            .map_err(|e| reject(OP, Category::BadInput, e))?;
        let body_text = p.body().to_string();
        let step = Step::new(
            OP,
            l,
            format!("policy-publish/{}", p.policy_id),
            request_digest(OP, &[&p.policy_id, &body_text]),
        );
        let p = p.clone();
        self.transition(
            &step,
            body!([p] |f| {
                let d = f.cas(
                    "INSERT INTO inactivity_policies (policy_id, body, digest, warn_after_ms, escalate_after_ms, replace_after_ms, \
                                                      replacements_before_reassign, max_attempts, exhaustion, evidence_kinds) \
                     VALUES ($1, $2, '', $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (policy_id) DO NOTHING RETURNING digest",
                    &[&p.policy_id, &p.body(), &p.warn_after_ms, &p.escalate_after_ms, &p.replace_after_ms,
                      &p.replacements_before_reassign, &p.max_attempts, &p.exhaustion, &p.evidence_kinds],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::Conflict, format!(
                        "policy {} is already published with another body; publish a new version", p.policy_id)).await?),
                };
                let digest: String = d.row().col("digest")?;
                d.decide(json!({ "policy_id": p.policy_id, "digest": digest, "policy": p.body() }))
            }),
        )
        .await
    }

    /// A policy as published, with its digest.
    pub async fn policy(
        &self,
        policy_id: &str,
    ) -> Result<Option<(InactivityPolicy, String)>, AuthorityError> {
        let c = self.pool.get().await?;
        let row = c
            .query_opt(
                "SELECT policy_id, warn_after_ms, escalate_after_ms, replace_after_ms, replacements_before_reassign, max_attempts, \
                        exhaustion, evidence_kinds, digest FROM inactivity_policies WHERE policy_id = $1",
                &[&policy_id],
            )
            .await?;
        row.map(|r| {
            Ok((
                InactivityPolicy {
                    policy_id: r.col("policy_id")?,
                    warn_after_ms: r.col("warn_after_ms")?,
                    escalate_after_ms: r.col("escalate_after_ms")?,
                    replace_after_ms: r.col("replace_after_ms")?,
                    replacements_before_reassign: r.col("replacements_before_reassign")?,
                    max_attempts: r.col("max_attempts")?,
                    exhaustion: r.col("exhaustion")?,
                    evidence_kinds: r.col("evidence_kinds")?,
                },
                r.col("digest")?,
            ))
        })
        .transpose()
    }

    /// A validated progress receipt: the one way `last_progress_at` moves. The generation
    /// must be the RUNNING one of this reservation, the deadline not yet passed (database
    /// time; equality is expired), the evidence of a kind the policy accepts and never
    /// counted before for this assignment. A retried message lands on its original receipt
    /// and extends nothing again.
    pub async fn record_progress(
        &self,
        l: &Leader,
        p: &ProgressClaim,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "progress";
        if !crate::protocol::envelope::is_digest(&p.evidence_digest)
            || !EVIDENCE_KINDS.contains(&p.evidence_kind.as_str())
            || p.next_action.as_deref().is_some_and(|n| !next_action_ok(n))
        {
            return Err(reject(
                OP,
                Category::BadInput,
                format!(
                    "progress needs an evidence kind ({}), a sha256 digest and at most a one-line next action",
                    EVIDENCE_KINDS.join(", ")
                ),
            ));
        }
        let c = &p.chain;
        let step = Step::new(
            OP,
            l,
            format!("progress/{}/{}", c.reservation_id, p.evidence_digest),
            request_digest(
                OP,
                &[
                    &c.key(),
                    &p.generation.to_string(),
                    &p.evidence_kind,
                    &p.evidence_digest,
                    p.next_action.as_deref().unwrap_or(""),
                ],
            ),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let (p, epoch, sot) = (p.clone(), l.epoch(), l.sot().to_string());
        self.transition(
            &step,
            body!([p, sot] |f| {
                let c = &p.chain;
                let d = f.cas(
                    concatcp!("UPDATE assignments a SET last_progress_at = clock_timestamp(), inactivity_base_at = clock_timestamp(), \
                            inactivity_deadline = clock_timestamp() + pol.replace_after_ms * interval '1 millisecond', \
                            watchdog_step = ", WatchdogStep::None.sql(), ", next_action = coalesce($7, a.next_action) \
                     FROM inactivity_policies pol, reservations r, lane_incarnations li, generations g \
                     WHERE a.assignment_id = $1 AND a.lifecycle = ", Lifecycle::Active.sql(), " AND a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL \
                       AND a.inactivity_deadline > clock_timestamp() \
                       AND pol.policy_id = a.inactivity_policy AND $5 = ANY(pol.evidence_kinds) \
                       AND r.reservation_id = $2 AND r.assignment_id = a.assignment_id AND r.assignment_attempt_id = $3 \
                       AND r.released_at IS NULL AND r.generation = $4 AND r.sot_incarnation = $8 \
                       AND li.lane_incarnation_id = r.lane_incarnation_id AND li.state = ", LaneState::Running.sql(), " AND li.retired_at IS NULL \
                       AND g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = $4 AND g.state = ", GenState::Live.sql(), " \
                       AND NOT EXISTS (SELECT 1 FROM progress_receipts x WHERE x.assignment_id = a.assignment_id AND x.evidence_digest = $6) \
                     RETURNING mosaic_ts(a.inactivity_deadline) AS inactivity_deadline"),
                    &[&c.assignment_id, &c.reservation_id, &c.assignment_attempt_id, &p.generation, &p.evidence_kind,
                      &p.evidence_digest, &p.next_action, &sot],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let why = u.read_opt(
                            "SELECT a.lifecycle, a.work_status, a.inactivity_deadline <= clock_timestamp() AS expired, \
                                    EXISTS (SELECT 1 FROM progress_receipts x WHERE x.assignment_id = a.assignment_id AND x.evidence_digest = $2) AS counted, \
                                    $3 = ANY(pol.evidence_kinds) AS kind_accepted \
                             FROM assignments a JOIN inactivity_policies pol ON pol.policy_id = a.inactivity_policy WHERE a.assignment_id = $1",
                            &[&c.assignment_id, &p.evidence_digest, &p.evidence_kind],
                        ).await?;
                        let why = match why {
                            None => None,
                            Some(r) => Some((
                                r.col::<Lifecycle>("lifecycle")?,
                                r.col::<WorkStatus>("work_status")?,
                                r.col::<Option<bool>>("expired")?.unwrap_or(true),
                                r.col::<bool>("counted")?,
                                r.col::<bool>("kind_accepted")?,
                            )),
                        };
                        let (cat, msg) = match why {
                            None => (Category::NotFound, "no such assignment".to_string()),
                            Some((life, work, ..)) if life != Lifecycle::Active || work != WorkStatus::Active =>
                                (Category::WrongState, format!("progress counts only for active work (assignment {life}, work {work})")),
                            Some((_, _, _, true, _)) => (Category::Conflict, "this evidence was already counted for the assignment: progress needs new evidence".into()),
                            Some((_, _, _, _, false)) => (Category::BadInput, format!("the assignment's policy does not accept {} evidence", p.evidence_kind)),
                            Some((_, _, true, _, _)) => (Category::Expired, "the inactivity deadline has passed (database time; equality is expired)".into()),
                            Some((life, work, ..)) => (Category::WrongState, format!("progress counts only for the RUNNING generation of active work (assignment {life}, work {work})")),
                        };
                        return Err(u.reject(cat, msg).await?);
                    }
                };
                let deadline: String = d.row().col("inactivity_deadline")?;
                let id = format!("pg-{}", uuid::Uuid::new_v4().simple());
                d.exec_one(
                    "INSERT INTO progress_receipts (progress_id, assignment_id, assignment_attempt_id, lane_incarnation_id, generation, reservation_id, \
                                                    evidence_kind, evidence_digest, message_id, sot_incarnation, coordinator_epoch, new_deadline) \
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, a.inactivity_deadline FROM assignments a WHERE a.assignment_id = $2",
                    &[&id, &c.assignment_id, &c.assignment_attempt_id, &c.lane_incarnation_id, &p.generation, &c.reservation_id,
                      &p.evidence_kind, &p.evidence_digest, &p.message_id, &sot, &epoch],
                ).await?;
                d.decide(json!({ "chain": c, "generation": p.generation, "progress_id": id, "evidence_kind": p.evidence_kind,
                    "evidence_digest": p.evidence_digest, "inactivity_deadline": deadline }))
            }),
        )
        .await
    }

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
             WHERE a.assignment_id = $1 AND a.lifecycle = {active} AND a.work_status = {work_active} AND a.requested_outcome IS NULL \
               AND a.watchdog_step = $2 AND mosaic_ts(a.inactivity_base_at) = $4 \
               AND pol.policy_id = a.inactivity_policy AND a.inactivity_base_at + pol.{column} * interval '1 millisecond' <= clock_timestamp() \
               AND li.lane_incarnation_id = a.lane_incarnation_id AND li.state = {running} \
             RETURNING mosaic_ts(a.inactivity_deadline) AS inactivity_deadline, a.responsibility_owner, a.next_action",
        active = Lifecycle::Active.sql(),
        work_active = WorkStatus::Active.sql(),
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
                     WHERE a.assignment_id = $3 AND a.lifecycle = ", Lifecycle::Active.sql(), " AND a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL \
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

    /// Blocked with evidence: by the RUNNING generation (through its host) or an operator.
    /// The work keeps its owner; its next action becomes the unblock action.
    pub async fn block(
        &self,
        l: &Leader,
        assignment_id: &str,
        by: &Blocker,
        code: &str,
        evidence_digest: &str,
        next_action: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "block";
        if !code_ok(code) {
            return Err(reject(
                OP,
                Category::BadInput,
                "a blocker code is lower-case words joined by dashes (at most 63 bytes)",
            ));
        }
        if !crate::protocol::envelope::is_digest(evidence_digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "blocked needs evidence: the sha256 digest of an evidence file",
            ));
        }
        if !next_action_ok(next_action) {
            return Err(reject(
                OP,
                Category::BadInput,
                "blocked needs an executable next action (one non-blank line)",
            ));
        }
        let (who, reservation, generation) = match by {
            Blocker::Generation { chain, generation } => {
                ("generation", chain.reservation_id.clone(), *generation)
            }
            Blocker::Operator => ("operator", String::new(), 0),
        };
        let step = Step::new(
            OP,
            l,
            format!("block/{assignment_id}/{evidence_digest}"),
            request_digest(
                OP,
                &[
                    assignment_id,
                    who,
                    &reservation,
                    code,
                    evidence_digest,
                    next_action,
                ],
            ),
        )
        .about(Some(assignment_id), None);
        let (asg, code, ev, next) = (
            assignment_id.to_string(),
            code.to_string(),
            evidence_digest.to_string(),
            next_action.to_string(),
        );
        let who = who.to_string();
        self.transition(
            &step,
            body!([asg, code, ev, next, who, reservation] |f| {
                // From a generation: only while it is the RUNNING one of its open reservation.
                let d = f.cas(
                    concatcp!("UPDATE assignments a SET work_status = ", WorkStatus::Blocked.sql(), ", blocker_code = $2, blocker_evidence_digest = $3, next_action = $4, \
                            watchdog_step = ", WatchdogStep::None.sql(), " \
                     WHERE a.assignment_id = $1 AND a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL \
                       AND a.lifecycle IN (", Lifecycle::Active.sql(), ", ", Lifecycle::Recovery.sql(), ") \
                       AND ($5 = '' OR EXISTS (SELECT 1 FROM reservations r JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
                                               JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
                                               WHERE r.reservation_id = $5 AND r.assignment_id = a.assignment_id AND r.released_at IS NULL \
                                                 AND r.generation = $6 AND li.state = ", LaneState::Running.sql(), " AND g.state = ", GenState::Live.sql(), " AND a.lifecycle = ", Lifecycle::Active.sql(), ")) \
                     RETURNING a.responsibility_owner, a.lifecycle"),
                    &[&asg, &code, &ev, &next, &reservation, &generation],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let r = u.read_opt("SELECT lifecycle, work_status FROM assignments WHERE assignment_id = $1", &[&asg]).await?;
                        return Err(match r {
                            None => u.reject(Category::NotFound, format!("no assignment {asg}")).await?,
                            Some(r) => u.reject(Category::WrongState, format!("only active unfinished work can be blocked{} (assignment {}, work {})",
                                if reservation.is_empty() { "" } else { " by its RUNNING generation" },
                                r.col::<Lifecycle>("lifecycle")?, r.col::<WorkStatus>("work_status")?)).await?,
                        });
                    }
                };
                let owner: String = d.row().col("responsibility_owner")?;
                let lifecycle: Lifecycle = d.row().col("lifecycle")?;
                d.decide(json!({ "assignment_id": asg, "by": who, "work_status": WorkStatus::Blocked, "blocker_code": code,
                    "blocker_evidence_digest": ev, "next_action": next, "responsibility_owner": owner, "lifecycle": lifecycle }))
            }),
        )
        .await
    }

    /// An operator unblocks work: it is active again with a fresh inactivity period and a
    /// fresh attempt budget; work in recovery gets its next attempt from the watchdog at once.
    pub async fn unblock(
        &self,
        l: &Leader,
        assignment_id: &str,
        next_action: &str,
        request_id: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "unblock";
        if !next_action_ok(next_action) {
            return Err(reject(
                OP,
                Category::BadInput,
                "unblock needs the executable next action (one non-blank line)",
            ));
        }
        let step = Step::new(
            OP,
            l,
            format!("unblock/{request_id}"),
            request_digest(OP, &[assignment_id, next_action]),
        )
        .about(Some(assignment_id), None);
        let (asg, next) = (assignment_id.to_string(), next_action.to_string());
        self.transition(
            &step,
            body!([asg, next] |f| {
                let d = f.cas(
                    concatcp!("UPDATE assignments a SET work_status = ", WorkStatus::Active.sql(), ", next_action = $2, inactivity_base_at = clock_timestamp(), \
                            inactivity_deadline = clock_timestamp() + pol.replace_after_ms * interval '1 millisecond', \
                            watchdog_step = CASE WHEN a.lifecycle = ", Lifecycle::Recovery.sql(), " THEN ", WatchdogStep::Replacing.sql(), " ELSE ", WatchdogStep::None.sql(), " END, \
                            attempts_before_budget = (SELECT count(*) FROM attempts t WHERE t.assignment_id = a.assignment_id) \
                     FROM inactivity_policies pol \
                     WHERE a.assignment_id = $1 AND a.work_status = ", WorkStatus::Blocked.sql(), " AND a.lifecycle IN (", Lifecycle::Active.sql(), ", ", Lifecycle::Recovery.sql(), ") \
                       AND a.requested_outcome IS NULL AND pol.policy_id = a.inactivity_policy \
                     RETURNING a.lifecycle, mosaic_ts(a.inactivity_deadline) AS inactivity_deadline"),
                    &[&asg, &next],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "only blocked unfinished work can be unblocked").await?),
                };
                let lifecycle: Lifecycle = d.row().col("lifecycle")?;
                let deadline: String = d.row().col("inactivity_deadline")?;
                d.decide(json!({ "assignment_id": asg, "work_status": WorkStatus::Active, "lifecycle": lifecycle, "next_action": next,
                    "inactivity_deadline": deadline }))
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
                 WHERE a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL AND a.lifecycle IN (", Lifecycle::Active.sql(), ", ", Lifecycle::Recovery.sql(), ") \
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
                        a.scope, a.holds, a.completion_policy FROM assignments a WHERE a.assignment_id = $1",
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
            })
        })
        .transpose()
    }
}
