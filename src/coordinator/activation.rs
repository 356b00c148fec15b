//! AWAITING_ACK → READY (the single-use challenge ACK, spec §8) and READY → RUNNING (the
//! atomic activation, spec §6.2).
//!
//! **Never:** moves a lane to READY unless the challenge consumption and the lane change are
//! decided by one statement; activates without a consumed, persisted ACK of the same chain;
//! issues a lease outside the activation commit.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::chain::diagnose;
use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::model::{Chain, ChainRow};
use super::secret::FenceToken;
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

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
    pub lease_ttl_ms: i64,
}

impl Activation {
    /// The activation a chain's own rows call for, presenting the fence token re-derived
    /// from the coordinator secret (`None` when the chain is not READY with a consumed ACK).
    pub fn of(store: &Store, c: &ChainRow, lease_ttl_ms: i64) -> Option<Activation> {
        Some(Activation {
            chain: c.chain.clone(),
            target: c.pending_target.clone()?,
            reservation_lease_id: c.reservation_lease_id.clone(),
            reservation_deadline: c.reservation_deadline.clone(),
            generation: c.generation?,
            fence_token: store
                .secret
                .fence_token(&c.chain.reservation_id, &c.fence_salt),
            challenge_id: c.challenge_id.clone()?,
            ack_digest: c.ack_digest.clone()?,
            contracts_digest: c.contracts_digest.clone()?,
            scope_digest: c.scope_digest.clone(),
            holds_digest: c.holds_digest.clone(),
            process_identity: c.process_identity.clone()?,
            completion_policy_digest: c.completion_policy_digest.clone(),
            lease_ttl_ms,
        })
    }
}

/// AWAITING_ACK → READY and the challenge consumption in one statement: both happen or
/// neither does. The lane row is decided first (the data-modifying CTE), so a lane that
/// changed concurrently (an expiry, a quarantine) leaves the challenge untouched.
const CONSUME_CAS: &str = "WITH ln AS ( \
       UPDATE lane_incarnations li SET state = 'READY' \
       FROM challenges c, reservations r, assignments a, generations g \
       WHERE li.lane_incarnation_id = $7 AND li.lane_id = $8 AND li.state = 'AWAITING_ACK' AND li.retired_at IS NULL \
         AND c.challenge_id = $1 AND c.consumed_at IS NULL AND c.expires_at > clock_timestamp() \
         AND c.sot_incarnation = $2 AND c.coordinator_epoch = $3 AND $2 = $17 AND $3 = $18 \
         AND r.reservation_id = c.reservation_id AND r.reservation_id = $4 AND r.reservation_epoch = $5 \
         AND mosaic_ts(r.deadline) = $6 AND r.deadline > clock_timestamp() AND r.released_at IS NULL \
         AND r.lane_incarnation_id = li.lane_incarnation_id \
         AND a.assignment_id = r.assignment_id AND a.assignment_id = $9 AND r.assignment_attempt_id = $10 \
         AND a.lifecycle = 'ACTIVE' AND a.requested_outcome IS NULL \
         AND g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = r.generation AND g.generation = $11 \
         AND g.stop_requested_at IS NULL AND g.process_identity = $12::text::jsonb \
         AND r.contracts_digest = $13 AND c.contracts_digest = $13 \
         AND a.scope_digest = $14 AND a.holds_digest = $15 AND a.runtime_id = $16 \
       RETURNING li.lane_incarnation_id) \
     UPDATE challenges c SET consumed_at = clock_timestamp() FROM ln \
     WHERE c.challenge_id = $1 AND c.consumed_at IS NULL \
     RETURNING c.challenge_id";

