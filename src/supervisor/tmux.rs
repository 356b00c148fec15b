//! One tmux server per lane, driven through its own socket.
//!
//! **Never:** uses the default tmux server or the operator's tmux config (`-f /dev/null`),
//! passes a command through a shell (argv form only), or treats tmux's view as authority
//! — tmux only hosts panes; cgroups decide what lives.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::SupervisorError;
use crate::cgroup::Cg;

#[derive(Debug, Clone)]
pub struct Tmux {
    bin: PathBuf,
    socket: PathBuf,
}

/// What tmux says about a lane's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    Present,
    Absent,
    /// No answer (a stopped or overloaded server, tmux not runnable): why.
    Unknown(String),
}

/// What tmux says about a lane's pane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaneState {
    pub pid: i32,
    pub dead: bool,
    /// Exit status of a dead pane; `None` for a pane killed by a signal.
    pub dead_status: Option<i32>,
}

/// How long one tmux client call may take before it is killed and counted as failed.
const TMUX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn err(what: &str, detail: impl std::fmt::Display) -> SupervisorError {
    SupervisorError::Tmux {
        detail: format!("{what}: {detail}"),
    }
}

impl Tmux {
    pub fn new(bin: &Path, socket: PathBuf) -> Self {
        Self {
            bin: bin.to_path_buf(),
            socket,
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A `tmux` command line for this lane's server.
    pub(super) fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("-S").arg(&self.socket).env_remove("TMUX");
        // The lane's server (and every generation it runs) must not inherit the service
        // manager's channel: a harness could otherwise notify systemd as the supervisor.
        for v in crate::systemd::MANAGER_ENV {
            c.env_remove(v);
        }
        c.stdin(Stdio::null());
        c
    }

    fn run(&self, what: &str, mut c: Command) -> Result<String, SupervisorError> {
        // Bounded: a wedged (or stopped) tmux server must not pin a supervisor thread.
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = crate::util::run_bounded(&mut c, TMUX_TIMEOUT)
            .map_err(|e| err(what, format!("cannot run {}: {e}", self.bin.display())))?;
        if !out.status.success() {
            return Err(err(
                what,
                format!(
                    "{} ({})",
                    String::from_utf8_lossy(&out.stderr).trim(),
                    out.status
                ),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts the lane's tmux server inside `cg`: the client joins the cgroup between fork
    /// and exec, and the server it forks inherits that membership.
    pub fn start_server(
        &self,
        session: &str,
        cg: &Cg,
        idle: &[String],
    ) -> Result<(), SupervisorError> {
        let procs = cg.open_procs_for_join()?;
        let fd = procs.as_raw_fd();
        let mut c = self.cmd();
        c.args([
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "200",
            "-y",
            "50",
            "-s",
            session,
        ]);
        c.args(idle);
        // SAFETY: between fork and exec we only call write(2) on an fd opened beforehand;
        // no allocation, no locks. Writing "0" moves the calling process.
        unsafe {
            c.pre_exec(move || {
                let r = libc::write(fd, b"0".as_ptr().cast(), 1);
                if r == 1 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        self.run("new-session", c)?;
        drop(procs);
        let mut c = self.cmd();
        c.args([
            "set-option",
            "-g",
            "remain-on-exit",
            "on",
            ";",
            "set-option",
            "-g",
            "exit-empty",
            "off",
        ]);
        self.run("set-option", c)?;
        Ok(())
    }

    /// Whether the lane's session is there. Only tmux saying so (no server on the socket,
    /// no such session) is `Absent`: a server that does not answer in time, or a tmux
    /// that cannot be run, is `Unknown`, never taken for gone.
    pub fn session_state(&self, session: &str) -> SessionState {
        // A server caught while it exits (killed a moment ago) answers "server exited
        // unexpectedly": that is no answer yet, so ask again, a bounded number of times,
        // until tmux says what is there.
        let mut state = self.session_state_once(session);
        for _ in 0..20 {
            match &state {
                SessionState::Unknown(said) if said.contains("server exited unexpectedly") => {
                    std::thread::sleep(std::time::Duration::from_millis(25));
                    state = self.session_state_once(session);
                }
                _ => break,
            }
        }
        state
    }

    fn session_state_once(&self, session: &str) -> SessionState {
        let mut c = self.cmd();
        c.args(["has-session", "-t", &format!("={session}")]);
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        match crate::util::run_bounded(&mut c, TMUX_TIMEOUT) {
            Ok(out) if out.status.success() => SessionState::Present,
            Ok(out) => {
                let said = String::from_utf8_lossy(&out.stderr);
                // "no sessions": the server on the lane's socket holds no session at
                // all, so not the lane's either (a lane's server holds only its own).
                if [
                    "can't find session",
                    "no sessions",
                    // `=name` against a server that is up but holds no session.
                    "no current target",
                    "no server running",
                    "error connecting to",
                ]
                .iter()
                .any(|m| said.contains(m))
                {
                    SessionState::Absent
                } else {
                    SessionState::Unknown(said.trim().to_string())
                }
            }
            Err(e) => SessionState::Unknown(e.to_string()),
        }
    }

    /// Submits `text` as one line of input to the program in the lane's pane, the way an
    /// operator typing would: types it literally, waits until the pane shows `marker`
    /// (a TUI that is still starting drops keys, so an unseen line is cleared and typed
    /// again: after half a second, the wait doubling up to three), then presses Enter
    /// until `taken` (see `press_enter`). Gives up at `deadline`, or as soon as
    /// `still_wanted` turns false.
    pub fn submit_line(
        &self,
        session: &str,
        text: &str,
        marker: &str,
        deadline: std::time::Instant,
        still_wanted: &dyn Fn() -> bool,
        taken: &dyn Fn() -> bool,
    ) -> Result<(), SupervisorError> {
        let target = format!("={session}:");
        // A fixed three seconds put most of that on every OpenCode start: its TUI takes
        // keys a few seconds after it starts, the line typed first is lost.
        let mut shown_within = std::time::Duration::from_millis(500);
        loop {
            if !still_wanted() {
                return Err(err("submit", "the generation is no longer waiting for it"));
            }
            let mut c = self.cmd();
            c.args(["send-keys", "-t", &target, "-l", "--", text]);
            self.run("send-keys", c)?;
            let typed_until = std::time::Instant::now() + shown_within;
            shown_within = (shown_within * 2).min(std::time::Duration::from_secs(3));
            while std::time::Instant::now() < typed_until.min(deadline) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let mut c = self.cmd();
                c.args(["capture-pane", "-p", "-J", "-t", &target]);
                let shown = self.run("capture-pane", c)?;
                if shown.contains(marker) && still_wanted() {
                    return self.press_enter(&target, deadline, still_wanted, taken);
                }
            }
            if std::time::Instant::now() >= deadline {
                // The marker carries the challenge phrase: never in a log.
                return Err(err("submit", "the pane never showed the typed line"));
            }
            // Not shown: the program was not reading yet. Clear whatever arrived, retype.
            if !still_wanted() {
                return Err(err("submit", "the generation is no longer waiting for it"));
            }
            let mut c = self.cmd();
            c.args(["send-keys", "-t", &target, "C-u"]);
            self.run("send-keys", c)?;
        }
    }

    /// Presses Enter until `taken` says the harness took the line. A TUI that is still
    /// starting may show typed text yet drop the Enter after it, so Enter is pressed again
    /// until then (an Enter on an empty prompt does nothing in any of the harnesses): after
    /// a quarter of a second, the wait doubling up to two seconds, at most twelve times,
    /// and then only waited on. (A fixed two seconds put most of that on every Codex
    /// start: its composer shows the bootstrap line well before it takes the Enter.)
    fn press_enter(
        &self,
        target: &str,
        deadline: std::time::Instant,
        still_wanted: &dyn Fn() -> bool,
        taken: &dyn Fn() -> bool,
    ) -> Result<(), SupervisorError> {
        let mut presses = 0;
        let mut wait = std::time::Duration::from_millis(250);
        loop {
            // Asked again right before every press: a line taken during the last wait
            // must get no further Enter (it would land in the turn it started).
            if taken() {
                return Ok(());
            }
            if !still_wanted() || std::time::Instant::now() >= deadline {
                return Err(err("submit", "the harness never took the line"));
            }
            if presses < 12 {
                let mut c = self.cmd();
                c.args(["send-keys", "-t", target, "Enter"]);
                self.run("send-keys", c)?;
                presses += 1;
            }
            let until = std::time::Instant::now() + wait;
            wait = (wait * 2).min(std::time::Duration::from_secs(2));
            while std::time::Instant::now() < until {
                if taken() {
                    return Ok(());
                }
                if !still_wanted() || std::time::Instant::now() >= deadline {
                    return Err(err("submit", "the harness never took the line"));
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }

    pub fn pane(&self, session: &str) -> Result<PaneState, SupervisorError> {
        let mut c = self.cmd();
        c.args([
            "display-message",
            "-p",
            "-t",
            &format!("={session}:"),
            "#{pane_pid} #{pane_dead} #{pane_dead_status}",
        ]);
        let out = self.run("display-message", c)?;
        let mut it = out.split_whitespace();
        let pid = it
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| err("display-message", format!("unexpected {out:?}")))?;
        let dead = it.next() == Some("1");
        let dead_status = it.next().and_then(|s| s.parse().ok());
        Ok(PaneState {
            pid,
            dead,
            dead_status,
        })
    }

    pub fn kill_server(&self) {
        let mut c = self.cmd();
        c.arg("kill-server")
            .stderr(Stdio::null())
            .stdout(Stdio::null());
        let _ = c.status();
    }
}

/// `tmux -V`, for doctor.
pub fn version(bin: &Path) -> Result<String, SupervisorError> {
    crate::sysdeps::tmux_version(bin).map_err(|e| err("tmux -V", e))
}
