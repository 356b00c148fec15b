//! What time alone decides, evaluated by the leader every half second through the same
//! fenced transitions as everything else (database time; equality at a deadline is
//! expired): reservation expiry before activation, effect-lease renewal and expiry, and
//! chains a dead coordinator process left mid-way (a reservation not yet staged, a READY
//! not yet activated, a RETIRING lane not yet finished). It also resends a message a chain
//! has waited on for too long, and destroys the lanes of ended elastic-lane leases (the TTL
//! worker, `elastic.rs`).
//!
//! **Never:** decides with a host clock: it only asks the database, which decides.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::coordinator::ending::EndCause;
use crate::coordinator::leader::Leader;

use super::driver::RESEND_AFTER;
use super::Service;
use crate::coordinator::states::{LaneState, Lifecycle, WatchdogStep};

const TICK: Duration = Duration::from_millis(500);
/// How often the leader forgets old operator requests, and after how many days.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
const REQUESTS_KEPT_DAYS: i32 = 30;

/// Sweeps every tick while this process leads, until `stop` is triggered (a sweep in
/// progress finishes first: each of its steps is a whole transition).
pub(crate) async fn run(svc: Arc<Service>, mut stop: crate::util::shutdown::ShutdownSignal) {
    let mut pruned = std::time::Instant::now();
    let mut lease_orders_sent = std::time::Instant::now();
    loop {
        let gained = tokio::select! {
            _ = tokio::time::sleep(TICK) => false,
            _ = svc.leadership.wait_gained() => true,
            _ = stop.triggered() => return,
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
        svc.sync_holds(&l).await;
        svc.destroy_due_leases(&l).await;
        svc.quarantine_unmade_leases(&l).await;
        if lease_orders_sent.elapsed() >= RESEND_AFTER {
            lease_orders_sent = std::time::Instant::now();
            svc.resend_lease_orders(&l).await;
        }
        if pruned.elapsed() >= PRUNE_EVERY {
            pruned = std::time::Instant::now();
            match svc.store.prune_requests(REQUESTS_KEPT_DAYS).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    forgotten = n,
                    "operator requests older than {REQUESTS_KEPT_DAYS} days forgotten"
                ),
                Err(e) => tracing::warn!(error = %e, "operator requests could not be pruned"),
            }
        }
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
            let actionable = match c.lane_state {
                LaneState::Reserved
                | LaneState::Checkpointing
                | LaneState::Fenced
                | LaneState::Ready => c.reservation_open && ours,
                LaneState::Retiring => true,
                _ => false,
            };
            let waiting_state = if c.stop_requested {
                "END"
            } else {
                c.lane_state.as_str()
            };
            let waiting = (c.stop_requested
                || matches!(
                    c.lane_state,
                    LaneState::Staging | LaneState::ContractInjecting | LaneState::AwaitingAck
                ))
                && self.hosts.is_connected(&c.host_id)
                && self.stale_since(&c.chain.reservation_id, waiting_state, RESEND_AFTER);
            if actionable || waiting {
                if let Err(e) = self.advance(l, &c.chain.reservation_id).await {
                    tracing::debug!(reservation_id = %c.chain.reservation_id, error = %e.message, "watchdog could not advance a chain");
                }
            }
        }
        self.end_withdrawn_targets(l).await;
        self.resume_due(l).await;
        self.inactivity(l).await;
        self.retarget_stranded(l).await;
        live.extend(self.push_continuations(l, None).await);
        self.forget_sent(&live);
    }

    /// Resumes blocked work whose known end has come (a provider's rate limit reset),
    /// without an operator: active again, then a continuation for its RUNNING generation
    /// (a separate transition; refused when nothing runs it or its loop budget is spent,
    /// and then the inactivity watchdog gives it a fresh generation as for any active work).
    async fn resume_due(&self, l: &Leader) {
        let due = match self.store.due_resumes().await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "watchdog cannot read blocked work due to resume");
                return;
            }
        };
        for d in due {
            match self.store.resume_blocked(l, &d).await {
                Ok(_) => {
                    self.bump();
                    tracing::info!(assignment_id = %d.assignment_id, blocked = %d.blocker_code,
                        "blocked work resumed at its known end");
                }
                Err(e) => {
                    self.note(l, &e).await;
                    continue;
                }
            }
            let request = format!(
                "resume.{}.{}",
                d.assignment_id,
                d.blocker_evidence_digest.trim_start_matches("sha256:")
            );
            match self
                .store
                .create_continuation(
                    l,
                    &d.assignment_id,
                    crate::coordinator::resume::RESUMED,
                    &request,
                    600_000,
                )
                .await
            {
                Ok(r) => {
                    if let Ok(id) = r.str("continuation_id") {
                        self.push_continuations(l, Some(&id)).await;
                    }
                }
                Err(e) => {
                    tracing::info!(assignment_id = %d.assignment_id, reason = %e,
                        "resumed work gets no continuation; the inactivity watchdog follows it");
                }
            }
        }
    }

    /// Ends the target chain of every withdrawn handoff (it can never be acknowledged; its
    /// generation would hold up the work's next attempt until its deadline).
    async fn end_withdrawn_targets(&self, l: &Leader) {
        let targets = match self.store.withdrawn_targets().await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "watchdog cannot read withdrawn handoffs");
                return;
            }
        };
        for res in targets {
            let Ok(Some(c)) = self.store.chain_by_reservation(&res).await else {
                continue;
            };
            if c.reservation_coordinator_epoch != l.epoch() {
                continue; // the takeover ends another epoch's preactivation chains
            }
            let cause = crate::coordinator::ending::EndCause::HandoffWithdrawn;
            match self.store.end_chain(l, &c.chain, cause).await {
                Ok(_) => {
                    self.bump();
                    tracing::info!(reservation_id = %res, assignment_id = %c.chain.assignment_id,
                        "the target chain of a withdrawn handoff ended");
                    let _ = self.advance(l, &res).await;
                }
                Err(e) => self.note(l, &e).await,
            }
        }
    }

    /// The inactivity policy, step by step: warn, escalate, replace the generation, start
    /// the next attempt (same lane, then another lane), and block the work for review once
    /// its attempts are used up. Every step is a fenced transition at database time.
    async fn inactivity(&self, l: &Leader) {
        let due = match self.store.due_work().await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "watchdog cannot read the work records");
                return;
            }
        };
        for w in due {
            let r = match (w.lifecycle, w.lane_state) {
                (Lifecycle::Active, LaneState::Running) if w.deadline_due => match &w.chain {
                    Some(c) => self.store.inactivity_replace(l, c).await.map(|r| {
                        tracing::warn!(lane_id = %w.lane_id, assignment_id = %w.assignment_id,
                            no_progress_since = %w.base_at, "no validated progress by the inactivity deadline: replacing the generation");
                        let _ = r;
                    }),
                    None => continue,
                },
                (Lifecycle::Active, LaneState::Running) if w.step == WatchdogStep::Warned && w.escalate_due => {
                    self.store.inactivity_notice(l, &w, true).await.map(|_| {
                        tracing::error!(lane_id = %w.lane_id, assignment_id = %w.assignment_id,
                            no_progress_since = %w.base_at, "inactivity escalated: no validated progress");
                    })
                }
                (Lifecycle::Active, LaneState::Running) if w.step == WatchdogStep::None && w.warn_due => {
                    self.store.inactivity_notice(l, &w, false).await.map(|_| {
                        tracing::warn!(lane_id = %w.lane_id, assignment_id = %w.assignment_id,
                            no_progress_since = %w.base_at, "inactivity warning: no validated progress");
                    })
                }
                (Lifecycle::Recovery, _) if (w.step == WatchdogStep::Replacing || w.deadline_due) && !w.unended => {
                    if w.attempts_used >= i64::from(w.max_attempts) {
                        self.store.inactivity_exhausted(l, &w).await.map(|_| {
                            tracing::error!(assignment_id = %w.assignment_id, attempts = w.attempts_used,
                                "inactivity policy exhausted: work blocked for operator review");
                        })
                    } else {
                        self.next_attempt(l, &w).await;
                        continue;
                    }
                }
                _ => continue,
            };
            match r {
                Ok(()) => {
                    self.bump();
                    if let Some(c) = &w.chain {
                        if w.deadline_due {
                            let _ = self.advance(l, &c.reservation_id).await;
                        }
                    }
                }
                Err(e) => {
                    self.note(l, &e).await;
                    tracing::debug!(assignment_id = %w.assignment_id, error = %e, "inactivity step not applied");
                }
            }
        }
    }

    /// The next attempt of work in recovery: the same lane while the policy allows more
    /// replacements there, then another idle lane of a connected host offering the runtime.
    /// Nothing idle: nothing happens, and the next sweep tries again.
    async fn next_attempt(&self, l: &Leader, w: &crate::coordinator::inactivity::DueWork) {
        let mut same_lane_ok = w.attempts_on_lane <= i64::from(w.replacements_before_reassign);
        let lanes = match self.store.lanes().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "watchdog cannot list lanes");
                return;
            }
        };
        // A lane that cannot take work again soon (quarantined, retired, being recreated,
        // its host gone) is no reason to wait: the next attempt goes elsewhere at once.
        if same_lane_ok {
            let usable = lanes.iter().any(|lane| {
                lane.lane_id == w.lane_id
                    && lane.state != LaneState::Quarantined
                    && !lane.recreate_requested
                    && lane.host_quarantine_reason.is_none()
                    && self.hosts.is_connected(&lane.host_id)
            });
            same_lane_ok = usable;
        }
        // Work whose start failed before activation goes to another lane only through a
        // recovery candidate (spec §6.3, `retarget@1`); work that ran goes on below.
        if !same_lane_ok {
            match self.store.retarget_eligible(&w.assignment_id).await {
                Ok(Some(Ok(_))) => {
                    if let Err(e) = self.retarget(l, &w.assignment_id).await {
                        tracing::debug!(assignment_id = %w.assignment_id, category = e.category.as_str(),
                            error = %e.message, "retarget not offered yet");
                    }
                    return;
                }
                // A start that failed but may not be retargeted (no objective evidence, its
                // source ended too, its budget spent) is never moved by a plain reservation:
                // it waits for its own lane or an operator.
                Ok(Some(Err(why))) => {
                    tracing::debug!(assignment_id = %w.assignment_id, why = %why,
                        "failed start not retargeted; it waits for its lane or an operator");
                    return;
                }
                // Its latest chain ran: an ordinary next attempt.
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "watchdog cannot read the work's failed target");
                    return;
                }
            }
        }
        // Work with a workspace goes to another host only from a checkpoint in the store.
        let has_workspace = match self.store.workspace_of(&w.assignment_id).await {
            Ok(h) => h.is_some(),
            Err(e) => {
                tracing::warn!(error = %e, "watchdog cannot read the work's workspace");
                return;
            }
        };
        let mut candidates = Vec::new();
        for lane in lanes {
            let same = lane.lane_id == w.lane_id;
            if has_workspace
                && !matches!(
                    self.store
                        .workspace_cannot_move(&w.assignment_id, &lane.host_id)
                        .await,
                    Ok(None)
                )
            {
                continue;
            }
            if lane.state != LaneState::IdleClean
                || lane.recreate_requested
                || lane.host_quarantine_reason.is_some()
                || lane.unended_generation.is_some()
                || same != same_lane_ok
                || !self.hosts.is_connected(&lane.host_id)
            {
                continue;
            }
            let offers = self
                .store
                .host_runtimes(&lane.host_id)
                .await
                .ok()
                .flatten()
                .is_some_and(|r| r.iter().any(|r| r == &w.runtime_id));
            if offers {
                candidates.push(lane);
            }
        }
        let Some(lane) = candidates.into_iter().next() else {
            return;
        };
        let next = match self.store.next_attempt(&w.assignment_id).await {
            Ok(Some(n)) => n,
            _ => return,
        };
        let req = crate::coordinator::chain::ReserveRequest {
            // One request per attempt number: a retried resume lands on the same reservation.
            request_id: format!("watchdog/{}/{}", w.assignment_id, w.attempts_total),
            lane_incarnation_id: lane.lane_incarnation_id.clone(),
            assignment_id: Some(w.assignment_id.clone()),
            target: lane.lane_id.clone(),
            runtime_id: w.runtime_id.clone(),
            task_text: next.task_text,
            scope: next.scope,
            holds: next.holds,
            completion_policy: next.completion_policy,
            inactivity_policy: String::new(),
            ttl_ms: self.timing.reservation_ttl_ms,
            repository: None, // a resumed assignment keeps its own
            grant: None,
            placement: None, // the watchdog's own choice of lane (see above)
            recovery: None,
        };
        match self.store.reserve(l, &req).await {
            Ok(r) => {
                self.bump();
                tracing::warn!(assignment_id = %w.assignment_id, lane_id = %lane.lane_id,
                    reassigned = lane.lane_id != w.lane_id, attempt = w.attempts_total + 1,
                    "watchdog: next attempt on a fresh generation");
                let _ = self.advance(l, &r.chain.reservation_id).await;
            }
            Err(e) => {
                self.note(l, &e).await;
                tracing::debug!(assignment_id = %w.assignment_id, error = %e, "next attempt not reserved");
            }
        }
    }
}
