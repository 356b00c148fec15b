//! How operator requests travel: the local socket and the TLS listener on the coordinator's
//! side, and the client the CLI calls (address parsing, one request, its decoded answer).

use super::*;

/// What `mosaic assign` asks for.
#[derive(Debug, Clone)]
pub struct AssignRequest {
    pub lane_id: String,
    pub runtime: String,
    pub task: String,
    pub scope: Vec<String>,
    pub holds: Vec<String>,
    pub completion_policy: String,
    pub wait: bool,
    pub resume: Option<String>,
    pub request_id: String,
    pub inactivity_policy: String,
    /// The repository (and base ref) a new assignment works in.
    pub repo: Option<String>,
    pub base: Option<String>,
    /// A resume with a task other than the assignment's is meant (see `OperatorRequest`).
    pub replace_task: bool,
    /// Another assignment's checkpoint a new one starts from, under a grant (and its
    /// lifetime, seconds).
    pub from_checkpoint: Option<String>,
    pub grant_within_s: Option<u32>,
    /// No lane named: what the placement policy must find in one.
    pub place: Option<crate::coordinator::placement::PlacementAsk>,
}

impl AssignRequest {
    /// A plain assignment with the defaults (`mosaic up --demo`, tests).
    pub fn new(lane_id: &str, runtime: &str, task: &str, wait: bool) -> Self {
        Self {
            lane_id: lane_id.into(),
            runtime: runtime.into(),
            task: task.into(),
            scope: vec![],
            holds: vec![],
            completion_policy: task::COMPLETION_POLICIES[0].into(),
            wait,
            resume: None,
            request_id: request_id(None),
            inactivity_policy: DEFAULT_INACTIVITY_POLICY.into(),
            repo: None,
            base: None,
            replace_task: false,
            from_checkpoint: None,
            grant_within_s: None,
            place: None,
        }
    }
}

/// Binds the operator socket (mode 0600) so it exists before anyone is told it does.
pub fn bind_operators(path: &Path) -> Result<tokio::net::UnixListener, ServiceError> {
    if let Some(dir) = path.parent() {
        crate::util::durable::ensure_dir(dir, 0o700).map_err(|e| ServiceError::Serve {
            what: "the operator socket",
            at: path.display().to_string(),
            detail: e.to_string(),
        })?;
    }
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub async fn serve_operators(
    svc: Arc<Service>,
    listener: tokio::net::UnixListener,
) -> Result<(), ServiceError> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                crate::util::accept_refused("operator socket", &e).await;
                continue;
            }
        };
        // A confined generation (or any tool it runs) on this host is never an operator.
        let cred = stream.peer_cred().ok();
        let peer = cred.and_then(|c| c.pid());
        if crate::confine::refuse_peer(peer) {
            tracing::warn!(pid = ?peer, "operator socket: refused a confined (or unreadable) peer");
            continue;
        }
        // Who the records of what it read name: the socket's peer user.
        let who = match cred {
            Some(c) => format!("local:uid={}", c.uid()),
            None => "local".to_string(),
        };
        tokio::spawn(operator_session(svc.clone(), stream, None, who));
    }
}

/// Remote operators: mutual TLS with a CA-issued certificate naming `operator:<name>`.
pub async fn serve_remote_operators(
    svc: Arc<Service>,
    listener: tokio::net::TcpListener,
    tls: TlsIdentity,
) -> Result<(), ServiceError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(transport::server_tls(&tls)?);
    loop {
        let (tcp, addr) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                crate::util::accept_refused("remote operators", &e).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (svc, acceptor) = (svc.clone(), acceptor.clone());
        tokio::spawn(async move {
            let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                tracing::warn!(%addr, "operator TLS handshake failed");
                return;
            };
            let principal = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| crate::pki::principal_of(c));
            let refusal = match &principal {
                Some(p) if p.starts_with("operator:") && svc.trust.is_revoked(p) => {
                    format!("{p} was revoked (mosaic trust revoke); this coordinator takes no request from it")
                }
                Some(p) if p.starts_with("operator:") => {
                    tracing::info!(operator = %p, %addr, "operator connected");
                    operator_session(svc, stream, Some(p.clone()), p.clone()).await;
                    return;
                }
                Some(p) => format!("the client certificate names {p}, not an operator: operator requests need a certificate from `mosaic enroll operator NAME`"),
                None => "the client certificate names no Mosaic principal (urn:mosaic:operator:NAME): issue one with `mosaic enroll operator NAME`".to_string(),
            };
            tracing::warn!(?principal, %addr, reason = %refusal, "operator connection refused");
            svc.store.auditor().record(
                "operator-connect",
                Category::NotOwner,
                None,
                None,
                None,
                &format!("{addr}: {refusal}"),
            );
            // Said to the client too, as the answer to its first request (read first, so
            // closing never resets the connection under the answer).
            // At most 64 KiB of it, for at most 5 s.
            let mut stream = tokio::io::BufReader::new(stream);
            let mut first = Vec::new();
            let mut limited = tokio::io::AsyncReadExt::take(&mut stream, 64 * 1024);
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                limited.read_until(b'\n', &mut first),
            )
            .await;
            let line = json!({ "ok": false, "error": OpError::new(Category::NotOwner, refusal) });
            let mut out = line.to_string().into_bytes();
            out.push(b'\n');
            let mut stream = stream.into_inner();
            let _ = stream.write_all(&out).await;
            let _ = stream.flush().await;
            let _ = stream.shutdown().await;
        });
    }
}

