//! The chain driver: drives each chain on from its rows. Given a reservation, it runs every
//! transition the coordinator can take by itself (checkpoint, fence, stage, activate,
//! finish) and then sends the host the one message the chain waits for (stage, contract,
//! challenge, activate, or the end of a generation).
//!
//! Everything here is re-derived from the database on every call, so any coordinator
//! process can call it for any chain at any time — after a crash, after a takeover, on a
//! host's reconnect — and the worst a duplicate can do is resend a message the host
//! already has (hosts handle every message idempotently).
//!
//! **Never:** keeps where a chain stands in memory (the resend timestamps it keeps are a
//! cache), or sends a message for a chain whose reservation is no longer open.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::coordinator::activation::Activation;
use crate::coordinator::leader::Leader;
use crate::coordinator::model::ChainRow;
use crate::protocol::canonical::Value;
use crate::protocol::envelope::{n, s};
use crate::protocol::schema::MessageType;
use crate::protocol::transport::Outgoing;

use super::operator::OpError;
use super::Service;
use crate::coordinator::states::{ContinuationState, GenState, HandoffState, LaneState};

/// When each waiting chain was last sent its message (a cache for resends).
#[derive(Default)]
pub(crate) struct DriverState {
    sent: Mutex<HashMap<String, (String, Instant)>>,
}

/// How long a chain waits for its host before the watchdog sends the same message again.
pub(crate) const RESEND_AFTER: Duration = Duration::from_secs(5);

/// Which form of the generation's fence proof a message carries (see `protocol::fence`).
#[derive(Clone, Copy)]
enum Proof {
    /// The stage: the commitment.
    Commit,
    /// Everything after: the reveal that opens it.
    Reveal,
}

impl Service {
    /// Runs the coordinator's own steps of this chain, then sends the host what the chain
    /// waits for. Returns the chain as it stands afterwards.
    pub(crate) async fn advance(
        &self,
        l: &Leader,
        reservation_id: &str,
    ) -> Result<Option<ChainRow>, OpError> {
        // Bounded: a chain has at most five coordinator-side steps in a row.
        for _ in 0..8 {
            let Some(c) = self.store.chain_by_reservation(reservation_id).await? else {
                return Ok(None);
            };
            if c.lane_retired {
                return Ok(Some(c));
            }
            // A preactivation chain of another epoch is the takeover's to end, not ours to
            // continue.
            let ours = c.reservation_coordinator_epoch == l.epoch();
            let step = match (c.lane_state, c.reservation_open) {
                (LaneState::Reserved, true) if ours => {
                    self.store.checkpoint(l, &c.chain).await.map(|_| ())
                }
                (LaneState::Checkpointing, true) if ours => {
                    self.store.fence(l, &c.chain).await.map(|_| ())
                }
                (LaneState::Fenced, true) if ours => {
                    self.store.stage(l, &c.chain).await.map(|_| ())
                }
                (LaneState::Ready, true) if ours => {
                    let Some(x) = Activation::of(&self.store, &c, self.timing.lease_ttl_ms) else {
                        return Ok(Some(c));
                    };
                    match self.store.activate(l, &x).await {
                        Ok(_) => {
                            self.bump();
                            if let Some(c) = self.store.chain_by_reservation(reservation_id).await?
                            {
                                self.push_activated(l, &c).await;
                                return Ok(Some(c));
                            }
                            return Ok(None);
                        }
                        Err(e) => Err(e),
                    }
                }
                // An accepted handoff's target chain: its own activation challenge now.
                (LaneState::AwaitingAck, true) if ours && c.challenge_id.is_none() => {
                    match self.store.handoff_of_reservation(reservation_id).await? {
                        Some(h) if h.state == HandoffState::Accepted => self
                            .store
                            .issue_activation_challenge(l, &c.chain, self.timing.challenge_ttl_ms)
                            .await
                            .map(|_| ()),
                        _ => {
                            self.send_waiting(l, &c).await;
                            return Ok(Some(c));
                        }
                    }
                }
                (LaneState::Retiring, _) => self
                    .store
                    .finish(l, &c.chain.lane_incarnation_id)
                    .await
                    .map(|_| ()),
                _ => {
                    self.send_waiting(l, &c).await;
                    return Ok(Some(c));
                }
            };
            match step {
                Ok(()) => self.bump(),
                Err(e) => {
                    self.note(l, &e).await;
                    return Err(e.into());
                }
            }
        }
        Ok(self.store.chain_by_reservation(reservation_id).await?)
    }

