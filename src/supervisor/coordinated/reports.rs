//! What the host tells the coordinator about a live generation (its harness's reports),
//! and the routing of each coordinator envelope to the chain it is for.

use super::*;

impl CoordinatedHost {
    /// Signs and sends the RUNNING harness's reports (progress, blocker, continuation
    /// results) for as long as the generation lives — also after a restart, for a re-adopted
    /// generation whose lane socket is served again.
    pub(super) async fn report_loop(self: Arc<Self>, ctx: Arc<ChainCtx>, session: Arc<GenSession>) {
        let rx = session.reports_rx.lock().ok().and_then(|mut r| r.take());
        let Some(mut rx) = rx else { return };
        let asks = session
            .checkpoints_rx
            .lock()
            .ok()
            .and_then(|mut r| r.take());
        let Some(mut asks) = asks else { return };
        loop {
            let report = tokio::select! {
                r = rx.recv() => match r {
                    Some(r) => r,
                    None => return,
                },
                Some(ask) = asks.recv() => {
                    // Answered in its own task: a capture never holds up the reports.
                    tokio::spawn(self.clone().on_checkpoint_ask(ctx.clone(), ask));
                    continue;
                }
            };
            let Some(ReportBase { chain, bound }) =
                ctx.report_base.lock().ok().and_then(|f| f.clone())
            else {
                continue;
            };
            let m = match report {
                HarnessReport::Progress {
                    kind,
                    evidence_digest,
                    next_action,
                } => FromHostChain::Progress(wire::Progress {
                    chain,
                    bound,
                    evidence_kind: kind,
                    evidence_digest,
                    next_action,
                    message_id: String::new(),
                }),
                HarnessReport::ContinuationResult {
                    continuation_id,
                    evidence_digest,
                } => FromHostChain::ContinuationResult(wire::ContinuationResult {
                    chain,
                    bound,
                    continuation_id,
                    result_evidence_digest: evidence_digest,
                }),
                HarnessReport::Blocked {
                    code,
                    evidence_digest,
                    next_action,
                    resume_after_ms,
                } => {
                    self.sup
                        .inner
                        .metrics
                        .harness_blocked
                        .get_or_create(&crate::supervisor::metrics::RuntimeCode {
                            runtime: ctx.runtime.clone(),
                            code: code.clone(),
                        })
                        .inc();
                    FromHostChain::Blocked(wire::Blocked {
                        chain,
                        bound,
                        blocker_code: code,
                        blocker_evidence_digest: evidence_digest,
                        next_action,
                        resume_after_ms,
                    })
                }
            };
            let t = m.message_type();
            tracing::info!(
                lane_incarnation_id = %ctx.lane_incarnation_id,
                generation = ctx.generation,
                message_type = t.as_str(),
                "harness report to the coordinator"
            );
            self.send(m);
        }
    }

    /// A checkpoint the generation's harness asked for: taken (its cgroup frozen), reported
    /// to the coordinator under the chain's authority, and uploaded at once; the harness is
    /// told what is known — taken, and stored in the coordinator's store or not yet.
    async fn on_checkpoint_ask(
        self: Arc<Self>,
        ctx: Arc<ChainCtx>,
        ask: crate::supervisor::lanesock::CheckpointAsk,
    ) {
        let answer = self.checkpoint_for_harness(&ctx).await;
        if let Err(e) = &answer {
            tracing::warn!(lane_incarnation_id = %ctx.lane_incarnation_id, generation = ctx.generation,
                error = %e, "a checkpoint the harness asked for was not taken");
        }
        let _ = ask.send(answer);
    }

    async fn checkpoint_for_harness(&self, ctx: &ChainCtx) -> Result<serde_json::Value, String> {
        let Some(ReportBase { chain, bound }) = ctx.report_base.lock().ok().and_then(|f| f.clone())
        else {
            return Err("the generation is not RUNNING here".into());
        };
        let lane = self
            .lane_name(&chain.lane_id)
            .ok_or("the generation's lane is not this host's")?;
        let (seq, taken) = self
            .sup
            .requested_checkpoint(&lane, &ctx.lane_incarnation_id, ctx.generation)
            .await?;
        let digest = taken.digest();
        self.send(FromHostChain::CheckpointTaken(wire::CheckpointTaken {
            chain,
            bound,
            origin: wire::TakenFor::Request(seq),
            taken: Ok(taken.clone()),
        }));
        let mut out = self
            .await_upload(
                &ctx.lane_incarnation_id,
                ctx.generation,
                seq,
                &taken.commit_id,
            )
            .await;
        out["request_seq"] = seq.into();
        out["checkpoint_digest"] = digest.into();
        out["commit_id"] = taken.commit_id.into();
        out["tree_id"] = taken.tree_id.into();
        Ok(out)
    }

