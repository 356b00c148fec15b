//! AWAITING_ACK → READY (the single-use challenge ACK, spec §8) and READY → RUNNING (the
//! atomic activation, spec §6.2).
//!
//! **Never:** moves a lane to READY unless the challenge consumption and the lane change are
//! decided by one statement; activates without a consumed, persisted ACK of the same chain;
//! issues a lease outside the activation commit.

use const_format::concatcp;
use serde::{Deserialize, Serialize};
use serde_json::json;

use std::sync::LazyLock;

use super::cas::{self, Pred};
use super::rows::RowExt;
use super::states::{ClaimState, GenState, LaneState, Lifecycle, WatchdogStep};

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

/// Every expected value of AWAITING_ACK → READY, in diagnosis order: both the consuming
/// CAS and the explanation of its refusal are built from this table. Parameters: $1
/// challenge, $2 timeline, $3 epoch (both as the ACK binds them), $4 reservation, $5 its
/// epoch, $6 its deadline, $7 lane incarnation, $8 lane, $9 assignment, $10 attempt,
/// $11 generation, $12 process identity, $13 contracts, $14 scope, $15 holds, $16 runtime,
/// $17 and $18 the current leader's timeline and epoch.
const CONSUME_PREDS: &[Pred] = &[
    Pred {
        sql: "$2::text = $17::text AND $3::bigint = $18::bigint",
        category: Category::StaleLeader,
        detail: "the ACK is bound to another coordinator epoch or timeline",
    },
    Pred {
        sql: "c.consumed_at IS NULL",
        category: Category::ChallengeConsumed,
        detail: "the challenge was already consumed",
    },
    Pred {
        sql: "r.reservation_id = $4",
        category: Category::Mismatch,
        detail: "reservation_id does not match the challenge's chain",
    },
    Pred {
        sql: "c.sot_incarnation = $2 AND c.coordinator_epoch = $3",
        category: Category::StaleLeader,
        detail: "the challenge was issued under another epoch or timeline",
    },
    Pred {
        sql: "r.reservation_epoch = $5",
        category: Category::Mismatch,
        detail: "reservation_epoch does not match the challenge's chain",
    },
    Pred {
        sql: "mosaic_ts(r.deadline) = $6",
        category: Category::Mismatch,
        detail: "reservation_deadline does not match the challenge's chain",
    },
    Pred {
        sql: "li.lane_incarnation_id = $7",
        category: Category::Mismatch,
        detail: "lane_incarnation_id does not match the challenge's chain",
    },
    Pred {
        sql: "li.lane_id = $8",
        category: Category::Mismatch,
        detail: "lane_id does not match the challenge's chain",
    },
    Pred {
        sql: "a.assignment_id = $9",
        category: Category::Mismatch,
        detail: "assignment_id does not match the challenge's chain",
    },
    Pred {
        sql: "r.assignment_attempt_id = $10",
        category: Category::Mismatch,
        detail: "assignment_attempt_id does not match the challenge's chain",
    },
    Pred {
        sql: "r.generation = $11",
        category: Category::Mismatch,
        detail: "generation does not match the challenge's chain",
    },
    Pred {
        sql: "g.process_identity = $12::text::jsonb",
        category: Category::Mismatch,
        detail: "process_identity does not match the challenge's chain",
    },
    Pred {
        sql: "r.contracts_digest = $13 AND c.contracts_digest = $13",
        category: Category::Mismatch,
        detail: "contracts_digest does not match the challenge's chain",
    },
    Pred {
        sql: "a.scope_digest = $14",
        category: Category::Mismatch,
        detail: "scope_digest does not match the challenge's chain",
    },
    Pred {
        sql: "a.holds_digest = $15",
        category: Category::Mismatch,
        detail: "holds_digest does not match the challenge's chain",
    },
    Pred {
        sql: "a.runtime_id = $16",
        category: Category::Mismatch,
        detail: "runtime_id does not match the challenge's chain",
    },
    Pred {
        sql: "c.expires_at > clock_timestamp() AND r.deadline > clock_timestamp()",
        category: Category::Expired,
        detail: "the challenge or its reservation expired (database time; equality is expired)",
    },
    Pred {
        sql: concatcp!(
            "r.released_at IS NULL AND a.lifecycle = ",
            Lifecycle::Active.sql(),
            " AND a.requested_outcome IS NULL AND g.stop_requested_at IS NULL"
        ),
        category: Category::WrongState,
        detail: "the chain was ended (released, stopping or no longer active)",
    },
    Pred {
        sql: concatcp!(
            "li.state = ",
            LaneState::AwaitingAck.sql(),
            " AND li.retired_at IS NULL"
        ),
        category: Category::WrongState,
        detail: "the lane is not AWAITING_ACK",
    },
];

