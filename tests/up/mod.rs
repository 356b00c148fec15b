//! `mosaic up` (coordinator + supervisor joined by the mutually authenticated session, a
//! private PostgreSQL) run as a user would, driven through the operator CLI.

#![allow(dead_code, unused_imports)]

use crate::common;
pub use crate::common::read_until;
use crate::pg;
pub use serde_json::Value;
pub use std::io::BufRead;
pub use std::path::PathBuf;
pub use std::process::{Child, Command, Stdio};
pub use std::time::{Duration, Instant};

pub struct Up {
    pub child: Child,
    pub dir: PathBuf,
    pub lanes: u32,
    pub _db: pg::TestDb,
    pub db_url: String,
    pub hosts: u32,
    /// More of `mosaic up`'s arguments, given again at every restart.
    pub extra: Vec<String>,
}

pub fn spawn_up(dir: &std::path::Path, lanes: u32, hosts: u32, db_url: &str) -> Child {
    spawn_up_with(dir, lanes, hosts, db_url, &[])
}

/// `spawn_up` with more of `mosaic up`'s arguments.
pub fn spawn_up_with(
    dir: &std::path::Path,
    lanes: u32,
    hosts: u32,
    db_url: &str,
    extra: &[String],
) -> Child {
    let mut child = Command::new(common::MOSAIC)
        .args([
            "up",
            "--lanes",
            &lanes.to_string(),
            "--hosts",
            &hosts.to_string(),
            "--state-dir",
        ])
        .arg(dir)
        .args(["--database-url", db_url])
        .args(extra)
        .env("MOSAIC_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log_of(dir))
                .unwrap(),
        )
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    read_until(&mut out, "Ctrl-C stops everything");
    // Keep draining stdout so `up` never blocks on a full pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    child
}

impl Up {
    pub fn start(lanes: u32) -> Self {
        Self::fleet(lanes, 1)
    }

    /// `mosaic up --hosts N`: N supervisor processes, each a host of its own.
    pub fn fleet(lanes: u32, hosts: u32) -> Self {
        Self::fleet_with(lanes, hosts, &[])
    }

    /// `fleet`, with more of `mosaic up`'s arguments.
    pub fn fleet_with(lanes: u32, hosts: u32, extra: &[String]) -> Self {
        common::require_host();
        let db = pg::TestDb::new();
        let dir =
            std::env::temp_dir().join(format!("mosaic-e2e-{}", uuid::Uuid::new_v4().simple()));
        let child = spawn_up_with(&dir, lanes, hosts, &db.url, extra);
        let db_url = db.url.clone();
        Self {
            child,
            dir,
            lanes,
            hosts,
            _db: db,
            db_url,
            extra: extra.to_vec(),
        }
    }

    /// Ends `mosaic up` with `sig` (SIGKILL: a crash; SIGTERM: a clean stop) and starts it
    /// again on the same state dir and database.
    pub fn restart_after(&mut self, sig: nix::sys::signal::Signal) {
        common::kill(self.child.id() as i32, sig);
        let _ = self.child.wait();
        self.child = spawn_up_with(&self.dir, self.lanes, self.hosts, &self.db_url, &self.extra);
    }

