//! Process-tree identity (spec §10): what makes "this generation's process" more than a PID.
//!
//! **Owns:** the launch nonce, its digest, reading a process's identity from procfs, and
//! the verdict on an identity claim.
//!
//! **Never:** prints, logs or serializes a raw nonce (`LaunchNonce` has no `Serialize` and a
//! redacting `Debug`); accepts a PID without its start time, boot id and cgroup; compares
//! secrets with `==`.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop};

const NONCE_DOMAIN: &str = "mosaic/launch-nonce/v1";

/// 128 random bits handed to exactly one shim launch. Zeroed on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct LaunchNonce([u8; 16]);

impl LaunchNonce {
    pub fn generate() -> Result<Self, IdentityError> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(|e| IdentityError::Random(e.to_string()))?;
        Ok(Self(b))
    }

    /// Parses the hex form the shim reads from its nonce file or sends on reattach.
    pub fn from_hex(s: &str) -> Result<Self, IdentityError> {
        let mut b = [0u8; 16];
        hex::decode_to_slice(s.trim(), &mut b).map_err(|_| IdentityError::MalformedNonce)?;
        Ok(Self(b))
    }

    /// The hex form, for the one place it must travel (the 0600 nonce file and the
    /// per-generation socket). Callers must not log it.
    pub fn expose_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn digest(&self) -> NonceDigest {
        NonceDigest(crate::util::sha256_hex(NONCE_DOMAIN, &[&self.0]))
    }
}

impl fmt::Debug for LaunchNonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LaunchNonce(<redacted>)")
    }
}

/// SHA-256 of a nonce: safe to store and show; 128 random bits cannot be brute-forced
/// back out of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NonceDigest(pub String);

impl NonceDigest {
    /// Constant-time: a claimed nonce is checked without leaking how much of it matched.
    pub fn matches(&self, nonce: &LaunchNonce) -> bool {
        let got = nonce.digest();
        crate::util::ct::eq(self.0.as_bytes(), got.0.as_bytes())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("random number generator failed: {0}")]
    Random(String),
    #[error("launch nonce is not 32 hex digits")]
    MalformedNonce,
    #[error("process {pid} is gone")]
    Gone { pid: i32 },
    #[error("cannot read identity of process {pid}: {detail}")]
    Unreadable { pid: i32, detail: String },
    #[error("peer credentials say pid {peer} but the claim names pid {claimed}")]
    PeerMismatch { peer: i32, claimed: i32 },
    #[error("process {pid} is in cgroup {actual:?}, not the generation's {expected:?}")]
    NotInCgroup {
        pid: i32,
        expected: String,
        actual: String,
    },
    #[error("process {pid} start time {actual} differs from the recorded {expected} (PID reuse)")]
    StartTime {
        pid: i32,
        expected: u64,
        actual: u64,
    },
    #[error("launch nonce does not match this generation's")]
    Nonce,
    #[error("boot id changed: the recorded process belongs to an earlier boot")]
    Boot,
    #[error("executable identity of process {pid} changed")]
    Exe { pid: i32 },
    #[error("claimed pid {claimed} is not the recorded root pid {recorded}")]
    WrongRoot { claimed: i32, recorded: i32 },
}

impl IdentityError {
    /// A stable, countable category for audit records.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Random(_) => "rng",
            Self::MalformedNonce => "malformed-nonce",
            Self::Gone { .. } => "process-gone",
            Self::Unreadable { .. } => "unreadable",
            Self::PeerMismatch { .. } => "peer-mismatch",
            Self::NotInCgroup { .. } => "not-in-cgroup",
            Self::StartTime { .. } => "start-time-mismatch",
            Self::Nonce => "nonce-mismatch",
            Self::Boot => "boot-mismatch",
            Self::Exe { .. } => "exe-mismatch",
            Self::WrongRoot { .. } => "wrong-root",
        }
    }
}

/// What procfs says about a live process right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub pid: i32,
    /// `starttime` from `/proc/<pid>/stat`, in clock ticks since boot.
    pub start_time: u64,
    pub exe_path: PathBuf,
    pub exe_dev: u64,
    pub exe_ino: u64,
    /// v2 cgroup path relative to the mount, starting with `/`.
    pub cgroup: String,
}

