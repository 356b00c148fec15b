//! Host sessions: who is connected, what each host message may touch, and the
//! reconciliation a hello starts.
//!
//! Every host-originated message is accepted only for lanes, reservations and generations
//! of the session's own host, and only when its fields agree with the chain they name; a
//! message that does not is refused and audited (identifiers only) and changes nothing.
//!
//! On every hello — first connect, reconnect, or a changed lane set on a live session — the
//! host reports each lane's incarnation, status and live generations; the coordinator
//! adopts the incarnations, follows a host-side quarantine, ends what may not keep running
//! (a generation it never staged, one whose chain ended, one whose host lost the chain
//! before activation), tells the host again what a RUNNING generation may not know yet, and
//! resends whatever each live chain waits for. No lane stays wedged on a lost message.
//!
//! **Never:** lets a session act for another host's lanes, or a receipt body speak for a
//! lane or generation other than the envelope's own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::coordinator::activation::AckClaim;
use crate::coordinator::ending::{EndCause, Reconciliation};
use crate::coordinator::error::{AuthorityError, Category};
use crate::coordinator::leader::Leader;
use crate::coordinator::model::ChainRow;
use crate::coordinator::states::{GenState, LaneState};
use crate::protocol::canonical::{self, Value};
use crate::protocol::envelope::{n, s};
use crate::protocol::report::{self, HostReport};
use crate::protocol::schema::MessageType;
use crate::protocol::transport::{self, Admission, Handled, Handler, Outgoing, SessionHandle};
use crate::protocol::{Envelope, Verified};

use super::driver::LaneOrder;
use super::operator::OpError;
use super::Service;

struct Session {
    session_id: String,
    session_epoch: i64,
    handle: SessionHandle,
    /// The runtimes this session last had recorded in `hosts` (a report repeats them on
    /// every state change; only a change is written).
    runtimes: Option<Vec<String>>,
}

/// A host that was disconnected for abusing its session waits before the next one.
struct Penalty {
    until: std::time::Instant,
    strikes: u32,
    last: std::time::Instant,
}

/// The live session of each host, and the hosts waiting out a penalty.
#[derive(Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<String, Session>>,
    penalties: Mutex<HashMap<String, Penalty>>,
    /// When each host's recent sessions opened (a session costs a row and an epoch).
    opens: Mutex<HashMap<String, std::collections::VecDeque<std::time::Instant>>>,
}

/// Sessions a host may open per minute. A supervisor reconnecting with its backoff opens
/// far fewer; a credential cycling sessions is refused until the minute rolls on.
const MAX_OPENS_PER_MINUTE: usize = 30;

/// A host session's view for `status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostSessionView {
    pub host_id: String,
    pub session_epoch: i64,
    pub silent_ms: u64,
}

