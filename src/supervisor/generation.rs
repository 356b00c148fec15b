//! One generation's life: launch → verified identity → watch → stop or death → cleanup →
//! receipt.
//!
//! The watcher task is the only code that finalizes a generation. Everything that can end a
//! generation (the shim's exit report, the shim's pidfd, `cgroup.events`, a stop request, the
//! watchdog tick) is an arm of one `select!` in that task, so the first observation wins and
//! exactly one receipt is written.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};

use super::identity::{self, Claim, Expected, LaunchNonce, ProcessIdentity};
use super::receipt::{
    self, Cleanup, ObservationSource, StopCause, StopDetail, TerminationReason, TerminationReceipt,
};
use super::state::{GenRecord, GenStatus};
use super::{Finished, Inner, LiveGen, SupervisorError};
use crate::shim::proto::{ExitStatus, HarnessState, ShimMsg, SupervisorMsg};

/// Upper bound on kill → verified empty. Past it the lane is quarantined.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest accepted line on the per-generation socket.
const MAX_LINE: usize = 64 * 1024;

/// The shim connection, split for concurrent read and write.
pub(crate) struct Link {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    writer: OwnedWriteHalf,
    peer_pid: Option<i32>,
}

impl Link {
    pub(crate) fn from_stream(s: UnixStream) -> Self {
        let peer_pid = s.peer_cred().ok().and_then(|c| c.pid());
        let (r, w) = s.into_split();
        Self {
            lines: BufReader::new(r).lines(),
            writer: w,
            peer_pid,
        }
    }

    pub(crate) async fn send(&mut self, m: &SupervisorMsg) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(m).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.writer.write_all(&line).await
    }

    /// `Ok(None)` on EOF. A line that is too long or not a known message is an error.
    pub(crate) async fn recv(&mut self) -> std::io::Result<Option<ShimMsg>> {
        match self.lines.next_line().await? {
            None => Ok(None),
            Some(l) if l.len() > MAX_LINE => Err(std::io::Error::other("line too long")),
            Some(l) => serde_json::from_str(&l)
                .map(Some)
                .map_err(std::io::Error::other),
        }
    }
}

/// Paths derived from (incarnation, generation): short enough for `sun_path`.
pub(crate) fn gen_paths(inner: &Inner, incarnation: &str, generation: u64) -> (PathBuf, PathBuf) {
    let tag = &crate::util::sha256_hex(
        "mosaic/gen-socket/v1",
        &[incarnation.as_bytes(), &generation.to_be_bytes()],
    )[..20];
    let dir = inner.cfg.runtime_dir.join("gen");
    (
        dir.join(format!("{tag}.sock")),
        dir.join(format!("{tag}.nonce")),
    )
}

/// A generation's short runtime directory (`<runtime_dir>/h/<tag>`), for the sockets a
/// harness makes for itself: under the private area their paths can exceed `sun_path`, and
/// Claude Code then falls back to a directory shared by every session of the user.
pub(crate) fn harness_run_dir(inner: &Inner, incarnation: &str, generation: u64) -> PathBuf {
    let tag = &crate::util::sha256_hex(
        "mosaic/harness-run/v1",
        &[incarnation.as_bytes(), &generation.to_be_bytes()],
    )[..16];
    inner.cfg.runtime_dir.join("h").join(tag)
}

/// A generation's private harness area (config home, temp, working directory): created
/// fresh at launch, removed once the generation's cgroup is verified empty.
pub(crate) fn harness_dir(inner: &Inner, incarnation: &str, generation: u64) -> PathBuf {
    inner
        .cfg
        .state_dir
        .join("harness")
        .join(incarnation)
        .join(format!("gen-{generation}"))
}

/// Removes a generation's private harness area. Only called once nothing of the generation
/// can be running (its cgroup verified empty): nothing can be writing there.
pub(crate) fn remove_harness_dir(inner: &Inner, incarnation: &str, generation: u64) {
    let _ = std::fs::remove_dir_all(harness_run_dir(inner, incarnation, generation));
    let dir = harness_dir(inner, incarnation, generation);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a generation's harness area")
        }
    }
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_dir(parent); // only if empty
    }
}

