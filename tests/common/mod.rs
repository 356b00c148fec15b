//! Shared fixture for integration tests: a real supervisor process with its own cgroup
//! root, state dir, runtime dir and tmux servers, all removed on drop (also on panic).
//!
//! Tests need root and cgroup v2. Without them they fail with the reason; they never skip.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mosaic::supervisor::control::{self, ClientError, Request};
use serde_json::Value;

pub const MOSAIC: &str = env!("CARGO_BIN_EXE_mosaic");
pub const SHIM: &str = env!("CARGO_BIN_EXE_mosaic-shim");
pub const MODEL: &str = env!("CARGO_BIN_EXE_mosaic-test-model");
/// Upper bound for waits on events that must happen; a guard against hangs, not a
/// performance assertion.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub fn require_host() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests create cgroups and must run as root (try: sudo -E cargo test)"
    );
    if let Err(e) = mosaic::cgroup::discover_mount() {
        panic!("these tests need a cgroup v2 hierarchy: {e}");
    }
    assert!(
        mosaic::sysdeps::which("tmux").is_some(),
        "these tests need tmux (run scripts/test, which installs it)"
    );
}

/// One `mosaic <what> --config <config>` daemon as a separate process, its stdout and
/// stderr appended to its log: every test world starts, crashes and reaps its daemons
/// through this, so no test carries its own process handling. The test runner's own
/// `FAILPOINTS` never leaks into a daemon; a test names a daemon's failpoints explicitly.
pub struct Daemon {
    pub what: &'static str,
    pub config: PathBuf,
    pub log: PathBuf,
    /// `MOSAIC_LOG` for this daemon.
    pub log_level: &'static str,
    /// Extra environment (`FAILPOINTS`, `NOTIFY_SOCKET`, ...): set, or removed when `None`.
    pub env: Vec<(&'static str, Option<String>)>,
    child: Option<Child>,
}

impl Daemon {
    pub fn new(what: &'static str, config: PathBuf, log: PathBuf) -> Self {
        Self {
            what,
            config,
            log,
            log_level: "info",
            env: vec![],
            child: None,
        }
    }

    /// Sets `key` (or removes it, `None`) in the daemon's environment for every later start.
    pub fn set_env(&mut self, key: &'static str, value: Option<String>) {
        self.env.retain(|(k, _)| *k != key);
        self.env.push((key, value));
    }

    /// Starts the daemon (it must not be running), with `failpoints` for this start only.
    pub fn start(&mut self, failpoints: Option<&str>) {
        assert!(self.child.is_none(), "{} already runs", self.what);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut c = Command::new(MOSAIC);
        c.arg(self.what)
            .arg("--config")
            .arg(&self.config)
            .env("MOSAIC_LOG", self.log_level)
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, v) in &self.env {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(f) = failpoints {
            c.env("FAILPOINTS", f);
        }
        self.child = Some(c.spawn().unwrap());
    }

