//! The host's side: connecting (with fallback addresses), the verified session challenge,
//! the coordinator's clock as the hello reported it, and the host session's sender.

use super::*;

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
    pub report: crate::protocol::report::HostReport,
    /// `family@version` of every runtime this host can start.
    pub runtimes: Vec<String>,
    pub liveness: Liveness,
    /// The largest clock offset from the coordinator's database time a session is opened
    /// with (`ClockSkew::DEFAULT_TOLERANCE_MS` unless configured).
    pub max_clock_skew_ms: u64,
}

/// The host's view of the coordinator's clock, from the session challenge: coordinator
/// time ≈ host time + `offset`. Good to the challenge's one-way delay, which only ever
/// makes the estimate early (an envelope is judged expired at most that much late).
#[derive(Debug, Clone, Copy)]
pub struct CoordinatorClock {
    ahead_ms: i128,
}

impl CoordinatorClock {
    pub(super) fn from_issued(issued_at: &str) -> Result<Self, TransportError> {
        let at = humantime::parse_rfc3339(issued_at)
            .map_err(|e| TransportError::Refused(format!("challenge issued_at: {e}")))?;
        Ok(Self {
            ahead_ms: unix_ms(at) - unix_ms(SystemTime::now()),
        })
    }

    /// True when `expires_at` (RFC 3339, coordinator time) has passed, or cannot be read.
    pub fn expired(&self, expires_at: &str) -> bool {
        let Ok(at) = humantime::parse_rfc3339(expires_at) else {
            return true;
        };
        unix_ms(SystemTime::now()) + self.ahead_ms >= unix_ms(at)
    }

    /// How far this host's clock is from the coordinator's (positive: the host is ahead).
    /// Good to the challenge's one-way delay.
    pub fn host_ahead_ms(&self) -> i64 {
        (-self.ahead_ms).clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }
}

/// The fields of the host's state report (the hello's, and every later `report`'s).
pub(super) fn state_fields(
    p: &LinkParams,
    session_id: &str,
    lanes: &[String],
    report: &crate::protocol::report::HostReport,
) -> Result<Vec<(&'static str, Value)>, TransportError> {
    let states = crate::protocol::report::to_value(report)
        .map_err(|e| TransportError::Refused(e.to_string()))?;
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
    report: &crate::protocol::report::HostReport,
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
        send_frame(&mut self.ws, bytes).await
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
        || challenge.issuer() != p.coordinator
    {
        return Err(TransportError::Refused(
            "the first frame was not our coordinator's session challenge".into(),
        ));
    }
    let session_id = challenge.session_id().unwrap_or("").to_string();
    let mut guard = ReplayGuard::new(&session_id);
    guard
        .check(challenge.message_id())
        .map_err(|why| TransportError::Refused(format!("session challenge message id: {why}")))?;
    let clock = CoordinatorClock::from_issued(challenge.issued_at().unwrap_or(""))?;
    // The coordinator's database time is the reference: a host too far from it opens no
    // session, and says by how much (the coordinator learns it from the close reason).
    let skew = super::ClockSkew {
        host_ahead_ms: clock.host_ahead_ms(),
        tolerance_ms: p.max_clock_skew_ms,
    };
    if skew.beyond_tolerance() {
        let _ = ws.close(close_frame(&skew.close_reason())).await;
        return Err(TransportError::ClockSkew(skew));
    }
    let mut seq = Sequencer::new(&session_id);
    let mut fields = state_fields(p, &session_id, &p.lanes, &p.report)?;
    fields.push(("host_clock", Value::Str(crate::util::now_rfc3339())));
    let hello = seq.seal(
        Outgoing::new(&p.signer, MessageType::Hello, fields),
        &p.coordinator,
    )?;
    send_text(&mut ws, hello).await?;
    Ok(HostSession {
        ws,
        session_id,
        seq,
        guard,
        clock,
        coordinator_epoch: challenge.coordinator_epoch(),
        sot_incarnation: match challenge.get("sot_incarnation") {
            Some(Value::Str(v)) => Some(v.clone()),
            _ => None,
        },
    })
}