/// AWAITING_ACK → READY and the challenge consumption in one statement: both happen or
/// neither does. The lane row is decided first (the data-modifying CTE), so a lane that
/// changed concurrently (an expiry, a quarantine) leaves the challenge untouched.
static CONSUME_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH ln AS ( \
           UPDATE lane_incarnations li SET state = {ready} \
           FROM challenges c, reservations r, assignments a, generations g \
           WHERE c.challenge_id = $1 AND r.reservation_id = c.reservation_id AND li.lane_incarnation_id = r.lane_incarnation_id \
             AND a.assignment_id = r.assignment_id AND g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = r.generation \
             AND {} \
           RETURNING li.lane_incarnation_id) \
         UPDATE challenges c SET consumed_at = clock_timestamp() FROM ln \
         WHERE c.challenge_id = $1 AND c.consumed_at IS NULL \
         RETURNING c.challenge_id",
        cas::conjunction(CONSUME_PREDS),
        ready = LaneState::Ready.sql()
    )
});

/// The refusal's explanation: each predicate over the same rows, reached from the
/// challenge the ACK names.
static CONSUME_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        CONSUME_PREDS,
        "FROM challenges c LEFT JOIN reservations r ON r.reservation_id = c.reservation_id \
         LEFT JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
         LEFT JOIN assignments a ON a.assignment_id = r.assignment_id \
         LEFT JOIN generations g ON g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = r.generation \
         WHERE c.challenge_id = $1",
    )
});

