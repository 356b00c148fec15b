//! End to end, with real processes: `mosaic up` (coordinator + supervisor, joined by the
//! mutually authenticated WebSocket) on real tmux, cgroups and PostgreSQL, driven through
//! the operator CLI exactly as a user would.

mod common;
mod pg;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Up {
    child: Child,
    dir: PathBuf,
    lanes: u32,
    _db: pg::TestDb,
    db_url: String,
    hosts: u32,
}

fn spawn_up(dir: &std::path::Path, lanes: u32, hosts: u32, db_url: &str) -> Child {
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
    fn start(lanes: u32) -> Self {
        Self::fleet(lanes, 1)
    }

    /// `mosaic up --hosts N`: N supervisor processes, each a host of its own.
    fn fleet(lanes: u32, hosts: u32) -> Self {
        common::require_host();
        let db = pg::TestDb::new();
        let dir =
            std::env::temp_dir().join(format!("mosaic-e2e-{}", uuid::Uuid::new_v4().simple()));
        let child = spawn_up(&dir, lanes, hosts, &db.url);
        let db_url = db.url.clone();
        Self {
            child,
            dir,
            lanes,
            hosts,
            _db: db,
            db_url,
        }
    }

    /// Ends `mosaic up` with `sig` (SIGKILL: a crash; SIGTERM: a clean stop) and starts it
    /// again on the same state dir and database.
    fn restart_after(&mut self, sig: nix::sys::signal::Signal) {
        common::kill(self.child.id() as i32, sig);
        let _ = self.child.wait();
        self.child = spawn_up(&self.dir, self.lanes, self.hosts, &self.db_url);
    }

    fn cli(&self, args: &[&str]) -> Result<Value, String> {
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

    fn host(&self, args: &[&str]) -> Value {
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

    fn lane_id(&self, n: u32) -> String {
        let host = nix::unistd::gethostname()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        format!("{host}:lane-{n}")
    }

    fn assign(&self, lane: &str, task: &str) -> Value {
        self.cli(&[
            "assign",
            "--lane",
            lane,
            "--runtime",
            "fake@1.0.0",
            "--task",
            task,
            "--wait",
            "running",
        ])
        .unwrap_or_else(|e| panic!("assign: {e}"))
    }

    fn lane_state(&self, lane: &str) -> String {
        let lanes = self.cli(&["lanes"]).unwrap();
        lanes
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lane_id"] == lane)
            .map(|l| l["state"].as_str().unwrap().to_string())
            .unwrap_or_default()
    }

    fn assignment(&self, id: &str) -> Value {
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
    async fn continuation_reaches(&self, cn: &str, want: &str, what: &str) {
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

    async fn count(&self, sql: &str) -> i64 {
        let (c, conn) = tokio_postgres::connect(&self.db_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c.query_one(sql, &[]).await.unwrap().get(0)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The state dir (keys, sockets) always goes; a failed test keeps only its log.
        let _ = std::fs::remove_dir_all(&self.dir);
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(log_of(&self.dir));
        } else {
            eprintln!("mosaic up log kept: {}", log_of(&self.dir).display());
        }
    }
}

/// Reads `mosaic up`'s output up to and including the first line containing `marker`.
fn read_until(out: &mut impl BufRead, marker: &str) -> String {
    let mut text = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("mosaic up ended early:\n{text}");
        }
        text.push_str(&line);
        if line.contains(marker) {
            return text;
        }
    }
}

fn log_of(dir: &std::path::Path) -> PathBuf {
    dir.with_extension("log")
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    common::wait_until(what, &mut f)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_reaches_running_in_a_fresh_attachable_generation() {
    let up = Up::start(1);
    let lane = up.lane_id(1);
    assert_eq!(up.lane_state(&lane), "IDLE_CLEAN");
    let a = up.assign(&lane, "print=hello-e2e spawn=3");
    assert_eq!(a["state"], "RUNNING");
    assert_eq!(a["lane_id"], lane.as_str());
    let pi = &a["process_identity"];
    // The identity the coordinator activated is the one the supervisor verified.
    let host = up.host(&["status"]);
    let g = &host["lanes"][0]["generation"];
    assert_eq!(pi["root_pid"], g["process_identity"]["root_pid"]);
    assert_eq!(
        pi["launch_nonce_digest"],
        g["process_identity"]["launch_nonce_digest"]
    );
    assert_eq!(pi["cgroup_path"], g["process_identity"]["cgroup_path"]);
    assert_eq!(g["generation"], a["generation"]);
    // Owners after activation (spec §4): execution and responsibility with the lane.
    let s = up.assignment(a["assignment_id"].as_str().unwrap());
    assert_eq!(
        (
            s["state"].as_str(),
            s["lane_state"].as_str(),
            s["execution_owner"].as_str(),
            s["responsibility_owner"].as_str()
        ),
        (
            Some("ACTIVE"),
            Some("RUNNING"),
            Some(lane.as_str()),
            Some(lane.as_str())
        )
    );
    // One effect lease per scoped capability (default: the lane itself).
    assert_eq!(
        up.count("SELECT count(*) FROM leases WHERE released_at IS NULL")
            .await,
        1
    );
    // Attachable: the lane's tmux pane shows the harness, which ran its contract's task.
    let sock = host["lanes"][0]["tmux_socket"]
        .as_str()
        .unwrap()
        .to_string();
    let screen = wait_for("pane output", || {
        let out = Command::new("tmux")
            .args(["-S", &sock, "capture-pane", "-p", "-t", "=lane-1:"])
            .output()
            .ok()?;
        let t = String::from_utf8_lossy(&out.stdout).into_owned();
        t.contains("hello-e2e").then_some(t)
    });
    assert!(screen.contains("generation is active"), "{screen}");
    // Stop: leases revoked, the host stops the generation, its receipt makes the
    // cancellation final, the lane is clean, nothing is left running.
    let stopped = up
        .cli(&["stop", "--assignment", a["assignment_id"].as_str().unwrap()])
        .unwrap();
    assert_eq!(stopped["state"], "CANCELLED");
    let s = up.assignment(a["assignment_id"].as_str().unwrap());
    assert_eq!(
        (s["state"].as_str(), s["execution_owner"].as_str()),
        (Some("CANCELLED"), None)
    );
    wait_for("lane clean", || {
        (up.lane_state(&lane) == "IDLE_CLEAN").then_some(())
    });
    assert_eq!(
        up.count("SELECT count(*) FROM leases WHERE released_at IS NULL")
            .await,
        0
    );
    let receipts = up.cli(&["receipts", "--lane", &lane]).unwrap();
    let r = receipts.as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            r["termination_reason"].as_str(),
            r["reconciliation"].as_str()
        ),
        (Some("quit"), Some("retiring"))
    );
    assert!(up.host(&["status"])["lanes"][0]["generation"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_becomes_a_receipt_and_a_recovery_never_a_completion() {
    let up = Up::start(2);
    let lane = up.lane_id(1);
    let a = up.assign(&lane, "spawn=6");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let harness = up.host(&["status"])["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(harness as i32, nix::sys::signal::Signal::SIGKILL);
    let r = wait_for("reconciled receipt", || {
        let rs = up.cli(&["receipts", "--lane", &lane]).ok()?;
        rs.as_array()?
            .iter()
            .find(|r| r["generation"] == a["generation"] && !r["reconciliation"].is_null())
            .cloned()
    });
    assert_eq!(
        (
            r["termination_reason"].as_str(),
            r["observation_source"].as_str()
        ),
        (Some("sigkill"), Some("shim"))
    );
    assert_eq!(r["reconciliation"], "recovery");
    assert_eq!(r["cleanup"]["verified_empty"], true);
    let s = up.assignment(&id);
    assert_eq!(
        (s["state"].as_str(), s["execution_owner"].as_str()),
        (Some("RECOVERY"), None),
        "a killed run is never completed"
    );
    assert_eq!(
        up.count("SELECT count(*) FROM leases WHERE released_at IS NULL")
            .await,
        0,
        "the dead generation's leases were revoked"
    );
    // The lane is reusable only after that reconciliation: the same assignment resumes, on a
    // fresh generation with a fresh identity and a never-reused attempt.
    assert_eq!(up.lane_state(&lane), "IDLE_CLEAN");
    let b = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "print=again",
            "--wait",
            "running",
            "--resume",
            &id,
        ])
        .unwrap();
    assert_eq!(b["assignment_id"], id.as_str());
    assert_eq!(
        b["generation"].as_i64(),
        a["generation"].as_i64().map(|g| g + 1)
    );
    assert_ne!(
        b["process_identity"]["launch_nonce_digest"],
        a["process_identity"]["launch_nonce_digest"]
    );
    let s = up.assignment(&id);
    assert_eq!(
        (s["state"].as_str(), s["execution_owner"].as_str()),
        (Some("ACTIVE"), Some(lane.as_str()))
    );
    // A resume that does not match an assignment in recovery (here: active again, and its
    // scope is the first lane's) is refused, and the idle lane is left as it was. The store
    // tests isolate each of those checks.
    let other = up.lane_id(2);
    let err = up
        .cli(&[
            "assign",
            "--lane",
            &other,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--resume",
            &id,
        ])
        .unwrap_err();
    assert!(err.contains("only an assignment in recovery"), "{err}");
    assert_eq!(up.lane_state(&other), "IDLE_CLEAN");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_change_neither_status_nor_the_database() {
    let up = Up::start(1);
    let lane = up.lane_id(1);
    let status = up.cli(&["status"]).unwrap();
    let rows = "SELECT (SELECT count(*) FROM assignments) + (SELECT count(*) FROM reservations) \
                + (SELECT count(*) FROM attempts) + (SELECT count(*) FROM generations) + (SELECT count(*) FROM transition_receipts)";
    let before = up.count(rows).await;
    let big =
        std::env::temp_dir().join(format!("mosaic-big-task-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&big, "print=x ".repeat(20_000)).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--runtime", "fake@1.0.0", "--task", "explode"],
            "bad-input",
        ),
        (
            vec!["--runtime", "claude@9.9.9", "--task", "x"],
            "unknown-runtime",
        ),
        (
            vec![
                "--runtime",
                "fake@1.0.0",
                "--task-file",
                big.to_str().unwrap(),
            ],
            "too-large",
        ),
        (
            vec![
                "--runtime",
                "fake@1.0.0",
                "--task",
                "hang",
                "--completion-policy",
                "agent-says-so",
            ],
            "bad-input",
        ),
        (
            vec![
                "--runtime",
                "fake@1.0.0",
                "--task-file",
                "/nonexistent/task",
            ],
            "bad-input",
        ),
        (
            vec![
                "--runtime",
                "fake@1.0.0",
                "--task",
                "hang",
                "--resume",
                "as-doesnotexist",
            ],
            "not-found",
        ),
    ];
    for (args, category) in cases {
        let mut all = vec!["assign", "--lane", lane.as_str()];
        all.extend(args.iter().copied());
        let out = Command::new(common::MOSAIC)
            .args(&all)
            .arg("--state-dir")
            .arg(&up.dir)
            .arg("--json")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{all:?} was accepted");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["error"]["category"], category, "{all:?}: {v}");
    }
    // A lane that does not exist.
    let out = Command::new(common::MOSAIC)
        .args([
            "assign",
            "--lane",
            "nowhere:lane-1",
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--json",
            "--state-dir",
        ])
        .arg(&up.dir)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["category"], "not-found", "{v}");
    let _ = std::fs::remove_file(&big);
    assert_eq!(
        up.count(rows).await,
        before,
        "a bad request changed the database"
    );
    let after = up.cli(&["status"]).unwrap();
    assert_eq!(after["assignments"], status["assignments"]);
    assert_eq!(after["lanes"], status["lanes"]);
    // A task longer than a command line takes (here 120 KB) is accepted from a file.
    std::fs::write(
        &big,
        format!(
            "hang {}",
            "print=abcdefghijklmnopqrstuvwxyz0123456789 ".repeat(3000)
        ),
    )
    .unwrap();
    let a = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            "fake@1.0.0",
            "--task-file",
            big.to_str().unwrap(),
            "--wait",
            "running",
        ])
        .unwrap();
    assert_eq!(a["state"], "RUNNING");
    let _ = std::fs::remove_file(&big);
    // On a busy lane, resuming an assignment that does not exist is still `not-found`.
    let e = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--resume",
            "as-doesnotexist",
        ])
        .unwrap_err();
    assert!(
        e.contains("not-found") || e.contains("no assignment"),
        "{e}"
    );
    // A stop, then a stop asking for another outcome: a conflict, and nothing changes.
    let id = a["assignment_id"].as_str().unwrap();
    let stopped = up.cli(&["stop", "--assignment", id]).unwrap();
    assert_eq!(stopped["state"], "CANCELLED");
    let out = Command::new(common::MOSAIC)
        .args([
            "stop",
            "--assignment",
            id,
            "--fail",
            "--json",
            "--state-dir",
        ])
        .arg(&up.dir)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["category"], "conflict", "{v}");
    // A finished assignment no longer shows its old lane's state as its own.
    let s = up.assignment(id);
    assert_eq!(
        (s["state"].as_str(), s["lane_state"].as_str()),
        (Some("CANCELLED"), None),
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mosaic_up_killed_or_stopped_and_restarted_leaves_every_lane_usable() {
    let mut up = Up::start(2);
    let (l1, l2) = (up.lane_id(1), up.lane_id(2));
    let running = up.assign(&l1, "hang spawn=2");
    // Lane 2 waits for an ACK that never comes.
    let dir = up.dir.clone();
    let l2c = l2.clone();
    let pending = std::thread::spawn(move || {
        Command::new(common::MOSAIC)
            .args([
                "assign",
                "--lane",
                &l2c,
                "--runtime",
                "fake@1.0.0",
                "--task",
                "no-ack hang",
                "--wait",
                "running",
                "--json",
                "--state-dir",
            ])
            .arg(&dir)
            .output()
    });
    wait_for("lane 2 waiting for its ACK", || {
        (up.lane_state(&l2) == "AWAITING_ACK").then_some(())
    });
    // SIGKILL: nothing is torn down. The restarted `up` re-adopts the RUNNING generation and
    // ends the chain that lost its hand-off (new epoch), stopping its generation.
    up.restart_after(nix::sys::signal::Signal::SIGKILL);
    let _ = pending.join();
    wait_for("lane 1 still RUNNING", || {
        (up.lane_state(&l1) == "RUNNING").then_some(())
    });
    wait_for("lane 2 clean", || {
        (up.lane_state(&l2) == "IDLE_CLEAN").then_some(())
    });
    let st = up.cli(&["status"]).unwrap();
    let a2 = st["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["lane_id"] == l2.as_str())
        .unwrap()
        .clone();
    assert_eq!(a2["state"], "RECOVERY");
    // Stop, resume and new work all succeed.
    let s = up
        .cli(&[
            "stop",
            "--assignment",
            running["assignment_id"].as_str().unwrap(),
        ])
        .unwrap();
    assert_eq!(s["state"], "CANCELLED");
    let r = up
        .cli(&[
            "assign",
            "--lane",
            &l2,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--wait",
            "running",
            "--resume",
            a2["assignment_id"].as_str().unwrap(),
        ])
        .unwrap();
    assert_eq!(r["state"], "RUNNING");
    wait_for("lane 1 clean", || {
        (up.lane_state(&l1) == "IDLE_CLEAN").then_some(())
    });
    let b = up.assign(&l1, "hang");
    assert_eq!(b["state"], "RUNNING");
    // SIGTERM tears every lane down; the restart makes fresh incarnations, and the work
    // they had is in recovery — never a quarantined lane.
    fn incarnation(up: &Up, l: &str) -> Option<String> {
        up.cli(&["lanes"])
            .ok()?
            .as_array()?
            .iter()
            .find(|x| x["lane_id"] == l)?["lane_incarnation_id"]
            .as_str()
            .map(String::from)
    }
    let before: Vec<Option<String>> = [&l1, &l2].iter().map(|l| incarnation(&up, l)).collect();
    up.restart_after(nix::sys::signal::Signal::SIGTERM);
    // Fresh incarnations, registered from the new supervisor's hello (until then the
    // coordinator still shows the old, idle ones).
    for (l, old) in [&l1, &l2].iter().zip(&before) {
        wait_for("fresh lane", || {
            (up.lane_state(l) == "IDLE_CLEAN" && incarnation(&up, l) != *old).then_some(())
        });
    }
    // The stopped coordinator's leadership loop gave its lease up as it stopped (it was
    // asked to stop and awaited, not aborted): the new one took over a released lease.
    assert_eq!(
        up.count(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'leadership-acquire' \
               AND (body->>'previous_released')::boolean \
               AND coordinator_epoch = (SELECT max(coordinator_epoch) FROM transition_receipts WHERE transition = 'leadership-acquire')"
        )
        .await,
        1,
        "the stopped coordinator did not release its lease"
    );
    let st = up.cli(&["status"]).unwrap();
    for a in st["assignments"].as_array().unwrap() {
        assert!(
            matches!(a["state"].as_str(), Some("RECOVERY" | "CANCELLED")),
            "{a}"
        );
    }
    assert_eq!(up.assign(&l1, "hang")["state"], "RUNNING");
    assert_eq!(up.assign(&l2, "hang")["state"], "RUNNING");
}

#[test]
fn up_demo_shows_running_sigkill_receipt_and_recovery_then_cleans_up_on_sigterm() {
    common::require_host();
    let db = pg::TestDb::new();
    let dir = std::env::temp_dir().join(format!("mosaic-e2e-{}", uuid::Uuid::new_v4().simple()));
    let mut child = Command::new(common::MOSAIC)
        .args(["up", "--demo", "--lanes", "1", "--state-dir"])
        .arg(&dir)
        .args(["--database-url", &db.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // On a failed assertion, still stop `up` so it tears down what it started.
    struct Stop(i32);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    let _stop = Stop(child.id() as i32);
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let text = read_until(&mut out, "[demo] done");
    assert!(text.contains("is RUNNING in generation 1"), "{text}");
    assert!(
        text.contains("reason \"sigkill\"") && text.contains("reconciliation: \"recovery\""),
        "{text}"
    );
    assert!(
        text.contains("is RECOVERY") && text.contains("RUNNING in a fresh generation 2"),
        "{text}"
    );
    // Still up, and the lane shows the demo's running generation, attachable.
    let sock = dir.join("run/lanes/lane-1/tmux.sock");
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_ok(),
        "lane tmux server not running"
    );
    let st = mosaic::supervisor::control::call(
        &dir.join("run/control.sock"),
        &mosaic::supervisor::control::Request::Status,
    )
    .unwrap();
    assert_eq!(st["lanes"][0]["current_generation"], 2, "{st}");
    common::kill(child.id() as i32, nix::sys::signal::Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
    let cfg = mosaic::up::config_for(&dir, 1).unwrap();
    let root = cfg.cgroup_root.clone().unwrap();
    assert!(
        !root.exists(),
        "cgroups left behind under {}",
        root.display()
    );
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_err(),
        "tmux server left running"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn no_secret_reaches_a_log_receipt_audit_row_metric_or_table() {
    let up = Up::start(1);
    let lane = up.lane_id(1);
    // A full session: assign (ACK, activation), SIGKILL, resume, stop — with a task text
    // marker nobody may repeat.
    let marker = format!("REDACTME{}", uuid::Uuid::new_v4().simple());
    let task = format!("print={marker} hang spawn=1");
    let a = up.assign(&lane, &task);
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let harness = up.host(&["status"])["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(harness as i32, nix::sys::signal::Signal::SIGKILL);
    wait_for("recovery", || {
        (up.assignment(&id)["state"] == "RECOVERY" && up.lane_state(&lane) == "IDLE_CLEAN")
            .then_some(())
    });
    let b = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            "fake@1.0.0",
            "--task",
            &task,
            "--wait",
            "running",
            "--resume",
            &id,
        ])
        .unwrap();
    assert_eq!(b["state"], "RUNNING");
    up.cli(&["stop", "--assignment", &id]).unwrap();
    // Also a refused request carrying the marker (a bad directive after it).
    let _ = up.cli(&[
        "assign",
        "--lane",
        &lane,
        "--runtime",
        "fake@1.0.0",
        "--task",
        &format!("print={marker} explode"),
    ]);

    // The secrets. Fence tokens, re-derived the way the coordinator derives them.
    let secret_hex = std::fs::read_to_string(up.dir.join("keys/coordinator-secret")).unwrap();
    let secret = mosaic::coordinator::CoordinatorSecret::from_hex(&secret_hex).unwrap();
    let (c, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut secrets: Vec<(String, String)> = c
        .query("SELECT reservation_id, fence_salt FROM reservations", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                "a fence token".to_string(),
                secret.fence_token(r.get(0), r.get(1)).expose_hex(),
            )
        })
        .collect();
    assert_eq!(
        secrets.len(),
        2,
        "two reservations (the first and the resume)"
    );
    // Every key the coordinator and the host hold: signing seeds, the secret, TLS keys.
    secrets.push((
        "the coordinator secret".into(),
        secret_hex.trim().to_lowercase(),
    ));
    for e in std::fs::read_dir(up.dir.join("keys")).unwrap().flatten() {
        let k = std::fs::read_to_string(e.path()).unwrap();
        secrets.push((
            format!("key {}", e.file_name().to_string_lossy()),
            k.trim().to_lowercase(),
        ));
    }
    for e in std::fs::read_dir(up.dir.join("pki")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with("-key.pem") {
            let pem = std::fs::read_to_string(e.path()).unwrap();
            // The key material: the longest base64 line of the PEM body.
            let body = pem
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .max_by_key(|l| l.len())
                .unwrap()
                .to_string();
            secrets.push((format!("TLS key {name}"), body));
        }
    }

    // Everywhere they could leak: every database row (the task text only where it must be
    // kept to deliver it: contracts and attempts), every file of the supervisor's state,
    // the daemons' log, every operator answer, both metrics endpoints.
    let mut haystacks: Vec<(String, String)> = Vec::new();
    let tables: Vec<String> = c
        .query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for t in &tables {
        let strip = if t == "contracts" || t == "attempts" {
            " - 'task_text'"
        } else {
            ""
        };
        for row in c
            .query(
                &format!("SELECT (to_jsonb(x){strip})::text FROM {t} x"),
                &[],
            )
            .await
            .unwrap()
        {
            haystacks.push((format!("table {t}"), row.get(0)));
        }
    }
    fn walk(p: &std::path::Path, out: &mut Vec<(String, String)>) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if let Ok(b) = std::fs::read(&p) {
                    out.push((
                        p.display().to_string(),
                        String::from_utf8_lossy(&b).into_owned(),
                    ));
                }
            }
        }
    }
    walk(&up.dir.join("supervisor"), &mut haystacks);
    haystacks.push((
        "mosaic up log".into(),
        std::fs::read_to_string(log_of(&up.dir)).unwrap(),
    ));
    for cmd in [
        vec!["status"],
        vec!["receipts"],
        vec!["audit"],
        vec!["lanes"],
    ] {
        haystacks.push((
            format!("mosaic {}", cmd[0]),
            up.cli(&cmd).unwrap().to_string(),
        ));
    }
    haystacks.push((
        "host receipts".into(),
        up.host(&["receipts", "--all"]).to_string(),
    ));
    haystacks.push(("host status".into(), up.host(&["status"]).to_string()));
    haystacks.push(("assign answers".into(), format!("{a} {b}")));
    for m in ["run/metrics-coordinator.addr", "run/metrics.addr"] {
        let text: String = scrape(&up.dir.join(m))
            .iter()
            .map(|(k, v)| format!("{k} {v}\n"))
            .collect();
        haystacks.push((format!("metrics {m}"), text));
    }
    assert!(haystacks.len() > 20, "too little was scanned");
    let mut found = Vec::new();
    for (where_, text) in &haystacks {
        let lower = text.to_lowercase();
        for (what, secret) in &secrets {
            if !secret.is_empty()
                && (text.contains(secret.as_str()) || lower.contains(&secret.to_lowercase()))
            {
                found.push(format!("{what} in {where_}"));
            }
        }
        if text.contains(&marker) {
            found.push(format!("the task text in {where_}"));
        }
    }
    // Launch nonces never left the nonce file the shim read and deleted: no 64-hex string
    // anywhere hashes to a recorded nonce digest.
    let digests: Vec<String> = c
        .query("SELECT process_identity->>'launch_nonce_digest' FROM generations WHERE process_identity IS NOT NULL", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(digests.len(), 2, "two generations with identities");
    for (where_, text) in &haystacks {
        for word in text.split(|ch: char| !ch.is_ascii_hexdigit()) {
            if word.len() == 64 {
                if let Ok(n) = mosaic::supervisor::identity::LaunchNonce::from_hex(word) {
                    if digests.contains(&n.digest().0) {
                        found.push(format!("a raw launch nonce in {where_}"));
                    }
                }
            }
        }
    }
    assert!(found.is_empty(), "secrets found: {found:#?}");
    // The marker is kept where it must be (to deliver the task after any crash) — which
    // also shows the scan would have found it.
    let kept: i64 = c
        .query_one(
            "SELECT count(*) FROM contracts WHERE task_text LIKE '%' || $1 || '%'",
            &[&marker],
        )
        .await
        .unwrap()
        .get(0);
    assert!(kept >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_under_mosaic_up_keep_to_their_own_lanes_and_survive_each_other() {
    let up = Up::fleet(1, 2);
    let me = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (h1, h2) = (format!("{me}-1"), format!("{me}-2"));
    let (l1, l2) = (format!("{h1}:lane-1"), format!("{h2}:lane-1"));
    let a1 = up.assign(&l1, "hang");
    let a2 = up.assign(&l2, "hang");
    let st = up.cli(&["status"]).unwrap();
    let epoch = |st: &Value, h: &str| {
        st["host_sessions"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["host_id"] == h))
            .and_then(|s| s["session_epoch"].as_i64())
    };
    assert_eq!(
        (epoch(&st, &h1), epoch(&st, &h2)),
        (Some(1), Some(1)),
        "{st}"
    );
    // Each host's own supervisor, its own cgroup subtree and tmux server.
    let sup_pid = |h: &str| -> i32 {
        let cfg = up.dir.join(format!("hosts/{h}/supervisor.toml"));
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .find_map(|e| {
                let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                String::from_utf8_lossy(&cmd)
                    .replace('\0', " ")
                    .contains(&format!("supervisor --config {}", cfg.display()))
                    .then_some(pid)
            })
            .unwrap_or_else(|| panic!("no supervisor process for {h}"))
    };
    let (p1, p2) = (sup_pid(&h1), sup_pid(&h2));
    assert_ne!(p1, p2);
    // Host 2's supervisor is SIGKILLed: host 1 never notices.
    common::kill(p2, nix::sys::signal::Signal::SIGKILL);
    assert_eq!(up.lane_state(&l1), "RUNNING");
    // `mosaic up` starts host 2 again; it re-adopts its generation on a new session.
    let st = wait_for("host 2 back on a new session", || {
        let st = up.cli(&["status"]).ok()?;
        (epoch(&st, &h2)? >= 2).then_some(st)
    });
    assert_eq!(epoch(&st, &h1), Some(1), "host 1's session moved: {st}");
    assert_eq!(up.lane_state(&l2), "RUNNING");
    for a in [&a1, &a2] {
        let out = up
            .cli(&["stop", "--assignment", a["assignment_id"].as_str().unwrap()])
            .unwrap();
        assert_eq!(out["state"], "CANCELLED", "{out}");
    }
    // And both take new work.
    for l in [&l1, &l2] {
        assert_eq!(up.assign(l, "hang")["state"], "RUNNING");
    }
}

/// `GET /metrics` from the address a daemon wrote beside its sockets: (series, value).
fn scrape(addr_file: &std::path::Path) -> Vec<(String, f64)> {
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

fn metric(m: &[(String, f64)], series: &str) -> f64 {
    m.iter()
        .find(|(k, _)| k == series)
        .map(|(_, v)| *v)
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_agree_with_the_database_after_a_scripted_run() {
    let up = Up::start(2);
    let (l1, l2) = (up.lane_id(1), up.lane_id(2));
    // A run that ends by SIGKILL, one stopped by the operator, and a lane quarantined by
    // its host (its tmux server killed), then recreated.
    let a = up.assign(&l1, "hang spawn=2");
    let harness = up.host(&["status"])["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(harness as i32, nix::sys::signal::Signal::SIGKILL);
    wait_for("lane 1 clean", || {
        (up.lane_state(&l1) == "IDLE_CLEAN").then_some(())
    });
    let b = up.assign(&l1, "hang");
    assert_eq!(
        up.cli(&["stop", "--assignment", b["assignment_id"].as_str().unwrap()])
            .unwrap()["state"],
        "CANCELLED"
    );
    let _ = Command::new("tmux")
        .arg("-S")
        .arg(up.dir.join("run/lanes/lane-2/tmux.sock"))
        .arg("kill-server")
        .status();
    // The host notices at its next use of the lane: an assign it must refuse.
    let _ = up.cli(&[
        "assign",
        "--lane",
        &l2,
        "--runtime",
        "fake@1.0.0",
        "--task",
        "hang",
        "--wait",
        "running",
    ]);
    wait_for("lane 2 quarantined", || {
        (up.lane_state(&l2) == "QUARANTINED").then_some(())
    });
    up.cli(&["lane", "recreate", "--lane", &l2]).unwrap();
    wait_for("lane 2 recreated", || {
        (up.lane_state(&l2) == "IDLE_CLEAN").then_some(())
    });
    let _ = a;

    let coord = scrape(&up.dir.join("run/metrics-coordinator.addr"));
    let host = scrape(&up.dir.join("run/metrics.addr"));
    let (c, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // Receipts by source and reason: the coordinator's series are the database's counts,
    // and the host wrote exactly those.
    let rows = c
        .query(
            "SELECT body->>'observation_source', body->>'termination_reason', count(*) FROM termination_receipts GROUP BY 1, 2",
            &[],
        )
        .await
        .unwrap();
    assert!(rows.len() >= 2, "the run produced too few kinds of receipt");
    for r in &rows {
        let (src, reason, n): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
        let labels = format!("{{source=\"{src}\",reason=\"{reason}\"}}");
        assert_eq!(
            metric(&coord, &format!("mosaic_termination_receipts{labels}")),
            n as f64,
            "{src}/{reason}"
        );
        assert_eq!(
            metric(&host, &format!("mosaic_termination_receipts_total{labels}")),
            n as f64,
            "host {src}/{reason}"
        );
    }
    let count = |sql: &str| {
        let c = &c;
        let sql = sql.to_string();
        async move { c.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) as f64 }
    };
    assert_eq!(
        metric(&coord, "mosaic_generations"),
        count("SELECT count(*) FROM generations").await
    );
    let entries = count("SELECT sum(quarantine_entries)::bigint FROM lane_incarnations").await;
    assert!(entries >= 1.0, "the run quarantined nothing");
    assert_eq!(metric(&coord, "mosaic_quarantine_entries"), entries);
    assert_eq!(
        metric(
            &host,
            &format!("mosaic_lane_quarantines_total{{lane=\"{l2}\"}}")
        ),
        1.0
    );
    assert_eq!(
        metric(
            &coord,
            "mosaic_authority_transitions{transition=\"activate\"}"
        ),
        count("SELECT count(*) FROM transition_receipts WHERE transition = 'activate'").await
    );
    assert_eq!(metric(&coord, "mosaic_leadership_leading"), 1.0);
    assert!(
        metric(
            &coord,
            "mosaic_transitions_total{op=\"activate\",result=\"decided\"}"
        ) >= 2.0
    );
    // No label or value carries a task, a token or a key: only the names used above.
    let text: String = coord.iter().chain(&host).map(|(k, _)| k.clone()).collect();
    assert!(
        !text.contains("spawn=") && !text.contains("hang"),
        "task text in metrics"
    );
}

/// A tmux server of the test's own, for driving an interactive program in a real pane.
struct Pane {
    socket: PathBuf,
}

impl Pane {
    fn start(dir: &std::path::Path, cmd: &str) -> Self {
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

    fn keys(&self, keys: &[&str]) {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("send-keys")
            .args(keys)
            .status()
            .unwrap();
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(["capture-pane", "-p"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
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

#[tokio::test(flavor = "multi_thread")]
async fn the_tui_lists_attaches_detaches_and_stops_in_a_real_terminal() {
    let up = Up::start(3);
    let l1 = up.lane_id(1);
    let a = up.assign(&l1, "print=hello-from-the-lane hang");
    let id = a["assignment_id"].as_str().unwrap();
    // Lane 3's work says it is blocked: the view shows why.
    let l3 = up.lane_id(3);
    up.assign(&l3, "blocked=needs-review");
    let tui = Pane::start(
        &up.dir,
        &format!("{} tui --state-dir {}", common::MOSAIC, up.dir.display()),
    );
    // The list: both lanes, lane 1 RUNNING under its assignment.
    let screen = tui.wait_for("the lane list", |s| {
        s.lines()
            .any(|l| l.contains(&l1) && l.contains("RUNNING") && l.contains(id))
            && s.contains(&up.lane_id(2))
    });
    assert!(screen.contains("fake@1.0.0"), "{screen}");
    tui.wait_for("the blocked work's reason", |s| {
        s.lines()
            .any(|l| l.contains(&l3) && l.contains("blocked: needs-review"))
    });
    // Enter attaches to the selected lane (the first): its pane shows the harness.
    tui.keys(&["Enter"]);
    tui.wait_for("the lane's own pane", |s| s.contains("hello-from-the-lane"));
    // Detach (the lane's tmux prefix, then d): back in the view.
    tui.keys(&["C-b", "d"]);
    tui.wait_for("the view again", |s| {
        s.contains(&format!("detached from {l1}"))
    });
    // `s` stops the selected lane's assignment; the view follows to IDLE_CLEAN.
    tui.keys(&["s"]);
    tui.wait_for("the lane stopped", |s| {
        s.lines()
            .any(|l| l.contains(&l1) && l.contains("IDLE_CLEAN"))
    });
    assert_eq!(up.assignment(id)["state"], "CANCELLED");
    // Assign from the prompt: `a`, then the runtime and task.
    tui.keys(&["a"]);
    tui.wait_for("the assign prompt", |s| s.contains("assign to"));
    tui.keys(&["print=second hang", "Enter"]);
    tui.wait_for("the new assignment running", |s| {
        s.lines().any(|l| l.contains(&l1) && l.contains("RUNNING"))
    });
    tui.keys(&["q"]);
}

/// Publishes a fast inactivity policy (thresholds in milliseconds) through the CLI.
fn publish_policy(
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

fn assign_under(up: &Up, lane: &str, task: &str, policy: &str) -> Value {
    up.cli(&[
        "assign",
        "--lane",
        lane,
        "--runtime",
        "fake@1.0.0",
        "--task",
        task,
        "--wait",
        "running",
        "--inactivity-policy",
        policy,
    ])
    .unwrap_or_else(|e| panic!("assign: {e}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_harness_is_warned_escalated_replaced_reassigned_and_blocked_by_its_policy() {
    let up = Up::start(2);
    let (lane1, lane2) = (up.lane_id(1), up.lane_id(2));
    // One replacement on the first lane, then another lane; three attempts in all.
    publish_policy(&up, "stall-test@1", 600, 1200, 2000, 1, 3);
    // A published version is frozen: the same id with another body is refused.
    let file = up.dir.join("changed.toml");
    std::fs::write(&file, "policy_id = \"stall-test@1\"\nwarn_after_ms = 1\nescalate_after_ms = 2\nreplace_after_ms = 3\nreplacements_before_reassign = 0\nmax_attempts = 1\nexhaustion = \"blocked\"\nevidence_kinds = [\"commit\"]\n").unwrap();
    let err = up
        .cli(&["policy", "publish", file.to_str().unwrap()])
        .unwrap_err();
    assert!(err.contains("conflict"), "{err}");
    // An unpublished policy is refused before anything is reserved.
    let err = up
        .cli(&[
            "assign",
            "--lane",
            &lane1,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--inactivity-policy",
            "nope@1",
        ])
        .unwrap_err();
    assert!(err.contains("not-found"), "{err}");
    assert_eq!(up.count("SELECT count(*) FROM assignments").await, 0);

    let a = assign_under(&up, &lane1, "hang", "stall-test@1");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let s = up.assignment(&id);
    assert_eq!(s["work_status"], "active");
    assert_eq!(s["inactivity_policy"], "stall-test@1");
    assert!(
        s["last_progress_at"].is_null(),
        "nothing reported progress yet"
    );
    let blocked = wait_for("the policy to run out", || {
        let s = up.assignment(&id);
        (s["work_status"] == "blocked").then_some(s)
    });
    assert_eq!(blocked["blocker_code"], "inactivity-exhausted");
    assert!(blocked["blocker_evidence_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(
        blocked["responsibility_owner"]
            .as_str()
            .map(|o| !o.is_empty()),
        Some(true)
    );
    assert!(
        blocked["next_action"]
            .as_str()
            .unwrap()
            .contains("mosaic unblock"),
        "{blocked}"
    );
    assert_eq!(
        blocked["state"], "RECOVERY",
        "blocked for review, never done"
    );
    // Every step is a receipt: per attempt a warning, an escalation and a replacement.
    let steps = |t: &'static str| {
        let id = id.clone();
        let up = &up;
        async move {
            up.count(&format!(
                "SELECT count(*) FROM transition_receipts WHERE assignment_id = '{id}' AND transition = '{t}'"
            ))
            .await
        }
    };
    assert_eq!(steps("inactivity-warn").await, 3);
    assert_eq!(steps("inactivity-escalate").await, 3);
    assert_eq!(steps("inactivity-replace").await, 3);
    assert_eq!(steps("inactivity-exhausted").await, 1);
    // Three attempts: two on the first lane (one replacement there), then the other lane.
    let on = |lane: &str| {
        format!(
            "SELECT count(*) FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) \
             WHERE r.assignment_id = '{id}' AND li.lane_id = '{lane}'"
        )
    };
    assert_eq!(up.count(&on(&lane1)).await, 2);
    assert_eq!(up.count(&on(&lane2)).await, 1);
    // Each replaced generation ended with a verified receipt and no survivor.
    let ended = format!(
        "SELECT count(*) FROM termination_receipts WHERE assignment_id = '{id}' AND verified_empty AND reconciled_at IS NOT NULL"
    );
    assert_eq!(up.count(&ended).await, 3);
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM progress_receipts WHERE assignment_id = '{id}'"
        ))
        .await,
        0
    );
    // The way out: unblock grants a fresh budget, and the watchdog starts the next attempt.
    let r = up
        .cli(&[
            "unblock",
            "--assignment",
            &id,
            "--next-action",
            "retry after the fixture fix",
        ])
        .unwrap();
    assert_eq!(r["work_status"], "active");
    wait_for("the next attempt to run", || {
        let s = up.assignment(&id);
        (s["state"] == "ACTIVE" && s["lane_state"] == "RUNNING").then_some(())
    });
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM attempts WHERE assignment_id = '{id}'"
        ))
        .await,
        4
    );
    up.cli(&["stop", "--assignment", &id]).unwrap();
    assert_eq!(up.assignment(&id)["work_status"], "done");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_new_evidence_is_progress_and_blocked_work_keeps_its_owner_and_evidence() {
    let up = Up::start(3);
    let (lane1, lane2, lane3) = (up.lane_id(1), up.lane_id(2), up.lane_id(3));
    publish_policy(&up, "progress-test@1", 500, 1000, 2500, 5, 5);
    // Fresh evidence every 300 ms keeps the work alive past its 2.5 s deadline.
    let a = assign_under(&up, &lane1, "progress-every=0.3", "progress-test@1");
    let live = a["assignment_id"].as_str().unwrap().to_string();
    // The same evidence over and over (a heartbeat dressed as progress) counts once.
    let b = assign_under(
        &up,
        &lane2,
        "progress-every=0.3 progress-same",
        "progress-test@1",
    );
    let same = b["assignment_id"].as_str().unwrap().to_string();
    // A harness that says it is blocked, with evidence and an unblock action.
    let c = assign_under(&up, &lane3, "blocked=needs-credentials", "progress-test@1");
    let blocked = c["assignment_id"].as_str().unwrap().to_string();

    wait_for("the repeated evidence's generation to be replaced", || {
        let s = up.assignment(&same);
        (s["watchdog_step"] == "replacing" || s["attempts"].as_i64() > Some(1)).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let s = up.assignment(&live);
    assert_eq!(
        (s["state"].as_str(), s["lane_state"].as_str()),
        (Some("ACTIVE"), Some("RUNNING"))
    );
    assert_eq!(
        s["attempts"], 1,
        "validated progress kept the first generation"
    );
    assert!(s["last_progress_at"].is_string());
    assert!(
        up.count(&format!(
            "SELECT count(*) FROM progress_receipts WHERE assignment_id = '{live}'"
        ))
        .await
            >= 5
    );
    assert_eq!(
        up.count(&format!("SELECT count(*) FROM transition_receipts WHERE assignment_id = '{live}' AND transition = 'inactivity-replace'")).await,
        0
    );
    // Of the repeated evidence exactly one report counted (a repeat is the same step: it lands
    // on the first receipt and extends nothing), so its deadline passed and it was replaced.
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM progress_receipts p JOIN attempts t USING (assignment_attempt_id) \
             WHERE p.assignment_id = '{same}' AND t.created_at = (SELECT min(created_at) FROM attempts WHERE assignment_id = '{same}')"
        ))
        .await,
        1
    );
    // Blocked: owner kept, evidence and next action recorded, and the watchdog leaves it be.
    let s = up.assignment(&blocked);
    assert_eq!(s["work_status"], "blocked");
    assert_eq!(s["blocker_code"], "needs-credentials");
    assert!(s["blocker_evidence_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert!(s["next_action"]
        .as_str()
        .unwrap()
        .contains("resolve needs-credentials"));
    assert_eq!(s["responsibility_owner"], lane3.as_str());
    assert_eq!(s["lane_state"], "RUNNING");
    assert_eq!(
        up.count(&format!("SELECT count(*) FROM transition_receipts WHERE assignment_id = '{blocked}' AND transition LIKE 'inactivity-%'")).await,
        0
    );
    // An operator's blocked claim needs evidence: an empty file is refused, nothing changes.
    let empty = up.dir.join("empty-evidence");
    std::fs::write(&empty, "").unwrap();
    let err = up
        .cli(&[
            "block",
            "--assignment",
            &live,
            "--code",
            "waiting",
            "--evidence",
            empty.to_str().unwrap(),
            "--next-action",
            "x",
        ])
        .unwrap_err();
    assert!(err.contains("empty"), "{err}");
    assert_eq!(up.assignment(&live)["work_status"], "active");
    // Without a next action it is refused by the coordinator too.
    let ev = up.dir.join("evidence");
    std::fs::write(&ev, "CI is red upstream").unwrap();
    let err = up
        .cli(&[
            "block",
            "--assignment",
            &live,
            "--code",
            "waiting",
            "--evidence",
            ev.to_str().unwrap(),
            "--next-action",
            " ",
        ])
        .unwrap_err();
    assert!(err.contains("bad-input"), "{err}");
    assert_eq!(up.assignment(&live)["work_status"], "active");
    // The database itself refuses blocked work without evidence, whatever the code does.
    let (cl, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let e = cl
        .batch_execute(&format!(
            "BEGIN; INSERT INTO transition_receipts (receipt_id, transition, sot_incarnation, coordinator_epoch, body) \
             SELECT 'x', 'x', sot_incarnation, epoch, '{{}}' FROM leadership; \
             UPDATE assignments SET work_status = 'blocked', blocker_code = 'x' WHERE assignment_id = '{live}'; COMMIT"
        ))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("blocked_has_evidence"), "{e:?}");
    let _ = cl.batch_execute("ROLLBACK").await;
    let e = cl
        .batch_execute(&format!(
            "BEGIN; INSERT INTO transition_receipts (receipt_id, transition, sot_incarnation, coordinator_epoch, body) \
             SELECT 'y', 'y', sot_incarnation, epoch, '{{}}' FROM leadership; \
             UPDATE assignments SET next_action = '' WHERE assignment_id = '{live}'; COMMIT"
        ))
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("unfinished_work_is_owned"),
        "{e:?}"
    );
    let _ = cl.batch_execute("ROLLBACK").await;
    // Unblocked by the operator, the work is active again under a fresh inactivity period.
    let r = up
        .cli(&[
            "unblock",
            "--assignment",
            &blocked,
            "--next-action",
            "credentials provided; continue",
        ])
        .unwrap();
    assert_eq!(r["work_status"], "active");
    let s = up.assignment(&blocked);
    assert_eq!(
        (s["work_status"].as_str(), s["blocker_code"].as_str()),
        (Some("active"), None)
    );
    for id in [&live, &same, &blocked] {
        let _ = up.cli(&["stop", "--assignment", id]);
    }
}

/// Spec §8.1 and §17 rows Unacknowledged handoff, Prior-owner handoff effect and
/// Handoff/activation confusion, end to end: an offer the target never acknowledges moves
/// nothing; an acknowledged one moves responsibility, fences the source, and the target
/// still goes through its own activation challenge and ACK before it runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_handoff_moves_responsibility_only_by_its_ack_and_the_target_still_activates() {
    let up = Up::start(3);
    let (lane1, lane2, lane3) = (up.lane_id(1), up.lane_id(2), up.lane_id(3));
    let a = up.assign(&lane1, "hang");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let source_generation = a["generation"].as_i64().unwrap();

    // 1. Unacknowledged: the target's harness never says handoff-ack.
    let r = up
        .cli(&[
            "handoff",
            "--assignment",
            &id,
            "--to",
            &lane2,
            "--task",
            "hang",
            "--within-ms",
            "3000",
        ])
        .unwrap_or_else(|e| panic!("handoff: {e}"));
    assert!(r["handoff_id"].is_string(), "{r}");
    let s = up.assignment(&id);
    assert_eq!(s["work_status"], "handoff");
    assert_eq!(
        (
            s["responsibility_owner"].as_str(),
            s["execution_owner"].as_str(),
            s["pending_target"].as_str()
        ),
        (
            Some(lane1.as_str()),
            Some(lane1.as_str()),
            Some(lane2.as_str())
        ),
        "an offer is not a transfer"
    );
    // A stop during the offer is refused, and a second offer is refused.
    let err = up
        .cli(&["stop", "--assignment", &id, "--no-wait"])
        .unwrap_err();
    assert!(err.contains("handoff"), "{err}");
    let err = up
        .cli(&["handoff", "--assignment", &id, "--to", &lane3])
        .unwrap_err();
    assert!(err.contains("wrong-state"), "{err}");
    wait_for("the unacknowledged offer to expire", || {
        let s = up.assignment(&id);
        (s["work_status"] == "active" && s["pending_target"].is_null()).then_some(s)
    });
    let s = up.assignment(&id);
    assert_eq!(
        (
            s["state"].as_str(),
            s["responsibility_owner"].as_str(),
            s["execution_owner"].as_str(),
            s["lane_state"].as_str()
        ),
        (
            Some("ACTIVE"),
            Some(lane1.as_str()),
            Some(lane1.as_str()),
            Some("RUNNING")
        ),
        "the work stayed with its source"
    );
    assert_eq!(s["generation"].as_i64().map(|_| ()), Some(()));
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM handoffs WHERE assignment_id = '{id}' AND state = 'EXPIRED'"
        ))
        .await,
        1
    );
    assert_eq!(
        up.count(&format!("SELECT count(*) FROM generations g JOIN reservations r USING (reservation_id) \
                           WHERE r.assignment_id = '{id}' AND g.lane_incarnation_id = (SELECT lane_incarnation_id FROM lane_incarnations WHERE lane_id = '{lane1}' AND retired_at IS NULL) AND g.state = 'LIVE'")).await,
        1,
        "the source generation still runs"
    );
    wait_for("the target lane to be clean again", || {
        (up.lane_state(&lane2) == "IDLE_CLEAN").then_some(())
    });

    // 2. Acknowledged: the target harness acknowledges the handoff, then its own activation.
    let before_leases = up
        .count(&format!("SELECT count(*) FROM leases l JOIN lane_incarnations li USING (lane_incarnation_id) WHERE li.lane_id = '{lane1}' AND l.released_at IS NULL"))
        .await;
    assert!(before_leases > 0, "the source holds its effect lease");
    up.cli(&[
        "handoff",
        "--assignment",
        &id,
        "--to",
        &lane3,
        "--task",
        "accept-handoff hang",
    ])
    .unwrap_or_else(|e| panic!("handoff: {e}"));
    let s = wait_for("the target to run", || {
        let s = up.assignment(&id);
        (s["lane_id"] == lane3.as_str() && s["lane_state"] == "RUNNING").then_some(s)
    });
    assert_eq!(
        (
            s["responsibility_owner"].as_str(),
            s["execution_owner"].as_str(),
            s["pending_target"].as_str(),
            s["work_status"].as_str()
        ),
        (
            Some(lane3.as_str()),
            Some(lane3.as_str()),
            None,
            Some("active")
        )
    );
    // The order of decisions: accept, then the target's activation challenge and ACK, then
    // activation — the handoff receipt granted nothing by itself.
    let order = |t: &str| {
        format!(
        "SELECT coalesce(min(decided_at) FILTER (WHERE transition = '{t}'), 'infinity') < \
                coalesce(min(decided_at) FILTER (WHERE transition = 'activation-challenge'), '-infinity') \
         FROM transition_receipts WHERE assignment_id = '{id}'"
    )
    };
    let (c, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let accepted_first: bool = c
        .query_one(&order("handoff-accept"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        accepted_first,
        "the activation challenge came before the handoff was accepted"
    );
    let row = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM transition_receipts WHERE assignment_id = '{id}' AND transition = 'handoff-accept'), \
                        (SELECT count(*) FROM transition_receipts WHERE assignment_id = '{id}' AND transition = 'activate'), \
                        (SELECT count(*) FROM challenges c JOIN reservations r USING (reservation_id) WHERE r.assignment_id = '{id}'), \
                        (SELECT count(*) FROM handoffs WHERE assignment_id = '{id}' AND state = 'ACCEPTED')"
            ),
            &[],
        )
        .await
        .unwrap();
    let counts: (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(
        counts,
        (1, 2, 2, 1),
        "(accepts, activations, activation challenges, accepted handoffs)"
    );
    // The prior owner holds nothing: its leases are revoked, its generation ended with a
    // verified receipt, its lane is clean.
    wait_for("the source generation's receipt", || {
        (up.lane_state(&lane1) == "IDLE_CLEAN").then_some(())
    });
    assert_eq!(
        up.count(&format!("SELECT count(*) FROM leases l JOIN lane_incarnations li USING (lane_incarnation_id) WHERE li.lane_id = '{lane1}' AND l.released_at IS NULL")).await,
        0
    );
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM termination_receipts WHERE assignment_id = '{id}' AND lane_id = '{lane1}' AND generation = {source_generation} AND verified_empty"
        ))
        .await,
        1
    );
    up.cli(&["stop", "--assignment", &id]).unwrap();
}

