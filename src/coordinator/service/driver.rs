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

use crate::coordinator::ending::EndCause;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::coordinator::activation::Activation;
use crate::coordinator::leader::Leader;
use crate::coordinator::model::ChainRow;
use crate::protocol::messages::{
    Activate, ChainAuthority, Challenge, Contract, Digests, HandoffBound, HandoffChallenge, Issued,
    Reconcile, Stage, ToHost,
};
use crate::protocol::report::LaneOrderWire;
use crate::protocol::transport::Outgoing;

use super::operator::OpError;
use super::Service;
use crate::coordinator::states::{GenState, HandoffState, LaneState};

/// What a stage of work in a repository restores.
enum Restore {
    /// This point (none: a fresh clone).
    At(Option<crate::protocol::repo::RestorePoint>),
    /// A handoff's checkpoint, not recorded or not stored yet.
    Wait,
    /// A checkpoint that will never reach the chain (a handoff's, a grant's): why, and
    /// the end it gives the chain.
    Never(String, crate::coordinator::ending::EndCause),
}

/// A waiting chain's last message: the state it waited in, when, and exactly what (the
/// message's subject and the host session it went to).
struct Sent {
    state: String,
    at: Instant,
    exact: Option<(String, Option<String>)>,
}

/// When each waiting chain was last sent its message (a cache for resends).
#[derive(Default)]
pub(crate) struct DriverState {
    sent: Mutex<HashMap<String, Sent>>,
    /// The continuations a pass of `push_continuations` is working on right now: another
    /// pass skips them (see `continuations.rs`).
    pub(super) driving: Mutex<BTreeSet<String>>,
    /// The source generations this process told to hold their workspace (by reservation),
    /// so that it can release them when the offer ends (see `holds.rs`).
    pub(super) held: Mutex<BTreeMap<String, super::holds::Held>>,
}

/// How long a chain waits for its host before the watchdog sends the same message again.
pub(crate) const RESEND_AFTER: Duration = Duration::from_secs(5);

/// Which form of the generation's fence proof a message carries (see `protocol::fence`).
#[derive(Clone, Copy)]
pub(crate) enum Proof {
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

    /// Sends the message a chain waits for from its host, if any — unless this very
    /// message went to the host's current session less than `RESEND_AFTER` ago. Every
    /// caller of `advance` that finds the chain waiting would send it again (the operator's
    /// request, the host's next message, the watchdog's sweep, a report), and each copy
    /// costs the host a duplicate to answer and the coordinator a replayed transition for
    /// its answer (issue 22). The watchdog still resends after `RESEND_AFTER`, and a new
    /// session is sent everything at once.
    pub(crate) async fn send_waiting(&self, l: &Leader, c: &ChainRow) {
        let session = self.hosts.session_id(&c.host_id);
        // A generation the coordinator wants ended comes first, whatever the lane state.
        if c.stop_requested && c.generation_state != Some(GenState::Ended) {
            if let Some(g) = c.generation {
                let exact = (format!("END/{g}"), session);
                if self.sent_just_now(&c.chain.reservation_id, &exact) {
                    return;
                }
                let mut lanes = BTreeMap::new();
                lanes.insert(
                    c.chain.lane_id.clone(),
                    LaneOrder {
                        incarnation: c.chain.lane_incarnation_id.clone(),
                        end: BTreeSet::from([g]),
                        ..LaneOrder::default()
                    },
                );
                if self.push_reconcile(l, &c.host_id, &lanes).await {
                    self.record_sent(&c.chain.reservation_id, "END", Some(exact));
                }
            }
            return;
        }
        if !c.reservation_open || c.reservation_coordinator_epoch != l.epoch() {
            return;
        }
        // A handoff target's challenge (awaiting its ACK with no activation challenge) is
        // not named by the row, so its message is never taken for one already sent.
        let named = c.lane_state != LaneState::AwaitingAck || c.challenge_id.is_some();
        let exact = named.then(|| {
            (
                format!(
                    "{}/{:?}/{:?}/{:?}",
                    c.lane_state, c.generation, c.contracts_digest, c.challenge_id
                ),
                session,
            )
        });
        if exact
            .as_ref()
            .is_some_and(|e| self.sent_just_now(&c.chain.reservation_id, e))
        {
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
            self.record_sent(&c.chain.reservation_id, c.lane_state.as_str(), exact);
        }
    }

