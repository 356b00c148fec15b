//! The chain from the ACK onwards: READY, the atomic activation to RUNNING, draining,
//! retirement, cleanup back to IDLE_CLEAN; quarantine and its release; expiry; and the
//! reconciliation of host termination receipts.
//!
//! **Never:** activates without a consumed, persisted ACK of the same chain; issues a lease
//! outside the activation commit; reaches a terminal outcome without final evidence and
//! released leases; turns a host observation straight into a terminal outcome.

use serde_json::json;

use super::chain::{is_digest, AckClaim, Activation, Chain, Outcome};
use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::store::Store;
use super::txn::{
    self, begin, commit_receipt, leader_params as lp, request_digest, Began, Receipt,
};

/// How a termination receipt was reconciled.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reconciliation {
    /// The same receipt was already ingested.
    Duplicate,
    /// A generation that died before or during its run: the assignment goes to recovery
    /// (no execution owner, no leases); the lane is clean again only if cleanup was verified.
    Recovery { lane_state: String },
    /// The retiring generation's expected end; `finish` completes the cycle.
    RetirementEvidence,
    /// The observation contradicts the coordinator's state: the lane is quarantined.
    Quarantined { reason: String },
}

impl Store {
    /// AWAITING_ACK → READY: consumes the challenge exactly once when every bound field
    /// matches the coordinator's state, persisting the immutable ACK receipt in the same
    /// commit.
    pub async fn consume_ack(&self, l: &Leader, a: &AckClaim) -> Result<Receipt, AuthorityError> {
        const OP: &str = "consume-ack";
        let claim = serde_json::to_string(a).map_err(|e| AuthorityError::Db(e.to_string()))?;
        let digest = request_digest(OP, &[&claim]);
        let id_text = a.process_identity.to_string();
        let body = async {
            let mut c = self.pool.get().await?;
            let tx = match begin(&mut c, OP, l, &a.idempotency_key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            let row = tx
                .query_opt(
                    &format!(
                        "UPDATE challenges c SET consumed_at = clock_timestamp() \
                         FROM reservations r, lane_incarnations li, assignments a, generations g \
                         WHERE c.challenge_id = $6 AND c.consumed_at IS NULL AND c.expires_at > clock_timestamp() \
                           AND c.sot_incarnation = $7 AND c.coordinator_epoch = $8 AND $7 = $5 AND $8 = $1 \
                           AND r.reservation_id = c.reservation_id AND r.reservation_id = $9 AND r.reservation_epoch = $10 \
                           AND mosaic_ts(r.deadline) = $11 AND r.deadline > clock_timestamp() AND r.released_at IS NULL \
                           AND li.lane_incarnation_id = r.lane_incarnation_id AND li.lane_incarnation_id = $12 AND li.lane_id = $13 \
                           AND li.state = 'AWAITING_ACK' AND li.retired_at IS NULL \
                           AND a.assignment_id = r.assignment_id AND a.assignment_id = $14 AND r.assignment_attempt_id = $15 AND a.lifecycle = 'ACTIVE' \
                           AND g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = r.generation AND g.generation = $16 \
                           AND g.process_identity = $17::text::jsonb AND r.contracts_digest = $18 AND c.contracts_digest = $18 \
                           AND a.scope_digest = $19 AND a.holds_digest = $20 AND a.runtime_id = $21 AND {} \
                         RETURNING c.challenge_id",
                        txn::LEADER_OK
                    ),
                    &lp(l, &[&a.challenge_id, &a.sot_incarnation, &a.coordinator_epoch, &a.reservation_id, &a.reservation_epoch, &a.reservation_deadline, &a.lane_incarnation_id, &a.lane_id, &a.assignment_id, &a.assignment_attempt_id, &a.generation, &id_text, &a.contracts_digest, &a.scope_digest, &a.holds_digest, &a.runtime_id]),
                )
                .await?;
            if row.is_none() {
                return Err(self.why_ack_refused(&tx, l, a).await?);
            }
            let ack_id = format!("ack-{}", uuid::Uuid::new_v4().simple());
            tx.execute(
                "INSERT INTO ack_receipts (ack_receipt_id, challenge_id, reservation_id, ack_digest, body) VALUES ($1, $2, $3, $4, $5::text::jsonb)",
                &[&ack_id, &a.challenge_id, &a.reservation_id, &a.ack_digest, &claim],
            )
            .await?;
            tx.execute("UPDATE lane_incarnations SET state = 'READY' WHERE lane_incarnation_id = $1 AND state = 'AWAITING_ACK'", &[&a.lane_incarnation_id]).await?;
            commit_receipt(tx, OP, l, (&a.idempotency_key, &digest), Some(&a.assignment_id), Some(&a.lane_incarnation_id), json!({ "challenge_id": a.challenge_id, "ack_receipt_id": ack_id, "ack_digest": a.ack_digest, "to": "READY" })).await
        }
        .await;
        self.settle(
            OP,
            l,
            &a.idempotency_key,
            &digest,
            (Some(&a.assignment_id), Some(&a.lane_incarnation_id)),
            body,
            |r| r,
        )
        .await
    }

    /// Names the first ACK field that disagrees with canonical state.
    async fn why_ack_refused(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        l: &Leader,
        a: &AckClaim,
    ) -> Result<AuthorityError, AuthorityError> {
        const OP: &str = "consume-ack";
        let ok: bool = txn::leader_ok(tx, l).await?;
        if !ok || a.coordinator_epoch != l.epoch() || a.sot_incarnation != l.sot() {
            return Ok(reject(
                OP,
                Category::StaleLeader,
                "the ACK is bound to another coordinator epoch or timeline, or leadership was lost",
            ));
        }
        let c = tx
            .query_opt(
                "SELECT c.consumed_at IS NOT NULL, c.expires_at <= clock_timestamp(), c.reservation_id, c.sot_incarnation, c.coordinator_epoch, \
                        r.reservation_epoch, mosaic_ts(r.deadline), r.deadline <= clock_timestamp(), r.lane_incarnation_id, li.lane_id, li.state, \
                        r.assignment_id, r.assignment_attempt_id, r.generation, g.process_identity::text, r.contracts_digest, a.scope_digest, a.holds_digest, \
                        a.runtime_id, g.process_identity = $2::text::jsonb, r.released_at IS NOT NULL \
                 FROM challenges c JOIN reservations r USING (reservation_id) JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
                 JOIN assignments a ON a.assignment_id = r.assignment_id \
                 LEFT JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
                 WHERE c.challenge_id = $1",
                &[&a.challenge_id, &a.process_identity.to_string()],
            )
            .await?;
        let Some(c) = c else {
            return Ok(reject(OP, Category::NotFound, "no such challenge"));
        };
        if c.get::<_, bool>(0) {
            return Ok(reject(
                OP,
                Category::ChallengeConsumed,
                "the challenge was already consumed",
            ));
        }
        let mismatch = |f: &str| {
            Ok(reject(
                OP,
                Category::Mismatch,
                format!("{f} does not match the challenge's chain"),
            ))
        };
        let s = |i: usize| c.get::<_, String>(i);
        if s(2) != a.reservation_id {
            return mismatch("reservation_id");
        }
        if c.get::<_, String>(3) != a.sot_incarnation || c.get::<_, i64>(4) != a.coordinator_epoch {
            return Ok(reject(
                OP,
                Category::StaleLeader,
                "the challenge was issued under another epoch or timeline",
            ));
        }
        if c.get::<_, i64>(5) != a.reservation_epoch {
            return mismatch("reservation_epoch");
        }
        if s(6) != a.reservation_deadline {
            return mismatch("reservation_deadline");
        }
        if s(8) != a.lane_incarnation_id {
            return mismatch("lane_incarnation_id");
        }
        if s(9) != a.lane_id {
            return mismatch("lane_id");
        }
        if s(11) != a.assignment_id {
            return mismatch("assignment_id");
        }
        if s(12) != a.assignment_attempt_id {
            return mismatch("assignment_attempt_id");
        }
        if c.get::<_, Option<i64>>(13) != Some(a.generation) {
            return mismatch("generation");
        }
        if !c.get::<_, Option<bool>>(19).unwrap_or(false) {
            return mismatch("process_identity");
        }
        if c.get::<_, Option<String>>(15).as_deref() != Some(a.contracts_digest.as_str()) {
            return mismatch("contracts_digest");
        }
        if s(16) != a.scope_digest {
            return mismatch("scope_digest");
        }
        if s(17) != a.holds_digest {
            return mismatch("holds_digest");
        }
        if s(18) != a.runtime_id {
            return mismatch("runtime_id");
        }
        if c.get::<_, bool>(1) || c.get::<_, bool>(7) {
            return Ok(reject(
                OP,
                Category::Expired,
                "the challenge or its reservation expired (database time; equality is expired)",
            ));
        }
        if c.get::<_, bool>(20) {
            return Ok(reject(
                OP,
                Category::WrongState,
                "the reservation was released",
            ));
        }
        Ok(reject(
            OP,
            Category::WrongState,
            format!("lane is {}, not AWAITING_ACK", s(10)),
        ))
    }

    /// READY → RUNNING, the atomic activation (spec §6.2): one compare-and-swap over every
    /// expected value commits RUNNING, `execution_owner = target`, cleared `pending_target`,
    /// the scoped effect leases and the activation receipt together.
    pub async fn activate(&self, l: &Leader, x: &Activation) -> Result<Receipt, AuthorityError> {
        const OP: &str = "activate";
        let c = &x.chain;
        let fence = self.secret.fence_digest(&x.fence_token);
        let id_text = x.process_identity.to_string();
        let scopes = x.lease_scopes.join(",");
        let digest = request_digest(
            OP,
            &[
                &serde_json::to_string(c).unwrap_or_default(),
                &x.target,
                &x.reservation_lease_id,
                &x.reservation_deadline,
                &x.generation.to_string(),
                &fence,
                &x.challenge_id,
                &x.ack_digest,
                &x.contracts_digest,
                &x.scope_digest,
                &x.holds_digest,
                &id_text,
                &x.completion_policy_digest,
                &scopes,
            ],
        );
        if x.lease_scopes.is_empty()
            || x.lease_scopes.iter().any(|s| s.is_empty())
            || !(1000..=86_400_000).contains(&x.lease_ttl_ms)
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "lease scopes and a lease ttl of 1 s..24 h are required",
            ));
        }
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, &x.idempotency_key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            // The fence token is compared by keyed digest in constant time, before the CAS
            // binds that same digest as an expected value.
            let stored: Option<String> = tx.query_opt("SELECT fence_digest FROM reservations WHERE reservation_id = $1", &[&c.reservation_id]).await?.map(|r| r.get(0));
            match stored {
                None => return Err(reject(OP, Category::NotFound, "no such reservation")),
                Some(s) if !self.secret.fence_matches(&x.fence_token, &s) => return Err(reject(OP, Category::FenceMismatch, "the presented fence token is not this reservation's")),
                Some(_) => {}
            }
            let row = tx
                .query_opt(
                    &format!(
                        "UPDATE lane_incarnations li SET state = 'RUNNING' \
                         FROM reservations r, assignments a, generations g, challenges c, ack_receipts k \
                         WHERE li.lane_incarnation_id = $6 AND li.lane_id = $7 AND li.state = 'READY' AND li.retired_at IS NULL \
                           AND r.reservation_id = $8 AND r.reservation_epoch = $9 AND r.reservation_lease_id = $10 AND mosaic_ts(r.deadline) = $11 \
                           AND r.deadline > clock_timestamp() AND r.released_at IS NULL AND r.lane_incarnation_id = li.lane_incarnation_id \
                           AND r.sot_incarnation = $5 AND r.coordinator_epoch = $1 \
                           AND a.assignment_id = r.assignment_id AND a.assignment_id = $12 AND r.assignment_attempt_id = $13 AND a.lifecycle = 'ACTIVE' \
                           AND a.responsibility_owner = $14 AND a.execution_owner IS NULL AND a.pending_target = $14 \
                           AND r.generation = $15 AND g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = $15 AND g.state = 'STAGING' \
                           AND r.fence_digest = $16 \
                           AND c.challenge_id = $17 AND c.reservation_id = r.reservation_id AND c.consumed_at IS NOT NULL \
                           AND k.challenge_id = c.challenge_id AND k.ack_digest = $18 \
                           AND r.contracts_digest = $19 AND a.scope_digest = $20 AND a.holds_digest = $21 \
                           AND g.process_identity = $22::text::jsonb AND r.process_identity = $22::text::jsonb \
                           AND a.completion_policy_digest = $23 AND {} \
                         RETURNING k.ack_receipt_id",
                        txn::LEADER_OK
                    ),
                    &lp(l, &[&c.lane_incarnation_id, &c.lane_id, &c.reservation_id, &c.reservation_epoch, &x.reservation_lease_id, &x.reservation_deadline, &c.assignment_id, &c.assignment_attempt_id, &x.target, &x.generation, &fence, &x.challenge_id, &x.ack_digest, &x.contracts_digest, &x.scope_digest, &x.holds_digest, &id_text, &x.completion_policy_digest]),
                )
                .await?;
            let Some(row) = row else {
                let state: Option<String> = tx.query_opt("SELECT state FROM lane_incarnations WHERE lane_incarnation_id = $1", &[&c.lane_incarnation_id]).await?.map(|r| r.get(0));
                let expired: bool = tx.query_opt("SELECT deadline <= clock_timestamp() FROM reservations WHERE reservation_id = $1", &[&c.reservation_id]).await?.map(|r| r.get(0)).unwrap_or(false);
                let leader: bool = txn::leader_ok(&tx, l).await?;
                return Err(match (leader, state.as_deref(), expired) {
                    (false, _, _) => reject(OP, Category::StaleLeader, "leadership lost"),
                    (_, Some(s), _) if s != "READY" => reject(OP, Category::WrongState, format!("lane is {s}, not READY")),
                    (_, _, true) => reject(OP, Category::Expired, "the reservation deadline has passed (database time)"),
                    _ => reject(OP, Category::Mismatch, "an expected activation value differs from canonical state"),
                });
            };
            let ack_receipt: String = row.get(0);
            tx.execute("UPDATE assignments SET execution_owner = $2, pending_target = NULL WHERE assignment_id = $1", &[&c.assignment_id, &x.target]).await?;
            tx.execute("UPDATE generations SET state = 'LIVE' WHERE lane_incarnation_id = $1 AND generation = $2", &[&c.lane_incarnation_id, &x.generation]).await?;
            let ttl = format!("{} milliseconds", x.lease_ttl_ms);
            let mut leases = Vec::new();
            for scope in &x.lease_scopes {
                let id = format!("ls-{}", uuid::Uuid::new_v4().simple());
                let exp: String = tx
                    .query_one(
                        "INSERT INTO leases (lease_id, scope, lease_epoch, assignment_id, assignment_attempt_id, lane_incarnation_id, generation, reservation_id, \
                                             sot_incarnation, coordinator_epoch, expires_at) \
                         VALUES ($1, $2, 1, $3, $4, $5, $6, $7, $8, $9, clock_timestamp() + $10::text::interval) RETURNING mosaic_ts(expires_at)",
                        &[&id, scope, &c.assignment_id, &c.assignment_attempt_id, &c.lane_incarnation_id, &x.generation, &c.reservation_id, &l.sot(), &l.epoch(), &ttl],
                    )
                    .await?
                    .get(0);
                leases.push(json!({ "lease_id": id, "scope": scope, "expires_at": exp }));
            }
            commit_receipt(tx, OP, l, (&x.idempotency_key, &digest), Some(&c.assignment_id), Some(&c.lane_incarnation_id), json!({
                "chain": c, "generation": x.generation, "to": "RUNNING", "execution_owner": x.target, "pending_target": null,
                "ack_receipt_id": ack_receipt, "leases": leases }))
            .await
        }
        .await;
        self.settle(
            OP,
            l,
            &x.idempotency_key,
            &digest,
            (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
            body,
            |r| r,
        )
        .await
    }

    /// RUNNING → DRAINING: records the terminal intent; the assignment is not terminal yet.
    pub async fn drain(
        &self,
        l: &Leader,
        c: &Chain,
        outcome: Outcome,
        key: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "drain";
        self.lifecycle_step(
            OP,
            l,
            c,
            key,
            "RUNNING",
            "DRAINING",
            outcome.as_str(),
            "UPDATE assignments SET requested_outcome = $2 WHERE assignment_id = $1",
        )
        .await
    }

    /// DRAINING → RETIRING: final evidence recorded, every lease released, and the terminal
    /// outcome finalized — all in this one fenced commit.
    pub async fn retire(
        &self,
        l: &Leader,
        c: &Chain,
        final_evidence_digest: &str,
        key: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "retire";
        if !is_digest(final_evidence_digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "final evidence must be a sha256 digest",
            ));
        }
        self.lifecycle_step(
            OP,
            l,
            c,
            key,
            "DRAINING",
            "RETIRING",
            final_evidence_digest,
            "WITH rel AS (UPDATE leases SET released_at = clock_timestamp() WHERE assignment_id = $1 AND released_at IS NULL), \
                  res AS (UPDATE reservations SET released_at = clock_timestamp() WHERE assignment_id = $1 AND released_at IS NULL) \
             UPDATE assignments SET lifecycle = requested_outcome, execution_owner = NULL, final_evidence_digest = $2 \
             WHERE assignment_id = $1 AND requested_outcome IS NOT NULL",
        )
        .await
    }

    /// A non-preactivation step with one follow-up statement (`$1` = assignment, `$2` = arg).
    #[allow(clippy::too_many_arguments)]
    async fn lifecycle_step(
        &self,
        op: &'static str,
        l: &Leader,
        c: &Chain,
        key: &str,
        from: &str,
        to: &str,
        arg: &str,
        follow: &str,
    ) -> Result<Receipt, AuthorityError> {
        let digest = request_digest(op, &[&serde_json::to_string(c).unwrap_or_default(), arg]);
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, op, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            let n = tx
                .execute(
                    &format!(
                        "UPDATE lane_incarnations li SET state = $7 FROM reservations r, assignments a \
                         WHERE li.lane_incarnation_id = $6 AND li.lane_id = $9 AND li.state = $8 AND r.reservation_id = $10 AND r.reservation_epoch = $11 \
                           AND r.lane_incarnation_id = li.lane_incarnation_id AND r.assignment_id = $12 AND r.assignment_attempt_id = $13 \
                           AND a.assignment_id = r.assignment_id AND a.lifecycle = 'ACTIVE' AND {}",
                        txn::LEADER_OK
                    ),
                    &lp(l, &[&c.lane_incarnation_id, &to, &from, &c.lane_id, &c.reservation_id, &c.reservation_epoch, &c.assignment_id, &c.assignment_attempt_id]),
                )
                .await?;
            if n != 1 {
                let state: Option<String> = tx.query_opt("SELECT state FROM lane_incarnations WHERE lane_incarnation_id = $1", &[&c.lane_incarnation_id]).await?.map(|r| r.get(0));
                let leader: bool = txn::leader_ok(&tx, l).await?;
                return Err(match (leader, state) {
                    (false, _) => reject(op, Category::StaleLeader, "leadership lost"),
                    (_, None) => reject(op, Category::NotFound, "no such lane incarnation"),
                    (_, Some(s)) if s != from => reject(op, Category::WrongState, format!("lane is {s}, expected {from}")),
                    _ => reject(op, Category::Mismatch, "the chain does not match the lane's reservation"),
                });
            }
            let m = tx.execute(follow, &[&c.assignment_id, &arg]).await?;
            if m != 1 {
                return Err(reject(op, Category::WrongState, "the assignment cannot take this step"));
            }
            commit_receipt(tx, op, l, (key, &digest), Some(&c.assignment_id), Some(&c.lane_incarnation_id), json!({ "chain": c, "from": from, "to": to, "arg": arg })).await
        }
        .await;
        self.settle(
            op,
            l,
            key,
            &digest,
            (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
            body,
            |r| r,
        )
        .await
    }

    /// RETIRING → IDLE_CLEAN, once the host's termination receipt for the retiring
    /// generation says cleanup was verified; a receipt that says otherwise quarantines.
    pub async fn finish(
        &self,
        l: &Leader,
        c: &Chain,
        termination_key: &str,
        key: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "finish";
        let digest = request_digest(
            OP,
            &[
                &serde_json::to_string(c).unwrap_or_default(),
                termination_key,
            ],
        );
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            let row = tx
                .query_opt(
                    "SELECT t.verified_empty, li.state FROM termination_receipts t \
                     JOIN reservations r ON r.lane_incarnation_id = t.lane_incarnation_id AND r.generation = t.generation \
                     JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
                     WHERE t.idempotency_key = $1 AND r.reservation_id = $2 AND li.lane_incarnation_id = $3 AND r.assignment_id = $4",
                    &[&termination_key, &c.reservation_id, &c.lane_incarnation_id, &c.assignment_id],
                )
                .await?;
            let Some(row) = row else {
                return Err(reject(OP, Category::Unreconciled, "no termination receipt for this chain's generation has been ingested"));
            };
            let (clean, state): (bool, String) = (row.get(0), row.get(1));
            if state != "RETIRING" {
                return Err(reject(OP, Category::WrongState, format!("lane is {state}, expected RETIRING")));
            }
            let to = if clean { "IDLE_CLEAN" } else { "QUARANTINED" };
            let n = tx
                .execute(
                    &format!("UPDATE lane_incarnations SET state = $7, quarantine_reason = CASE WHEN $7 = 'QUARANTINED' THEN 'cleanup of the retired generation was not verified' END WHERE lane_incarnation_id = $6 AND state = 'RETIRING' AND {}", txn::LEADER_OK),
                    &lp(l, &[&c.lane_incarnation_id, &to]),
                )
                .await?;
            if n != 1 {
                return Err(reject(OP, Category::StaleLeader, "leadership lost"));
            }
            tx.execute("UPDATE generations g SET state = 'ENDED', ended_at = clock_timestamp() FROM reservations r WHERE r.reservation_id = $1 AND g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation", &[&c.reservation_id]).await?;
            tx.execute("UPDATE termination_receipts SET reconciled_at = clock_timestamp(), reconciliation = 'retired' WHERE idempotency_key = $1 AND reconciled_at IS NULL", &[&termination_key]).await?;
            commit_receipt(tx, OP, l, (key, &digest), Some(&c.assignment_id), Some(&c.lane_incarnation_id), json!({ "chain": c, "to": to, "termination_receipt": termination_key })).await
        }
        .await;
        self.settle(
            OP,
            l,
            key,
            &digest,
            (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
            body,
            |r| r,
        )
        .await
    }

    /// Any state → QUARANTINED: leases revoked, the active assignment to recovery.
    pub async fn quarantine(
        &self,
        l: &Leader,
        lane_incarnation_id: &str,
        reason: &str,
        key: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "quarantine";
        let digest = request_digest(OP, &[lane_incarnation_id, reason]);
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            quarantine_in(&tx, l, lane_incarnation_id, reason).await?;
            commit_receipt(tx, OP, l, (key, &digest), None, Some(lane_incarnation_id), json!({ "lane_incarnation_id": lane_incarnation_id, "to": "QUARANTINED", "reason": reason })).await
        }
        .await;
        self.settle(
            OP,
            l,
            key,
            &digest,
            (None, Some(lane_incarnation_id)),
            body,
            |r| r,
        )
        .await
    }

    /// QUARANTINED → IDLE_CLEAN, only with nothing left to prove: every generation ended,
    /// every termination receipt reconciled, no active assignment, no unreleased lease.
    pub async fn release_quarantine(
        &self,
        l: &Leader,
        lane_incarnation_id: &str,
        key: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "release-quarantine";
        let digest = request_digest(OP, &[lane_incarnation_id]);
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            let n = tx
                .execute(
                    &format!(
                        "UPDATE lane_incarnations li SET state = 'IDLE_CLEAN', quarantine_reason = NULL \
                         WHERE li.lane_incarnation_id = $6 AND li.state = 'QUARANTINED' AND li.retired_at IS NULL \
                           AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> 'ENDED') \
                           AND NOT EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id AND t.reconciled_at IS NULL) \
                           AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.lane_incarnation_id = li.lane_incarnation_id AND a.lifecycle = 'ACTIVE') \
                           AND NOT EXISTS (SELECT 1 FROM leases s WHERE s.lane_incarnation_id = li.lane_incarnation_id AND s.released_at IS NULL) \
                           AND {}",
                        txn::LEADER_OK
                    ),
                    &lp(l, &[&lane_incarnation_id]),
                )
                .await?;
            if n != 1 {
                return Err(reject(OP, Category::Unreconciled, "the lane is not quarantined, or a generation, receipt, assignment or lease is still open"));
            }
            commit_receipt(tx, OP, l, (key, &digest), None, Some(lane_incarnation_id), json!({ "lane_incarnation_id": lane_incarnation_id, "to": "IDLE_CLEAN" })).await
        }
        .await;
        self.settle(
            OP,
            l,
            key,
            &digest,
            (None, Some(lane_incarnation_id)),
            body,
            |r| r,
        )
        .await
    }

    /// A preactivation chain whose reservation deadline has passed (database time): the
    /// assignment goes to recovery; the lane is idle again if no generation was staged, and
    /// quarantined (until that generation's end is reconciled) if one was.
    pub async fn expire(
        &self,
        l: &Leader,
        c: &Chain,
        key: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "expire";
        let digest = request_digest(OP, &[&serde_json::to_string(c).unwrap_or_default()]);
        let body = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, key, &digest).await? {
                Began::Replayed(r) => return Ok(r),
                Began::Fresh(tx) => tx,
            };
            let row = tx
                .query_opt(
                    &format!(
                        "UPDATE lane_incarnations li SET state = CASE WHEN r.generation IS NULL THEN 'IDLE_CLEAN' ELSE 'QUARANTINED' END, \
                                quarantine_reason = CASE WHEN r.generation IS NULL THEN NULL ELSE 'reservation expired with a staged generation' END \
                         FROM reservations r \
                         WHERE li.lane_incarnation_id = $6 AND r.reservation_id = $7 AND r.lane_incarnation_id = li.lane_incarnation_id \
                           AND r.assignment_id = $8 AND r.released_at IS NULL AND r.deadline <= clock_timestamp() \
                           AND li.state IN ('RESERVED','CHECKPOINTING','FENCED','STAGING','CONTRACT_INJECTING','AWAITING_ACK','READY') AND {} \
                         RETURNING li.state",
                        txn::LEADER_OK
                    ),
                    &lp(l, &[&c.lane_incarnation_id, &c.reservation_id, &c.assignment_id]),
                )
                .await?;
            let Some(row) = row else {
                return Err(reject(OP, Category::WrongState, "not an unexpired-deadline preactivation chain (or not expired yet by database time)"));
            };
            let to: String = row.get(0);
            tx.execute("UPDATE reservations SET released_at = clock_timestamp() WHERE reservation_id = $1", &[&c.reservation_id]).await?;
            tx.execute(
                "UPDATE assignments SET lifecycle = 'RECOVERY', execution_owner = NULL, next_action = 'reservation expired before activation: re-reserve on a fresh chain' WHERE assignment_id = $1 AND lifecycle = 'ACTIVE'",
                &[&c.assignment_id],
            )
            .await?;
            commit_receipt(tx, OP, l, (key, &digest), Some(&c.assignment_id), Some(&c.lane_incarnation_id), json!({ "chain": c, "to": to })).await
        }
        .await;
        self.settle(
            OP,
            l,
            key,
            &digest,
            (Some(&c.assignment_id), Some(&c.lane_incarnation_id)),
            body,
            |r| r,
        )
        .await
    }

    /// Ingests a host termination receipt (idempotent by its key) and reconciles it in the
    /// same commit. A receipt is an observation: it can move work into recovery or a lane
    /// into quarantine, never an assignment into a terminal outcome.
    pub async fn ingest_termination(
        &self,
        l: &Leader,
        receipt: &serde_json::Value,
    ) -> Result<(Reconciliation, Receipt), AuthorityError> {
        const OP: &str = "ingest-termination";
        let s = |k: &str| {
            receipt
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        let (key, lane_id, inc) = (s("idempotency_key"), s("lane_id"), s("lane_incarnation_id"));
        let generation = receipt
            .get("generation")
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        let verified = receipt
            .pointer("/cleanup/verified_empty")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        if key.is_empty() || lane_id.is_empty() || inc.is_empty() || generation < 1 {
            return Err(reject(
                OP,
                Category::BadInput,
                "receipt needs idempotency_key, lane_id, lane_incarnation_id and generation",
            ));
        }
        let body_text = receipt.to_string();
        let body_digest = format!(
            "sha256:{}",
            crate::util::sha256_hex(
                "mosaic/termination-receipt-body/v1",
                &[body_text.as_bytes()]
            )
        );
        // Keyed by content too: the very same observation replays; a different observation
        // under the same key is a conflict to reconcile (quarantine), not a mere refusal.
        let idem = format!("ingest/{key}/{body_digest}");
        let digest = request_digest(OP, &[&body_digest]);
        let outcome = async {
            let mut conn = self.pool.get().await?;
            let tx = match begin(&mut conn, OP, l, &idem, &digest).await? {
                Began::Replayed(r) => return Ok((Reconciliation::Duplicate, r)),
                Began::Fresh(tx) => tx,
            };
            let prior: Option<String> = tx.query_opt("SELECT body_digest FROM termination_receipts WHERE idempotency_key = $1", &[&key]).await?.map(|r| r.get(0));
            if prior.is_some() {
                // Same key, different content: two observations of one end disagree.
                let reason = format!("conflicting termination receipts for {key}");
                quarantine_in(&tx, l, &inc, &reason).await?;
                let rec = Reconciliation::Quarantined { reason };
                let body = json!({ "termination_receipt": key, "generation": generation, "reconciliation": rec });
                let r = commit_receipt(tx, OP, l, (&idem, &digest), None, Some(&inc), body).await?;
                return Ok((rec, r));
            }
            let lane = tx.query_opt("SELECT lane_id, state, retired_at IS NOT NULL FROM lane_incarnations WHERE lane_incarnation_id = $1", &[&inc]).await?;
            let Some(lane) = lane else { return Err(reject(OP, Category::NotFound, "unknown lane incarnation")) };
            if lane.get::<_, String>(0) != lane_id {
                return Err(reject(OP, Category::Mismatch, "lane id does not match the incarnation"));
            }
            tx.execute(
                "INSERT INTO termination_receipts (idempotency_key, lane_id, lane_incarnation_id, generation, body, body_digest, verified_empty, ingested_epoch) \
                 VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8)",
                &[&key, &lane_id, &inc, &generation, &body_text, &body_digest, &verified, &l.epoch()],
            )
            .await?;
            let state: String = lane.get(1);
            let g = tx
                .query_opt("SELECT g.state, r.reservation_id, r.assignment_id FROM generations g JOIN reservations r USING (reservation_id) WHERE g.lane_incarnation_id = $1 AND g.generation = $2", &[&inc, &generation])
                .await?;
            let rec = match g {
                None => {
                    let reason = format!("receipt for generation {generation}, which this coordinator never staged");
                    quarantine_in(&tx, l, &inc, &reason).await?;
                    Reconciliation::Quarantined { reason }
                }
                Some(g) => {
                    let (gstate, reservation, assignment): (String, String, String) = (g.get(0), g.get(1), g.get(2));
                    let current: Option<String> = tx.query_opt("SELECT reservation_id FROM reservations WHERE lane_incarnation_id = $1 AND released_at IS NULL", &[&inc]).await?.map(|r| r.get(0));
                    if gstate == "ENDED" {
                        let reason = format!("a second, different end observed for generation {generation}");
                        quarantine_in(&tx, l, &inc, &reason).await?;
                        Reconciliation::Quarantined { reason }
                    } else if state == "RETIRING" {
                        // The retiring chain's own generation (the only unended one, which
                        // the unique index guarantees): the expected end.

                        Reconciliation::RetirementEvidence
                    } else if matches!(state.as_str(), "STAGING" | "CONTRACT_INJECTING" | "AWAITING_ACK" | "READY" | "RUNNING" | "DRAINING") && current.as_deref() == Some(reservation.as_str()) {
                        // Died while it had (or was about to have) authority: recovery, with
                        // every lease revoked and no execution owner; the lane is clean only
                        // if cleanup was verified.
                        let to = if verified { "IDLE_CLEAN" } else { "QUARANTINED" };
                        let n = tx
                            .execute(
                                &format!("UPDATE lane_incarnations SET state = $7, quarantine_reason = CASE WHEN $7 = 'QUARANTINED' THEN 'generation died and its cleanup was not verified' END WHERE lane_incarnation_id = $6 AND {}", txn::LEADER_OK),
                                &lp(l, &[&inc, &to]),
                            )
                            .await?;
                        if n != 1 {
                            return Err(reject(OP, Category::StaleLeader, "leadership lost"));
                        }
                        tx.execute("UPDATE leases SET released_at = clock_timestamp() WHERE reservation_id = $1 AND released_at IS NULL", &[&reservation]).await?;
                        tx.execute("UPDATE reservations SET released_at = clock_timestamp() WHERE reservation_id = $1", &[&reservation]).await?;
                        tx.execute(
                            "UPDATE assignments SET lifecycle = 'RECOVERY', execution_owner = NULL, pending_target = NULL, \
                                    next_action = 'generation ' || $2 || ' ended unexpectedly: re-reserve on a fresh generation' \
                             WHERE assignment_id = $1 AND lifecycle = 'ACTIVE'",
                            &[&assignment, &generation.to_string()],
                        )
                        .await?;
                        tx.execute("UPDATE generations SET state = 'ENDED', ended_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND generation = $2", &[&inc, &generation]).await?;
                        tx.execute("UPDATE termination_receipts SET reconciled_at = clock_timestamp(), reconciliation = 'recovery' WHERE idempotency_key = $1", &[&key]).await?;
                        Reconciliation::Recovery { lane_state: to.into() }
                    } else if state == "QUARANTINED" {
                        // Evidence that a quarantined lane's generation is gone.
                        tx.execute("UPDATE generations SET state = 'ENDED', ended_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND generation = $2", &[&inc, &generation]).await?;
                        tx.execute("UPDATE termination_receipts SET reconciled_at = clock_timestamp(), reconciliation = 'quarantine-evidence' WHERE idempotency_key = $1", &[&key]).await?;
                        if !verified {
                            tx.execute("UPDATE termination_receipts SET reconciliation = 'quarantine-evidence-unclean' WHERE idempotency_key = $1", &[&key]).await?;
                        }
                        Reconciliation::Recovery { lane_state: "QUARANTINED".into() }
                    } else {
                        let reason = format!("receipt for generation {generation} conflicts with lane state {state}");
                        quarantine_in(&tx, l, &inc, &reason).await?;
                        Reconciliation::Quarantined { reason }
                    }
                }
            };
            let r = commit_receipt(tx, OP, l, (&idem, &digest), None, Some(&inc), json!({ "termination_receipt": key, "generation": generation, "reconciliation": rec })).await?;
            Ok((rec, r))
        }
        .await;
        self.settle(OP, l, &idem, &digest, (None, Some(&inc)), outcome, |r| {
            (Reconciliation::Duplicate, r)
        })
        .await
    }
}

