//! The host's link to the coordinator: one authenticated session that delivers the
//! outbox's receipts until acknowledged, hands verified coordinator envelopes to the
//! coordinated chain, and sends the host's own envelopes, queued while the link is down.
//!
//! A receipt is sent as soon as it is durable, and again — within the session, with
//! doubling backoff from 2 s to 30 s — until the coordinator answers it: `ingested` acks
//! it; `retry:<category>` (ingestion failed for now) keeps it for the next try;
//! `refused:<category>` (never ingestible: another host's lane, a body that contradicts its
//! envelope) moves it to `refused/` for an operator, loudly. Every reconnect sends every
//! unacknowledged receipt again (the coordinator deduplicates by key and content).
//!
//! **Never:** acts on a frame that failed verification or that its coordinator did not
//! issue, or drops a receipt before the coordinator answered that key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use crate::protocol::canonical::{self, Value};
use crate::protocol::envelope::{n, s};
use crate::protocol::schema::MessageType;
use crate::protocol::transport::{LinkParams, TransportError};
use crate::protocol::{verify, Envelope, Verified, VerifyContext};

/// Builds the `receipt` envelope for one outbox receipt.
pub fn receipt_envelope(
    p: &LinkParams,
    session_id: &str,
    r: &super::receipt::TerminationReceipt,
) -> Result<Vec<u8>, TransportError> {
    let json = serde_json::to_value(r).map_err(|e| TransportError::Refused(e.to_string()))?;
    let body = canonical::from_json(&json)
        .map_err(|e| TransportError::Refused(format!("receipt not encodable: {e}")))?;
    p.signer
        .sign(
            MessageType::Receipt,
            &p.coordinator,
            vec![
                (
                    "message_id",
                    s(&format!("msg-{}", uuid::Uuid::new_v4().simple())),
                ),
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
        )
        .map_err(|e| TransportError::Refused(e.to_string()))
}

/// What the host does with verified coordinator envelopes other than receipt acks.
pub trait HostDispatch: Send + Sync + 'static {
    fn dispatch(&self, env: Envelope<Verified>) -> BoxFuture<'static, ()>;
}

