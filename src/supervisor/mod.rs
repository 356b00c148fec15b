//! The per-host supervisor: owns every harness process on this host.
//!
//! **Owns:** lanes (one tmux server each), lane incarnations, generations (one fresh cgroup
//! each), process-tree identity, stopping and cleanup, termination receipts and their
//! outbox, and re-adoption after its own restart.
//!
//! **Never:** decides assignment authority (that is the coordinator's), identifies a
//! process by PID alone, reuses a generation number or cgroup directory, reports a lane
//! clean when cleanup was ambiguous (it quarantines instead), or tells anyone about a
//! termination before its receipt is durable.
//!
//! Concurrency shape: one async mutex per lane serializes lane operations (create, start,
//! stop, destroy). Each live generation has exactly one watcher task, the only code that
//! finalizes it, so exactly one receipt per generation falls out of the structure rather
//! than out of locking discipline. Stop requests are messages to that watcher.

pub mod audit;
pub mod authority;
pub mod config;
pub mod control;
pub mod coordinated;
pub mod identity;
pub mod names;
pub mod outbox;
pub mod receipt;
pub mod state;
pub mod tmux;
mod tmuxctl;

mod adopt;
mod generation;
mod launch;
pub use launch::Step as LaunchStep;
pub mod lanesock;
pub mod link;
pub mod metrics;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::{mpsc, watch, Mutex};

use crate::adapter::{Registry, RegistryError};
use crate::cgroup::{CgroupError, CgroupTree};
use crate::util::durable::{self, DurableError};
use audit::Audit;
use config::Config;
use identity::{IdentityError, ProcessIdentity};
use names::{IncarnationId, LaneName, NameError};
use outbox::{Outbox, OutboxError};
use receipt::{StopCause, TerminationReceipt};
use state::{GenRecord, LaneRecord, LaneStatus, Store};

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("configuration: {detail}")]
    Config { detail: String },
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Durable(#[from] DurableError),
    #[error("state: {detail}")]
    State { detail: String },
    #[error("tmux: {detail}")]
    Tmux { detail: String },
    #[error("no lane {0:?} on this host")]
    NoSuchLane(String),
    #[error("lane {lane:?} already exists (incarnation {incarnation})")]
    LaneExists { lane: String, incarnation: String },
    #[error("lane {lane:?} is quarantined: {reason}; destroy and recreate it to get a fresh incarnation")]
    Quarantined { lane: String, reason: String },
    #[error("lane {0:?} has no live generation")]
    NoLiveGeneration(String),
    #[error("generation {generation} of lane {lane:?} failed to launch: {detail}")]
    Launch {
        lane: String,
        generation: u64,
        detail: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another supervisor already holds {0}")]
    AlreadyRunning(PathBuf),
    #[error("the supervisor is shutting down")]
    ShuttingDown,
    #[error("this supervisor works under a coordinator: {0}")]
    Coordinated(&'static str),
    /// A failure injected by a test's failpoint (`failpoints` builds only).
    #[error("failpoint {failpoint} injected a failure")]
    Injected { failpoint: String },
}

impl SupervisorError {
    /// A stable category for API clients and audit counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config { .. } => "config",
            Self::Name(_) => "bad-name",
            Self::Registry(RegistryError::UnknownRuntime { .. }) => "unknown-runtime",
            Self::Registry(RegistryError::UnknownVersion { .. }) => "unknown-version",
            Self::Registry(RegistryError::Probe { .. }) => "version-probe",
            Self::Registry(RegistryError::Credentials { .. }) => "credentials",
            Self::Registry(_) => "registry",
            Self::Cgroup(CgroupError::NoV2 { .. }) => "no-cgroup-v2",
            Self::Cgroup(CgroupError::NotWritable { .. }) => "cgroup-not-writable",
            Self::Cgroup(_) => "cgroup",
            Self::Identity(_) => "identity",
            Self::Outbox(_) | Self::Durable(_) | Self::State { .. } | Self::Io { .. } => "storage",
            Self::Tmux { .. } => "tmux",
            Self::NoSuchLane(_) => "no-such-lane",
            Self::LaneExists { .. } => "lane-exists",
            Self::Quarantined { .. } => "quarantined",
            Self::NoLiveGeneration(_) => "no-live-generation",
            Self::Launch { .. } => "launch-failed",
            Self::AlreadyRunning(_) => "already-running",
            Self::ShuttingDown => "shutting-down",
            Self::Coordinated(_) => "coordinated",
            Self::Injected { .. } => "injected",
        }
    }
}

/// What `end_generation` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndOutcome {
    Stopped,
    AlreadyEnded,
    FencedNeverStarted,
}

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
    /// restart for an activated generation whose chain fields were recorded).
    pub session: Option<Arc<lanesock::GenSession>>,
}

#[derive(Debug)]
pub(crate) struct Lane {
    pub rec: LaneRecord,
    pub live: Option<LiveGen>,
}

