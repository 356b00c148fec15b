//! The coordinator's types: a chain's identity, everything the database holds about a chain
//! (what any coordinator process needs to drive it on), and the read models operators see.
//!
//! **Never:** holds authority. These are snapshots of rows; every decision re-checks them in
//! a compare-and-swap.

use const_format::concatcp;
use serde::{Deserialize, Serialize};
use tokio_postgres::Row;

use super::error::{AuthorityError, Category};
use super::rows::RowExt;
use super::states::{GenState, LaneState, Lifecycle, WatchdogStep, WorkStatus, PREACTIVATION};
use super::store::Store;

/// The immutable identity of one reservation chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub assignment_id: String,
    pub assignment_attempt_id: String,
    pub reservation_id: String,
    pub reservation_epoch: i64,
}

impl Chain {
    /// Decodes a chain's identifiers from a row that selects them under their own names
    /// (`lane_id`, `lane_incarnation_id`, `assignment_id`, `assignment_attempt_id`,
    /// `reservation_id`, `reservation_epoch`).
    pub(crate) fn from_row(r: &Row) -> Result<Self, AuthorityError> {
        Ok(Chain {
            lane_id: r.col("lane_id")?,
            lane_incarnation_id: r.col("lane_incarnation_id")?,
            assignment_id: r.col("assignment_id")?,
            assignment_attempt_id: r.col("assignment_attempt_id")?,
            reservation_id: r.col("reservation_id")?,
            reservation_epoch: r.col("reservation_epoch")?,
        })
    }

    /// Every identifier of the chain, for request digests.
    pub(crate) fn key(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.lane_id,
            self.lane_incarnation_id,
            self.assignment_id,
            self.assignment_attempt_id,
            self.reservation_id,
            self.reservation_epoch
        )
    }
}

/// A terminal outcome an assignment can be ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// Only with evidence under the assignment's completion policy.
    Completed,
    Failed,
    /// An operator's stop or cancel.
    Cancelled,
    /// Terminal quarantine of the work itself (not of the lane).
    Quarantined,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "COMPLETED",
            Outcome::Failed => "FAILED",
            Outcome::Cancelled => "CANCELLED",
            Outcome::Quarantined => "QUARANTINED",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            Outcome::Completed,
            Outcome::Failed,
            Outcome::Cancelled,
            Outcome::Quarantined,
        ]
        .into_iter()
        .find(|o| o.as_str().eq_ignore_ascii_case(s))
    }
}

/// Everything the database holds about one chain: enough for any coordinator process to
/// drive it on after the one that started it died.
#[derive(Debug, Clone)]
pub struct ChainRow {
    pub chain: Chain,
    pub host_id: String,
    pub lane_state: LaneState,
    pub lane_retired: bool,
    pub lifecycle: Lifecycle,
    pub runtime_id: String,
    pub scope_digest: String,
    pub holds_digest: String,
    pub completion_policy_digest: String,
    pub responsibility_owner: String,
    pub execution_owner: Option<String>,
    pub pending_target: Option<String>,
    pub requested_outcome: Option<String>,
    pub reservation_lease_id: String,
    /// Database time, in the one text form clients hand back unchanged.
    pub reservation_deadline: String,
    pub reservation_open: bool,
    pub reservation_coordinator_epoch: i64,
    pub fence_salt: String,
    pub task_text: String,
    pub generation: Option<i64>,
    pub generation_state: Option<GenState>,
    pub stop_requested: bool,
    pub process_identity: Option<serde_json::Value>,
    pub contracts_digest: Option<String>,
    pub challenge_id: Option<String>,
    pub challenge_expires_at: Option<String>,
    pub challenge_consumed: bool,
    pub ack_digest: Option<String>,
    /// The coordinator-issued time of the latest receipt of this chain (for `issued_at`).
    pub last_decided_at: String,
    /// The repository its work's workspace is cloned from, if it has one.
    pub repository: Option<crate::protocol::repo::RepoBinding>,
}

