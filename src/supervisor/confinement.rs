//! The supervisor's side of a generation's confinement (`crate::confine`): the policy it
//! sends the shim, and the check of the started harness before the generation counts as
//! live.
//!
//! **Never:** starts a confined lane's generation on a host that cannot confine (refused
//! with the probe's reason); counts a generation live whose harness does not show the
//! confinement in `/proc`; runs a lane unconfined unless the operator listed it in
//! `unconfined_lanes` (then says so at every start, at warn).

use std::path::{Path, PathBuf};

use crate::confine::{self, Confinement, Policy};

use super::config::Config;
use super::SupervisorError;

/// One generation's places, as its confinement needs them.
pub(crate) struct Generation<'a> {
    pub lane: &'a str,
    pub lane_id: &'a str,
    /// Its private area and run directory: the only places it writes.
    pub area: &'a Path,
    pub run: &'a Path,
    /// Its lane socket, when it has one (a coordinated generation).
    pub lane_socket: Option<&'a Path>,
    /// The harness's argv[0].
    pub program: Option<&'a str>,
    /// Whether its runtime has a provider, served by the gateway in its namespace.
    pub gateway: bool,
    /// The lane incarnation's own uid (and gid), which the harness runs as.
    pub uid: Option<u32>,
    /// Its workspace, read-only until activation (a coordinated generation's).
    pub workspace: Option<&'a Path>,
    /// The assignment's own workspace directory, bound over `workspace` (work in a
    /// repository).
    pub workspace_source: Option<&'a Path>,
}

/// Refuses a start of confined lane `lane` on a host that cannot confine: called before
/// anything is reserved for the start.
pub(crate) fn check_host(
    cfg: &Config,
    support: &Result<confine::Support, String>,
    lane: &str,
    lane_id: &str,
) -> Result<(), SupervisorError> {
    match support {
        Err(reason) if cfg.confined(lane) => Err(SupervisorError::ConfinementUnavailable {
            lane: lane_id.to_string(),
            reason: reason.clone(),
        }),
        _ => Ok(()),
    }
}

/// The confinement for generation `g` (its host passed `check_host`).
pub(crate) fn for_generation(
    cfg: &Config,
    g: &Generation<'_>,
) -> Result<Confinement, SupervisorError> {
    let Generation {
        lane,
        lane_id,
        area,
        run,
        lane_socket,
        program,
        gateway,
        uid,
        workspace,
        workspace_source,
    } = *g;
    if !cfg.confined(lane) {
        tracing::warn!(
            lane_id,
            "starting a generation UNCONFINED: the lane is listed in unconfined_lanes"
        );
        return Ok(Confinement::None);
    }
    let Some(uid) = uid else {
        return Err(SupervisorError::ConfinementUnavailable {
            lane: lane_id.to_string(),
            reason: "the lane has no uid of its own".into(),
        });
    };
    let mut read: Vec<PathBuf> = confine::SYSTEM_READ.iter().map(PathBuf::from).collect();
    read.push(cfg.harness_root.clone());
    read.push(cfg.bin_dir.clone());
    if let Some(p) = program.map(Path::new) {
        if let Some(dir) = std::fs::canonicalize(p)
            .ok()
            .and_then(|c| c.parent().map(Path::to_path_buf))
        {
            read.push(dir);
        }
    }
    // A resolver configuration kept elsewhere (systemd-resolved's, below /run) stays
    // readable: name resolution works.
    // The file alone: systemd-resolved's directory also holds its sockets.
    if let Some(file) = std::fs::canonicalize("/etc/resolv.conf")
        .ok()
        .filter(|f| !f.starts_with("/etc"))
    {
        read.push(file);
    }
    // Hidden: the system's service directories, this supervisor's state and runtime, and
    // what the operator adds (other supervisors' on the same machine: `mosaic up` hides
    // its whole state directory). By their real paths: a mount follows links.
    let hidden = confine::SYSTEM_HIDDEN
        .iter()
        .map(PathBuf::from)
        .chain([cfg.state_dir.clone(), cfg.runtime_dir.clone()])
        .chain(cfg.hidden_paths.iter().cloned())
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let policy = Policy {
        read,
        write: vec![area.to_path_buf(), run.to_path_buf()],
        devices: confine::DEVICES.iter().map(PathBuf::from).collect(),
        masked: cfg.masked_paths(),
        hidden,
        private: confine::PRIVATE
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| p.is_dir())
            .collect(),
        sockets: lane_socket
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .into_iter()
            .collect(),
        gateway: gateway.then_some(confine::net::GATEWAY_PORT),
        uid: Some(uid),
        staged: workspace.map(Path::to_path_buf),
        workspace_source: workspace_source.map(Path::to_path_buf),
    };
    policy
        .validate()
        .map_err(|e| SupervisorError::ConfinementUnavailable {
            lane: lane_id.to_string(),
            reason: e.to_string(),
        })?;
    Ok(Confinement::Enforced {
        policy: Box::new(policy),
    })
}

/// The confinement of a fresh workspace's setup commands in lane `lane` (`None`: the lane
/// is unconfined): a generation's, writing only the workspace `ws` (not yet anyone's
/// working directory), with no gateway and no lane socket.
pub(crate) fn for_setup(
    cfg: &Config,
    lane: &str,
    lane_id: &str,
    ws: &Path,
    uid: Option<u32>,
) -> Result<Option<Policy>, SupervisorError> {
    if !cfg.confined(lane) {
        tracing::warn!(
            lane_id,
            "running a workspace's setup UNCONFINED: the lane is listed in unconfined_lanes"
        );
        return Ok(None);
    }
    let g = Generation {
        lane,
        lane_id,
        area: ws,
        run: ws,
        lane_socket: None,
        program: None,
        gateway: false,
        uid,
        workspace: None,
        workspace_source: None,
    };
    Ok(match for_generation(cfg, &g)? {
        Confinement::Enforced { policy } => {
            let mut p = *policy;
            p.write = vec![ws.to_path_buf()];
            // No terminal: it has none (a session of its own, output to a pipe).
            p.devices.retain(|d| d != Path::new("/dev/tty"));
            Some(p)
        }
        Confinement::None => None,
    })
}

/// Checks that the started harness `pid` shows every layer of `c` and runs as `uid` (the
/// lane's, from the generation's record, not from the policy sent): what was seen, or an
/// error when it runs without its confinement (the launch then fails and is ended).
pub(crate) fn verify(c: &Confinement, pid: i32, uid: Option<u32>) -> Result<confine::Seen, String> {
    if matches!(c, Confinement::None) {
        return Ok(confine::Seen::None);
    }
    // Already exited (a zombie's namespaces cannot be read): not observed; its exit
    // report follows on the link.
    if confine::is_dead(pid) {
        return Ok(confine::Seen::Unobserved);
    }
    match confine::observe(pid) {
        Ok(o) if o.is_confined() && uid.is_none_or(|u| o.only_id == Some((u, u))) => {
            Ok(confine::Seen::Verified)
        }
        Ok(o) => Err(format!(
            "harness pid {pid} runs without its confinement: {o:?}"
        )),
        // Exiting (its namespaces already released) or gone: not observed; its exit
        // report follows on the link.
        Err(confine::ConfineError::Exiting { .. }) => Ok(confine::Seen::Unobserved),
        Err(_) if !Path::new(&format!("/proc/{pid}")).exists() => Ok(confine::Seen::Unobserved),
        Err(e) => Err(format!("cannot read harness pid {pid}'s confinement: {e}")),
    }
}
