//! `mosaic up`: the whole host side on one machine, for a first run and for demos.
//!
//! Today it runs the supervisor with N fake-harness lanes; it stops and removes
//! everything it started (generations, lanes, tmux servers, cgroups) on SIGTERM or Ctrl-C.
//! The coordinator joins it once the authority core exists.

use std::path::PathBuf;
use std::time::Duration;

use crate::supervisor::config::{Config, ConfigFile};

/// Prints to stdout, ignoring errors: a closed terminal or pipe must never abort `up`
/// halfway through tearing down what it started (`println!` panics on EPIPE).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

macro_rules! esay {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

use crate::supervisor::{Supervisor, SupervisorError};

#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error(transparent)]
    Sysdeps(#[from] crate::sysdeps::SysdepsError),
    #[error("{0}")]
    Usage(String),
    #[error("demo step failed: {0}")]
    Demo(String),
}

#[derive(Debug, Clone)]
pub struct UpOptions {
    pub state_dir: Option<PathBuf>,
    pub lanes: u32,
    pub demo: bool,
}

pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MOSAIC_STATE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("mosaic");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/state/mosaic")
}

/// The supervisor configuration `up` uses for a state dir (also used by `mosaic host
/// --state-dir` to find the control socket).
pub fn config_for(state_dir: &std::path::Path, lanes: u32) -> Result<Config, UpError> {
    let state_dir =
        std::path::absolute(state_dir).map_err(|e| UpError::Usage(format!("state dir: {e}")))?;
    let cgroup_root = if nix::unistd::geteuid().is_root() {
        let mount = crate::cgroup::discover_mount().map_err(SupervisorError::from)?;
        let tag = &crate::util::sha256_hex(
            "mosaic/up-root/v1",
            &[state_dir.as_os_str().as_encoded_bytes()],
        )[..12];
        Some(mount.path.join(format!("mosaic-up-{tag}")))
    } else {
        None
    };
    Ok(Config::from_file(ConfigFile {
        host_id: None,
        state_dir: state_dir.join("supervisor"),
        runtime_dir: state_dir.join("run"),
        cgroup_root,
        registry_dir: None,
        bin_dir: None,
        tmux: None,
        lanes: (1..=lanes).map(|i| format!("lane-{i}")).collect(),
        force_freezer_fallback: false,
        reattach_timeout_ms: None,
    })?)
}

