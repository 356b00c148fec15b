//! The coordinator's metrics (spec §18, the authority side).
//!
//! Two kinds: counters of what this process did (transitions and their latency, refusals,
//! session events) and values read from the database at scrape time (receipts by source
//! and reason, lanes by state, quarantine entries and exits, transitions by kind, leases
//! renewed and expired), which therefore agree with the database across restarts and
//! whichever coordinator wrote them. Labels are transition names, categories, reasons,
//! sources, states and message types — never a token, a prompt or a task.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::error::AuthorityError;
use super::rows::RowExt;
use super::store::Store;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpResult {
    pub op: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Op {
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabel {
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeCategory {
    pub message_type: String,
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceReason {
    pub source: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Transition {
    pub transition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabel {
    pub host: String,
}

fn transition_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// What the transition primitive records (owned by the `Store`).
pub struct TransitionMetrics {
    pub transitions: Family<OpResult, Counter>,
    pub seconds: Family<Op, Histogram, fn() -> Histogram>,
    pub ack_rejections: Family<CategoryLabel, Counter>,
    pub fence_denials: Counter,
}

impl Default for TransitionMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl TransitionMetrics {
    pub fn new() -> Self {
        Self {
            transitions: Family::default(),
            seconds: Family::new_with_constructor(transition_histogram),
            ack_rejections: Family::default(),
            fence_denials: Counter::default(),
        }
    }

    /// One transition's outcome: `decided`, `replayed`, or the refusal's category.
    pub fn record(
        &self,
        op: &str,
        elapsed: std::time::Duration,
        r: &Result<bool, &AuthorityError>,
    ) {
        let result = match r {
            Ok(false) => "decided".to_string(),
            Ok(true) => "replayed".to_string(),
            Err(e) => e
                .category()
                .map(|c| c.as_str().to_string())
                .unwrap_or_else(|| "error".into()),
        };
        if let Err(e) = r {
            if let Some(c) = e.category() {
                if op == "consume-ack" {
                    self.ack_rejections
                        .get_or_create(&CategoryLabel {
                            category: c.as_str().into(),
                        })
                        .inc();
                }
                if c == super::error::Category::FenceMismatch {
                    self.fence_denials.inc();
                }
            }
        }
        self.transitions
            .get_or_create(&OpResult {
                op: op.to_string(),
                result,
            })
            .inc();
        self.seconds
            .get_or_create(&Op { op: op.to_string() })
            .observe(elapsed.as_secs_f64());
    }
}

/// Everything the coordinator exposes.
pub struct CoordinatorMetrics {
    pub registry: Arc<Registry>,
    pub host_messages_refused: Family<TypeCategory, Counter>,
    pub invalid_frames: Family<CategoryLabel, Counter>,
    pub sessions_opened: Counter,
    pub sessions_closed: Family<Kind, Counter>,
    host_sessions: Gauge,
    leading: Gauge,
    epoch: Gauge,
    losses: Gauge,
    receipts: Family<SourceReason, Gauge>,
    generations: Gauge,
    lanes: Family<StateLabel, Gauge>,
    transitions_db: Family<Transition, Gauge>,
    quarantine_entries: Gauge,
    quarantine_exits: Gauge,
    quarantine_releases: Gauge,
    lease_renewals: Gauge,
    lease_expiries: Gauge,
    /// Restarts of the database by the process that supervises it (`mosaic up`'s private
    /// cluster); zero where the database is someone else's to run.
    pub database_restarts: Counter,
    /// Trust registry loads that replaced the registry in use, and reloads refused (the
    /// file did not load; the registry in use stayed).
    pub trust_reloads: Counter,
    pub trust_reload_failures: Counter,
    /// Each host's clock minus database time, measured from its last hello (ms).
    pub host_clock_offset: Family<HostLabel, Gauge>,
    audit_spooled: Gauge,
    audit_spool_lost: Gauge,
    /// Effect claims answered, by executor and result (admitted, settled, substituted,
    /// refused-<category>): the §18 executor fence denials are the refusals.
    effects: Family<ExecutorResult, Counter>,
    /// Notification deliveries by sink and result (delivered, failed).
    notifications: Family<ExecutorResult, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutorResult {
    pub executor: String,
    pub result: String,
}

impl CoordinatorMetrics {
    /// Counts one effect claim's answer.
    pub fn effect(&self, executor: &str, result: &str) {
        self.effects
            .get_or_create(&ExecutorResult {
                executor: executor.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts one delivery attempt of a notification to `sink`.
    pub fn notifications(&self, sink: &str, delivered: bool) {
        self.notifications
            .get_or_create(&ExecutorResult {
                executor: sink.into(),
                result: if delivered { "delivered" } else { "failed" }.into(),
            })
            .inc();
    }

    pub fn new(t: &TransitionMetrics) -> Self {
        let mut r = Registry::with_prefix("mosaic");
        let m = Self {
            registry: Arc::new(Registry::default()),
            host_messages_refused: Family::default(),
            invalid_frames: Family::default(),
            sessions_opened: Counter::default(),
            sessions_closed: Family::default(),
            host_sessions: Gauge::default(),
            leading: Gauge::default(),
            epoch: Gauge::default(),
            losses: Gauge::default(),
            receipts: Family::default(),
            generations: Gauge::default(),
            lanes: Family::default(),
            transitions_db: Family::default(),
            quarantine_entries: Gauge::default(),
            quarantine_exits: Gauge::default(),
            quarantine_releases: Gauge::default(),
            lease_renewals: Gauge::default(),
            lease_expiries: Gauge::default(),
            database_restarts: Counter::default(),
            trust_reloads: Counter::default(),
            trust_reload_failures: Counter::default(),
            host_clock_offset: Family::default(),
            audit_spooled: Gauge::default(),
            audit_spool_lost: Gauge::default(),
            effects: Family::default(),
            notifications: Family::default(),
        };
        r.register(
            "notifications",
            "Operator notification deliveries, by sink (executor: command, webhook) and result (delivered, failed)",
            m.notifications.clone(),
        );
        r.register(
            "effect_claims",
            "Effect claims answered, by executor and result (admitted; settled: the key named a claim already admitted; substituted: the key was bound to another operation; refused-<category>)",
            m.effects.clone(),
        );
        r.register(
            "audit_spooled",
            "Audit records waiting in the spool for the database to answer",
            m.audit_spooled.clone(),
        );
        r.register(
            "audit_spool_lost",
            "Audit records not spooled because the spool was full, since it was last written out",
            m.audit_spool_lost.clone(),
        );
        r.register(
            "host_clock_offset_ms",
            "Each host's clock minus the database time, measured from the hello of its last session (ms); a host beyond the transport tolerance opens no session",
            m.host_clock_offset.clone(),
        );
        r.register(
            "transitions",
            "Authority transitions this process ran, by transition and result (decided, replayed, or the refusal's category)",
            t.transitions.clone(),
        );
        r.register(
            "transition_seconds",
            "Latency of each authority transition (one fenced CAS, its receipt, the commit)",
            t.seconds.clone(),
        );
        r.register(
            "ack_rejections",
            "Challenge ACKs refused, by reason category",
            t.ack_rejections.clone(),
        );
        r.register(
            "fence_denials",
            "Transitions refused because a fence token did not match",
            t.fence_denials.clone(),
        );
        r.register(
            "host_messages_refused",
            "Host envelopes refused after verification (another host's chain, stale, mismatched), by type and category",
            m.host_messages_refused.clone(),
        );
        r.register(
            "invalid_frames",
            "Frames refused before anything read them (verification, replay, other session), by reason",
            m.invalid_frames.clone(),
        );
        r.register(
            "host_sessions_opened",
            "Host sessions established",
            m.sessions_opened.clone(),
        );
        r.register(
            "host_sessions_closed",
            "Host sessions ended, by kind (closed, silent, superseded, abusive, leadership, shutdown, transport)",
            m.sessions_closed.clone(),
        );
        r.register(
            "host_sessions",
            "Live host sessions",
            m.host_sessions.clone(),
        );
        r.register(
            "leadership_leading",
            "1 while this coordinator leads",
            m.leading.clone(),
        );
        r.register(
            "leadership_epoch",
            "This coordinator's epoch while it leads (0 otherwise)",
            m.epoch.clone(),
        );
        r.register(
            "leadership_losses",
            "Times this process lost leadership",
            m.losses.clone(),
        );
        r.register(
            "termination_receipts",
            "Termination receipts ingested (database), by observation source and reason",
            m.receipts.clone(),
        );
        r.register(
            "generations",
            "Generations ever staged (database)",
            m.generations.clone(),
        );
        r.register(
            "lanes",
            "Current lane incarnations by state (database)",
            m.lanes.clone(),
        );
        r.register(
            "authority_transitions",
            "Transition receipts in the database, by transition",
            m.transitions_db.clone(),
        );
        r.register(
            "quarantine_entries",
            "Lane incarnations that entered QUARANTINED (database)",
            m.quarantine_entries.clone(),
        );
        r.register(
            "quarantine_exits",
            "Lane incarnations that left QUARANTINED (database)",
            m.quarantine_exits.clone(),
        );
        r.register(
            "quarantine_releases",
            "Operator releases of a quarantine (database)",
            m.quarantine_releases.clone(),
        );
        r.register(
            "lease_renewals",
            "Effect-lease renewal transitions (database)",
            m.lease_renewals.clone(),
        );
        r.register(
            "lease_expiries",
            "Effect-lease expiry transitions (database)",
            m.lease_expiries.clone(),
        );
        r.register(
            "database_restarts",
            "Times mosaic up restarted its private PostgreSQL after its postmaster died",
            m.database_restarts.clone(),
        );
        r.register(
            "trust_reloads",
            "Trust registry loads that replaced the registry in use (file changes, SIGHUP, revocations)",
            m.trust_reloads.clone(),
        );
        r.register(
            "trust_reload_failures",
            "Trust registry reloads refused because the file did not load or lacked this coordinator's keys (the registry in use stays)",
            m.trust_reload_failures.clone(),
        );
        Self {
            registry: Arc::new(r),
            ..m
        }
    }

    /// Refreshes what is read at scrape time. A database error leaves the last values.
    pub async fn refresh(
        &self,
        store: &Store,
        leading_epoch: Option<i64>,
        losses: u64,
        host_sessions: usize,
    ) {
        self.leading.set(i64::from(leading_epoch.is_some()));
        self.epoch.set(leading_epoch.unwrap_or(0));
        self.losses.set(losses as i64);
        self.host_sessions.set(host_sessions as i64);
        let (spooled, lost) = store.auditor().spooled();
        self.audit_spooled.set(spooled as i64);
        self.audit_spool_lost.set(lost as i64);
        if let Err(e) = self.refresh_db(store).await {
            tracing::warn!(error = %e, "metrics: database values not refreshed");
        }
    }

    async fn refresh_db(&self, store: &Store) -> Result<(), AuthorityError> {
        let c = store.pool.get().await?;
        for r in c
            .query(
                "SELECT coalesce(body->>'observation_source', 'unknown') AS source, coalesce(body->>'termination_reason', 'unknown') AS reason, \
                        count(*) AS n \
                 FROM termination_receipts GROUP BY 1, 2",
                &[],
            )
            .await?
        {
            self.receipts
                .get_or_create(&SourceReason {
                    source: r.col("source")?,
                    reason: r.col("reason")?,
                })
                .set(r.col("n")?);
        }
        let g: i64 = c
            .query_one("SELECT count(*) AS n FROM generations", &[])
            .await?
            .col("n")?;
        self.generations.set(g);
        self.lanes.clear();
        for r in c
            .query(
                "SELECT state, count(*) AS n FROM lane_incarnations WHERE retired_at IS NULL GROUP BY state",
                &[],
            )
            .await?
        {
            self.lanes
                .get_or_create(&StateLabel {
                    state: r.col("state")?,
                })
                .set(r.col("n")?);
        }
        let mut renewals = 0;
        let mut expiries = 0;
        let mut releases = 0;
        for r in c
            .query(
                "SELECT transition, count(*) AS n FROM transition_receipts GROUP BY transition",
                &[],
            )
            .await?
        {
            let (t, n): (String, i64) = (r.col("transition")?, r.col("n")?);
            match t.as_str() {
                "renew-leases" => renewals = n,
                "lease-expired" => expiries = n,
                "release-quarantine" => releases = n,
                _ => {}
            }
            self.transitions_db
                .get_or_create(&Transition { transition: t })
                .set(n);
        }
        self.lease_renewals.set(renewals);
        self.lease_expiries.set(expiries);
        self.quarantine_releases.set(releases);
        let q = c
            .query_one(
                "SELECT coalesce(sum(quarantine_entries), 0)::bigint AS entries, coalesce(sum(quarantine_exits), 0)::bigint AS exits \
                 FROM lane_incarnations",
                &[],
            )
            .await?;
        self.quarantine_entries.set(q.col("entries")?);
        self.quarantine_exits.set(q.col("exits")?);
        Ok(())
    }
}
