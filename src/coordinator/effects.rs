//! Effect claims (spec §5.5): a host's broker dispatches a protected effect only once one
//! fenced compare-and-swap here has admitted its claim, and reports what it observed
//! afterwards.
//!
//! - [`Store::admit_effect`]: the claim CAS. It admits only for the RUNNING generation of
//!   an active chain whose execution owner is set and matches, under an unreleased,
//!   unexpired lease for a scope entry that licenses the effect's target, with no earlier
//!   claim of the assignment left unknown. Its idempotency key (`effect/<assignment>/<key>`)
//!   is bound to the operation for good: the same key with the same operation returns the
//!   original admission (and the claim as it stands now); another operation under it is
//!   refused (`idempotency-conflict`), and the caller quarantines the lane
//!   ([`Store::quarantine_for_substitution`]).
//! - [`Store::record_effect_result`]: what the broker observed (completed, failed, aborted,
//!   not dispatched), with the answer's token usage; a late observation of a claim already
//!   unknown reconciles it.
//! - [`settle_at_end`]: inside the transition that ingests a generation's termination
//!   receipt, every claim of that generation still admitted is settled — by what the
//!   receipt says the broker observed, else by its executor's rule (a provider call is
//!   reconciled, anything else becomes unknown with the operator as its owner).
//! - [`Store::resolve_effect`]: the owner's way out of an unknown outcome.
//!
//! **Never:** admits anything by itself (no claim without the CAS), holds a transaction
//! across a dispatch (the broker dispatches after the commit), keeps an effect's content
//! (digests only), or retries an effect.

use std::sync::LazyLock;

use const_format::concatcp;
use serde::Serialize;
use serde_json::json;

use super::cas::{self, Pred};
use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::rows::RowExt;
use super::states::{ClaimState, GenState, LaneState, Lifecycle, WorkStatus};
use super::store::Store;
use super::txn::{body, request_digest, Decided, Receipt, Step};
use crate::protocol::effects::{self, Executor, OnUnknown, Outcome, Target};

/// One claim as a host's broker presents it, after the chain it names was checked to be
/// the host's own (`hosts::owned`: lane, incarnation, assignment, attempt, generation,
/// timeline, fence commitment).
#[derive(Debug, Clone)]
pub struct EffectClaim {
    pub chain: Chain,
    pub generation: i64,
    pub target: Target,
    pub idempotency_key: String,
    pub operation_digest: String,
    pub responsibility_owner: String,
    pub execution_owner: String,
    pub process_identity: serde_json::Value,
    /// The fence reference the host showed (the stage's commitment, never a token).
    pub fence_reference: String,
    pub scope_digest: String,
    pub holds_digest: String,
}

/// What the claim CAS answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Admission {
    pub effect_id: String,
    pub lease_id: String,
    pub lease_epoch: i64,
    /// The claim as it stands now: `ADMITTED` for a fresh admission; for a repeat of an
    /// earlier claim, whatever became of it (a broker dispatches only a fresh one).
    pub state: ClaimState,
    /// True when this is the original admission returned again (same key, same operation).
    pub replayed: bool,
    pub result_digest: Option<String>,
    /// A fresh admission's database time, and the end of the window its broker has to
    /// dispatch it (`VERDICT_TTL`); `None` for a repeat.
    pub window: Option<(String, String)>,
}

/// How long a fresh admission's verdict is good for (database time): a broker that learns
/// of it later does not dispatch it.
pub const VERDICT_TTL: &str = "30 seconds";

/// What a broker observed of one effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub effect_id: String,
    pub outcome: Outcome,
    pub result_digest: String,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
}

impl Observed {
    /// From one entry of a termination receipt's `effects` list; `None` for an entry that
    /// is not exactly that shape (it then counts as unobserved).
    pub fn from_receipt_entry(v: &serde_json::Value) -> Option<Self> {
        let tokens = |k: &str| match v.get(k) {
            None | Some(serde_json::Value::Null) => Some(None),
            Some(t) => t.as_i64().filter(|n| *n >= 0).map(Some),
        };
        let digest = v.get("result_digest")?.as_str()?;
        if !crate::protocol::envelope::is_digest(digest) {
            return None;
        }
        Some(Self {
            effect_id: v.get("effect_id")?.as_str()?.to_string(),
            outcome: Outcome::parse(v.get("outcome")?.as_str()?)?,
            result_digest: digest.to_string(),
            input_tokens: tokens("input_tokens")?,
            output_tokens: tokens("output_tokens")?,
        })
    }
}

