//! Supervisor configuration (`mosaic supervisor --config FILE`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::names::{HostId, LaneName};
use super::SupervisorError;

/// The TOML file as written by an operator. Unknown keys are refused so a typo cannot
/// silently fall back to a default.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// This host's id in lane ids (`host:lane`). Default: the system hostname.
    pub host_id: Option<String>,
    /// Durable state: lane and generation records, the receipt outbox, the audit log.
    pub state_dir: PathBuf,
    /// Sockets and nonce files. Should be on tmpfs (for example /run/mosaic).
    pub runtime_dir: PathBuf,
    /// The delegated cgroup root to use when running as root outside systemd. Without it
    /// the supervisor uses its own cgroup, which must be delegated (systemd Delegate=yes).
    pub cgroup_root: Option<PathBuf>,
    /// Registry directory; default: the entries compiled into the binary.
    pub registry_dir: Option<PathBuf>,
    /// Directory holding `mosaic` and `mosaic-fake-harness`; default: beside this binary.
    pub bin_dir: Option<PathBuf>,
    /// tmux binary; default: `tmux` on PATH.
    pub tmux: Option<PathBuf>,
    /// Lanes to create at start if they do not exist.
    #[serde(default)]
    pub lanes: Vec<String>,
    /// Use the freeze + SIGKILL fallback even where `cgroup.kill` exists (tests the
    /// path older kernels take).
    #[serde(default)]
    pub force_freezer_fallback: bool,
    /// How long a restarted supervisor waits for a live generation's shim to re-present
    /// its identity before treating the generation as unverifiable. Default 5000.
    pub reattach_timeout_ms: Option<u64>,
    /// The coordinator to take assignments from and deliver receipts to.
    pub coordinator: Option<CoordinatorLink>,
    /// Serve Prometheus metrics at `http://<this>/metrics` (e.g. `127.0.0.1:9464`; port 0
    /// picks one, written to `<runtime_dir>/metrics.addr`). Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// Where real harnesses are installed (`<root>/<runtime>@<version>/`, as
    /// `mosaic harness install` lays them out). Default: /var/lib/mosaic/harnesses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness_root: Option<PathBuf>,
    /// Per-runtime credentials files (`claude-code = "/etc/mosaic/claude-code.env"`): mode
    /// 0600, `KEY=VALUE` lines passed into that runtime's generations and nowhere else.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub credentials: std::collections::BTreeMap<String, PathBuf>,
    /// Per-runtime config overlays (`pi = "/etc/mosaic/pi"`): a directory of config files
    /// (provider, model selection; no secrets) copied into each generation's harness config
    /// home before Mosaic's own files.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub harness_config: std::collections::BTreeMap<String, PathBuf>,
    /// Lanes whose generations run unconfined (`crate::confine`): an explicit opt-out for
    /// hosts that cannot confine, logged at every start and shown in `lanes`. Every other
    /// lane is confined, and where the kernel cannot confine, its starts are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unconfined_lanes: Vec<String>,
    /// Directories hidden from every generation besides the system's service directories
    /// and this supervisor's own state and runtime: where other supervisors or a
    /// coordinator on this machine keep their sockets and state, if not below /run or /var.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden_paths: Vec<PathBuf>,
    /// Per-runtime model provider base URLs (`claude-code = "https://api.anthropic.com"`).
    /// A confined generation reaches its provider only through the gateway
    /// (`supervisor::gateway`), which sends its requests here with the real credentials;
    /// the harness is pointed at the gateway (`{mosaic-provider}` in config overlays).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub providers: std::collections::BTreeMap<String, String>,
    /// The uids lane incarnations run their confined generations as (`{ first, count }`;
    /// each incarnation gets its own, never reused; the gid is the same number). Default
    /// 1900000000 and the million after it: no account of the host may lie in the range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane_uids: Option<super::state::UidRange>,
    /// The host's record of lane uids handed out, shared by every supervisor of the
    /// machine so no two give one uid to two lanes. Default
    /// /var/lib/mosaic/lane-uids.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane_uid_ledger: Option<PathBuf>,
    /// Repositories a confined generation may push to through `mosaic lane push`
    /// (`supervisor::push`), by name: `[repositories.app] url = "…"`, optionally
    /// `env = "/etc/mosaic/app-git.env"` (variables for `git push` alone). The generation
    /// never sees either.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub repositories: std::collections::BTreeMap<String, super::push::Repository>,
}

impl ConfigFile {
    /// A config with every optional key at its default: the base the programs that write
    /// configs (`mosaic up`, `mosaic enroll host`) start from.
    pub fn new(state_dir: PathBuf, runtime_dir: PathBuf) -> Self {
        Self {
            host_id: None,
            state_dir,
            runtime_dir,
            cgroup_root: None,
            registry_dir: None,
            bin_dir: None,
            tmux: None,
            lanes: vec![],
            force_freezer_fallback: false,
            reattach_timeout_ms: None,
            coordinator: None,
            metrics_listen: None,
            harness_root: None,
            credentials: Default::default(),
            harness_config: Default::default(),
            unconfined_lanes: vec![],
            hidden_paths: vec![],
            providers: Default::default(),
            lane_uids: None,
            lane_uid_ledger: None,
            repositories: Default::default(),
        }
    }
}