/// Spec §14 rule 11, end to end: a continuation reaches the live generation only at a
/// settled boundary, is accepted once (loop budget debited once), and its result recorded;
/// one open continuation per assignment.
#[tokio::test(flavor = "multi_thread")]
async fn a_continuation_reaches_a_settled_harness_once_and_its_result_is_recorded() {
    let up = Up::start(2);
    let lane = up.lane_id(1);
    let a = up.assign(&lane, "take-continuations busy=1");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let r = up
        .cli(&[
            "continue",
            "--assignment",
            &id,
            "--next-action",
            "run the integration tests",
        ])
        .unwrap_or_else(|e| panic!("continue: {e}"));
    let cn = r["continuation_id"].as_str().unwrap().to_string();
    // While the first one is open, a second is refused.
    let err = up
        .cli(&[
            "continue",
            "--assignment",
            &id,
            "--next-action",
            "and then the docs",
        ])
        .unwrap_err();
    assert!(err.contains("conflict"), "{err}");
    up.continuation_reaches(&cn, "RESULT_RECORDED", "the continuation's result")
        .await;
    // The second continuation arrives while the harness is busy with nothing (settled) —
    // and a third only after the second's result.
    let r2 = up
        .cli(&[
            "continue",
            "--assignment",
            &id,
            "--next-action",
            "and then the docs",
        ])
        .unwrap();
    let cn2 = r2["continuation_id"].as_str().unwrap().to_string();
    up.continuation_reaches(&cn2, "RESULT_RECORDED", "the second continuation's result")
        .await;
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE assignment_id IS NULL AND transition = 'continuation-accept' \
             AND body->>'assignment_id' = '{id}'"
        ))
        .await,
        2,
        "each continuation accepted exactly once"
    );
    assert_eq!(
        up.count(&format!(
            "SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{id}'"
        ))
        .await,
        18,
        "the loop budget was debited once per continuation"
    );
    assert_eq!(
        up.count("SELECT count(*) FROM audit WHERE operation LIKE '%continuation%' AND operation <> 'continuation-create'")
            .await,
        0,
        "no refused delivery, acceptance or result"
    );
    // `status` shows where the work's continuations stand.
    let st = up.assignment(&id);
    assert_eq!(st["continuation"]["state"], "RESULT_RECORDED");
    assert_eq!(st["continuation"]["continuation_id"], cn2.as_str());
    assert_eq!(st["continuation_budget"], 18);
    // A harness that never settles (it never waits for a continuation) is never given one:
    // the offer lapses undelivered and the loop budget is untouched.
    let lane2 = up.lane_id(2);
    let b = up.assign(&lane2, "hang");
    let busy = b["assignment_id"].as_str().unwrap().to_string();
    let r3 = up
        .cli(&[
            "continue",
            "--assignment",
            &busy,
            "--next-action",
            "anything",
            "--within-ms",
            "2000",
        ])
        .unwrap();
    let cn3 = r3["continuation_id"].as_str().unwrap().to_string();
    up.continuation_reaches(&cn3, "EXPIRED", "the undeliverable continuation's expiry")
        .await;
    assert_eq!(
        up.count(&format!(
            "SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{busy}'"
        ))
        .await,
        20
    );
    up.cli(&["stop", "--assignment", &id]).unwrap();
    up.cli(&["stop", "--assignment", &busy]).unwrap();
    assert_eq!(up.count("SELECT count(*) FROM continuations WHERE state IN ('PENDING', 'CLAIMED', 'DELIVERY_ACCEPTED')").await, 0);
}