/// One operator connection: JSON requests, one per line, answered in order. A remote
/// operator's (`principal`) is checked against the revocations before every request: a
/// revocation ends a connection opened before it at its next request. `who` names the
/// operator in the records of checkpoint material it reads (its principal, or the local
/// socket's peer user).
pub(super) async fn operator_session<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    svc: Arc<Service>,
    stream: S,
    principal: Option<String>,
    who: String,
) {
    let (r, mut w) = tokio::io::split(stream);
    let mut lines = tokio::io::BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(p) = principal.as_deref().filter(|p| svc.trust.is_revoked(p)) {
            let refusal = format!(
                "{p} was revoked (mosaic trust revoke); this coordinator takes no request from it"
            );
            svc.store.auditor().record(
                "operator-request",
                Category::NotOwner,
                None,
                None,
                None,
                &refusal,
            );
            let resp = json!({ "ok": false, "error": OpError::new(Category::NotOwner, refusal) });
            let mut out = resp.to_string().into_bytes();
            out.push(b'\n');
            let _ = w.write_all(&out).await;
            let _ = w.flush().await;
            break;
        }
        let resp = match serde_json::from_str::<OperatorRequest>(&line) {
            Err(e) => {
                json!({ "ok": false, "error": OpError::new(Category::BadInput, format!("bad request: {e}")) })
            }
            Ok(req) => match svc.operate(req, &who).await {
                Ok(v) => json!({ "ok": true, "result": v }),
                Err(e) => json!({ "ok": false, "error": e }),
            },
        };
        let mut out = resp.to_string().into_bytes();
        out.push(b'\n');
        if w.write_all(&out).await.is_err() || w.flush().await.is_err() {
            break;
        }
    }
}

/// Where an operator reaches the coordinator.
#[derive(Debug, Clone)]
pub enum OperatorTarget {
    /// The coordinator's local socket.
    Socket(PathBuf),
    /// A remote coordinator's operator listener, with this operator's certificate.
    Remote {
        addr: String,
        server_name: String,
        tls: TlsIdentity,
    },
}

