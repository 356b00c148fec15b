//! Continuations offered to a settled generation, and the coordinator's reconcile order
//! (generations to end, workspaces to hold or release, lanes to recreate).

use super::*;
use crate::supervisor::WorkspaceOrder;

impl CoordinatedHost {
    /// A continuation for this generation. `offer`: accepted (signed back) once the harness
    /// is settled — waiting in `mosaic lane next` — and never for a generation this process
    /// cannot reach (no lane socket). `accepted`: the coordinator committed the acceptance
    /// and debited the loop budget; hand it to the waiting harness — only if this process
    /// accepted it — which gets each continuation at most once.
    pub(super) fn on_continuation(
        self: Arc<Self>,
        ctx: Arc<ChainCtx>,
        m: wire::Continuation,
        message_id: &str,
    ) {
        let (lane_id, generation) = (m.authority.lane_id.clone(), Some(m.authority.generation));
        let base = ctx.report_base.lock().ok().and_then(|f| f.clone());
        let (Some(session), Some(base)) = (ctx.session.clone(), base) else {
            self.sup.audit_stale(
                "continuation-unreachable-generation",
                Some(&lane_id),
                generation,
                message_id,
            );
            return;
        };
        let next_action = m.next_action.clone();
        if crate::protocol::work::next_action_digest(&next_action) != m.next_action_digest {
            self.sup.audit_stale(
                "continuation-digest-mismatch",
                Some(&lane_id),
                generation,
                message_id,
            );
            return;
        }
        let id = m.continuation_id.clone();
        match m.phase {
            wire::ContinuationPhase::Accepted => {
                // Already given and answered: the coordinator is still waiting, so the
                // result report was lost; send it again (the same step, the same key).
                let answered = session
                    .results
                    .lock()
                    .ok()
                    .and_then(|r| r.get(&id).cloned());
                if let Some(evidence) = answered {
                    self.send(FromHostChain::ContinuationResult(
                        wire::ContinuationResult {
                            chain: base.chain,
                            bound: base.bound,
                            continuation_id: id,
                            result_evidence_digest: evidence,
                        },
                    ));
                    return;
                }
                // Re-sent while its result is outstanding: already given, nothing to do (its
                // result comes from the harness's next settled boundary).
                if session.given(&id) {
                    return;
                }
                let ours = session
                    .accepted_here
                    .lock()
                    .map(|a| a.contains(&id))
                    .unwrap_or(false);
                if !ours {
                    self.sup.audit_stale(
                        "continuation-accepted-by-another-process",
                        Some(&lane_id),
                        generation,
                        message_id,
                    );
                    return;
                }
                crate::coordinator::failpoint::host("continuation-deliver");
                session
                    .next
                    .send_replace(Some(crate::supervisor::lanesock::Continuation {
                        continuation_id: id,
                        next_action,
                    }));
                // Nobody waiting at a settled boundary (a Stop hook gave up before the
                // acceptance came back): bring one about.
                if !*session.settled.borrow() {
                    self.wake(&lane_id, ctx.generation, session.clone());
                }
            }
            wire::ContinuationPhase::Offer => {
                let claim = m.claim_ref.clone();
                let fresh = ctx
                    .offers
                    .lock()
                    .map(|mut o| o.insert(claim.clone()))
                    .unwrap_or(false);
                if session.given(&id) {
                    return; // given already: its acceptance is behind it
                }
                if !fresh {
                    // Already waiting to accept this claim; the re-sent offer only brings
                    // about a settled boundary if none came (one wake at a time).
                    if !*session.settled.borrow() {
                        self.wake(&lane_id, ctx.generation, session.clone());
                    }
                    return;
                }
                // In flight until it lapses, or until its acceptance came back (or had time
                // to).
                struct InFlight(Arc<GenSession>, String);
                impl Drop for InFlight {
                    fn drop(&mut self) {
                        if let Ok(mut o) = self.0.offers_in_flight.lock() {
                            if let Some(i) = o.iter().position(|x| *x == self.1) {
                                o.remove(i);
                            }
                        }
                    }
                }
                if let Ok(mut o) = session.offers_in_flight.lock() {
                    o.push(id.clone());
                }
                let in_flight = InFlight(session.clone(), id.clone());
                if !*session.settled.borrow() {
                    self.clone().wake(&lane_id, ctx.generation, session.clone());
                }
                tokio::spawn(async move {
                    let _in_flight = in_flight;
                    let mut settled = session.settled.subscribe();
                    // Bounded: a harness that never settles lets the claim lapse, and the
                    // coordinator reclaims or expires it.
                    let ok = matches!(
                        tokio::time::timeout(
                            std::time::Duration::from_secs(60),
                            settled.wait_for(|s| *s),
                        )
                        .await,
                        Ok(Ok(_))
                    );
                    if !ok {
                        return; // lapsed: the coordinator reclaims or expires it
                    }
                    crate::coordinator::failpoint::host("continuation-accept");
                    if let Ok(mut a) = session.accepted_here.lock() {
                        a.insert(id.clone());
                    }
                    self.send(FromHostChain::ContinuationAccept(
                        wire::ContinuationAccept {
                            chain: base.chain,
                            bound: base.bound,
                            continuation_id: id.clone(),
                            claim_ref: claim,
                            next_action_digest: m.next_action_digest,
                            process_identity: canonical::to_json(&ctx.identity),
                        },
                    ));
                    // In flight a little longer, so a Stop hook waits for the acceptance to
                    // come back (then it is on its way as accepted); one refused is not.
                    let mut next = session.next.subscribe();
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_secs(10),
                        next.wait_for(|c| c.as_ref().is_some_and(|c| c.continuation_id == id)),
                    )
                    .await;
                });
            }
        }
    }

    /// For a harness whose continuations are given at its Stop hook (Claude Code, Codex)
    /// and which sits idle at its prompt: types a short turn into its pane, so that the turn
    /// ends and its Stop hook waits for the continuation on its way. The turn carries no
    /// continuation: typed twice or lost, it gives nothing twice and loses nothing.
    pub(super) fn wake(self: Arc<Self>, lane_id: &str, generation: u64, session: Arc<GenSession>) {
        let family = session.family();
        if family.map(|f| f.adapter().continuation_delivery())
            != Some(crate::adapter::ContinuationDelivery::SettledHookAnswer)
        {
            return;
        }
        let Some(lane) = self.lane_name(lane_id) else {
            return;
        };
        if session
            .waking
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return; // one wake at a time
        }
        let tmux = self.sup.inner.tmux(&lane);
        let lane_id = lane_id.to_string();
        tokio::task::spawn_blocking(move || {
            struct Done<'a>(&'a std::sync::atomic::AtomicBool);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(false, std::sync::atomic::Ordering::SeqCst);
                }
            }
            let _done = Done(&session.waking);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            // Wanted while something is on its way to this live generation and no settled
            // boundary waits for it yet.
            let wanted = || {
                session.on_its_way()
                    && !*session.settled.borrow()
                    && matches!(*session.activation.borrow(), Some(Ok(())))
            };
            // Never typed into a running turn: its own end is the boundary.
            while session.observations().busy {
                if !wanted() || std::time::Instant::now() >= deadline {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let started = session.observations().turns_started;
            let taken = || session.observations().turns_started > started || !wanted();
            let line = crate::adapter::WAKE_TURN;
            match tmux.submit_line(&lane, line, line, deadline, &wanted, &taken) {
                Ok(()) => tracing::info!(%lane_id, generation,
                    "turn typed in the pane so that a continuation can be given at its end"),
                Err(e) => tracing::debug!(%lane_id, generation, error = %e,
                    "no turn typed for the continuation"),
            }
        });
    }

    /// The coordinator's reconcile: end the listed generations, recreate the listed lanes.
    pub(super) async fn on_reconcile(self: Arc<Self>, m: wire::Reconcile, message_id: String) {
        // Ending generations is authority: a reconcile must say whose (the link has checked
        // that timeline and epoch against the highest this host has seen).
        if m.sot_incarnation.is_none() || m.coordinator_epoch.is_none() {
            self.sup
                .audit_stale("authority-missing", None, None, &message_id);
            return;
        }
        for (lane_id, order) in m.lanes {
            let Some(lane) = self.lane_name(&lane_id) else {
                self.sup
                    .audit_stale("other-host", Some(&lane_id), None, &message_id);
                continue;
            };
            let this = self.clone();
            let message_id = message_id.clone();
            tokio::spawn(async move {
                // A handoff offer holds the source's workspace read-only while it runs on;
                // an offer that ends without moving the work releases it.
                let holds = order.hold.iter().map(|g| (*g, WorkspaceOrder::Hold));
                let releases = order.release.iter().map(|g| (*g, WorkspaceOrder::Release));
                for (g, o) in holds.chain(releases) {
                    if order.end.contains(&g) {
                        continue; // ended below, which closes it for good
                    }
                    if let Err(e) = this
                        .sup
                        .order_workspace(&lane, &order.lane_incarnation_id, g, o)
                        .await
                    {
                        tracing::error!(lane_id, generation = g, order = ?o, error = %e,
                            "cannot apply the coordinator's order to the generation's workspace");
                    }
                }
                for &g in &order.end {
                    if let Ok(mut gate) = this.gate.lock() {
                        gate.fence_generation(&lane_id, &order.lane_incarnation_id, g);
                    }
                    // Nothing more of it is dispatched, whatever was admitted before.
                    if let Some(c) = this.chain_of(&lane_id).filter(|c| c.generation == g) {
                        if !c.stopping.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            tracing::info!(lane_id, generation = g,
                                "generation fenced on the coordinator's order: nothing more of it is dispatched");
                        }
                    }
                    // Nor written: its workspace read-only (or the generation frozen) before
                    // its stop, which gives it a grace period.
                    if let Err(e) = this
                        .sup
                        .order_workspace(
                            &lane,
                            &order.lane_incarnation_id,
                            g,
                            WorkspaceOrder::Fence,
                        )
                        .await
                    {
                        tracing::error!(lane_id, generation = g, error = %e,
                            "cannot close the fenced generation's workspace; its stop follows");
                    }
                    let runtime = this
                        .chain_of(&lane_id)
                        .filter(|c| c.generation == g)
                        .map(|c| c.runtime.clone())
                        .unwrap_or_else(|| "unknown".into());
                    match this
                        .sup
                        .end_generation(&lane, &order.lane_incarnation_id, g, &runtime)
                        .await
                    {
                        Ok(o) => {
                            tracing::info!(lane_id, generation = g, outcome = ?o, "generation ended on the coordinator's order")
                        }
                        Err(e) => {
                            tracing::error!(lane_id, generation = g, error = %e, "cannot end the generation")
                        }
                    }
                }
                if order.create || order.destroy {
                    // (After the generations' orders above: a destroy stops whatever is
                    // left, and a recreate is never carried out with it.)
                    this.on_lease_order(&lane, &lane_id, &order, &message_id)
                        .await;
                    return;
                }
                if order.recreate {
                    // One recreate (or stage) of a lane at a time, and only of the
                    // incarnation the order names: a repeated order (sent again on a later
                    // report, before the coordinator saw the new incarnation) must not end
                    // the fresh one and whatever was staged on it.
                    let lock = match this.staging.lock() {
                        Ok(mut m) => m.entry(lane_id.clone()).or_default().clone(),
                        Err(_) => return,
                    };
                    let _one_at_a_time = lock.lock().await;
                    if let Some((inc, _)) = this.sup.lane_incarnation(&lane).await {
                        if inc != order.lane_incarnation_id {
                            this.sup.audit_stale(
                                "recreate-of-another-incarnation",
                                Some(&lane_id),
                                None,
                                &message_id,
                            );
                            return;
                        }
                    }
                    tracing::warn!(lane_id, "recreating the lane on the coordinator's order");
                    match this.sup.lane_destroy(&lane).await {
                        Ok(_) | Err(crate::supervisor::SupervisorError::NoSuchLane(_)) => {}
                        Err(e) => {
                            tracing::error!(lane_id, error = %e, "cannot destroy the lane; it stays as it is");
                            return;
                        }
                    }
                    if let Err(e) = this.sup.lane_create(&lane).await {
                        tracing::error!(lane_id, error = %e, "cannot recreate the lane");
                    }
                }
            });
        }
    }

    /// An elastic lane's order: make the lane a lease waits for, or destroy, for good, the
    /// incarnation whose lease ended (only that one: an order naming another incarnation
    /// is stale and audited). The host's next report says what became of it.
    async fn on_lease_order(
        &self,
        lane: &str,
        lane_id: &str,
        order: &crate::protocol::report::LaneOrderWire,
        message_id: &str,
    ) {
        // One lane-changing order (or stage) of a lane at a time.
        let lock = match self.staging.lock() {
            Ok(mut m) => m.entry(lane_id.to_string()).or_default().clone(),
            Err(_) => return,
        };
        let _one_at_a_time = lock.lock().await;
        let now = self.sup.lane_incarnation(lane).await;
        if order.create {
            if now.is_some() {
                return; // made already (a repeated order): its report carries it
            }
            match self.sup.lane_create(lane).await {
                Ok(v) => {
                    tracing::info!(lane_id, lane_incarnation_id = %v.lane_incarnation_id, "elastic lane made for its lease")
                }
                Err(e) => {
                    tracing::error!(lane_id, error = %e, "cannot make the elastic lane")
                }
            }
            return;
        }
        match now {
            Some((inc, false)) if inc == order.lane_incarnation_id => {}
            Some((inc, true)) if inc == order.lane_incarnation_id => {
                // Destroyed already: the report says so again.
                self.sup.publish_lanes().await;
                return;
            }
            _ => {
                self.sup.audit_stale(
                    "destroy-of-another-incarnation",
                    Some(lane_id),
                    None,
                    message_id,
                );
                return;
            }
        }
        tracing::warn!(lane_id, lane_incarnation_id = %order.lane_incarnation_id,
            "destroying the elastic lane: its lease ended");
        if let Err(e) = self.sup.lane_destroy(lane).await {
            tracing::error!(lane_id, error = %e, "cannot destroy the elastic lane; it stays as it is");
        }
    }
}
