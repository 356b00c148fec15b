//! The coordinator's side: admission of sessions (bounded handshakes per source), the
//! per-frame verification, strikes and rate limits, and the session loop that hands each
//! verified envelope to the handler.

use super::*;

/// What the server's handler knows about one live session, and how it ends it.
#[derive(Clone)]
pub struct SessionHandle {
    pub peer: String,
    pub session_id: String,
    /// Frames for the peer; `try_send` fails when the session is gone or its peer does
    /// not read (then the session is closed).
    pub push: tokio::sync::mpsc::Sender<Outgoing>,
    /// When the last frame arrived from the peer ([`mono_ms`]).
    pub last_frame: Arc<std::sync::atomic::AtomicU64>,
    /// The peer's clock offset from the coordinator's database time, measured from its
    /// hello (positive: the peer is ahead); `None` for a hello without `host_clock`.
    pub clock_offset_ms: Option<i64>,
    pub(super) close: Arc<tokio::sync::Notify>,
    pub(super) close_reason: Arc<std::sync::Mutex<Option<CloseReason>>>,
}

impl SessionHandle {
    /// Ends the session with `reason` (sent to the peer in the close frame).
    pub fn close(&self, reason: CloseReason) {
        let _ = self.close_for(reason);
    }

    /// Closes the session with `reason` unless it already has one, and returns the reason
    /// it is closed for: the first one given wins, so every record of the close agrees.
    pub fn close_for(&self, reason: CloseReason) -> CloseReason {
        let effective = match self.close_reason.lock() {
            Ok(mut r) => r.get_or_insert(reason).clone(),
            Err(_) => reason,
        };
        self.close.notify_one();
        effective
    }

    /// How long ago the peer last sent a frame.
    pub fn silent_for(&self) -> Duration {
        Duration::from_millis(
            mono_ms().saturating_sub(self.last_frame.load(std::sync::atomic::Ordering::Relaxed)),
        )
    }

    pub fn is_open(&self) -> bool {
        !self.push.is_closed()
    }
}

/// The coordinator's freshness data for a session challenge.
#[derive(Debug, Clone)]
pub struct Admission {
    pub sot_incarnation: Option<String>,
    pub coordinator_epoch: Option<u64>,
    /// Database time, RFC 3339.
    pub issued_at: String,
    pub expires_at: String,
}

/// The result of handling one verified frame.
pub struct Handled {
    pub replies: Vec<Outgoing>,
    /// The frame was refused as hostile (another host's lane, a field that contradicts
    /// its chain, …): it counts against the session's invalid-frame budget.
    pub violation: Option<String>,
    /// Work the session may finish after later frames (an effect claim, which nothing
    /// else on the session waits on): run as a task of its own, so it progresses whatever
    /// the session awaits; its replies are sent and its violation counted when it ends. At
    /// most `MAX_DEFERRED` run at once per session (below the store's pool size, so one host
    /// cannot take every connection); the session reads no further frame while that many
    /// are in flight. One still running when its session ends is finished all the same
    /// (its transition completes; only its reply is lost, and the host asks again).
    pub deferred: Option<BoxFuture<'static, Handled>>,
}

/// Deferred handlings in flight on one session at once.
pub const MAX_DEFERRED: usize = 16;

impl Handled {
    pub fn reply(replies: Vec<Outgoing>) -> Self {
        Self {
            replies,
            violation: None,
            deferred: None,
        }
    }

    /// Nothing now; `work` is finished by the session after later frames.
    pub fn defer(work: BoxFuture<'static, Handled>) -> Self {
        Self {
            replies: vec![],
            violation: None,
            deferred: Some(work),
        }
    }
}

impl Default for Handled {
    fn default() -> Self {
        Self::reply(vec![])
    }
}

