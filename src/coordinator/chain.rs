//! The chain up to the challenge (spec §6): IDLE_CLEAN → RESERVED → CHECKPOINTING → FENCED →
//! STAGING → CONTRACT_INJECTING → AWAITING_ACK.
//!
//! Each function is one transition through [`Store::transition`]: one compare-and-swap over
//! the values spec §6.1 lists for it, its receipt in the same commit. Idempotency keys are
//! derived from what the step acts on (`stage/<reservation>`, …), so a retry — by this
//! process or by the next leader — can only land on the same receipt.

use const_format::concatcp;
use serde_json::json;

use super::cas::{self, Pred};
use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::rows::RowExt;
use super::secret;
use super::states::{GenState, HandoffState, LaneState, Lifecycle, WatchdogStep, WorkStatus};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step, Undecided};
use crate::protocol::task;

/// What to reserve a lane for. Everything here is what the operator supplied; the digests
/// bound into the chain are computed from it.
#[derive(Debug, Clone)]
pub struct ReserveRequest {
    /// The operator's request id: a retried `assign` lands on the same reservation.
    pub request_id: String,
    pub lane_incarnation_id: String,
    /// `Some` to give an assignment in recovery a fresh chain; `None` for a new assignment.
    pub assignment_id: Option<String>,
    /// The principal that will execute (responsibility owner and pending target).
    pub target: String,
    pub runtime_id: String,
    pub task_text: String,
    pub scope: Vec<String>,
    pub holds: Vec<String>,
    pub completion_policy: String,
    /// The inactivity policy (`name@version`) a new assignment is approved under; a resumed
    /// one keeps its own.
    pub inactivity_policy: String,
    pub ttl_ms: i64,
    /// The repository a new assignment works in, and the ref its branch starts at (a
    /// resumed one keeps its own: these are ignored for it).
    pub repository: Option<(
        crate::protocol::repo::RepoName,
        crate::protocol::repo::BaseRef,
    )>,
    /// A new assignment's grant (§11) to start from another's checkpoint: its digest and
    /// the grant's lifetime (ms). Made in the reservation's transaction.
    pub grant: Option<(String, i64)>,
    /// How the lane was chosen when the operator named none: recorded with the reservation.
    pub placement: Option<crate::coordinator::placement::Decision>,
    /// A retarget (spec §6.3): the candidate's verified recovery ACK, consumed by this CAS.
    pub recovery: Option<crate::coordinator::recovery::RecoveryConsume>,
}

impl ReserveRequest {
    pub fn scope_digest(&self) -> String {
        task::list_digest("scope", &self.scope)
    }
    pub fn holds_digest(&self) -> String {
        task::list_digest("holds", &self.holds)
    }
    pub fn policy_digest(&self) -> String {
        task::policy_digest(&self.completion_policy)
    }
}

#[derive(Debug, Clone)]
pub struct Reserved {
    pub chain: Chain,
    pub reservation_lease_id: String,
    /// Database time, in the one text form clients must hand back unchanged.
    pub deadline: String,
    pub receipt: Receipt,
}

/// The expected state every step of a chain shares, in diagnosis order: the lane
/// incarnation current and in `from`, the reservation this chain's own, open, unexpired and
/// begun under the current epoch and timeline, the assignment active. Parameters: $1 the
/// new state, $2 lane incarnation, $3 lane, $4 reservation, $5 its epoch, $6 assignment, $7
/// attempt, $8 `from`, $9 epoch, $10 timeline; a step's own predicate uses $11 on.
const STEP_PREDS: &[Pred] = &[
    Pred { sql: "li.retired_at IS NULL", category: Category::Mismatch,
        detail: "lane incarnation was retired (lane recreated)" },
    Pred { sql: "li.lane_id = $3", category: Category::Mismatch, detail: "lane id differs" },
    Pred { sql: "r.reservation_id IS NOT NULL", category: Category::NotFound, detail: "no such reservation" },
    Pred { sql: "r.reservation_epoch = $5 AND r.lane_incarnation_id = li.lane_incarnation_id \
                 AND r.assignment_id = $6 AND r.assignment_attempt_id = $7",
        category: Category::Mismatch,
        detail: "the chain's reservation, lane incarnation, assignment or attempt do not belong together" },
    Pred { sql: "li.state = $8", category: Category::WrongState,
        detail: "the lane is not in the state this step starts from" },
    Pred { sql: "r.released_at IS NULL", category: Category::WrongState, detail: "the reservation was released" },
    Pred { sql: "r.deadline > clock_timestamp()", category: Category::Expired,
        detail: "the reservation deadline has passed (database time; equality is expired)" },
    Pred { sql: "r.coordinator_epoch = $9 AND r.sot_incarnation = $10", category: Category::StaleLeader,
        detail: "the chain began under another coordinator epoch" },
    Pred { sql: concatcp!("a.lifecycle = ", Lifecycle::Active.sql(), " AND a.requested_outcome IS NULL"), category: Category::WrongState,
        detail: "the assignment is no longer advancing" },
];

