//! Each admitted effect observed to its end, exactly once: completed when its answer was
//! read whole (or its tunnel closed), failed when the sink was never reached, aborted when
//! it was cut part-way, not dispatched when it was admitted and never sent. The observation
//! goes to the broker, which reports it until the coordinator records it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use hyper::body::Bytes;

use super::Body;
use crate::protocol::effects::Outcome;
use crate::supervisor::broker::{Broker, EffectObservation};

/// Admitted effects of one gateway not yet observed to their end, by effect id.
pub(super) type Inflight = Mutex<HashMap<String, Arc<Settle>>>;

/// One admitted effect, until its end is observed.
pub(super) struct Settle {
    pub(super) effect_id: String,
    lane_id: String,
    generation: u64,
    broker: Arc<dyn Broker>,
    done: AtomicBool,
    /// A provider call reports its answer's token usage.
    tokens: bool,
    pub(super) status: AtomicU16,
    pub(super) input: AtomicU64,
    pub(super) output: AtomicU64,
    /// A tunnel's bytes each way.
    pub(super) up: AtomicU64,
    pub(super) down: AtomicU64,
    /// Sent on toward its sink (before: cut means not dispatched; after: aborted).
    dispatched: AtomicBool,
    inflight: Weak<Inflight>,
}

impl Settle {
    /// Registers an admitted effect as in flight.
    pub(super) fn begin(
        inflight: &Arc<Inflight>,
        effect_id: &str,
        lane_id: &str,
        generation: u64,
        broker: Arc<dyn Broker>,
        tokens: bool,
    ) -> Arc<Self> {
        let s = Arc::new(Self {
            effect_id: effect_id.to_string(),
            lane_id: lane_id.to_string(),
            generation,
            broker,
            done: AtomicBool::new(false),
            tokens,
            status: AtomicU16::new(0),
            input: AtomicU64::new(0),
            output: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            dispatched: AtomicBool::new(false),
            inflight: Arc::downgrade(inflight),
        });
        if let Ok(mut m) = inflight.lock() {
            m.insert(effect_id.to_string(), s.clone());
        }
        s
    }

    /// It is being sent on toward its sink now.
    pub(super) fn dispatching(&self) {
        self.dispatched.store(true, Ordering::SeqCst);
    }

    /// Cut before its end: not dispatched if it never left, aborted if it had.
    pub(super) fn cut(&self) {
        self.finish(if self.dispatched.load(Ordering::SeqCst) {
            Outcome::Aborted
        } else {
            Outcome::NotDispatched
        });
    }

    /// Its end, observed: reported once (a later call does nothing).
    pub(super) fn finish(&self, outcome: Outcome) {
        if self.done.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(m) = self.inflight.upgrade() {
            if let Ok(mut m) = m.lock() {
                m.remove(&self.effect_id);
            }
        }
        let n = |a: &AtomicU64| a.load(Ordering::SeqCst).to_string();
        let status = self.status.load(Ordering::SeqCst).to_string();
        let (input, output, up, down) =
            (n(&self.input), n(&self.output), n(&self.up), n(&self.down));
        let tokens = self.tokens.then(|| {
            (
                self.input.load(Ordering::SeqCst),
                self.output.load(Ordering::SeqCst),
            )
        });
        let o = EffectObservation::new(
            &self.effect_id,
            outcome,
            &[
                status.as_bytes(),
                input.as_bytes(),
                output.as_bytes(),
                up.as_bytes(),
                down.as_bytes(),
            ],
            tokens,
        );
        self.broker.observed(&self.lane_id, self.generation, o);
    }
}

/// Everything still in flight was cut: its gateway is going away (its generation ended).
pub(super) fn abort_all(inflight: &Inflight) {
    let open: Vec<Arc<Settle>> = inflight
        .lock()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    for s in open {
        s.cut();
    }
}

/// An answer's body that settles its effect: completed when read to its end, aborted when
/// it fails or is dropped before.
pub(super) struct SettledBody {
    pub(super) inner: Body,
    pub(super) settle: Arc<Settle>,
    pub(super) ended: bool,
}

impl hyper::body::Body for SettledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        let r = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(None) => {
                this.ended = true;
                this.settle.finish(Outcome::Completed);
            }
            Poll::Ready(Some(Err(_))) => {
                this.ended = true;
                this.settle.finish(Outcome::Aborted);
            }
            _ => {}
        }
        r
    }
}

impl Drop for SettledBody {
    fn drop(&mut self) {
        if !self.ended {
            self.settle.finish(Outcome::Aborted);
        }
    }
}