/// What the server does with sessions and their verified envelopes.
pub trait Handler: Send + Sync + 'static {
    /// Decides whether `peer` (the TLS principal) may open a session at all — before any
    /// WebSocket or challenge work. A refusal closes the connection with the reason.
    fn admit(&self, peer: &str) -> BoxFuture<'static, Result<Admission, Refusal>>;

    /// The peer answered the challenge with a valid hello: the session is live. A refusal
    /// closes it. Called before the hello is handled.
    fn open(
        &self,
        session: SessionHandle,
        hello: &Envelope<Verified>,
    ) -> BoxFuture<'static, Result<(), Refusal>>;

    fn handle(&self, peer: String, env: Envelope<Verified>) -> BoxFuture<'static, Handled>;

    /// The session ended (`abusive`: it was closed for exceeding its limits).
    fn closed(&self, _peer: &str, _session_id: &str, _reason: &CloseReason) {}
}

/// Called with the reason of every strike against a session.
pub type StrikeHook = Arc<dyn Fn(&Violation) + Send + Sync>;

/// Where the server reports rejections (category + redacted detail, never frame content).
pub type AuditSink = Arc<dyn Fn(&str, &Violation, &str) + Send + Sync>;

#[derive(Clone)]
pub struct ServerParams {
    /// Read at every verification: a reload or a revocation applies to live sessions.
    pub registry: crate::protocol::LiveRegistry,
    /// The server's own principal: every envelope must be addressed to it.
    pub audience: String,
    pub trust_domain: String,
    pub audit: AuditSink,
    /// Signs the session challenge (the coordinator's session key).
    pub signer: Arc<Signer>,
    pub liveness: Liveness,
    pub limits: Limits,
    /// Called for every strike against a session (each invalid frame, by reason) — the
    /// audit sees only the first few of each.
    pub on_strike: Option<StrikeHook>,
}

/// Connections between TCP accept and a verified hello, at most — and from one source
/// address. A source holding connections open without finishing them (slowloris) runs
/// out of its own slots, not everyone's; each stage of a handshake has its own deadline.
pub(super) const MAX_HANDSHAKES: usize = 512;
pub(super) const MAX_HANDSHAKES_PER_SOURCE: usize = 32;
/// TLS and WebSocket handshakes are fast or hostile.
pub(super) const TLS_TIMEOUT: Duration = Duration::from_secs(5);

/// Handshakes in flight per source address.
#[derive(Default)]
pub(super) struct InFlight {
    per_source: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One handshake's claim on the global and the per-source budget, released when the
/// session is established or ends.
pub(super) struct HandshakeSlot {
    _global: tokio::sync::OwnedSemaphorePermit,
    ip: std::net::IpAddr,
    in_flight: Arc<InFlight>,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.in_flight.per_source.lock() {
            if let Some(n) = m.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&self.ip);
                }
            }
        }
    }
}

impl InFlight {
    /// Claims a per-source slot, or `None` when the source has too many in flight.
    pub(super) fn claim(
        self: &Arc<Self>,
        ip: std::net::IpAddr,
        global: tokio::sync::OwnedSemaphorePermit,
    ) -> Option<HandshakeSlot> {
        let mut m = self.per_source.lock().ok()?;
        let n = m.entry(ip).or_insert(0);
        if *n >= MAX_HANDSHAKES_PER_SOURCE {
            return None;
        }
        *n += 1;
        Some(HandshakeSlot {
            _global: global,
            ip,
            in_flight: self.clone(),
        })
    }
}

/// Refused connections are audited once per source per window, with a count of those
/// left out: a reconnect storm (or anyone able to open TCP connections) costs a counter,
/// not an audit row and a log line each.
pub(super) struct RefusalAudit {
    windows: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>,
}

impl RefusalAudit {
    const WINDOW: Duration = Duration::from_secs(10);
    const MAX_SOURCES: usize = 4096;

    pub(super) fn new() -> Self {
        Self {
            windows: Default::default(),
        }
    }