pub async fn run(opts: UpOptions) -> Result<(), UpError> {
    if opts.lanes == 0 || opts.lanes > 64 {
        return Err(UpError::Usage("--lanes must be between 1 and 64".into()));
    }
    crate::sysdeps::ensure(&[
        crate::sysdeps::Dep::Tmux,
        crate::sysdeps::Dep::PostgresServer,
    ])?;
    let state_dir = opts.state_dir.clone().unwrap_or_else(default_state_dir);
    let cfg = config_for(&state_dir, opts.lanes)?;
    let lanes = cfg.lanes.clone();
    let origin = crate::cgroup::cgroup_of(None).map_err(SupervisorError::from)?;
    let sup = Supervisor::open(cfg)?;
    let me = sup.cgroup_tree().supervisor();
    me.create().map_err(SupervisorError::from)?;
    me.join_self().map_err(SupervisorError::from)?;
    sup.recover().await?;
    for lane in &lanes {
        match sup.lane_create(lane.as_str()).await {
            Ok(_) | Err(SupervisorError::LaneExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let listener = crate::supervisor::control::bind(&sup.config().control_socket())?;
    let status = sup.status().await?;
    let sd = state_dir.display();
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "mosaic".into());
    say!(
        "Mosaic is up: a supervisor with {} lane(s) on host {}",
        status.lanes.len(),
        status.host_id
    );
    say!("  state dir    {sd}");
    say!(
        "  cgroup root  {} (kill method: {:?})",
        status.cgroup_root.display(),
        status.kill_method
    );
    for l in &status.lanes {
        say!("  lane {:<22} attach: {}", l.lane_id, l.attach);
    }
    say!("Run work in a fresh generation:");
    say!("  {exe} host --state-dir {sd} start --lane lane-1 --runtime fake@1.0.0 print=hello spawn=3");
    say!("  {exe} host --state-dir {sd} status | receipts | stop --lane lane-1");
    say!("Ctrl-C stops everything this command started.");

    let outcome = async {
        if opts.demo {
            demo(&sup).await?;
            say!("[demo] done; lane-1 keeps a fresh generation for you to attach to. Ctrl-C to stop.");
        }
        let serve = crate::supervisor::control::serve(sup.clone(), listener);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| UpError::Usage(format!("cannot watch SIGTERM: {e}")))?;
        tokio::select! {
            r = serve => r.map_err(UpError::from),
            _ = term.recv() => Ok(()),
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    }
    .await;
    say!("mosaic up: stopping everything it started");
    teardown(&sup, &origin).await;
    outcome
}

async fn teardown(sup: &Supervisor, origin: &str) {
    if let Ok(st) = sup.status().await {
        for l in st.lanes {
            if let Err(e) = sup.lane_destroy(&l.lane).await {
                esay!("mosaic up: destroying {}: {e}", l.lane_id);
            }
        }
    }
    let tree = sup.cgroup_tree().clone();
    sup.shutdown();
    let _ = std::fs::remove_file(sup.config().control_socket());
    // Step out of our own cgroup (back where we started), then remove the whole root.
    let back = tree.mount().join(origin.trim_start_matches('/'));
    let res =
        crate::cgroup::join_path(&back).and_then(|()| tree.destroy_all(Duration::from_secs(5)));
    if let Err(e) = res {
        esay!("mosaic up: removing {}: {e}", tree.root().display());
    }
}

async fn demo(sup: &Supervisor) -> Result<(), UpError> {
    let lane = "lane-1";
    let d = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    say!("\n[demo] starting a fresh generation on {lane}: print=hello-from-mosaic spawn=4");
    let g1 = sup
        .start(lane, "fake@1.0.0", &d("print=hello-from-mosaic spawn=4"))
        .await?;
    let id = g1
        .process_identity
        .clone()
        .ok_or_else(|| UpError::Demo("no identity".into()))?;
    say!(
        "[demo] generation {} live: shim pid {} (start time {}), harness pid {:?}, cgroup {}, nonce digest {}…",
        g1.generation, id.root_pid, id.root_start_time, id.harness_pid, id.cgroup_path, &id.launch_nonce_digest.0[..16]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hp = id
        .harness_pid
        .ok_or_else(|| UpError::Demo("no harness pid".into()))?;
    say!("[demo] SIGKILL the harness (pid {hp})");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(hp),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(|e| UpError::Demo(format!("kill: {e}")))?;
    let key = crate::supervisor::receipt::idempotency_key(
        &id.lane_id,
        &id.lane_incarnation_id,
        id.generation,
    );
    let r = wait_receipt(sup, &key).await?;
    say!(
        "[demo] receipt {}: reason {:?}, source {:?}, signal {:?}, cleanup verified empty: {}, members killed: {}",
        r.idempotency_key, r.termination_reason, r.observation_source, r.signal, r.cleanup.verified_empty, r.cleanup.members_killed
    );
    say!("[demo] recovery: the lane takes a fresh generation");
    let g2 = sup
        .start(lane, "fake@1.0.0", &d("print=second-task"))
        .await?;
    let id2 = g2
        .process_identity
        .clone()
        .ok_or_else(|| UpError::Demo("no identity".into()))?;
    say!(
        "[demo] generation {} live: shim pid {}, cgroup {}, nonce digest {}… (all new)",
        g2.generation,
        id2.root_pid,
        id2.cgroup_path,
        &id2.launch_nonce_digest.0[..16]
    );
    let r2 = sup.stop(lane).await?;
    say!(
        "[demo] stopped: reason {:?}, cleanup verified empty: {}",
        r2.termination_reason,
        r2.cleanup.verified_empty
    );
    let g3 = sup
        .start(lane, "fake@1.0.0", &d("print=attach-to-me spawn=2"))
        .await?;
    say!("[demo] generation {} is running on {lane}", g3.generation);
    Ok(())
}

async fn wait_receipt(
    sup: &Supervisor,
    key: &str,
) -> Result<crate::supervisor::receipt::TerminationReceipt, UpError> {
    for _ in 0..500 {
        if let Some(r) = sup
            .receipts(None, true)?
            .into_iter()
            .find(|r| r.idempotency_key == key)
        {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(UpError::Demo("no receipt appeared".into()))
}