/// Every expected value of READY → RUNNING (spec §6.2), in diagnosis order; the CAS and
/// its refusal's explanation are both built from it. Parameters: $1 lane incarnation, $2
/// lane, $3 reservation, $4 its epoch, $5 its lease, $6 its deadline, $7 assignment, $8
/// attempt, $9 target, $10 generation, $11 fence digest, $12 challenge, $13 ACK digest,
/// $14 contracts, $15 scope, $16 holds, $17 process identity, $18 completion policy, $19
/// and $20 the leader's timeline and epoch. (The fence token itself is compared in
/// constant time before the CAS binds its digest.)
const ACTIVATE_PREDS: &[Pred] = &[
    Pred {
        sql: "li.lane_incarnation_id = $1",
        category: Category::Mismatch,
        detail: "the lane incarnation is not the reservation's",
    },
    Pred {
        sql: "li.retired_at IS NULL",
        category: Category::Mismatch,
        detail: "lane incarnation was retired (lane recreated)",
    },
    Pred {
        sql: "li.lane_id = $2",
        category: Category::Mismatch,
        detail: "lane id differs",
    },
    Pred {
        sql: "r.reservation_epoch = $4",
        category: Category::Mismatch,
        detail: "reservation_epoch differs from the chain's",
    },
    Pred {
        sql: "a.assignment_id = $7",
        category: Category::Mismatch,
        detail: "assignment_id differs from the chain's",
    },
    Pred {
        sql: "r.assignment_attempt_id = $8",
        category: Category::Mismatch,
        detail: "assignment_attempt_id differs from the chain's",
    },
    Pred {
        sql: concatcp!("li.state = ", LaneState::Ready.sql()),
        category: Category::WrongState,
        detail: "the lane is not READY",
    },
    Pred {
        sql: "r.released_at IS NULL",
        category: Category::WrongState,
        detail: "the reservation was released",
    },
    Pred {
        sql: "(r.restore_checkpoint_digest IS NULL OR r.restored_checkpoint_digest = r.restore_checkpoint_digest)",
        category: Category::Mismatch,
        detail: "the workspace was not restored from the checkpoint its stage named",
    },
    Pred {
        sql: "r.deadline > clock_timestamp()",
        category: Category::Expired,
        detail: "the reservation deadline has passed (database time; equality is expired)",
    },
    Pred {
        sql: "r.sot_incarnation = $19 AND r.coordinator_epoch = $20",
        category: Category::StaleLeader,
        detail: "the chain began under another coordinator epoch",
    },
    Pred {
        sql: concatcp!(
            "a.lifecycle = ",
            Lifecycle::Active.sql(),
            " AND a.requested_outcome IS NULL"
        ),
        category: Category::WrongState,
        detail: "the assignment is no longer advancing",
    },
    Pred {
        sql: concatcp!(
            "g.state = ",
            GenState::Staging.sql(),
            " AND g.stop_requested_at IS NULL"
        ),
        category: Category::WrongState,
        detail: "the generation is stopping or no longer staging",
    },
    Pred {
        sql: "r.reservation_lease_id = $5",
        category: Category::Mismatch,
        detail: "reservation_lease_id differs from the chain's",
    },
    Pred {
        sql: "mosaic_ts(r.deadline) = $6",
        category: Category::Mismatch,
        detail: "reservation_deadline differs from the chain's",
    },
    Pred {
        sql: "a.responsibility_owner = $9 AND a.execution_owner IS NULL AND a.pending_target = $9",
        category: Category::Mismatch,
        detail: "the target is not the responsibility owner and pending target",
    },
    Pred {
        sql: "r.generation = $10",
        category: Category::Mismatch,
        detail: "generation differs from the chain's",
    },
    Pred {
        sql: "r.fence_digest = $11",
        category: Category::FenceMismatch,
        detail: "the presented fence token is not this reservation's",
    },
    Pred {
        sql: "c.challenge_id IS NOT NULL",
        category: Category::Mismatch,
        detail: "challenge_id is not this chain's",
    },
    Pred {
        sql: "c.consumed_at IS NOT NULL",
        category: Category::Mismatch,
        detail: "the challenge was not consumed by an ACK",
    },
    Pred {
        sql: "k.ack_digest = $13",
        category: Category::Mismatch,
        detail: "ack_digest differs from the persisted ACK receipt",
    },
    Pred {
        sql: "r.contracts_digest = $14",
        category: Category::Mismatch,
        detail: "contracts_digest differs from the chain's",
    },
    Pred {
        sql: "a.scope_digest = $15",
        category: Category::Mismatch,
        detail: "scope_digest differs from the assignment's",
    },
    Pred {
        sql: "a.holds_digest = $16",
        category: Category::Mismatch,
        detail: "holds_digest differs from the assignment's",
    },
    Pred {
        sql: "g.process_identity = $17::text::jsonb AND r.process_identity = $17::text::jsonb",
        category: Category::Mismatch,
        detail: "process_identity differs from the staged generation's",
    },
    Pred {
        sql: "a.completion_policy_digest = $18",
        category: Category::Mismatch,
        detail: "completion_policy_digest differs from the assignment's",
    },
    Pred {
        sql: concatcp!("NOT EXISTS (SELECT 1 FROM effect_claims x WHERE x.assignment_id = a.assignment_id AND x.state IN (",
            ClaimState::Admitted.sql(), ", ", ClaimState::Unknown.sql(), "))"),
        category: Category::Unreconciled,
        detail: "an effect claim of an earlier generation of the assignment is not settled yet",
    },
    // A handoff's source or a replaced generation drains with no execution owner: the new
    // generation activates only once every earlier activated (LIVE) one of the work is
    // proven ended (its receipt ingested), so two processes never execute the same work.
    // (One that never activated held no authority and blocks nothing.)
    Pred {
        sql: concatcp!("NOT EXISTS (SELECT 1 FROM reservations r2 JOIN generations g2 \
             ON g2.lane_incarnation_id = r2.lane_incarnation_id AND g2.generation = r2.generation \
             WHERE r2.assignment_id = a.assignment_id AND r2.reservation_id <> r.reservation_id AND g2.state = ",
            GenState::Live.sql(), ")"),
        category: Category::Unreconciled,
        detail: "an earlier activated generation of the assignment has not ended yet (its termination receipt is not in): the new one waits",
    },
];

