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

use crate::coordinator::service::operator::AssignRequest;
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
    /// Supervisors to run, each a host of its own (its own principal, certificate, keys,
    /// cgroup subtree and state). One runs in this process; more run as child processes.
    pub hosts: u32,
    pub demo: bool,
    /// Use this PostgreSQL instead of a private cluster in the state dir.
    pub database_url: Option<String>,
    /// Where real harnesses are installed (default: $MOSAIC_HARNESS_ROOT, else
    /// /var/lib/mosaic/harnesses).
    pub harness_root: Option<PathBuf>,
    /// `runtime=FILE` credentials files for the supervisors.
    pub credentials: Vec<(String, PathBuf)>,
    /// A runtime registry directory instead of the entries built into the binary.
    pub registry_dir: Option<PathBuf>,
    /// `runtime=DIR` config overlays for the supervisors.
    pub harness_config: Vec<(String, PathBuf)>,
    /// `runtime=URL` model provider base URLs (the gateway's upstreams).
    pub providers: Vec<(String, String)>,
    /// The coordinator's notification sinks (`notify_command`, `notify_webhook`).
    pub notify_command: Option<PathBuf>,
    pub notify_webhook: Option<String>,
    /// Lanes (by name) whose generations run outside the confinement.
    pub unconfined_lanes: Vec<String>,
}

/// The harness root `up` and `mosaic harness` use when none is given.
pub fn default_harness_root() -> PathBuf {
    std::env::var_os("MOSAIC_HARNESS_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(crate::supervisor::config::DEFAULT_HARNESS_ROOT))
}

/// Applies `--harness-root` and `--credentials` to a supervisor config file.
fn harness_settings(opts: &UpOptions, f: &mut ConfigFile) -> Result<(), UpError> {
    let root = opts
        .harness_root
        .clone()
        .unwrap_or_else(default_harness_root);
    f.harness_root =
        Some(std::path::absolute(&root).map_err(|e| UpError::Usage(format!("harness root: {e}")))?);
    for (rt, p) in &opts.credentials {
        let p = std::path::absolute(p).map_err(|e| UpError::Usage(format!("credentials: {e}")))?;
        f.credentials.insert(rt.clone(), p);
    }
    for (rt, p) in &opts.harness_config {
        let p =
            std::path::absolute(p).map_err(|e| UpError::Usage(format!("harness config: {e}")))?;
        f.harness_config.insert(rt.clone(), p);
    }
    for (rt, url) in &opts.providers {
        f.providers.insert(rt.clone(), url.clone());
    }
    for lane in &opts.unconfined_lanes {
        if !f.unconfined_lanes.contains(lane) {
            f.unconfined_lanes.push(lane.clone());
        }
    }
    if let Some(d) = &opts.registry_dir {
        f.registry_dir =
            Some(std::path::absolute(d).map_err(|e| UpError::Usage(format!("registry dir: {e}")))?);
    }
    Ok(())
}

pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MOSAIC_STATE_DIR") {
        return PathBuf::from(d);
    }
    // As root the PostgreSQL cluster runs as `postgres`, which cannot enter /root.
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/mosaic");
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("mosaic");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/state/mosaic")
}

/// The coordinator's operator socket under a `mosaic up` state dir.
pub fn coordinator_socket(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("run").join("coordinator.sock")
}

/// As root, the cgroup subtree `up` gives a supervisor of `state_dir` (one per state dir,
/// `suffix` telling a fleet's members apart); otherwise none (the supervisor's own cgroup,
/// which must then be delegated).
pub fn up_cgroup_root(
    state_dir: &std::path::Path,
    suffix: &str,
) -> Result<Option<PathBuf>, UpError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let mount = crate::cgroup::discover_mount().map_err(SupervisorError::from)?;
    let tag = &crate::util::sha256_hex(
        "mosaic/up-root/v1",
        &[state_dir.as_os_str().as_encoded_bytes()],
    )[..12];
    Ok(Some(mount.path.join(format!("mosaic-up-{tag}{suffix}"))))
}

/// The supervisor configuration `up` uses for a state dir (also used by `mosaic host
/// --state-dir` to find the control socket).
pub fn config_for(state_dir: &std::path::Path, lanes: u32) -> Result<Config, UpError> {
    Ok(Config::from_file(config_file_for(state_dir, lanes)?)?)
}