impl Sessions {
    /// `host:<id>` of every host with a live session.
    pub fn connected(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .map
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(_, s)| s.handle.is_open())
                    .map(|(h, _)| format!("host:{h}"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    pub fn views(&self) -> Vec<HostSessionView> {
        let mut v: Vec<HostSessionView> = self
            .map
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(_, s)| s.handle.is_open())
                    .map(|(h, s)| HostSessionView {
                        host_id: h.clone(),
                        session_epoch: s.session_epoch,
                        silent_ms: s.handle.silent_for().as_millis() as u64,
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.host_id.cmp(&b.host_id));
        v
    }

    pub fn is_connected(&self, host_id: &str) -> bool {
        self.map
            .lock()
            .map(|m| m.get(host_id).is_some_and(|s| s.handle.is_open()))
            .unwrap_or(false)
    }

    /// Why a new session of `host_id` may not open now, if it may not: the host waits out
    /// a penalty, or already has a live session (the live one wins: a second session —
    /// even with the host's own credentials — cannot displace it; a new one is admitted
    /// once the old one closed or fell silent past the liveness limit).
    fn refusal(&self, host_id: &str, liveness: &transport::Liveness) -> Option<String> {
        if let Ok(p) = self.penalties.lock() {
            if let Some(p) = p.get(host_id) {
                let now = std::time::Instant::now();
                if p.until > now {
                    return Some(format!(
                        "host:{host_id} was disconnected for abusing its session; retry in {} ms",
                        (p.until - now).as_millis()
                    ));
                }
            }
        }
        if let Ok(mut o) = self.opens.lock() {
            if let Some(q) = o.get_mut(host_id) {
                let minute = std::time::Duration::from_secs(60);
                while q.front().is_some_and(|t| t.elapsed() > minute) {
                    q.pop_front();
                }
                if q.len() >= MAX_OPENS_PER_MINUTE {
                    let wait = q
                        .front()
                        .map(|t| minute.saturating_sub(t.elapsed()))
                        .unwrap_or_default();
                    return Some(format!(
                        "host:{host_id} opened {MAX_OPENS_PER_MINUTE} sessions in the last minute; retry in {} ms",
                        wait.as_millis()
                    ));
                }
            }
        }
        let m = self.map.lock().ok()?;
        let s = m.get(host_id)?;
        (s.handle.is_open() && s.handle.silent_for() <= liveness.limit).then(|| {
            format!(
                "host:{host_id} has a live session (epoch {}, last frame {} ms ago); a new one is admitted once it closes or is silent for {} s",
                s.session_epoch,
                s.handle.silent_for().as_millis(),
                liveness.limit.as_secs()
            )
        })
    }

    /// Makes `handle` the host's live session; the one it replaces (closed, or silent past
    /// the limit) is closed with the reason.
    fn install(&self, host_id: &str, handle: SessionHandle, session_epoch: i64) -> Option<Session> {
        if let Ok(mut o) = self.opens.lock() {
            o.entry(host_id.to_string())
                .or_default()
                .push_back(std::time::Instant::now());
        }
        let mut m = self.map.lock().ok()?;
        let old = m.insert(
            host_id.to_string(),
            Session {
                session_id: handle.session_id.clone(),
                session_epoch,
                handle,
                runtimes: None,
            },
        );
        if let Some(o) = &old {
            o.handle
                .close(&format!("superseded by session epoch {session_epoch}"));
        }
        old
    }

    /// Closes every live session with `reason`.
    pub fn close_all(&self, reason: &str) {
        if let Ok(m) = self.map.lock() {
            for s in m.values() {
                s.handle.close(reason);
            }
        }
    }

    fn remove(&self, host_id: &str, session_id: &str) {
        if let Ok(mut m) = self.map.lock() {
            if m.get(host_id).is_some_and(|s| s.session_id == session_id) {
                m.remove(host_id);
            }
        }
    }

    /// A session closed for abuse: the host waits 2 s, doubling with each repeat within
    /// ten minutes, up to 5 min.
    fn penalize(&self, host_id: &str) {
        if let Ok(mut p) = self.penalties.lock() {
            let now = std::time::Instant::now();
            let e = p.entry(host_id.to_string()).or_insert(Penalty {
                until: now,
                strikes: 0,
                last: now,
            });
            if now.duration_since(e.last) > std::time::Duration::from_secs(600) {
                e.strikes = 0;
            }
            e.strikes = (e.strikes + 1).min(10);
            e.last = now;
            let wait = std::time::Duration::from_secs(2)
                .saturating_mul(1 << (e.strikes - 1))
                .min(std::time::Duration::from_secs(300));
            e.until = now + wait;
        }
    }

    /// True when `runtimes` differ from what `session_id` last recorded.
    fn runtimes_changed(&self, host_id: &str, session_id: &str, runtimes: &[String]) -> bool {
        let Ok(m) = self.map.lock() else {
            return true;
        };
        m.get(host_id)
            .filter(|s| s.session_id == session_id)
            .is_none_or(|s| s.runtimes.as_deref() != Some(runtimes))
    }

    fn runtimes_recorded(&self, host_id: &str, session_id: &str, runtimes: Vec<String>) {
        if let Ok(mut m) = self.map.lock() {
            if let Some(s) = m.get_mut(host_id).filter(|s| s.session_id == session_id) {
                s.runtimes = Some(runtimes);
            }
        }
    }

    pub fn session_id(&self, host_id: &str) -> Option<String> {
        let m = self.map.lock().ok()?;
        m.get(host_id)
            .filter(|s| s.handle.is_open())
            .map(|s| s.session_id.clone())
    }

    /// Queues an envelope for the host's session (sealed there). A session whose queue is
    /// full does not read what it is sent: it is closed, and the host reconnects and
    /// reconciles.
    pub fn push(&self, host_id: &str, out: Outgoing) -> Result<(), OpError> {
        let handle = self
            .map
            .lock()
            .ok()
            .and_then(|m| m.get(host_id).map(|s| s.handle.clone()))
            .ok_or_else(|| {
                OpError::new(
                    Category::HostUnreachable,
                    format!("host:{host_id} is not connected"),
                )
            })?;
        handle.push.try_send(out).map_err(|e| {
            if matches!(e, mpsc::error::TrySendError::Full(_)) {
                handle.close("the host does not read its session (queue full)");
            }
            OpError::new(
                Category::HostUnreachable,
                format!("cannot send to host:{host_id}: {e}"),
            )
        })
    }
}

pub(crate) struct HostHandler(pub Arc<Service>);

fn host_of(peer: &str) -> Option<&str> {
    peer.strip_prefix("host:").filter(|h| !h.is_empty())
}

/// How long a session challenge stays valid.
const CHALLENGE_TTL_MS: i64 = 10_000;

impl Handler for HostHandler {
    fn admit(&self, peer: &str) -> BoxFuture<'static, Result<Admission, String>> {
        let svc = self.0.clone();
        let peer = peer.to_string();
        Box::pin(async move {
            let Some(host) = host_of(&peer) else {
                return Err(format!("{peer} is not a host principal"));
            };
            let Some(l) = svc.leadership.current().await else {
                return Err("this coordinator is standing by; connect to the leader".into());
            };
            if let Some(why) = svc.hosts.refusal(host, &svc.timing.liveness) {
                return Err(why);
            }
            let (issued_at, expires_at) = svc
                .store
                .db_now_and(CHALLENGE_TTL_MS)
                .await
                .map_err(|e| format!("database: {e}"))?;
            Ok(Admission {
                sot_incarnation: Some(l.sot().to_string()),
                coordinator_epoch: Some(l.epoch() as u64),
                issued_at,
                expires_at,
            })
        })
    }

    fn open(
        &self,
        session: SessionHandle,
        hello: &Envelope<Verified>,
    ) -> BoxFuture<'static, Result<(), String>> {
        let svc = self.0.clone();
        let host_field = hello.str("host_id").to_string();
        Box::pin(async move {
            let Some(host) = host_of(&session.peer).map(String::from) else {
                return Err("not a host principal".into());
            };
            if host_field != host {
                return Err("the hello names another host".into());
            }
            let l = svc.leader().await.map_err(|e| e.message)?;
            // Checked again: another session may have been admitted since the challenge.
            if let Some(why) = svc.hosts.refusal(&host, &svc.timing.liveness) {
                return Err(why);
            }
            let epoch = svc
                .store
                .open_host_session(&host, &session.session_id, l.epoch())
                .await
                .map_err(|e| format!("cannot record the session: {e}"))?;
            let sid = session.session_id.clone();
            if let Some(old) = svc.hosts.install(&host, session, epoch) {
                let reason = format!("superseded by session epoch {epoch}");
                tracing::warn!(
                    host,
                    old_session_epoch = old.session_epoch,
                    session_epoch = epoch,
                    "host session superseded"
                );
                svc.store.auditor().record(
                    "host-session",
                    Category::Conflict,
                    Some(l.epoch()),
                    None,
                    None,
                    &format!("host:{host} session epoch {}: {reason}", old.session_epoch),
                );
                let _ = svc.store.close_host_session(&old.session_id, &reason).await;
            }
            tracing::info!(host, session_epoch = epoch, session_id = %sid, "host session open");
            svc.metrics.sessions_opened.inc();
            svc.bump();
            Ok(())
        })
    }