/// Every expected value of the claim CAS, in diagnosis order. Parameters: $1 effect id, $2
/// idempotency key, $3 operation digest, $4 executor, $5 sink class, $6 target, $7 the
/// leader's timeline, $8 its epoch, $9 responsibility owner, $10 execution owner, $11
/// assignment, $12 attempt, $13 lane, $14 lane incarnation, $15 generation, $16
/// reservation, $17 process identity (JSON text), $18 its digest, $19 fence reference,
/// $20 scope digest, $21 holds digest, $22 the scope entries that license the target.
const ADMIT_PREDS: &[Pred] = &[
    Pred {
        sql: "li.lane_incarnation_id = $14 AND li.lane_id = $13 AND li.retired_at IS NULL",
        category: Category::WrongState,
        detail: "the lane incarnation is not current",
    },
    Pred {
        sql: "a.assignment_id = $11 AND r.assignment_attempt_id = $12 AND r.generation = $15",
        category: Category::Mismatch,
        detail: "the assignment, attempt or generation is not the chain's",
    },
    Pred {
        sql: "r.sot_incarnation = $7",
        category: Category::WrongState,
        detail: "the chain is of another authority timeline",
    },
    Pred {
        sql: concatcp!("a.lifecycle = ", Lifecycle::Active.sql(), " AND a.requested_outcome IS NULL"),
        category: Category::WrongState,
        detail: "the work is not active, or its end was requested: admission is closed",
    },
    Pred {
        sql: concatcp!("a.work_status IN (", WorkStatus::Active.sql(), ", ", WorkStatus::Blocked.sql(), ")"),
        category: Category::WrongState,
        detail: "a handoff of the work is pending: the source's admission is fenced",
    },
    Pred {
        sql: "a.execution_owner IS NOT NULL",
        category: Category::WrongState,
        detail: "the work has no execution owner: no effect is admissible",
    },
    Pred {
        sql: "a.execution_owner = $10 AND a.responsibility_owner = $9",
        category: Category::WrongState,
        detail: "the claim's execution or responsibility owner is not the work's",
    },
    Pred {
        sql: "r.released_at IS NULL",
        category: Category::WrongState,
        detail: "the chain's reservation was released (its generation is fenced)",
    },
    Pred {
        sql: concatcp!("li.state = ", LaneState::Running.sql()),
        category: Category::WrongState,
        detail: "the lane is not RUNNING",
    },
    Pred {
        sql: concatcp!("g.state = ", GenState::Live.sql(), " AND g.stop_requested_at IS NULL"),
        category: Category::WrongState,
        detail: "the generation is not live, or is being stopped",
    },
    Pred {
        sql: "g.process_identity = $17::text::jsonb",
        category: Category::Mismatch,
        detail: "the process identity is not the generation's",
    },
    Pred {
        sql: "a.scope_digest = $20 AND a.holds_digest = $21",
        category: Category::Mismatch,
        detail: "the scope or holds digest is not the assignment's",
    },
    Pred {
        sql: "ls.lease_id IS NOT NULL",
        category: Category::OutOfScope,
        detail: "the assignment's scope does not license this effect (or its holds withhold it)",
    },
    Pred {
        sql: "ls.released_at IS NULL",
        category: Category::WrongState,
        detail: "the lease that licenses this effect was revoked",
    },
    Pred {
        sql: "ls.expires_at > clock_timestamp()",
        category: Category::Expired,
        detail: "the lease that licenses this effect expired (database time; equality is expired)",
    },
    Pred {
        sql: concatcp!("NOT EXISTS (SELECT 1 FROM effect_claims x WHERE x.assignment_id = a.assignment_id AND x.state = ",
            ClaimState::Unknown.sql(), ")"),
        category: Category::Unreconciled,
        detail: "an earlier effect claim of the assignment has an unknown outcome: it must be resolved first",
    },
];