    pub fn cli(&self, args: &[&str]) -> Result<Value, String> {
        let out = Command::new(common::MOSAIC)
            .args(args)
            .arg("--state-dir")
            .arg(&self.dir)
            .arg("--json")
            .output()
            .unwrap();
        if out.status.success() {
            Ok(serde_json::from_slice(&out.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn host(&self, args: &[&str]) -> Value {
        let out = Command::new(common::MOSAIC)
            .arg("host")
            .arg("--state-dir")
            .arg(&self.dir)
            .args(args)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn lane_id(&self, n: u32) -> String {
        let host = nix::unistd::gethostname()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        format!("{host}:lane-{n}")
    }

    pub fn assign(&self, lane: &str, task: &str) -> Value {
        self.assign_with(lane, task, &[])
    }

    /// `mosaic assign` of the fake harness, waiting for RUNNING, with `extra` arguments.
    pub fn assign_with(&self, lane: &str, task: &str, extra: &[&str]) -> Value {
        let mut args = vec![
            "assign",
            "--lane",
            lane,
            "--runtime",
            "fake@1.0.0",
            "--task",
            task,
            "--wait",
            "running",
        ];
        args.extend_from_slice(extra);
        self.cli(&args).unwrap_or_else(|e| panic!("assign: {e}"))
    }

    pub fn lane_state(&self, lane: &str) -> String {
        let lanes = self.cli(&["lanes"]).unwrap();
        lanes
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lane_id"] == lane)
            .map(|l| l["state"].as_str().unwrap().to_string())
            .unwrap_or_default()
    }

    pub fn assignment(&self, id: &str) -> Value {
        let st = self.cli(&["status"]).unwrap();
        st["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["assignment_id"] == id)
            .cloned()
            .unwrap()
    }

    /// Waits until continuation `cn` is in state `want`, on one connection.
    pub async fn continuation_reaches(&self, cn: &str, want: &str, what: &str) {
        let (c, conn) = tokio_postgres::connect(&self.db_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let start = Instant::now();
        loop {
            let state: String = c
                .query_one(
                    "SELECT state FROM continuations WHERE continuation_id = $1",
                    &[&cn],
                )
                .await
                .unwrap()
                .get(0);
            if state == want {
                return;
            }
            assert!(
                start.elapsed() < common::PATIENCE,
                "timed out waiting for {what} ({state})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn count(&self, sql: &str) -> i64 {
        let (c, conn) = tokio_postgres::connect(&self.db_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c.query_one(sql, &[]).await.unwrap().get(0)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        common::terminate(&mut self.child, Duration::from_secs(20));
        // The state dir (keys, sockets) always goes; a failed test keeps only its log.
        let _ = std::fs::remove_dir_all(&self.dir);
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(log_of(&self.dir));
        } else {
            eprintln!("mosaic up log kept: {}", log_of(&self.dir).display());
        }
    }
}

pub fn log_of(dir: &std::path::Path) -> PathBuf {
    dir.with_extension("log")
}

pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    common::wait_until(what, &mut f)
}

/// `GET /metrics` from the address a daemon wrote beside its sockets: (series, value).
pub fn scrape(addr_file: &std::path::Path) -> Vec<(String, f64)> {
    use std::io::{Read, Write};
    let addr = std::fs::read_to_string(addr_file).unwrap();
    let mut s = std::net::TcpStream::connect(addr.trim()).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

pub fn metric(m: &[(String, f64)], series: &str) -> f64 {
    m.iter()
        .find(|(k, _)| k == series)
        .map(|(_, v)| *v)
        .unwrap_or(0.0)
}

/// A tmux server of the test's own, for driving an interactive program in a real pane.
pub struct Pane {
    pub socket: PathBuf,
}

impl Pane {
    pub fn start(dir: &std::path::Path, cmd: &str) -> Self {
        let socket = dir.with_extension("tui.sock");
        let ok = Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args([
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "220",
                "-y",
                "40",
                cmd,
            ])
            .env_remove("TMUX")
            .status()
            .unwrap()
            .success();
        assert!(ok, "cannot start the test's tmux server");
        Self { socket }
    }

    pub fn keys(&self, keys: &[&str]) {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("send-keys")
            .args(keys)
            .status()
            .unwrap();
    }

    pub fn screen(&self) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(["capture-pane", "-p"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        wait_for(what, || {
            let s = self.screen();
            f(&s).then_some(s)
        })
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .status();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Publishes a fast inactivity policy (thresholds in milliseconds) through the CLI.
pub fn publish_policy(
    up: &Up,
    id: &str,
    warn: u64,
    escalate: u64,
    replace: u64,
    reassign_after: u32,
    attempts: u32,
) {
    let file = up.dir.join(format!("{id}.toml"));
    std::fs::write(
        &file,
        format!(
            "policy_id = \"{id}\"\nwarn_after_ms = {warn}\nescalate_after_ms = {escalate}\nreplace_after_ms = {replace}\n\
             replacements_before_reassign = {reassign_after}\nmax_attempts = {attempts}\nexhaustion = \"blocked\"\n\
             evidence_kinds = [\"test-result\", \"commit\"]\n"
        ),
    )
    .unwrap();
    let r = up
        .cli(&["policy", "publish", file.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("policy publish: {e}"));
    assert!(r["digest"].as_str().unwrap().starts_with("sha256:"), "{r}");
}

pub fn assign_under(up: &Up, lane: &str, task: &str, policy: &str) -> Value {
    up.assign_with(lane, task, &["--inactivity-policy", policy])
}