    fn handle(&self, peer: String, env: Envelope<Verified>) -> BoxFuture<'static, Handled> {
        let svc = self.0.clone();
        Box::pin(async move {
            let Some(host) = host_of(&peer).map(String::from) else {
                return Handled::default();
            };
            let t = env.message_type();
            let started = std::time::Instant::now();
            tracing::debug!(host, message_type = t.as_str(), "host message");
            // Identifiers are looked up, logged and echoed: refuse any that is not shaped
            // like one Mosaic mints, without repeating it.
            if let Some(field) = [
                "reservation_id",
                "assignment_id",
                "assignment_attempt_id",
                "lane_id",
                "lane_incarnation_id",
                "receipt_idempotency_key",
                "challenge_id",
                "host_id",
            ]
            .into_iter()
            .find(|f| matches!(env.get(f), Some(Value::Str(v)) if !report::id_ok(v)))
            {
                svc.metrics
                    .host_messages_refused
                    .get_or_create(&crate::coordinator::metrics::TypeCategory {
                        message_type: t.as_str().into(),
                        category: "bad-input".into(),
                    })
                    .inc();
                tracing::warn!(
                    host,
                    message_type = t.as_str(),
                    field,
                    "host message refused: malformed identifier"
                );
                return Handled {
                    replies: vec![],
                    violation: Some(format!("malformed-{field}")),
                };
            }
            let out = match t {
                MessageType::Hello | MessageType::Report => {
                    svc.on_state(&host, &env).await.map(|()| vec![])
                }
                MessageType::Receipt => return svc.on_receipt(&host, &env).await,
                MessageType::Staged => svc.on_staged(&host, &env).await.map(|()| vec![]),
                MessageType::Injected => svc.on_injected(&host, &env).await.map(|()| vec![]),
                MessageType::Ack => svc.on_ack(&host, &env).await.map(|()| vec![]),
                MessageType::Progress => svc.on_progress(&host, &env).await.map(|()| vec![]),
                MessageType::Blocked => svc.on_blocked(&host, &env).await.map(|()| vec![]),
                MessageType::HandoffAck => svc.on_handoff_ack(&host, &env).await.map(|()| vec![]),
                MessageType::ContinuationAccept => svc
                    .on_continuation_accept(&host, &env)
                    .await
                    .map(|()| vec![]),
                MessageType::ContinuationResult => svc
                    .on_continuation_result(&host, &env)
                    .await
                    .map(|()| vec![]),
                MessageType::Heartbeat => Ok(vec![]),
                other => Err(OpError::new(
                    Category::BadInput,
                    format!("hosts do not send {}", other.as_str()),
                )),
            };
            tracing::debug!(
                host,
                message_type = t.as_str(),
                micros = started.elapsed().as_micros() as u64,
                "host message handled"
            );
            match out {
                Ok(replies) => Handled::reply(replies),
                Err(e) => {
                    svc.metrics
                        .host_messages_refused
                        .get_or_create(&crate::coordinator::metrics::TypeCategory {
                            message_type: t.as_str().into(),
                            category: e.category.as_str().into(),
                        })
                        .inc();
                    tracing::warn!(host, message_type = t.as_str(), category = e.category.as_str(), error = %e.message, "host message refused");
                    svc.store.auditor().record(
                        &format!("host-{}", t.as_str()),
                        e.category,
                        None,
                        non_empty(env.str("assignment_id")),
                        non_empty(env.str("lane_incarnation_id")),
                        &format!(
                            "host:{host} message {}: {}",
                            env.str("message_id"),
                            e.message
                        ),
                    );
                    Handled {
                        replies: vec![],
                        violation: hostile(e.category)
                            .then(|| format!("refused-{}", e.category.as_str())),
                    }
                }
            }
        })
    }

    fn closed(&self, peer: &str, session_id: &str, reason: &str, abusive: bool) {
        let Some(host) = host_of(peer).map(String::from) else {
            return;
        };
        let svc = self.0.clone();
        svc.hosts.remove(&host, session_id);
        if abusive {
            svc.hosts.penalize(&host);
        }
        let kind = if abusive {
            "abusive"
        } else if reason.contains("superseded") {
            "superseded"
        } else if reason.contains("silent") {
            "silent"
        } else if reason.contains("no longer leads") {
            "leadership"
        } else if reason.contains("shutting down") {
            "shutdown"
        } else if reason.contains("closed by the peer") {
            "closed"
        } else {
            "transport"
        };
        svc.metrics
            .sessions_closed
            .get_or_create(&crate::coordinator::metrics::Kind { kind: kind.into() })
            .inc();
        svc.bump();
        tracing::info!(host, session_id, reason, abusive, "host session closed");
        let (sid, reason) = (session_id.to_string(), reason.to_string());
        tokio::spawn(async move {
            let _ = svc.store.close_host_session(&sid, &reason).await;
        });
    }
}

