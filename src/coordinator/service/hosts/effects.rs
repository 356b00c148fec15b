//! A host broker's effect claims and results (spec §5.5): each claim answered with an
//! `effect_verdict` — admitted, settled before, or refused — and each result with recorded
//! or not recorded. A claim that reuses a bound key for another operation is refused and
//! its lane quarantined.
//!
//! **Never:** admits a claim without the claim CAS, or answers "admitted" for a claim the
//! CAS did not admit just now (a repeat is "settled", and its broker does not dispatch).

use super::*;
use crate::coordinator::effects::{EffectClaim, Observed};
use crate::coordinator::service::driver::Proof;
use crate::protocol::effects::{self, Executor, Outcome, Target};
use crate::protocol::messages::{Effect, EffectAnswer, EffectResult, EffectVerdict};

/// How long an admission's verdict stays valid for the host (coordinator time): a verdict
/// that arrives later is refused by the link, and its broker reports the claim not
/// dispatched.
pub(crate) const VERDICT_TTL_MS: i64 = 30_000;

impl Service {
    /// A claim: checked against the host's own chain (lane, incarnation, assignment,
    /// attempt, generation, timeline, fence commitment), its executor and target read
    /// against the registry, then the claim CAS. Returns the verdict to send, and whether
    /// the claim was hostile (an unregistered executor, a malformed target, an effect id
    /// that is not its key's: a broker never sends one).
    pub(super) async fn on_effect(&self, host: &str, m: Effect) -> (Vec<Outgoing>, Option<String>) {
        let l = match self.leader().await {
            Ok(l) => l,
            Err(_) => return (vec![], None), // no leader: the broker times out, nothing admitted
        };
        let c = match self.chain_for(host, &l, &m.chain).await {
            Ok(c) => c,
            Err(e) => {
                self.refusal_audit(
                    host,
                    "host-effect",
                    &m.chain.assignment_id,
                    e.category,
                    &e.message,
                );
                let hostile =
                    hostile(e.category).then(|| format!("refused-{}", e.category.as_str()));
                return (vec![], hostile);
            }
        };
        let refused = |category: Category, why: &str| {
            self.refusal_audit(host, "host-effect", &m.chain.assignment_id, category, why);
            (
                EffectAnswer::Refused {
                    category: category.as_str().into(),
                },
                Some(format!("refused-{}", category.as_str())),
            )
        };
        let checked = match Executor::parse(&m.executor) {
            None => Err(refused(
                Category::BadInput,
                &format!(
                    "unknown executor (registered: {})",
                    Executor::ALL.map(|e| e.as_str()).join(", ")
                ),
            )),
            Some(_)
                if m.effect_id
                    != effects::effect_id(&m.chain.assignment_id, &m.idempotency_key) =>
            {
                Err(refused(
                    Category::BadInput,
                    "the effect id is not the one its key names",
                ))
            }
            Some(executor) => Target::parse(executor, &m.target)
                .map_err(|e| refused(Category::BadInput, &e.to_string())),
        };
        let target = match checked {
            Ok(t) => t,
            Err((answer, hostile)) => {
                let v = self
                    .verdict(&l, &c, &m.effect_id, answer, &m.idempotency_key, None)
                    .await;
                return (v.into_iter().collect(), hostile);
            }
        };
        let executor = target.executor();
        let claim = EffectClaim {
            chain: c.chain.clone(),
            generation: m.chain.generation as i64,
            target,
            idempotency_key: m.idempotency_key.clone(),
            operation_digest: m.operation_digest.clone(),
            responsibility_owner: m.responsibility_owner.clone(),
            execution_owner: m.execution_owner.clone(),
            process_identity: m.process_identity.clone(),
            fence_reference: m.chain.fence_proof.clone(),
            scope_digest: m.bound.digests.scope_digest.clone(),
            holds_digest: m.bound.digests.holds_digest.clone(),
        };
        let mut window = None;
        let answer = match self.store.admit_effect(&l, &claim).await {
            Ok(a) if !a.replayed => {
                self.metrics.effect(executor.as_str(), "admitted");
                window = a.window;
                EffectAnswer::Admitted {
                    lease_id: a.lease_id,
                    lease_epoch: a.lease_epoch.max(0) as u64,
                }
            }
            Ok(a) => {
                self.metrics.effect(executor.as_str(), "settled");
                EffectAnswer::Settled {
                    claim_state: a.state.as_str().into(),
                    result_digest: a.result_digest,
                }
            }
            Err(e) => match e.category() {
                Some(Category::IdempotencyConflict) => {
                    self.metrics.effect(executor.as_str(), "substituted");
                    tracing::error!(host, lane_id = %c.chain.lane_id, assignment_id = %c.chain.assignment_id,
                        "an effect key bound to one operation was presented for another: the lane is quarantined");
                    match self
                        .store
                        .quarantine_for_substitution(
                            &l,
                            &c.chain,
                            &claim.idempotency_key,
                            &claim.operation_digest,
                        )
                        .await
                    {
                        Ok(_) => {
                            self.bump();
                            let _ = self.advance(&l, &c.chain.reservation_id).await;
                        }
                        Err(q) => {
                            tracing::warn!(error = %q, "the substitution's quarantine was not applied")
                        }
                    }
                    EffectAnswer::Refused {
                        category: Category::IdempotencyConflict.as_str().into(),
                    }
                }
                Some(cat) => {
                    self.metrics
                        .effect(executor.as_str(), &format!("refused-{}", cat.as_str()));
                    EffectAnswer::Refused {
                        category: cat.as_str().into(),
                    }
                }
                // The database or a bug: no answer. The broker gives up waiting and reports the
                // claim not dispatched, whatever committed.
                None => {
                    tracing::warn!(host, error = %e, "effect claim not decided");
                    return (vec![], None);
                }
            },
        };
        (
            self.verdict(&l, &c, &m.effect_id, answer, &m.idempotency_key, window)
                .await
                .into_iter()
                .collect(),
            None,
        )
    }

