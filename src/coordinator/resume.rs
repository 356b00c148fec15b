//! Blocked work that ends by itself (issue 23: a provider's rate limit): a block may name
//! how long it lasts (`blocked_until`, migration 0035, decided at database time), and the
//! watchdog resumes the work once that time has come — active again with a fresh
//! inactivity period, its next action the resumption, by one fenced compare-and-swap that
//! holds only while the same block stands. The resumed work gets its continuation (a
//! separate transition) when a generation runs it; otherwise the inactivity watchdog
//! replaces it as for any active work.
//!
//! **Never:** resumes work whose block changed since it was read (another block, an
//! operator's unblock, an outcome requested), before its time at database time, or with a
//! fresh attempt budget (that is an operator's unblock).

use const_format::concatcp;
use serde_json::json;

use super::continuity::ACTIVE_AGAIN;
use super::error::{AuthorityError, Category};
use super::leader::Leader;
use super::rows::RowExt;
use super::states::{Lifecycle, WorkStatus};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

/// The next action of work resumed at its block's end.
pub const RESUMED: &str =
    "the provider's rate limit has reset: continue the task where you left off";

/// Blocked work whose known end has come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueResume {
    pub assignment_id: String,
    pub blocker_code: String,
    /// The block's evidence: the resume binds exactly this block.
    pub blocker_evidence_digest: String,
}

impl Store {
    /// Blocked work whose `blocked_until` has passed at database time, earliest first.
    pub async fn due_resumes(&self) -> Result<Vec<DueResume>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            concatcp!(
                "SELECT assignment_id, blocker_code, blocker_evidence_digest FROM assignments \
                 WHERE work_status = ",
                WorkStatus::Blocked.sql(),
                " AND blocked_until <= clock_timestamp() AND requested_outcome IS NULL \
                 AND lifecycle IN (",
                Lifecycle::Active.sql(),
                ", ",
                Lifecycle::Recovery.sql(),
                ") ORDER BY blocked_until LIMIT 100"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(DueResume {
                assignment_id: r.col("assignment_id")?,
                blocker_code: r.col("blocker_code")?,
                blocker_evidence_digest: r.col("blocker_evidence_digest")?,
            })
        })
        .collect()
    }

    /// Resumes `due` (its block unchanged and its time come): active, a fresh inactivity
    /// period, [`RESUMED`] as its next action. The attempt budget is kept.
    pub async fn resume_blocked(
        &self,
        l: &Leader,
        due: &DueResume,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "resume";
        let step = Step::new(
            OP,
            l,
            format!(
                "resume/{}/{}",
                due.assignment_id, due.blocker_evidence_digest
            ),
            request_digest(OP, &[&due.assignment_id, &due.blocker_evidence_digest]),
        )
        .about(Some(&due.assignment_id), None);
        let (asg, ev, code) = (
            due.assignment_id.clone(),
            due.blocker_evidence_digest.clone(),
            due.blocker_code.clone(),
        );
        self.transition(
            &step,
            body!([asg, ev, code] |f| {
                let d = f.cas(
                    concatcp!("UPDATE assignments a SET ", ACTIVE_AGAIN, ", next_action = $3 \
                     FROM inactivity_policies pol \
                     WHERE a.assignment_id = $1 AND a.work_status = ", WorkStatus::Blocked.sql(), " AND a.blocker_evidence_digest = $2 \
                       AND a.blocked_until <= clock_timestamp() AND a.requested_outcome IS NULL \
                       AND a.lifecycle IN (", Lifecycle::Active.sql(), ", ", Lifecycle::Recovery.sql(), ") \
                       AND pol.policy_id = a.inactivity_policy \
                     RETURNING a.lifecycle, mosaic_ts(a.inactivity_deadline) AS inactivity_deadline"),
                    &[&asg, &ev, &RESUMED],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "the block changed, or its time has not come").await?),
                };
                let lifecycle: Lifecycle = d.row().col("lifecycle")?;
                let deadline: String = d.row().col("inactivity_deadline")?;
                d.decide(json!({ "assignment_id": asg, "work_status": WorkStatus::Active, "lifecycle": lifecycle,
                    "resumed_from": code, "next_action": RESUMED, "inactivity_deadline": deadline }))
            }),
        )
        .await
    }
}