fn config_file_for(state_dir: &std::path::Path, lanes: u32) -> Result<ConfigFile, UpError> {
    let state_dir =
        std::path::absolute(state_dir).map_err(|e| UpError::Usage(format!("state dir: {e}")))?;
    let cgroup_root = up_cgroup_root(&state_dir, "")?;
    Ok(ConfigFile {
        cgroup_root,
        lanes: (1..=lanes).map(|i| format!("lane-{i}")).collect(),
        // The coordinator's socket, the private cluster's, everything `up` keeps.
        hidden_paths: vec![state_dir.clone()],
        ..ConfigFile::new(state_dir.join("supervisor"), state_dir.join("run"))
    })
}

pub async fn run(opts: UpOptions) -> Result<(), UpError> {
    if opts.lanes == 0 || opts.lanes > 64 {
        return Err(UpError::Usage("--lanes must be between 1 and 64".into()));
    }
    if opts.hosts == 0 || opts.hosts > 16 {
        return Err(UpError::Usage("--hosts must be between 1 and 16".into()));
    }
    // The coordinator's sessions and the supervisors' gateways, in this process and its
    // children.
    crate::util::raise_open_file_limit();
    crate::coordinator::service::notifier::Sinks::configured(
        opts.notify_command.as_deref(),
        opts.notify_webhook.as_deref(),
    )
    .map_err(|e| UpError::Usage(e.replace("notify_", "--notify-")))?;
    if opts.demo && opts.hosts > 1 {
        return Err(UpError::Usage(
            "--demo runs with one host (--hosts 1)".into(),
        ));
    }
    crate::sysdeps::ensure(&[
        crate::sysdeps::Dep::Tmux,
        crate::sysdeps::Dep::Git,
        crate::sysdeps::Dep::PostgresServer,
    ])?;
    let state_dir = opts.state_dir.clone().unwrap_or_else(default_state_dir);
    let state_dir =
        std::path::absolute(&state_dir).map_err(|e| UpError::Usage(format!("state dir: {e}")))?;
    // 0711: the postgres user must traverse it to reach its cluster; everything secret
    // inside (keys, PKI keys, supervisor state) is 0700/0600 on its own.
    crate::util::durable::ensure_dir(&state_dir, 0o711)
        .map_err(|e| UpError::Usage(e.to_string()))?;
    let mut file = config_file_for(&state_dir, opts.lanes)?;
    harness_settings(&opts, &mut file)?;
    let mut cfg = Config::from_file(file)?;
    // Everything `mosaic doctor` checks, before a cluster or a coordinator is started.
    let report = crate::doctor::run(cfg.cgroup_root.as_deref());
    if !report.can_run_supervisor {
        say!("{}", crate::doctor::render_human(&report));
        return Err(UpError::Usage(
            "this host cannot run the supervisor (see the failed checks above); nothing was started"
                .into(),
        ));
    }

    // PostgreSQL: a private cluster in the state dir unless a URL was given.
    let cluster = match &opts.database_url {
        Some(_) => None,
        None => {
            let c = crate::pgcluster::Cluster::at(&state_dir.join("pg"))
                .map_err(|e| UpError::Usage(e.to_string()))?;
            c.init().map_err(|e| {
                UpError::Usage(format!(
                    "{e}; the postgres user must be able to traverse every parent of {} (choose another --state-dir, or pass --database-url)",
                    state_dir.display()
                ))
            })?;
            let _ = c.stop(); // a cluster left running by an earlier, killed `up`
            c.start(crate::pgcluster::Durability::Durable)
                .map_err(|e| UpError::Usage(e.to_string()))?;
            let _ = c.psql("postgres", "CREATE DATABASE mosaic");
            Some(c)
        }
    };
    let database_url = match (&opts.database_url, &cluster) {
        (Some(u), _) => u.clone(),
        (None, Some(c)) => c.url("mosaic"),
        (None, None) => return Err(UpError::Usage("no database".into())),
    };
    let outcome = run_with(&opts, &state_dir, &mut cfg, &database_url, cluster.as_ref()).await;
    if let Some(c) = cluster {
        if let Err(e) = c.stop() {
            esay!("mosaic up: stopping PostgreSQL: {e}");
        }
    }
    outcome
}