impl Lane {
    /// Folds a finished generation (and any quarantine it calls for) into the lane record.
    /// Idempotent: the watcher's applier task and a stop caller may both call it.
    fn settle(&mut self, store: &Store, generation: Option<u64>, quarantine: Option<&str>) {
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

    fn apply_finish(&mut self, store: &Store, fin: &Finished) {
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
    lanes: std::sync::Mutex<BTreeMap<String, Arc<Mutex<Lane>>>>,
    /// Serializes lane creation: two creates of one new name must not both start servers.
    create_lock: Mutex<()>,
    pub shutdown: watch::Sender<bool>,
    /// What the coordinator link reports in its hello: the live lanes (`lane@incarnation`)
    /// and each lane's status and live generations. Republished on every change (a lane
    /// created, destroyed or quarantined; a generation started, activated or ended), so
    /// the link registers it again without reconnecting.
    host_state: watch::Sender<HostState>,
    /// Serializes read-and-publish of the host state, so a slower publisher cannot
    /// overwrite a newer state with the one it read earlier.
    publish_lock: Mutex<()>,
    pub metrics: Arc<metrics::HostMetrics>,
    /// Lane incarnations last published as quarantined (to count entries once).
    quarantined_seen: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Each lane's attached tmux control client: the start path's way to the lane's server.
    tmux_controls: tmuxctl::Controls,
    _lock: std::fs::File,
}

impl Inner {
    fn slot(&self, lane: &LaneName) -> Result<Arc<Mutex<Lane>>, SupervisorError> {
        self.lanes
            .lock()
            .map_err(|_| SupervisorError::State {
                detail: "lane table lock poisoned".into(),
            })?
            .get(lane.as_str())
            .cloned()
            .ok_or_else(|| SupervisorError::NoSuchLane(lane.to_string()))
    }

    fn insert_slot(&self, lane: &str, l: Lane) -> Result<Arc<Mutex<Lane>>, SupervisorError> {
        let slot = Arc::new(Mutex::new(l));
        self.lanes
            .lock()
            .map_err(|_| SupervisorError::State {
                detail: "lane table lock poisoned".into(),
            })?
            .insert(lane.to_string(), slot.clone());
        Ok(slot)
    }

    fn all_slots(&self) -> Vec<Arc<Mutex<Lane>>> {
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
                tmux::SessionState::Present | tmux::SessionState::Unknown(_) => {
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

/// A lane as shown to operators.
#[derive(Debug, Clone, Serialize)]
pub struct LaneView {
    pub lane: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub status: LaneStatus,
    pub quarantine_reason: Option<String>,
    pub current_generation: Option<u64>,
    pub generation: Option<GenView>,
    pub tmux_socket: PathBuf,
    pub attach: String,
}

/// A live generation as shown to operators: identity, never the nonce.
#[derive(Debug, Clone, Serialize)]
pub struct GenView {
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub runtime: String,
    pub started_at: String,
    pub process_identity: Option<ProcessIdentity>,
    /// Advisory observations from the harness's own hooks (settled turns, refused
    /// events); absent for a generation without a lane socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harness: Option<lanesock::Observed>,
    /// The conversation id a real harness was started with (hook events must name it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
}

impl GenView {
    fn of(r: &GenRecord) -> Self {
        Self {
            lane_id: r.lane_id.clone(),
            lane_incarnation_id: r.lane_incarnation_id.clone(),
            generation: r.generation,
            runtime: r.runtime.clone(),
            started_at: r.started_at.clone(),
            process_identity: r.identity.clone(),
            harness: None,
            conversation_id: r.conversation_id.clone(),
        }
    }

    fn of_live(g: &LiveGen) -> Self {
        let v = Self::of(&g.record);
        Self {
            harness: g.session.as_ref().map(|s| s.observations()),
            conversation_id: g
                .session
                .as_ref()
                .and_then(|s| s.conversation())
                .or(v.conversation_id.clone()),
            ..v
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    pub host_id: String,
    pub cgroup_root: PathBuf,
    pub kill_method: crate::cgroup::KillMethod,
    pub lanes: Vec<LaneView>,
    pub unacknowledged_receipts: usize,
}

/// The supervisor library handle. Cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

impl Supervisor {
    /// Validates the environment (cgroup v2, delegated root, registry, directories) and
    /// takes the state-dir lock. Creates no lanes and adopts nothing yet.
    pub fn open(cfg: Config) -> Result<Self, SupervisorError> {
        // Every generation starts with the shim, and its hooks call `mosaic`: a supervisor
        // that could not start either says so now, not at its first start.
        for exe in [cfg.shim_exe(), cfg.mosaic_exe()] {
            let runnable = std::fs::metadata(&exe).is_ok_and(|m| m.is_file())
                && nix::unistd::access(&exe, nix::unistd::AccessFlags::X_OK).is_ok();
            if !runnable {
                return Err(SupervisorError::Config {
                    detail: format!(
                        "{} is missing or not executable: `mosaic` and `mosaic-shim` are installed side by side in bin_dir",
                        exe.display()
                    ),
                });
            }
        }
        let mount = crate::cgroup::discover_mount()?;
        let own = crate::cgroup::cgroup_of(None)?;
        let tree = CgroupTree::open(
            &mount,
            cfg.cgroup_root.as_deref(),
            &own,
            cfg.force_freezer_fallback,
        )?;
        let registry = match &cfg.registry_dir {
            Some(d) => Registry::load_dir(d)?,
            None => Registry::embedded()?,
        };
        durable::ensure_dir(&cfg.state_dir, 0o700)?;
        durable::ensure_dir(&cfg.runtime_dir.join("gen"), 0o700)?;
        durable::ensure_dir(&cfg.runtime_dir.join("lanes"), 0o700)?;
        let lock_path = cfg.state_dir.join("supervisor.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| SupervisorError::Io {
                what: "open",
                path: lock_path.clone(),
                source,
            })?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| SupervisorError::AlreadyRunning(lock_path))?;
        let (shutdown, _) = watch::channel(false);
        let inner = Inner {
            outbox: Outbox::open(&cfg.state_dir)?,
            store: Store::open(&cfg.state_dir)?,
            audit: Audit::new(cfg.state_dir.join("audit.jsonl")),
            boot_id: identity::boot_id()?,
            tree,
            registry,
            cfg,
            lanes: std::sync::Mutex::new(BTreeMap::new()),
            create_lock: Mutex::new(()),
            shutdown,
            host_state: watch::channel(HostState::default()).0,
            publish_lock: Mutex::new(()),
            metrics: Arc::new(metrics::HostMetrics::new()),
            quarantined_seen: std::sync::Mutex::new(Default::default()),
            tmux_controls: Default::default(),
            _lock: lock,
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    pub fn cgroup_tree(&self) -> &CgroupTree {
        &self.inner.tree
    }

    /// Re-adopts what survived a previous supervisor and writes receipts for what did not.
    /// Must run once, before serving requests.
    pub async fn recover(&self) -> Result<adopt::RecoveryReport, SupervisorError> {
        adopt::recover(&self.inner).await
    }

    /// Creates a lane, or recreates a destroyed one under a fresh incarnation.
    pub async fn lane_create(&self, lane: &str) -> Result<LaneView, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let _creating = self.inner.create_lock.lock().await;
        let prior = match self.inner.slot(&name) {
            Ok(slot) => {
                let l = slot.lock().await;
                if l.rec.status != LaneStatus::Destroyed {
                    return Err(SupervisorError::LaneExists {
                        lane: lane.to_string(),
                        incarnation: l.rec.lane_incarnation_id.clone(),
                    });
                }
                Some(l.rec.clone())
            }
            Err(_) => None,
        };
        let inc = IncarnationId::fresh();
        let lane_id = self.inner.cfg.host.lane_id(&name);
        let tree = &self.inner.tree;
        tree.lane_tmux(name.as_str()).create()?;
        tree.incarnation(name.as_str(), inc.as_str()).create()?;
        let tmux = self.inner.tmux(name.as_str());
        durable::ensure_dir(
            tmux.socket()
                .parent()
                .unwrap_or(&self.inner.cfg.runtime_dir),
            0o700,
        )?;
        let idle = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!(
                "printf 'mosaic lane {lane_id}: idle, no generation yet\\n'; exec sleep infinity"
            ),
        ];
        // A stale server of an earlier incarnation must not be reused.
        self.inner.tmux_kill(name.as_str());
        tmux.start_server(name.as_str(), &tree.lane_tmux(name.as_str()), &idle)?;
        let past_incarnations = match prior {
            Some(p) => {
                let mut v = p.past_incarnations;
                v.push(p.lane_incarnation_id);
                v
            }
            None => Vec::new(),
        };
        let rec = LaneRecord {
            lane: name.to_string(),
            lane_id,
            lane_incarnation_id: inc.to_string(),
            status: LaneStatus::Active,
            quarantine_reason: None,
            created_at: crate::util::now_rfc3339(),
            next_generation: 1,
            current_generation: None,
            past_incarnations,
        };
        self.inner.store.save_lane(&rec)?;
        tracing::info!(lane_id = %rec.lane_id, incarnation = %rec.lane_incarnation_id, "lane created");
        let view = self.view(&rec, None);
        self.inner
            .insert_slot(name.as_str(), Lane { rec, live: None })?;
        drop(_creating);
        self.publish_lanes().await;
        Ok(view)
    }

    /// Republishes the host state (see `Inner::host_state`).
    pub(crate) async fn publish_lanes(&self) {
        publish(&self.inner).await
    }

    /// Stops the live generation (if any), kills the lane's tmux server and removes its
    /// cgroups. The lane record stays, marked destroyed, so a recreate gets a new
    /// incarnation and the history is kept.
    pub async fn lane_destroy(&self, lane: &str) -> Result<LaneView, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let mut l = slot.lock().await;
        if l.rec.status == LaneStatus::Destroyed {
            return Err(SupervisorError::NoSuchLane(lane.to_string()));
        }
        if let Some(live) = l.live.take() {
            let fin = generation::stop(live, StopCause::LaneDestroy).await?;
            l.apply_finish(&self.inner.store, &fin);
        }
        self.inner.tmux_kill(name.as_str());
        let tree = &self.inner.tree;
        let timeout = std::time::Duration::from_secs(5);
        let res = tokio::task::spawn_blocking({
            let tree = tree.clone();
            let lane = name.to_string();
            move || -> Result<(), CgroupError> {
                let cg = tree.lane(&lane);
                if cg.exists() {
                    cg.kill_and_wait(timeout)?;
                    cg.remove_tree()?;
                }
                Ok(())
            }
        })
        .await
        .map_err(|e| SupervisorError::State {
            detail: format!("cleanup task failed: {e}"),
        })?;
        if let Err(e) = res {
            let reason = format!("lane teardown was not clean: {e}");
            l.settle(&self.inner.store, None, Some(&reason));
            return Err(e.into());
        }
        l.rec.status = LaneStatus::Destroyed;
        l.rec.current_generation = None;
        self.inner.store.save_lane(&l.rec)?;
        tracing::info!(lane_id = %l.rec.lane_id, "lane destroyed");
        let view = self.view(&l.rec, None);
        drop(l);
        self.publish_lanes().await;
        Ok(view)
    }

    /// Starts a fresh generation on `lane`: stops and verifies-gone any previous one, then
    /// launches `runtime` with `directives` in a brand-new cgroup, and returns once the
    /// process identity is verified.
    pub async fn start(
        &self,
        lane: &str,
        runtime: &str,
        directives: &[String],
    ) -> Result<GenView, SupervisorError> {
        if self.inner.cfg.coordinator.is_some() {
            return Err(SupervisorError::Coordinated(
                "generations start only on its stage (assign through the coordinator)",
            ));
        }
        self.start_with(lane, runtime, directives, launch::Origin::Local, None)
            .await
    }

    /// Starts the coordinator-allocated `generation` of `lane` (whose current incarnation
    /// must be `incarnation`), handing its contract over `session`.
    pub async fn start_coordinated(
        &self,
        lane: &str,
        runtime: &str,
        incarnation: &str,
        generation: u64,
        session: Arc<lanesock::GenSession>,
        binding: state::CoordBinding,
    ) -> Result<GenView, SupervisorError> {
        self.start_with(
            lane,
            runtime,
            &[],
            launch::Origin::Coordinated {
                generation,
                session,
                binding,
            },
            Some(incarnation),
        )
        .await
    }

    async fn start_with(
        &self,
        lane: &str,
        runtime: &str,
        directives: &[String],
        origin: launch::Origin,
        incarnation: Option<&str>,
    ) -> Result<GenView, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let phases = launch::Phases::new();
        // Validate everything that can be validated before touching the lane.
        let plan = {
            let reg = self.inner.registry.clone();
            let rt = runtime.to_string();
            let d = directives.to_vec();
            let paths = crate::adapter::Paths {
                bin_dir: self.inner.cfg.bin_dir.clone(),
                harness_root: self.inner.cfg.harness_root.clone(),
            };
            let mut plan = tokio::task::spawn_blocking(move || {
                crate::adapter::plan_launch(&reg, &rt, &d, &paths)
            })
            .await
            .map_err(|e| SupervisorError::State {
                detail: format!("probe task failed: {e}"),
            })??;
            if matches!(origin, launch::Origin::Local)
                && plan.family.adapter().challenge_delivery()
                    != crate::adapter::ChallengeDelivery::SocketFetch
            {
                return Err(SupervisorError::Registry(
                    crate::adapter::RegistryError::Directives {
                        family: plan.family.name().into(),
                        detail: "a real harness runs only under the coordinator's chain (mosaic assign): its contract and ACK travel through it".into(),
                    },
                ));
            }
            if let Some(path) = self.inner.cfg.credentials.get(&plan.runtime.runtime) {
                plan.secret_env = crate::adapter::credentials::load(&plan.runtime.runtime, path)?;
            }
            plan
        };
        phases.mark("planned (registry, version probe, credentials)");
        let mut l = slot.lock().await;
        if let launch::Origin::Coordinated { generation, .. } = &origin {
            // A generation that already has a receipt ended for good (it ran, or it was
            // fenced as never started): a late stage cannot start it.
            let key =
                receipt::idempotency_key(&l.rec.lane_id, &l.rec.lane_incarnation_id, *generation);
            if self.inner.outbox.contains(&key) {
                return Err(SupervisorError::Launch {
                    lane: l.rec.lane_id.clone(),
                    generation: *generation,
                    detail: "this generation already ended (its receipt exists)".into(),
                });
            }
        }
        if let Some(inc) = incarnation {
            if inc != l.rec.lane_incarnation_id {
                return Err(SupervisorError::Launch {
                    lane: l.rec.lane_id.clone(),
                    generation: 0,
                    detail: format!(
                        "incarnation {inc} is not the lane's current {}",
                        l.rec.lane_incarnation_id
                    ),
                });
            }
        }
        match l.rec.status {
            LaneStatus::Active => {}
            LaneStatus::Destroyed => return Err(SupervisorError::NoSuchLane(lane.to_string())),
            LaneStatus::Quarantined => {
                return Err(SupervisorError::Quarantined {
                    lane: lane.to_string(),
                    reason: l.rec.quarantine_reason.clone().unwrap_or_default(),
                })
            }
        }
        if let Some(live) = l.live.take() {
            self.inner
                .metrics
                .replacements
                .get_or_create(&metrics::HostMetrics::lane(&l.rec.lane_id))
                .inc();
            let fin = generation::stop(live, StopCause::Replace).await?;
            l.apply_finish(&self.inner.store, &fin);
            if let Some(reason) = &fin.quarantine {
                return Err(SupervisorError::Quarantined {
                    lane: lane.to_string(),
                    reason: reason.clone(),
                });
            }
        }
        let check = {
            let (inner, lane) = (self.inner.clone(), name.to_string());
            tokio::task::spawn_blocking(move || inner.tmux_check(&lane))
                .await
                .map_err(|e| SupervisorError::State {
                    detail: format!("tmux check task failed: {e}"),
                })?
        };
        match check {
            TmuxCheck::Ready => {}
            TmuxCheck::Unusable(e) => return Err(e),
            TmuxCheck::Gone => {
                let reason = "the lane's tmux server is gone";
                l.settle(&self.inner.store, None, Some(reason));
                return Err(SupervisorError::Quarantined {
                    lane: lane.to_string(),
                    reason: reason.into(),
                });
            }
        }
        phases.mark("lane checked (receipt, state, tmux server alive)");
        let live = match launch::launch(&self.inner, &mut l.rec, plan, origin, &phases).await {
            Ok(live) => live,
            Err(launch::LaunchError::Refused(e)) => return Err(e),
            Err(launch::LaunchError::Aborted { error, finished }) => {
                // The aborted generation has its receipt; the lane takes the next start
                // unless its cleanup or receipt was not provably complete.
                l.apply_finish(&self.inner.store, &finished);
                drop(l);
                self.publish_lanes().await;
                return Err(match finished.quarantine {
                    Some(reason) => SupervisorError::Quarantined {
                        lane: lane.to_string(),
                        reason,
                    },
                    None => error,
                });
            }
        };
        self.inner
            .metrics
            .generation_starts
            .get_or_create(&metrics::HostMetrics::lane(&l.rec.lane_id))
            .inc();
        self.inner
            .metrics
            .start_seconds
            .observe(phases.elapsed().as_secs_f64());

        let view = GenView::of(&live.record);
        spawn_applier(self.inner.clone(), name.to_string(), &live);
        l.live = Some(live);
        drop(l);
        self.publish_lanes().await;
        phases.mark("lane published");
        Ok(view)
    }

    /// The coordination binding of the lane's live `generation`, if it is a coordinated one.
    pub async fn binding(&self, lane: &str, generation: u64) -> Option<state::CoordBinding> {
        let name = LaneName::parse(lane).ok()?;
        let slot = self.inner.slot(&name).ok()?;
        let l = slot.lock().await;
        l.live
            .as_ref()
            .filter(|g| g.record.generation == generation)
            .and_then(|g| g.record.coord.clone())
    }

    /// The lane-socket hand-off state of the lane's live `generation`, if it has one.
    pub async fn session_of(
        &self,
        lane: &str,
        generation: u64,
    ) -> Option<Arc<lanesock::GenSession>> {
        let name = LaneName::parse(lane).ok()?;
        let slot = self.inner.slot(&name).ok()?;
        let l = slot.lock().await;
        l.live
            .as_ref()
            .filter(|g| g.record.generation == generation)
            .and_then(|g| g.session.clone())
    }

    /// Records (durably, before the harness is told) that the coordinator activated the
    /// lane's live `generation`, with the chain fields its reports carry. Returns false
    /// when that generation is not the live one.
    pub async fn mark_activated(
        &self,
        lane: &str,
        generation: u64,
        chain_fields: Option<serde_json::Value>,
    ) -> Result<bool, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let mut l = slot.lock().await;
        let Some(live) = l
            .live
            .as_mut()
            .filter(|g| g.record.generation == generation)
        else {
            return Ok(false);
        };
        let Some(c) = live.record.coord.as_mut() else {
            return Ok(false);
        };
        if !c.activated || (c.chain_fields.is_none() && chain_fields.is_some()) {
            c.activated = true;
            if c.chain_fields.is_none() {
                c.chain_fields = chain_fields;
            }
            self.inner.store.save_gen(&live.record)?;
        }
        drop(l);
        self.publish_lanes().await;
        Ok(true)
    }

    /// Ends generation `generation` of incarnation `incarnation` of `lane` on the
    /// coordinator's order: stops it if it runs; if it never ran here and has no receipt,
    /// writes a `never-started` receipt so the number is fenced for good (a late stage is
    /// refused) and the coordinator learns it ended.
    pub async fn end_generation(
        &self,
        lane: &str,
        incarnation: &str,
        generation: u64,
        runtime: &str,
    ) -> Result<EndOutcome, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let lane_id = self.inner.cfg.host.lane_id(&name);
        let key = receipt::idempotency_key(&lane_id, incarnation, generation);
        let slot = self.inner.slot(&name).ok();
        if let Some(slot) = slot {
            let mut l = slot.lock().await;
            if l.rec.lane_incarnation_id == incarnation {
                if l.live
                    .as_ref()
                    .is_some_and(|g| g.record.generation == generation)
                {
                    let live = l
                        .live
                        .take()
                        .ok_or_else(|| SupervisorError::NoLiveGeneration(lane.to_string()))?;
                    let fin = generation::stop(live, StopCause::Coordinator).await?;
                    l.apply_finish(&self.inner.store, &fin);
                    drop(l);
                    self.publish_lanes().await;
                    return Ok(EndOutcome::Stopped);
                }
                if self.inner.outbox.contains(&key) {
                    self.resend_receipt(&key);
                    return Ok(EndOutcome::AlreadyEnded);
                }
                // Fence the number before anything else can use it.
                if generation >= l.rec.next_generation {
                    l.rec.next_generation = generation + 1;
                    self.inner.store.save_lane(&l.rec)?;
                }
                self.write_never_started(
                    &lane_id,
                    incarnation,
                    generation,
                    runtime,
                    "the coordinator ended it before it started here",
                )?;
                return Ok(EndOutcome::FencedNeverStarted);
            }
        }
        if self.inner.outbox.contains(&key) {
            self.resend_receipt(&key);
            return Ok(EndOutcome::AlreadyEnded);
        }
        self.write_never_started(
            &lane_id,
            incarnation,
            generation,
            runtime,
            "no such lane incarnation on this host",
        )?;
        Ok(EndOutcome::FencedNeverStarted)
    }

    /// The coordinator asks to end a generation this host already ended: it never got (or
    /// lost) the receipt, so the receipt goes back to the outbox to be sent again.
    fn resend_receipt(&self, key: &str) {
        match self.inner.outbox.resend(key) {
            Ok(true) => tracing::warn!(key, "the coordinator lacks this receipt; sending it again"),
            Ok(false) => {}
            Err(e) => {
                tracing::error!(receipt_key = %key, error = %e, "cannot queue the receipt again")
            }
        }
    }

    /// The host refuses to start a staged generation: a `never-started` receipt ends the
    /// coordinator's chain at once (instead of letting its reservation run out).
    pub fn refuse_generation(
        &self,
        lane_id: &str,
        incarnation: &str,
        generation: u64,
        runtime: &str,
        why: &str,
    ) -> Result<(), SupervisorError> {
        self.write_never_started(lane_id, incarnation, generation, runtime, why)
    }

    fn write_never_started(
        &self,
        lane_id: &str,
        incarnation: &str,
        generation: u64,
        runtime: &str,
        why: &str,
    ) -> Result<(), SupervisorError> {
        // A generation begun here has a record; its receipt may say only what was observed
        // of it (a launch abort or its watcher writes it, or a restart finds it). Writing
        // "never started" over a generation that did start would be a guess.
        let key = receipt::idempotency_key(lane_id, incarnation, generation);
        if self.inner.outbox.contains(&key) {
            return Ok(());
        }
        if self.inner.store.gen_exists(incarnation, generation) {
            return Err(SupervisorError::State {
                detail: format!(
                    "generation {generation} of {incarnation} was begun here; only its observed receipt may end it"
                ),
            });
        }
        let r = receipt::never_started(
            self.inner.cfg.host.as_str(),
            lane_id,
            incarnation,
            generation,
            runtime,
            why,
        );
        match self.inner.outbox.write(&r)? {
            outbox::Written::New => {
                self.inner.metrics.count_receipt(&r);
                tracing::warn!(
                    lane_id,
                    incarnation,
                    generation,
                    why,
                    "generation fenced as never started"
                );
            }
            outbox::Written::AlreadyPresent => {}
        }
        Ok(())
    }

    /// Gracefully stops the lane's live generation and returns its receipt once the cgroup
    /// is verified empty and removed.
    pub async fn stop(&self, lane: &str) -> Result<TerminationReceipt, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let mut l = slot.lock().await;
        let live = l
            .live
            .take()
            .ok_or_else(|| SupervisorError::NoLiveGeneration(lane.to_string()))?;
        let fin = generation::stop(live, StopCause::Operator).await?;
        l.apply_finish(&self.inner.store, &fin);
        Ok(fin.receipt.clone())
    }

