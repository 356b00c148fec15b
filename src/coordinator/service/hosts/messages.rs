//! What each chain message from a host decides: staged, injected, ACK, progress, handoff
//! ACK, continuation accept and result, blocked.

use super::*;

impl Service {
    pub(super) async fn chain_for(
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

    pub(super) async fn on_staged(
        &self,
        host: &str,
        env: &Envelope<Verified>,
    ) -> Result<(), OpError> {
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

    pub(super) async fn on_injected(
        &self,
        host: &str,
        env: &Envelope<Verified>,
    ) -> Result<(), OpError> {
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

    pub(super) async fn on_ack(&self, host: &str, env: &Envelope<Verified>) -> Result<(), OpError> {
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
    pub(super) async fn on_progress(
        &self,
        host: &str,
        env: &Envelope<Verified>,
    ) -> Result<(), OpError> {
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
    pub(super) async fn on_handoff_ack(
        &self,
        host: &str,
        env: &Envelope<Verified>,
    ) -> Result<(), OpError> {
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
    pub(super) async fn on_continuation_accept(
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

    pub(super) async fn on_continuation_result(
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
    pub(super) async fn on_blocked(
        &self,
        host: &str,
        env: &Envelope<Verified>,
    ) -> Result<(), OpError> {
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
    pub(super) async fn step<T>(
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