    /// A handoff of this generation's work in a repository: its workspace held and
    /// checkpointed (the same checkpoint for the same handoff), and the answer sent.
    async fn on_handoff_checkpoint(
        self: Arc<Self>,
        ctx: Arc<ChainCtx>,
        m: wire::HandoffCheckpoint,
    ) {
        let Some(lane) = self.lane_name(&m.authority.lane_id) else {
            return;
        };
        let taken = self
            .sup
            .handoff_checkpoint(
                &lane,
                &ctx.lane_incarnation_id,
                ctx.generation,
                &m.handoff_id,
            )
            .await;
        let taken = match taken {
            Ok(Some(c)) => Ok(c),
            Ok(None) => {
                tracing::debug!(lane_id = %m.authority.lane_id, handoff_id = %m.handoff_id,
                    "a handoff checkpoint asked for before the hold order (or after its release): not taken");
                return;
            }
            Err(e) => {
                tracing::error!(lane_id = %m.authority.lane_id, generation = ctx.generation, handoff_id = %m.handoff_id,
                    error = %e, "no checkpoint for the handoff: it cannot proceed");
                Err(e)
            }
        };
        let Some(ReportBase { chain, bound }) = ctx.report_base.lock().ok().and_then(|f| f.clone())
        else {
            return; // not activated here: the coordinator's chain is not RUNNING
        };
        self.send(FromHostChain::CheckpointTaken(wire::CheckpointTaken {
            chain,
            bound,
            origin: wire::TakenFor::Handoff(m.handoff_id),
            taken,
        }));
    }

