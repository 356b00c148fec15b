//! A long-lived tmux control-mode client per lane (`tmux -C attach-session`), the start
//! path's way to its lane's server.
//!
//! A `tmux` command line costs a client start-up (exec, identify, connect: about 2 ms on a
//! small machine) before the server does any work; through a control client already
//! attached, a command costs only the server's part. The start path runs one command per
//! generation (`respawn-pane`), and attaching is also the check that the lane's session
//! still exists, which a `has-session` client used to answer.
//!
//! The client attaches with `no-output` (the server never streams the pane's output to
//! us) and `ignore-size` (an operator's attached terminal alone sizes the window). It
//! exits on its own when its stdin closes, so a supervisor that dies, even by SIGKILL,
//! leaves no client behind.
//!
//! **Never:** sends a command again whose reply it did not see (a respawn may or may not
//! have happened; the client is dropped instead and the caller fails); passes a word it
//! cannot quote exactly (a newline, carriage return or NUL is refused before anything is
//! sent); runs a command without a bound on its reply.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::tmux::Tmux;
use super::SupervisorError;

/// How long one command (or the attach) may wait for its reply before the client is
/// dropped and the command counted as failed.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

fn err(what: &str, detail: impl std::fmt::Display) -> SupervisorError {
    SupervisorError::Tmux {
        detail: format!("{what}: {detail}"),
    }
}

/// One command's reply: the lines between `%begin` and `%end` (or `%error`).
#[derive(Debug)]
enum Reply {
    Ok(String),
    Error(String),
}

/// A finished block and whether this client sent its command on stdin (guard flags 1).
/// Hooks the server runs for this client (`after-respawn-pane`, set by anyone who can reach
/// the server) print blocks with flags 0: never a reply to what we sent.
#[derive(Debug)]
struct Block {
    sent_by_us: bool,
    reply: Reply,
}

/// An attached control-mode client of one lane's session.
pub struct Control {
    child: Child,
    stdin: ChildStdin,
    replies: Receiver<Block>,
    /// Set once a command went unanswered: the client must not be used again.
    broken: bool,
}

