//! `mosaic assign` without `--lane`, and `mosaic roster`: the operator's side of placement
//! (the policy is `coordinator::placement`, its records `coordinator::roster`).

use super::*;
use crate::coordinator::placement::Decision;

impl Service {
    /// Chooses the lane of an assignment that names none (and sets it on `a`), by the
    /// placement policy over the current roster and lane states. A request repeated with the
    /// same key gets the lane its first placement chose, whatever the lanes are now.
    pub(super) async fn place(&self, a: &mut AssignRequest) -> Result<Option<Decision>, OpError> {
        let ask = match (a.place.take(), a.lane_id.is_empty()) {
            (None, false) => return Ok(None),
            (Some(_), false) => {
                return Err(OpError::new(
                    Category::BadInput,
                    "name a lane or ask for placement (labels, role), not both",
                ))
            }
            (None, true) => return Err(OpError::new(
                Category::BadInput,
                "name a lane (--lane), or leave it out to have one placed by runtime and labels",
            )),
            (Some(ask), true) => ask,
        };
        ask.validate()
            .map_err(|e| OpError::new(Category::BadInput, e))?;
        let key = format!("reserve/{}", a.request_id);
        let context = self
            .store
            .placement_context(&key, &a.runtime, &ask, |h| self.hosts.is_connected(h))
            .await?;
        let decision = match context {
            Ok(kept) => kept.decision,
            Err(inputs) => Decision::decide(inputs).map_err(|why| {
                OpError::new(
                    Category::NoEligibleLane,
                    format!(
                        "no lane can take {} by {}: {why}",
                        a.runtime,
                        crate::coordinator::placement::POLICY
                    ),
                )
            })?,
        };
        tracing::info!(lane_id = %decision.lane_id, policy = %decision.policy,
            inputs_digest = %decision.inputs_digest, roster_version = decision.inputs.roster_version,
            "placement chose a lane");
        a.lane_id = decision.lane_id.clone();
        Ok(Some(decision))
    }

    /// `mosaic roster publish`.
    pub(super) async fn roster_publish(
        &self,
        roster: &crate::coordinator::placement::Roster,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let r = self.store.publish_roster(&l, roster).await;
        let r = self.settled(&l, r).await?;
        Ok(json!(r))
    }

    /// `mosaic roster show`: the current version, or, with a reservation, how it was placed.
    pub(super) async fn roster_show(
        &self,
        reservation: Option<&str>,
    ) -> Result<serde_json::Value, OpError> {
        match reservation {
            None => Ok(json!(self.store.roster().await?)),
            Some(r) => match self.store.placement(r).await? {
                Some(p) => {
                    // The audit an operator would do by hand: the recorded inputs, run
                    // through this build's policy, choose the recorded lane.
                    let d = &p.decision;
                    let agrees = d.policy == crate::coordinator::placement::POLICY
                        && Decision::decide(d.inputs.clone()).is_ok_and(|again| {
                            again.lane_id == d.lane_id
                                && again.inputs_digest == d.inputs_digest
                                && again.policy_digest == d.policy_digest
                        });
                    let mut v = json!(p);
                    v["recomputed"] = json!({ "agrees": agrees });
                    Ok(v)
                }
                None => Err(OpError::new(
                    Category::NotFound,
                    format!("reservation {r} was not placed by policy (or does not exist)"),
                )),
            },
        }
    }
}