/// The repository columns of a chain row, checked as the wire checks them.
fn repo_binding(r: &Row) -> Result<Option<crate::protocol::repo::RepoBinding>, AuthorityError> {
    use crate::protocol::repo::{BaseRef, RepoBinding, RepoName, RepoSource};
    let name: Option<String> = r.col("repository")?;
    let Some(name) = name else {
        return Ok(None);
    };
    let (base, kind, source): (Option<String>, Option<String>, Option<String>) = (
        r.col("base_ref")?,
        r.col("repository_kind")?,
        r.col("repository_source")?,
    );
    let bad = |detail: String| AuthorityError::Invariant {
        op: "chain-row",
        detail,
    };
    let (Some(base), Some(kind), Some(source)) = (base, kind, source) else {
        return Err(bad(format!("repository {name} without its base or source")));
    };
    Ok(Some(RepoBinding {
        name: RepoName::parse(&name).map_err(|e| bad(e.to_string()))?,
        source: RepoSource::of(&kind, &source).map_err(|e| bad(e.to_string()))?,
        base: BaseRef::parse(&base).map_err(|e| bad(e.to_string()))?,
        setup: super::repos::setup_of(r, "chain-row")?,
    }))
}

/// Where a chain stands for an operator waiting on it: its lane's state, whether its
/// reservation is open, whether its lane is retired. The waiting hub reads only this for
/// every waiter (two index probes each); a waiter reads its whole row once this satisfies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainProgress {
    pub lane_state: LaneState,
    pub reservation_open: bool,
    pub lane_retired: bool,
}

impl ChainProgress {
    /// Decodes the columns `lane_state`, `reservation_open` and `lane_retired`, named alike
    /// in `chain_reads::CHAIN_OF_ONE` and in the hub's narrower read.
    pub(super) fn from_row(r: &Row) -> Result<Self, AuthorityError> {
        Ok(ChainProgress {
            lane_state: r.col("lane_state")?,
            reservation_open: r.col("reservation_open")?,
            lane_retired: r.col("lane_retired")?,
        })
    }
}

impl ChainRow {
    /// Where it stands, as the waiting hub reads it.
    pub fn progress(&self) -> ChainProgress {
        ChainProgress {
            lane_state: self.lane_state,
            reservation_open: self.reservation_open,
            lane_retired: self.lane_retired,
        }
    }

    /// Its work is offered to another lane while it runs (a handoff offer is open): its
    /// workspace is held read-only, as its effect admission is closed.
    pub fn workspace_held(&self) -> bool {
        self.lane_state == LaneState::Running
            && self.reservation_open
            && self
                .pending_target
                .as_deref()
                .is_some_and(|t| t != self.chain.lane_id)
    }

    /// It runs with its work its own again (no offer open, its end not asked for): a held
    /// workspace may be released. Neither this nor `workspace_held` after an accepted
    /// handoff, whose end order closes the source for good.
    pub fn workspace_releasable(&self) -> bool {
        self.lane_state == LaneState::Running
            && self.reservation_open
            && !self.stop_requested
            && self.pending_target.is_none()
            && self.execution_owner.is_some()
            && self.requested_outcome.is_none()
            && self.lifecycle == Lifecycle::Active
    }