/// READY → RUNNING over every expected value of spec §6.2.
const ACTIVATE_CAS: &str = "UPDATE lane_incarnations li SET state = 'RUNNING' \
     FROM reservations r, assignments a, generations g, challenges c, ack_receipts k \
     WHERE li.lane_incarnation_id = $1 AND li.lane_id = $2 AND li.state = 'READY' AND li.retired_at IS NULL \
       AND r.reservation_id = $3 AND r.reservation_epoch = $4 AND r.reservation_lease_id = $5 AND mosaic_ts(r.deadline) = $6 \
       AND r.deadline > clock_timestamp() AND r.released_at IS NULL AND r.lane_incarnation_id = li.lane_incarnation_id \
       AND r.sot_incarnation = $19 AND r.coordinator_epoch = $20 \
       AND a.assignment_id = r.assignment_id AND a.assignment_id = $7 AND r.assignment_attempt_id = $8 \
       AND a.lifecycle = 'ACTIVE' AND a.requested_outcome IS NULL \
       AND a.responsibility_owner = $9 AND a.execution_owner IS NULL AND a.pending_target = $9 \
       AND r.generation = $10 AND g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = $10 \
       AND g.state = 'STAGING' AND g.stop_requested_at IS NULL \
       AND r.fence_digest = $11 \
       AND c.challenge_id = $12 AND c.reservation_id = r.reservation_id AND c.consumed_at IS NOT NULL \
       AND k.challenge_id = c.challenge_id AND k.ack_digest = $13 \
       AND r.contracts_digest = $14 AND a.scope_digest = $15 AND a.holds_digest = $16 \
       AND g.process_identity = $17::text::jsonb AND r.process_identity = $17::text::jsonb \
       AND a.completion_policy_digest = $18 \
     RETURNING k.ack_receipt_id, a.scope, a.holds";

