//! What the real-harness conformance suite and benchmark share: the deterministic model
//! endpoint as a process, `mosaic up` with a runtime's credentials and config overlay, and
//! each family's test wiring (credentials, overlay, process name).

#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{common, pg};

pub fn registry_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("registry")
}

pub fn harness_root() -> PathBuf {
    match std::env::var_os("MOSAIC_HARNESS_ROOT") {
        Some(r) => PathBuf::from(r),
        None => panic!(
            "MOSAIC_HARNESS_ROOT is not set: run the suite with scripts/test, which installs the \
             pinned harnesses from npm into its cache (mosaic harness install) and sets it"
        ),
    }
}

/// `f`'s first value within `patience`, polled; `None` if none came.
pub fn wait_until_or<T>(patience: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() >= patience {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn wait_for<T>(what: &str, patience: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < patience, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Up {
    /// `wait_for`, but a timeout shows the lane's screen: what the harness was doing.
    pub fn wait_for<T>(&self, what: &str, f: impl FnMut() -> Option<T>) -> T {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(what, common::PATIENCE, f)
        }));
        match r {
            Ok(v) => v,
            Err(_) => panic!(
                "timed out waiting for {what}; the lane's screen:\n{}",
                self.screen()
            ),
        }
    }
}

/// A temporary directory removed on drop, also when the test fails (it holds credentials).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        let d = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub use super::common::Model;

/// `mosaic up` with one lane, the installed harnesses, and a credentials file.
pub struct Up {
    pub child: Child,
    pub dir: PathBuf,
    pub db: pg::TestDb,
    /// `mosaic up`'s arguments, for a restart.
    args: Vec<std::ffi::OsString>,
}

