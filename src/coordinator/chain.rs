//! The assignment state machine (spec §6): IDLE_CLEAN → RESERVED → CHECKPOINTING → FENCED →
//! STAGING → CONTRACT_INJECTING → AWAITING_ACK → READY → RUNNING → DRAINING → RETIRING →
//! IDLE_CLEAN, with QUARANTINED reachable from anywhere ambiguous.
//!
//! Every function here is one authority transition: one transaction, one compare-and-swap
//! over the values spec §6.1/§6.2 list for it, the leadership check inside the deciding
//! statement, and the transition receipt in the same commit. A refused transition changes
//! nothing and leaves an audit record with its reason category.

use deadpool_postgres::Transaction;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_postgres::types::ToSql;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::secret::FenceToken;
use super::store::Store;
use super::txn::{
    self, begin, commit_receipt, leader_params as with_leader, replay, request_digest, Began,
    Receipt,
};

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
    fn key(&self) -> String {
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

/// What to reserve a lane for.
#[derive(Debug, Clone)]
pub struct ReserveRequest {
    pub lane_incarnation_id: String,
    /// `Some` to give an assignment in recovery a fresh chain; `None` for a new assignment.
    pub assignment_id: Option<String>,
    /// The principal that will execute (responsibility owner and pending target).
    pub target: String,
    pub runtime_id: String,
    pub scope_digest: String,
    pub holds_digest: String,
    pub completion_policy_digest: String,
    pub next_action: String,
    pub ttl_ms: i64,
    pub idempotency_key: String,
}

#[derive(Debug)]
pub struct Reserved {
    pub chain: Chain,
    pub reservation_lease_id: String,
    /// Database time, in the one text form clients must hand back unchanged.
    pub deadline: String,
    /// Handed out exactly once; `None` when the reservation is an idempotent replay.
    pub fence_token: Option<FenceToken>,
    pub receipt: Receipt,
}

/// Everything an activation ACK binds (spec §8). The coordinator checks each field against
/// its own state; `ack_digest` is the digest of the verified ACK envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AckClaim {
    pub challenge_id: String,
    pub sot_incarnation: String,
    pub coordinator_epoch: i64,
    pub reservation_id: String,
    pub reservation_epoch: i64,
    pub reservation_deadline: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub assignment_id: String,
    pub assignment_attempt_id: String,
    pub generation: i64,
    pub process_identity: serde_json::Value,
    pub contracts_digest: String,
    pub scope_digest: String,
    pub holds_digest: String,
    pub runtime_id: String,
    pub ack_digest: String,
    pub idempotency_key: String,
}

/// The expected values of the READY → RUNNING compare-and-swap (spec §6.2).
#[derive(Debug, Clone)]
pub struct Activation {
    pub chain: Chain,
    pub target: String,
    pub reservation_lease_id: String,
    pub reservation_deadline: String,
    pub generation: i64,
    pub fence_token: FenceToken,
    pub challenge_id: String,
    pub ack_digest: String,
    pub contracts_digest: String,
    pub scope_digest: String,
    pub holds_digest: String,
    pub process_identity: serde_json::Value,
    pub completion_policy_digest: String,
    pub lease_scopes: Vec<String>,
    pub lease_ttl_ms: i64,
    pub idempotency_key: String,
}

/// A terminal outcome an assignment can be drained towards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Completed,
    Failed,
    Cancelled,
    /// Terminal quarantine of the work itself (not of the lane): like the others, only
    /// after final evidence, released leases and the fenced retirement.
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
}

/// Read model of a lane incarnation and its active assignment (for operators and tests).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaneView {
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub state: String,
    pub next_generation: i64,
    pub quarantine_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssignmentView {
    pub assignment_id: String,
    pub lane_incarnation_id: String,
    pub lifecycle: String,
    pub responsibility_owner: String,
    pub execution_owner: Option<String>,
    pub pending_target: Option<String>,
    pub next_action: String,
}

pub(crate) fn is_digest(s: &str) -> bool {
    crate::protocol::envelope::is_digest(s)
}

const PREACTIVATION_CHECK: &str =
    "r.deadline > clock_timestamp() AND r.coordinator_epoch = $1 AND r.sot_incarnation = $5";