impl Store {
    /// AWAITING_ACK → READY: consumes the challenge exactly once when every bound field
    /// matches the coordinator's state, persisting the immutable ACK receipt in the same
    /// commit. The identical ACK again returns the original receipt; any other ACK for a
    /// consumed challenge is refused.
    pub async fn consume_ack(&self, l: &Leader, a: &AckClaim) -> Result<Receipt, AuthorityError> {
        const OP: &str = "consume-ack";
        let claim =
            serde_json::to_string(a).map_err(|e| AuthorityError::Internal(e.to_string()))?;
        let step = Step::new(
            OP,
            l,
            format!("consume-ack/{}/{}", a.challenge_id, a.ack_digest),
            request_digest(OP, &[&claim]),
        )
        .about(Some(&a.assignment_id), Some(&a.lane_incarnation_id));
        let (a, epoch, sot) = (a.clone(), l.epoch(), l.sot().to_string());
        self.transition(
            &step,
            body!([a, claim, sot] |f| {
                let id_text = a.process_identity.to_string();
                let d = f.cas(CONSUME_CAS, &[&a.challenge_id, &a.sot_incarnation, &a.coordinator_epoch, &a.reservation_id, &a.reservation_epoch,
                    &a.reservation_deadline, &a.lane_incarnation_id, &a.lane_id, &a.assignment_id, &a.assignment_attempt_id, &a.generation,
                    &id_text, &a.contracts_digest, &a.scope_digest, &a.holds_digest, &a.runtime_id, &sot, &epoch]).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(why_ack_refused(u, &a, epoch, &sot).await?),
                };
                let ack_id = format!("ack-{}", uuid::Uuid::new_v4().simple());
                d.exec_one(
                    "INSERT INTO ack_receipts (ack_receipt_id, challenge_id, reservation_id, ack_digest, body) VALUES ($1, $2, $3, $4, $5::text::jsonb)",
                    &[&ack_id, &a.challenge_id, &a.reservation_id, &a.ack_digest, &claim],
                ).await?;
                d.decide(json!({ "challenge_id": a.challenge_id, "ack_receipt_id": ack_id, "ack_digest": a.ack_digest,
                    "generation": a.generation, "to": "READY" }))
            }),
        )
        .await
    }

    /// READY → RUNNING, the atomic activation (spec §6.2): one compare-and-swap over every
    /// expected value commits RUNNING, `execution_owner = target`, cleared `pending_target`,
    /// one effect lease per capability in the assignment's scope (none for a capability it
    /// holds back) and the activation receipt together.
    pub async fn activate(&self, l: &Leader, x: &Activation) -> Result<Receipt, AuthorityError> {
        const OP: &str = "activate";
        if !(1000..=86_400_000).contains(&x.lease_ttl_ms) {
            return Err(reject(
                OP,
                Category::BadInput,
                "a lease ttl of 1 s..24 h is required",
            ));
        }
        let c = &x.chain;
        let fence = self.secret.fence_digest(&x.fence_token);
        let id_text = x.process_identity.to_string();
        let step = Step::new(
            OP,
            l,
            format!("activate/{}", c.reservation_id),
            request_digest(
                OP,
                &[
                    &c.key(),
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
                ],
            ),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let (x, epoch, sot, sec) = (
            x.clone(),
            l.epoch(),
            l.sot().to_string(),
            self.secret.clone(),
        );
        self.transition(
            &step,
            body!([x, sot, sec, fence, id_text] |f| {
                let c = &x.chain;
                // The token is compared by keyed digest in constant time before the CAS binds
                // that same digest as an expected value.
                let stored = f.read_opt("SELECT fence_digest FROM reservations WHERE reservation_id = $1", &[&c.reservation_id]).await?;
                match stored {
                    None => return Err(reject(OP, Category::NotFound, "no such reservation")),
                    Some(s) if !sec.fence_matches(&x.fence_token, &s.get::<_, String>(0)) => {
                        return Err(reject(OP, Category::FenceMismatch, "the presented fence token is not this reservation's"))
                    }
                    Some(_) => {}
                }
                let d = f.cas(ACTIVATE_CAS, &[&c.lane_incarnation_id, &c.lane_id, &c.reservation_id, &c.reservation_epoch, &x.reservation_lease_id,
                    &x.reservation_deadline, &c.assignment_id, &c.assignment_attempt_id, &x.target, &x.generation, &fence, &x.challenge_id,
                    &x.ack_digest, &x.contracts_digest, &x.scope_digest, &x.holds_digest, &id_text, &x.completion_policy_digest, &sot, &epoch]).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let state = u.read_opt("SELECT state FROM lane_incarnations WHERE lane_incarnation_id = $1", &[&c.lane_incarnation_id]).await?
                            .map(|r| r.get::<_, String>(0));
                        if state.as_deref() != Some("READY") {
                            return Err(diagnose(u, c, "READY", epoch).await?);
                        }
                        let expired = u.read_opt("SELECT deadline <= clock_timestamp() FROM reservations WHERE reservation_id = $1", &[&c.reservation_id]).await?
                            .map(|r| r.get::<_, bool>(0)).unwrap_or(false);
                        return Err(if expired {
                            u.reject(Category::Expired, "the reservation deadline has passed (database time)").await?
                        } else {
                            u.reject(Category::Mismatch, "an expected activation value differs from canonical state").await?
                        });
                    }
                };
                let ack_receipt: String = d.row().get(0);
                let scope: serde_json::Value = d.row().get(1);
                let holds: serde_json::Value = d.row().get(2);
                let held: Vec<String> = holds.as_array().map(|h| h.iter().filter_map(|v| v.as_str().map(String::from)).collect()).unwrap_or_default();
                let capabilities: Vec<String> = scope.as_array().into_iter().flatten().filter_map(|v| v.as_str())
                    .filter(|c| !held.iter().any(|h| h == c)).map(String::from).collect();
                let ttl = format!("{} milliseconds", x.lease_ttl_ms);
                // Owners, the generation and one lease per capability in one statement; the
                // counts prove the owner and generation updates each hit their one row.
                let out = d.query_one(
                    "WITH a AS (UPDATE assignments a SET execution_owner = $2, pending_target = NULL, next_action = 'run the task under its contract', \
                                       watchdog_step = 'none', inactivity_base_at = clock_timestamp(), \
                                       inactivity_deadline = clock_timestamp() + pol.replace_after_ms * interval '1 millisecond' \
                                FROM inactivity_policies pol WHERE a.assignment_id = $1 AND pol.policy_id = a.inactivity_policy RETURNING 1), \
                          g AS (UPDATE generations SET state = 'LIVE' WHERE lane_incarnation_id = $3 AND generation = $4 RETURNING 1), \
                          s AS (INSERT INTO leases (lease_id, scope, lease_epoch, assignment_id, assignment_attempt_id, lane_incarnation_id, generation, \
                                                    reservation_id, sot_incarnation, coordinator_epoch, expires_at) \
                                SELECT 'ls-' || replace(gen_random_uuid()::text, '-', ''), cap, 1, $1, $5, $3, $4, $6, $7, $8, clock_timestamp() + $9::text::interval \
                                FROM unnest($10::text[]) AS cap RETURNING lease_id, scope, mosaic_ts(expires_at) AS exp) \
                     SELECT (SELECT count(*) FROM a), (SELECT count(*) FROM g), \
                            coalesce((SELECT jsonb_agg(jsonb_build_object('lease_id', lease_id, 'scope', scope, 'expires_at', exp) ORDER BY scope) FROM s), '[]'::jsonb)",
                    &[&c.assignment_id, &x.target, &c.lane_incarnation_id, &x.generation, &c.assignment_attempt_id, &c.reservation_id, &sot, &epoch, &ttl, &capabilities],
                ).await?;
                if (out.get::<_, i64>(0), out.get::<_, i64>(1)) != (1, 1) {
                    return Err(AuthorityError::Internal("activate: the owner or generation update missed its row".into()));
                }
                let leases: serde_json::Value = out.get(2);
                d.decide(json!({
                    "chain": c, "generation": x.generation, "to": "RUNNING", "execution_owner": x.target, "pending_target": null,
                    "ack_receipt_id": ack_receipt, "leases": leases }))
            }),
        )
        .await
    }
}