/// A step's own predicates (over `li`, `r`, `a`), each with what its failure means.
type Extra = &'static [Pred];

/// A step's own predicate whose failure needs no words of its own.
const fn own(sql: &'static str) -> Pred {
    Pred {
        sql,
        category: Category::Mismatch,
        detail: "a transition-specific precondition does not hold",
    }
}

/// A step's whole table: the shared predicates, then its own.
fn step_preds(extra: Extra) -> Vec<Pred> {
    let mut preds = STEP_PREDS.to_vec();
    preds.extend_from_slice(extra);
    preds
}

/// The rows a step compares: the lane incarnation, the reservation, its assignment.
const STEP_ROWS: &str =
    "li.lane_incarnation_id = $2 AND r.reservation_id = $4 AND a.assignment_id = r.assignment_id";

/// Builds a step's CAS from its table.
fn step_cas(extra: Extra) -> String {
    format!(
        "UPDATE lane_incarnations li SET state = $1 FROM reservations r, assignments a \
         WHERE {STEP_ROWS} AND {} RETURNING li.lane_incarnation_id",
        cas::conjunction(&step_preds(extra))
    )
}

/// The predicate FENCED → STAGING adds: no generation allocated yet.
const STAGE_EXTRA: Extra = &[own("r.generation IS NULL")];

/// FENCED → STAGING also allocates the generation in the same row update: the number
/// returned is the one the lane's counter moved past.
fn stage_cas() -> String {
    format!(
        "UPDATE lane_incarnations li SET state = $1, next_generation = li.next_generation + 1 \
         FROM reservations r, assignments a \
         WHERE {STEP_ROWS} AND {} RETURNING li.next_generation - 1 AS generation",
        cas::conjunction(&step_preds(STAGE_EXTRA))
    )
}