struct NoDispatch;
impl HostDispatch for NoDispatch {
    fn dispatch(&self, _env: Envelope<Verified>) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// Delivers the outbox's receipts to the coordinator until each is acknowledged, across
/// disconnects: on every (re)connect all unacknowledged receipts are sent again (the
/// coordinator deduplicates by idempotency key). Runs until `shutdown`.
pub async fn run_receipt_link(
    p: LinkParams,
    outbox: super::outbox::Outbox,
    shutdown: watch::Receiver<bool>,
) {
    let (_keep, rx) = tokio::sync::mpsc::channel(1);
    let (_state, state) = watch::channel(super::HostState {
        lanes: p.lanes.clone(),
        report: p.report.clone(),
    });
    run_link(p, outbox, Arc::new(NoDispatch), rx, state, shutdown).await
}

/// The host's whole link: receipts as in [`run_receipt_link`], verified coordinator
/// envelopes to `dispatch`, and host-originated envelopes from `outgoing` (kept queued
/// while the link is down). Every hello carries the current host `state`; when it changes
/// mid-session a fresh hello on the same session reports it.
pub async fn run_link(
    mut p: LinkParams,
    outbox: super::outbox::Outbox,
    dispatch: Arc<dyn HostDispatch>,
    mut outgoing: tokio::sync::mpsc::Receiver<Vec<u8>>,
    mut lanes: watch::Receiver<super::HostState>,
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
        let session_id = format!("sess-{}", uuid::Uuid::new_v4().simple());
        let mut connected = false;
        let st = lanes.borrow_and_update().clone();
        p.lanes = st.lanes;
        p.report = st.report;
        match link_once(
            &p,
            &addr,
            &outbox,
            &session_id,
            dispatch.as_ref(),
            &mut outgoing,
            &mut lanes,
            &mut shutdown,
            &mut connected,
        )
        .await
        {
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

#[allow(clippy::too_many_arguments)]
async fn link_once(
    p: &LinkParams,
    addr: &str,
    outbox: &super::outbox::Outbox,
    session_id: &str,
    dispatch: &dyn HostDispatch,
    outgoing: &mut tokio::sync::mpsc::Receiver<Vec<u8>>,
    lanes: &mut watch::Receiver<super::HostState>,
    shutdown: &mut watch::Receiver<bool>,
    connected: &mut bool,
) -> Result<(), TransportError> {
    let mut ws = crate::protocol::transport::connect_to(p, addr, session_id).await?;
    *connected = true;

    tracing::info!(coordinator = %p.coordinator, addr, session_id, "coordinator link up");
    let mut sent: HashMap<String, Resend> = HashMap::new();
    // Receipts go out as soon as they are durable (the outbox signals each write); the
    // tick is the safety net for anything written while a send was in flight.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let written = outbox.written();
    loop {
        tokio::select! {
            _ = tick.tick() => send_pending(p, outbox, session_id, &mut sent, &mut ws).await?,
            _ = written.notified() => send_pending(p, outbox, session_id, &mut sent, &mut ws).await?,
            Ok(()) = lanes.changed() => {
                let now = lanes.borrow_and_update().clone();
                let hello = crate::protocol::transport::hello_envelope(p, session_id, &now.lanes, &now.report)?;
                ws.send(Message::text(String::from_utf8_lossy(&hello).into_owned())).await.map_err(|e| TransportError::Ws(e.to_string()))?;
                tracing::debug!(lanes = now.lanes.len(), session_id, "host state changed: reported again");
            }
            Some(out) = outgoing.recv() => {
                ws.send(Message::text(String::from_utf8_lossy(&out).into_owned())).await.map_err(|e| TransportError::Ws(e.to_string()))?;
            }
            frame = ws.next() => match frame {
                None | Some(Ok(Message::Close(_))) => return Err(TransportError::Ws("closed by the coordinator".into())),
                Some(Err(e)) => return Err(TransportError::Ws(e.to_string())),
                Some(Ok(Message::Text(t))) => {
                    let ctx = VerifyContext { registry: &p.registry, audience: &p.signer.principal, trust_domain: &p.trust_domain, now: SystemTime::now() };
                    match verify(t.as_bytes(), &ctx) {
                        Ok(env) if env.str("issuer") != p.coordinator => tracing::warn!(issuer = env.str("issuer"), "envelope not from our coordinator"),
                        Ok(env) if env.message_type() == MessageType::ReceiptAck => {
                            let key = env.str("receipt_idempotency_key").to_string();
                            answered(outbox, &mut sent, &key, env.str("verdict"));
                        }
                        Ok(env) => dispatch.dispatch(env).await,
                        Err(e) => tracing::warn!(category = e.category(), "rejected a frame from the coordinator"),
                    }
                }
                Some(Ok(_)) => {}
            },
            _ = crate::util::shutdown_signalled(shutdown) => {
                let _ = ws.close(None).await;
                return Ok(());
            }
        }
    }
}

/// When a receipt was last sent on this session, and how long to wait before sending it
/// again.
struct Resend {
    at: Instant,
    backoff: Duration,
}

const FIRST_RESEND: Duration = Duration::from_secs(2);
const MAX_RESEND: Duration = Duration::from_secs(30);

/// Applies the coordinator's answer about one receipt.
fn answered(
    outbox: &super::outbox::Outbox,
    sent: &mut HashMap<String, Resend>,
    key: &str,
    verdict: &str,
) {
    if let Some(category) = verdict.strip_prefix("refused:") {
        tracing::error!(
            key,
            category,
            "the coordinator refused this receipt for good; it is kept in refused/ for an operator"
        );
        if let Err(e) = outbox.refuse(key) {
            tracing::error!(key, error = %e, "cannot set the refused receipt aside");
        }
        sent.remove(key);
    } else if let Some(category) = verdict.strip_prefix("retry:") {
        tracing::warn!(
            key,
            category,
            "the coordinator could not ingest this receipt yet; sending it again later"
        );
    } else {
        if let Err(e) = outbox.ack(key) {
            tracing::warn!(key, error = %e, "receipt ack for an unknown receipt");
        }
        sent.remove(key);
    }
}

/// Sends every unacknowledged receipt not sent on this session yet, or whose backoff ran
/// out since it was last sent.
async fn send_pending(
    p: &LinkParams,
    outbox: &super::outbox::Outbox,
    session_id: &str,
    sent: &mut HashMap<String, Resend>,
    ws: &mut crate::protocol::transport::Ws,
) -> Result<(), TransportError> {
    for r in outbox
        .list(false)
        .map_err(|e| TransportError::Refused(e.to_string()))?
    {
        let due = match sent.get(&r.idempotency_key) {
            None => Some(FIRST_RESEND),
            Some(s) if s.at.elapsed() >= s.backoff => Some((s.backoff * 2).min(MAX_RESEND)),
            Some(_) => None,
        };
        let Some(backoff) = due else { continue };
        let env = receipt_envelope(p, session_id, &r)?;
        ws.send(Message::text(String::from_utf8_lossy(&env).into_owned()))
            .await
            .map_err(|e| TransportError::Ws(e.to_string()))?;
        sent.insert(
            r.idempotency_key.clone(),
            Resend {
                at: Instant::now(),
                backoff,
            },
        );
    }
    Ok(())
}
