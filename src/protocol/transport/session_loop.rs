//! A session's loop once admitted: frames read, verified and handled in order (effect work
//! deferred to tasks of its own), pushed messages sent, liveness pinged, invalid frames
//! counted against the session's budget, a token bucket over every frame.

use super::server::*;
use super::*;

/// One session's deferred handlings, each a task; left to finish when the session ends.
struct Deferred(tokio::task::JoinSet<Handled>);

impl Drop for Deferred {
    fn drop(&mut self) {
        self.0.detach_all();
    }
}

/// Counts a session's invalid frames; audits the first few of each reason and the totals.
pub(super) struct Strikes {
    window_start: std::time::Instant,
    in_window: u32,
    by_reason: std::collections::BTreeMap<String, u64>,
}

impl Strikes {
    const AUDITED_PER_REASON: u64 = 3;

    pub(super) fn new() -> Self {
        Self {
            window_start: std::time::Instant::now(),
            in_window: 0,
            by_reason: Default::default(),
        }
    }

    /// Records one invalid frame; true when the session is over its budget.
    pub(super) fn strike(
        &mut self,
        p: &ServerParams,
        peer: &str,
        session_id: &str,
        reason: &Violation,
    ) -> bool {
        if let Some(f) = &p.on_strike {
            f(reason);
        }
        let n = self
            .by_reason
            .entry(reason.as_str().to_string())
            .or_insert(0);
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

    pub(super) fn summary(&self) -> Option<String> {
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
pub(super) struct Rate {
    tokens: f64,
    at: std::time::Instant,
}

impl Rate {
    pub(super) fn allow(&mut self, l: &Limits) -> bool {
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

/// How long a closed session's peer may go on sending before its socket is dropped.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

/// How many frames, and bytes, a closed session's peer may send before its socket is
/// dropped. A peer that reads sends its own close after at most what it had in flight (a
/// host's burst is bounded by its outbox: about a receipt per lane); a flood does not stop,
/// and reading (decrypting) it for the whole of `CLOSE_DRAIN` cost the coordinator ~900 000
/// frames per abusive session in the fleet bench's flood. Past either bound the socket is
/// reset: a peer that was not reading loses the close frame, and a host resends what was
/// not acknowledged (receipts are idempotent by key).
pub(super) const CLOSE_DRAIN_FRAMES: usize = 1024;
pub(super) const CLOSE_DRAIN_BYTES: usize = 4 << 20;

/// After our close frame, reads (and drops) what the peer still sends until it closes too,
/// for at most `CLOSE_DRAIN`, `CLOSE_DRAIN_FRAMES` and `CLOSE_DRAIN_BYTES`. A socket closed
/// with unread input is reset, and the reset can destroy the close frame — and the reason
/// it carries — before the peer has read it: a peer sending a few frames more would then
/// see "broken pipe" instead of why it was closed.
pub(super) async fn drain<S>(ws: &mut S)
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let _ = tokio::time::timeout(CLOSE_DRAIN, async {
        let (mut frames, mut bytes) = (CLOSE_DRAIN_FRAMES, CLOSE_DRAIN_BYTES);
        while frames > 0 && bytes > 0 {
            let Some(Ok(m)) = ws.next().await else { break };
            frames -= 1;
            bytes = bytes.saturating_sub(m.len());
        }
    })
    .await;
}

pub(super) async fn send_text<S>(ws: &mut S, bytes: Vec<u8>) -> Result<(), TransportError>
where
    S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    let text = String::from_utf8(bytes).map_err(|e| TransportError::Ws(e.to_string()))?;
    ws.send(Message::text(text))
        .await
        .map_err(|e| TransportError::Ws(e.to_string()))
}

/// A session frame: sent once — twice, byte for byte, under the fault matrix's
/// `dup-frames` failpoint (a network that duplicates what it carries), or late, under
/// `delay-frames=return(MS)` (a slow network); never in a release build.
pub(super) async fn send_frame<S>(ws: &mut S, bytes: Vec<u8>) -> Result<(), TransportError>
where
    S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    #[cfg(feature = "failpoints")]
    {
        let dup = (|| {
            fail::fail_point!("dup-frames", |_| true);
            false
        })();
        static DUP_SAID: std::sync::Once = std::sync::Once::new();
        static DELAY_SAID: std::sync::Once = std::sync::Once::new();
        if dup {
            DUP_SAID.call_once(|| {
                tracing::warn!(
                    failpoint = "dup-frames",
                    "failpoint: every session frame is sent twice"
                )
            });
            send_text(ws, bytes.clone()).await?;
        }
        let delay: Option<u64> = (|| {
            fail::fail_point!("delay-frames", |ms: Option<String>| ms
                .and_then(|m| m.parse().ok()));
            None
        })();
        if let Some(ms) = delay {
            DELAY_SAID.call_once(|| {
                tracing::warn!(
                    failpoint = "delay-frames",
                    ms,
                    "failpoint: every session frame is sent late"
                )
            });
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
    send_text(ws, bytes).await
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_session(
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
                    return Ok(Ended::Closed(CloseReason::NotReading {
                        limit_s: limit.as_secs(),
                    }))
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
        send_or_end!(send_frame(ws, seq.seal(out, &peer)?));
    }
    // A hello the handler refused as hostile ends the session it opened.
    if let Some(v) = first.violation {
        return Ok(Ended::Closed(CloseReason::Abusive(format!(
            "hello refused: {v}"
        ))));
    }
    let mut strikes = Strikes::new();
    let mut rate = Rate {
        tokens: f64::from(params.limits.burst),
        at: std::time::Instant::now(),
    };
    let mut ping = tokio::time::interval(params.liveness.interval);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let over = |strikes: &Strikes, why: &str| {
        Ended::Closed(CloseReason::Abusive(match strikes.summary() {
            Some(s) => format!("{why}: {s}"),
            None => why.to_string(),
        }))
    };
    let mut deferred = Deferred(tokio::task::JoinSet::new());
    loop {
        let frame = tokio::select! {
            f = ws.next(), if deferred.0.len() < MAX_DEFERRED => f,
            Some(done) = deferred.0.join_next(), if !deferred.0.is_empty() => {
                let done: Handled = match done {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::error!(peer = %peer, error = %e, "a deferred handling ended without an answer");
                        continue;
                    }
                };
                if let Some(v) = done.violation {
                    if strikes.strike(params, &peer, &sid, &Violation::Hostile(v)) {
                        return Ok(over(&strikes, "invalid-frame budget exceeded"));
                    }
                }
                for out in done.replies {
                    send_or_end!(send_frame(ws, seq.seal(out, &peer)?));
                }
                continue;
            }
            Some(out) = pushed.recv() => {
                send_or_end!(send_frame(ws, seq.seal(out, &peer)?));
                continue;
            }
            _ = ping.tick() => {
                if handle.silent_for().min(listening_since.elapsed()) > params.liveness.limit {
                    return Ok(Ended::Closed(CloseReason::Silent { limit_s: params.liveness.limit.as_secs() }));
                }
                send_or_end!(async { ws.send(Message::Ping(Vec::new().into())).await.map_err(|e| TransportError::Ws(e.to_string())) });
                continue;
            }
            _ = handle.close.notified() => {
                let reason = handle.close_reason.lock().ok().and_then(|r| r.clone())
                    .unwrap_or_else(|| CloseReason::Transport("closed".into()));
                return Ok(Ended::Closed(reason));
            }
            _ = crate::util::shutdown_signalled(shutdown) => return Ok(Ended::Closed(CloseReason::Shutdown)),
        };
        // Frames decoded from TLS buffers never touch the socket, so a flooding peer would
        // otherwise keep this task (and its worker thread) busy without ever yielding.
        tokio::task::coop::consume_budget().await;
        let text = match frame {
            None | Some(Ok(Message::Close(_))) => {
                return Ok(Ended::Closed(CloseReason::PeerClosed))
            }
            Some(Err(e)) => {
                use tokio_tungstenite::tungstenite::Error as WsError;
                // A frame no envelope can be, or a WebSocket protocol violation, is the
                // peer's doing; a reset or EOF is the network's.
                return Ok(match e {
                    WsError::Capacity(_) | WsError::Protocol(_) | WsError::Utf8(_) => {
                        Ended::Closed(CloseReason::Abusive(format!("transport: {e}")))
                    }
                    _ => Ended::Closed(CloseReason::Transport(format!("transport: {e}"))),
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
                        if strikes.strike(params, &peer, &sid, &Violation::BinaryFrame) {
                            return Ok(over(&strikes, "invalid-frame budget exceeded"));
                        }
                        continue;
                    }
                    _ => continue, // ping/pong: liveness only (tungstenite answers pings)
                }
            }
        };
        let verdict = match verify(
            text.as_bytes(),
            &VerifyContext {
                registry: &params.registry.current(),
                audience: &params.audience,
                trust_domain: &params.trust_domain,
                now: SystemTime::now(),
            },
        ) {
            Err(e) => Err(Violation::Unverified(e.category())),
            Ok(env) if env.issuer() != peer => Err(Violation::IssuerNotPeer),
            Ok(env) if env.message_type() == MessageType::Hello => Err(Violation::SecondHello),
            Ok(env) if env.session_id().is_some_and(|s| s != sid) => Err(Violation::OtherSession),
            Ok(env) => match guard.check(env.message_id()) {
                Err(why) => Err(why),
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
        if let Some(work) = handled.deferred {
            deferred.0.spawn(work);
        }
        if let Some(v) = handled.violation {
            if strikes.strike(params, &peer, &sid, &Violation::Hostile(v)) {
                return Ok(over(&strikes, "invalid-frame budget exceeded"));
            }
        }
        for out in handled.replies {
            send_or_end!(send_frame(ws, seq.seal(out, &peer)?));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flooding peer's frames after our close are read only up to the bound: the rest
    /// is left for the socket's reset.
    #[tokio::test]
    async fn a_closed_sessions_drain_stops_at_its_frame_bound() {
        let sent = CLOSE_DRAIN_FRAMES * 10;
        let mut flood =
            futures_util::stream::iter((0..sent).map(|_| Ok(Message::text("{\"junk\":1}"))));
        drain(&mut flood).await;
        let left = flood.count().await;
        assert_eq!(sent - left, CLOSE_DRAIN_FRAMES, "frames read by the drain");
    }

    /// Large frames are cut by bytes before the frame bound.
    #[tokio::test]
    async fn a_closed_sessions_drain_stops_at_its_byte_bound() {
        let frame = 256 * 1024;
        let sent = CLOSE_DRAIN_BYTES / frame * 4;
        let mut flood =
            futures_util::stream::iter((0..sent).map(|_| Ok(Message::binary(vec![0u8; frame]))));
        drain(&mut flood).await;
        let left = flood.count().await;
        assert_eq!(
            sent - left,
            CLOSE_DRAIN_BYTES / frame,
            "frames read by the drain"
        );
    }
}
