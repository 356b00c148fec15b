//! WebSocket over mutual TLS between supervisors and the coordinator.
//!
//! **Owns:** TLS configuration from `mosaic pki` files (one crypto provider, ring, shared
//! with rcgen and passed explicitly), the session handshake, per-frame verification on the
//! server side, and the host link that delivers receipts until acknowledged.
//!
//! **Never:** accepts a client without a certificate from the configured CA; lets the TLS
//! identity authorize a message by itself (every frame is a verified envelope, and its
//! issuer must also be the TLS peer); lets one malformed frame end a session; logs frame
//! contents.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use super::canonical::Value;
use super::envelope::{s, verify, Envelope, Signer, Verified, VerifyContext, MAX_ENVELOPE_BYTES};
use super::schema::MessageType;
use super::trust::TrustRegistry;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("reading {path}: {detail}")]
    Pem { path: PathBuf, detail: String },
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("peer certificate names no Mosaic principal")]
    NoPrincipal,
    #[error("server is {got:?}, expected {want:?}")]
    WrongServer { got: String, want: String },
    #[error("websocket: {0}")]
    Ws(String),
    #[error("session refused: {0}")]
    Refused(String),
    #[error("timed out during {0}")]
    Timeout(&'static str),
}

/// A TLS identity: the CA to trust, and this side's certificate and key.
#[derive(Debug, Clone)]
pub struct TlsIdentity {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load(
    id: &TlsIdentity,
) -> Result<
    (
        rustls::RootCertStore,
        Vec<CertificateDer<'static>>,
        PrivateKeyDer<'static>,
    ),
    TransportError,
> {
    let pem = |path: &PathBuf, e: &dyn std::fmt::Display| TransportError::Pem {
        path: path.clone(),
        detail: e.to_string(),
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&id.ca).map_err(|e| pem(&id.ca, &e))? {
        roots
            .add(c.map_err(|e| pem(&id.ca, &e))?)
            .map_err(|e| pem(&id.ca, &e))?;
    }
    let certs = CertificateDer::pem_file_iter(&id.cert)
        .map_err(|e| pem(&id.cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(&id.cert, &e))?;
    let key = PrivateKeyDer::from_pem_file(&id.key).map_err(|e| pem(&id.key, &e))?;
    Ok((roots, certs, key))
}

/// Server TLS: a client certificate from the CA is required.
pub fn server_tls(id: &TlsIdentity) -> Result<Arc<rustls::ServerConfig>, TransportError> {
    let (roots, certs, key) = load(id)?;
    let tls = |e: &dyn std::fmt::Display| TransportError::Tls(e.to_string());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| tls(&e))?;
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| tls(&e))?;
    Ok(Arc::new(cfg))
}

/// Client TLS: trusts only the CA, presents this side's certificate.
pub fn client_tls(id: &TlsIdentity) -> Result<Arc<rustls::ClientConfig>, TransportError> {
    let (roots, certs, key) = load(id)?;
    let tls = |e: &dyn std::fmt::Display| TransportError::Tls(e.to_string());
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| tls(&e))?;
    Ok(Arc::new(cfg))
}

fn ws_config() -> WebSocketConfig {
    // One envelope per message; a larger frame ends the session (it cannot be valid).
    WebSocketConfig::default()
        .max_message_size(Some(MAX_ENVELOPE_BYTES + 1024))
        .max_frame_size(Some(MAX_ENVELOPE_BYTES + 1024))
        .max_write_buffer_size(4 * MAX_ENVELOPE_BYTES)
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How each side of a session notices a dead peer: it sends something at least every
/// `interval` (the host a signed `heartbeat`, the coordinator a WebSocket ping) and gives
/// the session up after `limit` without a single frame from the other side.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    pub interval: Duration,
    pub limit: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self::from_heartbeat_ms(None)
    }
}