pub(crate) fn bind_socket(path: &Path) -> Result<UnixListener, SupervisorError> {
    let io = |what, source| SupervisorError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove stale socket", e)),
    }
    let l = UnixListener::bind(path).map_err(|e| io("bind", e))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io("chmod", e))?;
    Ok(l)
}

pub(crate) fn pidfd(pid: i32) -> Result<OwnedFd, SupervisorError> {
    let p = rustix::process::Pid::from_raw(pid).ok_or(SupervisorError::Identity(
        identity::IdentityError::Gone { pid },
    ))?;
    rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
        .map_err(|_| SupervisorError::Identity(identity::IdentityError::Gone { pid }))
}

/// Verifies a Hello against procfs and the record; on success returns pidfd + observation.
/// The pidfd is opened *after* the procfs checks and the start time re-checked after it,
/// so the pidfd provably refers to the verified process, not a recycled PID.
pub(crate) struct Hello<'a> {
    pub pid: i32,
    pub start_time: u64,
    pub nonce_hex: &'a str,
}

pub(crate) fn verify_hello(
    inner: &Inner,
    link: &Link,
    cgroup_rel: &str,
    nonce_digest: &identity::NonceDigest,
    recorded: Option<&ProcessIdentity>,
    hello: Hello<'_>,
) -> Result<(OwnedFd, identity::Observed), identity::IdentityError> {
    let Hello {
        pid,
        start_time,
        nonce_hex,
    } = hello;
    let nonce = LaunchNonce::from_hex(nonce_hex)?;
    let claim = Claim {
        peer_pid: link.peer_pid.unwrap_or(-1),
        claimed_pid: pid,
        claimed_start_time: start_time,
        nonce: &nonce,
    };
    let exp = Expected {
        boot_id: &inner.boot_id,
        cgroup: cgroup_rel,
        nonce_digest,
        recorded,
    };
    let seen = identity::verify_claim(&claim, &exp)?;
    let fd = pidfd(pid).map_err(|_| identity::IdentityError::Gone { pid })?;
    let again = identity::observe(pid)?;
    if again.start_time != seen.start_time {
        return Err(identity::IdentityError::StartTime {
            pid,
            expected: seen.start_time,
            actual: again.start_time,
        });
    }
    Ok((fd, seen))
}

/// Everything a watcher needs; built by `launch` or by re-adoption.
pub(crate) struct Watcher {
    pub inner: Arc<Inner>,
    pub rec: GenRecord,
    /// `None` when finishing a generation whose shim is gone (restart reconciliation).
    pub link: Option<Link>,
    pub shim_pidfd: Option<OwnedFd>,
    pub harness_pidfd: Option<OwnedFd>,
    pub graceful: nix::sys::signal::Signal,
    pub grace: Duration,
    /// The lane socket server of a coordinated generation; ended with the generation.
    pub lane_server: Option<super::lanesock::LaneServer>,
    /// The provider gateway of a confined generation whose runtime has a provider;
    /// stopped with the generation.
    pub gateway: Option<super::gateway::Gateway>,
}

/// What ended a generation.
#[derive(Debug)]
pub(crate) enum Observation {
    HarnessExited(ObservationSource, ExitStatus),
    LaunchFailed(String),
    ShimGone(ObservationSource),
    Stop(StopCause),
    /// A restarted supervisor found it dead; `exit` is the shim's exit record if any.
    DiedWhileAway(Option<HarnessState>),
}

async fn recv_opt(link: &mut Option<Link>) -> std::io::Result<Option<ShimMsg>> {
    match link {
        Some(l) => l.recv().await,
        None => Ok(None),
    }
}

pub(crate) fn msg_kind(m: &Option<ShimMsg>) -> &'static str {
    match m {
        None => "end of stream",
        Some(ShimMsg::Hello { .. }) => "reattach hello",
        Some(ShimMsg::Started { .. }) => "started",
        Some(ShimMsg::Exited { .. }) => "exited",
        Some(ShimMsg::LaunchFailed { .. }) => "launch-failed",
    }
}

