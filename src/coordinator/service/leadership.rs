//! The leadership loop: acquire, renew on a connection of its own, and heal a lapse.
//!
//! A coordinator that is not leading stands by and keeps trying to acquire; the moment the
//! lease of the holder lapses (or is released) it takes a new epoch. A leader renews at a
//! third of its lease on a dedicated connection that no other load can starve. A failed
//! renewal — or a transition refused as `stale-leader` — drops the leadership at once and
//! re-acquires with a new epoch; the loss and the regain are logged and counted for
//! `mosaic status`.
//!
//! **Never:** acts on a cached lease: the database decides every transition (and every
//! renewal) by its own clock; this state only says whom to ask.

use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Notify, RwLock};

use crate::coordinator::error::{AuthorityError, Category};
use crate::coordinator::leader::{Candidate, Leader};

/// What `mosaic status` shows about this coordinator's leadership.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LeadershipStatus {
    /// `leading` or `standby`.
    pub state: String,
    pub epoch: Option<i64>,
    pub lease_expires_at: Option<String>,
    /// Host time this process last started leading.
    pub leading_since: Option<String>,
    pub acquisitions: u64,
    pub losses: u64,
    pub last_lost_at: Option<String>,
    pub last_loss_reason: Option<String>,
}

pub(crate) struct Leadership {
    current: RwLock<Option<Leader>>,
    status: Mutex<LeadershipStatus>,
    /// When the leadership loop last completed an iteration (`transport::mono_ms`): the
    /// systemd watchdog pings only while it keeps turning.
    pub(crate) last_turn: std::sync::atomic::AtomicU64,
    /// Woken when a transition was refused as stale: re-check now, not at the next tick.
    kick: Notify,
    /// Woken when this process starts leading (the driver then takes over its chains).
    gained: Notify,
}

impl Leadership {
    pub fn new() -> Self {
        Self {
            current: RwLock::new(None),
            status: Mutex::new(LeadershipStatus {
                state: "standby".into(),
                ..Default::default()
            }),
            kick: Notify::new(),
            gained: Notify::new(),
            last_turn: std::sync::atomic::AtomicU64::new(crate::protocol::transport::mono_ms()),
        }
    }