/// Where `mosaic harness install` puts harnesses unless told otherwise.
pub const DEFAULT_HARNESS_ROOT: &str = "/var/lib/mosaic/harnesses";

/// How to reach and authenticate to the coordinator.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorLink {
    /// `host:port` of its mutual-TLS listener.
    pub address: String,
    /// Other coordinators of the same database (standbys), tried in turn when the session
    /// to the one before fails: only the leader accepts a host session.
    #[serde(default)]
    pub fallback_addresses: Vec<String>,
    /// DNS name its certificate carries (e.g. `localhost`).
    pub server_name: String,
    /// Its principal, `coordinator:<name>`.
    pub principal: String,
    pub trust_domain: String,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub trust_registry: PathBuf,
    /// Ed25519 seeds (64 hex digits) of this host's session and ordinary keys; key ids are
    /// `host:<host_id>/session` and `host:<host_id>/ordinary`.
    pub session_key: PathBuf,
    pub ordinary_key: PathBuf,
    /// The seed of this host's recovery key (`host:<host_id>/recovery`, spec §7.4): the only
    /// key that signs `recovery_ack`. Without one the host answers no recovery challenge (it
    /// is never a retarget candidate).
    #[serde(default)]
    pub recovery_key: Option<PathBuf>,
    /// Send a heartbeat every this many ms (default 5000); a coordinator silent for three
    /// intervals is given up and reconnected to.
    #[serde(default)]
    pub heartbeat_ms: Option<u64>,
    /// The largest offset of this host's clock from the coordinator's database time a
    /// session is opened with (default 300000: five minutes).
    #[serde(default)]
    pub max_clock_skew_ms: Option<u64>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: HostId,
    pub state_dir: PathBuf,
    pub runtime_dir: PathBuf,
    pub cgroup_root: Option<PathBuf>,
    pub registry_dir: Option<PathBuf>,
    pub bin_dir: PathBuf,
    pub tmux: PathBuf,
    pub lanes: Vec<LaneName>,
    pub force_freezer_fallback: bool,
    pub reattach_timeout_ms: u64,
    pub coordinator: Option<CoordinatorLink>,
    pub metrics_listen: Option<String>,
    pub harness_root: PathBuf,
    pub credentials: std::collections::BTreeMap<String, PathBuf>,
    pub harness_config: std::collections::BTreeMap<String, PathBuf>,
    pub unconfined_lanes: Vec<LaneName>,
    pub hidden_paths: Vec<PathBuf>,
    pub providers: std::collections::BTreeMap<String, super::gateway::Upstream>,
    pub lane_uids: super::state::UidRange,
    pub lane_uid_ledger: PathBuf,
    pub repositories: std::collections::BTreeMap<String, super::push::Repository>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, SupervisorError> {
        let text = std::fs::read_to_string(path).map_err(|e| SupervisorError::Config {
            detail: format!("cannot read {}: {e}", path.display()),
        })?;
        let file: ConfigFile = toml::from_str(&text).map_err(|e| SupervisorError::Config {
            detail: format!("{}: {e}", path.display()),
        })?;
        Self::from_file(file)
    }

    pub fn from_file(f: ConfigFile) -> Result<Self, SupervisorError> {
        let host = match f.host_id {
            Some(h) => HostId::parse(&h)?,
            None => {
                let h = nix::unistd::gethostname().map_err(|e| SupervisorError::Config {
                    detail: format!("no host_id configured and gethostname failed: {e}"),
                })?;
                HostId::parse(&h.to_string_lossy())?
            }
        };
        let lanes = f
            .lanes
            .iter()
            .map(|l| LaneName::parse(l))
            .collect::<Result<Vec<_>, _>>()?;
        let bin_dir = match f.bin_dir {
            Some(b) => b,
            None => default_bin_dir()?,
        };
        if let Some(p) = f.hidden_paths.iter().find(|p| !p.is_absolute()) {
            return Err(SupervisorError::Config {
                detail: format!("hidden_paths must be absolute, got {}", p.display()),
            });
        }
        for (rt, p) in f.credentials.iter().chain(&f.harness_config) {
            if !p.is_absolute() {
                return Err(SupervisorError::Config {
                    detail: format!(
                        "credentials and config overlays ({rt}) must be absolute paths"
                    ),
                });
            }
        }
        let lane_uids = f.lane_uids.unwrap_or(super::state::UidRange::DEFAULT);
        lane_uids
            .check()
            .map_err(|detail| SupervisorError::Config { detail })?;
        let providers = f
            .providers
            .iter()
            .map(|(rt, url)| {
                super::gateway::Upstream::parse(url)
                    .map(|u| (rt.clone(), u))
                    .map_err(|e| SupervisorError::Config {
                        detail: format!("providers.{rt}: {e}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        for (name, r) in &f.repositories {
            if !crate::protocol::effects::repo_ok(name) {
                return Err(SupervisorError::Config {
                    detail: format!("repositories.{name}: a name is letters, digits, . _ -"),
                });
            }
            // A URL carrying a password would reach logs and errors: credentials go in
            // the env file.
            let userinfo = r
                .url
                .split_once("://")
                .and_then(|(_, rest)| rest.split('/').next())
                .and_then(|auth| auth.rsplit_once('@'))
                .map(|(u, _)| u.to_string());
            if userinfo.is_some_and(|u| u.contains(':')) || r.url.trim().is_empty() {
                return Err(SupervisorError::Config {
                    detail: format!(
                        "repositories.{name}: the url must name the remote without a password (put credentials in its env file)"
                    ),
                });
            }
            if r.env.as_ref().is_some_and(|p| !p.is_absolute()) {
                return Err(SupervisorError::Config {
                    detail: format!("repositories.{name}: env must be an absolute path"),
                });
            }
        }
        if !bin_dir.is_absolute() {
            return Err(SupervisorError::Config {
                detail: format!(
                    "bin_dir must be an absolute path, got {}",
                    bin_dir.display()
                ),
            });
        }
        for (name, p) in [("state_dir", &f.state_dir), ("runtime_dir", &f.runtime_dir)] {
            if !p.is_absolute() {
                return Err(SupervisorError::Config {
                    detail: format!("{name} must be an absolute path, got {}", p.display()),
                });
            }
        }
        Ok(Self {
            host,
            state_dir: f.state_dir,
            runtime_dir: f.runtime_dir,
            cgroup_root: f.cgroup_root,
            registry_dir: f.registry_dir,
            bin_dir,
            tmux: f.tmux.unwrap_or_else(|| PathBuf::from("tmux")),
            lanes,
            force_freezer_fallback: f.force_freezer_fallback,
            reattach_timeout_ms: f.reattach_timeout_ms.unwrap_or(5000),
            coordinator: f.coordinator,
            metrics_listen: f.metrics_listen,
            harness_root: f
                .harness_root
                .unwrap_or_else(|| PathBuf::from(DEFAULT_HARNESS_ROOT)),
            credentials: f.credentials,
            harness_config: f.harness_config,
            unconfined_lanes: f
                .unconfined_lanes
                .iter()
                .map(|l| LaneName::parse(l))
                .collect::<Result<_, _>>()?,
            hidden_paths: f.hidden_paths,
            providers,
            lane_uids,
            lane_uid_ledger: f
                .lane_uid_ledger
                .unwrap_or_else(|| PathBuf::from("/var/lib/mosaic/lane-uids.json")),
            repositories: f.repositories,
        })
    }

    pub fn mosaic_exe(&self) -> PathBuf {
        self.bin_dir.join("mosaic")
    }

    /// The first process of every generation (`src/bin/mosaic-shim.rs`).
    pub fn shim_exe(&self) -> PathBuf {
        self.bin_dir.join("mosaic-shim")
    }

    /// Whether lane `lane`'s generations run confined (all but the opted-out ones).
    pub fn confined(&self, lane: &str) -> bool {
        !self.unconfined_lanes.iter().any(|l| l.as_str() == lane)
    }

    /// The paths no generation may read: the supervisor's state and runtime directories
    /// (every lane's records, private areas, sockets), every credentials file and config
    /// overlay, and the coordinator link's keys and certificates. A generation's own areas
    /// are granted on top (they lie below the state and runtime directories).
    pub fn masked_paths(&self) -> Vec<PathBuf> {
        let mut m = vec![self.state_dir.clone(), self.runtime_dir.clone()];
        m.extend(self.credentials.values().cloned());
        m.extend(self.harness_config.values().cloned());
        if let Some(c) = &self.coordinator {
            m.extend([
                c.ca.clone(),
                c.cert.clone(),
                c.key.clone(),
                c.trust_registry.clone(),
                c.session_key.clone(),
                c.ordinary_key.clone(),
            ]);
            m.extend(c.recovery_key.clone());
        }
        // Rules follow links to their targets: the masks must name the targets too.
        let canonical: Vec<PathBuf> = m
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect();
        m.extend(canonical);
        m.sort();
        m.dedup();
        m
    }

    pub fn control_socket(&self) -> PathBuf {
        self.runtime_dir.join("control.sock")
    }
}

fn default_bin_dir() -> Result<PathBuf, SupervisorError> {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .ok_or_else(|| SupervisorError::Config {
            detail: "cannot locate this executable's directory; set bin_dir".into(),
        })
}
