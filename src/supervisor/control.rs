//! The supervisor's local control socket: one JSON request per line, one JSON response per
//! line, on a Unix socket that only the supervisor's user can open (mode 0600 in a 0700
//! runtime dir). This is the host-local operator surface until the coordinator exists.
//!
//! **Never:** accepts an unknown operation or field (serde `deny_unknown_fields`), lets one
//! bad request affect another connection, or returns a nonce.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use super::{Supervisor, SupervisorError};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Status,
    LaneCreate {
        lane: String,
    },
    LaneDestroy {
        lane: String,
    },
    Start {
        lane: String,
        runtime: String,
        #[serde(default)]
        directives: Vec<String>,
    },
    Stop {
        lane: String,
    },
    Receipts {
        lane: Option<String>,
        #[serde(default)]
        include_acked: bool,
    },
    Ack {
        key: String,
    },
    /// Destroy every lane, tell the coordinator, and exit (`mosaic host decommission`);
    /// `force`: exit even if the coordinator could not be told.
    Decommission {
        #[serde(default)]
        force: bool,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub kind: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Response {
    fn ok<T: Serialize>(v: T) -> Self {
        match serde_json::to_value(v) {
            Ok(v) => Self {
                ok: true,
                result: Some(v),
                error: None,
            },
            Err(e) => Self::err("internal", e.to_string()),
        }
    }
    fn err(kind: &str, message: String) -> Self {
        Self {
            ok: false,
            result: None,
            error: Some(ErrorBody {
                kind: kind.into(),
                message,
            }),
        }
    }
    fn from<T: Serialize>(r: Result<T, SupervisorError>) -> Self {
        match r {
            Ok(v) => Self::ok(v),
            Err(e) => Self::err(e.kind(), e.to_string()),
        }
    }
}

/// Binds the control socket, refusing if a live supervisor already answers on it.
pub fn bind(path: &Path) -> Result<UnixListener, SupervisorError> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(SupervisorError::AlreadyRunning(path.to_path_buf()));
    }
    super::generation::bind_socket(path)
}

pub async fn serve(sup: Supervisor, listener: UnixListener) -> Result<(), SupervisorError> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                crate::util::accept_refused("control socket", &e).await;
                continue;
            }
        };
        // A confined generation (or any tool it runs) never drives its own supervisor.
        let peer = stream.peer_cred().ok().and_then(|c| c.pid());
        if crate::confine::refuse_peer(peer) {
            sup.inner.audit.record(
                "control-peer-refused",
                None,
                None,
                &format!("pid {peer:?} is confined (a generation) or unreadable"),
            );
            tracing::warn!(pid = ?peer, "control socket: refused a confined (or unreadable) peer");
            drop(stream);
            continue;
        }
        let sup = sup.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut lines = tokio::io::BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut leave = false;
                let resp = match serde_json::from_str::<Request>(&line) {
                    Ok(req) => {
                        let decommission = matches!(req, Request::Decommission { .. });
                        let resp = handle(&sup, req).await;
                        leave = decommission && resp.ok;
                        resp
                    }
                    Err(e) => {
                        sup.inner
                            .audit
                            .record("bad-control-request", None, None, &e.to_string());
                        Response::err("bad-request", e.to_string())
                    }
                };
                let mut out =
                    serde_json::to_vec(&resp).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
                out.push(b'\n');
                if w.write_all(&out).await.is_err() {
                    break;
                }
                if leave {
                    // Answered first: the daemon stops serving once it is told.
                    let _ = w.flush().await;
                    sup.inner.decommissioned.send_replace(true);
                    break;
                }
            }
        });
    }
}

async fn handle(sup: &Supervisor, req: Request) -> Response {
    match req {
        Request::Status => Response::from(sup.status().await),
        Request::Decommission { force } => Response::from(sup.decommission(force).await),
        Request::LaneCreate { lane } => Response::from(sup.lane_create(&lane).await),
        Request::LaneDestroy { lane } => Response::from(sup.lane_destroy(&lane).await),
        Request::Start {
            lane,
            runtime,
            directives,
        } => Response::from(sup.start(&lane, &runtime, &directives).await),
        Request::Stop { lane } => Response::from(sup.stop(&lane).await),
        Request::Receipts {
            lane,
            include_acked,
        } => Response::from(sup.receipts(lane.as_deref(), include_acked)),
        Request::Ack { key } => Response::from(
            sup.ack(&key)
                .map(|()| serde_json::json!({ "acknowledged": key })),
        ),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the supervisor at {path}: {source} (is `mosaic supervisor` running?)")]
    Connect {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("supervisor connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed supervisor response: {0}")]
    Malformed(String),
    #[error("{kind}: {message}")]
    Refused { kind: String, message: String },
}

/// Sends one request and returns its result (blocking; for the CLI and tests).
pub fn call(socket: &Path, req: &Request) -> Result<serde_json::Value, ClientError> {
    call_within(socket, req, None)
}

/// [`call`], giving up (an I/O error) when the supervisor has not answered within
/// `timeout`: for a view that must not hang on a wedged supervisor.
pub fn call_within(
    socket: &Path,
    req: &Request,
    timeout: Option<std::time::Duration>,
) -> Result<serde_json::Value, ClientError> {
    let mut s =
        std::os::unix::net::UnixStream::connect(socket).map_err(|source| ClientError::Connect {
            path: socket.to_path_buf(),
            source,
        })?;
    s.set_read_timeout(timeout)?;
    s.set_write_timeout(timeout)?;
    let mut line = serde_json::to_vec(req).map_err(|e| ClientError::Malformed(e.to_string()))?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut r = BufReader::new(s);
    let mut resp = String::new();
    r.read_line(&mut resp)?;
    let resp: Response =
        serde_json::from_str(&resp).map_err(|e| ClientError::Malformed(e.to_string()))?;
    match (resp.ok, resp.result, resp.error) {
        (true, Some(v), _) => Ok(v),
        (false, _, Some(e)) => Err(ClientError::Refused {
            kind: e.kind,
            message: e.message,
        }),
        _ => Err(ClientError::Malformed("neither result nor error".into())),
    }
}
