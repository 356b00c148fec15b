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
use std::sync::LazyLock;

use super::cas::{self, Pred};
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

/// Every expected value of a piece of progress evidence, in diagnosis order (over the
/// assignment, its inactivity policy, the chain's reservation, lane and generation); the
/// CAS and its refusal's explanation are both built from it. Parameters: $1 assignment, $2
/// reservation, $3 attempt, $4 generation, $5 evidence kind, $6 evidence digest, $7 the
/// next action (set, not compared), $8 the chain's timeline.
const PROGRESS_PREDS: &[Pred] = &[
    Pred {
        sql: concatcp!("a.lifecycle = ", Lifecycle::Active.sql(), " AND a.work_status = ", WorkStatus::Active.sql()),
        category: Category::WrongState,
        detail: "progress counts only for active work (not blocked, handed off, in recovery or done)",
    },
    Pred {
        sql: "NOT EXISTS (SELECT 1 FROM progress_receipts x WHERE x.assignment_id = a.assignment_id AND x.evidence_digest = $6)",
        category: Category::Conflict,
        detail: "this evidence was already counted for the assignment: progress needs new evidence",
    },
    Pred {
        sql: "$5 = ANY(pol.evidence_kinds)",
        category: Category::BadInput,
        detail: "the assignment's inactivity policy does not accept this kind of evidence",
    },
    Pred {
        sql: "a.inactivity_deadline > clock_timestamp()",
        category: Category::Expired,
        detail: "the inactivity deadline has passed (database time; equality is expired)",
    },
    Pred {
        sql: "a.requested_outcome IS NULL",
        category: Category::WrongState,
        detail: "an outcome was requested for the work: it is finishing",
    },
    Pred {
        sql: "r.assignment_attempt_id = $3",
        category: Category::WrongState,
        detail: "progress counts only for the RUNNING generation: assignment_attempt_id is not the chain's",
    },
    Pred {
        sql: "r.released_at IS NULL",
        category: Category::WrongState,
        detail: "progress counts only for the RUNNING generation: the chain's reservation was released",
    },
    Pred {
        sql: "r.generation = $4",
        category: Category::WrongState,
        detail: "progress counts only for the RUNNING generation: generation is not the chain's",
    },
    Pred {
        sql: "r.sot_incarnation = $8",
        category: Category::WrongState,
        detail: "progress counts only for the RUNNING generation: the chain is of another timeline",
    },
    Pred {
        sql: concatcp!("li.state = ", LaneState::Running.sql(), " AND li.retired_at IS NULL"),
        category: Category::WrongState,
        detail: "progress counts only for the RUNNING generation: the lane is not RUNNING",
    },
    Pred {
        sql: concatcp!("g.state = ", GenState::Live.sql()),
        category: Category::WrongState,
        detail: "progress counts only for the RUNNING generation: the generation is not live",
    },
];

/// Progress resets the inactivity clock of the work it proves alive.
static PROGRESS_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE assignments a SET last_progress_at = clock_timestamp(), inactivity_base_at = clock_timestamp(), \
                inactivity_deadline = clock_timestamp() + pol.replace_after_ms * interval '1 millisecond', \
                watchdog_step = {none}, next_action = coalesce($7, a.next_action) \
         FROM inactivity_policies pol, reservations r, lane_incarnations li, generations g \
         WHERE a.assignment_id = $1 AND pol.policy_id = a.inactivity_policy \
           AND r.reservation_id = $2 AND r.assignment_id = a.assignment_id \
           AND li.lane_incarnation_id = r.lane_incarnation_id \
           AND g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = $4 \
           AND {} \
         RETURNING mosaic_ts(a.inactivity_deadline) AS inactivity_deadline",
        cas::conjunction(PROGRESS_PREDS),
        none = WatchdogStep::None.sql()
    )
});

/// The refusal's explanation: each predicate over the same rows, reached from the
/// assignment. (It binds the CAS's parameters, `$7` included.)
static PROGRESS_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        PROGRESS_PREDS,
        "FROM assignments a LEFT JOIN inactivity_policies pol ON pol.policy_id = a.inactivity_policy \
         LEFT JOIN reservations r ON r.reservation_id = $2 AND r.assignment_id = a.assignment_id \
         LEFT JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
         LEFT JOIN generations g ON g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = $4 \
         WHERE a.assignment_id = $1 AND ($7::text IS NULL OR true)",
    )
});

/// What a block says: its canonical code, the digest of its evidence, the action that
/// unblocks it, and — for a block that ends by itself (a provider's rate limit) — how long
/// after its decision it ends.
#[derive(Debug, Clone, Copy)]
pub struct Blockage<'a> {
    pub code: &'a str,
    pub evidence_digest: &'a str,
    pub next_action: &'a str,
    pub resume_after_ms: Option<i64>,
}

impl<'a> Blockage<'a> {
    /// A block that lasts until it is unblocked.
    pub fn new(code: &'a str, evidence_digest: &'a str, next_action: &'a str) -> Self {
        Self {
            code,
            evidence_digest,
            next_action,
            resume_after_ms: None,
        }
    }
}