/// Parses `--coordinator`: `HOST:PORT` or `tls://HOST:PORT[/]`, IPv6 hosts in brackets.
/// Returns the address to dial and the host part (the default certificate name).
pub fn parse_coordinator_addr(s: &str) -> Result<(String, String), String> {
    let rest = match s.split_once("://") {
        None => s,
        Some(("tls", rest)) => rest.trim_end_matches('/'),
        Some((scheme, _)) => {
            return Err(format!(
                "--coordinator {s}: scheme {scheme}:// is not supported; use HOST:PORT or tls://HOST:PORT (the operator listener speaks mutual TLS)"
            ))
        }
    };
    let bad = || format!("--coordinator {s}: expected HOST:PORT or tls://HOST:PORT");
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.is_empty() || rest.contains('/') || (bare == host && host.contains(':')) {
        return Err(bad());
    }
    Ok((rest.to_string(), bare.to_string()))
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> OpError {
    OpError::new(Category::Unavailable, e.to_string())
}

/// Sends one operator request to `target` (blocking; for the CLI and tests). A mutating
/// request without a key gets one here (`cli-…`), so that whatever happens its answer names
/// it: a connection lost after the request was sent answers `state: unknown` with the key.
pub fn operator_request(
    target: &OperatorTarget,
    req: &OperatorRequest,
) -> Result<serde_json::Value, OpError> {
    match target {
        OperatorTarget::Socket(p) => operator_call(p, req),
        OperatorTarget::Remote {
            addr,
            server_name,
            tls,
        } => {
            let (line, id) = keyed_line(req)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(unavailable)?;
            let mut s = rt
                .block_on(async {
                    let cfg = transport::client_tls(tls).map_err(unavailable)?;
                    let tcp = tokio::net::TcpStream::connect(addr)
                        .await
                        .map_err(|e| unavailable(format!("cannot reach {addr}: {e}")))?;
                    let _ = tcp.set_nodelay(true);
                    let name = rustls::pki_types::ServerName::try_from(server_name.clone())
                        .map_err(unavailable)?;
                    tokio_rustls::TlsConnector::from(cfg)
                        .connect(name, tcp)
                        .await
                        .map_err(|e| unavailable(format!("TLS: {e}")))
                })
                .map_err(|e| not_sent(e, id.as_deref()))?;
            let answered = rt.block_on(async {
                // From the first byte written on, the request may have been received.
                s.write_all(&line).await.map_err(unavailable)?;
                s.flush().await.map_err(unavailable)?;
                let mut out = String::new();
                tokio::io::BufReader::new(s)
                    .read_line(&mut out)
                    .await
                    .map_err(unavailable)?;
                decode_operator_response(
                    &out,
                    "is this an operator certificate from its CA? did the coordinator stop?",
                )
            });
            sent(answered, id.as_deref())
        }
    }
}

/// Sends one request to the first of `targets` that takes it: a coordinator that cannot
/// be reached (nothing sent) or answers `not-leader` passes it on to the next — first to
/// the leader it names, if any. A mutating request carries one key across every try, so
/// it is carried out at most once whichever coordinator ends up taking it.
pub fn operator_request_any(
    targets: &[OperatorTarget],
    req: &OperatorRequest,
) -> Result<serde_json::Value, OpError> {
    let mut req = req.clone();
    if req.mutation().is_some() && req.request_id().is_none() {
        req.set_request_id(format!("cli-{}", uuid::Uuid::new_v4().simple()));
    }
    let mut queue: std::collections::VecDeque<OperatorTarget> = targets.iter().cloned().collect();
    let mut tried = 0;
    let mut last = None;
    while let Some(t) = queue.pop_front() {
        tried += 1;
        if tried > targets.len() + 3 {
            break;
        }
        match operator_request(&t, &req) {
            Err(e) if e.category == Category::NotLeader => {
                if let (Some(at), OperatorTarget::Remote { tls, .. }) = (&e.leader, &t) {
                    if let Ok((addr, host)) = parse_coordinator_addr(at) {
                        queue.push_front(OperatorTarget::Remote {
                            addr,
                            server_name: host,
                            tls: tls.clone(),
                        });
                    }
                }
                last = Some(e);
            }
            // Never reached: nothing was sent, so the next one may take it.
            Err(e) if e.category == Category::Unavailable && e.state.is_none() => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| unavailable("no coordinator to ask")))
}

/// The request as one line, with a key if it is a mutating one; and that key.
fn keyed_line(req: &OperatorRequest) -> Result<(Vec<u8>, Option<String>), OpError> {
    let mut req = req.clone();
    if req.mutation().is_some() && req.request_id().is_none() {
        req.set_request_id(format!("cli-{}", uuid::Uuid::new_v4().simple()));
    }
    let id = req.request_id().map(String::from);
    let mut line = serde_json::to_vec(&req).map_err(unavailable)?;
    line.push(b'\n');
    Ok((line, id))
}

/// A failure before any byte of the request left: nothing this call sent took effect.
fn not_sent(e: OpError, id: Option<&str>) -> OpError {
    OpError {
        request_id: id.map(String::from),
        ..e
    }
}

/// The answer to a request that was sent: a failure with no answer from the coordinator
/// leaves its outcome unknown.
fn sent(
    r: Result<serde_json::Value, OpError>,
    id: Option<&str>,
) -> Result<serde_json::Value, OpError> {
    r.map_err(|e| match (id, e.request_id.is_some()) {
        (Some(id), false) => e.of_request(id),
        _ => e,
    })
}

/// `hint`: what an unanswered request most likely means on this kind of connection.
pub(super) fn decode_operator_response(
    out: &str,
    hint: &str,
) -> Result<serde_json::Value, OpError> {
    if out.is_empty() {
        return Err(unavailable(format!(
            "the coordinator closed the connection without an answer ({hint})"
        )));
    }
    let v: serde_json::Value = serde_json::from_str(out).map_err(unavailable)?;
    if v["ok"] == true {
        Ok(v["result"].clone())
    } else {
        Err(serde_json::from_value(v["error"].clone())
            .unwrap_or_else(|_| OpError::new(Category::Internal, v["error"].to_string())))
    }
}

/// Sends one operator request over the local socket (blocking; for the CLI and tests).
pub fn operator_call(path: &Path, req: &OperatorRequest) -> Result<serde_json::Value, OpError> {
    use std::io::{BufRead, Write};
    let (line, id) = keyed_line(req)?;
    let mut s = std::os::unix::net::UnixStream::connect(path)
        .map_err(|e| {
            unavailable(format!(
                "cannot reach the coordinator at {}: {e}",
                path.display()
            ))
        })
        .map_err(|e| not_sent(e, id.as_deref()))?;
    let answered = (|| {
        s.write_all(&line).map_err(unavailable)?;
        let mut out = String::new();
        std::io::BufReader::new(&s)
            .read_line(&mut out)
            .map_err(unavailable)?;
        decode_operator_response(&out, "it stopped or restarted while answering")
    })();
    sent(answered, id.as_deref())
}

#[cfg(test)]
mod tests {
    use crate::coordinator::service::parse_coordinator_addr as p;

    #[test]
    fn coordinator_addresses_parse_or_fail_with_the_reason() {
        let ok = |a: &str, h: &str| Ok((a.to_string(), h.to_string()));
        assert_eq!(
            p("coord.example:7443"),
            ok("coord.example:7443", "coord.example")
        );
        assert_eq!(
            p("tls://coord.example:7443/"),
            ok("coord.example:7443", "coord.example")
        );
        assert_eq!(p("[::1]:7443"), ok("[::1]:7443", "::1"));
        for bad in [
            "coord.example",
            "coord:http",
            ":7443",
            "::1:7443",
            "tls://c:1/x",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(p("https://c:1").unwrap_err().contains("not supported"));
    }
}
