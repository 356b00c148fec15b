//! The host's link to the coordinator: one authenticated session that delivers the
//! outbox's receipts until acknowledged, hands verified coordinator envelopes to the
//! coordinated chain, and sends the host's own envelopes, queued while the link is down.
//!
//! A session starts with the coordinator's challenge (a fresh session id) answered by the
//! hello; every envelope either side sends afterwards carries a message id of that session
//! with a strictly increasing number, so nothing recorded on one session is accepted on
//! another, or twice on the same one. The link sends a signed heartbeat every liveness
//! interval and gives the session up when the coordinator has been silent past the limit
//! (it pings), then reconnects with backoff.
//!
//! Before a coordinator envelope reaches the chain it must be our coordinator's, carry the
//! next message id of this session, not be expired by coordinator time (estimated from the
//! challenge), and pass the [`AuthorityFence`] (same timeline, epoch not below the highest
//! seen). Every refusal is audited with identifiers only.
//!
//! A receipt is sent as soon as it is durable, and again — within the session, with
//! doubling backoff from 2 s to 30 s — until the coordinator answers it: `ingested` acks
//! it; `retry:<category>` (ingestion failed for now) keeps it for the next try;
//! `refused:<category>` (never ingestible: another host's lane, a body that contradicts its
//! envelope) moves it to `refused/` for an operator, loudly. Every reconnect sends every
//! unacknowledged receipt again (the coordinator deduplicates by key and content).
//!
//! **Never:** acts on a frame that failed any of those checks, or drops a receipt before
//! the coordinator answered that key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::authority::AuthorityFence;
use crate::protocol::canonical::{self, Value};
use crate::protocol::envelope::{n, s};
use crate::protocol::messages::{ToHost, Verdict};
use crate::protocol::schema::MessageType;
use crate::protocol::transport::{HostSession, LinkParams, Outgoing, TransportError};
use crate::protocol::{verify, Envelope, Verified, VerifyContext};

/// Builds the `receipt` envelope for one outbox receipt.
pub fn receipt_outgoing(
    p: &LinkParams,
    session_id: &str,
    r: &super::receipt::TerminationReceipt,
) -> Result<Outgoing, TransportError> {
    let json = serde_json::to_value(r).map_err(|e| TransportError::Refused(e.to_string()))?;
    let body = canonical::from_json(&json)
        .map_err(|e| TransportError::Refused(format!("receipt not encodable: {e}")))?;
    Ok(Outgoing::new(
        &p.signer,
        MessageType::Receipt,
        vec![
            ("idempotency_key", s(&r.idempotency_key)),
            (
                "sot_incarnation",
                r.sot_incarnation.as_deref().map(s).unwrap_or(Value::Null),
            ),
            (
                "coordinator_epoch",
                r.coordinator_epoch.map(n).unwrap_or(Value::Null),
            ),
            (
                "assignment_id",
                r.assignment_id.as_deref().map(s).unwrap_or(Value::Null),
            ),
            ("session_id", s(session_id)),
            ("lane_id", s(&r.lane_id)),
            ("lane_incarnation_id", s(&r.lane_incarnation_id)),
            ("generation", n(r.generation)),
            ("receipt_idempotency_key", s(&r.idempotency_key)),
            ("receipt", body),
        ],
    ))
}

/// What the host does with verified coordinator envelopes other than receipt acks.
pub trait HostDispatch: Send + Sync + 'static {
    fn dispatch(&self, env: Envelope<Verified>, msg: ToHost) -> BoxFuture<'static, ()>;
}