/// READY → RUNNING over every expected value of spec §6.2.
static ACTIVATE_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE lane_incarnations li SET state = {running} \
         FROM reservations r, assignments a, generations g, challenges c, ack_receipts k \
         WHERE r.reservation_id = $3 AND li.lane_incarnation_id = r.lane_incarnation_id AND a.assignment_id = r.assignment_id \
           AND g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = r.generation \
           AND c.challenge_id = $12 AND c.reservation_id = r.reservation_id AND k.challenge_id = c.challenge_id \
           AND {} \
         RETURNING k.ack_receipt_id, a.scope, a.holds, r.restored_checkpoint_digest",
        cas::conjunction(ACTIVATE_PREDS),
        running = LaneState::Running.sql()
    )
});

/// The refusal's explanation: each predicate over the same rows, reached from the
/// reservation the activation names.
static ACTIVATE_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        ACTIVATE_PREDS,
        "FROM reservations r LEFT JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
         LEFT JOIN assignments a ON a.assignment_id = r.assignment_id \
         LEFT JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
         LEFT JOIN challenges c ON c.challenge_id = $12 AND c.reservation_id = r.reservation_id \
         LEFT JOIN ack_receipts k ON k.challenge_id = c.challenge_id \
         WHERE r.reservation_id = $3",
    )
});