    /// Decodes one row of `chain_reads::CHAIN_OF_ONE` by column name. The nullable sides of the left
    /// joins (no generation or challenge yet) decode as absent or false.
    pub(super) fn from_row(r: &Row) -> Result<Self, AuthorityError> {
        Ok(ChainRow {
            chain: Chain::from_row(r)?,
            host_id: r.col("host_id")?,
            lane_state: r.col("lane_state")?,
            lane_retired: r.col("lane_retired")?,
            lifecycle: r.col("lifecycle")?,
            runtime_id: r.col("runtime_id")?,
            scope_digest: r.col("scope_digest")?,
            holds_digest: r.col("holds_digest")?,
            completion_policy_digest: r.col("completion_policy_digest")?,
            responsibility_owner: r.col("responsibility_owner")?,
            execution_owner: r.col("execution_owner")?,
            pending_target: r.col("pending_target")?,
            requested_outcome: r.col("requested_outcome")?,
            reservation_lease_id: r.col("reservation_lease_id")?,
            reservation_deadline: r.col("reservation_deadline")?,
            reservation_open: r.col("reservation_open")?,
            reservation_coordinator_epoch: r.col("reservation_coordinator_epoch")?,
            fence_salt: r.col("fence_salt")?,
            task_text: r.col("task_text")?,
            generation: r.col("generation")?,
            generation_state: r.col("generation_state")?,
            stop_requested: r.col::<Option<bool>>("stop_requested")?.unwrap_or(false),
            process_identity: r.col("process_identity")?,
            contracts_digest: r.col("contracts_digest")?,
            challenge_id: r.col("challenge_id")?,
            challenge_expires_at: r.col("challenge_expires_at")?,
            challenge_consumed: r
                .col::<Option<bool>>("challenge_consumed")?
                .unwrap_or(false),
            ack_digest: r.col("ack_digest")?,
            last_decided_at: r
                .col::<Option<String>>("last_decided_at")?
                .unwrap_or_default(),
            repository: repo_binding(r)?,
        })
    }
}

/// Read model of a lane incarnation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaneView {
    pub lane_id: String,
    pub host_id: String,
    pub lane_incarnation_id: String,
    pub state: LaneState,
    pub next_generation: i64,
    pub quarantine_reason: Option<String>,
    pub host_quarantine_reason: Option<String>,
    pub recreate_requested: bool,
    /// The generation the coordinator still waits to see ended, if any.
    pub unended_generation: Option<i64>,
    /// When the lane incarnation last changed (its latest transition; database time).
    pub since: Option<String>,
}

/// An assignment's own record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssignmentView {
    pub assignment_id: String,
    pub lane_incarnation_id: String,
    pub lifecycle: Lifecycle,
    pub responsibility_owner: String,
    pub execution_owner: Option<String>,
    pub pending_target: Option<String>,
    pub next_action: String,
    pub requested_outcome: Option<String>,
    pub final_evidence_digest: Option<String>,
    pub runtime_id: String,
}

/// An assignment as operators see it: its own lifecycle as its state, beside its lane's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssignmentStatus {
    pub assignment_id: String,
    /// The assignment's lifecycle: ACTIVE, RECOVERY or its terminal outcome.
    pub state: Lifecycle,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    /// The lane's state while this assignment holds the lane; `null` once it let go.
    pub lane_state: Option<LaneState>,
    pub runtime_id: String,
    pub generation: Option<i64>,
    pub attempts: i64,
    pub responsibility_owner: String,
    pub execution_owner: Option<String>,
    pub pending_target: Option<String>,
    pub next_action: String,
    pub requested_outcome: Option<String>,
    pub final_evidence_digest: Option<String>,
    /// The work record (spec §14): active, blocked, handoff or done.
    pub work_status: WorkStatus,
    pub inactivity_policy: String,
    pub inactivity_policy_digest: String,
    /// Database time of the last validated progress receipt, if any.
    pub last_progress_at: Option<String>,
    /// When the watchdog replaces the generation without new progress (database time).
    pub inactivity_deadline: Option<String>,
    /// none, warned, escalated or replacing.
    pub watchdog_step: WatchdogStep,
    pub blocker_code: Option<String>,
    pub blocker_evidence_digest: Option<String>,
    /// When the watchdog resumes blocked work by itself (a rate limit's reset; database
    /// time); `null` when only an operator can.
    pub blocked_until: Option<String>,
    /// The accepted handoff that moved responsibility here, if any.
    pub handoff_ack: Option<String>,
    /// Continuations the assignment may still accept.
    pub continuation_budget: i32,
    /// Its latest continuation: id, state, claims made.
    pub continuation: Option<serde_json::Value>,
}

