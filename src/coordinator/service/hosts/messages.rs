//! What each chain message from a host decides: staged, injected, ACK, progress, handoff
//! ACK, continuation accept and result, blocked. Each handler takes its typed message
//! (`protocol::messages`), never the envelope.

use super::*;
use crate::protocol::messages::{
    Ack, Blocked, ChainRef, ContinuationAccept, ContinuationResult, FromHostChain, HandoffAck,
    Injected, Progress, Staged,
};

impl Service {
    /// Routes one typed chain message to its handler. (An answer the coordinator fails to
    /// take in is asked for again by the watchdog after `RESEND_AFTER`: forgetting the
    /// send to ask at once would, under an overloaded database, turn each failure into a
    /// resend every tick.)
    pub(super) async fn on_chain(&self, host: &str, m: FromHostChain) -> Result<(), OpError> {
        match m {
            FromHostChain::Staged(m) => self.on_staged(host, m).await,
            FromHostChain::Injected(m) => self.on_injected(host, m).await,
            FromHostChain::Ack(m) => self.on_ack(host, m).await,
            FromHostChain::Progress(m) => self.on_progress(host, m).await,
            FromHostChain::Blocked(m) => self.on_blocked(host, m).await,
            FromHostChain::HandoffAck(m) => self.on_handoff_ack(host, m).await,
            FromHostChain::ContinuationAccept(m) => self.on_continuation_accept(host, m).await,
            FromHostChain::ContinuationResult(m) => self.on_continuation_result(host, m).await,
            FromHostChain::CheckpointTaken(m) => self.on_checkpoint_taken(host, m).await,
            // Answered with a verdict by `handle` (`on_effect`, `on_effect_result`).
            FromHostChain::Effect(_) | FromHostChain::EffectResult(_) => Ok(()),
        }
    }

    /// The chain a message names, once the host is shown to own it and every chain field
    /// and the fence proof match its rows.
    pub(super) async fn chain_for(
        &self,
        host: &str,
        l: &Leader,
        m: &ChainRef,
    ) -> Result<ChainRow, OpError> {
        let res = &m.reservation_id;
        let c = self
            .store
            .chain_by_reservation(res)
            .await?
            .ok_or_else(|| OpError::new(Category::NotFound, format!("no reservation {res}")))?;
        owned(host, m, &c, l, &self.fence_commitment(&c))?;
        Ok(c)
    }

