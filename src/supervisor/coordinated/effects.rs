//! The coordinated host as its effect paths' [`Broker`]: each claim becomes an `effect`
//! envelope for the coordinator, and its `effect_verdict` the answer the effect path waits
//! for; each observation an `effect_result`, sent again until the coordinator answers it
//! (and carried by the generation's termination receipt meanwhile).
//!
//! **Never:** answers a claim itself, treats a verdict for another generation (or one that
//! did not pass the chain's authority check) as an admission, or dispatches after the
//! generation was fenced on this host.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::*;
use crate::protocol::effects::{self, Outcome};
use crate::protocol::messages::{EffectAnswer, EffectVerdict};
use crate::supervisor::broker::{Admitted, Broker, Claim, Denied, EffectObservation, Phase};

/// How long an effect path waits for the coordinator's admission.
pub const ADMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an unanswered observation is sent again.
const RESULT_RESEND: Duration = Duration::from_secs(5);

/// A claim waiting for its verdict.
pub(super) struct Waiting {
    lane_id: String,
    generation: u64,
    tx: tokio::sync::oneshot::Sender<EffectAnswer>,
}

/// An observation the coordinator has not recorded yet.
pub(super) struct Unrecorded {
    lane_id: String,
    generation: u64,
    obs: EffectObservation,
    sent: Instant,
}

/// The effect paths' shared state on this host.
#[derive(Default)]
pub(super) struct Effects {
    pub(super) waiting: Mutex<HashMap<String, Waiting>>,
    pub(super) unrecorded: Mutex<HashMap<String, Unrecorded>>,
}

/// The [`Broker`] installed for this host: a weak handle, so the supervisor's slot does
/// not keep the coordinated host alive.
pub(crate) struct HostBroker(pub(super) std::sync::Weak<CoordinatedHost>);

impl CoordinatedHost {
    /// The chain context of `generation` of `lane_id`, if this host holds it.
    fn ctx_of(&self, lane_id: &str, generation: u64) -> Option<Arc<ChainCtx>> {
        self.chain_of(lane_id)
            .filter(|c| c.generation == generation)
    }

    fn current(&self, lane_id: &str, ctx: &ChainCtx) -> bool {
        self.gate
            .lock()
            .is_ok_and(|g| g.is_current(lane_id, &ctx.lane_incarnation_id, ctx.generation))
    }

    /// The effect message of a claim, from what the generation's reports repeat.
    fn claim_message(
        ctx: &ChainCtx,
        base: ReportBase,
        effect_id: &str,
        claim: &Claim,
    ) -> FromHostChain {
        let owner = base.chain.lane_id.clone();
        FromHostChain::Effect(wire::Effect {
            chain: base.chain,
            bound: base.bound,
            idempotency_key: claim.idempotency_key.clone(),
            effect_id: effect_id.to_string(),
            executor: claim.target.executor().as_str().to_string(),
            target: claim.target.text(),
            operation_digest: claim.operation_digest.clone(),
            // A RUNNING generation's lane is both owners of its work.
            responsibility_owner: owner.clone(),
            execution_owner: owner,
            process_identity: canonical::to_json(&ctx.identity),
        })
    }

    fn result_message(base: ReportBase, o: &EffectObservation) -> FromHostChain {
        FromHostChain::EffectResult(wire::EffectResult {
            chain: base.chain,
            bound: base.bound,
            effect_id: o.effect_id.clone(),
            outcome: o.outcome.clone(),
            result_digest: o.result_digest.clone(),
            input_tokens: o.input_tokens,
            output_tokens: o.output_tokens,
        })
    }

