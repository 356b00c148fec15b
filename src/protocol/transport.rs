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

use std::net::SocketAddr;
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
    WebSocketConfig::default()
        .max_message_size(Some(MAX_ENVELOPE_BYTES * 4))
        .max_frame_size(Some(MAX_ENVELOPE_BYTES * 4))
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the server does with verified envelopes. Returns frames to send back.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, peer: String, env: Envelope<Verified>) -> BoxFuture<'static, Vec<Vec<u8>>>;

    /// Decides whether a verified hello from `peer` may open a session (a standby
    /// coordinator, for one, refuses). A refusal closes the connection with the reason.
    fn admit(
        &self,
        _peer: &str,
        _hello: &Envelope<Verified>,
    ) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    /// A session for `peer` passed its handshake; `push` sends frames to it unprompted
    /// until the session ends (then sends fail). Called before the hello is handled.
    fn opened(&self, _peer: &str, _session_id: &str, _push: tokio::sync::mpsc::Sender<Vec<u8>>) {}
}

/// Where the server reports rejections (category + redacted detail, never frame content).
pub type AuditSink = Arc<dyn Fn(&str, &str, &str) + Send + Sync>;

#[derive(Clone)]
pub struct ServerParams {
    pub registry: Arc<TrustRegistry>,
    /// The server's own principal: every envelope must be addressed to it.
    pub audience: String,
    pub trust_domain: String,
    pub audit: AuditSink,
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
    loop {
        let (tcp, addr) = tokio::select! {
            r = listener.accept() => r?,
            _ = crate::util::shutdown_signalled(&mut shutdown) => return Ok(()),
        };
        let (acceptor, params, handler, shutdown) = (
            acceptor.clone(),
            params.clone(),
            handler.clone(),
            shutdown.clone(),
        );
        // Envelopes are small and each one waits for an answer: Nagle's algorithm would hold
        // a frame written behind an unacknowledged one for the peer's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            if let Err(e) = session(tcp, addr, acceptor, params.clone(), handler, shutdown).await {
                (params.audit)(&addr.to_string(), "session-refused", &e.to_string());
            }
        });
    }
}

async fn session(
    tcp: TcpStream,
    addr: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    params: ServerParams,
    handler: Arc<dyn Handler>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), TransportError> {
    let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| TransportError::Timeout("TLS handshake"))??;
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| crate::pki::principal_of(c))
        .ok_or(TransportError::NoPrincipal)?;
    let mut ws = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::accept_async_with_config(tls, Some(ws_config())),
    )
    .await
    .map_err(|_| TransportError::Timeout("websocket handshake"))?
    .map_err(|e| TransportError::Ws(e.to_string()))?;
    let ctx = |now| VerifyContext {
        registry: &params.registry,
        audience: &params.audience,
        trust_domain: &params.trust_domain,
        now,
    };
    // Handshake: the first frame is a hello, verified, from the TLS peer's own principal.
    let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, ws.next())
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
    if hello.message_type() != MessageType::Hello || hello.str("issuer") != peer {
        let _ = ws.close(None).await;
        return Err(TransportError::Refused(format!(
            "hello issuer {:?} is not the TLS peer {peer:?}",
            hello.str("issuer")
        )));
    }
    if let Err(reason) = handler.admit(&peer, &hello).await {
        let _ = ws
            .close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
                code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Again,
                reason: reason.clone().into(),
            }))
            .await;
        return Err(TransportError::Refused(reason));
    }
    let (push, mut pushed) = tokio::sync::mpsc::channel::<Vec<u8>>(256);
    handler.opened(&peer, hello.str("session_id"), push);
    for out in handler.handle(peer.clone(), hello).await {
        ws.send(Message::text(String::from_utf8_lossy(&out).into_owned()))
            .await
            .map_err(|e| TransportError::Ws(e.to_string()))?;
    }
    loop {
        let frame = tokio::select! {
            f = ws.next() => f,
            Some(out) = pushed.recv() => {
                ws.send(Message::text(String::from_utf8_lossy(&out).into_owned())).await.map_err(|e| TransportError::Ws(e.to_string()))?;
                continue;
            }
            _ = crate::util::shutdown_signalled(&mut shutdown) => { let _ = ws.close(None).await; return Ok(()); }
        };
        let text = match frame {
            None | Some(Ok(Message::Close(_))) => return Ok(()),
            Some(Err(e)) => return Err(TransportError::Ws(e.to_string())),
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Binary(_))) => {
                (params.audit)(&peer, "binary-frame", &addr.to_string());
                continue;
            }
            Some(Ok(_)) => continue, // ping/pong are answered by tungstenite
        };
        let env = match verify(text.as_bytes(), &ctx(SystemTime::now())) {
            Ok(e) => e,
            Err(e) => {
                // Closes nothing but this frame.
                (params.audit)(&peer, e.category(), &addr.to_string());
                continue;
            }
        };
        if env.str("issuer") != peer {
            (params.audit)(&peer, "issuer-not-peer", env.str("issuer"));
            continue;
        }
        for out in handler.handle(peer.clone(), env).await {
            ws.send(Message::text(String::from_utf8_lossy(&out).into_owned()))
                .await
                .map_err(|e| TransportError::Ws(e.to_string()))?;
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
}

/// The host's hello for `session_id`, naming `lanes` (`lane@incarnation`), their states
/// and the host's runtimes. Sent first on every session, and again on the same session
/// whenever the host's state changes.
pub fn hello_envelope(
    p: &LinkParams,
    session_id: &str,
    lanes: &[String],
    report: &super::report::HostReport,
) -> Result<Vec<u8>, TransportError> {
    let states =
        super::report::to_value(report).map_err(|e| TransportError::Refused(e.to_string()))?;
    p.signer
        .sign(
            MessageType::Hello,
            &p.coordinator,
            vec![
                (
                    "message_id",
                    s(&format!("msg-{}", uuid::Uuid::new_v4().simple())),
                ),
                (
                    "idempotency_key",
                    s(&format!(
                        "hello-{session_id}-{}",
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
            ],
        )
        .map_err(|e| TransportError::Refused(e.to_string()))
}

/// A client session to the coordinator.
pub type Ws = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// Connects, checks the server's principal, and completes the hello exchange.
pub async fn connect(p: &LinkParams, session_id: &str) -> Result<Ws, TransportError> {
    connect_to(p, &p.addr, session_id).await
}

/// Like [`connect`], to `addr` (one of the coordinator's addresses).
pub async fn connect_to(
    p: &LinkParams,
    addr: &str,
    session_id: &str,
) -> Result<Ws, TransportError> {
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
    let hello = hello_envelope(p, session_id, &p.lanes, &p.report)?;
    ws.send(Message::text(String::from_utf8_lossy(&hello).into_owned()))
        .await
        .map_err(|e| TransportError::Ws(e.to_string()))?;
    Ok(ws)
}
