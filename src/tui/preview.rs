//! The live preview of the selected lane's pane: what `tmux capture-pane` shows of it,
//! refreshed twice a second on a thread of its own, so a slow or wedged tmux server never
//! freezes the view (a capture that takes more than 2 s is killed and reported).
//!
//! Only lanes whose supervisor runs on this machine (under `--state-dir`) can be shown;
//! the preview shows exactly what attaching would, and nothing is sent to the pane.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::view::s;

const EVERY: Duration = Duration::from_millis(500);
/// How often the map of local lanes is asked again of the supervisors.
const RELOCATE_EVERY: Duration = Duration::from_secs(5);
const CAPTURE_TIMEOUT: Duration = Duration::from_secs(2);
/// A pane larger than this is cut (the view shows its last lines anyway).
const MAX_CAPTURE: u64 = 1 << 20;

/// One look at a lane's pane.
pub(super) struct Shot {
    pub lane_id: String,
    pub text: Result<String, String>,
    pub at: Instant,
}

/// Where each local lane's tmux server and session are: lane id → (socket, session).
pub(super) fn local_lanes(state_dir: &Path) -> BTreeMap<String, (PathBuf, String)> {
    let mut out = BTreeMap::new();
    let run = state_dir.join("run");
    let mut sockets = vec![run.join("control.sock")];
    if let Ok(rd) = std::fs::read_dir(&run) {
        for e in rd.flatten() {
            sockets.push(e.path().join("control.sock"));
        }
    }
    for sock in sockets.into_iter().filter(|p| p.exists()) {
        // Bounded: a wedged supervisor costs the view one deadline, never the preview.
        if let Ok(st) = crate::supervisor::control::call_within(
            &sock,
            &crate::supervisor::control::Request::Status,
            Some(CAPTURE_TIMEOUT),
        ) {
            for l in st["lanes"].as_array().into_iter().flatten() {
                out.insert(
                    s(&l["lane_id"]),
                    (PathBuf::from(s(&l["tmux_socket"])), s(&l["lane"])),
                );
            }
        }
    }
    out
}

/// The preview's thread: told which lane is selected, it keeps the latest `Shot` of it,
/// taken every half second (only the latest: a view that is not drawing — the operator
/// attached to a lane — never piles them up).
pub(super) struct Preview {
    want: Arc<Mutex<Option<String>>>,
    latest: Arc<Mutex<Option<Shot>>>,
}

impl Preview {
    pub(super) fn start(tmux: PathBuf, state_dir: Option<PathBuf>) -> Self {
        let want = Arc::new(Mutex::new(None::<String>));
        let latest = Arc::new(Mutex::new(None::<Shot>));
        let (wanted, slot) = (want.clone(), latest.clone());
        std::thread::spawn(move || {
            let mut lanes = BTreeMap::new();
            let mut located: Option<Instant> = None;
            loop {
                let lane = wanted.lock().map(|w| w.clone()).unwrap_or(None);
                if let Some(lane_id) = lane {
                    // Asked again of the supervisors at most every few seconds, also for a
                    // lane that is not here (it runs on another host).
                    if located.is_none_or(|t| t.elapsed() >= RELOCATE_EVERY) {
                        if let Some(dir) = &state_dir {
                            lanes = local_lanes(dir);
                        }
                        located = Some(Instant::now());
                    }
                    let text = match lanes.get(&lane_id) {
                        Some((socket, session)) => capture(&tmux, socket, session),
                        None if state_dir.is_none() => Err(
                            "no --state-dir: the preview shows lanes of a local `mosaic up`".into(),
                        ),
                        None => Err("not on this machine: attach on its host".into()),
                    };
                    let shot = Shot {
                        lane_id,
                        text,
                        at: Instant::now(),
                    };
                    match slot.lock() {
                        Ok(mut l) => *l = Some(shot),
                        Err(_) => return,
                    }
                }
                std::thread::sleep(EVERY);
            }
        });
        Self { want, latest }
    }

    /// Which lane to look at from now on (`None`: none, while the view is not shown).
    pub(super) fn select(&self, lane_id: Option<&str>) {
        if let Ok(mut w) = self.want.lock() {
            if w.as_deref() != lane_id {
                *w = lane_id.map(str::to_string);
            }
        }
    }

    /// The latest look taken since the last call, if any.
    pub(super) fn take(&self) -> Option<Shot> {
        self.latest.lock().ok().and_then(|mut l| l.take())
    }
}

/// The visible contents of the session's active pane, as plain text with every control
/// character replaced (nothing the harness printed can drive the operator's terminal).
fn capture(tmux: &Path, socket: &Path, session: &str) -> Result<String, String> {
    let mut child = Command::new(tmux)
        .arg("-S")
        .arg(socket)
        .args(["capture-pane", "-p", "-J", "-t", &format!("={session}:")])
        .env_remove("TMUX")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run tmux: {e}"))?;
    // Read on a thread of its own, so a full pipe never stops the child and the deadline
    // below still holds.
    let mut out = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.take(MAX_CAPTURE).read_to_end(&mut buf);
        }
        buf
    });
    let deadline = Instant::now() + CAPTURE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("tmux did not answer within 2 s".into());
            }
            Err(e) => return Err(format!("tmux: {e}")),
        }
    };
    let buf = reader.join().unwrap_or_default();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.by_ref().take(4096).read_to_string(&mut err);
        }
        return Err(format!("tmux: {}", err.trim()));
    }
    Ok(plain(&String::from_utf8_lossy(&buf)))
}

/// Text with every control character but the line break replaced by `?`.
fn plain(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\n' { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_operators_terminal() {
        assert_eq!(plain("a\x1b]52;c;x\x07b\r\nc\td"), "a?]52;c;x?b?\nc?d");
    }
}