    pub async fn status(&self) -> Result<StatusView, SupervisorError> {
        let mut lanes = Vec::new();
        for slot in self.inner.all_slots() {
            let l = slot.lock().await;
            if l.rec.status == LaneStatus::Destroyed {
                continue;
            }
            let g = l.live.as_ref().map(GenView::of_live);
            lanes.push(self.view(&l.rec, g));
        }
        lanes.sort_by(|a, b| a.lane.cmp(&b.lane));
        Ok(StatusView {
            host_id: self.inner.cfg.host.as_str().to_string(),
            cgroup_root: self.inner.tree.root().to_path_buf(),
            kill_method: self.inner.tree.kill_method(),
            lanes,
            unacknowledged_receipts: self.inner.outbox.list(false)?.len(),
        })
    }

    pub fn receipts(
        &self,
        lane: Option<&str>,
        include_acked: bool,
    ) -> Result<Vec<TerminationReceipt>, SupervisorError> {
        let lane_id = match lane {
            Some(l) => Some(self.inner.cfg.host.lane_id(&LaneName::parse(l)?)),
            None => None,
        };
        Ok(self
            .inner
            .outbox
            .list(include_acked)?
            .into_iter()
            .filter(|r| lane_id.as_ref().is_none_or(|id| &r.lane_id == id))
            .collect())
    }

