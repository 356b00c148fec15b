//! A stage for this host: the generation started for exactly the staged chain, its
//! contract delivered, and the activation challenge typed into (or fetched by) the harness.

use super::*;

impl CoordinatedHost {
    pub(super) async fn on_stage(self: Arc<Self>, stage: wire::Stage, message_id: String) {
        let a = &stage.authority;
        let lane_id = a.lane_id.clone();
        let inc = a.lane_incarnation_id.clone();
        let runtime = a.runtime_id.clone();
        let generation = a.generation;
        let Some(lane) = self.lane_name(&lane_id) else {
            self.sup
                .audit_stale("other-host", Some(&lane_id), Some(generation), &message_id);
            return;
        };
        if !crate::protocol::fence::is_commitment(&a.fence_proof) {
            self.sup.audit_stale(
                "fence-proof-not-a-commitment",
                Some(&lane_id),
                Some(generation),
                &message_id,
            );
            return;
        }
        let lock = match self.staging.lock() {
            Ok(mut m) => m.entry(lane_id.clone()).or_default().clone(),
            Err(_) => return,
        };
        let _one_stage_at_a_time = lock.lock().await;
        // A host that dies with a stage in hand, before it starts anything.
        crate::coordinator::failpoint::host("stage");
        // A duplicate of the stage we already acted on: say `staged` again.
        if let Some(ctx) = self.chain_of(&lane_id) {
            if ctx.generation == generation
                && ctx.lane_incarnation_id == inc
                && ctx.binding.reservation_id == a.reservation_id
            {
                self.send_staged(&ctx);
                return;
            }
        }
        let binding = CoordBinding {
            reservation_id: a.reservation_id.clone(),
            assignment_id: a.assignment_id.clone(),
            assignment_attempt_id: a.assignment_attempt_id.clone(),
            sot_incarnation: a.sot_incarnation.clone(),
            coordinator_epoch: a.coordinator_epoch,
            fence_proof: a.fence_proof.clone(),
            activated: false,
            chain_fields: None,
            repository: stage.repository.clone(),
            restore: stage.restore.clone().map(Box::new),
            artifact_recipients: stage
                .artifact_recipients
                .iter()
                .map(|r| r.to_string())
                .collect(),
        };
        let session = GenSession::new();
        // A workspace restored from a checkpoint another host took: its objects first.
        let obtained = self.obtain(&stage).await;
        let started = match obtained {
            Err(e) => Err(crate::supervisor::SupervisorError::Launch {
                lane: lane.clone(),
                generation,
                detail: format!("restoring the work's checkpoint: {e}"),
            }),
            Ok(()) => {
                self.sup
                    .start_coordinated(
                        &lane,
                        &runtime,
                        &inc,
                        generation,
                        session.clone(),
                        binding.clone(),
                    )
                    .await
            }
        };
        let view = match started {
            Ok(v) => v,
            Err(e) => {
                // Refused: a receipt says so, and the coordinator's chain ends at once.
                tracing::error!(lane_id, generation, error = %e, "cannot stage the generation; refusing it");
                if let Err(w) =
                    self.sup
                        .refuse_generation(&lane_id, &inc, generation, &runtime, &e.to_string())
                {
                    tracing::error!(lane_id, generation, error = %w, "cannot record the refusal; the coordinator's reservation will expire");
                }
                self.sup.publish_lanes().await;
                return;
            }
        };
        let Some(id) = view.process_identity else {
            return;
        };
        if let Ok(mut g) = self.gate.lock() {
            let _ = g.advance(&lane_id, &inc, generation);
        }
        // What the prepared workspace is, in the marker's words (the activation binds it).
        let restored = stage
            .repository
            .as_ref()
            .and_then(|_| crate::supervisor::workspaces::marker(&self.sup.inner, &a.assignment_id))
            .and_then(|m| m.started_from);
        let ctx = Arc::new(ChainCtx {
            lane_incarnation_id: inc,
            generation,
            runtime,
            binding,
            stage: Some(stage),
            restored,
            session: Some(session),
            identity: identity_value(&id),
            contract: Mutex::new(None),
            challenge: tokio::sync::watch::channel(None).0,
            handoff: tokio::sync::watch::channel(None).0,
            offers: Mutex::new(Default::default()),
            report_base: Mutex::new(None),
            active: std::sync::atomic::AtomicBool::new(false),
            stopping: std::sync::atomic::AtomicBool::new(false),
            observing: std::sync::atomic::AtomicBool::new(false),
        });
        if let Ok(mut m) = self.chains.lock() {
            m.insert(lane_id.clone(), ctx.clone());
        }
        self.send_staged(&ctx);
        self.clone().bootstrap(&ctx, &lane_id);
        tokio::spawn(self.clone().drive(ctx));
    }