async fn run_with(
    opts: &UpOptions,
    state_dir: &std::path::Path,
    cfg: &mut Config,
    database_url: &str,
    cluster: Option<&crate::pgcluster::Cluster>,
) -> Result<(), UpError> {
    let usage = |e: &dyn std::fmt::Display| UpError::Usage(e.to_string());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| usage(&e))?;
    let addr = listener.local_addr().map_err(|e| usage(&e))?.to_string();
    let host_ids: Vec<String> = if opts.hosts == 1 {
        vec![cfg.host.as_str().to_string()]
    } else {
        (1..=opts.hosts)
            .map(|k| format!("{}-{k}", cfg.host.as_str()))
            .collect()
    };
    let mut prov = provision(state_dir, &host_ids, database_url, &addr)?;
    prov.coordinator.notify_command = opts.notify_command.clone();
    prov.coordinator.notify_webhook = opts.notify_webhook.clone();
    let svc = crate::coordinator::service::Service::start(&prov.coordinator)
        .await
        .map_err(|e| usage(&e))?;
    let leading = svc.wait_leading().await;
    // The private cluster is `up`'s to keep running: watched until `run_with` returns.
    let _watchdog = cluster.map(|c| {
        Watchdog(tokio::spawn(watch_cluster(
            c.clone(),
            svc.metrics.database_restarts.clone(),
        )))
    });
    let (stop_hosts, hosts_rx) = tokio::sync::watch::channel(false);
    let hosts_rx_metrics = hosts_rx.clone();
    let tls = crate::protocol::transport::TlsIdentity {
        ca: prov.coordinator.ca.clone(),
        cert: prov.coordinator.cert.clone(),
        key: prov.coordinator.key.clone(),
    };
    let hosts = svc.spawn_hosts(listener, tls, hosts_rx);
    let ops_listener =
        crate::coordinator::service::bind_operators(&prov.coordinator.operator_socket)
            .map_err(|e| usage(&e))?;
    let ops = tokio::spawn(crate::coordinator::service::serve_operators(
        svc.clone(),
        ops_listener,
    ));
    // Metrics on localhost, at ports written beside the sockets (run/*.addr).
    let coord_metrics = svc
        .serve_metrics("127.0.0.1:0", hosts_rx_metrics)
        .await
        .map_err(|e| usage(&e))?;
    crate::util::durable::write_atomic(
        &state_dir.join("run").join("metrics-coordinator.addr"),
        coord_metrics.as_bytes(),
    )
    .map_err(|e| usage(&e))?;
    if opts.hosts > 1 {
        let outcome = fleet(
            opts,
            state_dir,
            &prov,
            &host_ids,
            &svc,
            leading.epoch(),
            &coord_metrics,
        )
        .await;
        let _ = stop_hosts.send(true);
        svc.shut_down().await;
        hosts.closed().await;
        ops.abort();
        let _ = std::fs::remove_file(&prov.coordinator.operator_socket);
        return outcome;
    }

    cfg.coordinator = Some(prov.links[0].clone());
    let lanes = cfg.lanes.clone();
    let origin = crate::cgroup::cgroup_of(None).map_err(SupervisorError::from)?;
    let sup = Supervisor::open(cfg.clone())?;
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
    sup.connect_coordinator(&prov.links[0]).await?;
    let sup_metrics = sup.serve_metrics("127.0.0.1:0").await?;
    let status = sup.status().await?;
    // The coordinator registers the lanes from the host's hello.
    for _ in 0..200 {
        if svc.store.lanes().await.map(|l| l.len()).unwrap_or(0) >= status.lanes.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let sd = state_dir.display();
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "mosaic".into());
    say!(
        "Mosaic is up on host {}: coordinator (epoch {}) + supervisor, {} lane(s), PostgreSQL {}",
        status.host_id,
        leading.epoch(),
        status.lanes.len(),
        if opts.database_url.is_some() {
            "from --database-url"
        } else {
            "in the state dir"
        }
    );
    say!("  state dir    {sd}");
    say!(
        "  sessions     each generation's harness session is kept encrypted to {} (mosaic checkpoint artifacts)",
        recovery_identity(state_dir).display()
    );
    say!("  metrics      coordinator http://{coord_metrics}/metrics  supervisor http://{sup_metrics}/metrics");
    say!(
        "  cgroup root  {} (kill method: {:?})",
        status.cgroup_root.display(),
        status.kill_method
    );
    for l in &status.lanes {
        say!("  lane {:<22} attach: {}", l.lane_id, l.attach);
    }
    say!("Assign work (a fresh generation, contract, challenge ACK, activation):");
    say!("  {exe} assign --state-dir {sd} --lane {}:lane-1 --runtime fake@1.0.0 --task 'print=hello spawn=3' --wait running", status.host_id);
    say!("  {exe} status --state-dir {sd}  |  lanes  |  receipts  |  stop --assignment ID");
    say!("Ctrl-C stops everything this command started.");

    let outcome = async {
        if opts.demo {
            demo(&sup, &svc, status.host_id.as_str()).await?;
            say!("[demo] done; lane-1 keeps a RUNNING generation for you to attach to. Ctrl-C to stop.");
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
    let _ = stop_hosts.send(true);
    svc.shut_down().await;
    hosts.closed().await;
    ops.abort();
    let _ = std::fs::remove_file(&prov.coordinator.operator_socket);
    outcome
}

/// One child supervisor of a fleet.
struct Member {
    host_id: String,
    config: PathBuf,
    log: PathBuf,
    cfg: Config,
    child: Option<tokio::process::Child>,
}

impl Member {
    fn spawn(&mut self) -> Result<(), UpError> {
        let exe =
            std::env::current_exe().map_err(|e| UpError::Usage(format!("own executable: {e}")))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| UpError::Usage(format!("{}: {e}", self.log.display())))?;
        let child = tokio::process::Command::new(exe)
            .arg("supervisor")
            .arg("--config")
            .arg(&self.config)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                UpError::Usage(format!("starting the supervisor of {}: {e}", self.host_id))
            })?;
        self.child = Some(child);
        Ok(())
    }
}