    /// A verdict: the answer its claim waits for, or the end of an observation's resends.
    /// A verdict nobody waits for that admits a claim (its path gave up waiting) is
    /// reported not dispatched.
    pub(super) fn on_effect_verdict(self: Arc<Self>, m: EffectVerdict, message_id: &str) {
        let (lane_id, generation) = (m.authority.lane_id.clone(), m.authority.generation);
        // Checked against the generation's own chain when this host still holds it (the
        // same reservation, timeline and fence): a verdict for another chain is refused.
        if let Some(ctx) = self.ctx_of(&lane_id, generation) {
            if let Err(why) = authority_of(&ToHost::EffectVerdict(m.clone()), &ctx.binding) {
                self.sup
                    .audit_stale(why, Some(&lane_id), Some(generation), message_id);
                return;
            }
        }
        match m.answer {
            EffectAnswer::Recorded | EffectAnswer::NotRecorded { .. } => {
                if let EffectAnswer::NotRecorded { category } = &m.answer {
                    tracing::warn!(lane_id, generation, effect_id = %m.effect_id, category,
                        "the coordinator did not record an effect's result; it is not reported again");
                }
                if let Ok(mut u) = self.effects.unrecorded.lock() {
                    if u.get(&m.effect_id)
                        .is_some_and(|x| x.lane_id == lane_id && x.generation == generation)
                    {
                        u.remove(&m.effect_id);
                    }
                }
            }
            answer => {
                let waiter = self.effects.waiting.lock().ok().and_then(|mut w| {
                    let ok = w
                        .get(&m.effect_id)
                        .is_some_and(|x| x.lane_id == lane_id && x.generation == generation);
                    if ok {
                        w.remove(&m.effect_id)
                    } else {
                        None
                    }
                });
                match waiter {
                    Some(w) => {
                        let _ = w.tx.send(answer);
                    }
                    None if matches!(answer, EffectAnswer::Admitted { .. }) => {
                        // Admitted after its path gave up: it was never dispatched.
                        let o = EffectObservation::new(
                            &m.effect_id,
                            Outcome::NotDispatched,
                            &[b"late admission"],
                            None,
                        );
                        HostBroker(Arc::downgrade(&self)).observed(&lane_id, generation, o);
                    }
                    None => {}
                }
            }
        }
    }

    /// Sends every observation the coordinator has not answered for a while again. Runs
    /// until the host is gone.
    pub(super) async fn resend_results(this: std::sync::Weak<Self>) {
        let mut tick = tokio::time::interval(RESULT_RESEND);
        loop {
            tick.tick().await;
            let Some(host) = this.upgrade() else { return };
            let due: Vec<(String, u64, EffectObservation)> = match host.effects.unrecorded.lock() {
                Ok(mut u) => u
                    .values_mut()
                    .filter(|x| x.sent.elapsed() >= RESULT_RESEND)
                    .map(|x| {
                        x.sent = Instant::now();
                        (x.lane_id.clone(), x.generation, x.obs.clone())
                    })
                    .collect(),
                Err(_) => return,
            };
            for (lane_id, generation, o) in due {
                if let Some(base) = host
                    .ctx_of(&lane_id, generation)
                    .and_then(|c| c.report_base.lock().ok().and_then(|b| b.clone()))
                {
                    host.send(Self::result_message(base, &o));
                }
            }
        }
    }
}

impl Broker for HostBroker {
    fn phase(&self, lane_id: &str, generation: u64) -> Phase {
        let Some(host) = self.0.upgrade() else {
            return Phase::NoAuthority;
        };
        match host.ctx_of(lane_id, generation) {
            None => Phase::NoAuthority,
            Some(c) if c.active.load(Ordering::SeqCst) => Phase::Active,
            Some(_) => Phase::Staging,
        }
    }