pub(crate) fn spawn_watcher(w: Watcher, adopted: bool) -> LiveGen {
    let (stop_tx, stop_rx) = mpsc::channel(1);
    let (done_tx, done) = watch::channel(None);
    let record = w.rec.clone();
    let session = w.lane_server.as_ref().map(|l| l.session.clone());
    let gateway = w.gateway.as_ref().map(|g| g.handle());
    tokio::spawn(watch_generation(w, stop_rx, done_tx));
    LiveGen {
        record,
        stop_tx,
        done,
        adopted,
        session,
        gateway,
    }
}

/// Asks the watcher to stop its generation and waits for the receipt.
pub(crate) async fn stop(
    live: LiveGen,
    cause: StopCause,
) -> Result<Arc<Finished>, SupervisorError> {
    // If the watcher already finished (it died on its own), the send fails harmlessly.
    let _ = live.stop_tx.send(cause).await;
    let mut done = live.done;
    let v = done
        .wait_for(|v| v.is_some())
        .await
        .map_err(|_| SupervisorError::ShuttingDown)?;
    v.clone().ok_or(SupervisorError::ShuttingDown)
}

fn async_fd(fd: OwnedFd) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and refers to the
    // same file description for the AsyncFd's whole lifetime.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
}

fn events_watch(cg: &Path) -> Option<AsyncFd<OwnedFd>> {
    use rustix::fs::inotify;
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).ok()?;
    inotify::add_watch(&fd, cg.join("cgroup.events"), inotify::WatchFlags::MODIFY).ok()?;
    async_fd(fd)
}

async fn readable(fd: &Option<AsyncFd<OwnedFd>>) {
    match fd {
        Some(f) => {
            if let Ok(mut g) = f.readable().await {
                // Drain inotify; for a pidfd, readiness is permanent and reading is a no-op.
                let mut buf = [0u8; 1024];
                while rustix::io::read(f.get_ref().as_fd(), &mut buf).is_ok_and(|n| n > 0) {}
                g.clear_ready();
            }
        }
        None => std::future::pending().await,
    }
}

async fn watch_generation(
    mut w: Watcher,
    mut stop_rx: mpsc::Receiver<StopCause>,
    done_tx: watch::Sender<Option<Arc<Finished>>>,
) {
    let mut shutdown = w.inner.shutdown.subscribe();
    let shim_fd = w
        .shim_pidfd
        .as_ref()
        .and_then(|f| f.try_clone().ok())
        .and_then(async_fd);
    let events = events_watch(&w.rec.cgroup);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let cg = w.inner.tree.at_abs(&w.rec.cgroup);
    let obs = loop {
        tokio::select! {
            biased;
            m = recv_opt(&mut w.link) => match m {
                Ok(Some(ShimMsg::Exited { status, .. })) => break Observation::HarnessExited(ObservationSource::Shim, status),
                Ok(Some(ShimMsg::LaunchFailed { reason })) => break Observation::LaunchFailed(reason),
                Ok(Some(other)) => {
                    w.inner.audit.record("unexpected-shim-message", Some(&w.rec.lane_id), Some(w.rec.generation), msg_kind(&Some(other)));
                }
                Ok(None) | Err(_) => break Observation::ShimGone(ObservationSource::Supervisor),
            },
            _ = readable(&shim_fd) => break Observation::ShimGone(ObservationSource::Supervisor),
            _ = readable(&events) => {
                if cg.events().is_ok_and(|e| !e.populated) {
                    break Observation::ShimGone(ObservationSource::Supervisor);
                }
            }
            cause = stop_rx.recv() => match cause {
                Some(c) => break Observation::Stop(c),
                None => std::future::pending::<()>().await,
            },
            _ = tick.tick() => {
                // Safety net for a missed event: nobody reported it, the sweep noticed.
                if cg.events().is_ok_and(|e| !e.populated) || !w.shim_pidfd.as_ref().is_some_and(alive) {
                    break Observation::ShimGone(ObservationSource::Watchdog);
                }
            }
            _ = crate::util::shutdown_signalled(&mut shutdown) => {
                tracing::info!(lane = %w.rec.lane_id, generation = w.rec.generation, "supervisor exiting; generation left running");
                return;
            }
        }
    };
    let fin = finish(&mut w, obs).await;
    let _ = done_tx.send(Some(Arc::new(fin)));
}