    /// Whether to audit a refusal from `source` now; `Some(n)` with `n` refusals left out
    /// since the last audited one.
    pub(super) fn admit(&self, source: &str) -> Option<u64> {
        let Ok(mut m) = self.windows.lock() else {
            return Some(0);
        };
        let now = std::time::Instant::now();
        if m.len() >= Self::MAX_SOURCES {
            m.retain(|_, (at, _)| now.duration_since(*at) < Self::WINDOW);
        }
        match m.get_mut(source) {
            Some((at, left_out)) if now.duration_since(*at) < Self::WINDOW => {
                *left_out += 1;
                None
            }
            Some((at, left_out)) => {
                let n = *left_out;
                *at = now;
                *left_out = 0;
                Some(n)
            }
            None => {
                m.insert(source.to_string(), (now, 0));
                Some(0)
            }
        }
    }
}

/// Serves sessions until `shutdown` flips to true; sessions end with it.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    params: ServerParams,
    handler: Arc<dyn Handler>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), TransportError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let in_flight = Arc::new(InFlight::default());
    let refusals = Arc::new(RefusalAudit::new());
    // Every connection's task, so a shutdown lets each session send its close frame and
    // read the peer's (bounded) before the process goes: a task dropped mid-close resets
    // the socket, and the host saw "connection reset" instead of why.
    let mut sessions = tokio::task::JoinSet::new();
    loop {
        let (tcp, addr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(a) => a,
                // Out of descriptors (a connection flood): the listener stays.
                Err(e) => {
                    tokio::select! {
                        _ = crate::util::accept_refused("host sessions", &e) => continue,
                        _ = crate::util::shutdown_signalled(&mut shutdown) => break,
                    }
                }
            },
            Some(_) = sessions.join_next(), if !sessions.is_empty() => continue,
            _ = crate::util::shutdown_signalled(&mut shutdown) => break,
        };
        // A connection flood waits here rather than growing memory without bound.
        let global = tokio::select! {
            p = handshakes.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = crate::util::shutdown_signalled(&mut shutdown) => break,
        };
        let Some(permit) = in_flight.claim(addr.ip(), global) else {
            let source = addr.ip().to_string();
            if let Some(left_out) = refusals.admit(&source) {
                (params.audit)(
                    &source,
                    &Violation::SessionRefused,
                    &format!("more than {MAX_HANDSHAKES_PER_SOURCE} unfinished handshakes from {source} ({left_out} more refusals not audited)"),
                );
            }
            drop(tcp);
            continue;
        };
        let (acceptor, params, handler, shutdown, refusals) = (
            acceptor.clone(),
            params.clone(),
            handler.clone(),
            shutdown.clone(),
            refusals.clone(),
        );
        // Envelopes are small and each one waits for an answer: Nagle's algorithm would hold
        // a frame written behind an unacknowledged one for the peer's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        sessions.spawn(async move {
            if let Err((peer, e)) = session(tcp, acceptor, &params, handler, shutdown, permit).await
            {
                // Keyed by principal once TLS named one, else by source address.
                let source = peer.unwrap_or_else(|| addr.ip().to_string());
                if let Some(left_out) = refusals.admit(&source) {
                    let detail = if left_out > 0 {
                        format!("{e} ({left_out} more refusals of {source} not audited)")
                    } else {
                        e.to_string()
                    };
                    (params.audit)(&source, &Violation::SessionRefused, &detail);
                }
            }
        });
    }
    closing(sessions).await;
    Ok(())
}

/// How long a shutdown waits for its sessions' closes: each sends its close frame (up to
/// the liveness interval) and reads until the peer's (up to `CLOSE_DRAIN`).
const SHUTDOWN_CLOSE: Duration = Duration::from_secs(5);

/// Waits for every session to finish closing, for at most `SHUTDOWN_CLOSE`; what is left is
/// dropped.
async fn closing(mut sessions: tokio::task::JoinSet<()>) {
    let _ = tokio::time::timeout(SHUTDOWN_CLOSE, async {
        while sessions.join_next().await.is_some() {}
    })
    .await;
}

