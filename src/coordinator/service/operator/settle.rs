//! `mosaic stop`, and what a waiting stop waits for once its outcome is final and recorded:
//! the lane the work held out of RETIRING. The outcome is final with the receipt that proves
//! the end; the lane is IDLE_CLEAN one step later (its cleanup recorded as verified) — a
//! separate transition, so a stop that answered before it would leave an immediate assign on
//! that lane refused. The answer is recorded in the request journal first (a fault after
//! the outcome never leaves a definite answer unrecorded), then the lane awaited.

use super::*;
use crate::coordinator::states::LaneState;

impl Service {
    /// `mosaic stop` / `cancel`: revokes the leases at once, has the host stop the
    /// generation, and answers with the final outcome once the host's receipt proves the
    /// end — or `pending` when the host is unreachable (the outcome becomes final when it
    /// reconnects). Repeating it is idempotent.
    pub async fn stop(
        self: &Arc<Self>,
        assignment_id: &str,
        outcome: Outcome,
        evidence: Option<&str>,
        wait: bool,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let r = self
            .store
            .request_end(&l, assignment_id, outcome, evidence)
            .await;
        let ended = match self.settled(&l, r).await {
            // The end of this assignment was already asked for with another outcome or
            // evidence (the key is the assignment's): that is a conflict, not a bad key.
            Err(e) if e.category == Category::IdempotencyConflict => {
                let asked = self
                    .store
                    .assignment(assignment_id)
                    .await?
                    .and_then(|a| a.requested_outcome)
                    .unwrap_or_default();
                return Err(OpError::new(
                    Category::Conflict,
                    format!(
                        "an end of {assignment_id} was already requested (outcome {asked}); it cannot be changed"
                    ),
                ));
            }
            other => other?,
        };
        let chain = self.store.chain_of_assignment(assignment_id).await?;
        let host = chain
            .as_ref()
            .map(|c| c.host_id.clone())
            .unwrap_or_default();
        if let Some(c) = &chain {
            self.advance(&l, &c.chain.reservation_id).await.ok();
        }
        let view = |a: Option<crate::coordinator::model::AssignmentView>| {
            json!({ "assignment_id": assignment_id, "requested_outcome": outcome.as_str(),
                    "state": a.as_ref().map(|a| a.lifecycle), "final_evidence_digest": a.and_then(|a| a.final_evidence_digest),
                    "leases_revoked": true })
        };
        let done = |s: &Lifecycle| !crate::coordinator::states::NONTERMINAL.contains(s);
        let now = self.store.assignment(assignment_id).await?;
        let final_now = now.as_ref().is_some_and(|a| done(&a.lifecycle));
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        // The lane the work held, when this stop ended a generation there: a waiting stop
        // answers once it has settled (`with_settled_lane`, after the answer is recorded).
        let inc = now
            .as_ref()
            .filter(|_| ended.awaiting_receipt && wait)
            .map(|a| a.lane_incarnation_id.clone());
        let view = |a| {
            let mut v = view(a);
            if let Some(i) = &inc {
                v["lane_incarnation_id"] = json!(i);
            }
            v
        };
        if !ended.awaiting_receipt || final_now || !wait {
            let mut v = view(now);
            if ended.awaiting_receipt && !final_now {
                v["pending"] = json!("waiting for the host's termination receipt");
            }
            return Ok(v);
        }
        if !self.hosts.is_connected(&host) {
            let mut v = view(now);
            v["pending"] = json!("host unreachable: the generation is stopped and the outcome made final when the host reconnects");
            return Ok(v);
        }
        // Read once, then as the waiting hub reads it for every waiter together.
        let mut w = self.waiting.assignments.join(assignment_id);
        let mut a = self.store.assignment(assignment_id).await?;
        loop {
            if a.as_ref().is_some_and(|a| done(&a.lifecycle)) {
                return Ok(view(a));
            }
            tokio::select! {
                row = w.next() => a = Some(row),
                _ = tokio::time::sleep_until(deadline) => {
                    let mut v = view(a);
                    v["pending"] = json!("waiting for the host's termination receipt");
                    return Ok(v);
                }
            }
        }
    }

    /// `v` (a waiting stop's answer, recorded) with `lane_state` when the stop ended a
    /// generation (`lane_incarnation_id`) and its outcome is final: the state of that lane
    /// incarnation once it has left RETIRING (IDLE_CLEAN: usable at once; QUARANTINED: its
    /// cleanup was not verified; RETIRED), or as it is after [`STOP_WAIT`] more (with
    /// `pending`). Nothing is added when the lane is another assignment's by then, or
    /// cannot be read: the stop itself has succeeded.
    pub(super) async fn with_settled_lane(&self, mut v: serde_json::Value) -> serde_json::Value {
        let (Some(inc), Some(assignment_id), None) = (
            v["lane_incarnation_id"].as_str().map(String::from),
            v["assignment_id"].as_str().map(String::from),
            v.get("pending"),
        ) else {
            return v;
        };
        let (inc, assignment_id) = (inc.as_str(), assignment_id.as_str());
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        let retiring = LaneState::Retiring.to_string();
        // Read once, then as the waiting hub reads it for every waiter together.
        let mut w = self
            .waiting
            .lanes
            .join(&crate::coordinator::service::waiting::lane_key(
                inc,
                assignment_id,
            ));
        let mut now = match self.store.lane_after_stop(inc, assignment_id).await {
            Ok(s) => s,
            Err(_) => return v,
        };
        loop {
            let Some(state) = now.clone() else {
                return v;
            };
            if state != retiring {
                v["lane_state"] = json!(state);
                return v;
            }
            if tokio::time::Instant::now() >= deadline {
                v["lane_state"] = json!(state);
                v["pending"] = json!("its lane's cleanup is not recorded as verified yet");
                return v;
            }
            tokio::select! {
                state = w.next() => now = state,
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}
