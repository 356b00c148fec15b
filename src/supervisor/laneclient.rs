//! The harness side of the lane socket: what `mosaic lane …` does inside a generation.
//! Each call is one request over the generation's lane socket (`MOSAIC_LANE_SOCKET`); the
//! CLI only parses arguments and prints what [`run`] returns.
//!
//! **Never:** reads evidence larger than the protocol's limit or anything but a regular
//! file; sends evidence as anything but its bytes (hex) for the supervisor to digest;
//! prints anything to a hook's stdout but what the adapter rendered for the harness.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::lanesock::{self, LaneRequest, LaneResponse};
use crate::adapter::ackline;

/// Largest hook event read from stdin.
const MAX_HOOK_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LaneClientError {
    #[error("MOSAIC_LANE_SOCKET is not set: run this inside a Mosaic generation")]
    NoSocket,
    #[error("evidence {path}: {detail}")]
    Evidence { path: PathBuf, detail: String },
    #[error("reading the hook event from stdin: {0}")]
    Stdin(#[source] std::io::Error),
    #[error("a hook event is limited to {MAX_HOOK_BYTES} bytes")]
    HookTooLarge,
    #[error("the hook event is not JSON: {0}")]
    HookNotJson(#[source] serde_json::Error),
    #[error("give --evidence FILE or --commit ID")]
    NoEvidence,
    #[error("git in {dir}: {detail}")]
    Git { dir: PathBuf, detail: String },
    #[error("lane socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl LaneClientError {
    /// A stable category for the CLI's JSON.
    pub fn category(&self) -> &'static str {
        match self {
            Self::NoSocket => "not-in-a-generation",
            Self::Evidence { .. } | Self::NoEvidence => "bad-evidence",
            Self::Stdin(_) | Self::HookTooLarge | Self::HookNotJson(_) => "bad-hook-event",
            Self::Socket { .. } => "lane-socket",
            Self::Git { .. } => "git",
        }
    }
}

/// One harness-side lane command.
#[derive(Debug, Clone)]
pub enum LaneCall {
    Contract,
    Challenge,
    /// With `None`: fetch the challenge and the contract key, and answer with both.
    Ack {
        response: Option<String>,
    },
    /// Forward one hook event (its JSON read from `stdin`).
    Hook {
        family: String,
        event: String,
    },
    HandoffAck,
    Checkpoint,
    Next,
    ContinuationResult {
        continuation_id: String,
        evidence: PathBuf,
    },
    Progress {
        kind: String,
        evidence: Option<PathBuf>,
        commit: Option<String>,
        next_action: Option<String>,
    },
    Blocked {
        code: String,
        evidence: PathBuf,
        next_action: String,
    },
    /// Bundle the current commit of `from` and hand it to the supervisor's push executor.
    Push {
        repo: String,
        reference: Option<String>,
        from: Option<PathBuf>,
        key: Option<String>,
    },
}

/// What the command prints, and whether it succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Printed {
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub success: bool,
}

impl Printed {
    fn json(resp: &LaneResponse) -> Self {
        Self {
            stdout: Some(serde_json::to_string(resp).unwrap_or_else(|e| {
                format!("{{\"ok\":false,\"error\":\"cannot encode the answer: {e}\"}}")
            })),
            stderr: None,
            success: resp.ok,
        }
    }
}

/// The lane socket this process was given.
pub fn socket_from_env() -> Result<PathBuf, LaneClientError> {
    std::env::var_os("MOSAIC_LANE_SOCKET")
        .map(PathBuf::from)
        .ok_or(LaneClientError::NoSocket)
}

fn call(socket: &Path, req: &LaneRequest) -> Result<LaneResponse, LaneClientError> {
    lanesock::call(socket, req).map_err(|source| LaneClientError::Socket {
        path: socket.to_path_buf(),
        source,
    })
}

/// How long a harness's wait for a continuation keeps asking while its supervisor is away
/// (restarting: the socket is gone or refuses, or the wait's connection was cut).
const PARKED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(600);