    pub fn ack(&self, key: &str) -> Result<(), SupervisorError> {
        if self.inner.cfg.coordinator.is_some() {
            return Err(SupervisorError::Coordinated(
                "only the coordinator acknowledges receipts (an ack here would hide the end of a generation from it)",
            ));
        }
        Ok(self.inner.outbox.ack(key)?)
    }

    /// Starts the coordinator link: hello with this host's lanes (`lane@incarnation`),
    /// receipts until acknowledged, and the coordinated chain. Runs until shutdown.
    pub async fn connect_coordinator(
        &self,
        link: &config::CoordinatorLink,
    ) -> Result<(), SupervisorError> {
        let cfg_err = |detail: String| SupervisorError::Config { detail };
        let seed = |p: &std::path::Path| -> Result<[u8; 32], SupervisorError> {
            let text =
                std::fs::read_to_string(p).map_err(|e| cfg_err(format!("{}: {e}", p.display())))?;
            let mut b = [0u8; 32];
            hex::decode_to_slice(text.trim(), &mut b)
                .map_err(|_| cfg_err(format!("{}: expected 64 hex digits", p.display())))?;
            Ok(b)
        };
        let host = self.inner.cfg.host.as_str().to_string();
        let principal = format!("host:{host}");
        let registry = std::fs::read_to_string(&link.trust_registry)
            .map_err(|e| cfg_err(format!("{}: {e}", link.trust_registry.display())))
            .and_then(|t| {
                crate::protocol::TrustRegistry::from_toml(&t).map_err(|e| cfg_err(e.to_string()))
            })?;
        let tls =
            crate::protocol::transport::client_tls(&crate::protocol::transport::TlsIdentity {
                ca: link.ca.clone(),
                cert: link.cert.clone(),
                key: link.key.clone(),
            })
            .map_err(|e| cfg_err(e.to_string()))?;
        self.publish_lanes().await;
        let state = self.inner.host_state.borrow().clone();
        let params = crate::protocol::transport::LinkParams {
            addr: link.address.clone(),
            fallback_addrs: link.fallback_addresses.clone(),
            server_name: link.server_name.clone(),
            coordinator: link.principal.clone(),
            tls,
            signer: Arc::new(crate::protocol::Signer::new(
                &format!("{principal}/session"),
                &principal,
                &link.trust_domain,
                seed(&link.session_key)?,
            )),
            registry: Arc::new(registry),
            trust_domain: link.trust_domain.clone(),
            host_id: host,
            lanes: state.lanes,
            report: state.report,
            runtimes: self.inner.registry.runtimes(),
            liveness: crate::protocol::transport::Liveness::from_heartbeat_ms(link.heartbeat_ms),
        };
        let fence = Arc::new(authority::AuthorityFence::load(&self.inner.cfg.state_dir)?);
        let audit: link::LinkAudit = {
            let inner = self.inner.clone();
            Arc::new(move |category, detail| {
                tracing::warn!(category, detail, "coordinator frame refused");
                inner
                    .metrics
                    .link_refused
                    .get_or_create(&metrics::HostMetrics::category(category))
                    .inc();
                inner.audit.record(category, None, None, detail);
            })
        };
        let ordinary = Arc::new(crate::protocol::Signer::new(
            &format!("{principal}/ordinary"),
            &principal,
            &link.trust_domain,
            seed(&link.ordinary_key)?,
        ));
        let (out, rx) = tokio::sync::mpsc::channel(256);
        let host = coordinated::CoordinatedHost::new(self.clone(), ordinary, out).await;
        tokio::spawn(link::run_link(
            params,
            self.inner.outbox.clone(),
            Arc::new(host),
            rx,
            self.inner.host_state.subscribe(),
            fence,
            audit,
            Some(self.inner.metrics.clone()),
            self.inner.shutdown.subscribe(),
        ));
        Ok(())
    }

