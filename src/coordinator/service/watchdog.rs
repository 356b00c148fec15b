//! What time alone decides, evaluated by the leader every half second through the same
//! fenced transitions as everything else (database time; equality at a deadline is
//! expired): reservation expiry before activation, effect-lease renewal and expiry, and
//! chains a dead coordinator process left mid-way (a reservation not yet staged, a READY
//! not yet activated, a RETIRING lane not yet finished). It also resends a message a chain
//! has waited on for too long.
//!
//! **Never:** decides with a host clock: it only asks the database, which decides.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::coordinator::ending::EndCause;
use crate::coordinator::leader::Leader;

use super::driver::RESEND_AFTER;
use super::Service;

const TICK: Duration = Duration::from_millis(500);

pub(crate) async fn run(svc: Arc<Service>) {
    loop {
        let gained = tokio::select! {
            _ = tokio::time::sleep(TICK) => false,
            _ = svc.leadership.wait_gained() => true,
        };
        let Some(l) = svc.leadership.current().await else {
            continue;
        };
        if gained {
            // A new epoch: every connected host is reconciled (the takeover ended the old
            // epoch's preactivation chains; their generations are to be stopped).
            for host in svc.hosts.connected() {
                if let Some(h) = host.strip_prefix("host:") {
                    svc.reconcile_host(&l, h, None).await;
                }
            }
        }
        svc.sweep(&l).await;
    }
}

impl Service {
    async fn sweep(&self, l: &Leader) {
        match self.store.expired_chains().await {
            Ok(chains) => {
                for (c, _host) in chains {
                    match self.store.end_chain(l, &c, EndCause::Expired).await {
                        Ok(_) => {
                            self.bump();
                            tracing::warn!(lane_id = %c.lane_id, assignment_id = %c.assignment_id, "reservation expired before activation: recovery");
                            let _ = self.advance(l, &c.reservation_id).await;
                        }
                        Err(e) => {
                            self.note(l, &e).await;
                            tracing::debug!(error = %e, "expiry not applied");
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "watchdog cannot read expired chains"),
        }
        match self.store.running_leases().await {
            Ok(v) => {
                for (c, host, expired, half) in v {
                    let r = if expired {
                        tracing::warn!(lane_id = %c.lane_id, assignment_id = %c.assignment_id, "effect lease expired: recovery");
                        self.store.expire_leases(l, &c).await.map(|_| true)
                    } else if half && self.hosts.is_connected(&host) {
                        self.store
                            .renew_leases(l, &c, self.timing.lease_ttl_ms)
                            .await
                            .map(|_| false)
                    } else {
                        continue;
                    };
                    match r {
                        Ok(ended) => {
                            self.bump();
                            if ended {
                                let _ = self.advance(l, &c.reservation_id).await;
                            }
                        }
                        Err(e) => self.note(l, &e).await,
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "watchdog cannot read leases"),
        }
        let chains = match self.store.live_chains(None).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "watchdog cannot list live chains");
                return;
            }
        };
        let mut live = BTreeSet::new();
        for c in chains {
            live.insert(c.chain.reservation_id.clone());
            let ours = c.reservation_coordinator_epoch == l.epoch();
            let actionable = match c.lane_state.as_str() {
                "RESERVED" | "CHECKPOINTING" | "FENCED" | "READY" => c.reservation_open && ours,
                "RETIRING" => true,
                _ => false,
            };
            let waiting_state = if c.stop_requested {
                "END"
            } else {
                c.lane_state.as_str()
            };
            let waiting = matches!(
                waiting_state,
                "STAGING" | "CONTRACT_INJECTING" | "AWAITING_ACK" | "END"
            ) && self.hosts.is_connected(&c.host_id)
                && self.stale_since(&c.chain.reservation_id, waiting_state, RESEND_AFTER);
            if actionable || waiting {
                if let Err(e) = self.advance(l, &c.chain.reservation_id).await {
                    tracing::debug!(reservation_id = %c.chain.reservation_id, error = %e.message, "watchdog could not advance a chain");
                }
            }
        }
        self.forget_sent(&live);
    }
}