    /// For a harness whose session starts at its first prompt: type a bootstrap turn, so its
    /// session-start hook runs and takes the contract.
    pub(super) fn bootstrap(self: Arc<Self>, ctx: &Arc<ChainCtx>, lane_id: &str) {
        let Some(session) = ctx.session.clone() else {
            return;
        };
        let family = session.family();
        let Some(text) = family.and_then(|f| f.adapter().bootstrap_turn()) else {
            return;
        };
        let Some(lane) = self.lane_name(lane_id) else {
            return;
        };
        let tmux = self.sup.inner.tmux(&lane);
        let (lane_id, generation) = (lane_id.to_string(), ctx.generation);
        tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            // Only until the contract is delivered, and never into a successor's pane.
            let waiting = || session.activation.borrow().is_none();
            // Taken once its session-start hook took the contract.
            let taken = || session.delivered.borrow().is_some();
            match tmux.submit_line(&lane, text, text, deadline, &waiting, &taken) {
                Ok(()) => {
                    tracing::info!(%lane_id, generation, "bootstrap turn submitted in the pane")
                }
                Err(e) => {
                    tracing::warn!(%lane_id, generation, error = %e, "cannot submit the bootstrap turn")
                }
            }
        });
    }

    /// Waits for the harness to fetch the contract, reports it; waits for the challenge and
    /// the harness's ACK request, signs the ACK.
    pub(super) async fn drive(self: Arc<Self>, ctx: Arc<ChainCtx>) {
        let (Some(session), Some(stage)) = (&ctx.session, &ctx.stage) else {
            return;
        };
        let mut delivered = session.delivered.subscribe();
        let Ok(digest) = delivered
            .wait_for(|d| d.is_some())
            .await
            .map(|d| d.clone().unwrap_or_default())
        else {
            return;
        };
        let contract = ctx.contract.lock().ok().and_then(|c| c.clone());
        let Some(contract) = contract else { return };
        let base = ReportBase::of(stage, &contract);
        if let Ok(mut r) = ctx.report_base.lock() {
            *r = Some(base.clone());
        }
        // Durable before the coordinator hears of the injection: a supervisor that dies
        // after the coordinator activated the chain, before it recorded the activation,
        // serves the generation's lane socket again from these (`adopt`) and takes the
        // re-sent activation. Not recorded, the chain goes no further (it times out at
        // the coordinator) rather than run a generation a restart could not reach.
        let Some(lane) = self.lane_name(&stage.authority.lane_id) else {
            return;
        };
        match self
            .sup
            .record_chain_fields(&lane, ctx.generation, base.to_record())
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(generation = ctx.generation,
                    "the chain's fields were not recorded (the generation is no longer the lane's live one, is fenced, or has other fields): the injection is not reported");
                return;
            }
            Err(e) => {
                tracing::error!(generation = ctx.generation, error = %e,
                    "cannot record the chain's fields durably: the injection is not reported");
                return;
            }
        }
        self.send(FromHostChain::Injected(wire::Injected {
            chain: base.chain.clone(),
            bound: base.bound.clone(),
            delivered_contracts_digest: digest,
            process_identity: canonical::to_json(&ctx.identity),
        }));
        // A handoff target's generation: its handoff ACK, when the harness asks for it and
        // the challenge is here, echoing every bound field of the challenge.
        {
            let (this, ctx, session, stage, contract) = (
                self.clone(),
                ctx.clone(),
                session.clone(),
                stage.clone(),
                contract.clone(),
            );
            tokio::spawn(async move {
                let mut asked = session.handoff_ack_requested.subscribe();
                if asked.wait_for(|a| *a).await.is_err() {
                    return;
                }
                let mut hc = ctx.handoff.subscribe();
                let Ok(h) = hc.wait_for(|h| h.is_some()).await.map(|h| h.clone()) else {
                    return;
                };
                let Some(h) = h else { return };
                this.send(handoff_ack(&stage, &contract, &h, &ctx.identity));
            });
        }
        let mut asked = session.ack_requested.subscribe();
        if asked.wait_for(|a| *a).await.is_err() {
            return;
        }
        let mut ch = ctx.challenge.subscribe();
        let Ok(challenge) = ch
            .wait_for(|c| c.is_some())
            .await
            .map(|c| c.clone().unwrap_or_default())
        else {
            return;
        };
        self.send(FromHostChain::Ack(wire::Ack {
            chain: base.chain,
            bound: base.bound,
            challenge_id: challenge,
            process_identity: canonical::to_json(&ctx.identity),
            ack_digest: String::new(),
        }));
        // Then, for as long as the generation lives: its reports, signed for it.
        tokio::spawn(self.clone().report_loop(ctx.clone(), session.clone()));
    }

    /// For a harness that gets its checks in its pane: type the activation check (or a
    /// handoff target's handoff check) in as a user turn. The ACK is then the model's
    /// answer, reported by the harness's turn-end hook.
    pub(super) fn deliver_challenge(
        self: Arc<Self>,
        ctx: &Arc<ChainCtx>,
        session: Arc<GenSession>,
        lane_id: &str,
        check: Check,
        phrase: String,
    ) {
        let Some(family) = session.family() else {
            return;
        };
        if family.adapter().challenge_delivery() != crate::adapter::ChallengeDelivery::PaneTurn {
            return;
        }
        let Some(lane) = self.lane_name(lane_id) else {
            return;
        };
        let tmux = self.sup.inner.tmux(&lane);
        let (lane_id, generation) = (lane_id.to_string(), ctx.generation);
        let bootstrapped = family.adapter().bootstrap_turn().is_some();
        let what = match check {
            Check::Activation => "activation check",
            Check::Handoff => "handoff check",
        };
        tokio::task::spawn_blocking(move || {
            let marker = check.token(&phrase);
            let line = check.prompt(&phrase);
            // Bounded by the chain: the coordinator's challenge (or handoff offer) deadline
            // ends a generation that never answers.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            // Only while this generation is the one waiting for this check: never into a
            // successor's pane.
            let answered = || match check {
                Check::Activation => *session.ack_requested.borrow(),
                Check::Handoff => *session.handoff_ack_requested.borrow(),
            };
            let waiting = || session.activation.borrow().is_none() && !answered();
            // Never type into a running turn (where a keystroke could answer a dialog): wait
            // until the harness is idle — every started turn ended, and a bootstrap turn, if
            // the family needs one, finished.
            loop {
                let o = session.observations();
                if !o.busy && (!bootstrapped || o.settled >= 1) {
                    break;
                }
                if !waiting() || std::time::Instant::now() >= deadline {
                    tracing::warn!(%lane_id, generation, check = what, "the harness never went idle for its check");
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            // Only a turn that starts from here on answers the check.
            let started = session.observations().turns_started;
            session
                .answer_turns_after
                .store(started, std::sync::atomic::Ordering::SeqCst);
            // Taken once the harness started a turn for it (or it was already answered).
            let taken = || answered() || session.observations().turns_started > started;
            match tmux.submit_line(&lane, &line, &marker, deadline, &waiting, &taken) {
                Ok(()) => {
                    tracing::info!(%lane_id, generation, check = what, "check submitted in the pane")
                }
                Err(e) => {
                    tracing::warn!(%lane_id, generation, check = what, error = %e, "cannot submit the check in the pane")
                }
            }
        });
    }
}