/// The supervisor configuration of fleet member `k` (`host_id`) under `state_dir`.
fn member_config(
    state_dir: &std::path::Path,
    k: u32,
    host_id: &str,
    lanes: u32,
    link: &crate::supervisor::config::CoordinatorLink,
) -> Result<ConfigFile, UpError> {
    let cgroup_root = up_cgroup_root(state_dir, &format!("-h{k}"))?;
    Ok(ConfigFile {
        host_id: Some(host_id.to_string()),
        cgroup_root,
        lanes: (1..=lanes).map(|i| format!("lane-{i}")).collect(),
        coordinator: Some(link.clone()),
        metrics_listen: Some("127.0.0.1:0".into()),
        // Every host's state and sockets, the coordinator's, the private cluster's.
        hidden_paths: vec![state_dir.to_path_buf()],
        // The runtime dir is short: tmux and lane socket paths must fit a sockaddr_un.
        ..ConfigFile::new(
            state_dir.join("hosts").join(host_id),
            state_dir.join("run").join(format!("h{k}")),
        )
    })
}

/// `mosaic up --hosts N`: N supervisors as child processes, each a host of its own, against
/// this process's coordinator. A supervisor that dies is started again after a second (as
/// systemd would); on Ctrl-C or SIGTERM every lane is destroyed and every child stopped.
async fn fleet(
    opts: &UpOptions,
    state_dir: &std::path::Path,
    prov: &Provisioned,
    host_ids: &[String],
    svc: &std::sync::Arc<crate::coordinator::service::Service>,
    epoch: i64,
    coord_metrics: &str,
) -> Result<(), UpError> {
    let usage = |e: &dyn std::fmt::Display| UpError::Usage(e.to_string());
    let mut members = Vec::new();
    for (i, (h, link)) in host_ids.iter().zip(&prov.links).enumerate() {
        let k = i as u32 + 1;
        let mut file = member_config(state_dir, k, h, opts.lanes, link)?;
        harness_settings(opts, &mut file)?;
        let dir = state_dir.join("hosts").join(h);
        crate::util::durable::ensure_dir(&dir, 0o700).map_err(|e| usage(&e))?;
        let config = dir.join("supervisor.toml");
        let text = toml::to_string(&file).map_err(|e| usage(&e))?;
        crate::util::durable::write_atomic(&config, text.as_bytes()).map_err(|e| usage(&e))?;
        members.push(Member {
            host_id: h.clone(),
            config,
            log: dir.join("supervisor.log"),
            cfg: Config::from_file(file)?,
            child: None,
        });
    }
    // From the first spawn on, every way out goes through the teardown below: returned
    // early (a spawn that failed), the supervisors already running went on with their
    // lanes, orphaned.
    let mut outcome = Ok(());
    for m in &mut members {
        if let Err(e) = m.spawn() {
            outcome = Err(e);
            break;
        }
    }
    if outcome.is_ok() {
        outcome = async {
            let want = host_ids.len() * opts.lanes as usize;
            for _ in 0..400 {
                if svc.store.lanes().await.map(|l| l.len()).unwrap_or(0) >= want {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            let sd = state_dir.display();
            say!(
                "Mosaic is up: coordinator (epoch {epoch}) + {} supervisors as separate processes, {} lane(s) each",
                members.len(),
                opts.lanes
            );
            say!("  state dir    {sd}");
            say!("  metrics      coordinator http://{coord_metrics}/metrics; each supervisor's address in run/h<k>/metrics.addr");
            for m in &members {
                say!(
                    "  host {:<20} config {}  log {}",
                    m.host_id,
                    m.config.display(),
                    m.log.display()
                );
            }
            say!("  {} assign --state-dir {sd} --lane {}:lane-1 --runtime fake@1.0.0 --task hang --wait running", std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "mosaic".into()), host_ids[0]);
            say!("Ctrl-C stops everything this command started.");
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|e| UpError::Usage(format!("cannot watch SIGTERM: {e}")))?;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = term.recv() => break,
                    _ = tokio::signal::ctrl_c() => break,
                    _ = tick.tick() => {
                        for m in &mut members {
                            let exited = match m.child.as_mut().map(|c| c.try_wait()) {
                                Some(Ok(Some(status))) => Some(status.to_string()),
                                Some(Err(e)) => Some(e.to_string()),
                                _ => None,
                            };
                            if let Some(status) = exited {
                                esay!("mosaic up: the supervisor of {} exited ({status}); starting it again", m.host_id);
                                m.spawn()?;
                            }
                        }
                    }
                }
            }
            Ok::<(), UpError>(())
        }
        .await;
    }
    say!("mosaic up: stopping everything it started");
    for m in &mut members {
        let sock = m.cfg.control_socket();
        if let Ok(st) =
            crate::supervisor::control::call(&sock, &crate::supervisor::control::Request::Status)
        {
            for lane in st["lanes"].as_array().cloned().unwrap_or_default() {
                if let Some(name) = lane["lane"].as_str() {
                    let _ = crate::supervisor::control::call(
                        &sock,
                        &crate::supervisor::control::Request::LaneDestroy {
                            lane: name.to_string(),
                        },
                    );
                }
            }
        }
        if let Some(c) = m.child.as_mut() {
            if let Some(pid) = c.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let _ = tokio::time::timeout(Duration::from_secs(10), c.wait()).await;
            let _ = c.kill().await;
        }
        if let Some(root) = &m.cfg.cgroup_root {
            let mount = crate::cgroup::discover_mount().map_err(SupervisorError::from)?;
            if let Ok(tree) = crate::cgroup::CgroupTree::open(&mount, Some(root), "", false) {
                if let Err(e) = tree.destroy_all(Duration::from_secs(5)) {
                    esay!("mosaic up: removing {}: {e}", root.display());
                }
            }
        }
        let _ = std::fs::remove_file(&sock);
    }
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