impl Store {
    /// Settles a transition's result: a rejection is audited — unless a concurrent request
    /// with the same idempotency key won, in which case its receipt is the answer.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn settle<T>(
        &self,
        op: &'static str,
        l: &Leader,
        key: &str,
        digest: &str,
        ids: (Option<&str>, Option<&str>),
        result: Result<T, AuthorityError>,
        on_replay: impl FnOnce(Receipt) -> T,
    ) -> Result<T, AuthorityError> {
        match result {
            Err(AuthorityError::Rejected {
                category, detail, ..
            }) => {
                if category != Category::IdempotencyConflict {
                    let mut c = self.pool.get().await?;
                    let tx = c.transaction().await?;
                    if let Ok(Some(r)) = replay(&tx, op, key, digest).await {
                        return Ok(on_replay(r));
                    }
                }
                self.audit(op, category, Some(l.epoch()), ids.0, ids.1, &detail)
                    .await;
                Err(AuthorityError::Rejected {
                    op,
                    category,
                    detail,
                })
            }
            other => other,
        }
    }

    // ---- lanes ---------------------------------------------------------------------

    /// Registers a lane (and its first incarnation), or returns its current incarnation.
    pub async fn register_lane(
        &self,
        l: &Leader,
        lane_id: &str,
        host_id: &str,
    ) -> Result<LaneView, AuthorityError> {
        const OP: &str = "lane-register";
        if lane_id.is_empty() || host_id.is_empty() || !lane_id.contains(':') {
            return Err(reject(OP, Category::BadInput, "lane ids are host:session"));
        }
        if let Some(v) = self.lane(lane_id).await? {
            return Ok(v);
        }
        let key = format!("lane-register/{lane_id}");
        let digest = request_digest(OP, &[lane_id, host_id]);
        let mut c = self.pool.get().await?;
        let tx = match begin(&mut c, OP, l, &key, &digest).await? {
            Began::Replayed(_) => {
                return self
                    .lane(lane_id)
                    .await?
                    .ok_or_else(|| reject(OP, Category::NotFound, lane_id.to_string()))
            }
            Began::Fresh(tx) => tx,
        };
        let inc = format!("li-{}", uuid::Uuid::new_v4().simple());
        tx.execute(
            "INSERT INTO lanes (lane_id, host_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&lane_id, &host_id],
        )
        .await?;
        tx.execute(
            &format!("INSERT INTO lane_incarnations (lane_incarnation_id, lane_id, created_epoch) SELECT $6, $7, $1 WHERE {}", txn::LEADER_OK),
            &with_leader(l, &[&inc, &lane_id]),
        )
        .await?;
        commit_receipt(
            tx,
            OP,
            l,
            (&key, &digest),
            None,
            Some(&inc),
            json!({ "lane_id": lane_id, "lane_incarnation_id": inc }),
        )
        .await?;
        self.lane(lane_id)
            .await?
            .ok_or_else(|| reject(OP, Category::NotFound, lane_id.to_string()))
    }

    /// Retires the lane's current incarnation and creates a fresh one. Generations are
    /// scoped to the new incarnation and start again at 1; nothing from the old one can act
    /// for the new one.
    pub async fn recreate_lane(
        &self,
        l: &Leader,
        lane_id: &str,
        idempotency_key: &str,
    ) -> Result<(LaneView, Receipt), AuthorityError> {
        const OP: &str = "lane-recreate";
        let digest = request_digest(OP, &[lane_id]);
        let body = async {
            let mut c = self.pool.get().await?;
            let tx = match begin(&mut c, OP, l, idempotency_key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            let old: Option<String> = tx
                .query_opt(
                    &format!(
                        "UPDATE lane_incarnations li SET retired_at = clock_timestamp() \
                         WHERE li.lane_id = $6 AND li.retired_at IS NULL AND li.state IN ('IDLE_CLEAN', 'QUARANTINED') \
                           AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.lane_incarnation_id = li.lane_incarnation_id AND a.lifecycle = 'ACTIVE') \
                           AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> 'ENDED') \
                           AND {} RETURNING li.lane_incarnation_id",
                        txn::LEADER_OK
                    ),
                    &with_leader(l, &[&lane_id]),
                )
                .await?
                .map(|r| r.get(0));
            let Some(old) = old else {
                return Err(reject(OP, Category::WrongState, "the current incarnation is busy (active assignment or generation) or the lane is unknown"));
            };
            let inc = format!("li-{}", uuid::Uuid::new_v4().simple());
            tx.execute("INSERT INTO lane_incarnations (lane_incarnation_id, lane_id, created_epoch) VALUES ($1, $2, $3)", &[&inc, &lane_id, &l.epoch()]).await?;
            commit_receipt(
                tx,
                OP,
                l,
                (idempotency_key, &digest),
                None,
                Some(&inc),
                json!({ "lane_id": lane_id, "retired": old, "lane_incarnation_id": inc }),
            )
            .await
        };
        let r = self
            .settle(
                OP,
                l,
                idempotency_key,
                &digest,
                (None, None),
                body.await,
                |r| r,
            )
            .await?;
        let v = self
            .lane(lane_id)
            .await?
            .ok_or_else(|| reject(OP, Category::NotFound, lane_id.to_string()))?;
        Ok((v, r))
    }

    pub async fn lane(&self, lane_id: &str) -> Result<Option<LaneView>, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query_opt(
            "SELECT lane_id, lane_incarnation_id, state, next_generation, quarantine_reason FROM lane_incarnations WHERE lane_id = $1 AND retired_at IS NULL",
            &[&lane_id],
        )
        .await?
        .map(|r| LaneView { lane_id: r.get(0), lane_incarnation_id: r.get(1), state: r.get(2), next_generation: r.get(3), quarantine_reason: r.get(4) }))
    }

    pub async fn lanes(&self) -> Result<Vec<LaneView>, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query(
            "SELECT lane_id, lane_incarnation_id, state, next_generation, quarantine_reason FROM lane_incarnations WHERE retired_at IS NULL ORDER BY lane_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| LaneView { lane_id: r.get(0), lane_incarnation_id: r.get(1), state: r.get(2), next_generation: r.get(3), quarantine_reason: r.get(4) })
        .collect())
    }

    pub async fn assignment(&self, id: &str) -> Result<Option<AssignmentView>, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query_opt(
            "SELECT assignment_id, lane_incarnation_id, lifecycle, responsibility_owner, execution_owner, pending_target, next_action FROM assignments WHERE assignment_id = $1",
            &[&id],
        )
        .await?
        .map(|r| AssignmentView {
            assignment_id: r.get(0),
            lane_incarnation_id: r.get(1),
            lifecycle: r.get(2),
            responsibility_owner: r.get(3),
            execution_owner: r.get(4),
            pending_target: r.get(5),
            next_action: r.get(6),
        }))
    }

    // ---- the chain -----------------------------------------------------------------

    /// IDLE_CLEAN → RESERVED. Creates (or revives from recovery) the assignment with
    /// `responsibility_owner = pending_target = target` and no execution owner, a never-reused
    /// attempt, and a reservation whose lease grants no effects.
    pub async fn reserve(
        &self,
        l: &Leader,
        req: &ReserveRequest,
    ) -> Result<Reserved, AuthorityError> {
        const OP: &str = "reserve";
        let digest = request_digest(
            OP,
            &[
                &req.lane_incarnation_id,
                req.assignment_id.as_deref().unwrap_or("-"),
                &req.target,
                &req.runtime_id,
                &req.scope_digest,
                &req.holds_digest,
                &req.completion_policy_digest,
                &req.ttl_ms.to_string(),
            ],
        );
        for d in [
            &req.scope_digest,
            &req.holds_digest,
            &req.completion_policy_digest,
        ] {
            if !is_digest(d) {
                return Err(reject(
                    OP,
                    Category::BadInput,
                    "scope, holds and completion-policy digests must be sha256:<64 hex>",
                ));
            }
        }
        if req.target.is_empty()
            || req.runtime_id.is_empty()
            || req.next_action.is_empty()
            || !(1000..=86_400_000).contains(&req.ttl_ms)
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "target, runtime, next action and a ttl of 1 s..24 h are required",
            ));
        }
        let token = FenceToken::generate().map_err(|e| AuthorityError::Db(e.to_string()))?;
        let fence_digest = self.secret.fence_digest(&token);
        let body = async {
            let mut c = self.pool.get().await?;
            let tx = match begin(&mut c, OP, l, &req.idempotency_key, &digest).await? {
                Began::Replayed(r) => return Ok((r, false)),
                Began::Fresh(tx) => tx,
            };
            let lane: Option<String> = tx
                .query_opt(
                    &format!(
                        "UPDATE lane_incarnations li SET state = 'RESERVED' WHERE li.lane_incarnation_id = $6 AND li.state = 'IDLE_CLEAN' AND li.retired_at IS NULL \
                           AND NOT EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id AND t.reconciled_at IS NULL) \
                           AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> 'ENDED') \
                           AND {} RETURNING li.lane_id",
                        txn::LEADER_OK
                    ),
                    &with_leader(l, &[&req.lane_incarnation_id]),
                )
                .await?
                .map(|r| r.get(0));
            let Some(lane_id) = lane else {
                return Err(self
                    .why_not_reservable(&tx, l, &req.lane_incarnation_id)
                    .await?);
            };
            let assignment_id = match &req.assignment_id {
                None => {
                    let id = format!("as-{}", uuid::Uuid::new_v4().simple());
                    tx.execute(
                        "INSERT INTO assignments (assignment_id, lane_incarnation_id, responsibility_owner, execution_owner, pending_target, next_action, \
                                                  runtime_id, scope_digest, holds_digest, completion_policy_digest, created_epoch) \
                         VALUES ($1, $2, $3, NULL, $3, $4, $5, $6, $7, $8, $9)",
                        &[&id, &req.lane_incarnation_id, &req.target, &req.next_action, &req.runtime_id, &req.scope_digest, &req.holds_digest, &req.completion_policy_digest, &l.epoch()],
                    )
                    .await?;
                    id
                }
                Some(id) => {
                    let n = tx
                        .execute(
                            "UPDATE assignments SET lifecycle = 'ACTIVE', lane_incarnation_id = $2, responsibility_owner = $3, execution_owner = NULL, \
                                    pending_target = $3, next_action = $4 \
                             WHERE assignment_id = $1 AND lifecycle = 'RECOVERY' AND runtime_id = $5 AND scope_digest = $6 AND holds_digest = $7 \
                               AND completion_policy_digest = $8",
                            &[id, &req.lane_incarnation_id, &req.target, &req.next_action, &req.runtime_id, &req.scope_digest, &req.holds_digest, &req.completion_policy_digest],
                        )
                        .await?;
                    if n != 1 {
                        return Err(reject(OP, Category::WrongState, "only an assignment in recovery with the same runtime, scope, holds and policy can be re-reserved"));
                    }
                    id.clone()
                }
            };
            let attempt = format!("at-{}", uuid::Uuid::new_v4().simple());
            tx.execute("INSERT INTO attempts (assignment_attempt_id, assignment_id, created_epoch) VALUES ($1, $2, $3)", &[&attempt, &assignment_id, &l.epoch()]).await?;
            let reservation = format!("rs-{}", uuid::Uuid::new_v4().simple());
            let lease = format!("rl-{}", uuid::Uuid::new_v4().simple());
            let ttl = format!("{} milliseconds", req.ttl_ms);
            let deadline: String = tx
                .query_one(
                    "INSERT INTO reservations (reservation_id, reservation_epoch, reservation_lease_id, assignment_id, assignment_attempt_id, lane_incarnation_id, \
                                               sot_incarnation, coordinator_epoch, deadline, fence_digest) \
                     VALUES ($1, 1, $2, $3, $4, $5, $6, $7, clock_timestamp() + $8::text::interval, $9) RETURNING mosaic_ts(deadline)",
                    &[&reservation, &lease, &assignment_id, &attempt, &req.lane_incarnation_id, &l.sot(), &l.epoch(), &ttl, &fence_digest],
                )
                .await?
                .get(0);
            let chain = Chain {
                lane_id,
                lane_incarnation_id: req.lane_incarnation_id.clone(),
                assignment_id: assignment_id.clone(),
                assignment_attempt_id: attempt,
                reservation_id: reservation,
                reservation_epoch: 1,
            };
            let body = json!({ "chain": chain, "reservation_lease_id": lease, "reservation_deadline": deadline,
                "responsibility_owner": req.target, "execution_owner": null, "pending_target": req.target, "grants_effects": false });
            let r = commit_receipt(
                tx,
                OP,
                l,
                (&req.idempotency_key, &digest),
                Some(&assignment_id),
                Some(&req.lane_incarnation_id),
                body,
            )
            .await?;
            Ok((r, true))
        };
        let (receipt, fresh) = self
            .settle(
                OP,
                l,
                &req.idempotency_key,
                &digest,
                (req.assignment_id.as_deref(), Some(&req.lane_incarnation_id)),
                body.await,
                |r| (r, false),
            )
            .await?;
        let chain: Chain = serde_json::from_value(receipt.body["chain"].clone())
            .map_err(|e| AuthorityError::Db(e.to_string()))?;
        Ok(Reserved {
            chain,
            reservation_lease_id: receipt.body["reservation_lease_id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            deadline: receipt.body["reservation_deadline"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            fence_token: fresh.then_some(token),
            receipt,
        })
    }

    async fn why_not_reservable(
        &self,
        tx: &Transaction<'_>,
        l: &Leader,
        inc: &str,
    ) -> Result<AuthorityError, AuthorityError> {
        const OP: &str = "reserve";
        let leader_ok: bool = txn::leader_ok(tx, l).await?;
        if !leader_ok {
            return Ok(reject(OP, Category::StaleLeader, "leadership lost"));
        }
        let row = tx
            .query_opt(
                "SELECT state, retired_at IS NOT NULL, \
                        EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = $1 AND t.reconciled_at IS NULL), \
                        EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = $1 AND g.state <> 'ENDED') \
                 FROM lane_incarnations WHERE lane_incarnation_id = $1",
                &[&inc],
            )
            .await?;
        Ok(match row {
            None => reject(OP, Category::NotFound, format!("no lane incarnation {inc}")),
            Some(r) if r.get::<_, bool>(1) => reject(
                OP,
                Category::WrongState,
                "that incarnation was retired (the lane was recreated)",
            ),
            Some(r) if r.get::<_, bool>(2) => reject(
                OP,
                Category::Unreconciled,
                "a termination receipt for this lane is not reconciled yet",
            ),
            Some(r) if r.get::<_, bool>(3) => reject(
                OP,
                Category::Unreconciled,
                "a generation of this lane has not been observed to end",
            ),
            Some(r) => reject(
                OP,
                Category::WrongState,
                format!("lane is {}, not IDLE_CLEAN", r.get::<_, String>(0)),
            ),
        })
    }

    /// One CAS over the chain: state `from` → `to`, the reservation still the chain's own,
    /// unreleased, the assignment active, and (before activation) unexpired and begun under
    /// the current epoch. `extra` adds transition-specific predicates over `li`, `r`, `a`,
    /// whose values are bound as `$14` onwards from `extra_params`.
    #[allow(clippy::too_many_arguments)]
    async fn advance(
        &self,
        tx: &Transaction<'_>,
        op: &'static str,
        l: &Leader,
        c: &Chain,
        from: &str,
        to: &str,
        preactivation: bool,
        extra: &str,
        extra_params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), AuthorityError> {
        let pre = if preactivation {
            PREACTIVATION_CHECK
        } else {
            "true"
        };
        let sql = format!(
            "UPDATE lane_incarnations li SET state = $7 FROM reservations r, assignments a \
             WHERE li.lane_incarnation_id = $6 AND li.lane_id = $13 AND li.state = $8 AND li.retired_at IS NULL \
               AND r.reservation_id = $9 AND r.reservation_epoch = $10 AND r.lane_incarnation_id = li.lane_incarnation_id \
               AND r.assignment_id = $11 AND r.assignment_attempt_id = $12 AND r.released_at IS NULL \
               AND a.assignment_id = r.assignment_id AND a.lifecycle = 'ACTIVE' AND {pre} AND ({extra}) AND {} \
             RETURNING li.lane_incarnation_id",
            txn::LEADER_OK
        );
        let mut params = with_leader(
            l,
            &[
                &c.lane_incarnation_id,
                &to,
                &from,
                &c.reservation_id,
                &c.reservation_epoch,
                &c.assignment_id,
                &c.assignment_attempt_id,
                &c.lane_id,
            ],
        );
        params.extend_from_slice(extra_params);
        let n = tx.query_opt(&sql, &params).await?;
        if n.is_some() {
            return Ok(());
        }
        Err(self.diagnose(tx, op, l, c, from, preactivation).await?)
    }

    /// Explains a failed chain CAS with the most specific category.
    async fn diagnose(
        &self,
        tx: &Transaction<'_>,
        op: &'static str,
        l: &Leader,
        c: &Chain,
        from: &str,
        preactivation: bool,
    ) -> Result<AuthorityError, AuthorityError> {
        let leader_ok: bool = txn::leader_ok(tx, l).await?;
        if !leader_ok {
            return Ok(reject(
                op,
                Category::StaleLeader,
                format!(
                    "epoch {} is not the current unexpired leadership",
                    l.epoch()
                ),
            ));
        }
        let li = tx.query_opt("SELECT state, lane_id, retired_at IS NOT NULL FROM lane_incarnations WHERE lane_incarnation_id = $1", &[&c.lane_incarnation_id]).await?;
        let Some(li) = li else {
            return Ok(reject(op, Category::NotFound, "no such lane incarnation"));
        };
        if li.get::<_, bool>(2) {
            return Ok(reject(
                op,
                Category::Mismatch,
                "lane incarnation was retired (lane recreated)",
            ));
        }
        if li.get::<_, String>(1) != c.lane_id {
            return Ok(reject(op, Category::Mismatch, "lane id differs"));
        }
        let r = tx
            .query_opt(
                "SELECT r.reservation_epoch, r.lane_incarnation_id, r.assignment_id, r.assignment_attempt_id, r.released_at IS NOT NULL, \
                        r.deadline <= clock_timestamp(), r.coordinator_epoch, a.lifecycle \
                 FROM reservations r JOIN assignments a USING (assignment_id) WHERE r.reservation_id = $1",
                &[&c.reservation_id],
            )
            .await?;
        let Some(r) = r else {
            return Ok(reject(op, Category::NotFound, "no such reservation"));
        };
        if r.get::<_, i64>(0) != c.reservation_epoch
            || r.get::<_, String>(1) != c.lane_incarnation_id
            || r.get::<_, String>(2) != c.assignment_id
            || r.get::<_, String>(3) != c.assignment_attempt_id
        {
            return Ok(reject(op, Category::Mismatch, "the chain's reservation, lane incarnation, assignment or attempt do not belong together"));
        }
        let state: String = li.get(0);
        if state != from {
            return Ok(reject(
                op,
                Category::WrongState,
                format!("lane is {state}, expected {from}"),
            ));
        }
        if r.get::<_, bool>(4) {
            return Ok(reject(
                op,
                Category::WrongState,
                "the reservation was released",
            ));
        }
        if preactivation && r.get::<_, bool>(5) {
            return Ok(reject(
                op,
                Category::Expired,
                "the reservation deadline has passed (database time)",
            ));
        }
        if preactivation && r.get::<_, i64>(6) != l.epoch() {
            return Ok(reject(
                op,
                Category::StaleLeader,
                "the chain began under another coordinator epoch",
            ));
        }
        if r.get::<_, String>(7) != "ACTIVE" {
            return Ok(reject(
                op,
                Category::WrongState,
                format!("assignment is {}", r.get::<_, String>(7)),
            ));
        }
        Ok(reject(
            op,
            Category::Mismatch,
            "a transition-specific precondition does not hold",
        ))
    }

    #[allow(clippy::too_many_arguments)]
    async fn simple(
        &self,
        op: &'static str,
        l: &Leader,
        c: &Chain,
        key: &str,
        from: &str,
        to: &str,
        preactivation: bool,
        extra: &str,
    ) -> Result<Receipt, AuthorityError> {
        let digest = request_digest(op, &[&c.key(), from, to]);
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, op, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            self.advance(&tx, op, l, c, from, to, preactivation, extra, &[])
                .await?;
            commit_receipt(
                tx,
                op,
                l,
                (key, &digest),
                Some(&c.assignment_id),
                Some(&c.lane_incarnation_id),
                json!({ "chain": c, "from": from, "to": to }),
            )
            .await
        };
        self.settle(
            op,
            l,
            key,
            &digest,
            (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
            body.await,
            |r| r,
        )
        .await
    }

    /// RESERVED → CHECKPOINTING. A lane with no earlier generation has nothing to
    /// checkpoint, but the step is still a CAS.
    pub async fn checkpoint(
        &self,
        l: &Leader,
        c: &Chain,
        key: &str,
    ) -> Result<Receipt, AuthorityError> {
        self.simple(
            "checkpoint",
            l,
            c,
            key,
            "RESERVED",
            "CHECKPOINTING",
            true,
            "true",
        )
        .await
    }

    /// CHECKPOINTING → FENCED: every earlier generation of the incarnation has ended and its
    /// termination receipt is reconciled.
    pub async fn fence(&self, l: &Leader, c: &Chain, key: &str) -> Result<Receipt, AuthorityError> {
        self.simple(
            "fence",
            l,
            c,
            key,
            "CHECKPOINTING",
            "FENCED",
            true,
            "NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> 'ENDED') \
             AND NOT EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id AND t.reconciled_at IS NULL)",
        )
        .await
    }

    /// FENCED → STAGING: allocates the next generation of this incarnation. Staging holds no
    /// effect lease.
    pub async fn stage(
        &self,
        l: &Leader,
        c: &Chain,
        key: &str,
    ) -> Result<(i64, Receipt), AuthorityError> {
        const OP: &str = "stage";
        let digest = request_digest(OP, &[&c.key()]);
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            self.advance(
                &tx,
                OP,
                l,
                c,
                "FENCED",
                "STAGING",
                true,
                "r.generation IS NULL",
                &[],
            )
            .await?;
            let generation: i64 = tx
                .query_one("UPDATE lane_incarnations SET next_generation = next_generation + 1 WHERE lane_incarnation_id = $1 RETURNING next_generation - 1", &[&c.lane_incarnation_id])
                .await?
                .get(0);
            tx.execute("INSERT INTO generations (lane_incarnation_id, generation, reservation_id, state) VALUES ($1, $2, $3, 'STAGING')", &[&c.lane_incarnation_id, &generation, &c.reservation_id]).await?;
            tx.execute(
                "UPDATE reservations SET generation = $2 WHERE reservation_id = $1",
                &[&c.reservation_id, &generation],
            )
            .await?;
            commit_receipt(
                tx,
                OP,
                l,
                (key, &digest),
                Some(&c.assignment_id),
                Some(&c.lane_incarnation_id),
                json!({ "chain": c, "generation": generation, "effect_leases": [] }),
            )
            .await
        };
        let r = self
            .settle(
                OP,
                l,
                key,
                &digest,
                (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
                body.await,
                |r| r,
            )
            .await?;
        Ok((r.body["generation"].as_i64().unwrap_or(0), r))
    }

    /// STAGING → CONTRACT_INJECTING: the host verified a fresh process tree for exactly
    /// this generation.
    pub async fn record_staged(
        &self,
        l: &Leader,
        c: &Chain,
        generation: i64,
        identity: &serde_json::Value,
        key: &str,
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
        let digest = request_digest(OP, &[&c.key(), &generation.to_string(), &id_text]);
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            let extra = "r.generation = $14 AND EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id \
                         AND g.generation = $14 AND g.state = 'STAGING' AND g.process_identity IS NULL)";
            self.advance(
                &tx,
                OP,
                l,
                c,
                "STAGING",
                "CONTRACT_INJECTING",
                true,
                extra,
                &[&generation],
            )
            .await?;
            tx.execute("UPDATE generations SET process_identity = $3::text::jsonb WHERE lane_incarnation_id = $1 AND generation = $2", &[&c.lane_incarnation_id, &generation, &id_text]).await?;
            tx.execute("UPDATE reservations SET process_identity = $2::text::jsonb WHERE reservation_id = $1", &[&c.reservation_id, &id_text]).await?;
            commit_receipt(
                tx,
                OP,
                l,
                (key, &digest),
                Some(&c.assignment_id),
                Some(&c.lane_incarnation_id),
                json!({ "chain": c, "generation": generation, "process_identity": identity }),
            )
            .await
        };
        self.settle(
            OP,
            l,
            key,
            &digest,
            (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
            body.await,
            |r| r,
        )
        .await
    }

    /// Records the contract (task text, scope, holds) and its content digest. No challenge
    /// exists yet; none can until the host proves it delivered exactly this digest.
    pub async fn record_contract(
        &self,
        l: &Leader,
        c: &Chain,
        task_text: &str,
        scope_digest: &str,
        holds_digest: &str,
        key: &str,
    ) -> Result<(String, Receipt), AuthorityError> {
        const OP: &str = "contract";
        if task_text.is_empty() || !is_digest(scope_digest) || !is_digest(holds_digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "task text and sha256 scope/holds digests are required",
            ));
        }
        let cd = contracts_digest(task_text, scope_digest, holds_digest);
        let digest = request_digest(OP, &[&c.key(), &cd]);
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            // A same-state CAS: the lane stays CONTRACT_INJECTING.
            self.advance(
                &tx,
                OP,
                l,
                c,
                "CONTRACT_INJECTING",
                "CONTRACT_INJECTING",
                true,
                "r.contracts_digest IS NULL AND a.scope_digest = $14 AND a.holds_digest = $15",
                &[&scope_digest, &holds_digest],
            )
            .await?;
            tx.execute("INSERT INTO contracts (contracts_digest, task_text, scope_digest, holds_digest) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING", &[&cd, &task_text, &scope_digest, &holds_digest]).await?;
            tx.execute(
                "UPDATE reservations SET contracts_digest = $2 WHERE reservation_id = $1",
                &[&c.reservation_id, &cd],
            )
            .await?;
            commit_receipt(
                tx,
                OP,
                l,
                (key, &digest),
                Some(&c.assignment_id),
                Some(&c.lane_incarnation_id),
                json!({ "chain": c, "contracts_digest": cd }),
            )
            .await
        };
        let r = self
            .settle(
                OP,
                l,
                key,
                &digest,
                (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
                body.await,
                |r| r,
            )
            .await?;
        Ok((
            r.body["contracts_digest"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            r,
        ))
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
        key: &str,
    ) -> Result<(String, String, Receipt), AuthorityError> {
        const OP: &str = "injected";
        if !is_digest(delivered_digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "delivered digest must be sha256:<64 hex>",
            ));
        }
        let id_text = identity.to_string();
        let digest = request_digest(OP, &[&c.key(), delivered_digest, &id_text]);
        let ttl = format!("{} milliseconds", challenge_ttl_ms.clamp(1000, 3_600_000));
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            self.advance(
                &tx,
                OP,
                l,
                c,
                "CONTRACT_INJECTING",
                "AWAITING_ACK",
                true,
                "r.contracts_digest = $14 AND r.process_identity = $15::text::jsonb",
                &[&delivered_digest, &id_text],
            )
            .await?;
            let ch = format!("ch-{}", uuid::Uuid::new_v4().simple());
            let exp: String = tx
                .query_one(
                    "INSERT INTO challenges (challenge_id, reservation_id, sot_incarnation, coordinator_epoch, contracts_digest, expires_at) \
                     SELECT $1, r.reservation_id, r.sot_incarnation, $2, r.contracts_digest, LEAST(r.deadline, clock_timestamp() + $3::text::interval) \
                     FROM reservations r WHERE r.reservation_id = $4 RETURNING mosaic_ts(expires_at)",
                    &[&ch, &l.epoch(), &ttl, &c.reservation_id],
                )
                .await?
                .get(0);
            commit_receipt(tx, OP, l, (key, &digest), Some(&c.assignment_id), Some(&c.lane_incarnation_id), json!({ "chain": c, "challenge_id": ch, "challenge_expires_at": exp, "contracts_digest": delivered_digest })).await
        };
        let r = self
            .settle(
                OP,
                l,
                key,
                &digest,
                (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
                body.await,
                |r| r,
            )
            .await?;
        Ok((
            r.body["challenge_id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            r.body["challenge_expires_at"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            r,
        ))
    }
}

