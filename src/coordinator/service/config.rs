//! The coordinator daemon's configuration and its errors.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::coordinator::error::AuthorityError;
use crate::protocol::transport;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// This coordinator's name; its principal is `coordinator:<name>`.
    pub name: String,
    pub trust_domain: String,
    /// TCP address for host sessions (mutual TLS).
    pub listen: String,
    /// PostgreSQL URL or key=value string. A database on another machine needs
    /// `sslmode=verify-full` and `sslrootcert=FILE` (or `allow_insecure_database`).
    pub database_url: String,
    /// Accept a plain (unencrypted, unauthenticated) connection to a database that is not
    /// on this machine. Off by default.
    #[serde(default)]
    pub allow_insecure_database: bool,
    /// File holding the coordinator secret (64 hex digits). Every coordinator of one
    /// database must hold the same secret: fence tokens are derived from it.
    pub secret_file: PathBuf,
    /// Where the coordinator keeps what must outlive it on its own disk: the audit spool
    /// (records written while the database is unreachable). Default: the directory of
    /// `secret_file`.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub trust_registry: PathBuf,
    /// Ed25519 seeds (64 hex digits) of this coordinator's session and ordinary keys; key
    /// ids are `<principal>/session` and `<principal>/ordinary`.
    pub session_key: PathBuf,
    pub ordinary_key: PathBuf,
    /// The seed of this coordinator's recovery key (`<principal>/recovery`, spec §7.3): the
    /// only key that signs `recovery_challenge`. Without one the coordinator never retargets
    /// (work whose start failed waits in recovery for its own lane or an operator).
    #[serde(default)]
    pub recovery_key: Option<PathBuf>,
    /// Operator socket (mode 0600).
    pub operator_socket: PathBuf,
    /// Leadership lease (default 10000 ms); renewed every third of it.
    pub lease_ms: Option<i64>,
    /// How long a reservation may take to reach RUNNING (default 120000 ms).
    pub reservation_ttl_ms: Option<i64>,
    /// Effect leases issued at activation (default 900000 ms), renewed every third of it
    /// while the lane's host is connected.
    pub lease_ttl_ms: Option<i64>,
    /// Optional TCP address for remote operators: mutual TLS, and the client certificate
    /// must name an `operator:` principal (`mosaic pki issue-operator`).
    pub operator_listen: Option<String>,
    /// The address operators reach `operator_listen` at (`tls://HOST:PORT`), named to them
    /// by a standby's `not-leader` answer while this coordinator leads. Default:
    /// `operator_listen`, unless it is a wildcard address.
    #[serde(default)]
    pub advertise_operator: Option<String>,
    /// Host sessions: ping every this many ms (default 5000); a host silent for three
    /// intervals is disconnected.
    #[serde(default)]
    pub heartbeat_ms: Option<u64>,
    /// The largest offset of a host's clock from the database time a host session is
    /// opened with (default 300000: five minutes); beyond it the hello is refused with the
    /// offset named.
    #[serde(default)]
    pub max_clock_skew_ms: Option<u64>,
    /// Serve Prometheus metrics at `http://<this>/metrics` (e.g. `127.0.0.1:9465`). Off
    /// when absent.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// The largest object the checkpoint store takes (a checkpoint's bundle, or the bundle
    /// of its base commit), in bytes (default 268435456: 256 MiB). A checkpoint with a
    /// larger one stays on its host only, and says so (`mosaic checkpoint list`).
    #[serde(default)]
    pub checkpoint_store_max_bytes: Option<u64>,
    /// How long a workspace checkpoint is kept once its work is done, in seconds, before
    /// `mosaic checkpoint gc` deletes it; absent: kept until an operator deletes it
    /// (`mosaic checkpoint delete`). Recorded on each checkpoint as its policy's digest.
    #[serde(default)]
    pub checkpoint_retention_s: Option<u64>,
    /// How long after its work is done a harness artifact (a `sensitive` session
    /// transcript) is kept before `mosaic checkpoint gc` deletes it; absent: kept until an
    /// operator deletes it. Recorded on each artifact as its policy's digest.
    #[serde(default)]
    pub artifact_retention_s: Option<u64>,
    /// The principals allowed to recover a harness's artifact (its session transcript),
    /// each `PRINCIPAL=age1…` (an age X25519 public key; `mosaic pki recovery-key` makes a
    /// pair). Every generation's artifact is encrypted to these; none: no artifact is
    /// captured (a transcript is never kept in the clear).
    #[serde(default)]
    pub recovery_recipients: Vec<String>,
    /// A program (absolute path) run for every operator event — work blocked, waiting for
    /// input, attempts exhausted, a lane quarantined, a handoff offered or expired — with
    /// the event as JSON on its stdin; exit 0 takes it. Retried with backoff otherwise.
    #[serde(default)]
    pub notify_command: Option<PathBuf>,
    /// A URL (http or https) every operator event is POSTed to as JSON; a 2xx answer takes
    /// it. Only its scheme and host are ever shown (its path may hold a token).
    #[serde(default)]
    pub notify_webhook: Option<String>,
}