const LANE_SELECT: &str = concatcp!("SELECT li.lane_id, ln.host_id, li.lane_incarnation_id, li.state, li.next_generation, li.quarantine_reason, \
        li.host_quarantine_reason, li.recreate_requested_at IS NOT NULL AS recreate_requested, \
        (SELECT max(g.generation) FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> ", GenState::Ended.sql(), ") AS unended_generation, \
        (SELECT mosaic_ts(max(t.decided_at)) FROM transition_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id) AS since \
     FROM lane_incarnations li JOIN lanes ln USING (lane_id) WHERE li.retired_at IS NULL");

fn lane_view(r: &Row) -> Result<LaneView, AuthorityError> {
    Ok(LaneView {
        lane_id: r.col("lane_id")?,
        host_id: r.col("host_id")?,
        lane_incarnation_id: r.col("lane_incarnation_id")?,
        state: r.col("state")?,
        next_generation: r.col("next_generation")?,
        quarantine_reason: r.col("quarantine_reason")?,
        host_quarantine_reason: r.col("host_quarantine_reason")?,
        recreate_requested: r.col("recreate_requested")?,
        unended_generation: r.col("unended_generation")?,
        since: r.col("since")?,
    })
}

impl Store {
    pub async fn lane(&self, lane_id: &str) -> Result<Option<LaneView>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(&format!("{LANE_SELECT} AND li.lane_id = $1"))
            .await?;
        c.query_opt(&stmt, &[&lane_id])
            .await?
            .map(|r| lane_view(&r))
            .transpose()
    }

    pub async fn lanes(&self) -> Result<Vec<LaneView>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(&format!("{LANE_SELECT} ORDER BY li.lane_id"))
            .await?;
        c.query(&stmt, &[]).await?.iter().map(lane_view).collect()
    }

    /// The current lanes of one host.
    pub async fn lanes_of_host(&self, host_id: &str) -> Result<Vec<LaneView>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(&format!(
                "{LANE_SELECT} AND ln.host_id = $1 ORDER BY li.lane_id"
            ))
            .await?;
        c.query(&stmt, &[&host_id])
            .await?
            .iter()
            .map(lane_view)
            .collect()
    }

    /// The task text of an assignment's latest attempt (what a resume continues).
    pub async fn latest_task(&self, assignment: &str) -> Result<Option<String>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(
            "SELECT task_text FROM attempts WHERE assignment_id = $1 ORDER BY created_at DESC, assignment_attempt_id DESC LIMIT 1",
            &[&assignment],
        )
        .await?
        .map(|r| r.col("task_text"))
        .transpose()
    }

    pub async fn assignment(&self, id: &str) -> Result<Option<AssignmentView>, AuthorityError> {
        Ok(self.assignments(&[id.to_string()]).await?.pop())
    }

    /// The assignments of `ids` that exist (one read however many are asked for).
    pub async fn assignments(&self, ids: &[String]) -> Result<Vec<AssignmentView>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(
                "SELECT assignment_id, lane_incarnation_id, lifecycle, responsibility_owner, execution_owner, pending_target, next_action, \
                        requested_outcome, final_evidence_digest, runtime_id FROM assignments WHERE assignment_id = ANY($1)",
            )
            .await?;
        c.query(&stmt, &[&ids])
            .await?
            .iter()
            .map(|r| {
                Ok(AssignmentView {
                    assignment_id: r.col("assignment_id")?,
                    lane_incarnation_id: r.col("lane_incarnation_id")?,
                    lifecycle: r.col("lifecycle")?,
                    responsibility_owner: r.col("responsibility_owner")?,
                    execution_owner: r.col("execution_owner")?,
                    pending_target: r.col("pending_target")?,
                    next_action: r.col("next_action")?,
                    requested_outcome: r.col("requested_outcome")?,
                    final_evidence_digest: r.col("final_evidence_digest")?,
                    runtime_id: r.col("runtime_id")?,
                })
            })
            .collect()
    }

    pub async fn assignment_statuses(&self) -> Result<Vec<AssignmentStatus>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                // The lane's state belongs to an assignment only while it holds the lane: an
                // open reservation, or a generation of its still running or ending.
                concatcp!("SELECT a.assignment_id, a.lifecycle, li.lane_id, li.lane_incarnation_id, \
                        CASE WHEN li.retired_at IS NULL AND EXISTS (SELECT 1 FROM reservations r \
                             WHERE r.assignment_id = a.assignment_id AND r.lane_incarnation_id = li.lane_incarnation_id \
                               AND (r.released_at IS NULL OR EXISTS (SELECT 1 FROM generations g \
                                    WHERE g.reservation_id = r.reservation_id AND g.state <> ", GenState::Ended.sql(), "))) \
                             THEN li.state END AS lane_state, a.runtime_id, \
                        (SELECT r.generation FROM reservations r WHERE r.assignment_id = a.assignment_id ORDER BY r.created_at DESC LIMIT 1) AS generation, \
                        (SELECT count(*) FROM attempts t WHERE t.assignment_id = a.assignment_id) AS attempts, \
                        a.responsibility_owner, a.execution_owner, a.pending_target, a.next_action, a.requested_outcome, a.final_evidence_digest, \
                        a.work_status, a.inactivity_policy, a.inactivity_policy_digest, mosaic_ts(a.last_progress_at) AS last_progress_at, \
                        mosaic_ts(a.inactivity_deadline) AS inactivity_deadline, a.watchdog_step, a.blocker_code, a.blocker_evidence_digest, \
                        mosaic_ts(a.blocked_until) AS blocked_until, a.handoff_ack, a.continuation_budget, \
                        (SELECT jsonb_build_object('continuation_id', c.continuation_id, 'state', c.state, 'claims', c.attempts) \
                         FROM continuations c WHERE c.assignment_id = a.assignment_id ORDER BY c.created_at DESC LIMIT 1) AS continuation \
                 FROM assignments a JOIN lane_incarnations li USING (lane_incarnation_id) ORDER BY a.created_at"),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(AssignmentStatus {
                    assignment_id: r.col("assignment_id")?,
                    state: r.col("lifecycle")?,
                    lane_id: r.col("lane_id")?,
                    lane_incarnation_id: r.col("lane_incarnation_id")?,
                    lane_state: r.col("lane_state")?,
                    runtime_id: r.col("runtime_id")?,
                    generation: r.col("generation")?,
                    attempts: r.col("attempts")?,
                    responsibility_owner: r.col("responsibility_owner")?,
                    execution_owner: r.col("execution_owner")?,
                    pending_target: r.col("pending_target")?,
                    next_action: r.col("next_action")?,
                    requested_outcome: r.col("requested_outcome")?,
                    final_evidence_digest: r.col("final_evidence_digest")?,
                    work_status: r.col("work_status")?,
                    inactivity_policy: r.col("inactivity_policy")?,
                    inactivity_policy_digest: r.col("inactivity_policy_digest")?,
                    last_progress_at: r.col("last_progress_at")?,
                    inactivity_deadline: r.col("inactivity_deadline")?,
                    watchdog_step: r.col("watchdog_step")?,
                    blocker_code: r.col("blocker_code")?,
                    blocker_evidence_digest: r.col("blocker_evidence_digest")?,
                    blocked_until: r.col("blocked_until")?,
                    handoff_ack: r.col("handoff_ack")?,
                    continuation_budget: r.col("continuation_budget")?,
                    continuation: r.col("continuation")?,
                })
            })
            .collect()
    }

    /// Each lane's most recent ingested termination receipt: lane, generation, reason,
    /// source, reconciliation, when.
    pub async fn last_receipts(&self) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT DISTINCT ON (lane_id) lane_id, generation, body->>'termination_reason' AS reason, \
                        body->>'observation_source' AS source, reconciliation, mosaic_ts(ingested_at) AS at \
                 FROM termination_receipts ORDER BY lane_id, ingested_at DESC",
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(serde_json::json!({
                    "lane_id": r.col::<String>("lane_id")?, "generation": r.col::<i64>("generation")?,
                    "reason": r.col::<Option<String>>("reason")?, "source": r.col::<Option<String>>("source")?,
                    "reconciliation": r.col::<Option<String>>("reconciliation")?, "at": r.col::<String>("at")?,
                }))
            })
            .collect()
    }

    /// Ingested termination receipts, oldest first (optionally for one lane), each with the
    /// assignment, attempt, epoch and owners it concerned and how it was reconciled.
    /// What the host said of how generation `generation` of `inc` ended (its receipt's
    /// detail), once its receipt is in.
    pub async fn receipt_detail(
        &self,
        inc: &str,
        generation: i64,
    ) -> Result<Option<String>, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query_opt(
            "SELECT body->>'detail' AS detail FROM termination_receipts WHERE lane_incarnation_id = $1 AND generation = $2",
            &[&inc, &generation],
        )
        .await?
        .map(|r| r.col::<Option<String>>("detail"))
        .transpose()?
        .flatten())
    }

    pub async fn termination_receipts(
        &self,
        lane_id: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT body, reconciliation, reservation_id, assignment_id, assignment_attempt_id, ingested_epoch, \
                        responsibility_owner, execution_owner, mosaic_ts(ingested_at) AS ingested_at \
                 FROM termination_receipts WHERE $1::text IS NULL OR lane_id = $1 ORDER BY ingested_at",
                &[&lane_id],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let mut b: serde_json::Value = r.col("body")?;
                b["reconciliation"] = serde_json::json!(r.col::<Option<String>>("reconciliation")?);
                b["coordinator"] = serde_json::json!({
                    "reservation_id": r.col::<Option<String>>("reservation_id")?,
                    "assignment_id": r.col::<Option<String>>("assignment_id")?,
                    "assignment_attempt_id": r.col::<Option<String>>("assignment_attempt_id")?,
                    "coordinator_epoch": r.col::<i64>("ingested_epoch")?,
                    "responsibility_owner": r.col::<Option<String>>("responsibility_owner")?,
                    "execution_owner": r.col::<Option<String>>("execution_owner")?,
                    "ingested_at": r.col::<String>("ingested_at")?,
                });
                Ok(b)
            })
            .collect()
    }

    /// The runtimes a host advertised at its last hello.
    pub async fn host_runtimes(
        &self,
        host_id: &str,
    ) -> Result<Option<Vec<String>>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt("SELECT runtimes FROM hosts WHERE host_id = $1", &[&host_id])
            .await?
            .map(|r| r.col("runtimes"))
            .transpose()
    }

    /// The primary's clock now (RFC 3339, as `mosaic_ts` formats it), and `ahead_ms` later.
    pub async fn db_now_and(&self, ahead_ms: i64) -> Result<(String, String), AuthorityError> {
        let c = self.pool.get().await?;
        let r = c
            .query_one(
                "SELECT mosaic_ts(t) AS now, mosaic_ts(t + make_interval(secs => $1::double precision / 1000)) AS later \
                 FROM clock_timestamp() t",
                &[&(ahead_ms as f64)],
            )
            .await?;
        Ok((r.col("now")?, r.col("later")?))
    }

    /// Records a newly admitted host session: its id may never have been admitted before
    /// (primary key), and it gets the host's next session epoch.
    pub async fn open_host_session(
        &self,
        host_id: &str,
        session_id: &str,
        coordinator_epoch: i64,
    ) -> Result<i64, AuthorityError> {
        let c = self.pool.get().await?;
        let sql = "INSERT INTO host_sessions (session_id, host_id, session_epoch, coordinator_epoch) \
                   SELECT $1, $2, coalesce(max(session_epoch), 0) + 1, $3 FROM host_sessions WHERE host_id = $2 \
                   RETURNING session_epoch";
        // Two sessions of one host admitted at the same instant race for the epoch: the
        // loser takes the next one.
        for _ in 0..3 {
            match c
                .query_one(sql, &[&session_id, &host_id, &coordinator_epoch])
                .await
            {
                Ok(r) => return r.col("session_epoch"),
                Err(e)
                    if e.as_db_error().is_some_and(|d| {
                        d.constraint() == Some("host_sessions_host_id_session_epoch_key")
                    }) =>
                {
                    continue
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(AuthorityError::Rejected {
            op: "host-session",
            category: Category::Conflict,
            detail: "could not allocate a session epoch".into(),
        })
    }

    /// Records why a host session ended (once).
    pub async fn close_host_session(
        &self,
        session_id: &str,
        reason: &str,
    ) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        c.execute(
            "UPDATE host_sessions SET closed_at = clock_timestamp(), close_reason = $2 \
             WHERE session_id = $1 AND closed_at IS NULL",
            &[&session_id, &reason],
        )
        .await?;
        Ok(())
    }

    /// Records what a host advertised (declared capabilities; not authority).
    pub async fn record_host(
        &self,
        host_id: &str,
        runtimes: &[String],
    ) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        c.execute(
            "INSERT INTO hosts (host_id, runtimes) VALUES ($1, $2) \
             ON CONFLICT (host_id) DO UPDATE SET runtimes = $2, last_hello_at = clock_timestamp()",
            &[&host_id, &runtimes],
        )
        .await?;
        Ok(())
    }
}