/// The lease a claim is admitted under: of the chain's reservation, for one of the scope
/// entries that license the target, a live one first.
const LEASE_OF: &str = "LEFT JOIN LATERAL (SELECT s.lease_id, s.lease_epoch, s.released_at, s.expires_at FROM leases s \
       WHERE s.reservation_id = r.reservation_id AND s.scope = ANY($22::text[]) \
       ORDER BY (s.released_at IS NULL AND s.expires_at > clock_timestamp()) DESC, s.scope LIMIT 1) ls ON true";

static ADMIT_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO effect_claims (effect_id, idempotency_key, operation_digest, executor, sink_class, target, sot_incarnation, \
             coordinator_epoch, lease_id, lease_epoch, responsibility_owner, execution_owner, assignment_id, assignment_attempt_id, \
             lane_id, lane_incarnation_id, generation, reservation_id, process_identity_digest, fence_reference, scope_digest, holds_digest) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, ls.lease_id, ls.lease_epoch, $9, $10, a.assignment_id, r.assignment_attempt_id, \
             li.lane_id, li.lane_incarnation_id, g.generation, r.reservation_id, $18, $19, a.scope_digest, a.holds_digest \
         FROM reservations r JOIN assignments a ON a.assignment_id = r.assignment_id \
         JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
         JOIN generations g ON g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = r.generation \
         {LEASE_OF} \
         WHERE r.reservation_id = $16 AND {} \
         RETURNING effect_id, lease_id, lease_epoch, mosaic_ts(clock_timestamp()) AS admitted_at, \
             mosaic_ts(clock_timestamp() + interval '{VERDICT_TTL}') AS dispatch_until",
        cas::conjunction(ADMIT_PREDS),
    )
});

/// The refusal's explanation: each predicate over the same rows, reached from the
/// reservation the claim names (the parameters no predicate reads are bound all the same).
static ADMIT_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        ADMIT_PREDS,
        &format!(
            "FROM reservations r LEFT JOIN assignments a ON a.assignment_id = r.assignment_id \
             LEFT JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
             LEFT JOIN generations g ON g.lane_incarnation_id = li.lane_incarnation_id AND g.generation = r.generation \
             {LEASE_OF} \
             WHERE r.reservation_id = $16 \
               AND num_nonnulls($1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $8::bigint, $18::text, $19::text) >= 0"
        ),
    )
});

/// The claim's current row, for an admission returned again.
const CLAIM_NOW: &str = "SELECT effect_id, lease_id, lease_epoch, state, result_digest FROM effect_claims WHERE effect_id = $1";

