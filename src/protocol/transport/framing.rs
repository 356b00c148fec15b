//! What both ends of a session share: WebSocket limits, liveness, the outgoing envelope,
//! the per-session sequencer and replay guard, session ids and the monotonic clock.

use super::*;

pub(super) fn ws_config() -> WebSocketConfig {
    // One envelope per message; a larger frame ends the session (it cannot be valid).
    WebSocketConfig::default()
        .max_message_size(Some(MAX_ENVELOPE_BYTES + 1024))
        .max_frame_size(Some(MAX_ENVELOPE_BYTES + 1024))
        .max_write_buffer_size(4 * MAX_ENVELOPE_BYTES)
}

pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The largest offset of a host's clock from the coordinator's database time a session
    /// is opened with (see `ClockSkew`).
    pub max_clock_skew_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            invalid_frames: 16,
            window: Duration::from_secs(60),
            frames_per_second: 200,
            burst: 2000,
            queue: 1024,
            max_clock_skew_ms: super::ClockSkew::DEFAULT_TOLERANCE_MS,
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

    /// A coordinator → host message, from its typed form.
    pub fn to_host(signer: &Arc<Signer>, m: &crate::protocol::messages::ToHost) -> Self {
        Self::new(signer, m.message_type(), m.fields())
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

    pub fn check(&mut self, message_id: &str) -> Result<(), Violation> {
        let n = message_id
            .strip_prefix(self.session_id.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u64>().ok())
            .ok_or(Violation::OtherSession)?;
        if self.last.is_some_and(|l| n <= l) {
            return Err(Violation::Replayed);
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

/// Why a session ended. One value carries the close frame's text, the session row's
/// reason, the metric's kind and whether the host is penalized — never recovered from the
/// text afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// A newer session of the same host replaced this one.
    Superseded { session_epoch: i64 },
    /// The peer sent nothing within the liveness limit.
    Silent { limit_s: u64 },
    /// The peer did not read what it was sent within the liveness limit.
    NotReading { limit_s: u64 },
    /// Its queue of frames to send filled up: the peer does not read.
    QueueFull,
    /// This coordinator no longer leads.
    NotLeader,
    /// This process is shutting down.
    Shutdown,
    /// The peer's key or principal was revoked (`mosaic trust revoke`).
    Revoked(String),
    /// The peer closed the session.
    PeerClosed,
    /// A hostile session: refused hello, too many strikes, a flood, a protocol violation
    /// (the host waits out a penalty before it may connect again).
    Abusive(String),
    /// The network or the TLS/WebSocket layer failed.
    Transport(String),
}

impl CloseReason {
    /// The metric label (`mosaic_coordinator_host_sessions_closed_total{kind}`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Superseded { .. } => "superseded",
            Self::Silent { .. } => "silent",
            Self::NotLeader => "leadership",
            Self::Shutdown => "shutdown",
            Self::PeerClosed => "closed",
            Self::Abusive(_) => "abusive",
            Self::Revoked(_) => "revoked",
            // A peer that does not read is counted with the network's failures.
            Self::NotReading { .. } | Self::QueueFull | Self::Transport(_) => "transport",
        }
    }

    /// Whether the host is penalized for it.
    pub fn abusive(&self) -> bool {
        matches!(self, Self::Abusive(_))
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Superseded { session_epoch } => {
                write!(f, "superseded by session epoch {session_epoch}")
            }
            Self::Silent { limit_s } => write!(f, "peer silent for more than {limit_s} s"),
            Self::NotReading { limit_s } => write!(f, "the peer did not read for {limit_s} s"),
            Self::QueueFull => f.write_str("the host does not read its session (queue full)"),
            Self::NotLeader => {
                f.write_str("this coordinator no longer leads; reconnect to the leader")
            }
            Self::Shutdown => f.write_str("coordinator shutting down"),
            Self::Revoked(subject) => write!(f, "{subject} was revoked"),
            Self::PeerClosed => f.write_str("closed by the peer"),
            Self::Abusive(why) | Self::Transport(why) => f.write_str(why),
        }
    }
}

/// Why the server refused a frame or a session: audited, counted and (for a frame) struck
/// against the session. The text is the audit's and the metric's label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Not a verified envelope: the verifier's category (`too-large`, `bad-signature`, …).
    Unverified(&'static str),
    /// Signed by a principal other than the TLS peer.
    IssuerNotPeer,
    /// A second hello on one session.
    SecondHello,
    /// A message id of another session.
    OtherSession,
    /// A message id at or below one the session already saw.
    Replayed,
    /// A binary WebSocket frame (envelopes are text).
    BinaryFrame,
    /// The handler refused the message as hostile; its reason.
    Hostile(String),
    /// A connection refused before its session began.
    SessionRefused,
    /// A session closed as abusive.
    SessionClosedAbusive,
}

impl Violation {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Unverified(c) => c,
            Self::IssuerNotPeer => "issuer-not-peer",
            Self::SecondHello => "second-hello",
            Self::OtherSession => "other-session",
            Self::Replayed => "replayed",
            Self::BinaryFrame => "binary-frame",
            Self::Hostile(why) => why,
            Self::SessionRefused => "session-refused",
            Self::SessionClosedAbusive => "session-closed-abusive",
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a handler refused a session (the connection is closed with its text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The peer's certificate names no principal this server serves sessions to.
    NotAPeer(String),
    /// This server does not lead: the peer should connect to the one that does.
    NotLeader,
    /// The peer has a live session already, or waits out a penalty or rate limit.
    Busy(String),
    /// The hello does not fit the session it answers.
    BadHello(String),
    /// The server cannot decide now (its database is unavailable).
    Unavailable(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotLeader => {
                f.write_str("this coordinator is standing by; connect to the leader")
            }
            Self::NotAPeer(why)
            | Self::Busy(why)
            | Self::BadHello(why)
            | Self::Unavailable(why) => f.write_str(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CloseReason;

    #[test]
    fn a_close_reason_carries_its_kind_and_penalty() {
        let cases = [
            (
                CloseReason::Superseded { session_epoch: 3 },
                "superseded",
                false,
            ),
            (CloseReason::Silent { limit_s: 15 }, "silent", false),
            (CloseReason::NotReading { limit_s: 15 }, "transport", false),
            (CloseReason::QueueFull, "transport", false),
            (CloseReason::NotLeader, "leadership", false),
            (CloseReason::Shutdown, "shutdown", false),
            (CloseReason::PeerClosed, "closed", false),
            (CloseReason::Abusive("flood".into()), "abusive", true),
            (CloseReason::Transport("reset".into()), "transport", false),
        ];
        for (r, kind, abusive) in cases {
            assert_eq!((r.kind(), r.abusive()), (kind, abusive), "{r}");
            assert!(!r.to_string().is_empty());
        }
        assert_eq!(
            CloseReason::Superseded { session_epoch: 3 }.to_string(),
            "superseded by session epoch 3"
        );
    }
}