/// Quarantines inside an open transaction (shared by `quarantine` and reconciliation).
async fn quarantine_in(
    tx: &deadpool_postgres::Transaction<'_>,
    l: &Leader,
    inc: &str,
    reason: &str,
) -> Result<(), AuthorityError> {
    let n = tx
        .execute(
            &format!("UPDATE lane_incarnations SET state = 'QUARANTINED', quarantine_reason = $7 WHERE lane_incarnation_id = $6 AND retired_at IS NULL AND {}", txn::LEADER_OK),
            &lp(l, &[&inc, &reason]),
        )
        .await?;
    if n != 1 {
        return Err(reject(
            "quarantine",
            Category::NotFound,
            "no current lane incarnation (or leadership lost)",
        ));
    }
    tx.execute("UPDATE leases SET released_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND released_at IS NULL", &[&inc]).await?;
    tx.execute("UPDATE reservations SET released_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND released_at IS NULL", &[&inc]).await?;
    tx.execute(
        "UPDATE assignments SET lifecycle = 'RECOVERY', execution_owner = NULL, pending_target = NULL, next_action = 'lane quarantined: ' || $2 \
         WHERE lane_incarnation_id = $1 AND lifecycle = 'ACTIVE'",
        &[&inc, &reason],
    )
    .await?;
    Ok(())
}