impl Store {
    /// The claim CAS (see the module docs). A refused claim changes nothing; an
    /// `idempotency-conflict` refusal means the key was bound to another operation.
    pub async fn admit_effect(
        &self,
        l: &Leader,
        x: &EffectClaim,
    ) -> Result<Admission, AuthorityError> {
        const OP: &str = "admit-effect";
        if !effects::key_ok(&x.idempotency_key)
            || !crate::protocol::envelope::is_digest(&x.operation_digest)
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "a claim needs an idempotency key of letters, digits and . _ : - / (at most 200) and a sha256 operation digest",
            ));
        }
        let c = &x.chain;
        let executor = x.target.executor();
        let effect_id = effects::effect_id(&c.assignment_id, &x.idempotency_key);
        let target = x.target.text();
        // Bound for good: the key names this operation and no other.
        let step = Step::new(
            OP,
            l,
            format!("effect/{}/{}", c.assignment_id, x.idempotency_key),
            request_digest(OP, &[executor.as_str(), &target, &x.operation_digest]),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let id_text = x.process_identity.to_string();
        let id_digest = format!(
            "sha256:{}",
            crate::util::sha256_hex("mosaic/process-identity/v1", &[id_text.as_bytes()])
        );
        let licenses = x.target.licensed_by(&c.assignment_id);
        let (x, sot, epoch) = (x.clone(), l.sot().to_string(), l.epoch());
        let sink = executor.sink_class().as_str();
        let r = self
            .transition(
                &step,
                body!([x, sot, effect_id, target, id_text, id_digest, licenses] |f| {
                    let c = &x.chain;
                    let exec = executor.as_str();
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 22] = [&effect_id, &x.idempotency_key,
                        &x.operation_digest, &exec, &sink, &target, &sot, &epoch, &x.responsibility_owner, &x.execution_owner,
                        &c.assignment_id, &c.assignment_attempt_id, &c.lane_id, &c.lane_incarnation_id, &x.generation,
                        &c.reservation_id, &id_text, &id_digest, &x.fence_reference, &x.scope_digest, &x.holds_digest, &licenses];
                    let d = match f.cas(&ADMIT_CAS, &params).await? {
                        Ok(d) => d,
                        Err(u) => {
                            return Err(u.diagnose(&ADMIT_DIAGNOSIS, &params, ADMIT_PREDS, "no such reservation").await?)
                        }
                    };
                    let (lease_id, lease_epoch): (String, i64) = (d.row().col("lease_id")?, d.row().col("lease_epoch")?);
                    let (at, until): (String, String) = (d.row().col("admitted_at")?, d.row().col("dispatch_until")?);
                    d.decide(json!({ "effect_id": effect_id, "executor": exec, "target": target, "lease_id": lease_id,
                        "lease_epoch": lease_epoch, "generation": x.generation, "operation_digest": x.operation_digest,
                        "admitted_at": at, "dispatch_until": until }))
                }),
            )
            .await?;
        let effect_id = r.str("effect_id")?;
        if !r.replayed {
            return Ok(Admission {
                effect_id,
                lease_id: r.str("lease_id")?,
                lease_epoch: r.int("lease_epoch")?,
                state: ClaimState::Admitted,
                replayed: false,
                result_digest: None,
                window: Some((r.str("admitted_at")?, r.str("dispatch_until")?)),
            });
        }
        // The same claim presented again: what became of it is the answer.
        let c = self.pool.get().await?;
        let row = c
            .query_opt(CLAIM_NOW, &[&effect_id])
            .await?
            .ok_or_else(|| AuthorityError::Invariant {
                op: OP,
                detail: format!("claim {effect_id} has a receipt but no row"),
            })?;
        Ok(Admission {
            effect_id,
            lease_id: row.col("lease_id")?,
            lease_epoch: row.col("lease_epoch")?,
            state: row.col("state")?,
            replayed: true,
            result_digest: row.col("result_digest")?,
            window: None,
        })
    }

    /// What the broker observed of an admitted claim, from the generation that made it. A
    /// claim already unknown (its generation's end was ingested first) is reconciled by
    /// the observation; a settled one is not changed again.
    pub async fn record_effect_result(
        &self,
        l: &Leader,
        chain: &Chain,
        generation: i64,
        o: &Observed,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "effect-result";
        if !crate::protocol::envelope::is_digest(&o.result_digest)
            || o.input_tokens.is_some_and(|t| t < 0)
            || o.output_tokens.is_some_and(|t| t < 0)
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "a result needs a sha256 digest and non-negative token counts",
            ));
        }
        let tokens = |t: Option<i64>| t.map(|n| n.to_string()).unwrap_or_default();
        let step = Step::new(
            OP,
            l,
            format!("effect-result/{}", o.effect_id),
            request_digest(
                OP,
                &[
                    o.outcome.as_str(),
                    &o.result_digest,
                    &tokens(o.input_tokens),
                    &tokens(o.output_tokens),
                ],
            ),
        )
        .about(Some(&chain.assignment_id), Some(&chain.lane_incarnation_id));
        let (o, inc) = (o.clone(), chain.lane_incarnation_id.clone());
        self.transition(
            &step,
            body!([o, inc] |f| {
                let observed = ClaimState::observed(o.outcome);
                let late = format!("observed-late: {}", o.outcome);
                let d = f.cas(
                    concatcp!("UPDATE effect_claims SET \
                         state = CASE WHEN state = ", ClaimState::Unknown.sql(), " THEN ", ClaimState::Reconciled.sql(), " ELSE $4 END, \
                         reconciliation = CASE WHEN state = ", ClaimState::Unknown.sql(), " THEN $8 END, \
                         result_digest = $5, input_tokens = $6, output_tokens = $7, resolved_at = clock_timestamp() \
                     WHERE effect_id = $1 AND lane_incarnation_id = $2 AND generation = $3 \
                       AND state IN (", ClaimState::Admitted.sql(), ", ", ClaimState::Unknown.sql(), ") \
                     RETURNING state, assignment_id"),
                    &[&o.effect_id, &inc, &generation, &observed, &o.result_digest, &o.input_tokens, &o.output_tokens, &late],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let known = u.read_opt("SELECT state FROM effect_claims WHERE effect_id = $1 AND lane_incarnation_id = $2 AND generation = $3",
                            &[&o.effect_id, &inc, &generation]).await?;
                        return Err(match known {
                            None => u.reject(Category::NotFound, "no claim of this generation has that effect id").await?,
                            Some(_) => u.reject(Category::WrongState, "the claim is already settled").await?,
                        });
                    }
                };
                let state: ClaimState = d.row().col("state")?;
                d.decide(json!({ "effect_id": o.effect_id, "generation": generation, "outcome": o.outcome.as_str(),
                    "state": state, "result_digest": o.result_digest, "input_tokens": o.input_tokens, "output_tokens": o.output_tokens }))
            }),
        )
        .await
    }

    /// The reconciliation owner settles a claim whose outcome was unknown, with the digest
    /// of the evidence that decided it (what the sink shows now).
    pub async fn resolve_effect(
        &self,
        l: &Leader,
        effect_id: &str,
        applied: bool,
        evidence_digest: &str,
        request_id: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "resolve-effect";
        if !crate::protocol::envelope::is_digest(evidence_digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "resolving a claim needs the sha256 digest of its evidence",
            ));
        }
        let verdict = if applied { "applied" } else { "not applied" };
        let step = Step::new(
            OP,
            l,
            format!("resolve-effect/{effect_id}/{request_id}"),
            request_digest(OP, &[effect_id, verdict, evidence_digest]),
        );
        let (id, how) = (
            effect_id.to_string(),
            format!("operator: {verdict} (evidence {evidence_digest})"),
        );
        self.transition(
            &step,
            body!([id, how] |f| {
                let d = f.cas(
                    concatcp!("UPDATE effect_claims SET state = ", ClaimState::Reconciled.sql(), ", reconciliation = $2, resolved_at = clock_timestamp() \
                     WHERE effect_id = $1 AND state = ", ClaimState::Unknown.sql(), " RETURNING assignment_id, lane_incarnation_id"),
                    &[&id, &how],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let known = u.read_opt("SELECT state FROM effect_claims WHERE effect_id = $1", &[&id]).await?;
                        return Err(match known {
                            None => u.reject(Category::NotFound, "no such effect claim").await?,
                            Some(_) => u.reject(Category::WrongState, "only a claim whose outcome is unknown is resolved by hand").await?,
                        });
                    }
                };
                let assignment: String = d.row().col("assignment_id")?;
                d.decide(json!({ "effect_id": id, "assignment_id": assignment, "reconciliation": how, "state": ClaimState::Reconciled }))
            }),
        )
        .await
    }

    /// The lane whose generation presented another operation under a bound idempotency key
    /// is quarantined (spec §5.5: "rejects and quarantines"): its leases and reservation
    /// released, its generation told to stop, its work to recovery.
    pub async fn quarantine_for_substitution(
        &self,
        l: &Leader,
        chain: &Chain,
        idempotency_key: &str,
        operation_digest: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "effect-substitution";
        let step = Step::new(
            OP,
            l,
            format!(
                "effect-substitution/{}/{idempotency_key}/{operation_digest}",
                chain.assignment_id
            ),
            request_digest(OP, &[&chain.key(), idempotency_key, operation_digest]),
        )
        .about(Some(&chain.assignment_id), Some(&chain.lane_incarnation_id));
        let c = chain.clone();
        let reason = "a generation presented another operation under an effect idempotency key already bound"
            .to_string();
        self.transition(
            &step,
            body!(
                [c, reason] | f | {
                    let d = f
                        .cas(
                            concatcp!(
                                "UPDATE lane_incarnations SET state = ",
                                LaneState::Quarantined.sql(),
                                ", quarantine_reason = $2 \
                     WHERE lane_incarnation_id = $1 AND retired_at IS NULL AND state <> ",
                                LaneState::Quarantined.sql(),
                                " RETURNING 1"
                            ),
                            &[&c.lane_incarnation_id, &reason],
                        )
                        .await?;
                    let d = match d {
                        Ok(d) => d,
                        Err(u) => {
                            return Err(u
                                .reject(
                                    Category::WrongState,
                                    "the lane is already quarantined or retired",
                                )
                                .await?)
                        }
                    };
                    super::ending::quarantine_follow_ups(&d, &c.lane_incarnation_id, &reason)
                        .await?;
                    d.decide(json!({ "chain": c, "to": LaneState::Quarantined, "reason": reason }))
                }
            ),
        )
        .await
    }

    /// Claims, newest first (`assignment`: of that assignment only), for status and the
    /// `effects` command. Digests and identifiers only.
    pub async fn effect_claims(
        &self,
        assignment: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ClaimView>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT effect_id, assignment_id, lane_id, generation, executor, sink_class, target, state, operation_digest, \
                        result_digest, input_tokens, output_tokens, reconciliation, reconciliation_owner, lease_id, lease_epoch, \
                        mosaic_ts(admitted_at) AS admitted_at, mosaic_ts(resolved_at) AS resolved_at \
                 FROM effect_claims WHERE ($1::text IS NULL OR assignment_id = $1) ORDER BY admitted_at DESC LIMIT $2",
                &[&assignment, &limit],
            )
            .await?;
        rows.iter().map(ClaimView::from_row).collect()
    }

    /// Per assignment: claims by state, and the token usage its provider calls reported.
    pub async fn effect_usage(&self) -> Result<Vec<UsageView>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                concatcp!("SELECT assignment_id, count(*) AS claims, \
                        count(*) FILTER (WHERE state IN (", ClaimState::Admitted.sql(), ", ", ClaimState::Unknown.sql(), ")) AS open, \
                        count(*) FILTER (WHERE state = ", ClaimState::Unknown.sql(), ") AS unknown, \
                        coalesce(sum(input_tokens), 0)::bigint AS input_tokens, coalesce(sum(output_tokens), 0)::bigint AS output_tokens \
                 FROM effect_claims GROUP BY assignment_id"),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(UsageView {
                    assignment_id: r.col("assignment_id")?,
                    claims: r.col("claims")?,
                    open: r.col("open")?,
                    unknown: r.col("unknown")?,
                    input_tokens: r.col("input_tokens")?,
                    output_tokens: r.col("output_tokens")?,
                })
            })
            .collect()
    }
}

