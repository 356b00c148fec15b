//! The per-generation socket protocol between a shim and its supervisor: one JSON object
//! per line over a Unix stream socket that only the supervisor's user can open.
//!
//! This is a host-local channel, not the signed wire of `protocol/`: its authenticity
//! comes from `SO_PEERCRED` plus cgroup membership plus the launch nonce, all checked by
//! the supervisor.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a harness process ended, as `waitpid` reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Whether the kernel wrote a core dump (abort, segfault with cores enabled).
    #[serde(default)]
    pub core_dumped: bool,
}

/// The hex nonce in transit. Redacted in `Debug` so a logged message never shows it.
#[derive(Clone, Serialize, Deserialize, zeroize::Zeroize, zeroize::ZeroizeOnDrop)]
#[serde(transparent)]
pub struct NonceHex(pub String);

impl fmt::Debug for NonceHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A credential value in transit to the harness's environment. Redacted in `Debug`, wiped
/// on drop; the shim hands it to the harness and keeps no copy.
#[derive(Clone, Serialize, Deserialize, zeroize::Zeroize, zeroize::ZeroizeOnDrop)]
#[serde(transparent)]
pub struct SecretValue(pub String);

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What a shim already knows when it (re)attaches.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HarnessState {
    pub harness_pid: i32,
    pub harness_start_time: u64,
    pub exit: Option<ExitStatus>,
    /// The shim's descriptor of the provider gateway's listener (see `Started`).
    #[serde(default)]
    pub gateway_fd: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ShimMsg {
    /// First message on every connection. `harness` is `None` on first attach and set
    /// when the shim reattaches to a restarted supervisor.
    Hello {
        pid: i32,
        start_time: u64,
        nonce: NonceHex,
        harness: Option<HarnessState>,
    },
    Started {
        harness_pid: i32,
        harness_start_time: u64,
        /// The descriptor number, in the shim, of the provider gateway's listener bound in
        /// the generation's network namespace: the supervisor copies it from the verified
        /// shim (`pidfd_getfd`) and serves it. `None`: no gateway.
        #[serde(default)]
        gateway_fd: Option<i32>,
    },
    Exited {
        harness_pid: i32,
        status: ExitStatus,
    },
    /// The shim could not launch the harness (exec failed); it exits after sending this.
    LaunchFailed { reason: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum SupervisorMsg {
    /// Identity verified: start this harness.
    Launch {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        /// Credentials for the harness (never logged; see `SecretValue`).
        #[serde(default)]
        secret_env: Vec<(String, SecretValue)>,
        /// The harness's working directory (default: the pane's).
        #[serde(default)]
        cwd: Option<String>,
        banner: String,
        /// How the harness is confined (required: a launch that does not say is refused).
        confinement: crate::confine::Confinement,
    },
    /// Reattach verified: carry on.
    Adopted,
    /// Identity rejected; the shim must not launch anything.
    Reject { reason: String },
}