    async fn on_staged(&self, host: &str, m: Staged) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let generation = c.generation.unwrap_or(0);
        // A workspace that is not what the stage named to restore: the chain ends now (its
        // generation must never run on those files); `record_staged` refuses it as well.
        if let Some(decided) = self.store.decided_restore(&c.chain.reservation_id).await? {
            let named = decided.as_ref().map(|p| p.checkpoint_digest.as_str());
            if named != m.restored_checkpoint_digest.as_deref() {
                let why = format!(
                    "the host's workspace was restored from {}, but the stage named {}",
                    m.restored_checkpoint_digest
                        .as_deref()
                        .unwrap_or("no checkpoint"),
                    named.unwrap_or("none")
                );
                tracing::error!(host, reservation_id = %c.chain.reservation_id, reason = %why,
                    "a stage restored other files than its chain decided: the chain ends");
                if let Err(e) = self
                    .store
                    .end_chain(
                        &l,
                        &c.chain,
                        crate::coordinator::ending::EndCause::RestoreMismatch,
                    )
                    .await
                {
                    self.note(&l, &e).await;
                }
                return Err(OpError::new(Category::Mismatch, why));
            }
        }
        self.step(
            &l,
            self.store
                .record_staged(
                    &l,
                    &c.chain,
                    generation,
                    &m.process_identity,
                    m.restored_checkpoint_digest.as_deref(),
                )
                .await,
        )
        .await?;
        self.advance(&l, &c.chain.reservation_id).await?;
        Ok(())
    }

    async fn on_injected(&self, host: &str, m: Injected) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let r = self
            .store
            .record_injected(
                &l,
                &c.chain,
                &m.delivered_contracts_digest,
                &m.process_identity,
                self.timing.challenge_ttl_ms,
            )
            .await;
        self.step(&l, r).await?;
        self.advance(&l, &c.chain.reservation_id).await?;
        Ok(())
    }

    async fn on_ack(&self, host: &str, m: Ack) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let claim = AckClaim {
            challenge_id: m.challenge_id,
            sot_incarnation: m.chain.sot_incarnation.clone(),
            coordinator_epoch: m.chain.coordinator_epoch as i64,
            reservation_id: m.chain.reservation_id.clone(),
            reservation_epoch: m.bound.reservation_epoch as i64,
            reservation_deadline: m.bound.reservation_deadline,
            lane_id: m.chain.lane_id.clone(),
            lane_incarnation_id: m.chain.lane_incarnation_id.clone(),
            assignment_id: m.chain.assignment_id.clone(),
            assignment_attempt_id: m.chain.assignment_attempt_id.clone(),
            generation: m.chain.generation as i64,
            process_identity: m.process_identity,
            contracts_digest: m.bound.digests.contracts_digest,
            scope_digest: m.bound.digests.scope_digest,
            holds_digest: m.bound.digests.holds_digest,
            runtime_id: m.bound.runtime_id,
            ack_digest: m.ack_digest,
        };
        self.step(&l, self.store.consume_ack(&l, &claim).await)
            .await?;
        self.advance(&l, &c.chain.reservation_id).await?;
        Ok(())
    }

    /// A RUNNING generation's progress: bound to its own chain (the ownership checks), then
    /// the one fenced compare-and-swap that may move `last_progress_at`.
    async fn on_progress(&self, host: &str, m: Progress) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let claim = crate::coordinator::continuity::ProgressClaim {
            chain: c.chain.clone(),
            generation: m.chain.generation as i64,
            evidence_kind: m.evidence_kind,
            evidence_digest: m.evidence_digest,
            next_action: m.next_action,
            message_id: m.message_id,
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
    async fn on_handoff_ack(&self, host: &str, m: HandoffAck) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let claim = crate::coordinator::handoff::HandoffAckClaim {
            handoff_challenge_id: m.handoff.handoff_challenge_id,
            sot_incarnation: m.chain.sot_incarnation.clone(),
            coordinator_epoch: m.chain.coordinator_epoch as i64,
            assignment_id: m.chain.assignment_id.clone(),
            source_assignment_attempt_id: m.handoff.source_assignment_attempt_id,
            target_assignment_attempt_id: m.chain.assignment_attempt_id.clone(),
            responsibility_owner: m.handoff.responsibility_owner,
            execution_owner: m.handoff.execution_owner,
            pending_target: m.handoff.pending_target,
            next_action_digest: m.handoff.next_action_digest,
            scope_digest: m.bound.digests.scope_digest,
            holds_digest: m.bound.digests.holds_digest,
            contracts_digest: m.bound.digests.contracts_digest,
            lane_incarnation_id: m.chain.lane_incarnation_id.clone(),
            generation: m.chain.generation as i64,
            challenge_deadline: m.handoff.challenge_deadline,
            checkpoint_digest: m.handoff.checkpoint_digest,
            ack_digest: m.ack_digest,
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

    /// The source host's answer to a handoff's `handoff_checkpoint`: recorded (one fenced
    /// step), then the target chain is driven on (its stage restores the checkpoint).
    async fn on_checkpoint_taken(
        &self,
        host: &str,
        m: crate::protocol::messages::CheckpointTaken,
    ) -> Result<(), OpError> {
        use crate::protocol::messages::TakenFor;
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let generation = m.chain.generation as i64;
        let handoff_id = match m.origin {
            TakenFor::Handoff(h) => h,
            TakenFor::Request(seq) => {
                let r = self
                    .step(
                        &l,
                        self.store
                            .record_requested_checkpoint(&l, &c.chain, generation, seq, &m.taken)
                            .await,
                    )
                    .await?;
                if !r.replayed {
                    tracing::info!(assignment_id = %c.chain.assignment_id, generation, request_seq = seq,
                        checkpoint = %r.body["checkpoint_digest"], "checkpoint asked for by the generation recorded");
                }
                return Ok(());
            }
        };
        let r = self
            .step(
                &l,
                self.store
                    .record_handoff_checkpoint(&l, &c.chain, generation, &handoff_id, &m.taken)
                    .await,
            )
            .await?;
        if !r.replayed {
            match &m.taken {
                Ok(_) => {
                    tracing::info!(assignment_id = %c.chain.assignment_id, handoff_id = %handoff_id,
                    checkpoint = %r.body["checkpoint_digest"], "handoff checkpoint recorded: the target is restored from it")
                }
                Err(e) => {
                    tracing::error!(assignment_id = %c.chain.assignment_id, handoff_id = %handoff_id,
                    error = %e, "the source host took no checkpoint for the handoff: its target chain ends, the work stays with its source")
                }
            }
        }
        // Its target is driven on: staged from the checkpoint, or ended without one.
        if let Some(t) = r.body["target_reservation_id"].as_str() {
            let _ = self.advance(&l, t).await;
        }
        Ok(())
    }

    /// The host accepts a continuation for its settled harness: exactly once, for the
    /// current claim (see `coordinator::continuation`); then it is told to make it visible.
    async fn on_continuation_accept(
        &self,
        host: &str,
        m: ContinuationAccept,
    ) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let claim = crate::coordinator::continuation::AcceptClaim {
            continuation_id: m.continuation_id,
            claim_ref: m.claim_ref,
            reservation_id: c.chain.reservation_id.clone(),
            lane_incarnation_id: c.chain.lane_incarnation_id.clone(),
            generation: m.chain.generation as i64,
            next_action_digest: m.next_action_digest,
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
        m: ContinuationResult,
    ) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let r = self
            .store
            .record_continuation_result(
                &l,
                &m.continuation_id,
                &c.chain.lane_incarnation_id,
                m.chain.generation as i64,
                &m.result_evidence_digest,
            )
            .await;
        self.step(&l, r).await?;
        Ok(())
    }

    /// A RUNNING generation says it is blocked, with evidence and an unblock action.
    async fn on_blocked(&self, host: &str, m: Blocked) -> Result<(), OpError> {
        let l = self.leader().await?;
        let c = self.chain_for(host, &l, &m.chain).await?;
        let by = crate::coordinator::continuity::Blocker::Generation {
            chain: c.chain.clone(),
            generation: m.chain.generation as i64,
        };
        let r = self
            .store
            .block(
                &l,
                &c.chain.assignment_id,
                &by,
                &crate::coordinator::continuity::Blockage {
                    resume_after_ms: m
                        .resume_after_ms
                        .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
                    ..crate::coordinator::continuity::Blockage::new(
                        &m.blocker_code,
                        &m.blocker_evidence_digest,
                        &m.next_action,
                    )
                },
            )
            .await;
        self.step(&l, r).await?;
        tracing::warn!(lane_id = %c.chain.lane_id, assignment_id = %c.chain.assignment_id,
            reason = %m.blocker_code, "work blocked by its generation");
        Ok(())
    }

    /// Records the outcome of a transition the host's message asked for.
    pub(in crate::coordinator::service) async fn step<T>(
        &self,
        l: &Leader,
        r: Result<T, AuthorityError>,
    ) -> Result<T, OpError> {
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
}