/// One claim, as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimView {
    pub effect_id: String,
    pub assignment_id: String,
    pub lane_id: String,
    pub generation: i64,
    pub executor: String,
    pub sink_class: String,
    pub target: String,
    pub state: ClaimState,
    pub operation_digest: String,
    pub result_digest: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub reconciliation: Option<String>,
    pub reconciliation_owner: Option<String>,
    pub lease_id: String,
    pub lease_epoch: i64,
    pub admitted_at: String,
    pub resolved_at: Option<String>,
}

impl ClaimView {
    fn from_row(r: &tokio_postgres::Row) -> Result<Self, AuthorityError> {
        Ok(Self {
            effect_id: r.col("effect_id")?,
            assignment_id: r.col("assignment_id")?,
            lane_id: r.col("lane_id")?,
            generation: r.col("generation")?,
            executor: r.col("executor")?,
            sink_class: r.col("sink_class")?,
            target: r.col("target")?,
            state: r.col("state")?,
            operation_digest: r.col("operation_digest")?,
            result_digest: r.col("result_digest")?,
            input_tokens: r.col("input_tokens")?,
            output_tokens: r.col("output_tokens")?,
            reconciliation: r.col("reconciliation")?,
            reconciliation_owner: r.col("reconciliation_owner")?,
            lease_id: r.col("lease_id")?,
            lease_epoch: r.col("lease_epoch")?,
            admitted_at: r.col("admitted_at")?,
            resolved_at: r.col("resolved_at")?,
        })
    }
}