    pub(super) async fn route(self: Arc<Self>, env: Envelope<Verified>, msg: ToHost) {
        // Queue isolation: only the lane's current, unfenced generation receives anything.
        let admitted = match self.gate.lock() {
            Ok(g) => g.admit(&env),
            Err(_) => return,
        };
        if let Err(audit) = admitted {
            let line = serde_json::to_string(&*audit).unwrap_or_default();
            self.sup.audit_stale(
                audit.category,
                Some(&audit.lane_id),
                audit.generation,
                &line,
            );
            return;
        }
        let Some(a) = msg.authority() else { return };
        let (lane_id, generation) = (a.lane_id.clone(), a.generation);
        let message_id = env.message_id();
        let Some(ctx) = self.chain_of(&lane_id) else {
            return;
        };
        if let Err(why) = authority_of(&msg, &ctx.binding) {
            self.sup
                .audit_stale(why, Some(&lane_id), Some(generation), message_id);
            return;
        }
        // A re-adopted generation (this process never staged it) takes nothing of its
        // chain's staging: its checks went to the previous process, and nothing here would
        // sign their ACKs. Its activation, if the coordinator decided it, comes as such.
        if ctx.stage.is_none()
            && matches!(
                msg,
                ToHost::Contract(_) | ToHost::Challenge(_) | ToHost::HandoffChallenge(_)
            )
        {
            self.sup.audit_stale(
                "staging-message-for-a-readopted-generation",
                Some(&lane_id),
                Some(generation),
                message_id,
            );
            return;
        }
        match msg {
            ToHost::Contract(m) => {
                let Some(session) = &ctx.session else { return };
                let digest = crate::protocol::contracts_digest(
                    &m.task_text,
                    &m.digests.scope_digest,
                    &m.digests.holds_digest,
                );
                if digest != m.digests.contracts_digest {
                    self.sup.audit_stale(
                        "contract-digest-mismatch",
                        Some(&lane_id),
                        Some(generation),
                        message_id,
                    );
                    return;
                }
                let text = m.task_text.clone();
                if let Ok(mut c) = ctx.contract.lock() {
                    *c = Some(m);
                }
                let key =
                    crate::adapter::contract_key(&digest, &ctx.lane_incarnation_id, ctx.generation);
                session.contract.send_replace(Some(Contract {
                    task_text: text,
                    contracts_digest: digest,
                    key,
                }));
            }
            ToHost::Challenge(m) => {
                let cid = m.challenge_id;
                ctx.challenge.send_replace(Some(cid.clone()));
                if let Some(session) = &ctx.session {
                    if *session.handoff_ack_requested.borrow() {
                        // A handoff's target whose acceptance committed (its activation
                        // challenge is issued only after), dying before it can activate.
                        crate::coordinator::failpoint::host("challenged-after-handoff");
                    }
                    session.challenged.send_replace(true);
                    let phrase =
                        crate::adapter::ack_phrase(&cid, &ctx.lane_incarnation_id, ctx.generation);
                    let fresh = session.phrase.borrow().as_deref() != Some(phrase.as_str());
                    session.phrase.send_replace(Some(phrase.clone()));
                    if fresh {
                        self.clone().deliver_challenge(
                            &ctx,
                            session.clone(),
                            &lane_id,
                            Check::Activation,
                            phrase,
                        );
                    }
                }
            }
            ToHost::Continuation(m) => self.clone().on_continuation(ctx, m, message_id),
            ToHost::HandoffChallenge(m) => {
                // Its ACK binds the checkpoint the workspace was restored from: only the
                // one this generation's stage restored (none for work without one).
                let restored = ctx
                    .stage
                    .as_ref()
                    .and_then(|s| s.restore.as_ref())
                    .map(|r| r.checkpoint_digest.as_str());
                if m.bound.checkpoint_digest.is_some()
                    && m.bound.checkpoint_digest.as_deref() != restored
                {
                    self.sup.audit_stale(
                        "handoff-checkpoint-not-restored",
                        Some(&lane_id),
                        Some(generation),
                        message_id,
                    );
                    return;
                }
                if let Some(session) = &ctx.session {
                    session
                        .handoff
                        .send_replace(Some(m.bound.handoff_challenge_id.clone()));
                    // A harness answering in its own turns gets its handoff check typed into
                    // its pane, once per phrase (a re-sent challenge carries the same one).
                    let phrase = crate::adapter::handoff_phrase(
                        &m.bound.handoff_challenge_id,
                        &ctx.lane_incarnation_id,
                        ctx.generation,
                    );
                    let fresh = session.handoff_phrase.borrow().as_deref() != Some(phrase.as_str());
                    if fresh
                        && session.family().is_some_and(|f| {
                            f.adapter().challenge_delivery()
                                == crate::adapter::ChallengeDelivery::PaneTurn
                        })
                    {
                        session.handoff_phrase.send_replace(Some(phrase.clone()));
                        self.clone().deliver_challenge(
                            &ctx,
                            session.clone(),
                            &lane_id,
                            Check::Handoff,
                            phrase,
                        );
                    }
                }
                let resend = ctx.handoff.borrow().is_some()
                    && ctx
                        .session
                        .as_ref()
                        .is_some_and(|s| *s.handoff_ack_requested.borrow());
                ctx.handoff.send_replace(Some(m.clone()));
                // The coordinator sends the challenge again only while it has no ACK: the
                // first was lost (a coordinator restart, say). Answer again, same key.
                if resend {
                    if let (Some(stage), Some(contract)) = (
                        ctx.stage.as_ref(),
                        ctx.contract.lock().ok().and_then(|c| c.clone()),
                    ) {
                        self.send(handoff_ack(stage, &contract, &m, &ctx.identity));
                    }
                }
            }
            ToHost::Activate(_) => {
                let Some(lane) = self.lane_name(&lane_id) else {
                    return;
                };
                // A host that dies with the activation in hand, before it recorded it.
                crate::coordinator::failpoint::host("activate");
                // Durable first: a restarted supervisor must know this generation runs.
                let fields = ctx
                    .report_base
                    .lock()
                    .ok()
                    .and_then(|f| f.as_ref().map(ReportBase::to_record));
                match self.sup.mark_activated(&lane, ctx.generation, fields).await {
                    Ok(true) => {
                        ctx.active.store(true, std::sync::atomic::Ordering::SeqCst);
                        tracing::info!(
                            lane_id,
                            generation = ctx.generation,
                            assignment_id = %ctx.binding.assignment_id,
                            "generation activated by the coordinator"
                        );
                        if let Some(session) = &ctx.session {
                            session.activation.send_replace(Some(Ok(())));
                            self.observe_progress(&ctx, session);
                        }
                    }
                    Ok(false) => {}
                    // Its workspace cannot be opened, or the activation not recorded: it
                    // cannot do the work it was activated for, so it ends (the receipt
                    // tells the coordinator) rather than run on half-activated.
                    Err(e) => {
                        tracing::error!(lane_id, generation = ctx.generation, error = %e,
                            "cannot honour the activation: the generation is ended");
                        let (sup, inc, g, runtime) = (
                            self.sup.clone(),
                            ctx.lane_incarnation_id.clone(),
                            ctx.generation,
                            ctx.runtime.clone(),
                        );
                        tokio::spawn(async move {
                            if let Err(e) = sup.end_generation(&lane, &inc, g, &runtime).await {
                                tracing::error!(generation = g, error = %e, "cannot end the generation");
                            }
                        });
                    }
                }
            }
            ToHost::HandoffCheckpoint(m) => {
                tokio::spawn(self.clone().on_handoff_checkpoint(ctx, m));
            }
            other => tracing::warn!(
                message_type = other.message_type().as_str(),
                "unexpected coordinator message"
            ),
        }
    }
}