pub use crate::protocol::contracts_digest;

/// An assignment as operators see it, with its lane's state and current generation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssignmentStatus {
    pub assignment_id: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub state: String,
    pub lifecycle: String,
    pub generation: Option<i64>,
    pub responsibility_owner: String,
    pub execution_owner: Option<String>,
    pub pending_target: Option<String>,
    pub next_action: String,
}

impl Store {
    /// Registers the host's lane under the incarnation the host created. A new incarnation
    /// of a known lane retires the old one, which must be idle or quarantined with nothing
    /// open; incarnation ids are never reused (primary key).
    pub async fn adopt_lane_incarnation(
        &self,
        l: &Leader,
        lane_id: &str,
        host_id: &str,
        incarnation: &str,
    ) -> Result<LaneView, AuthorityError> {
        const OP: &str = "lane-adopt";
        if let Some(v) = self.lane(lane_id).await? {
            if v.lane_incarnation_id == incarnation {
                return Ok(v);
            }
        }
        if !lane_id.starts_with(&format!("{host_id}:")) || !incarnation.starts_with("li-") {
            return Err(reject(
                OP,
                Category::BadInput,
                "lane ids are host:session and incarnation ids li-…",
            ));
        }
        let key = format!("lane-adopt/{lane_id}/{incarnation}");
        let digest = request_digest(OP, &[lane_id, host_id, incarnation]);
        let body = async {
            let mut c = self.pool.get().await?;
            let tx = match begin(&mut c, OP, l, &key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            tx.execute(
                "INSERT INTO lanes (lane_id, host_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&lane_id, &host_id],
            )
            .await?;
            let retired = tx
                .execute(
                    &format!(
                        "UPDATE lane_incarnations li SET retired_at = clock_timestamp() \
                         WHERE li.lane_id = $6 AND li.retired_at IS NULL AND li.state IN ('IDLE_CLEAN', 'QUARANTINED') \
                           AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.lane_incarnation_id = li.lane_incarnation_id AND a.lifecycle = 'ACTIVE') \
                           AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> 'ENDED') \
                           AND {}",
                        txn::LEADER_OK
                    ),
                    &with_leader(l, &[&lane_id]),
                )
                .await?;
            let busy: bool = tx.query_one("SELECT EXISTS (SELECT 1 FROM lane_incarnations WHERE lane_id = $1 AND retired_at IS NULL)", &[&lane_id]).await?.get(0);
            if busy {
                return Err(reject(
                    OP,
                    Category::WrongState,
                    "the lane's current incarnation is busy; it cannot be replaced yet",
                ));
            }
            tx.execute("INSERT INTO lane_incarnations (lane_incarnation_id, lane_id, created_epoch) VALUES ($1, $2, $3)", &[&incarnation, &lane_id, &l.epoch()]).await?;
            commit_receipt(tx, OP, l, (&key, &digest), None, Some(incarnation), json!({ "lane_id": lane_id, "lane_incarnation_id": incarnation, "retired_previous": retired == 1 })).await
        };
        self.settle(
            OP,
            l,
            &key,
            &digest,
            (None, Some(incarnation)),
            body.await,
            |r| r,
        )
        .await?;
        self.lane(lane_id)
            .await?
            .ok_or_else(|| reject(OP, Category::NotFound, lane_id.to_string()))
    }

    pub async fn assignment_statuses(&self) -> Result<Vec<AssignmentStatus>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT a.assignment_id, li.lane_id, li.lane_incarnation_id, li.state, a.lifecycle, \
                        (SELECT max(r.generation) FROM reservations r WHERE r.assignment_id = a.assignment_id), \
                        a.responsibility_owner, a.execution_owner, a.pending_target, a.next_action \
                 FROM assignments a JOIN lane_incarnations li USING (lane_incarnation_id) ORDER BY a.created_at",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| AssignmentStatus {
                assignment_id: r.get(0),
                lane_id: r.get(1),
                lane_incarnation_id: r.get(2),
                state: r.get(3),
                lifecycle: r.get(4),
                generation: r.get(5),
                responsibility_owner: r.get(6),
                execution_owner: r.get(7),
                pending_target: r.get(8),
                next_action: r.get(9),
            })
            .collect())
    }

    /// Ingested termination receipts, oldest first (optionally for one lane).
    pub async fn termination_receipts(
        &self,
        lane_id: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT body, reconciliation FROM termination_receipts WHERE $1::text IS NULL OR lane_id = $1 ORDER BY ingested_at",
                &[&lane_id],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let mut b: serde_json::Value = r.get(0);
                b["reconciliation"] = json!(r.get::<_, Option<String>>(1));
                b
            })
            .collect())
    }
}

impl Store {
    /// Chains still before activation whose reservation deadline has passed by database
    /// time: what the watchdog expires.
    pub async fn expired_chains(&self) -> Result<Vec<Chain>, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query(
            "SELECT li.lane_id, r.lane_incarnation_id, r.assignment_id, r.assignment_attempt_id, r.reservation_id, r.reservation_epoch \
             FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) \
             WHERE r.released_at IS NULL AND r.deadline <= clock_timestamp() \
               AND li.state IN ('RESERVED','CHECKPOINTING','FENCED','STAGING','CONTRACT_INJECTING','AWAITING_ACK','READY')",
            &[],
        )
        .await?
        .iter()
        .map(|r| Chain {
            lane_id: r.get(0),
            lane_incarnation_id: r.get(1),
            assignment_id: r.get(2),
            assignment_attempt_id: r.get(3),
            reservation_id: r.get(4),
            reservation_epoch: r.get(5),
        })
        .collect())
    }
}