/// Reads identity facts of `pid` from `/proc`.
pub fn observe(pid: i32) -> Result<Observed, IdentityError> {
    let proc = procfs::process::Process::new(pid).map_err(|_| IdentityError::Gone { pid })?;
    let stat = proc.stat().map_err(|_| IdentityError::Gone { pid })?;
    let unreadable = |detail: String| IdentityError::Unreadable { pid, detail };
    let exe_path = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| unreadable(format!("exe link: {e}")))?;
    let meta = std::fs::metadata(format!("/proc/{pid}/exe"))
        .map_err(|e| unreadable(format!("exe stat: {e}")))?;
    let cgroup = crate::cgroup::cgroup_of(Some(pid)).map_err(|e| unreadable(e.to_string()))?;
    Ok(Observed {
        pid,
        start_time: stat.starttime,
        exe_path,
        exe_dev: meta.dev(),
        exe_ino: meta.ino(),
        cgroup,
    })
}

/// `/proc/sys/kernel/random/boot_id`: distinguishes PIDs and start times across reboots.
pub fn boot_id() -> Result<String, IdentityError> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .map_err(|e| IdentityError::Unreadable {
            pid: 0,
            detail: format!("boot_id: {e}"),
        })
}

/// The recorded identity of one generation's process tree (spec §10 item 2). The shim is
/// the root of the tree; the harness is its first child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessIdentity {
    pub boot_id: String,
    pub root_pid: i32,
    pub root_start_time: u64,
    pub exe_path: PathBuf,
    pub exe_dev: u64,
    pub exe_ino: u64,
    pub cgroup_path: String,
    pub cgroup_id: u64,
    pub launch_nonce_digest: NonceDigest,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub harness_pid: Option<i32>,
    pub harness_start_time: Option<u64>,
    /// What the supervisor saw of the harness's confinement before it went live.
    #[serde(default)]
    pub confinement: crate::confine::Seen,
}

/// A process's claim to be a generation's root, as it arrives on the socket.
#[derive(Debug)]
pub struct Claim<'a> {
    /// From `SO_PEERCRED`: the kernel's word, not the peer's.
    pub peer_pid: i32,
    pub claimed_pid: i32,
    pub claimed_start_time: u64,
    pub nonce: &'a LaunchNonce,
}

/// What a claim must match.
#[derive(Debug)]
pub struct Expected<'a> {
    pub boot_id: &'a str,
    pub cgroup: &'a str,
    pub nonce_digest: &'a NonceDigest,
    /// On re-adoption, the recorded root: pid, start time and executable must all match.
    pub recorded: Option<&'a ProcessIdentity>,
}

/// Checks a claim against procfs and the expectation. Every check runs on kernel-sourced
/// facts; the claimed values are only compared, never trusted.
pub fn verify_claim(claim: &Claim<'_>, expected: &Expected<'_>) -> Result<Observed, IdentityError> {
    if claim.peer_pid != claim.claimed_pid {
        return Err(IdentityError::PeerMismatch {
            peer: claim.peer_pid,
            claimed: claim.claimed_pid,
        });
    }
    if boot_id()? != expected.boot_id {
        return Err(IdentityError::Boot);
    }
    let seen = observe(claim.claimed_pid)?;
    if seen.cgroup != expected.cgroup {
        return Err(IdentityError::NotInCgroup {
            pid: seen.pid,
            expected: expected.cgroup.to_string(),
            actual: seen.cgroup,
        });
    }
    if seen.start_time != claim.claimed_start_time {
        return Err(IdentityError::StartTime {
            pid: seen.pid,
            expected: claim.claimed_start_time,
            actual: seen.start_time,
        });
    }
    if let Some(rec) = expected.recorded {
        if rec.root_pid != seen.pid {
            return Err(IdentityError::WrongRoot {
                claimed: seen.pid,
                recorded: rec.root_pid,
            });
        }
        if rec.root_start_time != seen.start_time {
            return Err(IdentityError::StartTime {
                pid: seen.pid,
                expected: rec.root_start_time,
                actual: seen.start_time,
            });
        }
        if rec.exe_dev != seen.exe_dev || rec.exe_ino != seen.exe_ino {
            return Err(IdentityError::Exe { pid: seen.pid });
        }
    }
    if !expected.nonce_digest.matches(claim.nonce) {
        return Err(IdentityError::Nonce);
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonce_never_prints() {
        let n = LaunchNonce::generate().unwrap();
        let dbg = format!("{n:?}");
        assert!(!dbg.contains(&n.expose_hex()));
        assert!(dbg.contains("redacted"));
    }

    #[test]
    fn digest_matching() {
        let a = LaunchNonce::generate().unwrap();
        let b = LaunchNonce::generate().unwrap();
        assert!(a.digest().matches(&a));
        assert!(!a.digest().matches(&b));
        assert_eq!(
            LaunchNonce::from_hex(&a.expose_hex()).unwrap().digest(),
            a.digest()
        );
        assert!(matches!(
            LaunchNonce::from_hex("zz"),
            Err(IdentityError::MalformedNonce)
        ));
    }
}
