//! Starting a generation, as one staged value.
//!
//! A start walks five stages, each named by [`Stage`]: the generation number is burned, the
//! cgroup is made (with the generation record, its socket, nonce hand-off and private
//! area), the shim is verified, the harness is started, and the generation is watched.
//!
//! Everything a stage makes is held by one [`Launching`] value, and every fallible step
//! after the number is burned lives inside [`Launching::run`]. [`launch`] has exactly one
//! error path out of `run`: [`Launching::abort`], which ends whatever exists (the lane
//! socket, the shim listener, the nonce file, the cgroup's whole tree, the private area)
//! and writes the generation's termination receipt. So no early return can leave a process
//! tree without a watcher or a cgroup without a receipt: outside `run` there is no early
//! return, and inside it every `?` lands in `abort`.
//!
//! With the `failpoints` feature, `FAILPOINTS="launch:<step>=1*return"` makes that step
//! fail once (see [`Step`]); the regression tests inject each one.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;

use super::generation::{
    self, bind_socket, cleanup_cgroup, gen_paths, harness_dir, harness_run_dir, remove_harness_dir,
    spawn_watcher, verify_hello, Hello, Link, Watcher,
};
use super::identity::{self, LaunchNonce, ProcessIdentity};
use super::receipt::{self, ObservationSource, TerminationReason};
use super::state::{GenRecord, GenStatus, LaneRecord};
use super::{Finished, Inner, LiveGen, SupervisorError};
use crate::adapter::LaunchPlan;
use crate::cgroup::Cg;
use crate::shim::proto::{ShimMsg, SupervisorMsg};
use crate::util::durable;

/// How long a launched shim has to connect, present its identity and report the start.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(15);

/// How a generation is started: by an operator on this host, or by the coordinator's chain
/// (which allocates the generation number and hands the contract over the lane socket).
pub(crate) enum Origin {
    Local,
    Coordinated {
        generation: u64,
        session: Arc<super::lanesock::GenSession>,
        binding: Box<super::state::CoordBinding>,
    },
}

impl Origin {
    fn binding(&self) -> Option<&super::state::CoordBinding> {
        match self {
            Self::Coordinated { binding, .. } => Some(binding),
            Self::Local => None,
        }
    }
}

pub(crate) use super::phases::Phases;

/// How far a launch got. An abort names the last stage reached in its receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    /// The generation number is durable in the lane record; nothing else exists yet.
    Burned,
    /// The generation's cgroup exists (with its record, socket, nonce and private area).
    CgroupMade,
    /// The shim in the pane proved its identity (pid, start time, cgroup, nonce).
    ShimVerified,
    /// The shim reported the harness started inside the cgroup.
    HarnessStarted,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Self::Burned => "burned",
            Self::CgroupMade => "cgroup-made",
            Self::ShimVerified => "shim-verified",
            Self::HarnessStarted => "harness-started",
        }
    }
}

/// Every fallible step of a launch after the number is burned, in order. Each is a
/// failpoint (`launch:<name>`) in a `failpoints` build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The generation record (status starting) is made durable.
    Record,
    /// The fresh cgroup directory is created.
    Cgroup,
    /// The cgroup's id is read.
    CgroupId,
    /// The shim's socket is bound.
    Socket,
    /// The nonce hand-off file is written.
    Nonce,
    /// The adapter fills the private area.
    Area,
    /// The record is saved again with the conversation id the area chose.
    AreaRecord,
    /// The pane is respawned with the shim.
    Respawn,
    /// The shim attaches and its identity is verified.
    Attach,
    /// The lane socket of a coordinated generation is served.
    LaneSocket,
    /// The shim is told to launch and reports the harness started.
    HarnessStart,
    /// The verified identity is made durable (status live).
    IdentityRecord,
}