impl Control {
    /// Attaches to `session` on `tmux`'s server. Fails when the server or the session is
    /// gone.
    pub fn attach(tmux: &Tmux, session: &str) -> Result<Self, SupervisorError> {
        let mut c = tmux.cmd();
        c.args([
            // Never start a server: `attach-session` otherwise starts one on a socket whose
            // server is gone, which answers "no sessions" and lingers while it exits,
            // hiding the fact that the lane's own server died.
            "-N",
            "-C",
            "attach-session",
            // The supervisor's environment stays out of the session's.
            "-E",
            "-f",
            "no-output,ignore-size",
            "-t",
            &format!("={session}"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = c
            .spawn()
            .map_err(|e| err("attach", format!("cannot run tmux: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err("attach", "tmux client has no pipes"));
        };
        let (tx, replies) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("tmux-control".into())
            .spawn(move || read_replies(BufReader::new(stdout), tx));
        let mut me = Self {
            child,
            stdin,
            replies,
            broken: false,
        };
        if let Err(e) = spawned {
            return Err(err("attach", format!("cannot start reader: {e}")));
        }
        // The attach command (from the command line, so flags 0) is answered first.
        me.reply("attach-session", true)?;
        Ok(me)
    }

    /// Whether the client can still be used: running (it exits when the session or the
    /// server goes) and every command so far answered.
    pub fn alive(&mut self) -> bool {
        !self.broken && matches!(self.child.try_wait(), Ok(None))
    }

    /// Runs one tmux command, given as words, and returns its output. A `%error` reply is
    /// an error and leaves the client usable; no reply in time, or a client that ended,
    /// is an error after which the client is not used again (`alive()` turns false).
    pub fn run(&mut self, words: &[&str]) -> Result<String, SupervisorError> {
        let Some(&what) = words.first() else {
            // An empty line would detach the client.
            return Err(err("command", "an empty command"));
        };
        let mut line = String::new();
        for w in words {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(&quote(w).ok_or_else(|| {
                err(
                    what,
                    "an argument holds a newline, carriage return or NUL, which a control-mode command line cannot carry",
                )
            })?);
        }
        line.push('\n');
        // Anything already finished is no reply to this command.
        while self.replies.try_recv().is_ok() {}
        if let Err(e) = self
            .stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
        {
            self.broken = true;
            return Err(err(what, format!("control client: {e}")));
        }
        self.reply(what, false)
    }

    /// Waits for the reply: the first block for the attach, else the next block of a
    /// command this client sent.
    fn reply(&mut self, what: &str, attach: bool) -> Result<String, SupervisorError> {
        let deadline = std::time::Instant::now() + REPLY_TIMEOUT;
        let got = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.replies.recv_timeout(left) {
                Ok(b) if attach || b.sent_by_us => break Ok(b.reply),
                Ok(_) => continue,
                Err(e) => break Err(e),
            }
        };
        match got {
            Ok(Reply::Ok(out)) => Ok(out),
            Ok(Reply::Error(msg)) => Err(err(what, msg.trim())),
            Err(RecvTimeoutError::Timeout) => {
                self.broken = true;
                let _ = self.child.kill();
                Err(err(
                    what,
                    format!(
                        "no reply within {} s (client killed)",
                        REPLY_TIMEOUT.as_secs()
                    ),
                ))
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.broken = true;
                Err(err(
                    what,
                    "the control client ended (server or session gone)",
                ))
            }
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Quotes `word` for tmux's command parser: single quotes, inside which nothing is
/// expanded (`~`, `$`, `#{}`, `;`), and `'\''` for a quote. `None` for a word a command
/// line cannot carry.
fn quote(word: &str) -> Option<String> {
    if word.contains(['\n', '\r', '\0']) {
        return None;
    }
    Some(format!("'{}'", word.replace('\'', r"'\''")))
}

/// Reads the client's output: collects each `%begin … %end|%error` block into a reply,
/// ignores notifications between blocks, and ends (dropping `tx`, which the waiting side
/// sees as disconnected) at `%exit` or end of output.
fn read_replies(mut out: impl BufRead, tx: std::sync::mpsc::Sender<Block>) {
    let mut block: Option<(String, String)> = None; // (guard fields, body)
    let mut line = String::new();
    loop {
        line.clear();
        match out.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let l = line.trim_end_matches(['\n', '\r']);
        match &mut block {
            None => {
                if let Some(guard) = l.strip_prefix("%begin ") {
                    block = Some((guard.to_string(), String::new()));
                } else if l == "%exit" || l.starts_with("%exit ") {
                    return;
                }
            }
            Some((guard, body)) => {
                // A block ends only with the guard its %begin carried, so output that
                // happens to start with "%end" cannot end it early.
                let end = l
                    .strip_prefix("%end ")
                    .filter(|g| g == guard)
                    .map(|_| true)
                    .or_else(|| {
                        l.strip_prefix("%error ")
                            .filter(|g| g == guard)
                            .map(|_| false)
                    });
                match end {
                    Some(ok) => {
                        let body = std::mem::take(body);
                        // Guard: "<time> <number> <flags>"; flags 1 = sent on our stdin.
                        let sent_by_us = guard.rsplit(' ').next() == Some("1");
                        block = None;
                        let reply = if ok {
                            Reply::Ok(body)
                        } else {
                            Reply::Error(body)
                        };
                        if tx.send(Block { sent_by_us, reply }).is_err() {
                            return;
                        }
                    }
                    None => {
                        body.push_str(l);
                        body.push('\n');
                    }
                }
            }
        }
    }
}

/// The control clients of every lane, each attached on first use and kept while it works.
#[derive(Default)]
pub struct Controls(Mutex<HashMap<String, Arc<Mutex<Option<Control>>>>>);

impl Controls {
    fn slot(&self, lane: &str) -> Arc<Mutex<Option<Control>>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(lane.to_string()).or_default().clone()
    }

    /// Runs `f` with the lane's attached client, attaching one first when there is none
    /// (or the last one ended). A client whose command failed other than by a `%error`
    /// reply is dropped, so the next call attaches afresh.
    pub fn with<T>(
        &self,
        tmux: &Tmux,
        lane: &str,
        f: impl FnOnce(&mut Control) -> Result<T, SupervisorError>,
    ) -> Result<T, SupervisorError> {
        let slot = self.slot(lane);
        // A panic mid-command may have left a reply unread: never reuse that client.
        let mut guard = slot.lock().unwrap_or_else(|p| {
            let mut g = p.into_inner();
            *g = None;
            g
        });
        if !guard.as_mut().is_some_and(Control::alive) {
            *guard = None;
            *guard = Some(Control::attach(tmux, lane)?);
        }
        let Some(control) = guard.as_mut() else {
            return Err(err("attach", "no control client"));
        };
        let res = f(control);
        if res.is_err() && !control.alive() {
            *guard = None;
        }
        res
    }

    /// Detaches the lane's client (its server is being killed, or the lane destroyed).
    pub fn forget(&self, lane: &str) {
        let slot = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(lane);
        if let Some(slot) = slot {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_every_word_literal_and_refuses_line_breaks() {
        assert_eq!(quote("a'b").as_deref(), Some(r"'a'\''b'"));
        assert_eq!(quote("").as_deref(), Some("''"));
        assert_eq!(quote("$HOME;#{x}").as_deref(), Some("'$HOME;#{x}'"));
        assert_eq!(quote("a\nb"), None);
        assert_eq!(quote("a\rb"), None);
        assert_eq!(quote("a\0b"), None);
    }

    #[test]
    fn replies_are_framed_by_their_own_guard() {
        let out = "%begin 1 10 0\n%end 1 10 0\n%session-changed $0 a\n%begin 1 11 1\n%end 9 9 9\nx\n%end 1 11 1\n%begin 1 12 1\ncan't find pane\n%error 1 12 1\n%begin 1 13 0\nhooked\n%end 1 13 0\n%exit\n%begin 1 14 1\n%end 1 14 1\n";
        let (tx, rx) = std::sync::mpsc::channel();
        read_replies(out.as_bytes(), tx);
        let got: Vec<Block> = rx.iter().collect();
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(
            matches!(&got[0], Block { sent_by_us: false, reply: Reply::Ok(b) } if b.is_empty())
        );
        assert!(
            matches!(&got[1], Block { sent_by_us: true, reply: Reply::Ok(b) } if b == "%end 9 9 9\nx\n")
        );
        assert!(
            matches!(&got[2], Block { sent_by_us: true, reply: Reply::Error(b) } if b == "can't find pane\n")
        );
        // A hook's block (flags 0) is told apart from a reply.
        assert!(
            matches!(&got[3], Block { sent_by_us: false, reply: Reply::Ok(b) } if b == "hooked\n")
        );
    }

    /// A scratch directory for real tmux servers, removed (servers killed) on drop.
    struct Scratch(std::path::PathBuf, std::path::PathBuf);
    impl Scratch {
        fn new(tag: &str) -> Self {
            let tmux = crate::sysdeps::which("tmux").expect("tmux on PATH");
            let dir =
                std::env::temp_dir().join(format!("mosaic-tmuxctl-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(tmux, dir)
        }
        fn tmux(&self) -> Tmux {
            Tmux::new(&self.0, self.1.join("s.sock"))
        }
        /// A server with the session `lane`, as a lane's.
        fn start_lane_session(&self) {
            let out = self.raw(&[
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-s",
                "lane",
                "sleep 100",
            ]);
            assert!(out.status.success(), "{out:?}");
        }
        fn raw(&self, args: &[&str]) -> std::process::Output {
            std::process::Command::new(&self.0)
                .arg("-S")
                .arg(self.1.join("s.sock"))
                .args(args)
                .output()
                .unwrap()
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = self.raw(&["kill-server"]);
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    /// Regression (clean-clone CI run, `a_dead_tmux_server_…_quarantines_the_lane`): the
    /// re-attach after the lane's server was killed started a fresh server of its own
    /// (`attach-session` starts one), which answered "no sessions" and lingered while it
    /// exited; the check that followed could not tell the lane's server was gone, so the
    /// lane was not quarantined. An attach to a dead server must fail as "no server",
    /// and leave no server behind.
    #[test]
    fn attaching_to_a_dead_server_starts_none() {
        let s = Scratch::new("dead");
        s.start_lane_session();
        let c = Control::attach(&s.tmux(), "lane");
        assert!(c.is_ok(), "{:?}", c.err());
        drop(c);
        // `kill-server` returns while the server is still exiting (a client reaching it
        // then is told "server exited unexpectedly"): the server's process is awaited
        // gone, so what follows asks a socket no server holds.
        let pid: i32 = String::from_utf8_lossy(&s.raw(&["display-message", "-p", "#{pid}"]).stdout)
            .trim()
            .parse()
            .unwrap();
        assert!(s.raw(&["kill-server"]).status.success());
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|st| {
                    st.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                })
                .unwrap_or(true)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !gone() {
            assert!(
                std::time::Instant::now() < deadline,
                "the killed tmux server {pid} never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let e = match Control::attach(&s.tmux(), "lane") {
            Ok(_) => panic!("attached to a killed server"),
            Err(e) => e.to_string(),
        };
        assert!(
            !e.contains("no sessions"),
            "the attach started a server: {e}"
        );
        let ls = s.raw(&["list-sessions"]);
        let said = String::from_utf8_lossy(&ls.stderr);
        assert!(
            said.contains("no server running") || said.contains("error connecting to"),
            "a server is running on the lane's socket: {said}"
        );
        assert_eq!(
            s.tmux().session_state("lane"),
            super::super::tmux::SessionState::Absent
        );
    }

    /// A lane's server keeps running without sessions (`exit-empty off`): its session
    /// gone is still gone, whatever words tmux uses for it.
    #[test]
    fn a_server_without_the_session_reads_as_absent() {
        let s = Scratch::new("empty");
        s.start_lane_session();
        assert!(s
            .raw(&["set-option", "-s", "exit-empty", "off"])
            .status
            .success());
        let t = s.tmux();
        assert_eq!(
            t.session_state("lane"),
            super::super::tmux::SessionState::Present
        );
        assert_eq!(
            t.session_state("other"),
            super::super::tmux::SessionState::Absent
        );
        assert!(s.raw(&["kill-session", "-t", "=lane"]).status.success());
        assert!(
            s.raw(&["list-sessions"]).status.success(),
            "the server stays up"
        );
        assert_eq!(
            t.session_state("lane"),
            super::super::tmux::SessionState::Absent
        );
        assert!(Control::attach(&t, "lane").is_err());
    }
}