impl Store {
    /// AWAITING_ACK → READY: consumes the challenge exactly once when every bound field
    /// matches the coordinator's state, persisting the immutable ACK receipt in the same
    /// commit. The identical ACK again returns the original receipt; any other ACK for a
    /// consumed challenge is refused.
    pub async fn consume_ack(&self, l: &Leader, a: &AckClaim) -> Result<Receipt, AuthorityError> {
        const OP: &str = "consume-ack";
        let claim = serde_json::to_string(a).map_err(|e| AuthorityError::Invariant {
            op: "consume-ack",
            detail: format!("the ACK claim does not encode: {e}"),
        })?;
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
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 18] = [&a.challenge_id, &a.sot_incarnation, &a.coordinator_epoch,
                    &a.reservation_id, &a.reservation_epoch, &a.reservation_deadline, &a.lane_incarnation_id, &a.lane_id, &a.assignment_id,
                    &a.assignment_attempt_id, &a.generation, &id_text, &a.contracts_digest, &a.scope_digest, &a.holds_digest, &a.runtime_id,
                    &sot, &epoch];
                let d = match f.cas(&CONSUME_CAS, &params).await? {
                    Ok(d) => d,
                    Err(u) => {
                        return Err(u.diagnose(&CONSUME_DIAGNOSIS, &params, CONSUME_PREDS, "no such challenge").await?)
                    }
                };
                let ack_id = format!("ack-{}", uuid::Uuid::new_v4().simple());
                d.exec_one(
                    "INSERT INTO ack_receipts (ack_receipt_id, challenge_id, reservation_id, ack_digest, body) VALUES ($1, $2, $3, $4, $5::text::jsonb)",
                    &[&ack_id, &a.challenge_id, &a.reservation_id, &a.ack_digest, &claim],
                ).await?;
                d.decide(json!({ "challenge_id": a.challenge_id, "ack_receipt_id": ack_id, "ack_digest": a.ack_digest,
                    "generation": a.generation, "to": LaneState::Ready }))
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
                    Some(s) if !sec.fence_matches(&x.fence_token, &s.col::<String>("fence_digest")?) => {
                        return Err(reject(OP, Category::FenceMismatch, "the presented fence token is not this reservation's"))
                    }
                    Some(_) => {}
                }
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 20] = [&c.lane_incarnation_id, &c.lane_id, &c.reservation_id,
                    &c.reservation_epoch, &x.reservation_lease_id, &x.reservation_deadline, &c.assignment_id, &c.assignment_attempt_id,
                    &x.target, &x.generation, &fence, &x.challenge_id, &x.ack_digest, &x.contracts_digest, &x.scope_digest,
                    &x.holds_digest, &id_text, &x.completion_policy_digest, &sot, &epoch];
                let d = match f.cas(&ACTIVATE_CAS, &params).await? {
                    Ok(d) => d,
                    Err(u) => {
                        return Err(u.diagnose(&ACTIVATE_DIAGNOSIS, &params, ACTIVATE_PREDS, "no such reservation").await?)
                    }
                };
                let ack_receipt: String = d.row().col("ack_receipt_id")?;
                let restored: Option<String> = d.row().col("restored_checkpoint_digest")?;
                let scope: serde_json::Value = d.row().col("scope")?;
                let holds: serde_json::Value = d.row().col("holds")?;
                let held: Vec<String> = holds.as_array().map(|h| h.iter().filter_map(|v| v.as_str().map(String::from)).collect()).unwrap_or_default();
                let capabilities: Vec<String> = scope.as_array().into_iter().flatten().filter_map(|v| v.as_str())
                    .filter(|c| !held.iter().any(|h| h == c)).map(String::from).collect();
                let ttl = format!("{} milliseconds", x.lease_ttl_ms);
                // Owners, the generation and one lease per capability in one statement; the
                // counts prove the owner and generation updates each hit their one row.
                let out = d.query_one(
                    concatcp!("WITH a AS (UPDATE assignments a SET execution_owner = $2, pending_target = NULL, next_action = 'run the task under its contract', \
                                       watchdog_step = ", WatchdogStep::None.sql(), ", inactivity_base_at = clock_timestamp(), \
                                       inactivity_deadline = clock_timestamp() + pol.replace_after_ms * interval '1 millisecond' \
                                FROM inactivity_policies pol WHERE a.assignment_id = $1 AND pol.policy_id = a.inactivity_policy RETURNING 1), \
                          g AS (UPDATE generations SET state = ", GenState::Live.sql(), " WHERE lane_incarnation_id = $3 AND generation = $4 RETURNING 1), \
                          s AS (INSERT INTO leases (lease_id, scope, lease_epoch, assignment_id, assignment_attempt_id, lane_incarnation_id, generation, \
                                                    reservation_id, sot_incarnation, coordinator_epoch, expires_at) \
                                SELECT 'ls-' || replace(gen_random_uuid()::text, '-', ''), cap, 1, $1, $5, $3, $4, $6, $7, $8, clock_timestamp() + $9::text::interval \
                                FROM unnest($10::text[]) AS cap RETURNING lease_id, scope, mosaic_ts(expires_at) AS exp) \
                     SELECT (SELECT count(*) FROM a) AS owners, (SELECT count(*) FROM g) AS generations, \
                            coalesce((SELECT jsonb_agg(jsonb_build_object('lease_id', lease_id, 'scope', scope, 'expires_at', exp) ORDER BY scope) FROM s), '[]'::jsonb) AS leases"),
                    &[&c.assignment_id, &x.target, &c.lane_incarnation_id, &x.generation, &c.assignment_attempt_id, &c.reservation_id, &sot, &epoch, &ttl, &capabilities],
                ).await?;
                if (out.col::<i64>("owners")?, out.col::<i64>("generations")?) != (1, 1) {
                    return Err(AuthorityError::Invariant { op: "activate", detail: "the owner or generation update missed its row".into() });
                }
                let leases: serde_json::Value = out.col("leases")?;
                d.decide(json!({
                    "chain": c, "generation": x.generation, "to": LaneState::Running, "execution_owner": x.target, "pending_target": null,
                    "ack_receipt_id": ack_receipt, "leases": leases, "restored_checkpoint_digest": restored }))
            }),
        )
        .await
    }
}