    /// Sends the message a chain waits for from its host, if any.
    pub(crate) async fn send_waiting(&self, l: &Leader, c: &ChainRow) {
        // A generation the coordinator wants ended comes first, whatever the lane state.
        if c.stop_requested && c.generation_state != Some(GenState::Ended) {
            if let Some(g) = c.generation {
                let mut lanes = BTreeMap::new();
                lanes.insert(
                    c.chain.lane_id.clone(),
                    LaneOrder {
                        incarnation: c.chain.lane_incarnation_id.clone(),
                        end: BTreeSet::from([g]),
                        recreate: false,
                    },
                );
                if self.push_reconcile(l, &c.host_id, &lanes).await {
                    self.mark_sent(&c.chain.reservation_id, "END");
                }
            }
            return;
        }
        if !c.reservation_open || c.reservation_coordinator_epoch != l.epoch() {
            return;
        }
        let sent = match c.lane_state {
            LaneState::Staging => self.push_stage(l, c).await,
            LaneState::ContractInjecting if c.contracts_digest.is_some() => {
                self.push_contract(l, c).await
            }
            LaneState::AwaitingAck if c.challenge_id.is_some() => self.push_challenge(l, c).await,
            LaneState::AwaitingAck => self.push_handoff_challenge(l, c).await,
            _ => false,
        };
        if sent {
            self.mark_sent(&c.chain.reservation_id, c.lane_state.as_str());
        }
    }

    fn mark_sent(&self, reservation: &str, state: &str) {
        if let Ok(mut m) = self.driver.sent.lock() {
            m.insert(reservation.to_string(), (state.to_string(), Instant::now()));
        }
    }

    /// Whether a chain waiting in `state` was sent its message longer ago than `after`.
    pub(crate) fn stale_since(&self, reservation: &str, state: &str, after: Duration) -> bool {
        match self.driver.sent.lock() {
            Ok(m) => match m.get(reservation) {
                Some((st, at)) if st == state => at.elapsed() >= after,
                _ => true,
            },
            Err(_) => true,
        }
    }

    pub(crate) fn forget_sent(&self, keep: &BTreeSet<String>) {
        if let Ok(mut m) = self.driver.sent.lock() {
            m.retain(|k, _| keep.contains(k));
        }
    }

    /// The chain fields every ordinary coordinator message carries.
    fn chain_fields(&self, l: &Leader, c: &ChainRow, proof: Proof) -> Vec<(&'static str, Value)> {
        let ch = &c.chain;
        vec![
            ("sot_incarnation", s(l.sot())),
            ("coordinator_epoch", n(l.epoch() as u64)),
            ("assignment_id", s(&ch.assignment_id)),
            ("lane_id", s(&ch.lane_id)),
            ("lane_incarnation_id", s(&ch.lane_incarnation_id)),
            ("assignment_attempt_id", s(&ch.assignment_attempt_id)),
            ("reservation_id", s(&ch.reservation_id)),
            ("reservation_epoch", n(ch.reservation_epoch as u64)),
            ("reservation_deadline", s(&c.reservation_deadline)),
            ("runtime_id", s(&c.runtime_id)),
            ("generation", n(c.generation.unwrap_or(0) as u64)),
            ("fence_proof", s(&self.fence_proof(c, proof))),
        ]
    }

