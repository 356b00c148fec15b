//! `mosaic host decommission`: the host leaves the fleet. Every lane is destroyed (each
//! generation stopped and receipted, its tmux server and cgroups removed), the coordinator
//! is told on the live session (so each lane is retired there at once), a marker in the
//! state dir keeps the supervisor from ever starting again on it, and the daemon exits; on
//! its way out it removes its cgroup root (when it was given one — under systemd the unit's
//! cgroup is systemd's) and its sockets. Its state directory stays: the lane and receipt
//! history, and receipts the coordinator has not acknowledged yet. With the coordinator
//! unreachable it does not leave (the lanes are destroyed; it says so) unless forced.

use std::time::Duration;

use super::*;

/// How long the decommission waits for the coordinator link to send the lanes' end.
const REPORT_WAIT: Duration = Duration::from_secs(15);

/// The state dir's record that this host left the fleet: the supervisor refuses to start
/// while it is there.
pub const MARKER: &str = "decommissioned.json";

/// Refuses to run on a decommissioned host's state dir.
pub(crate) fn refuse_if_decommissioned(state_dir: &std::path::Path) -> Result<(), SupervisorError> {
    let marker = state_dir.join(MARKER);
    match std::fs::read_to_string(&marker) {
        Ok(text) => Err(SupervisorError::Config {
            detail: format!(
                "this host was decommissioned ({}: {}); remove that file to bring it back into the fleet",
                marker.display(),
                text.trim()
            ),
        }),
        Err(_) => Ok(()),
    }
}

impl Supervisor {
    /// Destroys every lane, and waits until the coordinator was sent that (when this host
    /// has one); refused if it was not, unless `force`. The caller then shuts the daemon
    /// down.
    pub async fn decommission(&self, force: bool) -> Result<serde_json::Value, SupervisorError> {
        // No lane is created (by an operator or a coordinator's recreate order) from here on.
        self.inner
            .leaving
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let _creating = self.inner.create_lock.lock().await;
        let mut destroyed = vec![];
        let names: Vec<String> = {
            let mut v = vec![];
            for slot in self.inner.all_slots() {
                let l = slot.lock().await;
                if l.rec.status != LaneStatus::Destroyed {
                    v.push(l.rec.lane.clone());
                }
            }
            v
        };
        for lane in names {
            let view = self.lane_destroy(&lane).await?;
            destroyed.push(view.lane_id);
        }
        self.publish_lanes().await;
        let reported = if self.inner.cfg.coordinator.is_some() {
            let want = self.inner.host_state.borrow().clone();
            let mut rx = self.inner.reported.subscribe();
            tokio::time::timeout(REPORT_WAIT, rx.wait_for(|r| *r == want))
                .await
                .is_ok_and(|r| r.is_ok())
        } else {
            true
        };
        // The lanes' last receipts reach the coordinator before the link goes away (each is
        // kept in the state dir until acknowledged, whatever happens).
        let deadline = tokio::time::Instant::now() + REPORT_WAIT;
        let mut unacknowledged = self.inner.outbox.list(false)?.len();
        while reported && unacknowledged > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            unacknowledged = self.inner.outbox.list(false)?.len();
        }
        if !reported && !force {
            self.inner
                .leaving
                .store(false, std::sync::atomic::Ordering::SeqCst);
            return Err(SupervisorError::State {
                detail: format!(
                    "every lane is destroyed ({}), but the coordinator was not reached within {} s to be told: the supervisor stays up; run decommission again once it is reachable, or with --force to leave anyway (the coordinator then retires the lanes only when this host's state reaches it, which may be never)",
                    destroyed.join(", "),
                    REPORT_WAIT.as_secs()
                ),
            });
        }
        let marker = self.inner.cfg.state_dir.join(MARKER);
        let note = serde_json::json!({
            "decommissioned_at": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            "host_id": self.inner.cfg.host.as_str(),
            "coordinator_told": reported,
        });
        crate::util::durable::write_atomic(&marker, note.to_string().as_bytes()).map_err(|e| {
            SupervisorError::State {
                detail: format!("{}: {e}", marker.display()),
            }
        })?;
        tracing::warn!(
            lanes = destroyed.len(),
            reported,
            unacknowledged,
            "decommissioned: every lane destroyed; the supervisor exits"
        );
        Ok(serde_json::json!({
            "host_id": self.inner.cfg.host.as_str(),
            "destroyed": destroyed,
            "coordinator_told": reported,
            "unacknowledged_receipts": unacknowledged,
            "marker": marker,
            "state_dir": self.inner.cfg.state_dir,
            "note": if reported { "the supervisor exits and removes its cgroup root and sockets; its state dir keeps the history (remove it when no longer wanted); disable its systemd unit and revoke its keys (mosaic trust revoke host:ID)" }
                    else { "forced: the coordinator was not reached; it retires the lanes only when this host's state reaches it; the supervisor exits" },
        }))
    }

    /// After the daemon stopped serving: removes what it made outside its state dir.
    pub(crate) fn remove_traces(&self) {
        let _ = std::fs::remove_file(self.inner.cfg.control_socket());
        let _ = std::fs::remove_file(self.inner.cfg.runtime_dir.join("metrics.addr"));
        let Some(root) = self.inner.cfg.cgroup_root.clone() else {
            return;
        };
        // This process lives in `<root>/supervisor`: it moves to the root's parent first,
        // or the kernel would refuse to remove its cgroup.
        match self.inner.tree.leave_and_remove() {
            Ok(()) => tracing::info!(root = %root.display(), "cgroup root removed"),
            Err(e) => tracing::warn!(root = %root.display(), error = %e, "cgroup root not removed"),
        }
    }
}