struct NoDispatch;
impl HostDispatch for NoDispatch {
    fn dispatch(&self, _env: Envelope<Verified>, _msg: ToHost) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// Which coordinator session the link is in: `Some(n)` while its n-th session attempt is
/// up, `None` between sessions. A part waiting for an answer to something it sent on
/// session `n` stops waiting when `n` ends: the answer, if any, went with the session.
pub type LinkSession = watch::Sender<Option<u64>>;

/// Where the link records what it refuses (identifiers only).
pub type LinkAudit = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// Delivers the outbox's receipts to the coordinator until each is acknowledged, across
/// disconnects: on every (re)connect all unacknowledged receipts are sent again (the
/// coordinator deduplicates by idempotency key). Runs until `shutdown`.
pub async fn run_receipt_link(
    p: LinkParams,
    outbox: super::outbox::Outbox,
    fence: Arc<AuthorityFence>,
    shutdown: watch::Receiver<bool>,
) {
    let (_keep, rx) = tokio::sync::mpsc::channel(1);
    let (_state, state) = watch::channel(super::HostState {
        lanes: p.lanes.clone(),
        report: p.report.clone(),
    });
    let audit: LinkAudit = Arc::new(|category, detail| {
        tracing::warn!(category, detail, "coordinator frame refused");
    });
    run_link(
        p,
        outbox,
        Arc::new(NoDispatch),
        rx,
        state,
        fence,
        audit,
        None,
        None,
        None,
        shutdown,
    )
    .await
}

/// The host's whole link: receipts as in [`run_receipt_link`], verified coordinator
/// envelopes to `dispatch`, and host-originated envelopes from `outgoing` (kept queued
/// while the link is down; sealed for whichever session sends them). The hello carries the
/// current host `state`; when it changes mid-session a `report` carries it again.
#[allow(clippy::too_many_arguments)]
pub async fn run_link(
    mut p: LinkParams,
    outbox: super::outbox::Outbox,
    dispatch: Arc<dyn HostDispatch>,
    mut outgoing: tokio::sync::mpsc::Receiver<Outgoing>,
    mut lanes: watch::Receiver<super::HostState>,
    fence: Arc<AuthorityFence>,
    audit: LinkAudit,
    metrics: Option<Arc<super::metrics::HostMetrics>>,
    reported: Option<Arc<watch::Sender<super::HostState>>>,
    session: Option<Arc<LinkSession>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    let addrs: Vec<String> = std::iter::once(p.addr.clone())
        .chain(p.fallback_addrs.iter().cloned())
        .collect();
    let mut attempt = 0usize;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let addr = addrs[attempt % addrs.len()].clone();
        attempt += 1;
        let mut connected = false;
        let st = lanes.borrow_and_update().clone();
        p.lanes = st.lanes;
        p.report = st.report;
        let link = Link {
            p: &p,
            outbox: &outbox,
            dispatch: dispatch.as_ref(),
            fence: &fence,
            audit: &audit,
            reported: reported.as_deref(),
            session: session.as_deref(),
            attempt: attempt as u64,
        };
        let outcome = link
            .once(
                &addr,
                &mut outgoing,
                &mut lanes,
                &mut shutdown,
                &mut connected,
                metrics.as_deref(),
            )
            .await;
        if let Some(m) = &metrics {
            m.link_up.set(0);
        }
        if let Some(s) = &session {
            s.send_replace(None);
        }
        match outcome {
            Ok(()) => return,
            Err(e) => {
                // A session that was up starts the next attempt fast again.
                if connected {
                    backoff = Duration::from_millis(100);
                }
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "coordinator link down");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = crate::util::shutdown_signalled(&mut shutdown) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

struct Link<'a> {
    p: &'a LinkParams,
    outbox: &'a super::outbox::Outbox,
    dispatch: &'a dyn HostDispatch,
    fence: &'a Arc<AuthorityFence>,
    audit: &'a LinkAudit,
    /// The host state the coordinator was last sent (its hello's, then each report's).
    reported: Option<&'a watch::Sender<super::HostState>>,
    /// Told when this session is up (`attempt`) and, by `run_link`, when it ends.
    session: Option<&'a LinkSession>,
    attempt: u64,
}

impl Link<'_> {
    async fn once(
        &self,
        addr: &str,
        outgoing: &mut tokio::sync::mpsc::Receiver<Outgoing>,
        lanes: &mut watch::Receiver<super::HostState>,
        shutdown: &mut watch::Receiver<bool>,
        connected: &mut bool,
        metrics: Option<&super::metrics::HostMetrics>,
    ) -> Result<(), TransportError> {
        let p = self.p;
        // The challenge's authority, judged before the hello: a deposed or foreign
        // coordinator gets no session, and no session row.
        let fence = self.fence.clone();
        let audit = self.audit.clone();
        let check = move |c: &Envelope<Verified>| -> Result<(), String> {
            fence.admit(c.sot_incarnation(), c.coordinator_epoch()).map_err(|r| {
                audit(r.category(), "session challenge");
                format!(
                    "the host refuses this coordinator ({}): it answers to another timeline or a higher epoch",
                    r.category()
                )
            })
        };
        let res = crate::protocol::transport::connect_checked(p, addr, &check).await;
        match &res {
            Ok(hs) => {
                if let Some(m) = metrics {
                    m.clock_measured(hs.clock.host_ahead_ms(), p.max_clock_skew_ms, false)
                }
            }
            Err(TransportError::ClockSkew(s)) => {
                tracing::error!(
                    host_ahead_ms = s.host_ahead_ms,
                    tolerance_ms = s.tolerance_ms,
                    "{s}"
                );
                if let Some(m) = metrics {
                    m.clock_measured(s.host_ahead_ms, s.tolerance_ms, true)
                }
            }
            Err(_) => {}
        }
        let mut hs = res?;
        // Only a session the host accepted resets the reconnect backoff.
        *connected = true;
        if let Some(r) = self.reported {
            r.send_replace(super::HostState {
                lanes: p.lanes.clone(),
                report: p.report.clone(),
            });
        }
        let session_id = hs.session_id.clone();
        tracing::info!(coordinator = %p.coordinator, addr, session_id, "coordinator link up");
        if let Some(m) = metrics {
            m.link_up.set(1);
        }
        if let Some(s) = self.session {
            s.send_replace(Some(self.attempt));
        }
        let mut sent: HashMap<String, Resend> = HashMap::new();
        let mut pace = Pace::of(&crate::protocol::transport::Limits::default());
        // Receipts go out as soon as they are durable (the outbox signals each write); the
        // tick is the safety net for anything written while a send was in flight.
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut heartbeat = tokio::time::interval(p.liveness.interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        let written = self.outbox.written();
        loop {
            tokio::select! {
                _ = tick.tick() => self.send_pending(&mut hs, &mut sent, &mut pace).await?,
                _ = written.notified() => self.send_pending(&mut hs, &mut sent, &mut pace).await?,
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > p.liveness.limit {
                        return Err(TransportError::Timeout("coordinator silent past the liveness limit"));
                    }
                    let hb = Outgoing::new(&p.signer, MessageType::Heartbeat, vec![
                        ("idempotency_key", s(&format!("heartbeat/{session_id}/{}", uuid::Uuid::new_v4().simple()))),
                        ("sot_incarnation", Value::Null),
                        ("coordinator_epoch", Value::Null),
                        ("assignment_id", Value::Null),
                        ("session_id", s(&session_id)),
                    ]);
                    hs.send(hb, &p.coordinator).await?;
                }
                Ok(()) = lanes.changed() => {
                    let now = lanes.borrow_and_update().clone();
                    let report = crate::protocol::transport::report_outgoing(p, &session_id, &now.lanes, &now.report)?;
                    hs.send(report, &p.coordinator).await?;
                    if let Some(r) = self.reported {
                        r.send_replace(now.clone());
                    }
                    tracing::debug!(lanes = now.lanes.len(), session_id, "host state changed: reported");
                }
                Some(out) = outgoing.recv() => hs.send(out, &p.coordinator).await?,
                frame = hs.ws.next() => {
                    let t = match frame {
                        None => return Err(TransportError::Ws("closed by the coordinator".into())),
                        // Its reason (a penalty, a newer session, a lost leadership) is what
                        // the operator needs in the log line the caller writes.
                        Some(Ok(Message::Close(f))) => return Err(TransportError::Ws(match f {
                            Some(f) => format!("closed by the coordinator ({}): {}", u16::from(f.code), f.reason),
                            None => "closed by the coordinator".into(),
                        })),
                        Some(Err(e)) => return Err(TransportError::Ws(e.to_string())),
                        Some(Ok(Message::Text(t))) => { last_heard = Instant::now(); t }
                        Some(Ok(_)) => { last_heard = Instant::now(); continue } // pings (answered by tungstenite)
                    };
                    let Some((env, msg)) = self.admit(&mut hs, t.as_bytes()) else { continue };
                    if let ToHost::ReceiptAck(a) = &msg {
                        answered(self.outbox, &mut sent, &a.receipt_idempotency_key, &a.verdict);
                    } else {
                        self.dispatch.dispatch(env, msg).await;
                    }
                }
                _ = crate::util::shutdown_signalled(shutdown) => {
                    let _ = hs.ws.close(None).await;
                    return Ok(());
                }
            }
        }
    }

    /// Every check a coordinator frame must pass before anything acts on it.
    fn admit(&self, hs: &mut HostSession, bytes: &[u8]) -> Option<(Envelope<Verified>, ToHost)> {
        let p = self.p;
        let ctx = VerifyContext {
            registry: &p.registry,
            audience: &p.signer.principal,
            trust_domain: &p.trust_domain,
            now: SystemTime::now(),
        };
        let env = match verify(bytes, &ctx) {
            Ok(env) => env,
            Err(e) => {
                (self.audit)(e.category(), "frame from the coordinator");
                return None;
            }
        };
        let id = env.message_id().to_string();
        let refuse = |category: &str| {
            (self.audit)(category, &format!("{} {id}", env.message_type().as_str()));
            None
        };
        if env.issuer() != p.coordinator {
            return refuse("not-our-coordinator");
        }
        if let Err(why) = hs.guard.check(&id) {
            return refuse(why.as_str());
        }
        if env.session_id().is_some_and(|s| s != hs.session_id) {
            return refuse("other-session");
        }
        if env.expires_at().is_some_and(|at| hs.clock.expired(at)) {
            return refuse("expired");
        }
        if let Err(r) = self
            .fence
            .admit(env.sot_incarnation(), env.coordinator_epoch())
        {
            return refuse(r.category());
        }
        // The one place a coordinator envelope becomes its typed message: a field missing or
        // a value this build does not know refuses the whole message, audited.
        let msg = match ToHost::decode(&env) {
            Ok(Some(m)) => m,
            Ok(None) => return refuse("not-for-hosts"),
            Err(e) => {
                tracing::warn!(error = %e, "coordinator message refused: malformed");
                return refuse("malformed");
            }
        };
        Some((env, msg))
    }

    /// Sends every unacknowledged receipt not sent on this session yet, or whose backoff ran
    /// out since it was last sent, as far as `pace` and the in-flight bound allow (the rest
    /// at a later call). Never-sent receipts go first: a backlog the coordinator keeps
    /// answering "retry" must not keep newer ones from being sent at all.
    async fn send_pending(
        &self,
        hs: &mut HostSession,
        sent: &mut HashMap<String, Resend>,
        pace: &mut Pace,
    ) -> Result<(), TransportError> {
        if !pace.ready() {
            return Ok(());
        }
        let pending = self
            .outbox
            .list(false)
            .map_err(|e| TransportError::Refused(e.to_string()))?;
        // What left the outbox otherwise (an operator's acknowledgement) awaits nothing.
        let keys: std::collections::HashSet<&str> =
            pending.iter().map(|r| r.idempotency_key.as_str()).collect();
        sent.retain(|k, _| keys.contains(k.as_str()));
        let mut fresh = Vec::new();
        let mut due = Vec::new();
        for r in pending {
            match sent.get(&r.idempotency_key) {
                None => fresh.push((r, FIRST_RESEND)),
                Some(s) if s.at.elapsed() >= s.backoff => {
                    let backoff = (s.backoff * 2).min(MAX_RESEND);
                    due.push((r, backoff))
                }
                Some(_) => {}
            }
        }
        let mut room =
            RECEIPTS_IN_FLIGHT.saturating_sub(sent.values().filter(|s| s.awaiting).count());
        for (r, backoff) in fresh.into_iter().chain(due) {
            let was_awaiting = sent.get(&r.idempotency_key).is_some_and(|s| s.awaiting);
            if !was_awaiting {
                if room == 0 {
                    continue;
                }
                room -= 1;
            }
            if !pace.take() {
                break;
            }
            let env = receipt_outgoing(self.p, &hs.session_id, &r)?;
            hs.send(env, &self.p.coordinator).await?;
            sent.insert(
                r.idempotency_key.clone(),
                Resend {
                    at: Instant::now(),
                    backoff,
                    awaiting: true,
                },
            );
        }
        Ok(())
    }
}

/// Receipts sent on a session and not answered yet, at most. The coordinator reads a
/// session's frames as it handles them (each receipt is a transaction) and charges its
/// frame budget as it reads: what the pace let out during a database stall would
/// otherwise be read in one burst when it ends.
const RECEIPTS_IN_FLIGHT: usize = 256;

/// The share of the coordinator's per-session frame budget (`Limits`) receipts may use:
/// half its burst and half its sustained rate. A backlog — a host away while many of its
/// generations ended — used to go out in one burst, and past the coordinator's burst the
/// session was closed as abusive, on every reconnect. The other half stays for the
/// chain's messages, reports and heartbeats.
struct Pace {
    tokens: f64,
    at: Instant,
    per_second: f64,
    cap: f64,
}

impl Pace {
    fn of(l: &crate::protocol::transport::Limits) -> Self {
        let cap = f64::from(l.burst / 2).max(1.0);
        Self {
            tokens: cap,
            at: Instant::now(),
            per_second: f64::from(l.frames_per_second / 2).max(1.0),
            cap,
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let earned = now.duration_since(self.at).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + earned).min(self.cap);
        self.at = now;
    }