impl Liveness {
    /// From a heartbeat interval (default 5 s): silent for three intervals is dead.
    pub fn from_heartbeat_ms(heartbeat_ms: Option<u64>) -> Self {
        let interval = Duration::from_millis(heartbeat_ms.unwrap_or(5_000).max(100));
        Self {
            interval,
            limit: interval * 3,
        }
    }
}

/// What one session may cost the server before it is closed.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Frames that fail verification, replay, or are refused as hostile, per `window`.
    pub invalid_frames: u32,
    pub window: Duration,
    /// Sustained frames per second, and the burst above it.
    pub frames_per_second: u32,
    pub burst: u32,
    /// Frames queued for the peer; a session whose peer does not read is closed.
    pub queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            invalid_frames: 16,
            window: Duration::from_secs(60),
            frames_per_second: 200,
            burst: 2000,
            queue: 1024,
        }
    }
}

/// An envelope to send on a session. The session seals it: it adds the message id
/// (`<session_id>.<n>`, `n` strictly increasing) and the audience, and signs it with
/// `signer`. Sealing in one place per session is what makes every message id unique and
/// every replay detectable.
pub struct Outgoing {
    pub signer: Arc<Signer>,
    pub message_type: MessageType,
    pub fields: Vec<(&'static str, Value)>,
}

impl Outgoing {
    pub fn new(
        signer: &Arc<Signer>,
        message_type: MessageType,
        fields: Vec<(&'static str, Value)>,
    ) -> Self {
        Self {
            signer: signer.clone(),
            message_type,
            fields,
        }
    }
}

/// Gives one sender's envelopes their message ids on one session.
pub struct Sequencer {
    session_id: String,
    next: u64,
}

impl Sequencer {
    pub fn new(session_id: &str) -> Self {
        Self {
            session_id: session_id.to_string(),
            next: 0,
        }
    }

    pub fn seal(&mut self, o: Outgoing, audience: &str) -> Result<Vec<u8>, TransportError> {
        let mut fields = o.fields;
        fields.push((
            "message_id",
            s(&format!("{}.{}", self.session_id, self.next)),
        ));
        self.next += 1;
        o.signer
            .sign(o.message_type, audience, fields)
            .map_err(|e| TransportError::Refused(format!("cannot sign: {e}")))
    }
}

/// Accepts a peer's message ids only as `<this session's id>.<n>` with `n` above every
/// earlier one: a frame replayed on the same session, or taken from another session, is
/// refused before anything reads it.
pub struct ReplayGuard {
    session_id: String,
    last: Option<u64>,
}

impl ReplayGuard {
    pub fn new(session_id: &str) -> Self {
        Self {
            session_id: session_id.to_string(),
            last: None,
        }
    }

    pub fn check(&mut self, message_id: &str) -> Result<(), &'static str> {
        let n = message_id
            .strip_prefix(self.session_id.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u64>().ok())
            .ok_or("other-session")?;
        if self.last.is_some_and(|l| n <= l) {
            return Err("replayed");
        }
        self.last = Some(n);
        Ok(())
    }
}

/// 256 random bits, hex: a session id nobody can predict or reuse.
pub fn fresh_session_id() -> Result<String, TransportError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| TransportError::Refused(format!("random source: {e}")))?;
    Ok(format!("sess-{}", hex::encode(b)))
}

/// Milliseconds on a process-local monotonic clock (for liveness stamps shared between
/// tasks).
pub fn mono_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

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
    close: Arc<tokio::sync::Notify>,
    close_reason: Arc<std::sync::Mutex<Option<String>>>,
}