/// Starts `mosaic up` with `args`, its log appended beside `dir`, and waits until it serves.
fn spawn_up(args: &[std::ffi::OsString], dir: &Path, failpoints: Option<&str>) -> Child {
    let mut cmd = Command::new(common::MOSAIC);
    cmd.args(args)
        // MOSAIC_HARNESS_LOG=debug keeps the launch phases (benches/harnesses.rs).
        .env(
            "MOSAIC_LOG",
            std::env::var("MOSAIC_HARNESS_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(Stdio::piped())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.with_extension("log"))
                .unwrap(),
        );
    match failpoints {
        Some(f) => cmd.env("FAILPOINTS", f),
        None => cmd.env_remove("FAILPOINTS"),
    };
    let mut child = cmd.spawn().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    common::read_until(&mut out, "Ctrl-C stops everything");
    std::thread::spawn(move || for _ in out.lines() {});
    child
}

impl Up {
    /// `mosaic up` for family `f` against `model`: its credentials file (a fresh token) and
    /// config overlay in a private directory, removed with the returned guard. Bound as
    /// `let (_creds, up, token) = …`, the `Up` stops before the directory goes.
    pub fn for_family(
        f: &Family,
        model: &Model,
        registry: Option<&Path>,
    ) -> (TempDir, Self, String) {
        Self::for_family_lanes(f, model, registry, 1, &[])
    }

    /// [`Up::for_family`] with `lanes` lanes and more `mosaic up` arguments (`extra`, e.g.
    /// `--unconfined-lane …`).
    pub fn for_family_lanes(
        f: &Family,
        model: &Model,
        registry: Option<&Path>,
        lanes: u32,
        extra: &[&str],
    ) -> (TempDir, Self, String) {
        let name = f.family_name();
        let token = format!("mosaic-test-token-{}", uuid::Uuid::new_v4().simple());
        let creds_dir = TempDir::new("mosaic-creds");
        let creds = creds_dir.0.join(format!("{name}.env"));
        std::fs::write(&creds, (f.credentials)(&token)).unwrap();
        std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let files = (f.overlay)();
        let overlay = (!files.is_empty()).then(|| {
            let d = creds_dir.0.join("overlay");
            std::fs::create_dir_all(&d).unwrap();
            for (n, text) in &files {
                std::fs::write(d.join(n), text).unwrap();
            }
            d
        });
        let up = Up::start_lanes(
            name,
            &creds,
            overlay.as_deref(),
            registry,
            &format!("http://127.0.0.1:{}", model.port),
            lanes,
            extra,
        );
        (creds_dir, up, token)
    }

    pub fn start(
        runtime: &str,
        credentials: &Path,
        overlay: Option<&Path>,
        registry: Option<&Path>,
        provider: &str,
    ) -> Self {
        Self::start_lanes(runtime, credentials, overlay, registry, provider, 1, &[])
    }

    pub fn start_lanes(
        runtime: &str,
        credentials: &Path,
        overlay: Option<&Path>,
        registry: Option<&Path>,
        provider: &str,
        lanes: u32,
        extra: &[&str],
    ) -> Self {
        common::require_host();
        let db = pg::TestDb::new();
        let dir = std::env::temp_dir().join(format!("mosaic-hc-{}", uuid::Uuid::new_v4().simple()));
        // The coordinator's notification command: appends each event to `notified.jsonl`
        // beside the state directory (`Up::notified`).
        let notify = dir.with_extension("notify.sh");
        std::fs::write(
            &notify,
            format!(
                "#!/bin/sh\ncat >> {0}\necho >> {0}\n",
                dir.with_extension("notified.jsonl").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&notify, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut args: Vec<std::ffi::OsString> = vec![
            "up".into(),
            "--lanes".into(),
            lanes.to_string().into(),
            "--state-dir".into(),
            dir.clone().into(),
            "--database-url".into(),
            db.url.clone().into(),
            "--harness-root".into(),
            harness_root().into(),
            "--credentials".into(),
            format!("{runtime}={}", credentials.display()).into(),
            "--provider".into(),
            format!("{runtime}={provider}").into(),
            "--notify-command".into(),
            notify.into(),
        ];
        if let Some(r) = registry {
            args.extend(["--registry-dir".into(), r.into()]);
        }
        if let Some(o) = overlay {
            args.extend([
                "--harness-config".into(),
                format!("{runtime}={}", o.display()).into(),
            ]);
        }
        args.extend(extra.iter().map(std::ffi::OsString::from));
        let child = spawn_up(&args, &dir, None);
        Self {
            child,
            dir,
            db,
            args,
        }
    }

    /// Ends `mosaic up` with SIGKILL — a crash: nothing is torn down, the lanes' tmux
    /// servers and generations live on — unless it already died (a failpoint's own
    /// SIGKILL), and starts it again on the same state dir and database, with `failpoints`
    /// (`FAILPOINTS`) for the new process. The new one re-adopts every live generation.
    pub fn restart(&mut self, failpoints: Option<&str>) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_up(&self.args, &self.dir, failpoints);
    }

    /// Waits for `mosaic up` to end by itself (a failpoint's SIGKILL).
    pub fn wait_exited(&mut self, what: &str) {
        let child = &mut self.child;
        wait_for(what, common::PATIENCE, || child.try_wait().ok().flatten());
    }

    /// One text value from the authority's database.
    pub fn sql(&self, query: &str, arg: &str) -> Option<String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (c, conn) = tokio_postgres::connect(&self.db.url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            c.query_opt(query, &[&arg])
                .await
                .unwrap()
                .and_then(|r| r.get::<_, Option<String>>(0))
        })
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

    /// The events the coordinator's notification command was given, in order.
    pub fn notified(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.with_extension("notified.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn lane(&self) -> String {
        self.lane_n(1)
    }

    /// The id of lane `n` (from 1).
    pub fn lane_n(&self, n: u32) -> String {
        let host = nix::unistd::gethostname().unwrap();
        format!("{}:lane-{n}", host.to_string_lossy())
    }

    pub fn assign(&self, runtime: &str, task: &str, wait: bool) -> Result<Value, String> {
        let lane = self.lane();
        let mut args = vec![
            "assign",
            "--lane",
            &lane,
            "--runtime",
            runtime,
            "--task",
            task,
        ];
        if wait {
            args.extend(["--wait", "running"]);
        }
        self.cli(&args)
    }

    pub fn host_status(&self) -> Value {
        let out = Command::new(common::MOSAIC)
            .args(["host", "--state-dir"])
            .arg(&self.dir)
            .args(["status", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn generation(&self) -> Value {
        self.host_status()["lanes"][0]["generation"].clone()
    }

    pub fn settled(&self) -> u64 {
        self.generation()["harness"]["settled"]
            .as_u64()
            .unwrap_or(0)
    }

    pub fn cgroup(&self) -> PathBuf {
        let rel = self.generation()["process_identity"]["cgroup_path"]
            .as_str()
            .unwrap()
            .to_string();
        mosaic::cgroup::discover_mount()
            .unwrap()
            .path
            .join(rel.trim_start_matches('/'))
    }

    pub fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(self.dir.join("run/lanes/lane-1/tmux.sock"));
        c
    }

    pub fn screen(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-p", "-J", "-t", "=lane-1:"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types a turn into the harness's TUI, as an operator attached to the lane would.
    /// A TUI that is not reading (still drawing after a turn, or starting) drops keys: a line
    /// not shown within a few seconds is cleared and typed again, as `tmux::submit_line`
    /// does for the supervisor's own lines.
    pub fn type_turn(&self, text: &str) {
        let marker: String = text.chars().take(40).collect();
        wait_for("the typed turn on screen", common::PATIENCE, || {
            assert!(self
                .tmux()
                .args(["send-keys", "-t", "=lane-1:", "-l", "--", text])
                .status()
                .unwrap()
                .success());
            let shown = wait_until_or(Duration::from_secs(3), || {
                self.screen().contains(&marker).then_some(())
            });
            if shown.is_none() {
                let _ = self
                    .tmux()
                    .args(["send-keys", "-t", "=lane-1:", "C-u"])
                    .status();
            }
            shown
        });
        assert!(self
            .tmux()
            .args(["send-keys", "-t", "=lane-1:", "Enter"])
            .status()
            .unwrap()
            .success());
    }

    pub fn key(&self, key: &str) {
        assert!(self
            .tmux()
            .args(["send-keys", "-t", "=lane-1:", key])
            .status()
            .unwrap()
            .success());
    }

    pub fn receipt(&self, generation: &Value) -> Value {
        let lane = self.lane();
        wait_for("the reconciled receipt", common::PATIENCE, || {
            let rs = self.cli(&["receipts", "--lane", &lane]).ok()?;
            rs.as_array()?
                .iter()
                .find(|r| &r["generation"] == generation && !r["reconciliation"].is_null())
                .cloned()
        })
    }

    pub fn stop(&self, id: &str) -> Value {
        let g = self.generation()["generation"].clone();
        self.cli(&["stop", "--assignment", id]).unwrap();
        self.receipt(&g)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the lane's screen:\n{}", self.screen());
        }
        common::terminate(&mut self.child, Duration::from_secs(30));
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("notify.sh"));
        let _ = std::fs::remove_file(self.dir.with_extension("notified.jsonl"));
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(self.dir.with_extension("log"));
        } else {
            eprintln!(
                "mosaic up log kept: {}",
                self.dir.with_extension("log").display()
            );
        }
    }
}

pub fn outcome(r: &Value) -> Value {
    json!({
        "termination_reason": r["termination_reason"],
        "observation_source": r["observation_source"],
        "verified_empty": r["cleanup"]["verified_empty"],
        "cgroup_removed": r["cleanup"]["cgroup_removed"],
        "reconciliation": r["reconciliation"],
    })
}

pub fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Processes in `cg` whose command line contains `needle`.
pub fn members_running(cg: &Path, needle: &str) -> Vec<(i32, u64)> {
    common::members(cg)
        .into_iter()
        .filter(|(p, _)| common::cmdline_contains(*p, needle))
        .collect()
}

pub fn survivors(before: &[(i32, u64)]) -> usize {
    before
        .iter()
        .filter(|(p, st)| !common::is_dead(*p, *st))
        .count()
}

/// What differs between families: the runtime, its credentials file, its config overlay.
pub struct Family {
    pub runtime: &'static str,
    /// `KEY=VALUE` lines pointing the harness at the test model with `token`.
    /// The credentials file's text for a key (its provider is the gateway's upstream).
    pub credentials: fn(&str) -> String,
    /// The harness's own process name.
    pub comm: &'static str,
    /// The operator's config overlay files pointing the harness at its provider
    /// (`{mosaic-provider}`: the gateway, in a confined lane).
    pub overlay: fn() -> Vec<(&'static str, String)>,
    /// Keys an operator presses to interrupt a turn whose tool child was SIGKILLed, for a
    /// harness that otherwise waits on it forever (OpenCode 1.18.33); empty if it settles
    /// by itself.
    pub interrupt_after_tool_kill: &'static [&'static str],
}

pub const CLAUDE: Family = Family {
    runtime: "claude-code@2.1.332",
    // Its base URL is the adapter's to set (ANTHROPIC_BASE_URL: the gateway).
    credentials: |token| format!("ANTHROPIC_AUTH_TOKEN={token}\n"),
    comm: "claude",
    overlay: Vec::new,
    interrupt_after_tool_kill: &[],
};

pub const PI: Family = Family {
    runtime: "pi@1.6.0",
    credentials: |token| format!("PI_TEST_API_KEY={token}\n"),
    comm: "pi",
    interrupt_after_tool_kill: &[],
    overlay: || {
        vec![
            (
                "models.json",
                json!({"providers": {"mosaic-test": {
                    "baseUrl": "{mosaic-provider}/v1",
                    "api": "openai-completions",
                    "apiKey": "$PI_TEST_API_KEY",
                    "models": [{"id": "mosaic-test-model", "contextWindow": 200000,
                        "maxTokens": 8000}]}}})
                .to_string(),
            ),
            (
                "settings.json",
                // Pi compacts only what lies beyond its most recent keepRecentTokens (20 000
                // by default, more than a test conversation holds): keep little, so the
                // parity check's compaction has something to summarize.
                json!({"defaultProvider": "mosaic-test", "defaultModel": "mosaic-test-model",
                    "quietStartup": true, "compaction": {"keepRecentTokens": 10}})
                .to_string(),
            ),
        ]
    },
};

impl Family {
    pub fn family_name(&self) -> &'static str {
        self.runtime.split_once('@').map(|(n, _)| n).unwrap_or("")
    }
}

/// The fake harness as a family, for benchmarks that run it beside the real ones.
pub const FAKE: Family = Family {
    runtime: "fake@1.0.0",
    credentials: |_| "FAKE_UNUSED=1\n".into(),
    comm: "mosaic-fake-har",
    overlay: Vec::new,
    interrupt_after_tool_kill: &[],
};

/// The work `id` as `mosaic status` shows it.
pub fn work(up: &Up, id: &str) -> Value {
    up.cli(&["status"]).unwrap()["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["assignment_id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no assignment {id} in the status"))
}

/// Waits until continuation `cn` has its result recorded; panics if it expired or was
/// abandoned instead.
pub fn wait_result(up: &Up, cn: &str) {
    up.wait_for("the continuation's result recorded", || {
        let state = up.sql(
            "SELECT state FROM continuations WHERE continuation_id = $1",
            cn,
        )?;
        assert!(
            !matches!(state.as_str(), "EXPIRED" | "ABANDONED"),
            "continuation {cn} ended {state}"
        );
        (state == "RESULT_RECORDED").then_some(())
    });
}

pub const OPENCODE: Family = Family {
    runtime: "opencode@1.18.33",
    credentials: |token| format!("OC_TEST_API_KEY={token}\n"),
    comm: "opencode",
    interrupt_after_tool_kill: &["Escape", "Escape"],
    overlay: || {
        vec![(
            "opencode.json",
            json!({"$schema": "https://opencode.ai/config.json",
                "provider": {"mosaic-test": {"npm": "@ai-sdk/openai-compatible",
                    "name": "Mosaic test",
                    "options": {"baseURL": "{mosaic-provider}/v1",
                        "apiKey": "{env:OC_TEST_API_KEY}"},
                    "models": {"mosaic-test-model": {"name": "Mosaic test model",
                        "limit": {"context": 200000, "output": 8000}}}}},
                "model": "mosaic-test/mosaic-test-model"})
            .to_string(),
        )]
    },
};

pub const CODEX: Family = Family {
    runtime: "codex@0.171.0",
    credentials: |token| format!("CX_TEST_API_KEY={token}\n"),
    comm: "codex",
    interrupt_after_tool_kill: &[],
    overlay: || {
        vec![(
            "config.toml",
            "model = \"mosaic-test-model\"\nmodel_provider = \"mosaic-test\"\n\
             model_context_window = 200000\nmodel_auto_compact_token_limit = 150000\n\n\
             [model_providers.mosaic-test]\nname = \"Mosaic test\"\n\
             base_url = \"{mosaic-provider}/v1\"\nwire_api = \"responses\"\n\
             env_key = \"CX_TEST_API_KEY\"\nrequires_openai_auth = false\n\
             supports_websockets = false\n"
                .to_string(),
        )]
    },
};