/// The host's offset from the coordinator's database time: its `host_clock` against the
/// database time of the admission (`db_at`) plus the time since. `None` if either is not
/// an RFC 3339 time.
fn host_offset(host_clock: &str, db_at: &str, since: Duration) -> Option<i64> {
    let host = unix_ms(humantime::parse_rfc3339(host_clock).ok()?);
    let db = unix_ms(humantime::parse_rfc3339(db_at).ok()?) + since.as_millis() as i128;
    Some((host - db).clamp(i64::MIN as i128, i64::MAX as i128) as i64)
}

pub(super) fn close_frame(
    reason: &str,
) -> Option<tokio_tungstenite::tungstenite::protocol::CloseFrame> {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    // A close reason is at most 123 bytes.
    let mut r = reason.to_string();
    while r.len() > 120 {
        r.pop();
    }
    Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: CloseCode::Policy,
        reason: r.into(),
    })
}

/// How a session ended.
pub(super) enum Ended {
    Closed(CloseReason),
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn session(
    tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    params: &ServerParams,
    handler: Arc<dyn Handler>,
    shutdown: watch::Receiver<bool>,
    permit: HandshakeSlot,
) -> Result<(), (Option<String>, TransportError)> {
    let tls = tokio::time::timeout(TLS_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| (None, TransportError::Timeout("TLS handshake")))?
        .map_err(|e| (None, e.into()))?;
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| crate::pki::principal_of(c))
        .ok_or((None, TransportError::NoPrincipal))?;
    admitted(tls, &peer, params, handler, shutdown, permit)
        .await
        .map_err(|e| (Some(peer), e))
}