/// Whether the process behind `pidfd` is still running. A pidfd polls readable once its
/// process has exited; a zero-timeout poll asks without waiting and without signalling.
fn alive(pidfd: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&zero)) {
        Ok(0) => true,
        Ok(_) => !fds[0]
            .revents()
            .intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR),
        Err(_) => true, // cannot tell: the cgroup.events check decides
    }
}

/// Ends the generation: (for a stop) graceful signal and bounded wait, then kill, verify,
/// remove, receipt. Returns only after the receipt is durable or found unwritable.
pub(crate) async fn finish(w: &mut Watcher, obs: Observation) -> Finished {
    let (source, reason, exit, stop, detail) = match obs {
        Observation::HarnessExited(src, st) => {
            (src, receipt::classify_exit(&st), Some(st), None, None)
        }
        Observation::LaunchFailed(r) => (
            ObservationSource::Shim,
            TerminationReason::LaunchFailed,
            None,
            None,
            Some(r),
        ),
        Observation::ShimGone(src) => {
            let (reason, detail) = shim_death(w).await;
            (src, reason, None, None, Some(detail))
        }
        Observation::DiedWhileAway(h) => match h.and_then(|h| h.exit) {
            Some(st) => (
                ObservationSource::Supervisor,
                receipt::classify_exit(&st),
                Some(st),
                None,
                Some(
                    "died while the supervisor was away; reason from the shim's exit record".into(),
                ),
            ),
            None => (
                ObservationSource::Supervisor,
                TerminationReason::Unknown,
                None,
                None,
                Some("died while the supervisor was away and left no exit record".into()),
            ),
        },
        Observation::Stop(cause) => {
            let (exit, forced) = graceful_stop(w).await;
            let reason = match (cause, forced) {
                (StopCause::Replace, _) => TerminationReason::Replace,
                (StopCause::Coordinator, false) => TerminationReason::Quit,
                (StopCause::Unverifiable, _) => TerminationReason::Unknown,
                (_, true) => TerminationReason::Timeout,
                (_, false) => TerminationReason::Quit,
            };
            let stop = StopDetail {
                cause,
                graceful_signal: w.rec.graceful_signal.clone(),
                grace_period_ms: w.grace.as_millis() as u64,
                forced,
            };
            (
                ObservationSource::Supervisor,
                reason,
                exit,
                Some(stop),
                None,
            )
        }
    };
    if let Some(server) = w.lane_server.take() {
        server.end("the generation ended before activation");
    }
    w.gateway = None;
    let cleanup = cleanup_cgroup(&w.inner, w.rec.cgroup.clone()).await;
    let verified_empty = cleanup.verified_empty;
    let mut quarantine = cleanup.error.clone().map(|e| {
        format!(
            "cleanup of generation {} was not verified: {e}",
            w.rec.generation
        )
    });
    // A checkpoint its handoff took is in its saved record (the watcher's copy is its
    // launch's): its end is that checkpoint.
    if let Ok(saved) = w
        .inner
        .store
        .load_gen(&w.rec.lane_incarnation_id, w.rec.generation)
    {
        w.rec.handoff_checkpoint = saved.handoff_checkpoint;
    }
    let mut r = build_receipt(
        &w.inner, &w.rec, source, reason, exit, stop, cleanup, detail,
    );
    r.unfinished_status =
        !(reason == TerminationReason::Quit && r.stop.is_none() && r.exit_code == Some(0));
    // The receipt, then the record as ended; what cannot be written now is held and
    // written again (never rebuilt from a later guess).
    let unwritten = super::unwritten::settle_end(&w.inner, &r, &w.rec);
    // Its private area only once its receipt is durable: its artifact was sealed from it,
    // and a receipt built again after a restart seals it again (the same files).
    if verified_empty && unwritten.is_none() {
        remove_harness_dir(&w.inner, &w.rec.lane_incarnation_id, w.rec.generation);
    }
    if let Some(why) = unwritten {
        quarantine.get_or_insert(why);
    }
    w.rec.status = GenStatus::Terminated;
    Finished {
        receipt: r,
        quarantine,
    }
}

