//! The supervisor's errors, each with a stable category for the control API and audit.

use std::path::PathBuf;

use super::*;

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("configuration: {detail}")]
    Config { detail: String },
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Durable(#[from] DurableError),
    #[error("state: {detail}")]
    State { detail: String },
    #[error("tmux: {detail}")]
    Tmux { detail: String },
    #[error("no lane {0:?} on this host")]
    NoSuchLane(String),
    #[error("lane {lane:?} already exists (incarnation {incarnation})")]
    LaneExists { lane: String, incarnation: String },
    #[error("lane {lane:?} is quarantined: {reason}; destroy and recreate it to get a fresh incarnation")]
    Quarantined { lane: String, reason: String },
    #[error("lane {lane}: the termination receipt of generation {generation} is not durable yet (the state filesystem refused it); it is written again until it is — free space on the state filesystem, then destroy or recreate the lane")]
    ReceiptNotDurable { lane: String, generation: u64 },
    #[error("lane {0:?} has no live generation")]
    NoLiveGeneration(String),
    #[error("generation {generation} of lane {lane:?} failed to launch: {detail}")]
    Launch {
        lane: String,
        generation: u64,
        detail: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("lane {lane:?} cannot start a confined generation on this host: {reason} (run `mosaic doctor`; an operator may list the lane in unconfined_lanes)")]
    ConfinementUnavailable { lane: String, reason: String },
    #[error("lane {lane:?}: a confined {runtime} generation reaches its model only through the provider gateway, and the supervisor config declares no providers.{runtime}")]
    NoProvider { lane: String, runtime: String },
    #[error("lane {lane_id} generation {generation}: cannot {action} its workspace: {source}")]
    Workspace {
        lane_id: String,
        generation: u64,
        action: &'static str,
        #[source]
        source: crate::confine::workspace::SwitchError,
    },
    #[error("lane uids: {detail}")]
    LaneUids { detail: String },
    #[error("another supervisor already holds {0}")]
    AlreadyRunning(PathBuf),
    #[error("the supervisor is shutting down")]
    ShuttingDown,
    #[error("this supervisor works under a coordinator: {0}")]
    Coordinated(&'static str),
    /// A failure injected by a test's failpoint (`failpoints` builds only).
    #[error("failpoint {failpoint} injected a failure")]
    Injected { failpoint: String },
}

impl SupervisorError {
    /// A stable category for API clients and audit counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config { .. } => "config",
            Self::Name(_) => "bad-name",
            Self::Registry(RegistryError::UnknownRuntime { .. }) => "unknown-runtime",
            Self::Registry(RegistryError::UnknownVersion { .. }) => "unknown-version",
            Self::Registry(RegistryError::Probe { .. }) => "version-probe",
            Self::Registry(RegistryError::Credentials { .. }) => "credentials",
            Self::Registry(_) => "registry",
            Self::Cgroup(CgroupError::NoV2 { .. }) => "no-cgroup-v2",
            Self::Cgroup(CgroupError::NotWritable { .. }) => "cgroup-not-writable",
            Self::Cgroup(_) => "cgroup",
            Self::Identity(_) => "identity",
            Self::Outbox(_) | Self::Durable(_) | Self::State { .. } | Self::Io { .. } => "storage",
            Self::Tmux { .. } => "tmux",
            Self::NoSuchLane(_) => "no-such-lane",
            Self::LaneExists { .. } => "lane-exists",
            Self::Quarantined { .. } => "quarantined",
            Self::ReceiptNotDurable { .. } => "receipt-not-durable",
            Self::NoLiveGeneration(_) => "no-live-generation",
            Self::Launch { .. } => "launch-failed",
            Self::ConfinementUnavailable { .. } => "confinement-unavailable",
            Self::NoProvider { .. } => "no-provider",
            Self::Workspace { .. } => "workspace",
            Self::LaneUids { .. } => "lane-uids",
            Self::AlreadyRunning(_) => "already-running",
            Self::ShuttingDown => "shutting-down",
            Self::Coordinated(_) => "coordinated",
            Self::Injected { .. } => "injected",
        }
    }
}

/// What `end_generation` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndOutcome {
    Stopped,
    AlreadyEnded,
    FencedNeverStarted,
}