/// One assignment's claims and token usage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageView {
    pub assignment_id: String,
    pub claims: i64,
    pub open: i64,
    pub unknown: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
}

/// How the claims of an ended generation were settled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SettledAtEnd {
    /// Settled by what the receipt says the broker observed.
    pub observed: u64,
    /// Reconciled by their executor's rule.
    pub reconciled: u64,
    /// Left unknown, for their reconciliation owner.
    pub unknown: u64,
}

/// Inside the transition that ends `generation` of `inc` (its termination receipt's
/// ingestion): every claim of it still admitted is settled, by `observed` first (what the
/// receipt carries), then by its executor's rule.
pub(crate) async fn settle_at_end(
    d: &Decided<'_>,
    inc: &str,
    generation: i64,
    observed: &[Observed],
) -> Result<SettledAtEnd, AuthorityError> {
    let mut out = SettledAtEnd::default();
    for o in observed {
        out.observed += d
            .exec(
                concatcp!(
                    "UPDATE effect_claims SET state = $4, result_digest = $5, input_tokens = $6, output_tokens = $7, \
                     resolved_at = clock_timestamp() \
                 WHERE effect_id = $1 AND lane_incarnation_id = $2 AND generation = $3 AND state = ",
                    ClaimState::Admitted.sql()
                ),
                &[
                    &o.effect_id,
                    &inc,
                    &generation,
                    &ClaimState::observed(o.outcome),
                    &o.result_digest,
                    &o.input_tokens,
                    &o.output_tokens,
                ],
            )
            .await?;
    }
    // Every executor's rule in one statement: an unobserved claim is reconciled for its
    // executor's reason or left unknown for the operator (one round trip, not one per
    // executor: issue 22).
    let (mut executors, mut reconcile, mut why) = (vec![], vec![], vec![]);
    for executor in Executor::ALL {
        executors.push(executor.as_str());
        match executor.on_unknown() {
            OnUnknown::ReconcileAtEnd(w) => {
                reconcile.push(true);
                why.push(Some(w));
            }
            OnUnknown::Operator => {
                reconcile.push(false);
                why.push(None);
            }
        }
    }
    let settled = d
        .query(
            concatcp!(
                "UPDATE effect_claims e SET \
                   state = CASE WHEN x.reconcile THEN ", ClaimState::Reconciled.sql(), " ELSE ", ClaimState::Unknown.sql(), " END, \
                   reconciliation = CASE WHEN x.reconcile THEN x.why ELSE e.reconciliation END, \
                   reconciliation_owner = CASE WHEN x.reconcile THEN e.reconciliation_owner ELSE $6 END, \
                   resolved_at = CASE WHEN x.reconcile THEN clock_timestamp() ELSE e.resolved_at END \
                 FROM unnest($3::text[], $4::bool[], $5::text[]) AS x(executor, reconcile, why) \
                 WHERE e.lane_incarnation_id = $1 AND e.generation = $2 AND e.executor = x.executor AND e.state = ",
                ClaimState::Admitted.sql(),
                " RETURNING x.reconcile"
            ),
            &[&inc, &generation, &executors, &reconcile, &why, &effects::RECONCILIATION_OWNER],
        )
        .await?;
    for row in settled {
        if row.col::<bool>("reconcile")? {
            out.reconciled += 1;
        } else {
            out.unknown += 1;
        }
    }
    Ok(out)
}

/// How many claims of `assignment` are not settled (admitted and unobserved, or unknown).
pub(crate) async fn open_claims(d: &Decided<'_>, assignment: &str) -> Result<i64, AuthorityError> {
    d.query_one(
        concatcp!(
            "SELECT count(*) AS n FROM effect_claims WHERE assignment_id = $1 AND state IN (",
            ClaimState::Admitted.sql(),
            ", ",
            ClaimState::Unknown.sql(),
            ")"
        ),
        &[&assignment],
    )
    .await?
    .col("n")
}