impl Store {
    /// When the earliest unreleased lease of a reservation expires (database time).
    pub async fn lease_expiry(
        &self,
        reservation_id: &str,
    ) -> Result<Option<String>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_one(
            "SELECT mosaic_ts(min(expires_at)) AS expires_at FROM leases WHERE reservation_id = $1 AND released_at IS NULL",
            &[&reservation_id],
        )
        .await?
        .col("expires_at")
    }

    /// RUNNING chains and their earliest unreleased lease: (chain, expired, past half-life).
    pub async fn running_leases(&self) -> Result<Vec<(Chain, String, bool, bool)>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                concatcp!("SELECT li.lane_id, r.lane_incarnation_id, r.assignment_id, r.assignment_attempt_id, r.reservation_id, r.reservation_epoch, ln.host_id, \
                        bool_or(s.expires_at <= clock_timestamp()) AS expired, \
                        bool_or(s.expires_at - clock_timestamp() < (s.expires_at - s.issued_at) / 2) AS past_half_life \
                 FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) JOIN lanes ln ON ln.lane_id = li.lane_id \
                 JOIN leases s ON s.reservation_id = r.reservation_id AND s.released_at IS NULL \
                 WHERE li.state = ", LaneState::Running.sql(), " AND li.retired_at IS NULL AND r.released_at IS NULL \
                 GROUP BY 1, 2, 3, 4, 5, 6, 7"),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    Chain::from_row(r)?,
                    r.col("host_id")?,
                    r.col::<Option<bool>>("expired")?.unwrap_or(false),
                    r.col::<Option<bool>>("past_half_life")?.unwrap_or(false),
                ))
            })
            .collect()
    }

    /// Preactivation chains whose reservation deadline has passed (database time).
    pub async fn expired_chains(&self) -> Result<Vec<(Chain, String)>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            "SELECT li.lane_id, r.lane_incarnation_id, r.assignment_id, r.assignment_attempt_id, r.reservation_id, r.reservation_epoch, ln.host_id \
             FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) JOIN lanes ln ON ln.lane_id = li.lane_id \
             WHERE r.released_at IS NULL AND r.deadline <= clock_timestamp() AND li.retired_at IS NULL \
               AND li.state = ANY($1)",
            &[&PREACTIVATION],
        )
        .await?
        .iter()
        .map(|r| Ok((Chain::from_row(r)?, r.col("host_id")?)))
        .collect()
    }
}
