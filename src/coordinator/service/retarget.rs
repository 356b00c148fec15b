//! The service's side of preactivation retarget (spec §6.3; the authority is
//! `coordinator::recovery`): choosing the candidate lane by the retarget policy, sending the
//! candidate host its `recovery_challenge`, and handing a verified `recovery_ack` to the one
//! reservation CAS that may consume it.
//!
//! **Never:** sends a recovery challenge signed by any key but the recovery key, or
//! reserves anything for a candidate before its ACK; builds a reservation from a recovery
//! ACK whose message id is not of the candidate's current session, or whose challenge
//! digest is not the digest of the exact envelope this coordinator signs for the
//! candidate row.

use super::*;
use crate::coordinator::recovery::{Offer, RecoveryConsume, Selection};
use crate::coordinator::states::{CandidateState, LaneState};
use crate::protocol::messages::{RecoveryAck, ToHost};
use crate::protocol::transport::Outgoing;

/// A candidate's challenge is sent again (the first may have been lost with a session)
/// once it is this old and still unanswered.
const RESEND_AFTER_MS: i64 = 2000;

impl Service {
    /// Offers the work in recovery to a candidate lane chosen by the retarget policy (or
    /// sends the open candidate's challenge again), and sends the candidate host its
    /// challenge. Automatic (the watchdog) and operator-approved (`mosaic retarget`) alike.
    pub(super) async fn retarget(&self, l: &Leader, assignment_id: &str) -> Result<Offer, OpError> {
        let Some(signer) = self.recovery.clone() else {
            return Err(OpError::new(
                Category::Unavailable,
                "this coordinator has no recovery key (recovery_key in its configuration): it cannot retarget",
            ));
        };
        let failed_lane = match self.store.retarget_eligible(assignment_id).await? {
            None => {
                return Err(OpError::new(
                    Category::WrongState,
                    format!(
                    "assignment {assignment_id} is not work in recovery (with no end requested)"
                ),
                ))
            }
            Some(Err(why)) => return Err(OpError::new(Category::WrongState, why)),
            Some(Ok(lane)) => lane,
        };
        let offer = match self
            .store
            .open_recovery_candidate(assignment_id, l.epoch())
            .await?
        {
            // Its challenge was sent moments ago: its ACK is on its way (sending it again
            // would only draw a second ACK for the same candidate).
            Some(open) if open.age_ms < RESEND_AFTER_MS => return Ok(open),
            Some(open) => open,
            None => {
                let next = self
                    .store
                    .next_attempt(assignment_id)
                    .await?
                    .ok_or_else(|| {
                        OpError::new(Category::NotFound, format!("no assignment {assignment_id}"))
                    })?;
                let sel = self
                    .select_candidate(assignment_id, &next.runtime_id, &failed_lane)
                    .await?;
                let contracts = crate::protocol::contracts_digest(
                    &next.task_text,
                    &crate::protocol::task::list_digest("scope", &next.scope),
                    &crate::protocol::task::list_digest("holds", &next.holds),
                );
                let request = format!("{assignment_id}/{}", uuid::Uuid::new_v4().simple());
                let offer = self
                    .step(
                        l,
                        self.store
                            .offer_recovery(
                                l,
                                assignment_id,
                                &sel,
                                &contracts,
                                crate::coordinator::recovery::CANDIDATE_TTL_MS,
                                &request,
                            )
                            .await,
                    )
                    .await?;
                tracing::warn!(assignment_id, failed_lane = %failed_lane, candidate_lane = %offer.candidate_lane_id,
                    recovery_candidate_id = %offer.challenge.facts.recovery_candidate_id,
                    recovery_deadline = %offer.challenge.facts.recovery_deadline,
                    "retarget: a recovery candidate is offered (it grants nothing until its ACK is consumed)");
                offer
            }
        };
        self.hosts.push(
            &offer.candidate_host_id,
            Outgoing::to_host(&signer, &ToHost::RecoveryChallenge(offer.challenge.clone())),
        )?;
        Ok(offer)
    }

