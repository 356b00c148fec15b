//! The broker's admission (spec §5.5), as the effect paths of a generation see it: the
//! provider gateway and the egress proxy (`gateway/`), and the push path (`lanesock`). Each
//! asks [`Broker::admit`] before it dispatches anything, checks [`Broker::may_dispatch`]
//! right before it does, and reports what it observed with [`Broker::observed`].
//!
//! The supervisor itself decides nothing here: a [`Broker`] is installed by whatever holds
//! authority for this host (the coordinated chain, `coordinated/effects.rs`), and with none
//! installed — a supervisor without a coordinator — every effect is refused: a generation
//! that no assignment authorizes has no effect to make.
//!
//! **Never:** dispatches an effect without a fresh admission (no admission is cached or
//! reused), dispatches one whose generation was fenced meanwhile, or reports an outcome it
//! did not observe.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::protocol::effects::{Outcome, Target};

/// Where a generation stands, for its effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No authority knows it (a supervisor without a coordinator, or a generation the
    /// coordinated chain does not hold): nothing is admitted, ever.
    NoAuthority,
    /// Staged, not yet activated: nothing is admitted; the gateway answers the activation
    /// exchange itself.
    Staging,
    /// RUNNING: each effect is admitted by the coordinator, or not.
    Active,
}

/// One effect to admit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub target: Target,
    pub idempotency_key: String,
    pub operation_digest: String,
}

/// An admitted claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    /// Admitted now: dispatch it, once.
    Fresh { effect_id: String },
    /// The key names a claim admitted before, for this operation: it is not dispatched
    /// again; this is what became of it.
    Settled {
        effect_id: String,
        claim_state: String,
        result_digest: Option<String>,
    },
}

/// Why an effect is not dispatched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("this generation is under no assignment: no authority admits its effects")]
    NoAuthority,
    #[error("this generation is not active yet: nothing is admitted before its activation")]
    NotActive,
    #[error("the coordinator refused the effect ({0})")]
    Refused(String),
    #[error("the coordinator did not answer in time; nothing was dispatched")]
    NoAnswer,
    #[error("the generation was fenced before the effect was dispatched")]
    Fenced,
}

impl Denied {
    /// The category a refused request carries back to the harness and the logs.
    pub fn category(&self) -> &str {
        match self {
            Self::NoAuthority => "no-authority",
            Self::NotActive => "not-active",
            Self::Refused(c) => c,
            Self::NoAnswer => "no-answer",
            Self::Fenced => "fenced",
        }
    }
}

/// What a broker observed of one admitted effect; kept until the coordinator recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectObservation {
    pub effect_id: String,
    pub outcome: String,
    pub result_digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
}

impl EffectObservation {
    /// The observation of `effect_id`: its outcome, the result's digest over what the
    /// broker saw of it (`parts`), and the token usage a provider answer reported.
    pub fn new(
        effect_id: &str,
        outcome: Outcome,
        parts: &[&[u8]],
        tokens: Option<(u64, u64)>,
    ) -> Self {
        Self {
            effect_id: effect_id.to_string(),
            outcome: outcome.as_str().to_string(),
            result_digest: crate::protocol::effects::result_digest(effect_id, outcome, parts),
            input_tokens: tokens.map(|t| t.0),
            output_tokens: tokens.map(|t| t.1),
        }
    }
}

/// The authority a host's effect paths ask.
pub trait Broker: Send + Sync {
    /// Where generation `generation` of lane `lane_id` stands.
    fn phase(&self, lane_id: &str, generation: u64) -> Phase;

    /// Asks the coordinator to admit `claim` for that generation.
    fn admit(
        &self,
        lane_id: &str,
        generation: u64,
        claim: Claim,
    ) -> BoxFuture<'static, Result<Admitted, Denied>>;

    /// Right before dispatching an admitted effect: whether the generation is still the
    /// lane's current one and not fenced on this host (a stop order, a newer generation).
    fn may_dispatch(&self, lane_id: &str, generation: u64) -> bool;

    /// What was observed of an admitted effect: reported to the coordinator until it is
    /// recorded (and carried by the generation's termination receipt meanwhile).
    fn observed(&self, lane_id: &str, generation: u64, o: EffectObservation);

    /// The observations of `generation` the coordinator has not recorded yet.
    fn unrecorded(&self, lane_id: &str, generation: u64) -> Vec<EffectObservation>;

    /// The provider answered a request of that generation: rate-limited (`Some`), or
    /// successfully, which ends a limit seen before (`None`).
    fn provider_answered(
        &self,
        _lane_id: &str,
        _generation: u64,
        _limited: Option<crate::supervisor::ratelimit::Limited>,
    ) {
    }
}

/// Where the installed broker lives: the effect paths look it up per effect, so a broker
/// installed after a generation started (the coordinator link comes up after a restart's
/// re-adoption) is used. A supervisor that has a coordinator *expects* one: until it is
/// installed, an effect path waits for it (bounded) instead of refusing.
#[derive(Clone)]
pub struct BrokerSlot {
    broker: tokio::sync::watch::Sender<Option<Arc<dyn Broker>>>,
    expected: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for BrokerSlot {
    fn default() -> Self {
        Self {
            broker: tokio::sync::watch::channel(None).0,
            expected: Default::default(),
        }
    }
}

impl BrokerSlot {
    pub fn install(&self, b: Arc<dyn Broker>) {
        self.broker.send_replace(Some(b));
    }

    /// This supervisor answers to a coordinator: its broker will be installed.
    pub fn expect(&self) {
        self.expected
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn get(&self) -> Option<Arc<dyn Broker>> {
        self.broker.borrow().clone()
    }

    /// The broker, waiting up to `patience` for an expected one to be installed.
    pub async fn ready(&self, patience: std::time::Duration) -> Option<Arc<dyn Broker>> {
        if let Some(b) = self.get() {
            return Some(b);
        }
        if !self.expected.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        let mut rx = self.broker.subscribe();
        tokio::time::timeout(patience, rx.wait_for(|b| b.is_some()))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|b| b.clone()))
    }

    pub fn phase(&self, lane_id: &str, generation: u64) -> Phase {
        self.get()
            .map_or(Phase::NoAuthority, |b| b.phase(lane_id, generation))
    }

    pub fn unrecorded(&self, lane_id: &str, generation: u64) -> Vec<EffectObservation> {
        self.get()
            .map(|b| b.unrecorded(lane_id, generation))
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for BrokerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BrokerSlot")
    }
}

/// Holds an effect path at a named moment (`effect:pre-dispatch`, `effect:post-sink`)
/// until the file the failpoint names exists: how the tests put a revocation, a takeover
/// or a crash exactly between two steps of one effect. Nothing without the `failpoints`
/// feature.
pub(crate) async fn hold(point: &str) {
    #[cfg(feature = "failpoints")]
    {
        let path: Option<String> = fail::eval(point, |arg| arg).flatten();
        if let Some(p) = path {
            tracing::warn!(failpoint = %point, until = %p, "failpoint: holding this effect");
            while !std::path::Path::new(&p).exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = point;
}

/// [`hold`] for a blocking thread (`checkpoint:frozen`: a requested checkpoint's cgroup
/// frozen, before its workspace is read).
pub(crate) fn hold_blocking(point: &str) {
    #[cfg(feature = "failpoints")]
    {
        let path: Option<String> = fail::eval(point, |arg| arg).flatten();
        if let Some(p) = path {
            tracing::warn!(failpoint = %point, until = %p, "failpoint: holding here");
            while !std::path::Path::new(&p).exists() {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = point;
}