    /// Records that `key`'s message for `state` went out now (and, where known, exactly
    /// which message to which session, for `sent_just_now`).
    pub(super) fn record_sent(
        &self,
        key: &str,
        state: &str,
        exact: Option<(String, Option<String>)>,
    ) {
        if let Ok(mut m) = self.driver.sent.lock() {
            m.insert(
                key.to_string(),
                Sent {
                    state: state.to_string(),
                    at: Instant::now(),
                    exact,
                },
            );
        }
    }

    /// Whether exactly this message (subject and session) went out less than
    /// `RESEND_AFTER` ago.
    fn sent_just_now(&self, key: &str, exact: &(String, Option<String>)) -> bool {
        exact.1.is_some()
            && self.driver.sent.lock().is_ok_and(|m| {
                m.get(key).is_some_and(|s| {
                    s.exact.as_ref() == Some(exact) && s.at.elapsed() < RESEND_AFTER
                })
            })
    }

    /// Whether a chain waiting in `state` was sent its message longer ago than `after`.
    pub(crate) fn stale_since(&self, reservation: &str, state: &str, after: Duration) -> bool {
        match self.driver.sent.lock() {
            Ok(m) => match m.get(reservation) {
                Some(s) if s.state == state => s.at.elapsed() >= after,
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

    /// The authority every ordinary coordinator message carries.
    pub(crate) fn authority(&self, l: &Leader, c: &ChainRow, proof: Proof) -> ChainAuthority {
        let ch = &c.chain;
        ChainAuthority {
            sot_incarnation: l.sot().to_string(),
            coordinator_epoch: l.epoch() as u64,
            assignment_id: ch.assignment_id.clone(),
            lane_id: ch.lane_id.clone(),
            lane_incarnation_id: ch.lane_incarnation_id.clone(),
            assignment_attempt_id: ch.assignment_attempt_id.clone(),
            reservation_id: ch.reservation_id.clone(),
            reservation_epoch: ch.reservation_epoch as u64,
            reservation_deadline: c.reservation_deadline.clone(),
            runtime_id: c.runtime_id.clone(),
            generation: c.generation.unwrap_or(0) as u64,
            fence_proof: self.fence_proof(c, proof),
        }
    }

    /// The contract digests, once the chain has a contract.
    pub(crate) fn digests(c: &ChainRow) -> Option<Digests> {
        Some(Digests {
            contracts_digest: c.contracts_digest.clone()?,
            scope_digest: c.scope_digest.clone(),
            holds_digest: c.holds_digest.clone(),
        })
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

    pub(super) fn issued(key: String, at: &str, until: &str) -> Issued {
        Issued {
            idempotency_key: key,
            issued_at: at.to_string(),
            expires_at: until.to_string(),
        }
    }

    pub(super) fn sign_push(&self, host_id: &str, m: ToHost) -> bool {
        crate::coordinator::failpoint::before_push(m.message_type().as_str());
        self.hosts
            .push(host_id, Outgoing::to_host(&self.ordinary, &m))
            .is_ok()
    }

    async fn push_stage(&self, l: &Leader, c: &ChainRow) -> bool {
        // Work in a repository restores its workspace from its latest checkpoint (the host
        // keeps its own workspace when it is already that checkpoint's). Decided once, before
        // the first stage leaves; a resend sends the very same point (its activation will
        // require the host to have restored exactly that: `restore_binding`).
        let decided = match &c.repository {
            Some(_) => match self.store.decided_restore(&c.chain.reservation_id).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, reservation_id = %c.chain.reservation_id,
                        "cannot read the stage's restore decision; the stage waits");
                    return false;
                }
            },
            None => Some(None),
        };
        let restore = match decided {
            Some(p) => p,
            None => match self.restore_for(l, c).await {
                Ok(Restore::At(p)) => {
                    if let Err(e) = self.store.decide_restore(l, &c.chain, p.as_ref()).await {
                        tracing::error!(error = %e, reservation_id = %c.chain.reservation_id,
                            "the stage's restore point cannot be bound to its chain; the stage is not sent");
                        self.note(l, &e).await;
                        return false;
                    }
                    p
                }
                // A handoff's checkpoint not taken (or not in the store) yet: asked for.
                Ok(Restore::Wait) => return false,
                // It never will be: the offer ends now rather than hold its source until
                // its deadline.
                Ok(Restore::Never(why, end)) => {
                    tracing::error!(reservation_id = %c.chain.reservation_id, assignment_id = %c.chain.assignment_id,
                        reason = %why, "the checkpoint this stage must restore cannot reach it: the chain ends");

                    if let Err(e) = self.store.end_chain(l, &c.chain, end).await {
                        self.note(l, &e).await;
                    }
                    return false;
                }
                Err(e) => {
                    tracing::warn!(error = %e, reservation_id = %c.chain.reservation_id,
                        "cannot read the work's checkpoint; the stage waits");
                    return false;
                }
            },
        };
        let m = Stage {
            authority: self.authority(l, c, Proof::Commit),
            issued: Self::issued(
                format!("stage/{}", c.chain.reservation_id),
                &c.last_decided_at,
                &c.reservation_deadline,
            ),
            repository: c.repository.clone(),
            restore,
            artifact_recipients: self.recipients.clone(),
        };
        self.sign_push(&c.host_id, ToHost::Stage(m))
    }

    /// The checkpoint a stage of work in a repository restores: a handoff target's, the
    /// one its offer took of the source's held workspace (`Wait` until it is recorded and,
    /// for another host than its own, in the store — the source host is asked for it
    /// meanwhile; `Never` once it cannot be); any other chain's, the work's latest.
    async fn restore_for(
        &self,
        l: &Leader,
        c: &ChainRow,
    ) -> Result<Restore, crate::coordinator::error::AuthorityError> {
        let h = self
            .store
            .handoff_of_reservation(&c.chain.reservation_id)
            .await?;
        let Some(h) = h.filter(|h| h.needs_checkpoint) else {
            let own = self.store.restore_point(&c.chain.assignment_id).await?;
            // Another host's checkpoint not in the store yet (a late receipt made it the
            // latest after the reservation): not decided before its objects can reach
            // this host.
            if own
                .as_ref()
                .is_some_and(|p| p.host_id != c.host_id && p.bundle_object.is_none())
            {
                return Ok(Restore::Wait);
            }
            if own.is_some() || !self.store.has_grant(&c.chain.assignment_id).await? {
                return Ok(Restore::At(own));
            }
            return self.granted(l, c).await;
        };
        if let Some(e) = h.checkpoint_error {
            return Ok(Restore::Never(e, EndCause::NoHandoffCheckpoint));
        }
        if h.checkpoint_digest.is_none() {
            if h.state == HandoffState::Offered {
                self.push_handoff_checkpoint(l, &h, c).await;
            }
            return Ok(Restore::Wait);
        }
        match self.store.handoff_restore_point(&h.handoff_id).await? {
            Some(p) if p.host_id == c.host_id || p.bundle_object.is_some() => {
                Ok(Restore::At(Some(p)))
            }
            Some(_) => match self.store.handoff_transfer_error(&h.handoff_id).await? {
                Some(e) => Ok(Restore::Never(e, EndCause::NoHandoffCheckpoint)),
                None => Ok(Restore::Wait), // its host's upload is not finished
            },
            None => Ok(Restore::Wait),
        }
    }

    /// The checkpoint a remediation assignment's first stage restores: its grant's, once
    /// this chain consumed it (one fenced step, with its access receipt; again for the
    /// same chain, nothing new). A grant that cannot be consumed — spent, revoked,
    /// expired, made for another attempt, or any bound field not holding — ends the chain:
    /// the work never starts from a fresh clone in its place.
    async fn granted(
        &self,
        l: &Leader,
        c: &ChainRow,
    ) -> Result<Restore, crate::coordinator::error::AuthorityError> {
        let Some(g) = self
            .store
            .grant_of_attempt(&c.chain.assignment_attempt_id)
            .await?
        else {
            return Ok(Restore::Never(
                "its workspace starts from a granted checkpoint, and this attempt has no grant (a grant is single-use: the work needs a new assignment with a new grant)".into(),
                EndCause::NoGrantedCheckpoint,
            ));
        };
        if g.consumed_by_reservation.as_deref() != Some(c.chain.reservation_id.as_str()) {
            if let Some(why) = g.spent() {
                return Ok(Restore::Never(why, EndCause::NoGrantedCheckpoint));
            }
            if let Err(e) = self.store.consume_grant(l, c, &g).await {
                return match e.category() {
                    Some(crate::coordinator::error::Category::Conflict) => Ok(Restore::Never(
                        format!(
                            "grant {} does not hold for this chain: {e}",
                            g.binding.grant_id
                        ),
                        EndCause::NoGrantedCheckpoint,
                    )),
                    _ => Err(e),
                };
            }
        }
        // The very record the grant binds (of its source generation, that digest: its end,
        // or one it asked for while it ran), never another row of that generation.
        let point = self
            .store
            .point_where(
                "ck.handoff_id IS NULL AND ck.lane_incarnation_id || '/' || ck.generation::text || '/' || ck.checkpoint_digest = $1",
                &format!(
                    "{}/{}/{}",
                    g.binding.source_lane_incarnation_id,
                    g.binding.source_generation,
                    g.binding.checkpoint_digest
                ),
            )
            .await?
            .filter(|p| p.checkpoint_digest == g.binding.checkpoint_digest);
        match point {
            Some(p) if p.host_id == c.host_id || p.bundle_object.is_some() => {
                Ok(Restore::At(Some(p)))
            }
            Some(_) => Ok(Restore::Wait), // its host's upload is not finished
            None => Ok(Restore::Never(
                format!(
                    "the granted checkpoint {} is no longer recorded",
                    g.binding.checkpoint_digest
                ),
                EndCause::NoGrantedCheckpoint,
            )),
        }
    }

    /// Asks the source host of handoff `h` to hold its generation's workspace and
    /// checkpoint it (under the source chain's authority, valid while the `target` chain's
    /// reservation is).
    async fn push_handoff_checkpoint(
        &self,
        l: &Leader,
        h: &crate::coordinator::handoff::HandoffView,
        target: &ChainRow,
    ) {
        let src = match self
            .store
            .chain_by_reservation(&h.source_reservation_id)
            .await
        {
            Ok(Some(s)) if s.reservation_open => s,
            _ => return,
        };
        let Some(digests) = Self::digests(&src) else {
            return;
        };
        if !self.hosts.is_connected(&src.host_id) {
            return;
        }
        let m = crate::protocol::messages::HandoffCheckpoint {
            authority: self.authority(l, &src, Proof::Reveal),
            digests,
            handoff_id: h.handoff_id.clone(),
            issued: Self::issued(
                format!("handoff-checkpoint/{}", h.handoff_id),
                &target.last_decided_at,
                &target.reservation_deadline,
            ),
        };
        self.sign_push(&src.host_id, ToHost::HandoffCheckpoint(m));
    }

    async fn push_contract(&self, l: &Leader, c: &ChainRow) -> bool {
        let Some(digests) = Self::digests(c) else {
            return false;
        };
        let m = Contract {
            authority: self.authority(l, c, Proof::Reveal),
            digests,
            task_text: c.task_text.clone(),
            issued: Self::issued(
                format!("contract/{}", c.chain.reservation_id),
                &c.last_decided_at,
                &c.reservation_deadline,
            ),
        };
        self.sign_push(&c.host_id, ToHost::Contract(m))
    }

    async fn push_challenge(&self, l: &Leader, c: &ChainRow) -> bool {
        let (Some(digests), Some(ch), Some(exp)) =
            (Self::digests(c), &c.challenge_id, &c.challenge_expires_at)
        else {
            return false;
        };
        let m = Challenge {
            authority: self.authority(l, c, Proof::Reveal),
            digests,
            challenge_id: ch.clone(),
            issued: Self::issued(
                format!("challenge/{}", c.chain.reservation_id),
                &c.last_decided_at,
                exp,
            ),
        };
        self.sign_push(&c.host_id, ToHost::Challenge(m))
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
        let (Some(hc), Some(deadline), Some(digests)) =
            (&h.challenge_id, &h.challenge_deadline, Self::digests(c))
        else {
            return false;
        };
        if h.state != HandoffState::Challenged {
            return false;
        }
        let m = HandoffChallenge {
            authority: self.authority(l, c, Proof::Reveal),
            digests,
            bound: HandoffBound {
                handoff_challenge_id: hc.clone(),
                source_assignment_attempt_id: h.source_attempt_id.clone(),
                responsibility_owner: h.responsibility_owner.clone(),
                execution_owner: h.execution_owner.clone(),
                pending_target: h.pending_target.clone(),
                next_action_digest: h.next_action_digest.clone(),
                challenge_deadline: deadline.clone(),
                checkpoint_digest: h.checkpoint_digest.clone(),
            },
            next_action: h.next_action.clone(),
            issued: Self::issued(
                format!("handoff-challenge/{}", c.chain.reservation_id),
                &c.last_decided_at,
                deadline,
            ),
        };
        self.sign_push(&c.host_id, ToHost::HandoffChallenge(m))
    }

    /// Tells the host its generation is RUNNING (after activation, and again whenever the
    /// host reports it does not know yet).
    pub(crate) async fn push_activated(&self, l: &Leader, c: &ChainRow) -> bool {
        let Some(digests) = Self::digests(c) else {
            return false;
        };
        let lease_until = self
            .store
            .lease_expiry(&c.chain.reservation_id)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| c.reservation_deadline.clone());
        let m = Activate {
            authority: self.authority(l, c, Proof::Reveal),
            digests,
            issued: Self::issued(
                format!("activate/{}", c.chain.reservation_id),
                &c.last_decided_at,
                &lease_until,
            ),
        };
        self.sign_push(&c.host_id, ToHost::Activate(m))
    }

