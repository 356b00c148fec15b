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
pub mod broker;
pub mod config;
pub mod control;
pub mod coordinated;
pub mod gateway;
pub(crate) mod hand_on_plan;
pub mod identity;
pub mod names;
pub mod outbox;
pub mod progress;
pub mod push;
pub mod ratelimit;
pub mod receipt;
pub mod state;
pub mod tmux;
mod tmuxctl;

mod adopt;
mod confinement;
mod generation;
mod harness;
mod launch;
mod phases;
pub use launch::Step as LaunchStep;
pub use start::WorkspaceOrder;
pub mod laneclient;
pub mod lanesock;
pub mod link;
pub mod metrics;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{watch, Mutex};

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

pub(crate) mod artifacts;
pub mod checkpoints;
mod daemon;
mod decommission;
mod end;
mod error;
mod lanes;
mod lanewatch;
mod setup;
mod start;
mod unwritten;
mod views;
mod workspaces;

pub use daemon::run_daemon;
pub(crate) use daemon::spawn_applier;
pub use error::*;
pub use lanes::*;
pub use views::*;

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
        // Held open read-only: a descriptor open for writing would keep the state
        // filesystem from being remounted read-only under a running supervisor.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .and_then(|created| {
                drop(created);
                std::fs::File::open(&lock_path)
            })
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
            leaving: std::sync::atomic::AtomicBool::new(false),
            shutdown,
            host_state: watch::channel(HostState::default()).0,
            reported: Arc::new(watch::channel(HostState::default()).0),
            link_session: Arc::new(watch::channel(None).0),
            decommissioned: watch::channel(false).0,
            publish_lock: Mutex::new(()),
            metrics: Arc::new(metrics::HostMetrics::new()),
            quarantined_seen: std::sync::Mutex::new(Default::default()),
            tmux_controls: Default::default(),
            unwritten: Default::default(),
            confine_support: {
                let probed = crate::confine::probe().map_err(|e| e.to_string());
                // A host that cannot confine, for tests (`failpoints` builds only).
                #[cfg(feature = "failpoints")]
                let probed = match fail::eval("confine:probe", |_| ()) {
                    Some(()) => {
                        Err("failpoint confine:probe: landlock reported missing".to_string())
                    }
                    None => probed,
                };
                match &probed {
                    Ok(s) => tracing::info!(
                        landlock_abi = s.landlock_abi,
                        "generations run confined (own mount, IPC, network and PID namespaces, landlock, seccomp, no capabilities)"
                    ),
                    Err(e) => {
                        tracing::error!(reason = %e, "this host cannot confine generations: confined lanes refuse to start (see `mosaic doctor`)")
                    }
                }
                probed
            },
            broker: Default::default(),
            _lock: lock,
        };
        if inner.cfg.coordinator.is_some() {
            inner.broker.expect();
        }
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Where this host's effect paths find the authority that admits their effects.
    pub fn broker_slot(&self) -> &broker::BrokerSlot {
        &self.inner.broker
    }

    pub fn cgroup_tree(&self) -> &CgroupTree {
        &self.inner.tree
    }

    /// Re-adopts what survived a previous supervisor and writes receipts for what did not,
    /// then starts the host's own watches: the writer of held receipts (`unwritten`) and
    /// the watch of every lane's tmux server (`lanewatch`). Must run once, before serving
    /// requests.
    pub async fn recover(&self) -> Result<adopt::RecoveryReport, SupervisorError> {
        let report = adopt::recover(&self.inner).await?;
        tokio::spawn(unwritten::retry(self.inner.clone()));
        tokio::spawn(lanewatch::watch(self.inner.clone()));
        Ok(report)
    }

    /// Creates a lane, or recreates a destroyed one under a fresh incarnation.
    pub async fn lane_create(&self, lane: &str) -> Result<LaneView, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let _creating = self.inner.create_lock.lock().await;
        if self.inner.leaving.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(SupervisorError::State {
                detail: format!("lane {lane} not created: this host is being decommissioned"),
            });
        }
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
        // Its own uid before anything of it exists (a failed creation burns one: uids are
        // never handed out twice).
        let uid = {
            let (store, range, ledger) = (
                self.inner.store.clone(),
                self.inner.cfg.lane_uids,
                self.inner.cfg.lane_uid_ledger.clone(),
            );
            tokio::task::spawn_blocking(move || store.allocate_uid(range, &ledger))
                .await
                .map_err(|e| SupervisorError::State {
                    detail: format!("uid allocation task failed: {e}"),
                })??
        };
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
            uid: Some(uid),
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
    /// The lane's current incarnation, and whether it is destroyed (`None`: no such lane).
    pub async fn lane_incarnation(&self, lane: &str) -> Option<(String, bool)> {
        let name = LaneName::parse(lane).ok()?;
        let slot = self.inner.slot(&name).ok()?;
        let l = slot.lock().await;
        Some((
            l.rec.lane_incarnation_id.clone(),
            l.rec.status == LaneStatus::Destroyed,
        ))
    }

    pub async fn lane_destroy(&self, lane: &str) -> Result<LaneView, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let mut l = slot.lock().await;
        if l.rec.status == LaneStatus::Destroyed {
            return Err(SupervisorError::NoSuchLane(lane.to_string()));
        }
        // The quarantine of a lane whose last end is not durable is its record of that end:
        // it stays until the held receipt is written.
        if let Some(generation) = self
            .inner
            .unwritten
            .holds_incarnation(&l.rec.lane_incarnation_id)
        {
            return Err(SupervisorError::ReceiptNotDurable {
                lane: lane.to_string(),
                generation,
            });
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
            receipts_not_durable: self.inner.unwritten.views(),
            coordinator_clock: self.inner.metrics.clock.lock().ok().and_then(|c| c.clone()),
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
            confinement: if self.inner.cfg.confined(&rec.lane) {
                "enforced"
            } else {
                "none"
            },
            uid: rec.uid.filter(|_| self.inner.cfg.confined(&rec.lane)),
        }
    }
}
