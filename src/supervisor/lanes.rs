//! The lane table: each lane's record and live generation behind its own lock, the
//! shared state every lane operation reads (`Inner`), and the host state published to the
//! coordinator link whenever it changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch, Mutex};

use super::*;

/// What the host reports to its coordinator (see `Inner::host_state`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostState {
    pub lanes: Vec<String>,
    pub report: crate::protocol::report::HostReport,
}

/// Builds the host state from the lane table and publishes it if it changed.
pub(crate) async fn publish(inner: &Arc<Inner>) {
    use crate::protocol::report::{GenReport, LaneReport};
    let _one_at_a_time = inner.publish_lock.lock().await;
    let mut st = HostState::default();
    let mut quarantined = std::collections::BTreeSet::new();
    for slot in inner.all_slots() {
        let l = slot.lock().await;
        let m = &inner.metrics;
        if l.rec.status == LaneStatus::Destroyed {
            m.active_generation
                .remove(&metrics::HostMetrics::lane(&l.rec.lane_id));
            // Said explicitly (and only after its teardown was verified), so the
            // coordinator retires the incarnation at once rather than guessing from an
            // absence.
            st.report.insert(
                l.rec.lane.clone(),
                LaneReport {
                    lane_incarnation_id: l.rec.lane_incarnation_id.clone(),
                    status: "destroyed".into(),
                    quarantine_reason: None,
                    generations: vec![],
                },
            );
            continue;
        }
        m.active_generation
            .get_or_create(&metrics::HostMetrics::lane(&l.rec.lane_id))
            .set(l.live.as_ref().map_or(0, |g| g.record.generation as i64));
        if l.rec.status == LaneStatus::Quarantined {
            quarantined.insert(format!("{}@{}", l.rec.lane_id, l.rec.lane_incarnation_id));
        }
        st.lanes
            .push(format!("{}@{}", l.rec.lane, l.rec.lane_incarnation_id));
        let generations = l
            .live
            .iter()
            .map(|g| GenReport {
                generation: g.record.generation,
                reservation_id: g.record.coord.as_ref().map(|c| c.reservation_id.clone()),
                activated: g.record.coord.as_ref().is_some_and(|c| c.activated),
                chain_held: g.record.coord.as_ref().is_some_and(|c| c.activated) || !g.adopted,
                held: g.record.held,
            })
            .collect();
        st.report.insert(
            l.rec.lane.clone(),
            LaneReport {
                lane_incarnation_id: l.rec.lane_incarnation_id.clone(),
                status: match l.rec.status {
                    LaneStatus::Quarantined => "quarantined".into(),
                    _ => "active".into(),
                },
                quarantine_reason: l.rec.quarantine_reason.clone(),
                generations,
            },
        );
    }
    st.lanes.sort();
    inner.metrics.lanes.set(st.lanes.len() as i64);
    if let Ok(mut seen) = inner.quarantined_seen.lock() {
        for q in quarantined.difference(&seen) {
            let lane = q.split('@').next().unwrap_or("");
            inner
                .metrics
                .quarantines
                .get_or_create(&metrics::HostMetrics::lane(lane))
                .inc();
        }
        *seen = quarantined;
    }
    inner.host_state.send_if_modified(|cur| {
        let changed = *cur != st;
        *cur = st;
        changed
    });
}

/// How a finished generation left things.
#[derive(Debug)]
pub(crate) struct Finished {
    pub receipt: TerminationReceipt,
    /// Set when cleanup or the receipt write was not provably complete.
    pub quarantine: Option<String>,
}

pub(crate) type DoneRx = watch::Receiver<Option<Arc<Finished>>>;

/// Handle on a live generation's watcher.
#[derive(Debug)]
pub(crate) struct LiveGen {
    pub record: GenRecord,
    pub stop_tx: mpsc::Sender<StopCause>,
    pub done: DoneRx,
    /// Re-adopted by a restarted supervisor.
    pub adopted: bool,
    /// The lane socket's hand-off state of a coordinated generation (served again after a
    /// restart for a generation whose chain fields were recorded).
    pub session: Option<Arc<lanesock::GenSession>>,
    /// The counters of its provider gateway, if it has one.
    pub gateway: Option<super::gateway::GatewayHandle>,
}

