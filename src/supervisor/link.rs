//! The host's link to the coordinator: one authenticated session that delivers the
//! outbox's receipts until acknowledged (again on every reconnect — the coordinator
//! deduplicates by key), hands verified coordinator envelopes to the coordinated chain,
//! and sends the host's own envelopes, queued while the link is down.
//!
//! **Never:** acts on a frame that failed verification or that its coordinator did not
//! issue, or drops a receipt before the coordinator acknowledged that key.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use crate::protocol::canonical::{self, Value};
use crate::protocol::envelope::{n, s};
use crate::protocol::schema::MessageType;
use crate::protocol::transport::{connect, LinkParams, TransportError};
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
    let (_lanes, lanes) = watch::channel(p.lanes.clone());
    run_link(p, outbox, Arc::new(NoDispatch), rx, lanes, shutdown).await
}

/// The host's whole link: receipts as in [`run_receipt_link`], verified coordinator
/// envelopes to `dispatch`, and host-originated envelopes from `outgoing` (kept queued
/// while the link is down). Every hello names the current `lanes`; when they change
/// mid-session a fresh hello on the same session registers them.
pub async fn run_link(
    mut p: LinkParams,
    outbox: super::outbox::Outbox,
    dispatch: Arc<dyn HostDispatch>,
    mut outgoing: tokio::sync::mpsc::Receiver<Vec<u8>>,
    mut lanes: watch::Receiver<Vec<String>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if *shutdown.borrow() {
            return;
        }
        let session_id = format!("sess-{}", uuid::Uuid::new_v4().simple());
        let mut connected = false;
        p.lanes = lanes.borrow_and_update().clone();
        match link_once(
            &p,
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
    outbox: &super::outbox::Outbox,
    session_id: &str,
    dispatch: &dyn HostDispatch,
    outgoing: &mut tokio::sync::mpsc::Receiver<Vec<u8>>,
    lanes: &mut watch::Receiver<Vec<String>>,
    shutdown: &mut watch::Receiver<bool>,
    connected: &mut bool,
) -> Result<(), TransportError> {
    let mut ws = connect(p, session_id).await?;
    *connected = true;

    tracing::info!(coordinator = %p.coordinator, session_id, "coordinator link up");
    let mut sent: HashSet<String> = HashSet::new();
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
                let hello = crate::protocol::transport::hello_envelope(p, session_id, &now)?;
                ws.send(Message::text(String::from_utf8_lossy(&hello).into_owned())).await.map_err(|e| TransportError::Ws(e.to_string()))?;
                tracing::info!(lanes = now.len(), session_id, "lane set changed: registered again");
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
                            if let Err(e) = outbox.ack(&key) {
                                tracing::warn!(key, error = %e, "receipt ack for an unknown receipt");
                            }
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

/// Sends every unacknowledged receipt not yet sent on this session.
async fn send_pending(
    p: &LinkParams,
    outbox: &super::outbox::Outbox,
    session_id: &str,
    sent: &mut HashSet<String>,
    ws: &mut crate::protocol::transport::Ws,
) -> Result<(), TransportError> {
    for r in outbox
        .list(false)
        .map_err(|e| TransportError::Refused(e.to_string()))?
    {
        if sent.insert(r.idempotency_key.clone()) {
            let env = receipt_envelope(p, session_id, &r)?;
            ws.send(Message::text(String::from_utf8_lossy(&env).into_owned()))
                .await
                .map_err(|e| TransportError::Ws(e.to_string()))?;
        }
    }
    Ok(())
}