async fn demo(
    sup: &Supervisor,
    svc: &std::sync::Arc<crate::coordinator::service::Service>,
    host: &str,
) -> Result<(), UpError> {
    let lane_id = format!("{host}:lane-1");
    let task = "print=hello-from-mosaic spawn=4";
    say!("\n[demo] assign {lane_id}: {task}");
    let a = svc
        .assign(AssignRequest::new(&lane_id, "fake@1.0.0", task, true))
        .await
        .map_err(|e| UpError::Demo(e.to_string()))?;
    let pi = &a["process_identity"];
    let digest = pi["launch_nonce_digest"].as_str().unwrap_or("");
    say!(
        "[demo] {} is RUNNING in generation {}: root pid {}, cgroup {}, nonce digest {}…",
        a["assignment_id"].as_str().unwrap_or(""),
        a["generation"],
        pi["root_pid"],
        pi["cgroup_path"].as_str().unwrap_or(""),
        &digest[..16.min(digest.len())]
    );
    let st = sup.status().await?;
    let hp = st
        .lanes
        .iter()
        .find(|l| l.lane == "lane-1")
        .and_then(|l| l.generation.as_ref())
        .and_then(|g| g.process_identity.as_ref())
        .and_then(|i| i.harness_pid)
        .ok_or_else(|| UpError::Demo("no harness pid".into()))?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    say!("[demo] SIGKILL the harness (pid {hp})");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(hp),
        nix::sys::signal::Signal::SIGKILL,
    )
    .map_err(|e| UpError::Demo(format!("kill: {e}")))?;
    let mut reconciled = None;
    for _ in 0..400 {
        let rs = svc
            .store
            .termination_receipts(Some(&lane_id))
            .await
            .map_err(|e| UpError::Demo(e.to_string()))?;
        if let Some(r) = rs
            .into_iter()
            .find(|r| r["generation"] == a["generation"] && !r["reconciliation"].is_null())
        {
            reconciled = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let r = reconciled.ok_or_else(|| UpError::Demo("no reconciled receipt".into()))?;
    say!(
        "[demo] receipt: reason {}, source {}, cleanup verified empty {} → coordinator reconciliation: {}",
        r["termination_reason"], r["observation_source"], r["cleanup"]["verified_empty"], r["reconciliation"]
    );
    let st = svc
        .store
        .assignment_statuses()
        .await
        .map_err(|e| UpError::Demo(e.to_string()))?;
    if let Some(s) = st
        .iter()
        .find(|s| Some(s.assignment_id.as_str()) == a["assignment_id"].as_str())
    {
        say!(
            "[demo] assignment {} is {} (execution owner {:?}), lane {} — never a false COMPLETED",
            s.assignment_id,
            s.state,
            s.execution_owner,
            s.lane_state.map_or("released", |l| l.as_str())
        );
    }
    let b = svc
        .assign(AssignRequest {
            resume: a["assignment_id"].as_str().map(String::from),
            // The demo resumes it with a task that shows it is the resumed one.
            replace_task: true,
            ..AssignRequest::new(&lane_id, "fake@1.0.0", "print=resumed spawn=2", true)
        })
        .await
        .map_err(|e| UpError::Demo(e.to_string()))?;
    say!(
        "[demo] recovery: {} resumed, RUNNING in a fresh generation {} (root pid {})",
        b["assignment_id"].as_str().unwrap_or(""),
        b["generation"],
        b["process_identity"]["root_pid"]
    );
    Ok(())
}

mod provision;

pub use provision::*;

/// Stops watching the private cluster when dropped (before `up` stops the cluster itself).
struct Watchdog(tokio::task::JoinHandle<()>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Restarts the private cluster whenever its postmaster is gone: checked every second,
/// restarted at once, then with a doubling wait (up to 30 s) while restarts fail. Each
/// death and each restart is logged and counted (`mosaic_database_restarts_total`); the
/// coordinator and the supervisors reconnect on their own, as after any database restart.
async fn watch_cluster(
    c: crate::pgcluster::Cluster,
    restarts: prometheus_client::metrics::counter::Counter,
) {
    let mut backoff = std::time::Duration::from_secs(1);
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let probe = c.clone();
        if tokio::task::spawn_blocking(move || probe.running())
            .await
            .unwrap_or(true)
        {
            backoff = std::time::Duration::from_secs(1);
            continue;
        }
        tracing::error!("the private PostgreSQL's postmaster is gone; restarting it");
        let again = c.clone();
        match tokio::task::spawn_blocking(move || {
            again.start(crate::pgcluster::Durability::Durable)
        })
        .await
        {
            Ok(Ok(())) => {
                restarts.inc();
                tracing::warn!(
                    restarts = restarts.get(),
                    "the private PostgreSQL is running again"
                );
                backoff = std::time::Duration::from_secs(1);
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, retry_in_s = backoff.as_secs(), "restarting the private PostgreSQL failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
            }
            Err(e) => tracing::error!(error = %e, "the restart task failed"),
        }
    }
}