    /// Whether a frame's budget is there (spends nothing).
    fn ready(&mut self) -> bool {
        self.refill();
        self.tokens >= 1.0
    }

    /// Spends one frame's budget if there is one.
    fn take(&mut self) -> bool {
        self.refill();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// When a receipt was last sent on this session, and how long to wait before sending it
/// again.
struct Resend {
    at: Instant,
    backoff: Duration,
    /// Sent and not answered yet (a "retry" answer clears it until the next send).
    awaiting: bool,
}

const FIRST_RESEND: Duration = Duration::from_secs(2);
const MAX_RESEND: Duration = Duration::from_secs(30);

/// Applies the coordinator's answer about one receipt.
fn answered(
    outbox: &super::outbox::Outbox,
    sent: &mut HashMap<String, Resend>,
    key: &str,
    verdict: &Verdict,
) {
    if let Verdict::Refused(category) = verdict {
        tracing::error!(
            key,
            category,
            "the coordinator refused this receipt for good; it is kept in refused/ for an operator"
        );
        if let Err(e) = outbox.refuse(key) {
            tracing::error!(receipt_key = %key, error = %e, "cannot set the refused receipt aside");
        }
        sent.remove(key);
    } else if let Verdict::Retry(category) = verdict {
        tracing::warn!(
            key,
            category,
            "the coordinator could not ingest this receipt yet; sending it again later"
        );
        if let Some(s) = sent.get_mut(key) {
            s.awaiting = false;
        }
    } else {
        if let Err(e) = outbox.ack(key) {
            tracing::warn!(receipt_key = %key, error = %e, "receipt ack for an unknown receipt");
        }
        sent.remove(key);
    }
}