    /// The generation's fence proof (see `protocol::fence`): derived from the fence token
    /// on the spot (the token is dropped, zeroized, right after).
    fn fence_proof(&self, c: &ChainRow, proof: Proof) -> String {
        let token = self
            .store
            .secret
            .fence_token(&c.chain.reservation_id, &c.fence_salt);
        let r = token.generation_reveal(
            &c.chain.lane_incarnation_id,
            c.generation.unwrap_or(0) as u64,
        );
        match proof {
            Proof::Commit => crate::protocol::fence::commitment(&r),
            Proof::Reveal => crate::protocol::fence::reveal(&r),
        }
    }

    /// The commitment a host's messages about this chain must echo.
    pub(crate) fn fence_commitment(&self, c: &ChainRow) -> String {
        self.fence_proof(c, Proof::Commit)
    }

    fn issued(at: &str, until: &str) -> [(&'static str, Value); 2] {
        [("issued_at", s(at)), ("expires_at", s(until))]
    }

    fn sign_push(&self, host_id: &str, t: MessageType, fields: Vec<(&'static str, Value)>) -> bool {
        crate::coordinator::failpoint::before_push(t.as_str());
        self.hosts
            .push(host_id, Outgoing::new(&self.ordinary, t, fields))
            .is_ok()
    }

    async fn push_stage(&self, l: &Leader, c: &ChainRow) -> bool {
        let mut f = self.chain_fields(l, c, Proof::Commit);
        f.push((
            "idempotency_key",
            s(&format!("stage/{}", c.chain.reservation_id)),
        ));
        f.extend(Self::issued(&c.last_decided_at, &c.reservation_deadline));
        self.sign_push(&c.host_id, MessageType::Stage, f)
    }

    async fn push_contract(&self, l: &Leader, c: &ChainRow) -> bool {
        let Some(cd) = &c.contracts_digest else {
            return false;
        };
        let mut f = self.chain_fields(l, c, Proof::Reveal);
        f.extend([
            (
                "idempotency_key",
                s(&format!("contract/{}", c.chain.reservation_id)),
            ),
            ("contracts_digest", s(cd)),
            ("scope_digest", s(&c.scope_digest)),
            ("holds_digest", s(&c.holds_digest)),
            ("task_text", s(&c.task_text)),
        ]);
        f.extend(Self::issued(&c.last_decided_at, &c.reservation_deadline));
        self.sign_push(&c.host_id, MessageType::Contract, f)
    }

    async fn push_challenge(&self, l: &Leader, c: &ChainRow) -> bool {
        let (Some(cd), Some(ch), Some(exp)) = (
            &c.contracts_digest,
            &c.challenge_id,
            &c.challenge_expires_at,
        ) else {
            return false;
        };
        let mut f = self.chain_fields(l, c, Proof::Reveal);
        f.extend([
            (
                "idempotency_key",
                s(&format!("challenge/{}", c.chain.reservation_id)),
            ),
            ("contracts_digest", s(cd)),
            ("scope_digest", s(&c.scope_digest)),
            ("holds_digest", s(&c.holds_digest)),
            ("challenge_id", s(ch)),
        ]);
        f.extend(Self::issued(&c.last_decided_at, exp));
        self.sign_push(&c.host_id, MessageType::Challenge, f)
    }

    /// A handoff target's generation is sent its handoff challenge (spec §8.1), with every
    /// field its ACK must bind.
    async fn push_handoff_challenge(&self, l: &Leader, c: &ChainRow) -> bool {
        let Ok(Some(h)) = self
            .store
            .handoff_of_reservation(&c.chain.reservation_id)
            .await
        else {
            return false;
        };
        let (Some(hc), Some(deadline), Some(cd)) =
            (&h.challenge_id, &h.challenge_deadline, &c.contracts_digest)
        else {
            return false;
        };
        if h.state != HandoffState::Challenged {
            return false;
        }
        let mut f = self.chain_fields(l, c, Proof::Reveal);
        f.extend([
            (
                "idempotency_key",
                s(&format!("handoff-challenge/{}", c.chain.reservation_id)),
            ),
            ("contracts_digest", s(cd)),
            ("scope_digest", s(&c.scope_digest)),
            ("holds_digest", s(&c.holds_digest)),
            ("handoff_challenge_id", s(hc)),
            ("source_assignment_attempt_id", s(&h.source_attempt_id)),
            ("responsibility_owner", s(&h.responsibility_owner)),
            ("execution_owner", s(&h.execution_owner)),
            ("pending_target", s(&h.pending_target)),
            ("next_action", s(&h.next_action)),
            ("next_action_digest", s(&h.next_action_digest)),
            ("challenge_deadline", s(deadline)),
        ]);
        f.extend(Self::issued(&c.last_decided_at, deadline));
        self.sign_push(&c.host_id, MessageType::HandoffChallenge, f)
    }

    /// Drives every open continuation (or just `only`): claims a pending one, reclaims one
    /// whose claim lapsed or belongs to another epoch, expires one out of attempts or time,
    /// and sends the host what the continuation waits for — the current claim's offer, or,
    /// once accepted, the word to make it visible (resent until its result, which is safe:
    /// the host shows each continuation at most once). Returns the resend-cache keys of the
    /// continuations it found open.
    pub(crate) async fn push_continuations(&self, l: &Leader, only: Option<&str>) -> Vec<String> {
        let open = match self.store.open_continuations().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list continuations");
                return Vec::new();
            }
        };
        let keys = open
            .iter()
            .map(|v| format!("continuation/{}", v.continuation_id))
            .collect();
        for v in open {
            if only.is_some_and(|o| o != v.continuation_id) {
                continue;
            }
            let key = format!("continuation/{}", v.continuation_id);
            let ours = v.claimant_epoch == Some(l.epoch());
            let step = match v.state {
                ContinuationState::Pending | ContinuationState::Claimed
                    if v.expired
                        || (v.attempts >= v.max_attempts
                            && (v.state == ContinuationState::Pending || v.claim_expired)) =>
                {
                    match self.store.expire_continuation(l, &v).await {
                        Ok(_) => {
                            self.bump();
                            tracing::warn!(continuation_id = %v.continuation_id, assignment_id = %v.assignment_id,
                                attempts = v.attempts, "continuation expired undelivered");
                        }
                        Err(e) => self.note(l, &e).await,
                    }
                    continue;
                }
                ContinuationState::DeliveryAccepted if v.expired => {
                    match self.store.abandon_continuation(l, &v).await {
                        Ok(r) => {
                            self.bump();
                            tracing::error!(continuation_id = %v.continuation_id, assignment_id = %v.assignment_id,
                                "continuation accepted but no result by its deadline: abandoned, its generation replaced");
                            if r.body["generation_replaced"] == true {
                                let _ = self.advance(l, &v.reservation_id).await;
                            }
                        }
                        Err(e) => self.note(l, &e).await,
                    }
                    continue;
                }
                ContinuationState::Pending => true,
                ContinuationState::Claimed if v.claim_expired || !ours => true,
                _ => false,
            };
            let claim_ref = if step {
                match self.store.claim_continuation(l, &v).await {
                    Ok(r) => {
                        self.bump();
                        r.body["claim_ref"].as_str().map(String::from)
                    }
                    Err(e) => {
                        self.note(l, &e).await;
                        continue;
                    }
                }
            } else {
                if only.is_none() && !self.stale_since(&key, v.state.as_str(), RESEND_AFTER) {
                    continue;
                }
                v.claim_ref.clone()
            };
            let Some(claim_ref) = claim_ref else { continue };
            let phase = if v.state == ContinuationState::DeliveryAccepted {
                "accepted"
            } else {
                "offer"
            };
            let Ok(Some(c)) = self.store.chain_by_reservation(&v.reservation_id).await else {
                continue;
            };
            if c.lane_state != LaneState::Running || !c.reservation_open {
                continue;
            }
            let Some(cd) = &c.contracts_digest else {
                continue;
            };
            let mut f = self.chain_fields(l, &c, Proof::Reveal);
            f.extend([
                (
                    "idempotency_key",
                    s(&format!(
                        "continuation/{}/{claim_ref}/{phase}",
                        v.continuation_id
                    )),
                ),
                ("contracts_digest", s(cd)),
                ("scope_digest", s(&c.scope_digest)),
                ("holds_digest", s(&c.holds_digest)),
                ("continuation_id", s(&v.continuation_id)),
                ("claim_ref", s(&claim_ref)),
                ("next_action", s(&v.next_action)),
                ("next_action_digest", s(&v.next_action_digest)),
                ("loop_budget", n(v.budget.max(0) as u64)),
                ("phase", s(phase)),
                ("result_to", s("coordinator")),
            ]);
            f.extend(Self::issued(&c.last_decided_at, &v.expires_at));
            if self.sign_push(&c.host_id, MessageType::Continuation, f) {
                let state = if step {
                    ContinuationState::Claimed
                } else {
                    v.state
                };
                let state = state.as_str();
                self.mark_sent(&key, state);
            }
        }
        keys
    }