#[derive(Debug)]
pub(crate) struct Lane {
    pub rec: LaneRecord,
    pub live: Option<LiveGen>,
}

impl Lane {
    /// The live generation, if it is `generation`.
    pub(super) fn live_gen(&mut self, generation: u64) -> Option<&mut LiveGen> {
        self.live
            .as_mut()
            .filter(|g| g.record.generation == generation)
    }

    /// Folds a finished generation (and any quarantine it calls for) into the lane record.
    /// Idempotent: the watcher's applier task and a stop caller may both call it.
    pub(super) fn settle(
        &mut self,
        store: &Store,
        generation: Option<u64>,
        quarantine: Option<&str>,
    ) {
        let mut changed = false;
        if let Some(g) = generation {
            if self.live.as_ref().map(|l| l.record.generation) == Some(g) {
                self.live = None;
            }
            if self.rec.current_generation == Some(g) {
                self.rec.current_generation = None;
                changed = true;
            }
        }
        if let Some(reason) = quarantine {
            if self.rec.status == LaneStatus::Active {
                tracing::error!(lane_id = %self.rec.lane_id, ?generation, reason, "lane quarantined");
                self.rec.status = LaneStatus::Quarantined;
                self.rec.quarantine_reason = Some(reason.to_string());
                changed = true;
            }
        }
        if changed {
            if let Err(e) = store.save_lane(&self.rec) {
                tracing::error!(lane_id = %self.rec.lane_id, error = %e, "cannot persist lane record");
            }
        }
    }

    pub(super) fn apply_finish(&mut self, store: &Store, fin: &Finished) {
        self.settle(
            store,
            Some(fin.receipt.generation),
            fin.quarantine.as_deref(),
        );
    }
}

/// What `Inner::tmux_check` found.
pub(crate) enum TmuxCheck {
    Ready,
    /// The lane's server or its session is gone: the lane cannot host a generation again.
    Gone,
    /// The session is there but no control client could attach (an old tmux, a wedged
    /// server): this start fails, the lane stays as it is.
    Unusable(SupervisorError),
}

pub(crate) struct Inner {
    pub cfg: Config,
    pub tree: CgroupTree,
    pub registry: Registry,
    pub outbox: Outbox,
    pub store: Store,
    pub audit: Audit,
    pub boot_id: String,
    pub(super) lanes: std::sync::Mutex<BTreeMap<String, Arc<Mutex<Lane>>>>,
    /// Serializes lane creation: two creates of one new name must not both start servers.
    pub(super) create_lock: Mutex<()>,
    /// Set while the host is being decommissioned: no lane is created.
    pub(super) leaving: std::sync::atomic::AtomicBool,
    pub shutdown: watch::Sender<bool>,
    /// What the coordinator link reports in its hello: the live lanes (`lane@incarnation`)
    /// and each lane's status and live generations. Republished on every change (a lane
    /// created, destroyed or quarantined; a generation started, activated or ended), so
    /// the link registers it again without reconnecting.
    pub(super) host_state: watch::Sender<HostState>,
    /// The host state the coordinator link last sent (`decommission` waits for its lanes'
    /// destruction to be reported).
    pub(super) reported: Arc<watch::Sender<HostState>>,
    /// Which coordinator session the link is in (see `link::LinkSession`).
    pub(super) link_session: Arc<super::link::LinkSession>,
    /// Set once `decommission` answered: the daemon stops and removes its traces.
    pub(super) decommissioned: watch::Sender<bool>,
    /// Serializes read-and-publish of the host state, so a slower publisher cannot
    /// overwrite a newer state with the one it read earlier.
    pub(super) publish_lock: Mutex<()>,
    pub metrics: Arc<metrics::HostMetrics>,
    /// Observed ends whose receipt (or record) is not durable yet, written again until it is.
    pub(crate) unwritten: super::unwritten::Unwritten,
    /// Lane incarnations last published as quarantined (to count entries once).
    pub(super) quarantined_seen: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Each lane's attached tmux control client: the start path's way to the lane's server.
    pub(super) tmux_controls: tmuxctl::Controls,
    /// What the kernel can confine, probed once at start (`crate::confine::probe`).
    pub(super) confine_support: Result<crate::confine::Support, String>,
    /// The authority this host's effect paths ask (none: every effect is refused).
    pub(crate) broker: super::broker::BrokerSlot,
    pub(super) _lock: std::fs::File,
}