/// Refusals that a well-behaved host never provokes: they count against the session's
/// invalid-frame budget. (Chain races — a late ACK, an expired reservation — do not.)
fn hostile(c: Category) -> bool {
    matches!(
        c,
        Category::NotOwner | Category::Mismatch | Category::BadInput | Category::FenceMismatch
    )
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// Checks that an ordinary host message is about a chain of this host, and that every
/// chain field it carries is that chain's: lane, incarnation, assignment, attempt,
/// generation, the timeline and epoch the chain was staged under, and the fence
/// commitment of its generation.
fn owned(
    host: &str,
    env: &Envelope<Verified>,
    c: &ChainRow,
    l: &Leader,
    fence_commitment: &str,
) -> Result<(), OpError> {
    if c.host_id != host {
        return Err(OpError::new(
            Category::NotOwner,
            format!(
                "reservation {} is on a lane of another host",
                c.chain.reservation_id
            ),
        ));
    }
    let ch = &c.chain;
    let checks: [(&str, Option<String>, String); 7] = [
        (
            "lane_id",
            Some(env.str("lane_id").to_string()),
            ch.lane_id.clone(),
        ),
        (
            "lane_incarnation_id",
            Some(env.str("lane_incarnation_id").to_string()),
            ch.lane_incarnation_id.clone(),
        ),
        (
            "assignment_id",
            Some(env.str("assignment_id").to_string()),
            ch.assignment_id.clone(),
        ),
        (
            "assignment_attempt_id",
            Some(env.str("assignment_attempt_id").to_string()),
            ch.assignment_attempt_id.clone(),
        ),
        (
            "generation",
            env.uint("generation").map(|g| g.to_string()),
            c.generation.map(|g| g.to_string()).unwrap_or_default(),
        ),
        (
            "sot_incarnation",
            Some(env.str("sot_incarnation").to_string()),
            l.sot().to_string(),
        ),
        (
            "coordinator_epoch",
            env.uint("coordinator_epoch").map(|e| e.to_string()),
            c.reservation_coordinator_epoch.to_string(),
        ),
    ];
    for (field, got, want) in &checks {
        if got.as_deref() != Some(want.as_str()) {
            return Err(OpError::new(
                Category::Mismatch,
                format!("{field} does not match reservation {}", ch.reservation_id),
            ));
        }
    }
    use subtle::ConstantTimeEq;
    let shown = env.str("fence_proof").as_bytes();
    if shown.len() != fence_commitment.len()
        || !bool::from(shown.ct_eq(fence_commitment.as_bytes()))
    {
        return Err(OpError::new(
            Category::FenceMismatch,
            format!(
                "fence_proof is not the commitment of reservation {}'s generation",
                ch.reservation_id
            ),
        ));
    }
    Ok(())
}

impl Service {
    async fn chain_for(
        &self,
        host: &str,
        l: &Leader,
        env: &Envelope<Verified>,
    ) -> Result<ChainRow, OpError> {
        let res = env.str("reservation_id");
        let c = self
            .store
            .chain_by_reservation(res)
            .await?
            .ok_or_else(|| OpError::new(Category::NotFound, format!("no reservation {res}")))?;
        owned(host, env, &c, l, &self.fence_commitment(&c))?;
        Ok(c)
    }

    async fn on_staged(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, env).await?;
        let identity = canonical::to_json(env.get("process_identity").unwrap_or(&Value::Null));
        let generation = c.generation.unwrap_or(0);
        self.step(
            &l,
            self.store
                .record_staged(&l, &c.chain, generation, &identity)
                .await,
        )
        .await?;
        self.advance(&l, &c.chain.reservation_id).await?;
        Ok(())
    }

    async fn on_injected(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, env).await?;
        let identity = canonical::to_json(env.get("process_identity").unwrap_or(&Value::Null));
        let r = self
            .store
            .record_injected(
                &l,
                &c.chain,
                env.str("delivered_contracts_digest"),
                &identity,
                self.timing.challenge_ttl_ms,
            )
            .await;
        self.step(&l, r).await?;
        self.advance(&l, &c.chain.reservation_id).await?;
        Ok(())
    }

    async fn on_ack(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, env).await?;
        let claim = AckClaim {
            challenge_id: env.str("challenge_id").into(),
            sot_incarnation: env.str("sot_incarnation").into(),
            coordinator_epoch: env.uint("coordinator_epoch").unwrap_or(0) as i64,
            reservation_id: env.str("reservation_id").into(),
            reservation_epoch: env.uint("reservation_epoch").unwrap_or(0) as i64,
            reservation_deadline: env.str("reservation_deadline").into(),
            lane_id: env.str("lane_id").into(),
            lane_incarnation_id: env.str("lane_incarnation_id").into(),
            assignment_id: env.str("assignment_id").into(),
            assignment_attempt_id: env.str("assignment_attempt_id").into(),
            generation: env.uint("generation").unwrap_or(0) as i64,
            process_identity: canonical::to_json(
                env.get("process_identity").unwrap_or(&Value::Null),
            ),
            contracts_digest: env.str("contracts_digest").into(),
            scope_digest: env.str("scope_digest").into(),
            holds_digest: env.str("holds_digest").into(),
            runtime_id: env.str("runtime_id").into(),
            ack_digest: env.digest(),
        };
        self.step(&l, self.store.consume_ack(&l, &claim).await)
            .await?;
        self.advance(&l, &c.chain.reservation_id).await?;
        Ok(())
    }

    /// A RUNNING generation's progress: bound to its own chain (the ownership checks), then
    /// the one fenced compare-and-swap that may move `last_progress_at`.
    async fn on_progress(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, env).await?;
        let claim = crate::coordinator::continuity::ProgressClaim {
            chain: c.chain.clone(),
            generation: env.uint("generation").unwrap_or(0) as i64,
            evidence_kind: env.str("evidence_kind").into(),
            evidence_digest: env.str("evidence_digest").into(),
            next_action: env.get("next_action").and_then(|v| match v {
                Value::Str(s) => Some(s.clone()),
                _ => None,
            }),
            message_id: env.str("message_id").into(),
        };
        let r = self
            .step(&l, self.store.record_progress(&l, &claim).await)
            .await?;
        if !r.replayed {
            tracing::info!(lane_id = %c.chain.lane_id, assignment_id = %c.chain.assignment_id,
                evidence_kind = %claim.evidence_kind, "validated progress: inactivity deadline moved");
        }
        Ok(())
    }

    /// A handoff target's ACK: bound to its own chain (the ownership checks), then the one
    /// compare-and-swap that moves responsibility and fences the source.
    async fn on_handoff_ack(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, env).await?;
        let claim = crate::coordinator::handoff::HandoffAckClaim {
            handoff_challenge_id: env.str("handoff_challenge_id").into(),
            sot_incarnation: env.str("sot_incarnation").into(),
            coordinator_epoch: env.uint("coordinator_epoch").unwrap_or(0) as i64,
            assignment_id: env.str("assignment_id").into(),
            source_assignment_attempt_id: env.str("source_assignment_attempt_id").into(),
            target_assignment_attempt_id: env.str("assignment_attempt_id").into(),
            responsibility_owner: env.str("responsibility_owner").into(),
            execution_owner: env.str("execution_owner").into(),
            pending_target: env.str("pending_target").into(),
            next_action_digest: env.str("next_action_digest").into(),
            scope_digest: env.str("scope_digest").into(),
            holds_digest: env.str("holds_digest").into(),
            contracts_digest: env.str("contracts_digest").into(),
            lane_incarnation_id: env.str("lane_incarnation_id").into(),
            generation: env.uint("generation").unwrap_or(0) as i64,
            challenge_deadline: env.str("challenge_deadline").into(),
            ack_digest: env.digest(),
        };
        let r = self
            .step(&l, self.store.accept_handoff(&l, &claim).await)
            .await?;
        if !r.replayed {
            tracing::warn!(assignment_id = %claim.assignment_id, lane_id = %c.chain.lane_id,
                "handoff accepted: responsibility moved; the source is fenced and the target awaits its own activation");
        }
        // The source's generation is to be stopped; the target chain gets its challenge.
        if let Some(src) = r.body["source_reservation_id"].as_str() {
            let _ = self.advance(&l, src).await;
        }
        self.advance(&l, &c.chain.reservation_id).await?;
        Ok(())
    }

    /// The host accepts a continuation for its settled harness: exactly once, for the
    /// current claim (see `coordinator::continuation`); then it is told to make it visible.
    async fn on_continuation_accept(
        &self,
        host: &str,
        env: &Envelope<Verified>,
    ) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, env).await?;
        let claim = crate::coordinator::continuation::AcceptClaim {
            continuation_id: env.str("continuation_id").into(),
            claim_ref: env.str("claim_ref").into(),
            reservation_id: c.chain.reservation_id.clone(),
            lane_incarnation_id: c.chain.lane_incarnation_id.clone(),
            generation: env.uint("generation").unwrap_or(0) as i64,
            next_action_digest: env.str("next_action_digest").into(),
        };
        let r = self
            .step(&l, self.store.accept_continuation(&l, &claim).await)
            .await?;
        if !r.replayed {
            tracing::info!(lane_id = %c.chain.lane_id, assignment_id = %c.chain.assignment_id,
                continuation_id = %claim.continuation_id, "continuation accepted (loop budget debited)");
        }
        self.push_continuations(&l, Some(&claim.continuation_id))
            .await;
        Ok(())
    }

    async fn on_continuation_result(
        &self,
        host: &str,
        env: &Envelope<Verified>,
    ) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, env).await?;
        let r = self
            .store
            .record_continuation_result(
                &l,
                env.str("continuation_id"),
                &c.chain.lane_incarnation_id,
                env.uint("generation").unwrap_or(0) as i64,
                env.str("result_evidence_digest"),
            )
            .await;
        self.step(&l, r).await?;
        Ok(())
    }

    /// A RUNNING generation says it is blocked, with evidence and an unblock action.
    async fn on_blocked(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, env).await?;
        let by = crate::coordinator::continuity::Blocker::Generation {
            chain: c.chain.clone(),
            generation: env.uint("generation").unwrap_or(0) as i64,
        };
        let r = self
            .store
            .block(
                &l,
                &c.chain.assignment_id,
                &by,
                env.str("blocker_code"),
                env.str("blocker_evidence_digest"),
                env.str("next_action"),
            )
            .await;
        self.step(&l, r).await?;
        tracing::warn!(lane_id = %c.chain.lane_id, assignment_id = %c.chain.assignment_id,
            reason = env.str("blocker_code"), "work blocked by its generation");
        Ok(())
    }

    /// Records the outcome of a transition the host's message asked for.
    async fn step<T>(&self, l: &Leader, r: Result<T, AuthorityError>) -> Result<T, OpError> {
        match r {
            Ok(v) => {
                self.bump();
                Ok(v)
            }
            Err(e) => {
                self.note(l, &e).await;
                Err(e.into())
            }
        }
    }

    /// A termination receipt: ingested and reconciled, then acknowledged with a verdict —
    /// `ingested`, `retry:<category>` (the host sends it again later) or
    /// `refused:<category>` (it never will be ingestible).
    async fn on_receipt(&self, host: &str, env: &Envelope<Verified>) -> Handled {
        let key = env.str("receipt_idempotency_key").to_string();
        let verdict = match self.ingest_receipt(host, env).await {
            Ok(()) => "ingested".to_string(),
            Err(e) => {
                let final_refusal = matches!(
                    e.category,
                    Category::NotOwner
                        | Category::Mismatch
                        | Category::BadInput
                        | Category::Conflict
                        | Category::NotFound
                );
                tracing::warn!(host, receipt_key = %key, category = e.category.as_str(), error = %e.message, "termination receipt not ingested");
                self.store.auditor().record(
                    "host-receipt",
                    e.category,
                    None,
                    None,
                    non_empty(env.str("lane_incarnation_id")),
                    &format!("host:{host} receipt {key}: {}", e.message),
                );
                format!(
                    "{}:{}",
                    if final_refusal { "refused" } else { "retry" },
                    e.category.as_str()
                )
            }
        };
        // A host never has a receipt for a lane the coordinator does not know: for
        // receipts, `not-found` counts against the session too.
        let violation = verdict
            .strip_prefix("refused:")
            .and_then(Category::parse)
            .filter(|c| hostile(*c) || *c == Category::NotFound)
            .map(|c| format!("refused-{}", c.as_str()));
        let epoch = self.leadership.current().await.map(|l| l.epoch());
        let ack = Outgoing::new(
            &self.session,
            MessageType::ReceiptAck,
            vec![
                ("idempotency_key", s(&format!("receipt-ack/{key}"))),
                ("sot_incarnation", Value::Null),
                (
                    "coordinator_epoch",
                    epoch.map(|e| n(e as u64)).unwrap_or(Value::Null),
                ),
                ("assignment_id", Value::Null),
                ("session_id", s(env.str("session_id"))),
                ("receipt_idempotency_key", s(&key)),
                ("verdict", s(&verdict)),
            ],
        );
        Handled {
            replies: vec![ack],
            violation,
        }
    }

    async fn ingest_receipt(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
        let l = self.leader().await?;
        let body = canonical::to_json(env.get("receipt").unwrap_or(&Value::Null));
        // The body must be about the very lane and generation the envelope names.
        let same = body["lane_id"].as_str() == Some(env.str("lane_id"))
            && body["lane_incarnation_id"].as_str() == Some(env.str("lane_incarnation_id"))
            && body["generation"].as_u64() == env.uint("generation")
            && body["idempotency_key"].as_str() == Some(env.str("receipt_idempotency_key"))
            && body["host_id"].as_str() == Some(host);
        if !same {
            return Err(OpError::new(
                Category::Mismatch,
                "the receipt body names another lane, generation, key or host than its envelope",
            ));
        }
        let (rec, r) = self
            .step(&l, self.store.ingest_termination(&l, host, &body).await)
            .await?;
        tracing::info!(
            receipt_key = %body["idempotency_key"].as_str().unwrap_or(""),
            lane_id = %env.str("lane_id"),
            generation = env.uint("generation").unwrap_or(0),
            reason = %body["termination_reason"].as_str().unwrap_or(""),
            ?rec,
            replayed = r.replayed,
            "termination receipt reconciled"
        );
        if matches!(rec, Reconciliation::Retiring { .. }) {
            let inc = env.str("lane_incarnation_id");
            match self.store.finish(&l, inc).await {
                Ok(_) => self.bump(),
                Err(e) => {
                    self.note(&l, &e).await;
                    tracing::warn!(error = %e, "finish after the receipt failed; the watchdog retries");
                }
            }
        }
        Ok(())
    }

    /// A hello: adopt the lanes it names, record what the host advertises, and reconcile.
    /// A host's state: the hello that opened its session, or a `report` after a change.
    async fn on_state(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
        if env.str("host_id") != host {
            return Err(OpError::new(
                Category::NotOwner,
                "the report names another host",
            ));
        }
        let l = self.leader().await?;
        let list = |field: &str| -> Vec<String> {
            match env.get(field) {
                Some(Value::Array(v)) => v
                    .iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect(),
                _ => vec![],
            }
        };
        // The whole report is refused (and nothing adopted) if any entry is not a lane
        // name and incarnation as hosts make them, or there are more than a host may have.
        let lanes = list("lanes");
        let runtimes = list("runtimes");
        let lanes_ok = lanes.len() <= report::MAX_LANES
            && lanes.iter().all(|l| {
                l.split_once('@')
                    .is_some_and(|(n, i)| report::lane_name_ok(n) && report::incarnation_ok(i))
            });
        let runtimes_ok = runtimes.len() <= report::MAX_RUNTIMES
            && runtimes.iter().all(|r| report::id_ok(r) && r.len() <= 64);
        if !lanes_ok || !runtimes_ok {
            return Err(OpError::new(
                Category::BadInput,
                format!(
                    "the report's {} are not valid (at most {} lanes named 1-32 of A-Za-z0-9-_, each with an li- incarnation; at most {} runtimes)",
                    if lanes_ok { "runtimes" } else { "lanes" },
                    report::MAX_LANES,
                    report::MAX_RUNTIMES
                ),
            ));
        }
        let session_id = env.str("session_id");
        if self.hosts.runtimes_changed(host, session_id, &runtimes) {
            self.store.record_host(host, &runtimes).await?;
            self.hosts.runtimes_recorded(host, session_id, runtimes);
        }
        for lane in lanes {
            let Some((name, inc)) = lane.split_once('@') else {
                continue;
            };
            let lane_id = format!("{host}:{name}");
            if let Err(e) = self
                .store
                .adopt_lane_incarnation(&l, host, &lane_id, inc)
                .await
            {
                self.note(&l, &e).await;
                tracing::warn!(lane_id, error = %e, "lane not registered");
            } else {
                self.bump();
            }
        }
        let report: HostReport = match env.get("lane_states") {
            Some(v) => report::from_value("lane_states", v)
                .map_err(|e| OpError::new(Category::BadInput, e.to_string()))?,
            None => HostReport::new(),
        };
        // A session's hello resends whatever every chain of the host waits for; a later
        // report (the host's state changed) only reconciles what it reports.
        let full = env.message_type() == MessageType::Hello;
        self.reconcile_report(&l, host, Some(&report), full).await;
        Ok(())
    }

    /// Reconciles a host: what its report shows against the database, then every live
    /// chain of the host driven on (each resends what it waits for).
    pub(crate) async fn reconcile_host(&self, l: &Leader, host: &str, report: Option<&HostReport>) {
        self.reconcile_report(l, host, report, true).await
    }

    async fn reconcile_report(
        &self,
        l: &Leader,
        host: &str,
        report: Option<&HostReport>,
        resend: bool,
    ) {
        let lanes = match self.store.lanes_of_host(host).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(host, error = %e, "cannot reconcile");
                return;
            }
        };
        let mut orders: BTreeMap<String, LaneOrder> = BTreeMap::new();
        for lane in lanes {
            let name = lane.lane_id.split_once(':').map(|(_, n)| n).unwrap_or("");
            let inc = lane.lane_incarnation_id.clone();
            let rep = report
                .and_then(|r| r.get(name))
                .filter(|r| r.lane_incarnation_id == inc);
            let mut end: BTreeSet<i64> = BTreeSet::new();
            if let Some(rep) = rep {
                if rep.status == "quarantined" {
                    let reason = format!(
                        "host: {}",
                        rep.quarantine_reason.clone().unwrap_or_default()
                    );
                    if lane.host_quarantine_reason.as_deref() != Some(reason.as_str()) {
                        let r = self
                            .store
                            .host_quarantine(
                                l,
                                &inc,
                                rep.quarantine_reason.as_deref().unwrap_or("quarantined"),
                            )
                            .await;
                        if self.step(l, r).await.is_ok() {
                            tracing::warn!(lane_id = %lane.lane_id, reason, "the host quarantined the lane");
                        }
                    }
                }
                for g in &rep.generations {
                    let gen = g.generation as i64;
                    let chain = self
                        .store
                        .chain_of_generation(&inc, gen)
                        .await
                        .ok()
                        .flatten();
                    match chain {
                        None => {
                            end.insert(gen);
                        }
                        Some(c)
                            if c.stop_requested || c.generation_state == Some(GenState::Ended) =>
                        {
                            end.insert(gen);
                        }
                        Some(c)
                            if c.lane_state.is_preactivation()
                                && c.reservation_open
                                && !g.chain_held =>
                        {
                            let r = self.store.end_chain(l, &c.chain, EndCause::Abandoned).await;
                            if self.step(l, r).await.is_ok() {
                                tracing::warn!(lane_id = %lane.lane_id, generation = gen, "the host lost the chain before activation: ended in recovery");
                            }
                            end.insert(gen);
                        }
                        Some(c)
                            if c.lane_state == LaneState::Running
                                && c.reservation_open
                                && !g.activated =>
                        {
                            self.push_activated(l, &c).await;
                        }
                        Some(_) => {}
                    }
                }
            }
            // A generation the coordinator asked to end — or one the host reported live
            // (`staged`) and now no longer lists — is over on the host: it answers with its
            // receipt (sent again if it was lost), or fences it as never started.
            if let Some(u) = lane.unended_generation {
                if let Ok(Some(c)) = self.store.chain_of_generation(&inc, u).await {
                    let gone = rep.is_some_and(|r| {
                        c.generation_state == Some(GenState::Live)
                            && !r.generations.iter().any(|g| g.generation as i64 == u)
                    });
                    if c.stop_requested || gone {
                        end.insert(u);
                    }
                }
            }
            if !end.is_empty() || lane.recreate_requested {
                orders.insert(
                    lane.lane_id.clone(),
                    LaneOrder {
                        incarnation: inc,
                        end,
                        recreate: lane.recreate_requested,
                    },
                );
            }
        }
        self.push_reconcile(l, host, &orders).await;
        if resend {
            self.advance_all(l, Some(host)).await;
        }
    }
}
