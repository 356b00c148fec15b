//! `mosaic handoff`: the operator's side of an offer.

use super::*;

impl Service {
    /// `mosaic handoff`: validated like an assign (lane, host, runtime, task) before anything
    /// is reserved; then the offer and the target chain, driven as far as it goes.
    pub(super) async fn handoff(
        &self,
        assignment_id: &str,
        lane_id: &str,
        task: Option<String>,
        within_ms: Option<i64>,
        request_id: String,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let lane = self.known_lane(lane_id).await?;
        if within_ms.is_some_and(|w| !(1000..=86_400_000).contains(&w)) {
            return Err(OpError::new(
                Category::BadInput,
                "--within-ms takes 1000..86400000",
            ));
        }
        let Some(a) = self.store.assignment(assignment_id).await? else {
            return Err(OpError::new(
                Category::NotFound,
                format!("no assignment {assignment_id}"),
            ));
        };
        if !self.hosts.is_connected(&lane.host_id) {
            return Err(OpError::new(
                Category::HostUnreachable,
                format!("host:{} is not connected to this coordinator", lane.host_id),
            ));
        }
        let runtime = a.runtime_id;
        let runtimes = self
            .store
            .host_runtimes(&lane.host_id)
            .await?
            .unwrap_or_default();
        if !runtimes.iter().any(|r| r == &runtime) {
            return Err(OpError::new(
                Category::UnknownRuntime,
                format!("host:{} does not offer runtime {runtime}", lane.host_id),
            ));
        }
        if let Some(t) = &task {
            crate::adapter::validate_task(&runtime, t).map_err(|e| {
                OpError::new(
                    match e {
                        task::TaskError::TooLarge { .. } => Category::TooLarge,
                        _ => Category::BadInput,
                    },
                    e.to_string(),
                )
            })?;
        }
        let req = crate::coordinator::handoff::OfferRequest {
            request_id,
            assignment_id: assignment_id.to_string(),
            target_lane_incarnation_id: lane.lane_incarnation_id.clone(),
            task_text: task,
            ttl_ms: within_ms.unwrap_or(self.timing.reservation_ttl_ms),
        };
        let r = self.store.offer_handoff(&l, &req).await;
        let chain = self.settled(&l, r).await?;
        // The source's workspace is held from now on (its admission closed with the offer).
        self.sync_holds(&l).await;
        let c = self.advance(&l, &chain.reservation_id).await?;
        let h = self
            .store
            .handoff_of_reservation(&chain.reservation_id)
            .await?;
        let repo = self
            .store
            .workspace_of(assignment_id)
            .await?
            .map(|(r, _)| r);
        let mut out = json!({ "assignment_id": assignment_id, "handoff_id": h.map(|h| h.handoff_id), "target_lane_id": lane_id,
                   "target_reservation_id": chain.reservation_id, "target_state": c.map(|c| c.lane_state),
                   "pending": "the target's fresh generation acknowledges the handoff (its harness answers the handoff check, or mosaic lane handoff-ack); only then does responsibility move" });
        if let Some(r) = repo {
            out["workspace"] = json!(format!("repository {r}: the source's workspace is held read-only and checkpointed; the target's is restored from exactly that checkpoint before its harness starts"));
        }
        Ok(out)
    }
}