/// What blocked work becomes when it is unblocked or resumed (the `SET` list over
/// `assignments a` joined with its `inactivity_policies pol`): active, a fresh inactivity
/// period from now, and work in recovery handed to the watchdog's next attempt.
pub(super) const ACTIVE_AGAIN: &str = concatcp!(
    "work_status = ",
    WorkStatus::Active.sql(),
    ", inactivity_base_at = clock_timestamp(), \
     inactivity_deadline = clock_timestamp() + pol.replace_after_ms * interval '1 millisecond', \
     watchdog_step = CASE WHEN a.lifecycle = ",
    Lifecycle::Recovery.sql(),
    " THEN ",
    WatchdogStep::Replacing.sql(),
    " ELSE ",
    WatchdogStep::None.sql(),
    " END"
);

/// The furthest a block may name its own end (a provider's reset time): 7 days.
pub const MAX_RESUME_AFTER_MS: i64 = 7 * 86_400_000;

/// Every expected value of a block, in diagnosis order; the CAS and its refusal's
/// explanation are both built from it. Parameters: $1 assignment, $2 blocker code, $3
/// evidence digest, $4 next action, $5 the blocking generation's reservation (`''` for an
/// operator), $6 its generation.
const BLOCK_PREDS: &[Pred] = &[
    Pred {
        sql: concatcp!("a.work_status = ", WorkStatus::Active.sql()),
        category: Category::WrongState,
        detail: "only active work can be blocked (it is already blocked, being handed off, or done)",
    },
    Pred {
        sql: "a.requested_outcome IS NULL",
        category: Category::WrongState,
        detail: "an outcome was requested for the work: it is finishing",
    },
    Pred {
        sql: concatcp!("a.lifecycle IN (", Lifecycle::Active.sql(), ", ", Lifecycle::Recovery.sql(), ")"),
        category: Category::WrongState,
        detail: "only unfinished work can be blocked",
    },
    Pred {
        sql: concatcp!("$5 = '' OR EXISTS (SELECT 1 FROM reservations r JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
                JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
                WHERE r.reservation_id = $5 AND r.assignment_id = a.assignment_id AND r.released_at IS NULL \
                  AND r.generation = $6 AND li.state = ", LaneState::Running.sql(), " AND g.state = ", GenState::Live.sql(), " AND a.lifecycle = ", Lifecycle::Active.sql(), ")"),
        category: Category::WrongState,
        detail: "a generation blocks its work only while it is the RUNNING generation of the work's open reservation",
    },
];

/// Active work becomes blocked, with its owner kept and the unblock action next.
static BLOCK_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE assignments a SET work_status = {blocked}, blocker_code = $2, blocker_evidence_digest = $3, next_action = $4, \
                watchdog_step = {none}, blocked_until = clock_timestamp() + $7::bigint * interval '1 millisecond' \
         WHERE a.assignment_id = $1 AND {} \
         RETURNING a.responsibility_owner, a.lifecycle, mosaic_ts(a.blocked_until) AS blocked_until",
        cas::conjunction(BLOCK_PREDS),
        blocked = WorkStatus::Blocked.sql(),
        none = WatchdogStep::None.sql()
    )
});

/// The refusal's explanation, over the work the request names (binding the CAS's
/// parameters; `$2`–`$4` are only typed there, the predicates do not compare them).
static BLOCK_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        BLOCK_PREDS,
        "FROM assignments a WHERE a.assignment_id = $1 \
           AND ($2::text IS NULL OR $3::text IS NULL OR $4::text IS NULL OR $7::bigint IS NULL OR true)",
    )
});

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
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [&c.assignment_id, &c.reservation_id,
                    &c.assignment_attempt_id, &p.generation, &p.evidence_kind, &p.evidence_digest, &p.next_action, &sot];
                let d = match f.cas(&PROGRESS_CAS, &params).await? {
                    Ok(d) => d,
                    Err(u) => {
                        return Err(u.diagnose(&PROGRESS_DIAGNOSIS, &params, PROGRESS_PREDS, "no such assignment").await?)
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

    /// Blocked with evidence: by the RUNNING generation (through its host) or an operator.
    /// The work keeps its owner; its next action becomes the unblock action.
    pub async fn block(
        &self,
        l: &Leader,
        assignment_id: &str,
        by: &Blocker,
        b: &Blockage<'_>,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "block";
        let (code, evidence_digest, next_action, resume_after_ms) =
            (b.code, b.evidence_digest, b.next_action, b.resume_after_ms);
        if resume_after_ms.is_some_and(|ms| !(1000..=MAX_RESUME_AFTER_MS).contains(&ms)) {
            return Err(reject(
                OP,
                Category::BadInput,
                "work resumes at a known time 1 s to 7 days from now",
            ));
        }
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
                    &resume_after_ms.map(|ms| ms.to_string()).unwrap_or_default(),
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
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [&asg, &code, &ev, &next, &reservation, &generation, &resume_after_ms];
                let d = match f.cas(&BLOCK_CAS, &params).await? {
                    Ok(d) => d,
                    Err(u) => return Err(u.diagnose(&BLOCK_DIAGNOSIS, &params, BLOCK_PREDS, "no such assignment").await?),
                };
                let owner: String = d.row().col("responsibility_owner")?;
                let lifecycle: Lifecycle = d.row().col("lifecycle")?;
                let until: Option<String> = d.row().col("blocked_until")?;
                d.decide(json!({ "assignment_id": asg, "by": who, "work_status": WorkStatus::Blocked, "blocker_code": code,
                    "blocker_evidence_digest": ev, "next_action": next, "responsibility_owner": owner, "lifecycle": lifecycle,
                    "blocked_until": until }))
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
                    concatcp!("UPDATE assignments a SET ", ACTIVE_AGAIN, ", next_action = $2, \
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
}
