//! The README's production walkthrough, run as written: every line of its marked block in
//! one shell, in order, against a real PostgreSQL, real daemons as separate processes and
//! real cgroups — so the documented commands cannot drift from the tool. Only the block's
//! first variables are given values of this run (a database, free ports, a directory);
//! each of those lines keeps a value already in the environment, as the README says.

mod common;
mod pg;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The commands of the README's walkthrough block, one per element.
fn walkthrough() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let start = readme
        .find("<!-- walkthrough -->")
        .expect("the README has no walkthrough block");
    let rest = &readme[start..];
    let body = rest
        .split_once("```sh\n")
        .and_then(|(_, b)| b.split_once("\n```"))
        .map(|(b, _)| b)
        .expect("the walkthrough block is not a ```sh block");
    let mut lines = vec![];
    let mut cur = String::new();
    for l in body.lines() {
        if let Some(head) = l.strip_suffix('\\') {
            cur.push_str(head);
            continue;
        }
        cur.push_str(l);
        let line = std::mem::take(&mut cur);
        if !line.trim().is_empty() && !line.trim_start().starts_with('#') {
            lines.push(line);
        }
    }
    lines
}

struct Shell {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    dir: PathBuf,
    daemons: Vec<i32>,
}

impl Shell {
    /// Sends `script` and returns the value of the marker line it ends with.
    fn run(&mut self, script: &str, marker: &str) -> String {
        writeln!(self.stdin, "{script}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "the shell ended while running {script:?}");
            if let Some(v) = line.trim_end().strip_prefix(marker) {
                return v.to_string();
            }
        }
    }

    fn output(&self, step: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("step-{step}.out"))).unwrap_or_default()
    }
}