    /// A result: recorded, or not recorded for good (the broker stops reporting it). A
    /// database fault gives no answer; the broker reports it again.
    pub(super) async fn on_effect_result(
        &self,
        host: &str,
        m: EffectResult,
    ) -> (Vec<Outgoing>, Option<String>) {
        let l = match self.leader().await {
            Ok(l) => l,
            Err(_) => return (vec![], None),
        };
        let c = match self.chain_for(host, &l, &m.chain).await {
            Ok(c) => c,
            Err(e) => {
                self.refusal_audit(
                    host,
                    "host-effect-result",
                    &m.chain.assignment_id,
                    e.category,
                    &e.message,
                );
                return (
                    vec![],
                    hostile(e.category).then(|| format!("refused-{}", e.category.as_str())),
                );
            }
        };
        let key = format!("effect-result/{}", m.effect_id);
        let Some(outcome) = Outcome::parse(&m.outcome) else {
            self.refusal_audit(
                host,
                "host-effect-result",
                &m.chain.assignment_id,
                Category::BadInput,
                "unknown outcome",
            );
            let v = self
                .verdict(
                    &l,
                    &c,
                    &m.effect_id,
                    EffectAnswer::NotRecorded {
                        category: Category::BadInput.as_str().into(),
                    },
                    &key,
                    None,
                )
                .await;
            return (v.into_iter().collect(), Some("refused-bad-input".into()));
        };
        let observed = Observed {
            effect_id: m.effect_id.clone(),
            outcome,
            result_digest: m.result_digest.clone(),
            input_tokens: m.input_tokens.map(|t| t.min(i64::MAX as u64) as i64),
            output_tokens: m.output_tokens.map(|t| t.min(i64::MAX as u64) as i64),
        };
        let answer = match self
            .store
            .record_effect_result(&l, &c.chain, m.chain.generation as i64, &observed)
            .await
        {
            Ok(_) => EffectAnswer::Recorded,
            Err(e) => match e.category() {
                Some(cat) => EffectAnswer::NotRecorded {
                    category: cat.as_str().into(),
                },
                None => {
                    tracing::warn!(host, error = %e, "effect result not recorded");
                    return (vec![], None);
                }
            },
        };
        (
            self.verdict(&l, &c, &m.effect_id, answer, &key, None)
                .await
                .into_iter()
                .collect(),
            None,
        )
    }

    /// The signed verdict for one claim or result of chain `c`, valid from `window`'s
    /// database time (a fresh admission's own) or now, for `VERDICT_TTL_MS`.
    async fn verdict(
        &self,
        l: &Leader,
        c: &ChainRow,
        effect_id: &str,
        answer: EffectAnswer,
        key: &str,
        window: Option<(String, String)>,
    ) -> Option<Outgoing> {
        let digests = Self::digests(c)?;
        let (issued_at, expires_at) = match window {
            Some(w) => w,
            None => self.store.db_now_and(VERDICT_TTL_MS).await.ok()?,
        };
        let m = ToHost::EffectVerdict(EffectVerdict {
            authority: self.authority(l, c, Proof::Reveal),
            digests,
            effect_id: effect_id.to_string(),
            answer,
            issued: crate::protocol::messages::Issued {
                idempotency_key: format!("effect-verdict/{key}/{}", uuid::Uuid::new_v4().simple()),
                issued_at,
                expires_at,
            },
        });
        Some(Outgoing::to_host(&self.ordinary, &m))
    }

    fn refusal_audit(&self, host: &str, op: &str, assignment: &str, category: Category, why: &str) {
        self.store.auditor().record(
            op,
            category,
            None,
            non_empty(assignment),
            None,
            &format!("host:{host}: {why}"),
        );
    }
}
