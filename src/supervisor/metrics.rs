//! The supervisor's metrics (spec §18, the host side). Every label is a lane id, a reason,
//! a source or a category.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Lane {
    pub lane: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceReason {
    pub source: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabel {
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeOutcome {
    pub runtime: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeDirection {
    pub runtime: String,
    pub direction: String,
}

/// A runtime and a blocker code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeCode {
    pub runtime: String,
    pub code: String,
}

pub struct HostMetrics {
    pub registry: Arc<Registry>,
    /// Work this host's harnesses reported blocked, by runtime and code (`rate-limited`,
    /// `waiting-for-input`, …).
    pub harness_blocked: Family<RuntimeCode, Counter>,
    pub active_generation: Family<Lane, Gauge>,
    pub generation_starts: Family<Lane, Counter>,
    pub replacements: Family<Lane, Counter>,
    pub start_seconds: Histogram,
    pub receipts: Family<SourceReason, Counter>,
    pub orphans: Family<Lane, Counter>,
    pub quarantines: Family<Lane, Counter>,
    pub stale: Family<CategoryLabel, Counter>,
    pub link_up: Gauge,
    pub link_refused: Family<CategoryLabel, Counter>,
    pub lanes: Gauge,
    pub gateway_requests: Family<RuntimeOutcome, Counter>,
    pub provider_tokens: Family<RuntimeDirection, Counter>,
    pub receipts_not_durable: Gauge,
    pub clock_offset_ms: Gauge,
    pub clock_skew_refusals: Counter,
    /// The last clock measurement against the coordinator (for `status`).
    pub clock: std::sync::Mutex<Option<ClockReading>>,
}

/// This host's clock against the coordinator's database time, measured at session start.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClockReading {
    /// Positive: this host is ahead.
    pub host_ahead_ms: i64,
    pub tolerance_ms: u64,
    /// The offset was beyond the tolerance, so no session was opened.
    pub refused: bool,
    pub measured_at: String,
}

impl HostMetrics {
    pub fn new() -> Self {
        let active_generation = Family::<Lane, Gauge>::default();
        let generation_starts = Family::<Lane, Counter>::default();
        let replacements = Family::<Lane, Counter>::default();
        let start_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let receipts = Family::<SourceReason, Counter>::default();
        let orphans = Family::<Lane, Counter>::default();
        let quarantines = Family::<Lane, Counter>::default();
        let stale = Family::<CategoryLabel, Counter>::default();
        let link_up = Gauge::default();
        let link_refused = Family::<CategoryLabel, Counter>::default();
        let lanes = Gauge::default();
        let gateway_requests = Family::<RuntimeOutcome, Counter>::default();
        let provider_tokens = Family::<RuntimeDirection, Counter>::default();
        let harness_blocked = Family::<RuntimeCode, Counter>::default();
        let receipts_not_durable = Gauge::default();
        let clock_offset_ms = Gauge::default();
        let clock_skew_refusals = Counter::default();
        let mut r = Registry::with_prefix("mosaic");
        r.register(
            "lane_active_generation",
            "The lane's live generation number (0: none)",
            active_generation.clone(),
        );
        r.register(
            "generation_starts",
            "Generations started (fresh process, fresh cgroup, identity verified)",
            generation_starts.clone(),
        );
        r.register(
            "generation_replacements",
            "Generations stopped to make way for the lane's next one",
            replacements.clone(),
        );
        r.register(
            "generation_start_seconds",
            "From the start request to a live generation with a verified identity",
            start_seconds.clone(),
        );
        r.register(
            "termination_receipts",
            "Termination receipts written, by observation source and reason",
            receipts.clone(),
        );
        r.register(
            "orphan_descendants",
            "Processes still in a generation's cgroup after its harness was gone, killed at cleanup",
            orphans.clone(),
        );
        r.register(
            "lane_quarantines",
            "Lanes this host quarantined",
            quarantines.clone(),
        );
        r.register(
            "stale_envelopes",
            "Coordinator envelopes for a lane refused before delivery (stale generation, other reservation, wrong authority), by category",
            stale.clone(),
        );
        r.register(
            "coordinator_link_up",
            "1 while a session to the coordinator is established",
            link_up.clone(),
        );
        r.register(
            "coordinator_frames_refused",
            "Frames from the coordinator refused by the link, by category",
            link_refused.clone(),
        );
        r.register("lanes", "Lanes on this host", lanes.clone());
        r.register(
            "gateway_requests",
            "Provider requests from confined generations, by runtime: carried to the upstream, or failed (unreachable, credentials unreadable)",
            gateway_requests.clone(),
        );
        r.register(
            "provider_tokens",
            "Model tokens the provider reported in answers carried by the gateway, by runtime and direction (input, output)",
            provider_tokens.clone(),
        );
        r.register(
            "harness_blocked",
            "Work a harness of this host was reported blocked for, by runtime and code (rate-limited: the provider's own 429; waiting-for-input: a prompt waiting for a human)",
            harness_blocked.clone(),
        );
        r.register(
            "receipts_not_durable",
            "Observed generation ends whose receipt or record could not be written yet (full or read-only state filesystem), held in memory and written again",
            receipts_not_durable.clone(),
        );
        r.register(
            "coordinator_clock_offset_ms",
            "This host's clock minus the coordinator's database time, measured at each session start (ms)",
            clock_offset_ms.clone(),
        );
        r.register(
            "coordinator_clock_skew_refusals",
            "Sessions not opened because this host's clock was beyond the transport tolerance",
            clock_skew_refusals.clone(),
        );
        Self {
            registry: Arc::new(r),
            harness_blocked,
            active_generation,
            generation_starts,
            replacements,
            start_seconds,
            receipts,
            orphans,
            quarantines,
            stale,
            link_up,
            link_refused,
            lanes,
            gateway_requests,
            provider_tokens,
            receipts_not_durable,
            clock_offset_ms,
            clock_skew_refusals,
            clock: std::sync::Mutex::new(None),
        }
    }

    pub fn lane(lane: &str) -> Lane {
        Lane {
            lane: lane.to_string(),
        }
    }

    pub fn runtime_outcome(runtime: &str, outcome: &str) -> RuntimeOutcome {
        RuntimeOutcome {
            runtime: runtime.to_string(),
            outcome: outcome.to_string(),
        }
    }

    pub fn runtime_direction(runtime: &str, direction: &str) -> RuntimeDirection {
        RuntimeDirection {
            runtime: runtime.to_string(),
            direction: direction.to_string(),
        }
    }

    pub fn category(c: &str) -> CategoryLabel {
        CategoryLabel {
            category: c.to_string(),
        }
    }
}

impl HostMetrics {
    /// A clock measurement at session start (`refused`: beyond the tolerance).
    pub fn clock_measured(&self, host_ahead_ms: i64, tolerance_ms: u64, refused: bool) {
        self.clock_offset_ms.set(host_ahead_ms);
        if refused {
            self.clock_skew_refusals.inc();
        }
        if let Ok(mut c) = self.clock.lock() {
            *c = Some(ClockReading {
                host_ahead_ms,
                tolerance_ms,
                refused,
                measured_at: crate::util::now_rfc3339(),
            });
        }
    }

    /// A new durable receipt: counted by source and reason; descendants killed after an
    /// end nobody asked for are orphans the cleanup found.
    pub fn count_receipt(&self, r: &super::receipt::TerminationReceipt) {
        let label = |v: &dyn erased::Kebab| v.kebab();
        self.receipts
            .get_or_create(&SourceReason {
                source: label(&r.observation_source),
                reason: label(&r.termination_reason),
            })
            .inc();
        if r.stop.is_none() && r.cleanup.members_killed > 0 {
            self.orphans
                .get_or_create(&Self::lane(&r.lane_id))
                .inc_by(r.cleanup.members_killed as u64);
        }
    }
}

mod erased {
    /// The wire (kebab-case) name of a receipt enum value.
    pub trait Kebab {
        fn kebab(&self) -> String;
    }
    impl<T: serde::Serialize> Kebab for T {
        fn kebab(&self) -> String {
            serde_json::to_value(self)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_else(|| "unknown".into())
        }
    }
}

impl Default for HostMetrics {
    fn default() -> Self {
        Self::new()
    }
}
