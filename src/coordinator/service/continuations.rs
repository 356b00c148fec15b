//! Driving continuations: claim a pending one, reclaim one whose claim lapsed or belongs to
//! another epoch, expire or abandon one out of attempts or time, and send its host what it
//! waits for.
//!
//! **Never:** lets two passes work on one continuation at once. The operator's `continue`,
//! a host's report and the watchdog each start a pass; without the guard, a second pass
//! could send the offer of a claim the first pass committed and has not sent yet, so that
//! a claimant paused between its claim and its send (a stopped process, a slow disk) would
//! see its claim delivered by somebody else under its epoch. With it, a claim is sent by
//! the pass that made it, or, once that pass is gone, by a later one.

use crate::coordinator::leader::Leader;
use crate::coordinator::states::{ContinuationState, LaneState};
use crate::protocol::messages::{Continuation, ContinuationPhase, ToHost};

use super::driver::{Proof, RESEND_AFTER};
use super::Service;

/// One pass's hold on one continuation; released when dropped.
struct Driving<'a> {
    service: &'a Service,
    id: String,
}

impl<'a> Driving<'a> {
    /// Takes the continuation for this pass, or `None` while another pass has it.
    fn take(service: &'a Service, id: &str) -> Option<Self> {
        let mut set = service.driver.driving.lock().ok()?;
        set.insert(id.to_string()).then(|| Self {
            service,
            id: id.to_string(),
        })
    }
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        if let Ok(mut set) = self.service.driver.driving.lock() {
            set.remove(&self.id);
        }
    }
}

impl Service {
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
            let Some(_driving) = Driving::take(self, &v.continuation_id) else {
                continue;
            };
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
                ContinuationPhase::Accepted
            } else {
                ContinuationPhase::Offer
            };
            let Ok(Some(c)) = self.store.chain_by_reservation(&v.reservation_id).await else {
                continue;
            };
            if c.lane_state != LaneState::Running || !c.reservation_open {
                continue;
            }
            let Some(digests) = Self::digests(&c) else {
                continue;
            };
            let m = Continuation {
                authority: self.authority(l, &c, Proof::Reveal),
                digests,
                continuation_id: v.continuation_id.clone(),
                claim_ref: claim_ref.clone(),
                next_action: v.next_action.clone(),
                next_action_digest: v.next_action_digest.clone(),
                loop_budget: v.budget.max(0) as u64,
                phase,
                result_to: "coordinator".into(),
                issued: Self::issued(
                    format!(
                        "continuation/{}/{claim_ref}/{}",
                        v.continuation_id,
                        phase.as_str()
                    ),
                    &c.last_decided_at,
                    &v.expires_at,
                ),
            };
            if self.sign_push(&c.host_id, ToHost::Continuation(m)) {
                let state = if step {
                    ContinuationState::Claimed
                } else {
                    v.state
                };
                let state = state.as_str();
                self.record_sent(&key, state, None);
            }
        }
        keys
    }
}