/// A hook event that waits for a continuation: asked again of a restarted supervisor, which
/// serves the same socket path, so the harness stays reachable across the restart. Asking
/// again gives nothing twice: a continuation the previous process accepted is never given
/// by this one.
fn call_parked(socket: &Path, req: &LaneRequest) -> Result<LaneResponse, LaneClientError> {
    let since = std::time::Instant::now();
    loop {
        match call(socket, req) {
            Err(e) if since.elapsed() < PARKED_PATIENCE => {
                tracing::debug!(error = %e, "lane socket away; asking again");
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

/// Evidence as hex of its bytes: a regular file within the protocol's limit.
fn evidence_hex(p: &Path) -> Result<String, LaneClientError> {
    let err = |detail: String| LaneClientError::Evidence {
        path: p.to_path_buf(),
        detail,
    };
    let meta = std::fs::metadata(p).map_err(|e| err(e.to_string()))?;
    let max = crate::protocol::work::MAX_EVIDENCE_BYTES;
    if !meta.is_file() || meta.len() as usize > max {
        return Err(err(format!(
            "must be a regular file of at most {max} bytes"
        )));
    }
    Ok(hex::encode(
        std::fs::read(p).map_err(|e| err(e.to_string()))?,
    ))
}

/// Runs one lane command against `socket`; a hook event is read from `stdin`.
pub fn run(socket: &Path, c: LaneCall, stdin: impl Read) -> Result<Printed, LaneClientError> {
    let req = match c {
        LaneCall::Contract => LaneRequest::Contract,
        LaneCall::Challenge => LaneRequest::Challenge,
        LaneCall::Ack {
            response: Some(response),
        } => LaneRequest::Ack { response },
        LaneCall::Ack { response: None } => {
            // The challenge's phrase and the contract's key: the answer binds both.
            let ch = call(socket, &LaneRequest::Challenge)?;
            if ch.ok && ch.state.as_deref() == Some("active") {
                return Ok(Printed::json(&ch));
            }
            let phrase = ch.challenge.as_deref().and_then(ackline::parse_challenge);
            let k = call(socket, &LaneRequest::Contract)?;
            match (phrase, k.contract.as_ref().map(|k| k.key.as_str())) {
                (Some(p), Some(key)) if !key.is_empty() => LaneRequest::Ack {
                    response: ackline::ack(p, key),
                },
                _ => {
                    let mut out = Printed::json(if ch.ok { &k } else { &ch });
                    out.success = false;
                    return Ok(out);
                }
            }
        }
        LaneCall::Hook { family, event } => {
            let mut raw = Vec::new();
            stdin
                .take(MAX_HOOK_BYTES + 1)
                .read_to_end(&mut raw)
                .map_err(LaneClientError::Stdin)?;
            if raw.len() as u64 > MAX_HOOK_BYTES {
                return Err(LaneClientError::HookTooLarge);
            }
            let payload: serde_json::Value =
                serde_json::from_slice(&raw).map_err(LaneClientError::HookNotJson)?;
            let parks = crate::adapter::Family::parse(&family)
                .and_then(|f| f.adapter().parking_event())
                == Some(event.as_str());
            let req = LaneRequest::Hook {
                family,
                event,
                payload,
            };
            let resp = if parks {
                call_parked(socket, &req)?
            } else {
                call(socket, &req)?
            };
            // The harness reads the hook's stdout: only what the adapter rendered.
            return Ok(Printed {
                stdout: resp.output.clone(),
                stderr: (!resp.ok)
                    .then(|| format!("mosaic lane hook: {}", resp.error.unwrap_or_default())),
                success: resp.ok,
            });
        }
        LaneCall::HandoffAck => LaneRequest::HandoffAck,
        LaneCall::Checkpoint => LaneRequest::Checkpoint,
        LaneCall::Next => LaneRequest::Next,
        LaneCall::ContinuationResult {
            continuation_id,
            evidence,
        } => LaneRequest::ContinuationResult {
            continuation_id,
            evidence_hex: evidence_hex(&evidence)?,
        },
        LaneCall::Progress {
            kind,
            evidence,
            commit,
            next_action,
        } => LaneRequest::Progress {
            kind,
            evidence_hex: match (evidence, commit) {
                (Some(p), _) => evidence_hex(&p)?,
                (None, Some(c)) => hex::encode(c.trim()),
                (None, None) => return Err(LaneClientError::NoEvidence),
            },
            next_action,
        },
        LaneCall::Blocked {
            code,
            evidence,
            next_action,
        } => LaneRequest::Blocked {
            code,
            evidence_hex: evidence_hex(&evidence)?,
            next_action,
        },
        LaneCall::Push {
            repo,
            reference,
            from,
            key,
        } => {
            let from = match from {
                Some(f) => f,
                None => std::env::current_dir().map_err(|e| LaneClientError::Git {
                    dir: PathBuf::from("."),
                    detail: e.to_string(),
                })?,
            };
            // Bundled here, inside the generation, by its own git: the supervisor only reads
            // the bundle (as data), never this repository.
            let new = git(&from, &["rev-parse", "--verify", "HEAD^{commit}"])?;
            let git_dir = git(&from, &["rev-parse", "--absolute-git-dir"])?;
            let bundle = PathBuf::from(git_dir).join(format!(
                "mosaic-push-{}.bundle",
                uuid::Uuid::new_v4().simple()
            ));
            let b = bundle.display().to_string();
            git(&from, &["bundle", "create", "--quiet", &b, "HEAD"])?;
            let resp = call(
                socket,
                &LaneRequest::Push(crate::supervisor::push::PushRequest {
                    repo,
                    reference,
                    bundle: bundle.clone(),
                    new,
                    key,
                }),
            );
            let _ = std::fs::remove_file(&bundle);
            return Ok(Printed::json(&resp?));
        }
    };
    Ok(Printed::json(&call(socket, &req)?))
}

/// Runs git in `dir` (the generation's own repository, as the generation); its trimmed
/// stdout.
fn git(dir: &Path, args: &[&str]) -> Result<String, LaneClientError> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| LaneClientError::Git {
            dir: dir.to_path_buf(),
            detail: format!("running git: {e}"),
        })?;
    if !out.status.success() {
        return Err(LaneClientError::Git {
            dir: dir.to_path_buf(),
            detail: String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("failed")
                .to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