/// Explains a refused step from the same table its CAS was built from: each predicate over
/// the lane incarnation and, reached from it, the reservation and assignment. (`$1`, the
/// new state, decides nothing here; it is named so both statements bind one parameter
/// list.)
pub(crate) async fn diagnose(
    u: Undecided<'_>,
    extra: Extra,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<AuthorityError, AuthorityError> {
    let preds = step_preds(extra);
    let sql = cas::diagnosis(
        &preds,
        "FROM lane_incarnations li LEFT JOIN reservations r ON r.reservation_id = $4 \
         LEFT JOIN assignments a ON a.assignment_id = r.assignment_id \
         WHERE li.lane_incarnation_id = $2 AND $1::text IS NOT NULL",
    );
    u.diagnose(&sql, params, &preds, "no such lane incarnation")
        .await
}

fn chain_step(op: &'static str, l: &Leader, c: &Chain, key: String, parts: &[&str]) -> Step {
    let mut all = vec![c.key()];
    all.extend(parts.iter().map(|p| p.to_string()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    Step::new(op, l, key, request_digest(op, &refs))
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id))
}

impl Store {
    /// IDLE_CLEAN → RESERVED. Creates (or revives from recovery) the assignment with
    /// `responsibility_owner = pending_target = target` and no execution owner, a never-reused
    /// attempt carrying the task, and a reservation whose lease grants no effects.
    pub async fn reserve(
        &self,
        l: &Leader,
        req: &ReserveRequest,
    ) -> Result<Reserved, AuthorityError> {
        const OP: &str = "reserve";
        if let Err(e) = crate::adapter::validate_task(&req.runtime_id, &req.task_text) {
            let cat = match e {
                task::TaskError::TooLarge { .. } => Category::TooLarge,
                task::TaskError::BadRuntime(_) => Category::UnknownRuntime,
                task::TaskError::Grammar { .. } | task::TaskError::Empty => Category::BadInput,
            };
            return Err(reject(OP, cat, e.to_string()));
        }
        if req.request_id.is_empty()
            || req.target.is_empty()
            || !(1000..=86_400_000).contains(&req.ttl_ms)
            || !task::COMPLETION_POLICIES.contains(&req.completion_policy.as_str())
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "request id, target, a known completion policy and a ttl of 1 s..24 h are required",
            ));
        }
        let (scope, holds, policy) = (req.scope_digest(), req.holds_digest(), req.policy_digest());
        let task_digest = task::task_digest(&req.task_text);
        let resume = req.assignment_id.clone().unwrap_or_default();
        let digest = request_digest(
            OP,
            &[
                &req.lane_incarnation_id,
                &resume,
                &req.target,
                &req.runtime_id,
                &scope,
                &holds,
                &policy,
                &task_digest,
                &req.ttl_ms.to_string(),
                &req.inactivity_policy,
                req.grant.as_ref().map_or("", |g| g.0.as_str()),
                req.placement
                    .as_ref()
                    .map_or("", |p| p.inputs_digest.as_str()),
                &req.recovery
                    .as_ref()
                    .map_or(String::new(), |c| c.param().to_string()),
            ],
        );
        if req.recovery.is_some() && req.assignment_id.is_none() {
            return Err(reject(
                OP,
                Category::BadInput,
                "a retarget gives existing work a fresh chain",
            ));
        }
        if req
            .placement
            .as_ref()
            .is_some_and(|p| p.lane_incarnation_id != req.lane_incarnation_id)
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "a placement reserves the lane it chose",
            ));
        }
        let step = Step::new(OP, l, format!("reserve/{}", req.request_id), digest)
            .about(req.assignment_id.as_deref(), Some(&req.lane_incarnation_id));
        let salt = secret::fence_salt().map_err(|e| AuthorityError::Entropy(e.to_string()))?;
        let req = req.clone();
        let sec = self.secret.clone();
        let scope_json = json!(req.scope);
        let holds_json = json!(req.holds);
        let epoch = l.epoch();
        let sot = l.sot().to_string();
        let recovery = req.recovery.as_ref().map(|c| c.param());
        let r = self
            .transition(
                &step,
                body!([req, sec, salt, scope, holds, policy, task_digest, scope_json, holds_json, sot, recovery] |f| {
                    // A retarget pins the work's row first: the failed target's snapshot the
                    // CAS recomputes cannot move under it before this commit.
                    if recovery.is_some() {
                        f.read("SELECT 1 FROM assignments WHERE assignment_id = $1 FOR UPDATE", &[&req.assignment_id]).await?;
                    }
                    // The lane and (when resuming) the assignment, both in their expected
                    // states, in one statement.
                    let d = f.cas(
                        concatcp!("UPDATE lane_incarnations li SET state = ", LaneState::Reserved.sql(), " \
                         WHERE li.lane_incarnation_id = $1 AND li.state = ", LaneState::IdleClean.sql(), " AND li.retired_at IS NULL \
                           AND li.recreate_requested_at IS NULL AND li.host_quarantine_reason IS NULL \
                           AND NOT EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id AND t.reconciled_at IS NULL) \
                           AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> ", GenState::Ended.sql(), ") \
                           AND ", super::leases::LEASE_ADMITS_WORK, " \
                           AND ($2::text = '' OR EXISTS (SELECT 1 FROM assignments a WHERE a.assignment_id = $2 AND a.lifecycle = ", Lifecycle::Recovery.sql(), " \
                                  AND a.requested_outcome IS NULL AND a.work_status = ", WorkStatus::Active.sql(), " AND a.runtime_id = $3 AND a.scope_digest = $4 AND a.holds_digest = $5 \
                                  AND a.completion_policy_digest = $6 \
                                  AND NOT EXISTS (SELECT 1 FROM reservations r2 JOIN generations g2 ON g2.lane_incarnation_id = r2.lane_incarnation_id \
                                                  AND g2.generation = r2.generation WHERE r2.assignment_id = a.assignment_id AND g2.state <> ", GenState::Ended.sql(), " \
                                                  AND ($7::jsonb IS NULL OR g2.state = ", GenState::Live.sql(), ")))) \
                           AND ($7::jsonb IS NULL OR ($7->>'operation' <> 'pre-transfer' AND ", super::recovery::ADMITS, ")) \
                         RETURNING li.lane_id"),
                        &[&req.lane_incarnation_id, &req.assignment_id.clone().unwrap_or_default(), &req.runtime_id, &scope, &holds, &policy,
                          &recovery, &epoch],
                    ).await?;
                    let d = match d {
                        Ok(d) => d,
                        Err(u) => return Err(super::reservable::why_not(u, &req, epoch).await?),
                    };
                    let lane_id: String = d.row().col("lane_id")?;
                    let next_action = format!("stage a fresh generation of {} and deliver task {task_digest}", req.runtime_id);
                    let assignment_id = req.assignment_id.clone().unwrap_or_else(|| format!("as-{}", uuid::Uuid::new_v4().simple()));
                    let attempt = format!("at-{}", uuid::Uuid::new_v4().simple());
                    let reservation = format!("rs-{}", uuid::Uuid::new_v4().simple());
                    let lease = format!("rl-{}", uuid::Uuid::new_v4().simple());
                    let ttl = format!("{} milliseconds", req.ttl_ms);
                    let fence_digest = sec.fence_digest(&sec.fence_token(&reservation, &salt));
                    // The assignment (new, or revived from recovery), its attempt and the
                    // reservation, in one statement: the attempt and the reservation hang
                    // off the assignment row the first part wrote.
                    let asg_sql = if req.assignment_id.is_none() {
                        "INSERT INTO assignments (assignment_id, lane_incarnation_id, responsibility_owner, execution_owner, pending_target, next_action, \
                                                  runtime_id, scope_digest, holds_digest, completion_policy_digest, created_epoch, scope, holds, completion_policy, \
                                                  inactivity_policy, inactivity_base_at, inactivity_deadline, repository, base_ref) \
                         SELECT $1, $2, $3, NULL, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, pol.policy_id, clock_timestamp(), \
                                clock_timestamp() + pol.replace_after_ms * interval '1 millisecond', $23, $24 \
                         FROM inactivity_policies pol WHERE pol.policy_id = $22 RETURNING assignment_id"
                    } else {
                        // (Every parameter of the insert form is referenced, so both forms bind the
                        // same parameter list.)
                        concatcp!("UPDATE assignments SET lifecycle = ", Lifecycle::Active.sql(), ", lane_incarnation_id = $2, responsibility_owner = $3, execution_owner = NULL, \
                                pending_target = $3, next_action = $4, watchdog_step = ", WatchdogStep::None.sql(), " \
                         WHERE assignment_id = $1 AND lifecycle = ", Lifecycle::Recovery.sql(), " AND work_status = ", WorkStatus::Active.sql(), " AND runtime_id = $5 AND scope_digest = $6 AND holds_digest = $7 \
                           AND completion_policy_digest = $8 AND $9::bigint IS NOT NULL AND $10::jsonb IS NOT NULL AND $11::jsonb IS NOT NULL AND $12::text IS NOT NULL \
                           AND $22::text IS NOT NULL AND ($23::text IS NULL OR $23::text IS NOT NULL) AND ($24::text IS NULL OR $24::text IS NOT NULL) \
                         RETURNING assignment_id")
                    };
                    let sql = format!(
                        "WITH a AS ({asg_sql}), \
                              t AS (INSERT INTO attempts (assignment_attempt_id, assignment_id, created_epoch, task_text, task_digest) \
                                    SELECT $13, assignment_id, $9, $14, $15 FROM a RETURNING assignment_attempt_id) \
                         INSERT INTO reservations (reservation_id, reservation_epoch, reservation_lease_id, assignment_id, assignment_attempt_id, lane_incarnation_id, \
                                                   sot_incarnation, coordinator_epoch, deadline, fence_digest, fence_salt) \
                         SELECT $16, (SELECT coalesce(max(px.reservation_epoch), 0) + 1 FROM reservations px WHERE px.lane_incarnation_id = $2), $17, $1, t.assignment_attempt_id, $2, $18, $9, clock_timestamp() + $19::text::interval, $20, $21 FROM t \
                         RETURNING mosaic_ts(deadline) AS deadline, reservation_epoch"
                    );
                    let (repo, base): (Option<&str>, Option<&str>) = match &req.repository {
                        Some((r, b)) => (Some(r.as_str()), Some(b.as_str())),
                        None => (None, None),
                    };
                    let rows = d.query(
                        &sql,
                        &[&assignment_id, &req.lane_incarnation_id, &req.target, &next_action, &req.runtime_id, &scope, &holds, &policy, &epoch,
                          &scope_json, &holds_json, &req.completion_policy, &attempt, &req.task_text, &task_digest, &reservation, &lease, &sot,
                          &ttl, &fence_digest, &salt, &req.inactivity_policy, &repo, &base],
                    ).await?;
                    // A resume misses when the assignment left recovery under us; a new one when
                    // its inactivity policy is not published.
                    let Some(row) = rows.first() else {
                        return Err(reject(OP, if req.assignment_id.is_some() { Category::WrongState } else { Category::NotFound },
                            if req.assignment_id.is_some() { "the assignment was resumed concurrently; it is no longer in recovery".to_string() }
                            else { format!("no published inactivity policy {}", req.inactivity_policy) }));
                    };
                    let deadline: String = row.col("deadline")?;
                    let reservation_epoch: i64 = row.col("reservation_epoch")?;
                    let grant_id = match (&req.grant, repo, &req.assignment_id) {
                        (Some((digest, ms)), Some(repo), None) => {
                            let id = format!("cg-{}", uuid::Uuid::new_v4().simple());
                            let fields = crate::coordinator::grants::permitted_fields_digest();
                            d.exec_one(crate::coordinator::grants::CREATE, &[&id, &sot, &epoch, &assignment_id, &attempt,
                                &req.lane_incarnation_id, &fields, &format!("{ms} milliseconds"), digest, &repo]).await?;
                            Some(id)
                        }
                        (None, _, _) => None,
                        _ => return Err(reject(OP, Category::BadInput, "a grant is made only with a new assignment in a repository")),
                    };
                    if let Some(p) = &req.placement {
                        super::roster::record(&d, p, &reservation, &assignment_id, &format!("reserve/{}", req.request_id)).await?;
                    }
                    let retarget = match &req.recovery {
                        Some(c) => Some(super::recovery::consume(&d, c, &reservation).await?),
                        None => None,
                    };
                    let chain = Chain {
                        lane_id,
                        lane_incarnation_id: req.lane_incarnation_id.clone(),
                        assignment_id,
                        assignment_attempt_id: attempt,
                        reservation_id: reservation,
                        reservation_epoch,
                    };
                    d.decide(json!({ "chain": chain, "reservation_lease_id": lease, "reservation_deadline": deadline,
                        "responsibility_owner": req.target, "execution_owner": null, "pending_target": req.target,
                        "task_digest": task_digest, "grants_effects": false, "checkpoint_grant": grant_id,
                        "placement": req.placement.as_ref().map(|p| json!({ "policy": p.policy, "policy_digest": p.policy_digest, "inputs_digest": p.inputs_digest })),
                        "retarget": retarget }))
                }),
            )
            .await?;
        let chain: Chain = serde_json::from_value(r.body["chain"].clone()).map_err(|e| {
            AuthorityError::Invariant {
                op: "reserve",
                detail: format!("its receipt has no chain: {e}"),
            }
        })?;
        Ok(Reserved {
            chain,
            reservation_lease_id: r.str("reservation_lease_id")?,
            deadline: r.str("reservation_deadline")?,
            receipt: r,
        })
    }

    /// One step of a chain: `from` → `to` under the shared predicate plus `extra`.
    async fn simple_step(
        &self,
        op: &'static str,
        l: &Leader,
        c: &Chain,
        from: LaneState,
        to: LaneState,
        extra: Extra,
    ) -> Result<Receipt, AuthorityError> {
        let step = chain_step(
            op,
            l,
            c,
            format!("{op}/{}", c.reservation_id),
            &[from.as_str(), to.as_str()],
        );
        let (c, epoch, sot) = (c.clone(), l.epoch(), l.sot().to_string());
        self.transition(
            &step,
            body!(
                [c, sot] | f | {
                    let sql = step_cas(extra);
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
                        &to,
                        &c.lane_incarnation_id,
                        &c.lane_id,
                        &c.reservation_id,
                        &c.reservation_epoch,
                        &c.assignment_id,
                        &c.assignment_attempt_id,
                        &from,
                        &epoch,
                        &sot,
                    ];
                    let d = match f.cas(&sql, &params).await? {
                        Ok(d) => d,
                        Err(u) => return Err(diagnose(u, extra, &params).await?),
                    };
                    d.decide(json!({ "chain": c, "from": from, "to": to }))
                }
            ),
        )
        .await
    }

    /// RESERVED → CHECKPOINTING. A lane with no earlier generation has nothing to
    /// checkpoint, but the step is still a compare-and-swap.
    pub async fn checkpoint(&self, l: &Leader, c: &Chain) -> Result<Receipt, AuthorityError> {
        self.simple_step(
            "checkpoint",
            l,
            c,
            LaneState::Reserved,
            LaneState::Checkpointing,
            &[],
        )
        .await
    }

    /// CHECKPOINTING → FENCED: every earlier generation of the incarnation has ended, its
    /// termination receipt is reconciled, and each that ran for work in a repository has
    /// its checkpoint recorded (or the operator's release went on without it).
    pub async fn fence(&self, l: &Leader, c: &Chain) -> Result<Receipt, AuthorityError> {
        self.simple_step(
            "fence",
            l,
            c,
            LaneState::Checkpointing,
            LaneState::Fenced,
            // Each check is a subquery run for this one lane, on a partial index of what is
            // still open (`OFFSET 0` keeps it one: as an anti-join, the generic plan hashed
            // every generation and receipt there is, and a fence cost O(history); issue
            // 22). A generation's checkpoint debt is kept on its row by the database
            // (migration 0039).
            &[
                Pred {
                    sql: concatcp!("NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> ", GenState::Ended.sql(), " OFFSET 0)"),
                    category: Category::Unreconciled,
                    detail: "an earlier generation of the lane has not ended",
                },
                Pred {
                    sql: "NOT EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id AND t.reconciled_at IS NULL OFFSET 0)",
                    category: Category::Unreconciled,
                    detail: "a termination receipt of the lane is not reconciled yet",
                },
                Pred {
                    sql: "NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.checkpoint_owed OFFSET 0)",
                    category: Category::Unreconciled,
                    detail: "an earlier generation of the lane owes its work's checkpoint (it lands with the generation's termination receipt; without one, the lane's quarantine release waives it)",
                },
            ],
        )
        .await
    }

    /// FENCED → STAGING: allocates the next generation of this incarnation. Staging holds
    /// no effect lease.
    pub async fn stage(&self, l: &Leader, c: &Chain) -> Result<(i64, Receipt), AuthorityError> {
        const OP: &str = "stage";
        let step = chain_step(OP, l, c, format!("stage/{}", c.reservation_id), &[]);
        let (c, epoch, sot) = (c.clone(), l.epoch(), l.sot().to_string());
        let r = self
            .transition(
                &step,
                body!([c, sot] |f| {
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [&LaneState::Staging, &c.lane_incarnation_id, &c.lane_id,
                        &c.reservation_id, &c.reservation_epoch, &c.assignment_id, &c.assignment_attempt_id, &LaneState::Fenced, &epoch, &sot];
                    let d = match f.cas(&stage_cas(), &params).await? {
                        Ok(d) => d,
                        Err(u) => return Err(diagnose(u, STAGE_EXTRA, &params).await?),
                    };
                    let generation: i64 = d.row().col("generation")?;
                    d.exec_one(
                        concatcp!("WITH g AS (INSERT INTO generations (lane_incarnation_id, generation, reservation_id, state) VALUES ($1, $2, $3, ", GenState::Staging.sql(), ") RETURNING 1) \
                         UPDATE reservations r SET generation = $2 FROM g WHERE r.reservation_id = $3"),
                        &[&c.lane_incarnation_id, &generation, &c.reservation_id],
                    ).await?;
                    d.decide(json!({ "chain": c, "generation": generation, "effect_leases": [] }))
                }),
            )
            .await?;
        Ok((r.int("generation")?, r))
    }

    /// STAGING → CONTRACT_INJECTING: the host verified a fresh process tree for exactly this
    /// generation. The contract (the attempt's task, scope and holds) is recorded with its
    /// content digest in the same commit; no challenge exists yet, and none can until the
    /// host proves it delivered exactly this digest.
    pub async fn record_staged(
        &self,
        l: &Leader,
        c: &Chain,
        generation: i64,
        identity: &serde_json::Value,
        restored: Option<&str>,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "staged";
        if !identity
            .as_object()
            .is_some_and(|o| o.contains_key("root_pid") && o.contains_key("launch_nonce_digest"))
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "a process identity with root pid and launch nonce digest is required",
            ));
        }
        let id_text = identity.to_string();
        let step = chain_step(
            OP,
            l,
            c,
            format!("staged/{}", c.reservation_id),
            &[&generation.to_string(), &id_text, restored.unwrap_or("-")],
        );
        let (c, epoch, sot, identity, restored) = (
            c.clone(),
            l.epoch(),
            l.sot().to_string(),
            identity.clone(),
            restored.map(String::from),
        );
        self.transition(
            &step,
            body!([c, sot, id_text, identity, restored] |f| {
                // The workspace is what the stage named to restore, or nothing was named
                // and nothing restored (`restore_binding`; the host message's handler ends
                // a chain whose host says otherwise): the CAS's last predicate.
                let t = f.read_opt(
                    "SELECT at.task_text, a.scope_digest, a.holds_digest FROM attempts at JOIN assignments a USING (assignment_id) WHERE at.assignment_attempt_id = $1",
                    &[&c.assignment_attempt_id],
                ).await?;
                let Some(t) = t else {
                    return Err(reject(OP, Category::NotFound, "no such attempt"));
                };
                let (task_text, scope, holds): (String, String, String) =
                    (t.col("task_text")?, t.col("scope_digest")?, t.col("holds_digest")?);
                let cd = crate::protocol::contracts_digest(&task_text, &scope, &holds);
                const EXTRA: Extra = &[own(concatcp!("r.generation = $11 AND r.contracts_digest IS NULL AND EXISTS (SELECT 1 FROM generations g \
                    WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = $11 AND g.state = ", GenState::Staging.sql(), " \
                    AND g.process_identity IS NULL AND g.stop_requested_at IS NULL) \
                    AND r.restore_checkpoint_digest IS NOT DISTINCT FROM $12"))];
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 12] = [&LaneState::ContractInjecting, &c.lane_incarnation_id, &c.lane_id,
                    &c.reservation_id, &c.reservation_epoch, &c.assignment_id, &c.assignment_attempt_id, &LaneState::Staging, &epoch, &sot, &generation,
                    &restored];
                let d = match f.cas(&step_cas(EXTRA), &params).await? {
                    Ok(d) => d,
                    Err(u) => return Err(diagnose(u, EXTRA, &params).await?),
                };
                // The identity on the generation and the reservation, and the contract, in one
                // statement (the reservation update depends on the generation's).
                d.exec_one(
                    "WITH g AS (UPDATE generations SET process_identity = $2::text::jsonb WHERE lane_incarnation_id = $4 AND generation = $5 RETURNING 1), \
                          k AS (INSERT INTO contracts (contracts_digest, task_text, scope_digest, holds_digest) VALUES ($3, $6, $7, $8) ON CONFLICT DO NOTHING), \
                          n AS (UPDATE assignments SET next_action = 'deliver contract ' || $3 || ' to generation ' || $5 || ', then await its ACK' WHERE assignment_id = $9) \
                     UPDATE reservations r SET process_identity = $2::text::jsonb, contracts_digest = $3, restored_checkpoint_digest = $10 \
                     FROM g WHERE r.reservation_id = $1",
                    &[&c.reservation_id, &id_text, &cd, &c.lane_incarnation_id, &generation, &task_text, &scope, &holds, &c.assignment_id, &restored],
                ).await?;
                d.decide(json!({ "chain": c, "generation": generation, "process_identity": identity, "contracts_digest": cd,
                    "restored_checkpoint_digest": restored }))
            }),
        )
        .await
    }

    /// CONTRACT_INJECTING → AWAITING_ACK: the host delivered exactly the recorded digest to
    /// exactly the staged process; only now is the single-use challenge minted.
    pub async fn record_injected(
        &self,
        l: &Leader,
        c: &Chain,
        delivered_digest: &str,
        identity: &serde_json::Value,
        challenge_ttl_ms: i64,
    ) -> Result<(String, String, Receipt), AuthorityError> {
        const OP: &str = "injected";
        if !crate::protocol::envelope::is_digest(delivered_digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "delivered digest must be sha256:<64 hex>",
            ));
        }
        let id_text = identity.to_string();
        let ttl = format!("{} milliseconds", challenge_ttl_ms.clamp(1000, 3_600_000));
        let step = chain_step(
            OP,
            l,
            c,
            format!("injected/{}", c.reservation_id),
            &[delivered_digest, &id_text],
        );
        let (c, epoch, sot, delivered) = (
            c.clone(),
            l.epoch(),
            l.sot().to_string(),
            delivered_digest.to_string(),
        );
        let r = self
            .transition(
                &step,
                body!([c, sot, delivered, id_text, ttl] |f| {
                    const EXTRA: Extra = &[own("r.contracts_digest = $11 AND r.process_identity = $12::text::jsonb")];
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 12] = [&LaneState::AwaitingAck, &c.lane_incarnation_id, &c.lane_id,
                        &c.reservation_id, &c.reservation_epoch, &c.assignment_id, &c.assignment_attempt_id, &LaneState::ContractInjecting,
                        &epoch, &sot, &delivered, &id_text];
                    let d = match f.cas(&step_cas(EXTRA), &params).await? {
                        Ok(d) => d,
                        Err(u) => return Err(diagnose(u, EXTRA, &params).await?),
                    };
                    // A handoff's target chain gets the handoff challenge now, and its own
                    // activation challenge only once the handoff is accepted.
                    let handoff: Option<(Option<String>, Option<HandoffState>)> = match d.query(
                        "SELECT r.handoff_id, h.state FROM reservations r LEFT JOIN handoffs h ON h.handoff_id = r.handoff_id \
                         WHERE r.reservation_id = $1 AND r.handoff_id IS NOT NULL",
                        &[&c.reservation_id],
                    ).await?.first() {
                        Some(r) => Some((r.col("handoff_id")?, r.col("state")?)),
                        None => None,
                    };
                    if let Some((Some(handoff_id), state)) = handoff {
                        if state != Some(HandoffState::Offered) {
                            return Err(reject(OP, Category::WrongState, format!("handoff {handoff_id} is {}; its target gets no challenge",
                                state.map(HandoffState::as_str).unwrap_or_default())));
                        }
                        let hc = format!("hc-{}", crate::util::random_hex(32).map_err(AuthorityError::Entropy)?);
                        let exp: String = d.query_one(
                            concatcp!("WITH n AS (UPDATE assignments SET next_action = 'the target acknowledges handoff challenge ' || $1 || ' (its harness answers the handoff check in its own turn, or mosaic lane handoff-ack)' WHERE assignment_id = $5) \
                             UPDATE handoffs h SET state = ", HandoffState::Challenged.sql(), ", challenge_id = $1, challenge_epoch = $2, \
                                    challenge_deadline = LEAST(r.deadline, clock_timestamp() + $3::text::interval) \
                             FROM reservations r WHERE r.reservation_id = $4 AND h.handoff_id = r.handoff_id AND h.state = ", HandoffState::Offered.sql(), " \
                             RETURNING mosaic_ts(h.challenge_deadline) AS expires_at"),
                            &[&hc, &epoch, &ttl, &c.reservation_id, &c.assignment_id],
                        ).await?.col("expires_at")?;
                        return d.decide(json!({ "chain": c, "challenge_id": hc, "challenge_kind": "handoff", "handoff_id": handoff_id,
                            "challenge_expires_at": exp, "contracts_digest": delivered }));
                    }
                    let ch = format!("ch-{}", uuid::Uuid::new_v4().simple());
                    let exp: String = d.query_one(
                        "WITH n AS (UPDATE assignments SET next_action = 'the harness acknowledges challenge ' || $1 || ' (mosaic lane ack); then activation' WHERE assignment_id = $5) \
                         INSERT INTO challenges (challenge_id, reservation_id, sot_incarnation, coordinator_epoch, contracts_digest, expires_at) \
                         SELECT $1, r.reservation_id, r.sot_incarnation, $2, r.contracts_digest, LEAST(r.deadline, clock_timestamp() + $3::text::interval) \
                         FROM reservations r WHERE r.reservation_id = $4 RETURNING mosaic_ts(expires_at) AS expires_at",
                        &[&ch, &epoch, &ttl, &c.reservation_id, &c.assignment_id],
                    ).await?.col("expires_at")?;
                    d.decide(json!({ "chain": c, "challenge_id": ch, "challenge_kind": "activation", "challenge_expires_at": exp, "contracts_digest": delivered }))
                }),
            )
            .await?;
        Ok((r.str("challenge_id")?, r.str("challenge_expires_at")?, r))
    }
}