/// Sends the registry's graceful signal to the harness (through its pidfd: no PID race)
/// and waits, bounded by the grace period, for the shim to report its exit.
/// Returns the exit status if it came, and whether the grace period ran out.
async fn graceful_stop(w: &mut Watcher) -> (Option<ExitStatus>, bool) {
    if let Some(fd) = &w.harness_pidfd {
        let sig = rustix::process::Signal::from_named_raw(w.graceful as i32);
        if let Some(sig) = sig {
            let _ = rustix::process::pidfd_send_signal(fd, sig);
        }
    }
    let deadline = tokio::time::Instant::now() + w.grace;
    loop {
        match tokio::time::timeout_at(deadline, recv_opt(&mut w.link)).await {
            Ok(Ok(Some(ShimMsg::Exited { status, .. }))) => return (Some(status), false),
            Ok(Ok(Some(_))) => continue,
            // Shim gone (link closed): nothing more will be reported.
            Ok(Ok(None)) | Ok(Err(_)) => {
                return (None, w.harness_pidfd.as_ref().is_some_and(alive))
            }
            Err(_) => return (None, true),
        }
    }
}

/// Why did the shim die without a report? The shim makes every catchable asynchronous
/// signal harmless and never exits on its own after launch, so a silent death is SIGKILL —
/// corroborated by tmux, whose pane shows no exit status for a signal death.
async fn shim_death(w: &Watcher) -> (TerminationReason, String) {
    let Some(root) = w.rec.identity.as_ref().map(|i| i.root_pid) else {
        return (
            TerminationReason::Unknown,
            "shim gone before identity was recorded".into(),
        );
    };
    let tmux = w.inner.tmux(&w.rec.lane);
    for _ in 0..50 {
        match tmux.pane(&w.rec.lane) {
            Ok(p) if p.pid == root && p.dead => {
                return match p.dead_status {
                    None => (
                        TerminationReason::Sigkill,
                        "shim killed by a signal it cannot catch (tmux saw a signal death)".into(),
                    ),
                    Some(code) => (
                        TerminationReason::Crash,
                        format!("shim exited with status {code} without a report"),
                    ),
                };
            }
            Ok(p) if p.pid != root => break,
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    (
        TerminationReason::Unknown,
        "shim vanished without a report and tmux could not say how".into(),
    )
}

/// Kill everything left, verify empty, remove. Never reports success on doubt.
///
/// A process can still join between the verified-empty kill and the removal (a shim
/// respawned just before a launch was aborted joins its cgroup as its first act): the
/// removal then fails while the cgroup is populated again, so it is killed again, within
/// the same bound, rather than reported as a failed cleanup.
pub(crate) async fn cleanup_cgroup(inner: &Arc<Inner>, path: PathBuf) -> Cleanup {
    let tree = inner.tree.clone();
    let res = tokio::task::spawn_blocking(move || {
        let cg = tree.at_abs(&path);
        if !cg.exists() {
            return Cleanup {
                method: None,
                verified_empty: true,
                cgroup_removed: true,
                members_killed: 0,
                error: None,
            };
        }
        let start = std::time::Instant::now();
        let mut members_killed = 0;
        loop {
            let left = CLEANUP_TIMEOUT.saturating_sub(start.elapsed());
            let rep = match cg.kill_and_wait(left) {
                Ok(rep) => rep,
                Err(e) => {
                    return Cleanup {
                        method: Some(tree.kill_method()),
                        verified_empty: false,
                        cgroup_removed: false,
                        members_killed,
                        error: Some(e.to_string()),
                    }
                }
            };
            members_killed += rep.members_before;
            match cg.remove() {
                Ok(()) => {
                    return Cleanup {
                        method: Some(rep.method),
                        verified_empty: true,
                        cgroup_removed: true,
                        members_killed,
                        error: None,
                    }
                }
                Err(_)
                    if start.elapsed() < CLEANUP_TIMEOUT
                        && cg.events().is_ok_and(|e| e.populated) =>
                {
                    continue
                }
                Err(e) => {
                    return Cleanup {
                        method: Some(rep.method),
                        verified_empty: true,
                        cgroup_removed: false,
                        members_killed,
                        error: Some(e.to_string()),
                    }
                }
            }
        }
    })
    .await;
    res.unwrap_or_else(|e| Cleanup {
        method: None,
        verified_empty: false,
        cgroup_removed: false,
        members_killed: 0,
        error: Some(format!("cleanup task failed: {e}")),
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_receipt(
    inner: &Inner,
    rec: &GenRecord,
    source: ObservationSource,
    reason: TerminationReason,
    exit: Option<ExitStatus>,
    stop: Option<StopDetail>,
    cleanup: Cleanup,
    detail: Option<String>,
) -> TerminationReceipt {
    let mut detail = detail;
    let verified = cleanup.verified_empty;
    // The harness's session, sealed from its private area (still there: it is removed
    // after this).
    let harness_artifact = capture(verified, rec, "harness artifact", &mut detail, || {
        super::artifacts::seal(inner, rec)
    });
    // Work in a repository: its workspace checkpointed (git runs, bounded by its deadline).
    let checkpoint = capture(verified, rec, "checkpoint", &mut detail, || {
        super::checkpoints::checkpoint(inner, rec)
    });
    let now = crate::util::now_rfc3339();
    TerminationReceipt {
        receipt_id: format!("rcpt-{}", uuid::Uuid::new_v4().simple()),
        idempotency_key: rec.receipt_key.clone(),
        sot_incarnation: None,
        coordinator_epoch: None,
        assignment_id: None,
        assignment_attempt_id: None,
        responsibility_owner: None,
        execution_owner: None,
        host_id: inner.cfg.host.as_str().to_string(),
        lane_id: rec.lane_id.clone(),
        lane_incarnation_id: rec.lane_incarnation_id.clone(),
        generation: rec.generation,
        runtime: rec.runtime.clone(),
        process_identity: rec.identity.clone(),
        observation_source: source,
        termination_reason: reason,
        exit_code: exit.and_then(|e| e.code),
        signal: exit.and_then(|e| e.signal),
        core_dumped: exit.is_some_and(|e| e.core_dumped),
        stop,
        cleanup,
        started_at: Some(rec.started_at.clone()),
        observed_at: now.clone(),
        written_at: now,
        unfinished_status: true,
        next_action_digest: None,
        checkpoint_digest: checkpoint.as_ref().map(|c| c.digest()),
        checkpoint,
        harness_artifact,
        handoff_state_digest: None,
        last_validated_progress_at: None,
        last_progress_receipt_digest: None,
        detail,
        effects: inner.broker.unrecorded(&rec.lane_id, rec.generation),
    }
}

/// One capture of an ended generation (its artifact, its checkpoint), taken only once its
/// cleanup is verified (nothing of it is left to write what is read: a capture of files
/// still changing is no fact), off the runtime's worker. `None` when there is nothing to
/// capture; a failure is logged and said in the receipt's `detail`.
fn capture<T>(
    verified: bool,
    rec: &GenRecord,
    what: &str,
    detail: &mut Option<String>,
    take: impl FnOnce() -> Option<Result<T, String>>,
) -> Option<T> {
    if !verified {
        return None;
    }
    match blocking(take)? {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::error!(lane_id = %rec.lane_id, generation = rec.generation, error = %e,
                "cannot capture the generation's {what}; its receipt says so");
            *detail = Some(match detail.take() {
                Some(d) => format!("{d}; no {what}: {e}"),
                None => format!("no {what}: {e}"),
            });
            None
        }
    }
}

/// Runs blocking work (git, file capture) off the runtime's worker when on a multi-thread
/// runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

pub(crate) fn write_receipt(inner: &Inner, r: &TerminationReceipt) -> Result<(), SupervisorError> {
    let written = inner.outbox.write(r)?;
    if written == super::outbox::Written::New {
        inner.metrics.count_receipt(r);
    }
    tracing::info!(
        lane_id = %r.lane_id,
        generation = r.generation,
        reason = ?r.termination_reason,
        source = ?r.observation_source,
        receipt_key = %r.idempotency_key,
        new = (written == super::outbox::Written::New),
        "termination receipt durable"
    );
    Ok(())
}