    /// Serves this supervisor's metrics on `addr` until shutdown; the bound address is
    /// written to `<runtime_dir>/metrics.addr` and returned.
    pub async fn serve_metrics(&self, addr: &str) -> Result<String, SupervisorError> {
        let listener = crate::metrics::bind(addr)
            .await
            .map_err(|e| SupervisorError::Config {
                detail: e.to_string(),
            })?;
        let bound = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let path = self.inner.cfg.runtime_dir.join("metrics.addr");
        crate::util::durable::write_atomic(&path, bound.as_bytes())?;
        tracing::info!(addr = %bound, "metrics at http://{bound}/metrics");
        tokio::spawn(crate::metrics::serve(
            listener,
            self.inner.metrics.registry.clone(),
            None,
            self.inner.shutdown.subscribe(),
        ));
        Ok(bound)
    }

    /// One line for the service manager's status: lanes, live generations, the link.
    pub async fn status_line(&self) -> String {
        match self.status().await {
            Ok(st) => format!(
                "{} lanes, {} generations live, {} quarantined; coordinator link {}",
                st.lanes.len(),
                st.lanes.iter().filter(|l| l.generation.is_some()).count(),
                st.lanes
                    .iter()
                    .filter(|l| l.status == LaneStatus::Quarantined)
                    .count(),
                if self.inner.cfg.coordinator.is_none() {
                    "not configured"
                } else if self.inner.metrics.link_up.get() == 1 {
                    "up"
                } else {
                    "down"
                }
            ),
            Err(e) => format!("status unavailable: {e}"),
        }
    }