impl SessionHandle {
    /// Ends the session with `reason` (sent to the peer in the close frame).
    pub fn close(&self, reason: &str) {
        if let Ok(mut r) = self.close_reason.lock() {
            r.get_or_insert_with(|| reason.to_string());
        }
        self.close.notify_one();
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
#[derive(Default)]
pub struct Handled {
    pub replies: Vec<Outgoing>,
    /// The frame was refused as hostile (another host's lane, a field that contradicts
    /// its chain, …): it counts against the session's invalid-frame budget.
    pub violation: Option<String>,
}

impl Handled {
    pub fn reply(replies: Vec<Outgoing>) -> Self {
        Self {
            replies,
            violation: None,
        }
    }
}

/// What the server does with sessions and their verified envelopes.
pub trait Handler: Send + Sync + 'static {
    /// Decides whether `peer` (the TLS principal) may open a session at all — before any
    /// WebSocket or challenge work. A refusal closes the connection with the reason.
    fn admit(&self, peer: &str) -> BoxFuture<'static, Result<Admission, String>>;

    /// The peer answered the challenge with a valid hello: the session is live. A refusal
    /// closes it. Called before the hello is handled.
    fn open(
        &self,
        session: SessionHandle,
        hello: &Envelope<Verified>,
    ) -> BoxFuture<'static, Result<(), String>>;

    fn handle(&self, peer: String, env: Envelope<Verified>) -> BoxFuture<'static, Handled>;

    /// The session ended (`abusive`: it was closed for exceeding its limits).
    fn closed(&self, _peer: &str, _session_id: &str, _reason: &str, _abusive: bool) {}
}

/// Called with the reason of every strike against a session.
pub type StrikeHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Where the server reports rejections (category + redacted detail, never frame content).
pub type AuditSink = Arc<dyn Fn(&str, &str, &str) + Send + Sync>;

#[derive(Clone)]
pub struct ServerParams {
    pub registry: Arc<TrustRegistry>,
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
const MAX_HANDSHAKES: usize = 512;
const MAX_HANDSHAKES_PER_SOURCE: usize = 32;
/// TLS and WebSocket handshakes are fast or hostile.
const TLS_TIMEOUT: Duration = Duration::from_secs(5);

/// Handshakes in flight per source address.
#[derive(Default)]
struct InFlight {
    per_source: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One handshake's claim on the global and the per-source budget, released when the
/// session is established or ends.
struct HandshakeSlot {
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
    fn claim(
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
struct RefusalAudit {
    windows: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>,
}

impl RefusalAudit {
    const WINDOW: Duration = Duration::from_secs(10);
    const MAX_SOURCES: usize = 4096;

    fn new() -> Self {
        Self {
            windows: Default::default(),
        }
    }

    /// Whether to audit a refusal from `source` now; `Some(n)` with `n` refusals left out
    /// since the last audited one.
    fn admit(&self, source: &str) -> Option<u64> {
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
    loop {
        let (tcp, addr) = tokio::select! {
            r = listener.accept() => r?,
            _ = crate::util::shutdown_signalled(&mut shutdown) => return Ok(()),
        };
        // A connection flood waits here rather than growing memory without bound.
        let global = tokio::select! {
            p = handshakes.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return Ok(()) },
            _ = crate::util::shutdown_signalled(&mut shutdown) => return Ok(()),
        };
        let Some(permit) = in_flight.claim(addr.ip(), global) else {
            let source = addr.ip().to_string();
            if let Some(left_out) = refusals.admit(&source) {
                (params.audit)(
                    &source,
                    "session-refused",
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
        tokio::spawn(async move {
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
                    (params.audit)(&source, "session-refused", &detail);
                }
            }
        });
    }
}

fn close_frame(reason: &str) -> Option<tokio_tungstenite::tungstenite::protocol::CloseFrame> {
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

/// Counts a session's invalid frames; audits the first few of each reason and the totals.
struct Strikes {
    window_start: std::time::Instant,
    in_window: u32,
    by_reason: std::collections::BTreeMap<String, u64>,
}

impl Strikes {
    const AUDITED_PER_REASON: u64 = 3;

    fn new() -> Self {
        Self {
            window_start: std::time::Instant::now(),
            in_window: 0,
            by_reason: Default::default(),
        }
    }

    /// Records one invalid frame; true when the session is over its budget.
    fn strike(&mut self, p: &ServerParams, peer: &str, session_id: &str, reason: &str) -> bool {
        if let Some(f) = &p.on_strike {
            f(reason);
        }
        let n = self.by_reason.entry(reason.to_string()).or_insert(0);
        *n += 1;
        if *n <= Self::AUDITED_PER_REASON {
            (p.audit)(peer, reason, session_id);
        }
        if self.window_start.elapsed() > p.limits.window {
            self.window_start = std::time::Instant::now();
            self.in_window = 0;
        }
        self.in_window += 1;
        self.in_window > p.limits.invalid_frames
    }

    fn summary(&self) -> Option<String> {
        let total: u64 = self.by_reason.values().sum();
        (total > 0).then(|| {
            let parts: Vec<String> = self
                .by_reason
                .iter()
                .map(|(r, n)| format!("{r}={n}"))
                .collect();
            format!("{total} invalid frames ({})", parts.join(", "))
        })
    }
}

/// A token bucket over all frames of a session.
struct Rate {
    tokens: f64,
    at: std::time::Instant,
}

impl Rate {
    fn allow(&mut self, l: &Limits) -> bool {
        let now = std::time::Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * f64::from(l.frames_per_second);
        self.tokens = (self.tokens + refill).min(f64::from(l.burst));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// How a session ended.
enum Ended {
    Closed(String),
    Abusive(String),
}

#[allow(clippy::too_many_arguments)]
async fn session(
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
async fn admitted(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    peer: &str,
    params: &ServerParams,
    handler: Arc<dyn Handler>,
    mut shutdown: watch::Receiver<bool>,
    permit: HandshakeSlot,
) -> Result<(), TransportError> {
    let peer = peer.to_string();
    let admission = handler.admit(&peer).await;
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
                        .map(super::envelope::n)
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
    let ctx = |now| VerifyContext {
        registry: &params.registry,
        audience: &params.audience,
        trust_domain: &params.trust_domain,
        now,
    };
    let first = tokio::time::timeout(TLS_TIMEOUT, ws.next())
        .await
        .map_err(|_| TransportError::Timeout("hello"))?;
    let hello = match first {
        Some(Ok(Message::Text(t))) => verify(t.as_bytes(), &ctx(SystemTime::now()))
            .map_err(|e| TransportError::Refused(format!("hello: {}", e.category())))?,
        _ => {
            return Err(TransportError::Refused(
                "first frame was not a text hello".into(),
            ))
        }
    };
    let refuse = |why: String| TransportError::Refused(why);
    if hello.message_type() != MessageType::Hello || hello.str("issuer") != peer {
        let _ = ws.close(close_frame("hello refused")).await;
        return Err(refuse(format!(
            "hello issuer {:?} is not the TLS peer {peer:?}",
            hello.str("issuer")
        )));
    }
    if hello.str("session_id") != session_id {
        let _ = ws.close(close_frame("hello refused")).await;
        return Err(refuse(
            "the hello does not answer this connection's session challenge (replayed?)".into(),
        ));
    }
    if let Err(why) = guard.check(hello.str("message_id")) {
        let _ = ws.close(close_frame("hello refused")).await;
        return Err(refuse(format!("hello message id: {why}")));
    }
    let (push, mut pushed) = tokio::sync::mpsc::channel::<Outgoing>(params.limits.queue);
    let handle = SessionHandle {
        peer: peer.clone(),
        session_id: session_id.clone(),
        push,
        last_frame: Arc::new(std::sync::atomic::AtomicU64::new(mono_ms())),
        close: Arc::new(tokio::sync::Notify::new()),
        close_reason: Arc::new(std::sync::Mutex::new(None)),
    };
    if let Err(reason) = handler.open(handle.clone(), &hello).await {
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
    let (reason, abusive) = match &ended {
        Ok(Ended::Closed(r)) => (r.clone(), false),
        Ok(Ended::Abusive(r)) => (r.clone(), true),
        Err(e) => (e.to_string(), false),
    };
    if abusive {
        (params.audit)(&peer, "session-closed-abusive", &reason);
    }
    let _ = tokio::time::timeout(params.liveness.interval, ws.close(close_frame(&reason))).await;
    handler.closed(&peer, &session_id, &reason, abusive);
    Ok(())
}

async fn send_text<S>(ws: &mut S, bytes: Vec<u8>) -> Result<(), TransportError>
where
    S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    let text = String::from_utf8(bytes).map_err(|e| TransportError::Ws(e.to_string()))?;
    ws.send(Message::text(text))
        .await
        .map_err(|e| TransportError::Ws(e.to_string()))
}

#[allow(clippy::too_many_arguments)]
async fn run_session(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_rustls::server::TlsStream<TcpStream>>,
    params: &ServerParams,
    handler: &Arc<dyn Handler>,
    handle: &SessionHandle,
    hello: Envelope<Verified>,
    seq: &mut Sequencer,
    guard: &mut ReplayGuard,
    pushed: &mut tokio::sync::mpsc::Receiver<Outgoing>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Ended, TransportError> {
    let peer = handle.peer.clone();
    let sid = handle.session_id.clone();
    // Every write is bounded by the liveness limit: a peer that stops reading must not
    // freeze this task (its liveness checks, its close, shutdown) behind a full socket.
    let limit = params.liveness.limit;
    // While a write waits for the peer to read, this task reads nothing: that time is not
    // the peer's silence. Silence counts from the later of its last frame and the end of
    // the last write that kept us from listening.
    let mut listening_since = std::time::Instant::now();
    macro_rules! send_or_end {
        ($fut:expr) => {{
            let began = std::time::Instant::now();
            let r = match tokio::time::timeout(limit, $fut).await {
                Ok(r) => r?,
                Err(_) => {
                    return Ok(Ended::Closed(format!(
                        "the peer did not read for {} s",
                        limit.as_secs()
                    )))
                }
            };
            if began.elapsed() >= params.liveness.interval {
                listening_since = std::time::Instant::now();
            }
            r
        }};
    }
    let first = handler.handle(peer.clone(), hello).await;
    for out in first.replies {
        send_or_end!(send_text(ws, seq.seal(out, &peer)?));
    }
    // A hello the handler refused as hostile ends the session it opened.
    if let Some(v) = first.violation {
        return Ok(Ended::Abusive(format!("hello refused: {v}")));
    }
    let ctx = |now| VerifyContext {
        registry: &params.registry,
        audience: &params.audience,
        trust_domain: &params.trust_domain,
        now,
    };
    let mut strikes = Strikes::new();
    let mut rate = Rate {
        tokens: f64::from(params.limits.burst),
        at: std::time::Instant::now(),
    };
    let mut ping = tokio::time::interval(params.liveness.interval);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let over = |strikes: &Strikes, why: &str| {
        Ended::Abusive(match strikes.summary() {
            Some(s) => format!("{why}: {s}"),
            None => why.to_string(),
        })
    };
    loop {
        let frame = tokio::select! {
            f = ws.next() => f,
            Some(out) = pushed.recv() => {
                send_or_end!(send_text(ws, seq.seal(out, &peer)?));
                continue;
            }
            _ = ping.tick() => {
                if handle.silent_for().min(listening_since.elapsed()) > params.liveness.limit {
                    return Ok(Ended::Closed(format!("peer silent for more than {} s", params.liveness.limit.as_secs())));
                }
                send_or_end!(async { ws.send(Message::Ping(Vec::new().into())).await.map_err(|e| TransportError::Ws(e.to_string())) });
                continue;
            }
            _ = handle.close.notified() => {
                let reason = handle.close_reason.lock().ok().and_then(|r| r.clone()).unwrap_or_else(|| "closed".into());
                return Ok(Ended::Closed(reason));
            }
            _ = crate::util::shutdown_signalled(shutdown) => return Ok(Ended::Closed("coordinator shutting down".into())),
        };
        // Frames decoded from TLS buffers never touch the socket, so a flooding peer would
        // otherwise keep this task (and its worker thread) busy without ever yielding.
        tokio::task::coop::consume_budget().await;
        let text = match frame {
            None | Some(Ok(Message::Close(_))) => {
                return Ok(Ended::Closed("closed by the peer".into()))
            }
            Some(Err(e)) => {
                use tokio_tungstenite::tungstenite::Error as WsError;
                // A frame no envelope can be, or a WebSocket protocol violation, is the
                // peer's doing; a reset or EOF is the network's.
                return Ok(match e {
                    WsError::Capacity(_) | WsError::Protocol(_) | WsError::Utf8(_) => {
                        Ended::Abusive(format!("transport: {e}"))
                    }
                    _ => Ended::Closed(format!("transport: {e}")),
                });
            }
            Some(Ok(m)) => {
                handle
                    .last_frame
                    .store(mono_ms(), std::sync::atomic::Ordering::Relaxed);
                if !rate.allow(&params.limits) {
                    return Ok(over(&strikes, "frame rate over the session's limit"));
                }
                match m {
                    Message::Text(t) => t,
                    Message::Binary(_) => {
                        if strikes.strike(params, &peer, &sid, "binary-frame") {
                            return Ok(over(&strikes, "invalid-frame budget exceeded"));
                        }
                        continue;
                    }
                    _ => continue, // ping/pong: liveness only (tungstenite answers pings)
                }
            }
        };
        let verdict = match verify(text.as_bytes(), &ctx(SystemTime::now())) {
            Err(e) => Err(e.category().to_string()),
            Ok(env) if env.str("issuer") != peer => Err("issuer-not-peer".into()),
            Ok(env) if env.message_type() == MessageType::Hello => Err("second-hello".into()),
            Ok(env) if env.get("session_id").is_some() && env.str("session_id") != sid => {
                Err("other-session".into())
            }
            Ok(env) => match guard.check(env.str("message_id")) {
                Err(why) => Err(why.to_string()),
                Ok(()) => Ok(env),
            },
        };
        let env = match verdict {
            Ok(env) => env,
            Err(reason) => {
                if strikes.strike(params, &peer, &sid, &reason) {
                    return Ok(over(&strikes, "invalid-frame budget exceeded"));
                }
                continue;
            }
        };
        let handled = handler.handle(peer.clone(), env).await;
        if let Some(v) = handled.violation {
            if strikes.strike(params, &peer, &sid, &v) {
                return Ok(over(&strikes, "invalid-frame budget exceeded"));
            }
        }
        for out in handled.replies {
            send_or_end!(send_text(ws, seq.seal(out, &peer)?));
        }
    }
}

/// The host's side of the link.
#[derive(Clone)]
pub struct LinkParams {
    pub addr: String,
    /// Tried in turn after `addr` when a session fails (standby coordinators).
    pub fallback_addrs: Vec<String>,
    /// DNS name the coordinator's certificate must carry (e.g. `localhost`).
    pub server_name: String,
    /// The coordinator principal (`coordinator:<name>`), checked against its certificate.
    pub coordinator: String,
    pub tls: Arc<rustls::ClientConfig>,
    /// The host's session key.
    pub signer: Arc<Signer>,
    pub registry: Arc<TrustRegistry>,
    pub trust_domain: String,
    pub host_id: String,
    /// `lane@incarnation` of every live lane.
    pub lanes: Vec<String>,
    /// Each lane's status and live generations (see `protocol::report`).
    pub report: super::report::HostReport,
    /// `family@version` of every runtime this host can start.
    pub runtimes: Vec<String>,
    pub liveness: Liveness,
}

/// The host's view of the coordinator's clock, from the session challenge: coordinator
/// time ≈ host time + `offset`. Good to the challenge's one-way delay, which only ever
/// makes the estimate early (an envelope is judged expired at most that much late).
#[derive(Debug, Clone, Copy)]
pub struct CoordinatorClock {
    ahead_ms: i128,
}

impl CoordinatorClock {
    fn from_issued(issued_at: &str) -> Result<Self, TransportError> {
        let at = humantime::parse_rfc3339(issued_at)
            .map_err(|e| TransportError::Refused(format!("challenge issued_at: {e}")))?;
        let ms = |t: SystemTime| -> i128 {
            match t.duration_since(SystemTime::UNIX_EPOCH) {
                Ok(d) => d.as_millis() as i128,
                Err(e) => -(e.duration().as_millis() as i128),
            }
        };
        Ok(Self {
            ahead_ms: ms(at) - ms(SystemTime::now()),
        })
    }

    /// True when `expires_at` (RFC 3339, coordinator time) has passed, or cannot be read.
    pub fn expired(&self, expires_at: &str) -> bool {
        let Ok(at) = humantime::parse_rfc3339(expires_at) else {
            return true;
        };
        let ms = |t: SystemTime| -> i128 {
            match t.duration_since(SystemTime::UNIX_EPOCH) {
                Ok(d) => d.as_millis() as i128,
                Err(e) => -(e.duration().as_millis() as i128),
            }
        };
        ms(SystemTime::now()) + self.ahead_ms >= ms(at)
    }
}

/// The fields of the host's state report (the hello's, and every later `report`'s).
fn state_fields(
    p: &LinkParams,
    session_id: &str,
    lanes: &[String],
    report: &super::report::HostReport,
) -> Result<Vec<(&'static str, Value)>, TransportError> {
    let states =
        super::report::to_value(report).map_err(|e| TransportError::Refused(e.to_string()))?;
    Ok(vec![
        (
            "idempotency_key",
            s(&format!(
                "state/{session_id}/{}",
                uuid::Uuid::new_v4().simple()
            )),
        ),
        ("sot_incarnation", Value::Null),
        ("coordinator_epoch", Value::Null),
        ("assignment_id", Value::Null),
        ("session_id", s(session_id)),
        ("host_id", s(&p.host_id)),
        ("lanes", Value::Array(lanes.iter().map(|l| s(l)).collect())),
        (
            "runtimes",
            Value::Array(p.runtimes.iter().map(|r| s(r)).collect()),
        ),
        ("lane_states", states),
    ])
}

/// The host's state report for a live session (sent whenever that state changes).
pub fn report_outgoing(
    p: &LinkParams,
    session_id: &str,
    lanes: &[String],
    report: &super::report::HostReport,
) -> Result<Outgoing, TransportError> {
    Ok(Outgoing::new(
        &p.signer,
        MessageType::Report,
        state_fields(p, session_id, lanes, report)?,
    ))
}

/// A client session to the coordinator.
pub type Ws = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// One established host session: the socket, this session's id, the sequencer for the
/// host's own envelopes, the guard over the coordinator's, and the coordinator's clock.
pub struct HostSession {
    pub ws: Ws,
    pub session_id: String,
    pub seq: Sequencer,
    pub guard: ReplayGuard,
    pub clock: CoordinatorClock,
    /// The coordinator's epoch and timeline when it issued the challenge.
    pub coordinator_epoch: Option<u64>,
    pub sot_incarnation: Option<String>,
}

impl HostSession {
    /// Seals and sends one envelope.
    pub async fn send(&mut self, o: Outgoing, audience: &str) -> Result<(), TransportError> {
        let bytes = self.seq.seal(o, audience)?;
        send_text(&mut self.ws, bytes).await
    }
}

/// Connects, checks the server's principal, answers its session challenge with the hello.
pub async fn connect(p: &LinkParams) -> Result<HostSession, TransportError> {
    connect_to(p, &p.addr).await
}

/// Opens a connection to `addr` and reads the coordinator's first frame, its session
/// challenge (verified), without answering it. [`connect_to`] answers it with the hello.
pub async fn open(p: &LinkParams, addr: &str) -> Result<(Ws, Envelope<Verified>), TransportError> {
    let tcp = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| TransportError::Timeout("connect"))??;
    // No Nagle: see `serve`.
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(p.server_name.clone())
        .map_err(|e| TransportError::Tls(e.to_string()))?;
    let tls = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsConnector::from(p.tls.clone()).connect(name, tcp),
    )
    .await
    .map_err(|_| TransportError::Timeout("TLS handshake"))??;
    let server = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| crate::pki::principal_of(c))
        .ok_or(TransportError::NoPrincipal)?;
    if server != p.coordinator {
        return Err(TransportError::WrongServer {
            got: server,
            want: p.coordinator.clone(),
        });
    }
    let url = format!("wss://{}/mosaic/v1", p.server_name);
    let (mut ws, _) = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::client_async_with_config(url, tls, Some(ws_config())),
    )
    .await
    .map_err(|_| TransportError::Timeout("websocket handshake"))?
    .map_err(|e| TransportError::Ws(e.to_string()))?;
    // The coordinator speaks first: its challenge, or a close frame with the reason it
    // refuses this session.
    let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, ws.next())
        .await
        .map_err(|_| TransportError::Timeout("session challenge"))?;
    let challenge = match first {
        Some(Ok(Message::Text(t))) => {
            let ctx = VerifyContext {
                registry: &p.registry,
                audience: &p.signer.principal,
                trust_domain: &p.trust_domain,
                now: SystemTime::now(),
            };
            verify(t.as_bytes(), &ctx)
                .map_err(|e| TransportError::Refused(format!("session challenge: {e}")))?
        }
        Some(Ok(Message::Close(Some(f)))) => {
            return Err(TransportError::Refused(f.reason.to_string()))
        }
        _ => {
            return Err(TransportError::Refused(
                "the coordinator sent no session challenge".into(),
            ))
        }
    };
    Ok((ws, challenge))
}

/// Like [`connect`], to `addr` (one of the coordinator's addresses).
pub async fn connect_to(p: &LinkParams, addr: &str) -> Result<HostSession, TransportError> {
    connect_checked(p, addr, &|_| Ok(())).await
}

/// Like [`connect_to`], but `check` judges the (verified) session challenge before the
/// hello is sent: a host that will not answer to this coordinator opens no session.
pub async fn connect_checked(
    p: &LinkParams,
    addr: &str,
    check: &(dyn Fn(&Envelope<Verified>) -> Result<(), String> + Sync),
) -> Result<HostSession, TransportError> {
    let (mut ws, challenge) = open(p, addr).await?;
    if let Err(why) = check(&challenge) {
        let _ = ws.close(close_frame(&why)).await;
        return Err(TransportError::Refused(why));
    }
    if challenge.message_type() != MessageType::SessionChallenge
        || challenge.str("issuer") != p.coordinator
    {
        return Err(TransportError::Refused(
            "the first frame was not our coordinator's session challenge".into(),
        ));
    }
    let session_id = challenge.str("session_id").to_string();
    let mut guard = ReplayGuard::new(&session_id);
    guard
        .check(challenge.str("message_id"))
        .map_err(|why| TransportError::Refused(format!("session challenge message id: {why}")))?;
    let clock = CoordinatorClock::from_issued(challenge.str("issued_at"))?;
    let mut seq = Sequencer::new(&session_id);
    let hello = seq.seal(
        Outgoing::new(
            &p.signer,
            MessageType::Hello,
            state_fields(p, &session_id, &p.lanes, &p.report)?,
        ),
        &p.coordinator,
    )?;
    send_text(&mut ws, hello).await?;
    Ok(HostSession {
        ws,
        session_id,
        seq,
        guard,
        clock,
        coordinator_epoch: challenge.uint("coordinator_epoch"),
        sot_incarnation: match challenge.get("sot_incarnation") {
            Some(Value::Str(v)) => Some(v.clone()),
            _ => None,
        },
    })
}