/// Names the first ACK field that disagrees with canonical state.
async fn why_ack_refused(
    u: super::txn::Undecided<'_>,
    a: &AckClaim,
    epoch: i64,
    sot: &str,
) -> Result<AuthorityError, AuthorityError> {
    if a.coordinator_epoch != epoch || a.sot_incarnation != sot {
        return u
            .reject(
                Category::StaleLeader,
                "the ACK is bound to another coordinator epoch or timeline",
            )
            .await;
    }
    let c = u
        .read_opt(
            "SELECT c.consumed_at IS NOT NULL, c.expires_at <= clock_timestamp(), c.reservation_id, c.sot_incarnation, c.coordinator_epoch, \
                    r.reservation_epoch, mosaic_ts(r.deadline), r.deadline <= clock_timestamp(), r.lane_incarnation_id, li.lane_id, li.state, \
                    r.assignment_id, r.assignment_attempt_id, r.generation, r.contracts_digest, a.scope_digest, a.holds_digest, \
                    a.runtime_id, g.process_identity = $2::text::jsonb, r.released_at IS NOT NULL, a.requested_outcome IS NOT NULL OR a.lifecycle <> 'ACTIVE', \
                    g.stop_requested_at IS NOT NULL \
             FROM challenges c JOIN reservations r USING (reservation_id) JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
             JOIN assignments a ON a.assignment_id = r.assignment_id \
             LEFT JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
             WHERE c.challenge_id = $1",
            &[&a.challenge_id, &a.process_identity.to_string()],
        )
        .await?;
    let Some(c) = c else {
        return u.reject(Category::NotFound, "no such challenge").await;
    };
    if c.get::<_, bool>(0) {
        return u
            .reject(
                Category::ChallengeConsumed,
                "the challenge was already consumed",
            )
            .await;
    }
    let s = |i: usize| c.get::<_, String>(i);
    let mismatch = |f: &str| format!("{f} does not match the challenge's chain");
    let field = if s(2) != a.reservation_id {
        Some("reservation_id")
    } else if c.get::<_, String>(3) != a.sot_incarnation
        || c.get::<_, i64>(4) != a.coordinator_epoch
    {
        return u
            .reject(
                Category::StaleLeader,
                "the challenge was issued under another epoch or timeline",
            )
            .await;
    } else if c.get::<_, i64>(5) != a.reservation_epoch {
        Some("reservation_epoch")
    } else if s(6) != a.reservation_deadline {
        Some("reservation_deadline")
    } else if s(8) != a.lane_incarnation_id {
        Some("lane_incarnation_id")
    } else if s(9) != a.lane_id {
        Some("lane_id")
    } else if s(11) != a.assignment_id {
        Some("assignment_id")
    } else if s(12) != a.assignment_attempt_id {
        Some("assignment_attempt_id")
    } else if c.get::<_, Option<i64>>(13) != Some(a.generation) {
        Some("generation")
    } else if !c.get::<_, Option<bool>>(18).unwrap_or(false) {
        Some("process_identity")
    } else if c.get::<_, Option<String>>(14).as_deref() != Some(a.contracts_digest.as_str()) {
        Some("contracts_digest")
    } else if s(15) != a.scope_digest {
        Some("scope_digest")
    } else if s(16) != a.holds_digest {
        Some("holds_digest")
    } else if s(17) != a.runtime_id {
        Some("runtime_id")
    } else {
        None
    };
    if let Some(f) = field {
        return u.reject(Category::Mismatch, mismatch(f)).await;
    }
    if c.get::<_, bool>(1) || c.get::<_, bool>(7) {
        return u
            .reject(
                Category::Expired,
                "the challenge or its reservation expired (database time; equality is expired)",
            )
            .await;
    }
    if c.get::<_, bool>(19) || c.get::<_, bool>(20) || c.get::<_, Option<bool>>(21).unwrap_or(false)
    {
        return u
            .reject(
                Category::WrongState,
                "the chain was ended (released, stopping or no longer active)",
            )
            .await;
    }
    u.reject(
        Category::WrongState,
        format!("lane is {}, not AWAITING_ACK", s(10)),
    )
    .await
}