    /// Records a rejected (stale, misaddressed) coordinator message, identifiers only.
    pub fn audit_stale(
        &self,
        category: &str,
        lane_id: Option<&str>,
        generation: Option<u64>,
        detail: &str,
    ) {
        self.inner
            .metrics
            .stale
            .get_or_create(&metrics::HostMetrics::category(category))
            .inc();
        self.inner
            .audit
            .record(category, lane_id, generation, detail);
    }

    pub fn audit_path(&self) -> PathBuf {
        self.inner.audit.path().to_path_buf()
    }

    /// Stops watching (generations keep running, to be re-adopted by the next supervisor).
    pub fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
    }

    fn view(&self, rec: &LaneRecord, generation: Option<GenView>) -> LaneView {
        let sock = self.inner.tmux(&rec.lane).socket().to_path_buf();
        LaneView {
            lane: rec.lane.clone(),
            lane_id: rec.lane_id.clone(),
            lane_incarnation_id: rec.lane_incarnation_id.clone(),
            status: rec.status,
            quarantine_reason: rec.quarantine_reason.clone(),
            current_generation: rec.current_generation,
            generation,
            attach: format!("tmux -S {} attach -t ={}", sock.display(), rec.lane),
            tmux_socket: sock,
        }
    }
}

/// Pings the systemd watchdog at half its interval — but only when a full status read
/// (every lane's lock, the state the control socket serves) completes in time. A lane
/// stuck under a hung operation therefore stops the pings, and systemd restarts the
/// supervisor (generations keep running and are re-adopted).
async fn watchdog(sup: Supervisor, every: std::time::Duration) {
    let half = every / 2;
    loop {
        tokio::time::sleep(half).await;
        match tokio::time::timeout(half, sup.status_line()).await {
            Ok(line) => crate::systemd::alive(&line),
            Err(_) => tracing::error!(
                "the supervisor's lanes did not answer within {} ms; withholding the watchdog ping",
                half.as_millis()
            ),
        }
    }
}