    /// Sends a host what to end (or hold, or release), per lane. Only ever takes authority
    /// away, but for a release, which gives back only what the work's own chain had.
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
        let lanes = lanes
            .iter()
            .map(|(lane, o)| {
                let gens = |s: &BTreeSet<i64>| s.iter().map(|g| *g as u64).collect();
                let order = LaneOrderWire {
                    lane_incarnation_id: o.incarnation.clone(),
                    end: gens(&o.end),
                    hold: gens(&o.hold),
                    release: gens(&o.release),
                    recreate: o.recreate,
                    create: o.create,
                    destroy: o.destroy,
                };
                (lane.clone(), order)
            })
            .collect();
        crate::coordinator::failpoint::before_push("reconcile");
        let m = ToHost::Reconcile(Reconcile {
            idempotency_key: format!("reconcile/{}", uuid::Uuid::new_v4().simple()),
            sot_incarnation: Some(l.sot().to_string()),
            coordinator_epoch: Some(l.epoch() as u64),
            session_id,
            lanes,
        });
        let env = Outgoing::to_host(&self.session, &m);
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
    /// Generations whose workspace is held read-only (their work is offered away).
    pub hold: BTreeSet<i64>,
    /// Held generations whose work came back: their workspace opens again.
    pub release: BTreeSet<i64>,
    pub recreate: bool,
    /// Make this lane (an elastic lane's lease waits for it); `incarnation` is empty.
    pub create: bool,
    /// Destroy the lane's `incarnation` for good (its lease's destruction was decided).
    pub destroy: bool,
}