/// The timing settings the running service uses, with their defaults applied.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub lease_ms: i64,
    pub reservation_ttl_ms: i64,
    pub lease_ttl_ms: i64,
    pub challenge_ttl_ms: i64,
    pub liveness: transport::Liveness,
    pub max_clock_skew_ms: u64,
    pub checkpoint_max_bytes: u64,
}

impl CoordinatorConfig {
    pub fn timing(&self) -> Timing {
        Timing {
            lease_ms: self.lease_ms.unwrap_or(10_000),
            reservation_ttl_ms: self.reservation_ttl_ms.unwrap_or(120_000),
            lease_ttl_ms: self.lease_ttl_ms.unwrap_or(900_000),
            challenge_ttl_ms: 60_000,
            liveness: transport::Liveness::from_heartbeat_ms(self.heartbeat_ms),
            max_clock_skew_ms: self
                .max_clock_skew_ms
                .unwrap_or(transport::ClockSkew::DEFAULT_TOLERANCE_MS),
            checkpoint_max_bytes: self
                .checkpoint_store_max_bytes
                .unwrap_or(crate::coordinator::checkpoint_store::DEFAULT_MAX_OBJECT_BYTES),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A file the configuration names cannot be read.
    #[error("{}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file the configuration names holds something unusable (a secret that is not 64 hex
    /// digits, a trust registry that does not parse).
    #[error("{}: {detail}", path.display())]
    BadFile { path: PathBuf, detail: String },
    /// A listener or socket the coordinator must serve cannot be set up.
    #[error("cannot serve {what} at {at}: {detail}")]
    Serve {
        what: &'static str,
        at: String,
        detail: String,
    },
    /// The configuration was checked as a whole and these are what is wrong with it.
    #[error("not starting: {}", problems.join("; "))]
    Invalid { problems: Vec<String> },
    #[error(transparent)]
    Authority(#[from] AuthorityError),
    #[error(transparent)]
    Transport(#[from] transport::TransportError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl ServiceError {
    /// The category the CLI's JSON and the logs carry.
    pub fn category(&self) -> crate::coordinator::Category {
        use crate::coordinator::Category;
        match self {
            Self::ReadFile { .. } | Self::BadFile { .. } | Self::Invalid { .. } => {
                Category::BadInput
            }
            Self::Serve { .. } | Self::Io(_) => Category::Unavailable,
            Self::Authority(e) => e.operator_category(),
            Self::Transport(_) => Category::Unavailable,
        }
    }
}

pub fn read_seed(path: &Path) -> Result<[u8; 32], ServiceError> {
    let text = std::fs::read_to_string(path).map_err(|source| ServiceError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    let mut b = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut b).map_err(|_| ServiceError::BadFile {
        path: path.to_path_buf(),
        detail: "expected 64 hex digits".into(),
    })?;
    Ok(b)
}