/// After a generation finishes on its own (crash, SIGKILL, exit), folds the result into
/// the lane record without waiting for the next lane operation.
pub(crate) fn spawn_applier(inner: Arc<Inner>, lane: String, live: &LiveGen) {
    let mut done = live.done.clone();
    tokio::spawn(async move {
        let fin = match done.wait_for(|v| v.is_some()).await {
            Ok(v) => v.clone(),
            Err(_) => return, // watcher ended without finishing: supervisor shutdown
        };
        let Some(fin) = fin else { return };
        let Ok(name) = LaneName::parse(&lane) else {
            return;
        };
        if let Ok(slot) = inner.slot(&name) {
            slot.lock().await.apply_finish(&inner.store, &fin);
        }
        publish(&inner).await;
    });
}

/// Runs the supervisor daemon until SIGTERM or SIGINT.
pub async fn run_daemon(cfg: Config) -> Result<(), SupervisorError> {
    // Everything `mosaic doctor` checks, before anything is created.
    let report = crate::doctor::run(cfg.cgroup_root.as_deref());
    if !report.can_run_supervisor {
        let failed: Vec<String> = report
            .checks
            .iter()
            .filter(|c| c.required && !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        return Err(SupervisorError::Config {
            detail: format!("this host cannot run the supervisor: {}", failed.join("; ")),
        });
    }
    let sup = Supervisor::open(cfg)?;
    // The daemon lives in `supervisor/` so the delegated root holds no process itself.
    let me = sup.inner.tree.supervisor();
    me.create()?;
    me.join_self()?;
    let report = sup.recover().await?;
    tracing::info!(
        adopted = report.adopted,
        receipts_written = report.receipts_written,
        quarantined = report.quarantined,
        "recovery done"
    );
    for lane in sup.inner.cfg.lanes.clone() {
        match sup.lane_create(lane.as_str()).await {
            Ok(v) => tracing::info!(lane = %v.lane_id, attach = %v.attach, "lane ready"),
            Err(SupervisorError::LaneExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if let Some(link) = sup.inner.cfg.coordinator.clone() {
        sup.connect_coordinator(&link).await?;
    }
    if let Some(addr) = sup.inner.cfg.metrics_listen.clone() {
        sup.serve_metrics(&addr).await?;
    }
    let listener = control::bind(&sup.inner.cfg.control_socket())?;
    tracing::info!(socket = %sup.inner.cfg.control_socket().display(), "supervisor ready");
    // Serving: lanes re-adopted, the control socket bound.
    crate::systemd::ready(&sup.status_line().await);
    if let Some(every) = crate::systemd::watchdog() {
        tokio::spawn(watchdog(sup.clone(), every));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| SupervisorError::Io {
            what: "signal handler",
            path: PathBuf::from("SIGTERM"),
            source,
        })?;
    tokio::select! {
        r = control::serve(sup.clone(), listener) => r?,
        _ = term.recv() => tracing::info!("SIGTERM: leaving lanes running"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: leaving lanes running"),
    }
    crate::systemd::stopping();
    sup.shutdown();
    let _ = std::fs::remove_file(sup.inner.cfg.control_socket());
    Ok(())
}
