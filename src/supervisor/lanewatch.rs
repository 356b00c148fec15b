//! Watches every active lane's tmux server, so a server killed from outside is noticed
//! while nothing else touches the lane (spec §16: the lane's server is a dependency of the
//! generation, which can no longer be attached to or driven without it).
//!
//! Every `CHECK_EVERY` each active lane's socket is connected to (a UNIX connect: no tmux
//! process, a few microseconds); a refused or missing socket is confirmed with tmux itself
//! (`has-session`: only tmux saying the session is gone counts). A lost server then:
//!
//! 1. quarantines the lane (its reason names the server), so nothing new starts on it;
//! 2. stops the running generation gracefully (its harness and shim do not need tmux to
//!    stop) and receipts it with the stop cause `lane-server-lost`: the work cannot be
//!    attached to any more, and an unattended generation must not go on acting;
//! 3. publishes the host state, so the coordinator sees the quarantine and the receipt as
//!    soon as the stop is done.
//!
//! The way out is the usual one for a host quarantine: destroy and create the lane (the
//! coordinator's `mosaic lane recreate` does both), a fresh incarnation with a fresh server.
//!
//! **Never:** acts on a lane another operation holds (its lock taken: that operation meets
//! the server's state itself); takes a server that does not answer for a gone one.

use std::sync::Arc;
use std::time::Duration;

use super::receipt::StopCause;
use super::state::LaneStatus;
use super::{generation, lanes, tmux, Inner};

/// How often every lane's server is checked: the bound on noticing a lost one.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Whether something listens on the tmux socket at `path`.
fn listening(path: &std::path::Path) -> bool {
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.raw_os_error(),
            Some(nix::libc::ECONNREFUSED) | Some(nix::libc::ENOENT)
        ),
    }
}

pub(crate) async fn watch(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = shutdown.changed() => return,
        }
        for slot in inner.all_slots() {
            let Ok(mut l) = slot.try_lock() else {
                continue;
            };
            if l.rec.status != LaneStatus::Active {
                continue;
            }
            let name = l.rec.lane.clone();
            let tmux = inner.tmux(&name);
            if listening(tmux.socket()) {
                continue;
            }
            let state = {
                let (tmux, name) = (tmux.clone(), name.clone());
                tokio::task::spawn_blocking(move || tmux.session_state(&name)).await
            };
            match state {
                Ok(tmux::SessionState::Absent) => {}
                Ok(tmux::SessionState::Present) => continue,
                Ok(tmux::SessionState::Unknown(said)) => {
                    tracing::debug!(lane = %name, tmux_said = %said, "the lane's tmux server does not listen and tmux cannot say why; checking again");
                    continue;
                }
                Err(_) => continue,
            }
            let running = l.live.as_ref().map(|g| g.record.generation);
            let reason = match running {
                Some(g) => format!(
                    "the lane's tmux server is gone (noticed while generation {g} ran, which was stopped: it could no longer be attached to)"
                ),
                None => "the lane's tmux server is gone (noticed while the lane was idle)".to_string(),
            };
            inner.tmux_controls.forget(&name);
            l.settle(&inner.store, None, Some(&reason));
            // Stopped under the lane's lock, so no other operation sees the lane between
            // its quarantine and its receipt; published once the lock is let go.
            if let Some(live) = l.live.take() {
                match generation::stop(live, StopCause::LaneServerLost).await {
                    Ok(fin) => l.apply_finish(&inner.store, &fin),
                    Err(e) => {
                        tracing::error!(lane = %name, error = %e, "cannot stop the generation of a lane whose tmux server is gone")
                    }
                }
            }
            drop(l);
            lanes::publish(&inner).await;
        }
    }
}