    /// Tells the host its generation is RUNNING (after activation, and again whenever the
    /// host reports it does not know yet).
    pub(crate) async fn push_activated(&self, l: &Leader, c: &ChainRow) -> bool {
        let Some(cd) = &c.contracts_digest else {
            return false;
        };
        let lease_until = self
            .store
            .lease_expiry(&c.chain.reservation_id)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| c.reservation_deadline.clone());
        let mut f = self.chain_fields(l, c, Proof::Reveal);
        f.extend([
            (
                "idempotency_key",
                s(&format!("activate/{}", c.chain.reservation_id)),
            ),
            ("contracts_digest", s(cd)),
            ("scope_digest", s(&c.scope_digest)),
            ("holds_digest", s(&c.holds_digest)),
            ("control_op", s("activate")),
        ]);
        f.extend(Self::issued(&c.last_decided_at, &lease_until));
        self.sign_push(&c.host_id, MessageType::Control, f)
    }

    /// Sends a host what to end, per lane. Only ever takes authority away.
    pub(crate) async fn push_reconcile(
        &self,
        l: &Leader,
        host_id: &str,
        lanes: &BTreeMap<String, LaneOrder>,
    ) -> bool {
        if lanes.is_empty() {
            return true;
        }
        let Some(session_id) = self.hosts.session_id(host_id) else {
            return false;
        };
        let body = Value::Object(
            lanes
                .iter()
                .map(|(lane, o)| {
                    (
                        lane.clone(),
                        Value::Object(vec![
                            (
                                "end".into(),
                                Value::Array(o.end.iter().map(|g| n(*g as u64)).collect()),
                            ),
                            ("lane_incarnation_id".into(), s(&o.incarnation)),
                            ("recreate".into(), Value::Bool(o.recreate)),
                        ]),
                    )
                })
                .collect(),
        );
        crate::coordinator::failpoint::before_push("reconcile");
        let env = Outgoing::new(
            &self.session,
            MessageType::Reconcile,
            vec![
                (
                    "idempotency_key",
                    s(&format!("reconcile/{}", uuid::Uuid::new_v4().simple())),
                ),
                ("sot_incarnation", s(l.sot())),
                ("coordinator_epoch", n(l.epoch() as u64)),
                ("assignment_id", Value::Null),
                ("session_id", s(&session_id)),
                ("lanes", body),
            ],
        );
        self.hosts.push(host_id, env).is_ok()
    }

    /// Drives every live chain of `host_id` (all hosts when `None`) as far as it goes.
    pub(crate) async fn advance_all(&self, l: &Leader, host_id: Option<&str>) {
        let chains = match self.store.live_chains(host_id).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list live chains");
                return;
            }
        };
        for c in chains {
            if let Err(e) = self.advance(l, &c.chain.reservation_id).await {
                tracing::debug!(reservation_id = %c.chain.reservation_id, error = %e.message, "chain not advanced");
            }
        }
    }
}

/// What a reconcile tells a host about one lane.
#[derive(Debug, Clone, Default)]
pub(crate) struct LaneOrder {
    pub incarnation: String,
    pub end: BTreeSet<i64>,
    pub recreate: bool,
}