    /// SIGKILLs the daemon (if it runs) and reaps it: no chance to clean up, as in a crash.
    pub fn crash(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` and reaps the daemon; its exit status.
    pub fn signal_and_wait(&mut self, sig: nix::sys::signal::Signal) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("the daemon runs");
        kill(c.id() as i32, sig);
        c.wait().unwrap()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The exit status, once the daemon ended by itself (it is then no longer running).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let st = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(st)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.crash();
    }
}

pub struct Host {
    pub id: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub cgroup_root: PathBuf,
    pub host_id: String,
    pub daemon: Daemon,
}

pub struct Options {
    pub force_freezer: bool,
    pub lanes: Vec<&'static str>,
    pub reattach_timeout_ms: u64,
    /// Extra environment for the supervisor process (e.g. `FAILPOINTS`).
    pub env: Vec<(&'static str, String)>,
    /// Lanes the operator opted out of confinement.
    pub unconfined_lanes: Vec<&'static str>,
    /// TOML appended to the supervisor config (tables: providers, credentials).
    pub extra_config: String,
    /// Puts the state directory on its own tmpfs of this size (`"2m"`), so a test can fill
    /// it or make it read-only; unmounted at teardown.
    pub state_fs: Option<&'static str>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            force_freezer: false,
            lanes: vec![],
            reattach_timeout_ms: 5000,
            env: vec![],
            unconfined_lanes: vec![],
            extra_config: String::new(),
            state_fs: None,
        }
    }
}

impl Host {
    pub fn new() -> Self {
        Self::with(Options::default())
    }

    pub fn with(o: Options) -> Self {
        require_host();
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
        let dir = PathBuf::from(format!("/tmp/mosaic-t-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(size) = o.state_fs {
            let state = dir.join("state");
            std::fs::create_dir_all(&state).unwrap();
            nix::mount::mount(
                Some("tmpfs"),
                &state,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                Some(format!("size={size},mode=0700").as_str()),
            )
            .expect("mount the state tmpfs");
        }
        let mount = mosaic::cgroup::discover_mount().unwrap();
        let cgroup_root = mount.path.join(format!("mosaic-test-{id}"));
        let host_id = format!("t-{id}");
        let bin_dir = Path::new(MOSAIC).parent().unwrap();
        let lanes: Vec<String> = o.lanes.iter().map(|l| format!("{l:?}")).collect();
        let unconfined: Vec<String> = o
            .unconfined_lanes
            .iter()
            .map(|l| format!("{l:?}"))
            .collect();
        let config = dir.join("supervisor.toml");
        std::fs::write(
            &config,
            format!(
                "host_id = {host_id:?}\nstate_dir = {:?}\nruntime_dir = {:?}\ncgroup_root = {:?}\n\
                 bin_dir = {:?}\nlanes = [{}]\nforce_freezer_fallback = {}\nreattach_timeout_ms = {}\nunconfined_lanes = [{}]\n{}",
                dir.join("state"),
                dir.join("run"),
                cgroup_root,
                bin_dir,
                lanes.join(", "),
                o.force_freezer,
                o.reattach_timeout_ms,
                unconfined.join(", "),
                o.extra_config,
            ),
        )
        .unwrap();
        let mut daemon = Daemon::new("supervisor", config.clone(), dir.join("supervisor.log"));
        daemon.log_level = "debug";
        for (k, v) in o.env {
            daemon.set_env(k, Some(v));
        }
        let mut h = Self {
            id,
            dir,
            config,
            cgroup_root,
            host_id,
            daemon,
        };
        h.start_supervisor();
        h
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("run/control.sock")
    }
    pub fn lane_id(&self, lane: &str) -> String {
        format!("{}:{lane}", self.host_id)
    }

    pub fn start_supervisor(&mut self) {
        self.daemon.start(None);
        let start = Instant::now();
        loop {
            if self.try_call(&Request::Status).is_ok() {
                return;
            }
            if let Some(st) = self.daemon.exited() {
                panic!("supervisor exited early ({st}); log:\n{}", self.log());
            }
            assert!(
                start.elapsed() < PATIENCE,
                "supervisor did not come up; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs the supervisor process: no chance to clean up, as in a crash.
    pub fn crash_supervisor(&mut self) {
        self.daemon.crash();
    }

    pub fn supervisor_pid(&self) -> Option<u32> {
        self.daemon.pid()
    }

    pub fn log(&self) -> String {
        self.daemon.log_text()
    }

    pub fn try_call(&self, r: &Request) -> Result<Value, ClientError> {
        control::call(&self.socket(), r)
    }

    pub fn call(&self, r: &Request) -> Value {
        match self.try_call(r) {
            Ok(v) => v,
            Err(e) => panic!("{r:?} failed: {e}\nsupervisor log:\n{}", self.log()),
        }
    }

    /// The error kind of a request that must be refused.
    pub fn refused(&self, r: &Request) -> (String, String) {
        match self.try_call(r) {
            Err(ClientError::Refused { kind, message }) => (kind, message),
            other => panic!("{r:?} was expected to be refused, got {other:?}"),
        }
    }

    pub fn create_lane(&self, lane: &str) -> Value {
        self.call(&Request::LaneCreate { lane: lane.into() })
    }

    pub fn start(&self, lane: &str, directives: &str) -> Value {
        self.call(&Request::Start {
            lane: lane.into(),
            runtime: "fake@1.0.0".into(),
            directives: directives.split_whitespace().map(String::from).collect(),
        })
    }

    pub fn status(&self) -> Value {
        self.call(&Request::Status)
    }

    pub fn lane_status(&self, lane: &str) -> Value {
        let st = self.status();
        st["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lane"] == lane)
            .cloned()
            .unwrap_or_else(|| panic!("lane {lane} not in status {st}"))
    }

    pub fn receipts(&self, lane: Option<&str>, all: bool) -> Vec<Value> {
        self.call(&Request::Receipts {
            lane: lane.map(String::from),
            include_acked: all,
        })
        .as_array()
        .unwrap()
        .clone()
    }

    /// Waits for the receipt of (lane, generation) and returns it.
    pub fn wait_receipt(&self, lane: &str, generation: u64) -> Value {
        let lane_id = self.lane_id(lane);
        wait_until(&format!("receipt for {lane} gen {generation}"), || {
            self.receipts(Some(lane), true)
                .into_iter()
                .find(|r| r["lane_id"] == lane_id.as_str() && r["generation"] == generation)
        })
    }

    pub fn audit(&self) -> String {
        std::fs::read_to_string(self.state_dir().join("audit.jsonl")).unwrap_or_default()
    }

    pub fn lane_tmux_socket(&self, lane: &str) -> PathBuf {
        self.dir.join("run/lanes").join(lane).join("tmux.sock")
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.crash_supervisor();
        let state = self.state_dir();
        if is_mount_point(&state) {
            // After the lanes' servers and cgroups are gone nothing holds it.
            teardown(
                &self.dir.join("nothing"),
                &self.dir.join("run/lanes"),
                &self.cgroup_root,
                &[],
            );
            let _ = nix::mount::umount2(&state, nix::mount::MntFlags::MNT_DETACH);
        }
        teardown(
            &self.dir,
            &self.dir.join("run/lanes"),
            &self.cgroup_root,
            &["supervisor.log"],
        );
    }
}

/// Whether `p` is the root of a mount (its device differs from its parent's).
pub fn is_mount_point(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(p), p.parent().map(std::fs::metadata)) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

/// Removes everything a test host made: each lane's tmux server (sockets under `lanes_dir`),
/// every process in `cgroup_root` (then the cgroups themselves) and the state dir `dir`
/// (keys, sockets). A failing test keeps only the named `logs`, moved beside the state dir.
pub fn teardown(dir: &Path, lanes_dir: &Path, cgroup_root: &Path, logs: &[&str]) {
    teardown_all(dir, &[lanes_dir], &[cgroup_root], logs)
}

/// `teardown` for several supervisors: their lanes' tmux servers and their cgroup roots.
pub fn teardown_all(dir: &Path, lanes_dirs: &[&Path], cgroup_roots: &[&Path], logs: &[&str]) {
    for lanes_dir in lanes_dirs {
        if let Ok(rd) = std::fs::read_dir(lanes_dir) {
            for e in rd.flatten() {
                let _ = Command::new("tmux")
                    .arg("-S")
                    .arg(e.path().join("tmux.sock"))
                    .arg("kill-server")
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    for cgroup_root in cgroup_roots {
        if cgroup_root.exists() {
            let _ = std::fs::write(cgroup_root.join("cgroup.kill"), "1");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline
                && !std::fs::read_to_string(cgroup_root.join("cgroup.events"))
                    .unwrap_or_default()
                    .contains("populated 0")
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            remove_tree(cgroup_root);
        }
    }
    if std::thread::panicking() {
        for name in logs {
            let kept = dir.with_extension(name);
            if std::fs::rename(dir.join(name), &kept).is_ok() {
                eprintln!("test log kept: {}", kept.display());
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn remove_tree(p: &Path) {
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(p);
}

/// Whether process `pid`'s command line (arguments joined by spaces) holds `needle`.
pub fn cmdline_contains(pid: i32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            String::from_utf8_lossy(&c)
                .replace('\0', " ")
                .contains(needle)
        })
        .unwrap_or(false)
}

pub fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A file a generation appends to in its private area, opened once it exists and read
/// through that descriptor from then on: the supervisor removes the area as soon as the
/// generation has ended, and what was written before that stays readable here.
pub struct Kept(std::fs::File);

impl Kept {
    pub fn open(what: &str, path: &Path) -> Kept {
        Kept(wait_until(what, || std::fs::File::open(path).ok()))
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = &self.0;
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        s
    }
}

/// Members of a cgroup directory (absolute path), with their start times.
pub fn members(cg: &Path) -> Vec<(i32, u64)> {
    std::fs::read_to_string(cg.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .filter_map(|p| start_time(p).map(|s| (p, s)))
        .collect()
}

pub fn start_time(pid: i32) -> Option<u64> {
    procfs::process::Process::new(pid)
        .and_then(|p| p.stat())
        .map(|s| s.starttime)
        .ok()
}

/// True when (pid, start time) no longer names a live, non-zombie process: it is gone, or
/// the PID now belongs to someone else.
pub fn is_dead(pid: i32, st: u64) -> bool {
    match procfs::process::Process::new(pid).and_then(|p| p.stat()) {
        Ok(s) => s.starttime != st || s.state == 'Z' || s.state == 'X',
        Err(_) => true,
    }
}

pub fn cgroup_abs(host: &Host, rel: &str) -> PathBuf {
    let _ = host;
    cgroup_at(rel)
}

/// The cgroup directory of a `cgroup_path` as identities carry it (relative to the mount).
pub fn cgroup_at(rel: &str) -> PathBuf {
    let mount = mosaic::cgroup::discover_mount().unwrap().path;
    mount.join(rel.trim_start_matches('/'))
}

/// Ends `child` as a service manager would: SIGTERM, up to `grace` to exit on its own,
/// then SIGKILL; reaped either way.
pub fn terminate(child: &mut Child, grace: Duration) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub fn kill(pid: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
}

/// A TCP port for a daemon a test starts, free right now. Taken at random below the
/// kernel's ephemeral range (32768+), where outgoing connections never land: a port found
/// with `bind(:0)` and released can be reused by any outgoing connection before the
/// daemon binds it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 600) as u16 * 20;
    for _ in 0..2000 {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = 20000 + (base - 20000 + n) % 12000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between 20000 and 32000")
}

/// The deterministic model endpoint, as a separate process.
pub struct Model {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Model {
    pub fn start() -> Self {
        let log = std::env::temp_dir().join(format!(
            "mosaic-model-{}.jsonl",
            uuid::Uuid::new_v4().simple()
        ));
        let mut child = Command::new(MODEL)
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the test model said {line:?}"));
        Self { child, port, log }
    }

    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Requests of the harness's main conversation (those offering tools), as text.
    pub fn conversation(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| r["body"]["tools"].as_array().is_some_and(|t| !t.is_empty()))
            .map(|r| r["body"].to_string())
            .collect()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() && std::env::var_os("MOSAIC_KEEP_MODEL_LOG").is_none() {
            let _ = std::fs::remove_file(&self.log);
        } else {
            eprintln!("test model log kept: {}", self.log.display());
        }
    }
}

/// Reads `mosaic up`'s output up to and including the first line containing `marker`.
pub fn read_until(out: &mut impl std::io::BufRead, marker: &str) -> String {
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

/// The harness process of a generation whose recorded `harness_pid` is `pid`: confined,
/// that is its PID namespace's init (`mosaic-init`), and the harness is the init's one
/// child; unconfined, `pid` itself.
pub fn harness_process(pid: i32) -> i32 {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim() != mosaic::confine::pidns::INIT_NAME {
        return pid;
    }
    wait_until("the init's child", || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}