    fn admit(
        &self,
        lane_id: &str,
        generation: u64,
        claim: Claim,
    ) -> BoxFuture<'static, Result<Admitted, Denied>> {
        let host = self.0.upgrade();
        let lane_id = lane_id.to_string();
        Box::pin(async move {
            let host = host.ok_or(Denied::NoAuthority)?;
            let ctx = host
                .ctx_of(&lane_id, generation)
                .ok_or(Denied::NoAuthority)?;
            if !ctx.active.load(Ordering::SeqCst) {
                return Err(Denied::NotActive);
            }
            let base = ctx
                .report_base
                .lock()
                .ok()
                .and_then(|b| b.clone())
                .ok_or(Denied::NotActive)?;
            if !host.current(&lane_id, &ctx) {
                return Err(Denied::Fenced);
            }
            let effect_id = effects::effect_id(&base.chain.assignment_id, &claim.idempotency_key);
            let (tx, rx) = tokio::sync::oneshot::channel();
            {
                let mut w = host.effects.waiting.lock().map_err(|_| Denied::NoAnswer)?;
                if w.contains_key(&effect_id) {
                    // The same key in flight twice from this host: the second waits for
                    // nothing; it is the same claim.
                    return Err(Denied::Refused("in-flight".into()));
                }
                w.insert(
                    effect_id.clone(),
                    Waiting {
                        lane_id: lane_id.clone(),
                        generation,
                        tx,
                    },
                );
            }
            host.send(CoordinatedHost::claim_message(
                &ctx, base, &effect_id, &claim,
            ));
            let answer = tokio::time::timeout(ADMIT_TIMEOUT, rx).await;
            if let Ok(mut w) = host.effects.waiting.lock() {
                w.remove(&effect_id);
            }
            match answer {
                Ok(Ok(EffectAnswer::Admitted { .. })) => Ok(Admitted::Fresh { effect_id }),
                Ok(Ok(EffectAnswer::Settled {
                    claim_state,
                    result_digest,
                })) => Ok(Admitted::Settled {
                    effect_id,
                    claim_state,
                    result_digest,
                }),
                Ok(Ok(EffectAnswer::Refused { category })) => Err(Denied::Refused(category)),
                Ok(Ok(_)) => Err(Denied::Refused("malformed-verdict".into())),
                Ok(Err(_)) | Err(_) => Err(Denied::NoAnswer),
            }
        })
    }

    fn may_dispatch(&self, lane_id: &str, generation: u64) -> bool {
        let Some(host) = self.0.upgrade() else {
            return false;
        };
        host.ctx_of(lane_id, generation).is_some_and(|c| {
            c.active.load(Ordering::SeqCst)
                && !c.stopping.load(Ordering::SeqCst)
                && host.current(lane_id, &c)
        })
    }

    fn observed(&self, lane_id: &str, generation: u64, o: EffectObservation) {
        let Some(host) = self.0.upgrade() else { return };
        let base = host
            .ctx_of(lane_id, generation)
            .and_then(|c| c.report_base.lock().ok().and_then(|b| b.clone()));
        if let Ok(mut u) = host.effects.unrecorded.lock() {
            u.insert(
                o.effect_id.clone(),
                Unrecorded {
                    lane_id: lane_id.to_string(),
                    generation,
                    obs: o.clone(),
                    sent: Instant::now(),
                },
            );
        }
        if let Some(base) = base {
            host.send(CoordinatedHost::result_message(base, &o));
        }
    }

    fn unrecorded(&self, lane_id: &str, generation: u64) -> Vec<EffectObservation> {
        let Some(host) = self.0.upgrade() else {
            return vec![];
        };
        let mut v: Vec<EffectObservation> = host
            .effects
            .unrecorded
            .lock()
            .map(|u| {
                u.values()
                    .filter(|x| x.lane_id == lane_id && x.generation == generation)
                    .map(|x| x.obs.clone())
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.effect_id.cmp(&b.effect_id));
        v
    }

    fn provider_answered(
        &self,
        lane_id: &str,
        generation: u64,
        limited: Option<crate::supervisor::ratelimit::Limited>,
    ) {
        let session = self
            .0
            .upgrade()
            .and_then(|host| host.ctx_of(lane_id, generation))
            .and_then(|ctx| ctx.session.clone());
        if let Some(s) = session {
            s.provider_answered(limited);
        }
    }
}