impl Inner {
    pub(super) fn slot(&self, lane: &LaneName) -> Result<Arc<Mutex<Lane>>, SupervisorError> {
        self.lanes
            .lock()
            .map_err(|_| SupervisorError::State {
                detail: "lane table lock poisoned".into(),
            })?
            .get(lane.as_str())
            .cloned()
            .ok_or_else(|| SupervisorError::NoSuchLane(lane.to_string()))
    }

    pub(super) fn insert_slot(
        &self,
        lane: &str,
        l: Lane,
    ) -> Result<Arc<Mutex<Lane>>, SupervisorError> {
        let slot = Arc::new(Mutex::new(l));
        self.lanes
            .lock()
            .map_err(|_| SupervisorError::State {
                detail: "lane table lock poisoned".into(),
            })?
            .insert(lane.to_string(), slot.clone());
        Ok(slot)
    }

    pub(super) fn all_slots(&self) -> Vec<Arc<Mutex<Lane>>> {
        match self.lanes.lock() {
            Ok(m) => m.values().cloned().collect(),
            Err(p) => p.into_inner().values().cloned().collect(),
        }
    }

    /// Whether the lane's tmux session can host a generation: its control client is
    /// attached (attaching one when there is none). A failed attach is told apart with a
    /// `has-session`: only a session that is really gone counts as gone. Blocking (up to
    /// the attach timeout): call it off the async runtime.
    pub fn tmux_check(&self, lane: &str) -> TmuxCheck {
        match self.tmux_controls.with(&self.tmux(lane), lane, |_| Ok(())) {
            Ok(()) => TmuxCheck::Ready,
            Err(e) => match self.tmux(lane).session_state(lane) {
                tmux::SessionState::Absent => TmuxCheck::Gone,
                tmux::SessionState::Present => {
                    tracing::warn!(lane, error = %e, "the lane's tmux session is there but no control client attaches");
                    TmuxCheck::Unusable(e)
                }
                tmux::SessionState::Unknown(said) => {
                    tracing::warn!(lane, error = %e, tmux_said = %said, "cannot tell whether the lane's tmux server is there: this start fails, the lane stays as it is");
                    TmuxCheck::Unusable(e)
                }
            },
        }
    }

    /// Replaces whatever runs in the lane's pane with `argv` (argv form, no shell), through
    /// the lane's control client.
    pub fn tmux_respawn(&self, lane: &str, argv: &[String]) -> Result<(), SupervisorError> {
        let target = format!("={lane}:");
        let mut words = vec!["respawn-pane", "-k", "-t", target.as_str()];
        words.extend(argv.iter().map(String::as_str));
        self.tmux_controls
            .with(&self.tmux(lane), lane, |c| c.run(&words).map(|_| ()))
    }

    /// Kills the lane's tmux server (and detaches its control client first).
    pub fn tmux_kill(&self, lane: &str) {
        self.tmux_controls.forget(lane);
        self.tmux(lane).kill_server();
    }

    pub fn tmux(&self, lane: &str) -> tmux::Tmux {
        tmux::Tmux::new(
            &self.cfg.tmux,
            self.cfg
                .runtime_dir
                .join("lanes")
                .join(lane)
                .join("tmux.sock"),
        )
    }
}
