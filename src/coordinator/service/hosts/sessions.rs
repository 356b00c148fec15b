//! The table of live host sessions: one per host, its liveness, the doubling penalty after
//! an abusive session, and the sender the driver pushes envelopes through.

use super::*;

pub(super) struct Session {
    pub(super) session_id: String,
    pub(super) session_epoch: i64,
    pub(super) handle: SessionHandle,
    /// The runtimes this session last had recorded in `hosts` (a report repeats them on
    /// every state change; only a change is written).
    pub(super) runtimes: Option<Vec<String>>,
}

/// A host that was disconnected for abusing its session waits before the next one.
pub(super) struct Penalty {
    pub(super) until: std::time::Instant,
    pub(super) strikes: u32,
    pub(super) last: std::time::Instant,
}

/// The live session of each host, and the hosts waiting out a penalty.
#[derive(Default)]
pub(crate) struct Sessions {
    pub(super) map: Mutex<HashMap<String, Session>>,
    pub(super) penalties: Mutex<HashMap<String, Penalty>>,
    /// When each host's recent sessions opened (a session costs a row and an epoch).
    pub(super) opens: Mutex<HashMap<String, std::collections::VecDeque<std::time::Instant>>>,
}

/// Sessions a host may open per minute. A supervisor reconnecting with its backoff opens
/// far fewer; a credential cycling sessions is refused until the minute rolls on.
pub(super) const MAX_OPENS_PER_MINUTE: usize = 30;

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
    pub(super) fn refusal(&self, host_id: &str, liveness: &transport::Liveness) -> Option<String> {
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

    /// Makes `handle` the host's live session. The one it replaces (closed, or silent past
    /// the limit, as [`Self::refusal`] admitted) is closed here, and the reason is decided
    /// once: silent past the limit is `silent` — the reason it could be replaced at all —
    /// even when its own liveness tick has not come round yet; otherwise `superseded`.
    /// Returns the old session and that reason, which every record of the close uses.
    pub(super) fn install(
        &self,
        host_id: &str,
        handle: SessionHandle,
        session_epoch: i64,
        liveness: &transport::Liveness,
    ) -> Option<(Session, transport::CloseReason)> {
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
        )?;
        let why = if old.handle.silent_for() > liveness.limit {
            transport::CloseReason::Silent {
                limit_s: liveness.limit.as_secs(),
            }
        } else {
            transport::CloseReason::Superseded { session_epoch }
        };
        let reason = old.handle.close_for(why);
        Some((old, reason))
    }

    /// Closes every live session with `reason`.
    pub fn close_all(&self, reason: transport::CloseReason) {
        if let Ok(m) = self.map.lock() {
            for s in m.values() {
                s.handle.close(reason.clone());
            }
        }
    }

    /// Closes the session of `host_id`, if it has one.
    pub fn close_host(&self, host_id: &str, reason: transport::CloseReason) -> bool {
        match self.map.lock() {
            Ok(m) => m.get(host_id).map(|s| s.handle.close(reason)).is_some(),
            Err(_) => false,
        }
    }

    pub(super) fn remove(&self, host_id: &str, session_id: &str) {
        if let Ok(mut m) = self.map.lock() {
            if m.get(host_id).is_some_and(|s| s.session_id == session_id) {
                m.remove(host_id);
            }
        }
    }

    /// A session closed for abuse: the host waits 2 s, doubling with each repeat within
    /// ten minutes, up to 5 min.
    pub(super) fn penalize(&self, host_id: &str) {
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
    pub(super) fn runtimes_changed(
        &self,
        host_id: &str,
        session_id: &str,
        runtimes: &[String],
    ) -> bool {
        let Ok(m) = self.map.lock() else {
            return true;
        };
        m.get(host_id)
            .filter(|s| s.session_id == session_id)
            .is_none_or(|s| s.runtimes.as_deref() != Some(runtimes))
    }

    pub(super) fn runtimes_recorded(&self, host_id: &str, session_id: &str, runtimes: Vec<String>) {
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
                handle.close(transport::CloseReason::QueueFull);
            }
            OpError::new(
                Category::HostUnreachable,
                format!("cannot send to host:{host_id}: {e}"),
            )
        })
    }
}