/// The rest of a session once TLS named its peer.
pub(super) async fn admitted(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    peer: &str,
    params: &ServerParams,
    handler: Arc<dyn Handler>,
    mut shutdown: watch::Receiver<bool>,
    permit: HandshakeSlot,
) -> Result<(), TransportError> {
    let peer = peer.to_string();
    let admission = handler.admit(&peer).await;
    // `issued_at` is database time at this instant: with the time since, the coordinator's
    // estimate of database time when the hello arrives.
    let admitted_at = std::time::Instant::now();
    let mut ws = tokio::time::timeout(
        TLS_TIMEOUT,
        tokio_tungstenite::accept_async_with_config(tls, Some(ws_config())),
    )
    .await
    .map_err(|_| TransportError::Timeout("websocket handshake"))?
    .map_err(|e| TransportError::Ws(e.to_string()))?;
    let admission = match admission {
        Ok(a) => a,
        Err(reason) => {
            let reason = reason.to_string();
            let _ = ws.close(close_frame(&reason)).await;
            return Err(TransportError::Refused(format!("{peer}: {reason}")));
        }
    };
    // The challenge: a fresh session id the hello must name, so a hello recorded on any
    // other connection is worthless here.
    let session_id = fresh_session_id()?;
    let mut seq = Sequencer::new(&session_id);
    let mut guard = ReplayGuard::new(&session_id);
    let challenge = seq.seal(
        Outgoing::new(
            &params.signer,
            MessageType::SessionChallenge,
            vec![
                ("idempotency_key", s(&format!("session/{session_id}"))),
                (
                    "sot_incarnation",
                    admission
                        .sot_incarnation
                        .as_deref()
                        .map(s)
                        .unwrap_or(Value::Null),
                ),
                (
                    "coordinator_epoch",
                    admission
                        .coordinator_epoch
                        .map(crate::protocol::envelope::n)
                        .unwrap_or(Value::Null),
                ),
                ("assignment_id", Value::Null),
                ("session_id", s(&session_id)),
                ("issued_at", s(&admission.issued_at)),
                ("expires_at", s(&admission.expires_at)),
            ],
        ),
        &peer,
    )?;
    send_text(&mut ws, challenge).await?;
    let first = tokio::time::timeout(TLS_TIMEOUT, ws.next())
        .await
        .map_err(|_| TransportError::Timeout("hello"))?;
    let hello = match first {
        Some(Ok(Message::Text(t))) => verify(
            t.as_bytes(),
            &VerifyContext {
                registry: &params.registry.current(),
                audience: &params.audience,
                trust_domain: &params.trust_domain,
                now: SystemTime::now(),
            },
        )
        .map_err(|e| TransportError::Refused(format!("hello: {}", e.category())))?,
        // A host that will not open this session says why (its clock, its authority fence).
        Some(Ok(Message::Close(Some(f)))) => {
            return Err(TransportError::Refused(format!(
                "the host closed before its hello: {}",
                f.reason
            )))
        }
        _ => {
            return Err(TransportError::Refused(
                "first frame was not a text hello".into(),
            ))
        }
    };
    let refuse = |why: String| TransportError::Refused(why);
    if hello.message_type() != MessageType::Hello || hello.issuer() != peer {
        let _ = ws.close(close_frame("hello refused")).await;
        return Err(refuse(format!(
            "hello issuer {:?} is not the TLS peer {peer:?}",
            hello.issuer()
        )));
    }
    if hello.session_id() != Some(session_id.as_str()) {
        let _ = ws.close(close_frame("hello refused")).await;
        return Err(refuse(
            "the hello does not answer this connection's session challenge (replayed?)".into(),
        ));
    }
    if let Err(why) = guard.check(hello.message_id()) {
        let _ = ws.close(close_frame("hello refused")).await;
        return Err(refuse(format!("hello message id: {why}")));
    }
    let clock_offset_ms = match hello.get("host_clock") {
        Some(Value::Str(at)) => {
            let skew = host_offset(at, &admission.issued_at, admitted_at.elapsed())
                .map(|host_ahead_ms| super::ClockSkew {
                    host_ahead_ms,
                    tolerance_ms: params.limits.max_clock_skew_ms,
                })
                .ok_or_else(|| refuse("hello: host_clock is not an RFC 3339 time".into()))?;
            if skew.beyond_tolerance() {
                let _ = ws.close(close_frame(&skew.close_reason())).await;
                return Err(TransportError::ClockSkew(skew));
            }
            Some(skew.host_ahead_ms)
        }
        _ => None,
    };
    let (push, mut pushed) = tokio::sync::mpsc::channel::<Outgoing>(params.limits.queue);
    let handle = SessionHandle {
        peer: peer.clone(),
        session_id: session_id.clone(),
        push,
        last_frame: Arc::new(std::sync::atomic::AtomicU64::new(mono_ms())),
        clock_offset_ms,
        close: Arc::new(tokio::sync::Notify::new()),
        close_reason: Arc::new(std::sync::Mutex::new(None)),
    };
    if let Err(reason) = handler.open(handle.clone(), &hello).await {
        let reason = reason.to_string();
        let _ = ws.close(close_frame(&reason)).await;
        return Err(refuse(format!("{peer}: {reason}")));
    }
    // The session is established: it no longer counts as a handshake.
    drop(permit);
    let ended = run_session(
        &mut ws,
        params,
        &handler,
        &handle,
        hello,
        &mut seq,
        &mut guard,
        &mut pushed,
        &mut shutdown,
    )
    .await;
    let reason = match ended {
        Ok(Ended::Closed(r)) => r,
        Err(e) => CloseReason::Transport(e.to_string()),
    };
    // A reason already given to the handle (a replacing session's, a shutdown's) wins, so
    // the peer, the log and the database all see the one decision.
    let reason = handle.close_for(reason);
    let text = reason.to_string();
    if reason.abusive() {
        (params.audit)(&peer, &Violation::SessionClosedAbusive, &text);
    }
    let _ = tokio::time::timeout(params.liveness.interval, ws.close(close_frame(&text))).await;
    // The session is over for everyone at once; the drain is only the socket's.
    handler.closed(&peer, &session_id, &reason);
    drain(&mut ws).await;
    Ok(())
}