    fn turned(&self) {
        self.last_turn.store(
            crate::protocol::transport::mono_ms(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// How long ago the leadership loop last turned.
    pub(crate) fn since_turn(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            crate::protocol::transport::mono_ms()
                .saturating_sub(self.last_turn.load(std::sync::atomic::Ordering::Relaxed)),
        )
    }

    /// The leadership to act under, if this process believes it leads.
    pub async fn current(&self) -> Option<Leader> {
        self.current.read().await.clone()
    }

    pub fn status(&self) -> LeadershipStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// A transition under `epoch` was refused as stale: stop using it and re-acquire.
    /// True when this dropped the current leadership.
    pub async fn stale(&self, epoch: i64) -> bool {
        let dropped = self
            .drop_epoch(epoch, "a transition was refused: stale leadership")
            .await;
        self.kick.notify_one();
        dropped
    }

    /// Stops using `epoch` if it is still the one this process believes it leads, and
    /// records why; true when it was.
    async fn drop_epoch(&self, epoch: i64, why: &str) -> bool {
        let mut cur = self.current.write().await;
        let dropped = cur.as_ref().map(|l| l.epoch()) == Some(epoch);
        if dropped {
            *cur = None;
            drop(cur);
            self.lost(epoch, why);
        }
        dropped
    }

    pub async fn wait_gained(&self) {
        self.gained.notified().await
    }

    fn lost(&self, epoch: i64, why: &str) {
        tracing::error!(
            epoch,
            reason = why,
            "leadership lost; re-acquiring with a new epoch"
        );
        if let Ok(mut s) = self.status.lock() {
            s.state = "standby".into();
            s.losses += 1;
            s.last_lost_at = Some(crate::util::now_rfc3339());
            s.last_loss_reason = Some(why.to_string());
            s.epoch = None;
            s.lease_expires_at = None;
        }
    }

    async fn set(&self, l: Leader) {
        let epoch = l.epoch();
        let exp = l.lease_expires_at().to_string();
        *self.current.write().await = Some(l);
        if let Ok(mut s) = self.status.lock() {
            s.state = "leading".into();
            s.epoch = Some(epoch);
            s.lease_expires_at = Some(exp);
            s.leading_since = Some(crate::util::now_rfc3339());
            s.acquisitions += 1;
        }
        self.gained.notify_waiters();
    }

    async fn renewed(&self, l: Leader) {
        let exp = l.lease_expires_at().to_string();
        let mut cur = self.current.write().await;
        if cur.as_ref().map(|c| c.epoch()) == Some(l.epoch()) {
            *cur = Some(l);
            if let Ok(mut s) = self.status.lock() {
                s.lease_expires_at = Some(exp);
            }
        }
    }
}

/// Acquires while standing by and renews while leading, until `stop` is triggered; then
/// gives up the lease it holds, so a standby need not wait for it to expire.
pub(crate) async fn run(
    svc: std::sync::Arc<super::Service>,
    cand: Candidate,
    lease_ms: i64,
    mut stop: crate::util::shutdown::ShutdownSignal,
) {
    lead(&svc, &cand, lease_ms, &mut stop).await;
    if let Some(l) = svc.leadership.current().await {
        match svc.store.release(&l).await {
            Ok(()) => tracing::info!(epoch = l.epoch(), "leadership released"),
            Err(e) => {
                tracing::warn!(epoch = l.epoch(), error = %e, "cannot release leadership; it lapses at its deadline")
            }
        }
    }
}

/// This process no longer leads epoch `l` (if that is still the one it believed it led):
/// forgotten, counted, and every host session closed.
async fn step_down(svc: &std::sync::Arc<super::Service>, l: &Leader, why: &str) {
    if svc.leadership.drop_epoch(l.epoch(), why).await {
        svc.leadership_lost();
    }
}

async fn lead(
    svc: &std::sync::Arc<super::Service>,
    cand: &Candidate,
    lease_ms: i64,
    stop: &mut crate::util::shutdown::ShutdownSignal,
) {
    let renew_every = Duration::from_millis((lease_ms / 3).max(50) as u64);
    let retry_every = Duration::from_millis((lease_ms / 4).clamp(50, 2000) as u64);
    let lease = Duration::from_millis(lease_ms.max(0) as u64);
    let mut client: Option<tokio_postgres::Client> = None;
    // Until when this process may believe it leads, by its own monotonic clock: one lease
    // from the moment the last successful acquisition or renewal was *sent*. The database
    // set its deadline no earlier than that, so believing no longer than this never outlasts
    // the real lease — whatever the clocks say — even when the database cannot be reached to
    // say it lapsed.
    let mut believed_until = tokio::time::Instant::now();
    loop {
        if stop.is_triggered() {
            return;
        }
        svc.leadership.turned();
        let Some(mut l) = svc.leadership.current().await else {
            let sent = tokio::time::Instant::now();
            match svc.store.acquire(cand, lease_ms).await {
                Ok((l, r)) => {
                    tracing::info!(epoch = l.epoch(), receipt = %r.receipt_id, "leading");
                    believed_until = sent + lease;
                    svc.leadership.set(l).await;
                    continue;
                }
                Err(e) => {
                    if e.category() != Some(Category::LeadershipHeld) {
                        tracing::warn!(error = %e, "cannot acquire leadership");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(retry_every) => {}
                        _ = svc.leadership.kick.notified() => {}
                        _ = stop.triggered() => return,
                    }
                    continue;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(renew_every) => {}
            _ = tokio::time::sleep_until(believed_until) => {}
            _ = svc.leadership.kick.notified() => {}
            _ = stop.triggered() => return,
        }
        if tokio::time::Instant::now() >= believed_until {
            step_down(
                svc,
                &l,
                "the lease ran out unrenewed (the database did not answer in time); it may have lapsed",
            )
            .await;
            continue;
        }
        // Neither the connect nor the renewal may outlast the belief: a connection the
        // database stopped answering without closing it (a black-holed network, a stopped
        // server) held the loop for as long as TCP retried, while this process went on
        // answering `leading` past its lease and kept its hosts from failing over.
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            client = match tokio::time::timeout_at(believed_until, svc.store.dedicated()).await {
                Ok(Ok(c)) => Some(c),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "leadership connection unavailable");
                    None
                }
                Err(_) => {
                    tracing::warn!("leadership connection unavailable: the database did not answer before the lease's end");
                    None
                }
            };
        }
        let Some(c) = &client else { continue };
        let sent = tokio::time::Instant::now();
        let renewal =
            tokio::time::timeout_at(believed_until, svc.store.renew_on(c, &mut l, lease_ms)).await;
        let Ok(renewal) = renewal else {
            // Past the lease: the next turn steps down; this connection is not used again.
            tracing::warn!(
                "leadership renewal unanswered until the lease's end; dropping its connection"
            );
            client = None;
            continue;
        };
        match renewal {
            Ok(()) => {
                believed_until = sent + lease;
                svc.leadership.renewed(l).await
            }
            Err(AuthorityError::Rejected { .. }) => {
                step_down(
                    svc,
                    &l,
                    "the lease expired or was taken over before renewal",
                )
                .await
            }
            Err(e) => {
                // The connection failed: the database decides whether the lease lapses.
                tracing::warn!(error = %e, "leadership renewal failed; retrying on a new connection");
                client = None;
            }
        }
    }
}