impl Step {
    pub const ALL: [Step; 12] = [
        Step::Record,
        Step::Cgroup,
        Step::CgroupId,
        Step::Socket,
        Step::Nonce,
        Step::Area,
        Step::AreaRecord,
        Step::Respawn,
        Step::Attach,
        Step::LaneSocket,
        Step::HarnessStart,
        Step::IdentityRecord,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Record => "record",
            Self::Cgroup => "cgroup",
            Self::CgroupId => "cgroup-id",
            Self::Socket => "socket",
            Self::Nonce => "nonce",
            Self::Area => "area",
            Self::AreaRecord => "area-record",
            Self::Respawn => "respawn",
            Self::Attach => "attach",
            Self::LaneSocket => "lane-socket",
            Self::HarnessStart => "harness-start",
            Self::IdentityRecord => "identity-record",
        }
    }

    /// The failpoint's name (`launch:<step>`).
    pub fn failpoint(self) -> String {
        format!("launch:{}", self.as_str())
    }
}

/// Fails the step when its failpoint is set (`failpoints` builds only). A failpoint with an
/// argument (`return(<incarnation>)`) fails only the launches of that lane incarnation, so
/// tests sharing one process cannot trip each other's.
#[cfg(feature = "failpoints")]
fn inject(step: Step, incarnation: &str) -> Result<(), SupervisorError> {
    let name = step.failpoint();
    let fire = fail::eval(&name, |arg| arg.is_none_or(|a| a == incarnation)).unwrap_or(false);
    if fire {
        return Err(SupervisorError::Injected { failpoint: name });
    }
    Ok(())
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
fn inject(_step: Step, _incarnation: &str) -> Result<(), SupervisorError> {
    Ok(())
}

/// A launch that did not reach a watcher: the error, and how the generation was ended (its
/// receipt, and a quarantine when cleanup or the receipt was not provably complete).
#[derive(Debug)]
pub(crate) enum LaunchError {
    /// Refused before anything was reserved or made: nothing to end, no receipt.
    Refused(SupervisorError),
    /// Failed after the number was burned: ended, with its receipt.
    Aborted {
        error: SupervisorError,
        finished: Box<Finished>,
    },
}

/// What a launch holds at any moment: each field is set by the stage that makes it, and
/// `abort` ends each one that is set.
struct Launching {
    inner: Arc<Inner>,
    stage: Stage,
    rec: GenRecord,
    cg: Cg,
    nonce_file: PathBuf,
    listener: Option<UnixListener>,
    lane_server: Option<super::lanesock::LaneServer>,
    link: Option<Link>,
    gateway: Option<super::gateway::Gateway>,
}

/// What `run` hands over once the harness is started and its identity durable.
struct Ready {
    link: Link,
    shim_pidfd: OwnedFd,
    harness_pidfd: Option<OwnedFd>,
    lane_server: Option<super::lanesock::LaneServer>,
    gateway: Option<super::gateway::Gateway>,
}

/// Launches a fresh generation on a lane whose previous generation is already gone.
pub(crate) async fn launch(
    inner: &Arc<Inner>,
    lane: &mut LaneRecord,
    plan: LaunchPlan,
    origin: Origin,
    phases: &Phases,
) -> Result<LiveGen, LaunchError> {
    // Validation first: nothing below this block reserves or makes anything.
    let generation = match &origin {
        Origin::Local => lane.next_generation,
        Origin::Coordinated { generation, .. } if *generation >= lane.next_generation => {
            *generation
        }
        Origin::Coordinated { generation, .. } => {
            return Err(LaunchError::Refused(SupervisorError::Launch {
                lane: lane.lane_id.clone(),
                generation: *generation,
                detail: format!(
                    "generation {generation} does not move past {}",
                    lane.next_generation - 1
                ),
            }))
        }
    };
    let nonce = LaunchNonce::generate().map_err(|e| LaunchError::Refused(e.into()))?;
    let cg = inner
        .tree
        .generation(&lane.lane, &lane.lane_incarnation_id, generation);
    let (socket, nonce_file) = gen_paths(inner, &lane.lane_incarnation_id, generation);
    let rec = GenRecord {
        lane: lane.lane.clone(),
        lane_id: lane.lane_id.clone(),
        lane_incarnation_id: lane.lane_incarnation_id.clone(),
        generation,
        runtime: plan.runtime.to_string(),
        status: GenStatus::Starting,
        cgroup: cg.path().to_path_buf(),
        socket,
        exit_record: inner
            .store
            .gen_dir(&lane.lane_incarnation_id)
            .join(format!("gen-{generation}.exit.json")),
        nonce_digest: nonce.digest(),
        graceful_signal: format!("{:?}", plan.graceful_signal),
        grace_period_ms: plan.grace_period.as_millis() as u64,
        identity: None,
        started_at: crate::util::now_rfc3339(),
        receipt_key: receipt::idempotency_key(&lane.lane_id, &lane.lane_incarnation_id, generation),
        coord: match &origin {
            Origin::Local => None,
            Origin::Coordinated { binding, .. } => Some((**binding).clone()),
        },
        conversation_id: None,
        workspace: None,
        fenced: false,
        held: false,
        handoff_checkpoint: None,
        requested_checkpoints: 0,
        requested_checkpoint_at: None,
        artifact_paths: crate::adapter::artifact_paths_of(plan.family),
        uid: if inner.cfg.confined(&lane.lane) {
            lane.uid
        } else {
            None
        },
    };

    // The number is burned durably before anything is made, so a crash mid-launch can never
    // lead to the same generation number twice. The bumped `next_generation` stays even if
    // the write fails: it may have reached the disk, and a number is never handed out twice.
    let previous = lane.current_generation;
    lane.next_generation = generation + 1;
    lane.current_generation = Some(generation);
    if let Err(e) = inner.store.save_lane(lane) {
        lane.current_generation = previous;
        return Err(LaunchError::Refused(e));
    }
    phases.mark("generation number durable");

    let mut l = Launching {
        inner: inner.clone(),
        stage: Stage::Burned,
        rec,
        cg,
        nonce_file,
        listener: None,
        lane_server: None,
        link: None,
        gateway: None,
    };
    match l.run(nonce, &plan, &origin, phases).await {
        Ok(ready) => {
            tracing::info!(
                lane_id = %l.rec.lane_id,
                generation,
                root_pid = l.rec.identity.as_ref().map(|i| i.root_pid),
                harness_pid = l.rec.identity.as_ref().and_then(|i| i.harness_pid),
                "generation live"
            );
            // Nothing fallible from here: the watcher owns the generation.
            Ok(spawn_watcher(
                Watcher {
                    inner: inner.clone(),
                    graceful: plan.graceful_signal,
                    grace: plan.grace_period,
                    rec: l.rec,
                    link: Some(ready.link),
                    shim_pidfd: Some(ready.shim_pidfd),
                    harness_pidfd: ready.harness_pidfd,
                    lane_server: ready.lane_server,
                    gateway: ready.gateway,
                },
                false,
            ))
        }
        Err(error) => Err(l.abort(error).await),
    }
}

impl Launching {
    fn launch_error(&self, detail: impl Into<String>) -> SupervisorError {
        SupervisorError::Launch {
            lane: self.rec.lane_id.clone(),
            generation: self.rec.generation,
            detail: detail.into(),
        }
    }

    /// Every fallible step after the number is burned. Any error returned here is ended
    /// by `abort`; what each step makes is stored in `self` before the next step runs.
    async fn run(
        &mut self,
        nonce: LaunchNonce,
        plan: &LaunchPlan,
        origin: &Origin,
        phases: &Phases,
    ) -> Result<Ready, SupervisorError> {
        let inner = self.inner.clone();
        let phase = |what: &'static str| phases.mark(what);

        // Stage: burned. The record comes before the cgroup, so a crash from here on
        // leaves a record that points at whatever was made, and a restart ends it.
        inject(Step::Record, &self.rec.lane_incarnation_id)?;
        inner.store.save_gen(&self.rec)?;

        inject(Step::Cgroup, &self.rec.lane_incarnation_id)?;
        self.cg.create_fresh()?;
        self.stage = Stage::CgroupMade;
        phase("cgroup created");

        // Stage: cgroup made.
        inject(Step::CgroupId, &self.rec.lane_incarnation_id)?;
        let cgroup_id = self.cg.id()?;
        let cgroup_rel = inner.tree.rel(self.cg.path());
        inject(Step::Socket, &self.rec.lane_incarnation_id)?;
        self.listener = Some(bind_socket(&self.rec.socket)?);
        inject(Step::Nonce, &self.rec.lane_incarnation_id)?;
        // The nonce file is a hand-off to this start's shim, not state: a restart never reads
        // it (a generation whose shim was not verified before a crash is ended), so it is not
        // fsync'd. `abort` removes it. The nonce itself (zeroized) goes at once.
        durable::create_private(&self.nonce_file, nonce.expose_hex().as_bytes())?;
        drop(nonce);
        phase("nonce written, generation record durable");
        inject(Step::Area, &self.rec.lane_incarnation_id)?;
        let confined = inner.cfg.confined(&self.rec.lane);
        let upstream = inner.cfg.providers.get(&plan.runtime.runtime);
        let provider_url = upstream.map(|u| {
            if confined {
                crate::confine::net::gateway_url()
            } else {
                u.url()
            }
        });
        let coordinated = matches!(origin, Origin::Coordinated { .. });
        // Work in a repository: its workspace, bound over a confined generation's working
        // directory or (unconfined) the adapter's, which records it as trusted.
        let lane = super::workspaces::Lane {
            name: &self.rec.lane,
            id: &self.rec.lane_id,
            uid: self.rec.uid,
            cg: &self.cg,
        };
        let repo_dir = super::workspaces::prepare(&inner, origin.binding(), lane)
            .await
            .map_err(|e| self.launch_error(e))?;
        let unconfined_workspace = repo_dir.as_deref().filter(|_| !confined);
        let url = provider_url.as_deref();
        let prepared = super::harness::prepare(&inner, plan, &self.rec, url, unconfined_workspace)
            .map_err(|detail| self.launch_error(detail))?;
        // A confined, coordinated generation's workspace is read-only to it until its
        // activation commits (staging makes no effect); recorded before its shim starts,
        // so a restarted supervisor knows what to open or close.
        let workspace = prepared.cwd.clone().filter(|_| confined && coordinated);
        if prepared.conversation_id.is_some() || workspace.is_some() {
            inject(Step::AreaRecord, &self.rec.lane_incarnation_id)?;
            self.rec.conversation_id = prepared.conversation_id.clone();
            self.rec.workspace = workspace.clone();
            inner.store.save_gen(&self.rec)?;
        }
        let lane_socket = coordinated.then(|| super::lanesock::path_for(&self.rec.socket));
        let area = harness_dir(&inner, &self.rec.lane_incarnation_id, self.rec.generation);
        let run = harness_run_dir(&inner, &self.rec.lane_incarnation_id, self.rec.generation);
        // Its areas are its uid's alone (0700 each, as the adapter made them).
        if let Some(uid) = self.rec.uid {
            for d in [&area, &run] {
                durable::chown_tree(d, uid, uid).map_err(|e| {
                    self.launch_error(format!("giving {} to uid {uid}: {e}", d.display()))
                })?;
            }
        }
        let confinement = super::confinement::for_generation(
            &inner.cfg,
            &super::confinement::Generation {
                lane: &self.rec.lane,
                lane_id: &self.rec.lane_id,
                area: &area,
                run: &run,
                lane_socket: lane_socket.as_deref(),
                program: prepared.argv.first().map(String::as_str),
                // Every confined generation has the broker's listener: its provider (if
                // its runtime declares one) and egress to what its scope names.
                gateway: true,
                uid: self.rec.uid,
                workspace: workspace.as_deref(),
                workspace_source: repo_dir.as_deref().filter(|_| confined),
            },
        )?;
        phase("harness area prepared");

        // Stage: shim verified.
        let shim_argv: Vec<String> = vec![
            inner.cfg.shim_exe().display().to_string(),
            "--cgroup".into(),
            self.cg.path().display().to_string(),
            "--socket".into(),
            self.rec.socket.display().to_string(),
            "--nonce-file".into(),
            self.nonce_file.display().to_string(),
            "--exit-record".into(),
            self.rec.exit_record.display().to_string(),
        ];
        inject(Step::Respawn, &self.rec.lane_incarnation_id)?;
        {
            let (inner, lane) = (inner.clone(), self.rec.lane.clone());
            tokio::task::spawn_blocking(move || inner.tmux_respawn(&lane, &shim_argv))
                .await
                .map_err(|e| SupervisorError::State {
                    detail: format!("respawn task failed: {e}"),
                })??;
        }
        phase("pane respawned");
        inject(Step::Attach, &self.rec.lane_incarnation_id)?;
        let listener = self
            .listener
            .as_ref()
            .ok_or_else(|| SupervisorError::State {
                detail: "shim listener missing".into(),
            })?;
        let attached = attach_new(&inner, listener, &self.rec, &cgroup_rel).await;
        let _ = std::fs::remove_file(&self.nonce_file);
        let (link, shim_pidfd, seen) = attached?;
        self.link = Some(link);
        self.stage = Stage::ShimVerified;
        phase("shim verified");

        let generation = self.rec.generation;
        let mut env = prepared.env.clone();
        let (secret_env, gateway_secrets) =
            super::harness::credentials(&confinement, &plan.secret_env, &mut env);
        if let Some(url) = &provider_url {
            env.push(("MOSAIC_PROVIDER_URL".into(), url.clone()));
        }
        if confined {
            env.extend(super::harness::proxy_env());
        }
        env.extend([
            ("MOSAIC_LANE_ID".to_string(), self.rec.lane_id.clone()),
            (
                "MOSAIC_LANE_INCARNATION_ID".to_string(),
                self.rec.lane_incarnation_id.clone(),
            ),
            ("MOSAIC_GENERATION".to_string(), generation.to_string()),
        ]);
        if let Origin::Coordinated {
            session, binding, ..
        } = origin
        {
            inject(Step::LaneSocket, &self.rec.lane_incarnation_id)?;
            session.bind_harness(plan.family, self.rec.conversation_id.clone());
            let _ = session.assignment_id.set(binding.assignment_id.clone());
            if confined {
                let _ = session
                    .push
                    .set(super::harness::push_ctx(&inner, &self.rec, &area));
            }
            let path = super::lanesock::path_for(&self.rec.socket);
            let server =
                super::lanesock::serve(&path, cgroup_rel.clone(), session.clone(), self.rec.uid)?;
            env.push(("MOSAIC_LANE_SOCKET".into(), path.display().to_string()));
            env.push((
                "MOSAIC_BIN".into(),
                inner.cfg.mosaic_exe().display().to_string(),
            ));
            self.lane_server = Some(server);
        }

        // Stage: harness started.
        inject(Step::HarnessStart, &self.rec.lane_incarnation_id)?;
        let banner = format!(
            "mosaic: lane {} generation {} ({}) — incarnation {}",
            self.rec.lane_id, generation, self.rec.runtime, self.rec.lane_incarnation_id
        );
        let link = self.link.as_mut().ok_or_else(|| SupervisorError::State {
            detail: "shim link missing".into(),
        })?;
        let (harness_pid, harness_start_time, gateway_fd) = start_harness(
            link,
            SupervisorMsg::Launch {
                argv: prepared.argv.clone(),
                env,
                secret_env,
                cwd: prepared.cwd.as_ref().map(|d| d.display().to_string()),
                banner,
                confinement: sent_confinement(&confinement),
            },
        )
        .await
        .map_err(|detail| self.launch_error(detail))?;
        self.stage = Stage::HarnessStarted;
        phase("harness started");
        // The gateway's listener, copied from the verified shim, served before the
        // generation counts as live (requests made meanwhile wait in its backlog).
        if matches!(&confinement, crate::confine::Confinement::Enforced { policy } if policy.gateway.is_some())
        {
            let route = super::gateway::Route {
                lane_id: self.rec.lane_id.clone(),
                generation,
                runtime: plan.runtime.runtime.clone(),
                upstream: upstream.cloned(),
                secrets: Ok(gateway_secrets),
                broker: inner.broker.clone(),
            };
            let served = super::harness::serve_gateway(&inner, &shim_pidfd, gateway_fd, route)
                .map_err(|e| self.launch_error(e))?;
            self.gateway = Some(served);
        }
        // Live only once the harness shows its confinement (a harness already gone has its
        // exit report next on the link).
        let confinement_seen = super::confinement::verify(&confinement, harness_pid, self.rec.uid)
            .map_err(|detail| self.launch_error(detail))?;
        phase("confinement verified");
        // The harness may already be gone (exit=0); its exit report is then next on the link.
        let harness_pidfd = match identity::observe(harness_pid) {
            Ok(h)
                if h.cgroup == cgroup_rel
                    && (harness_start_time == 0 || h.start_time == harness_start_time) =>
            {
                generation::pidfd(harness_pid).ok().filter(|_| {
                    identity::observe(harness_pid)
                        .is_ok_and(|again| again.start_time == h.start_time)
                })
            }
            Ok(h) => {
                return Err(self.launch_error(format!(
                    "harness pid {harness_pid} is in {} with start time {}, expected {cgroup_rel} / {harness_start_time}",
                    h.cgroup, h.start_time
                )))
            }
            Err(_) => None,
        };

        // The identity is what was verified; it is in the record (and in an abort's
        // receipt) from here on, whether or not the save below succeeds.
        self.rec.identity = Some(ProcessIdentity {
            boot_id: inner.boot_id.clone(),
            root_pid: seen.pid,
            root_start_time: seen.start_time,
            exe_path: seen.exe_path,
            exe_dev: seen.exe_dev,
            exe_ino: seen.exe_ino,
            cgroup_path: cgroup_rel,
            cgroup_id,
            launch_nonce_digest: self.rec.nonce_digest.clone(),
            lane_id: self.rec.lane_id.clone(),
            lane_incarnation_id: self.rec.lane_incarnation_id.clone(),
            generation,
            harness_pid: Some(harness_pid),
            harness_start_time: Some(harness_start_time),
            confinement: confinement_seen,
        });
        self.rec.status = GenStatus::Live;
        inject(Step::IdentityRecord, &self.rec.lane_incarnation_id)?;
        if let Err(e) = inner.store.save_gen(&self.rec) {
            // Not durable: a restart could not re-adopt this tree, so it must not live.
            self.rec.status = GenStatus::Starting;
            return Err(e);
        }
        phase("identity durable");
        if let Some(l) = self.listener.take() {
            drop(l);
            let _ = std::fs::remove_file(&self.rec.socket);
        }
        let link = self.link.take().ok_or_else(|| SupervisorError::State {
            detail: "shim link missing".into(),
        })?;
        Ok(Ready {
            link,
            shim_pidfd,
            harness_pidfd,
            lane_server: self.lane_server.take(),
            gateway: self.gateway.take(),
        })
    }

    /// Ends a launch that failed at any step after the number was burned: the lane socket
    /// and shim listener are closed, the nonce hand-off removed, the cgroup's tree killed,
    /// verified empty and removed, the private area removed, and the receipt written. A
    /// cleanup that was not verified, or a receipt that could not be made durable, is
    /// reported as a quarantine (the caller applies it to the lane).
    async fn abort(mut self, error: SupervisorError) -> LaunchError {
        let inner = self.inner.clone();
        tracing::error!(
            lane_id = %self.rec.lane_id,
            generation = self.rec.generation,
            stage = self.stage.as_str(),
            error = %error,
            "launch failed"
        );
        if let Some(server) = self.lane_server.take() {
            server.end("the generation failed to start");
        }
        self.gateway = None;
        if self.listener.take().is_some() {
            let _ = std::fs::remove_file(&self.rec.socket);
        }
        self.link = None;
        let _ = std::fs::remove_file(&self.nonce_file);
        let cleanup = cleanup_cgroup(&inner, self.cg.path().to_path_buf()).await;
        let verified_empty = cleanup.verified_empty;
        let mut quarantine = cleanup.error.clone().map(|e| {
            format!(
                "cleanup of generation {} after a failed launch was not verified: {e}",
                self.rec.generation
            )
        });
        let r = generation::build_receipt(
            &inner,
            &self.rec,
            ObservationSource::Supervisor,
            TerminationReason::LaunchFailed,
            None,
            None,
            cleanup,
            Some(format!(
                "launch failed after stage {}: {error}",
                self.stage.as_str()
            )),
        );
        // Its private area once its receipt is durable (its artifact was sealed from it).
        let unwritten = super::unwritten::settle_end(&inner, &r, &self.rec);
        if verified_empty && unwritten.is_none() {
            remove_harness_dir(&inner, &self.rec.lane_incarnation_id, self.rec.generation);
        }
        if let Some(why) = unwritten {
            quarantine.get_or_insert(why);
        }
        self.rec.status = GenStatus::Terminated;
        LaunchError::Aborted {
            error,
            finished: Box::new(Finished {
                receipt: r,
                quarantine,
            }),
        }
    }
}

/// The confinement as sent to the shim. With the `failpoints` feature,
/// `FAILPOINTS=confine:wrong-uid=return` sends another uid than the lane's, so a test can
/// show that the supervisor's check of the started harness refuses it.
fn sent_confinement(c: &crate::confine::Confinement) -> crate::confine::Confinement {
    #[allow(unused_mut)]
    let mut sent = c.clone();
    #[cfg(feature = "failpoints")]
    if fail::eval("confine:wrong-uid", |_| ()).is_some() {
        if let crate::confine::Confinement::Enforced { policy } = &mut sent {
            policy.uid = policy.uid.map(|u| u + 1);
        }
    }
    sent
}

/// Sends the launch message and waits (bounded) for the shim's report of the harness start:
/// its pid, start time, and the shim's gateway listener descriptor if it bound one.
async fn start_harness(
    link: &mut Link,
    launch: SupervisorMsg,
) -> Result<(i32, u64, Option<i32>), String> {
    link.send(&launch)
        .await
        .map_err(|e| format!("sending launch: {e}"))?;
    match tokio::time::timeout(ATTACH_TIMEOUT, link.recv()).await {
        Ok(Ok(Some(ShimMsg::Started {
            harness_pid,
            harness_start_time,
            gateway_fd,
        }))) => Ok((harness_pid, harness_start_time, gateway_fd)),
        Ok(Ok(Some(ShimMsg::LaunchFailed { reason }))) => Err(reason),
        Ok(Ok(other)) => Err(format!(
            "unexpected shim message {}",
            generation::msg_kind(&other)
        )),
        Ok(Err(e)) => Err(format!("shim link: {e}")),
        Err(_) => Err("shim did not report the harness start in time".into()),
    }
}

/// Accepts connections until one presents a valid first-attach identity. Every rejected
/// attempt is audited and answered with `Reject`; none can delay the real shim beyond the
/// attach timeout.
async fn attach_new(
    inner: &Arc<Inner>,
    listener: &UnixListener,
    rec: &GenRecord,
    cgroup_rel: &str,
) -> Result<(Link, OwnedFd, identity::Observed), SupervisorError> {
    let deadline = tokio::time::Instant::now() + ATTACH_TIMEOUT;
    loop {
        let accepted = tokio::time::timeout_at(deadline, listener.accept())
            .await
            .map_err(|_| SupervisorError::Launch {
                lane: rec.lane_id.clone(),
                generation: rec.generation,
                detail: "the shim did not attach in time".into(),
            })?;
        // Refused by the kernel (out of descriptors): tried again until the deadline.
        let Ok((stream, _)) = accepted.inspect_err(|e| tracing::warn!(lane_id = %rec.lane_id,
            generation = rec.generation, error = %e, "cannot accept the shim's connection; trying again"))
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut link = Link::from_stream(stream);
        let hello = tokio::time::timeout_at(deadline, link.recv()).await;
        let verdict = match hello {
            Ok(Ok(Some(ShimMsg::Hello {
                pid,
                start_time,
                nonce,
                harness: None,
            }))) => verify_hello(
                inner,
                &link,
                cgroup_rel,
                &rec.nonce_digest,
                None,
                Hello {
                    pid,
                    start_time,
                    nonce_hex: &nonce.0,
                },
            )
            .map_err(|e| (e.category(), e.to_string())),
            Ok(Ok(other)) => Err((
                "bad-hello",
                format!(
                    "expected a first hello, got {}",
                    generation::msg_kind(&other)
                ),
            )),
            Ok(Err(e)) => Err(("malformed", e.to_string())),
            Err(_) => Err(("timeout", "no hello before the deadline".to_string())),
        };
        match verdict {
            Ok((fd, seen)) => return Ok((link, fd, seen)),
            Err((category, detail)) => {
                inner
                    .audit
                    .record(category, Some(&rec.lane_id), Some(rec.generation), &detail);
                let _ = link
                    .send(&SupervisorMsg::Reject {
                        reason: category.to_string(),
                    })
                    .await;
            }
        }
    }
}