fn is_assignment(line: &str) -> bool {
    let name: String = line
        .chars()
        .take_while(|c| c.is_ascii_uppercase() || *c == '_')
        .collect();
    !name.is_empty() && line[name.len()..].starts_with('=')
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readmes_production_walkthrough_runs_as_written() {
    common::require_host();
    let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let dir = std::env::temp_dir().join(format!("mosaic-walk-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let server = pg::server();
    let db = format!("walk_{id}");
    let mount = mosaic::cgroup::discover_mount().unwrap().path;
    let cgr = mount.join(format!("mosaic-walk-{id}"));
    let bin = Path::new(common::MOSAIC).parent().unwrap().to_path_buf();
    let ports: Vec<String> = (0..4).map(|_| common::free_port().to_string()).collect();
    let mut child = Command::new("bash")
        .args(["--noprofile", "--norc"])
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("W", &dir)
        .env("ADMIN_URL", server.url("postgres"))
        .env("DB", &db)
        .env("DB_URL", server.url(&db))
        .env("A", "127.0.0.1")
        .env("B", "127.0.0.1")
        .env("PA", &ports[0])
        .env("OA", &ports[1])
        .env("PB", &ports[2])
        .env("OB", &ports[3])
        .env("CGR", &cgr)
        .env("MOSAIC_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("bash");
    let mut sh = Shell {
        stdin: child.stdin.take_or_panic(),
        out: BufReader::new(child.stdout.take_or_panic()),
        child,
        dir: dir.clone(),
        daemons: vec![],
    };
    let _cleanup = Cleanup {
        dir: dir.clone(),
        roots: vec![
            PathBuf::from(format!("{}-1", cgr.display())),
            PathBuf::from(format!("{}-2", cgr.display())),
        ],
        db: db.clone(),
        pids: std::sync::Arc::new(std::sync::Mutex::new(vec![])),
    };
    let lines = walkthrough();
    assert!(
        lines.len() > 20,
        "the walkthrough block is too short: {lines:?}"
    );
    let mut daemons_started = false;
    let mut last_output = String::new();
    for (i, line) in lines.iter().enumerate() {
        if is_assignment(line) {
            let rc = sh.run(&format!("{line}\necho __rc:$?"), "__rc:");
            assert_eq!(rc, "0", "step {i} `{line}` failed");
            continue;
        }
        if let Some(cmd) = line.trim_end().strip_suffix('&') {
            let pid = sh.run(
                &format!("{cmd} > \"$W/daemon-{i}.log\" 2>&1 &\necho __pid:$!"),
                "__pid:",
            );
            let pid: i32 = pid.parse().unwrap();
            sh.daemons.push(pid);
            _cleanup.pids.lock().unwrap().push(pid);
            daemons_started = true;
            continue;
        }
        // A command refused because a daemon is still starting (the host not connected yet,
        // its lanes not registered yet, a standby taking over) is repeated until it is
        // answered, as an operator would; any other failure, or any failure before a
        // daemon runs, fails the walkthrough at once.
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let rc = sh.run(
                &format!("{{ {line} ; }} > \"$W/step-{i}.out\" 2>&1; echo __rc:$?"),
                "__rc:",
            );
            if rc == "0" {
                break;
            }
            let out = sh.output(i);
            let not_yet = ["not-leader", "unavailable", "host-unreachable", "not-found"]
                .iter()
                .any(|c| out.contains(&format!("\"category\": \"{c}\"")));
            assert!(
                daemons_started && not_yet && Instant::now() < deadline,
                "step {i} `{line}` failed (exit {rc}):\n{out}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        last_output = sh.output(i);
    }

    // What the walkthrough promised, checked in the database and the last status.
    let (c, conn) = tokio_postgres::connect(&server.url(&db), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let count = |q: &'static str| {
        let c = &c;
        async move { c.query_one(q, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert!(
        count("SELECT count(*) FROM epochs").await >= 2,
        "the standby never took over"
    );
    assert_eq!(count("SELECT count(*) FROM assignments").await, 3);
    assert_eq!(
        count("SELECT count(*) FROM lane_incarnations li JOIN lanes l USING (lane_id) WHERE l.host_id = 'build-01' AND li.retired_at IS NULL").await,
        0,
        "the decommissioned host's lanes are still current"
    );
    assert_eq!(
        count("SELECT count(*) FROM trust_revocations WHERE subject IN ('host:build-01', 'host:build-02')").await,
        2
    );
    let status: serde_json::Value = serde_json::from_str(&last_output)
        .unwrap_or_else(|e| panic!("status is not JSON ({e}): {last_output}"));
    assert!(
        !status["hosts_connected"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h == "host:build-02"),
        "the revoked host is still connected: {status}"
    );
    assert!(
        status["host_sessions"].is_array(),
        "status has no host sessions: {status}"
    );
    // The revoked host keeps trying; each hello is refused and audited.
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let n = count("SELECT count(*) FROM audit WHERE detail LIKE '%host:build-02%revoked-key%'")
            .await;
        if n > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no refusal of the revoked host was audited"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The decommissioned supervisor left: its process, its cgroup root.
    let decommissioned = PathBuf::from(format!("{}-1", cgr.display()));
    common::wait_until("build-01's cgroup root removed", || {
        (!decommissioned.exists()).then_some(())
    });
    drop(sh.stdin);
    let _ = sh.child.wait();
}

trait TakeOrPanic<T> {
    fn take_or_panic(&mut self) -> T;
}

impl<T> TakeOrPanic<T> for Option<T> {
    fn take_or_panic(&mut self) -> T {
        self.take().expect("piped")
    }
}

/// Kills every daemon the walkthrough started, their lanes (cgroup roots) and database.
struct Cleanup {
    dir: PathBuf,
    roots: Vec<PathBuf>,
    db: String,
    pids: std::sync::Arc<std::sync::Mutex<Vec<i32>>>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in self.pids.lock().map(|p| p.clone()).unwrap_or_default() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        }
        let lanes: Vec<PathBuf> = ["build-01", "build-02"]
            .iter()
            .map(|h| self.dir.join(h).join("run").join("lanes"))
            .collect();
        let lanes: Vec<&Path> = lanes.iter().map(PathBuf::as_path).collect();
        let roots: Vec<&Path> = self.roots.iter().map(PathBuf::as_path).collect();
        pg::server().psql(
            "postgres",
            &format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.db),
        );
        let logs: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".log") || n.ends_with(".out"))
                    .collect()
            })
            .unwrap_or_default();
        let logs: Vec<&str> = logs.iter().map(String::as_str).collect();
        common::teardown_all(&self.dir, &lanes, &roots, &logs);
    }
}