    /// The automatic half of `retarget@1`: work whose start failed before activation, on a
    /// lane that cannot take it again soon (its host without a session for
    /// `HOST_GONE_AFTER_MS`; the lane quarantined, retired or being recreated), is offered to
    /// another lane at once. Work whose failed lane is fine
    /// waits for the inactivity policy's next attempt there, which retargets once its
    /// replacements on that lane are used up. (A failed generation not yet proven ended
    /// does not block a retarget, since it never activated; on a connected host its receipt
    /// follows in moments, so it is no reason to move the work by itself.)
    pub(super) async fn retarget_stranded(&self, l: &Leader) {
        if self.recovery.is_none() {
            return;
        }
        let stranded = match self.store.preactivation_failures().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "watchdog cannot read work whose start failed");
                return;
            }
        };
        for s in stranded {
            let host_gone = s.host_gone && !self.hosts.is_connected(&s.host_id);
            if !s.lane_unusable && !host_gone {
                continue;
            }
            if let Err(e) = self.retarget(l, &s.assignment_id).await {
                tracing::debug!(assignment_id = %s.assignment_id, failed_lane = %s.lane_id,
                    category = e.category.as_str(), error = %e.message, "retarget not offered yet");
            }
        }
    }

    /// `mosaic retarget`: the offer, then (for up to five seconds) whether its ACK was
    /// consumed and the chain it reserved.
    pub(super) async fn retarget_json(
        &self,
        assignment_id: &str,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let offer = self.retarget(&l, assignment_id).await?;
        let id = offer.challenge.facts.recovery_candidate_id.clone();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut now = offer.clone();
        while now.state == CandidateState::Issued && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            if let Some(o) = self.store.recovery_candidate(&id).await? {
                now = o;
            }
        }
        let f = &now.challenge.facts;
        Ok(serde_json::json!({
            "recovery_candidate_id": f.recovery_candidate_id,
            "state": now.state,
            "candidate_principal": f.candidate_principal,
            "candidate_lane_id": now.candidate_lane_id,
            "expected_retarget_operation": f.expected_retarget_operation,
            "failed_reservation_id": now.failed_reservation_id,
            "failed_target_snapshot_digest": f.failed_target_snapshot_digest,
            "objective_failure_evidence_digest": f.objective_failure_evidence_digest,
            "policy": crate::coordinator::recovery::POLICY,
            "policy_digest": crate::coordinator::recovery::policy_digest(),
            "policy_selection_digest": f.policy_selection_digest,
            "recovery_deadline": f.recovery_deadline,
            "retarget_reservation_id": self.store.retarget_reservation(&id).await?,
        }))
    }

    /// A pre-transfer retarget (§6.3.3): the source still runs; the offer moves to the
    /// candidate's lane — a new handoff offer and U's fresh target chain, made by the CAS
    /// that consumes the ACK — and is driven on like any offer.
    async fn retarget_handoff(
        &self,
        l: &Leader,
        offer: &Offer,
        consume: RecoveryConsume,
    ) -> Result<(), OpError> {
        // The failed offer's task (the work's latest attempt): the contract the candidate
        // bound, never the source's own.
        let next = self
            .store
            .next_attempt(&consume.ack.facts.assignment_id)
            .await?
            .ok_or_else(|| OpError::new(Category::NotFound, "no such assignment"))?;
        let req = crate::coordinator::handoff::OfferRequest {
            request_id: format!("retarget/{}", consume.ack.facts.recovery_candidate_id),
            assignment_id: consume.ack.facts.assignment_id.clone(),
            target_lane_incarnation_id: offer.candidate_lane_incarnation_id.clone(),
            task_text: Some(next.task_text),
            ttl_ms: self.timing.reservation_ttl_ms,
        };
        let chain = self
            .step(
                l,
                self.store.offer_handoff_retarget(l, &req, &consume).await,
            )
            .await?;
        tracing::warn!(assignment_id = %chain.assignment_id, lane_id = %chain.lane_id,
            "retarget (pre-transfer): the handoff is offered to the candidate's lane; the source runs on until its ACK");
        self.sync_holds(l).await;
        let _ = self.advance(l, &chain.reservation_id).await;
        Ok(())
    }

    /// Whether `host_id` can answer a recovery challenge at all: the registry holds its
    /// recovery key, unrevoked. (A host without one would never ACK; choosing it would
    /// only offer the same dead candidate again at every deadline.)
    fn can_be_candidate(&self, host_id: &str) -> bool {
        let reg = self.registry.current();
        reg.resolve(&format!("host:{host_id}/recovery"))
            .is_some_and(|k| {
                !k.revoked
                    && k.purpose == crate::protocol::schema::Purpose::Recovery
                    && k.allowed_types
                        .contains(&crate::protocol::schema::MessageType::RecoveryAck)
            })
    }

    /// U by the retarget policy: placement over the roster, or — with no roster published —
    /// the first idle lane by id of a connected host that advertises the runtime. Either
    /// way without the failed lane, without hosts lacking a recovery key and, for work with
    /// a workspace, without the failed lane's host (its workspace is one directory there,
    /// which the failed generation may still hold) and hosts its checkpoint cannot reach.
    async fn select_candidate(
        &self,
        assignment_id: &str,
        runtime: &str,
        failed_lane: &str,
    ) -> Result<Selection, OpError> {
        let lanes = self.store.lanes().await?;
        let failed_host = lanes
            .iter()
            .find(|l| l.lane_id == failed_lane)
            .map(|l| l.host_id.clone())
            .unwrap_or_default();
        let has_workspace = self.store.workspace_of(assignment_id).await?.is_some();
        let mut barred = std::collections::BTreeSet::new();
        for lane in &lanes {
            let host = &lane.host_id;
            if barred.contains(host) {
                continue;
            }
            let bar = !self.can_be_candidate(host)
                || (has_workspace
                    && (*host == failed_host
                        || self
                            .store
                            .workspace_cannot_move(assignment_id, host)
                            .await?
                            .is_some()));
            if bar {
                barred.insert(host.clone());
            }
        }
        let ask = crate::coordinator::placement::PlacementAsk::default();
        let roster = match self
            .store
            .placement_inputs(runtime, &ask, |h| self.hosts.is_connected(h))
            .await
        {
            Ok(inputs) => Some(inputs),
            // No roster published: the first-idle rule below.
            Err(e) if e.category() == Some(Category::NotFound) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(mut inputs) = roster {
            inputs
                .candidates
                .retain(|c| c.lane_id != failed_lane && !barred.contains(&c.host_id));
            let d = crate::coordinator::placement::Decision::decide(inputs).map_err(|why| {
                OpError::new(
                    Category::NoEligibleLane,
                    format!("no lane to retarget to: {why}"),
                )
            })?;
            let host_id = d
                .inputs
                .candidates
                .iter()
                .find(|c| c.lane_id == d.lane_id)
                .map(|c| c.host_id.clone())
                .unwrap_or_default();
            return Ok(Selection {
                lane_id: d.lane_id,
                lane_incarnation_id: d.lane_incarnation_id,
                host_id,
                method: crate::coordinator::placement::POLICY.into(),
                inputs_digest: d.inputs_digest,
                excluded_lane: failed_lane.into(),
            });
        }
        let mut seen = Vec::new();
        let mut chosen = None;
        for lane in lanes {
            let offers = self
                .store
                .host_runtimes(&lane.host_id)
                .await?
                .is_some_and(|r| r.iter().any(|r| r == runtime));
            let ok = lane.lane_id != failed_lane
                && lane.state == LaneState::IdleClean
                && !lane.recreate_requested
                && lane.host_quarantine_reason.is_none()
                && lane.unended_generation.is_none()
                && offers
                && self.hosts.is_connected(&lane.host_id)
                && !barred.contains(&lane.host_id);
            seen.push(format!(
                "{}@{}:{}:{ok}",
                lane.lane_id, lane.lane_incarnation_id, lane.state
            ));
            if ok && chosen.is_none() {
                chosen = Some(lane);
            }
        }
        let Some(lane) = chosen else {
            return Err(OpError::new(
                Category::NoEligibleLane,
                format!("no idle lane of a connected host offers {runtime} (besides the failed lane {failed_lane})"),
            ));
        };
        Ok(Selection {
            lane_id: lane.lane_id,
            lane_incarnation_id: lane.lane_incarnation_id,
            host_id: lane.host_id,
            method: "first-idle".into(),
            inputs_digest: format!(
                "sha256:{}",
                crate::util::sha256_hex(
                    "mosaic/retarget-first-idle/v1",
                    &[seen.join("\n").as_bytes()]
                )
            ),
            excluded_lane: failed_lane.into(),
        })
    }

    /// A candidate host's recovery ACK: checked against the candidate row and the envelope
    /// this coordinator signs for it, then given to the reservation CAS that consumes it.
    pub(super) async fn on_recovery_ack(&self, host: &str, m: RecoveryAck) -> Result<(), OpError> {
        let Some(signer) = self.recovery.clone() else {
            return Err(OpError::new(
                Category::Unavailable,
                "this coordinator has no recovery key",
            ));
        };
        let l = self.leader().await?;
        let principal = format!("host:{host}");
        if m.facts.candidate_principal != principal {
            return Err(OpError::new(
                Category::NotOwner,
                format!("a recovery ACK naming another candidate arrived from {principal}"),
            ));
        }
        let offer = self
            .store
            .recovery_candidate(&m.facts.recovery_candidate_id)
            .await?
            .ok_or_else(|| OpError::new(Category::NotFound, "no such recovery candidate"))?;
        if offer.state == CandidateState::Consumed
            && self
                .store
                .retarget_reservation(&m.facts.recovery_candidate_id)
                .await?
                .is_some()
            && m.facts == offer.challenge.facts
        {
            // The candidate answered a challenge sent again before its first ACK was
            // consumed: that one won; this one changes nothing.
            tracing::debug!(recovery_candidate_id = %m.facts.recovery_candidate_id, "a second recovery ACK of a consumed candidate");
            return Ok(());
        }
        // The ACK names a challenge this coordinator sent on the host's current session.
        let session = self.hosts.session_id(host).unwrap_or_default();
        let sent_here = !session.is_empty()
            && m.acknowledged_recovery_message_id
                .strip_prefix(session.as_str())
                .is_some_and(|n| n.starts_with('.'));
        if !sent_here {
            return Err(OpError::new(
                Category::Mismatch,
                "the recovery ACK names a challenge message that was not sent on this session",
            ));
        }
        let expected = offer
            .challenge
            .envelope_digest(&signer, &principal, &m.acknowledged_recovery_message_id)
            .map_err(|e| OpError::new(Category::Internal, e.to_string()))?;
        if !crate::util::ct::eq(
            expected.as_bytes(),
            m.acknowledged_recovery_challenge_digest.as_bytes(),
        ) {
            return Err(OpError::new(
                Category::Mismatch,
                "the recovery ACK's challenge digest is not the candidate's challenge",
            ));
        }
        let consume = RecoveryConsume {
            ack: m,
            signer_principal: principal,
        };
        if consume.ack.facts.expected_retarget_operation == "pre-transfer" {
            return self.retarget_handoff(&l, &offer, consume).await;
        }
        let m = &consume.ack;
        let next = self
            .store
            .next_attempt(&m.facts.assignment_id)
            .await?
            .ok_or_else(|| OpError::new(Category::NotFound, "no such assignment"))?;
        let req = crate::coordinator::chain::ReserveRequest {
            request_id: format!("retarget/{}", m.facts.recovery_candidate_id),
            lane_incarnation_id: offer.candidate_lane_incarnation_id.clone(),
            assignment_id: Some(m.facts.assignment_id.clone()),
            target: offer.candidate_lane_id.clone(),
            runtime_id: next.runtime_id,
            task_text: next.task_text,
            scope: next.scope,
            holds: next.holds,
            completion_policy: next.completion_policy,
            inactivity_policy: String::new(),
            ttl_ms: self.timing.reservation_ttl_ms,
            repository: None,
            grant: None,
            placement: None,
            recovery: Some(consume.clone()),
        };
        let r = self.step(&l, self.store.reserve(&l, &req).await).await?;
        if !r.receipt.replayed {
            tracing::warn!(assignment_id = %r.chain.assignment_id, lane_id = %r.chain.lane_id,
                reservation_id = %r.chain.reservation_id,
                "retarget: the candidate's ACK was consumed; a fresh chain on the candidate lane (activation still needs its own challenge and ACK)");
        }
        self.bump();
        let _ = self.advance(&l, &r.chain.reservation_id).await;
        Ok(())
    }
}
