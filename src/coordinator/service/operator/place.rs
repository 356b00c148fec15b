//! `mosaic assign` without `--lane`, and `mosaic roster`: the operator's side of placement
//! (the policy is `coordinator::placement`, its records `coordinator::roster`).

use super::*;
use crate::coordinator::placement::{Decision, ElasticChoice, ElasticHost, ElasticRefusal};

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
        let no_lane = |why: String| {
            OpError::new(
                Category::NoEligibleLane,
                format!(
                    "no lane can take {} by {}: {why}",
                    a.runtime,
                    crate::coordinator::placement::POLICY
                ),
            )
        };
        let decision = match context {
            Ok(kept) => kept.decision,
            Err(inputs) => match (Decision::decide(inputs.clone()), &ask.elastic) {
                (Ok(d), _) => d,
                (Err(why), None) => return Err(no_lane(why)),
                // `--elastic`: a lane leased for it, then the policy decides again.
                (Err(why), Some(e)) => {
                    let choice = self
                        .lease_for_placement(a, &ask, e, &inputs)
                        .await
                        .map_err(|lease| match lease.category {
                            Category::NoEligibleLane => {
                                no_lane(format!("{why}; and no elastic lane: {}", lease.message))
                            }
                            _ => lease,
                        })?;
                    let again = self
                        .store
                        .placement_inputs(&a.runtime, &ask, |h| self.hosts.is_connected(h))
                        .await?;
                    let mut d = Decision::decide(again).map_err(no_lane)?;
                    // The lane leased for this request is the one it takes: another that
                    // became eligible meanwhile would leave the lease idle (and two
                    // requests racing for it would both have leased).
                    if d.lane_id != choice.lane_id
                        || d.inputs.roster_version != inputs.roster_version
                    {
                        return Err(OpError::new(
                            Category::Conflict,
                            format!(
                                "the lanes changed while lane {} was leased for this request; ask again with the same --request-id (its lease is reused)",
                                choice.lane_id
                            ),
                        ));
                    }
                    d.elastic = Some(choice);
                    d
                }
            },
        };
        tracing::info!(lane_id = %decision.lane_id, policy = %decision.policy,
            inputs_digest = %decision.inputs_digest, roster_version = decision.inputs.roster_version,
            "placement chose a lane");
        a.lane_id = decision.lane_id.clone();
        Ok(Some(decision))
    }

    /// `--elastic` with no eligible lane: a lease on the first host the roster declares —
    /// by fewest busy lanes, then host id — that is connected and whose lease the
    /// coordinator admits (its capacity, its runtimes); answered once the lane is made,
    /// with how the host was chosen (recorded with the placement).
    async fn lease_for_placement(
        &self,
        a: &AssignRequest,
        ask: &crate::coordinator::placement::PlacementAsk,
        e: &crate::coordinator::placement::ElasticAsk,
        inputs: &crate::coordinator::placement::Inputs,
    ) -> Result<ElasticChoice, OpError> {
        let roster = self
            .store
            .roster()
            .await?
            .ok_or_else(|| OpError::new(Category::NotFound, "no roster is published"))?;
        // The roster the inputs were taken from (a newer one is another decision).
        if roster.version != inputs.roster_version {
            return Err(OpError::new(
                Category::Conflict,
                "the roster changed while placing; ask again",
            ));
        }
        let hosts: Vec<ElasticHost> = roster
            .roster
            .hosts
            .iter()
            .map(|h| ElasticHost {
                host_id: h.host_id.clone(),
                busy: ElasticChoice::busy_in(inputs, &h.host_id),
                connected: self.hosts.is_connected(&h.host_id),
            })
            .collect();
        let first_inputs_digest = inputs.digest().map_err(|e| {
            OpError::new(
                Category::Internal,
                format!("placement inputs do not encode: {e}"),
            )
        })?;
        let mut refused = Vec::new();
        let mut why = Vec::new();
        for host in ElasticChoice::order(&hosts) {
            let lease = crate::coordinator::leases::LeaseAsk {
                host_id: host.clone(),
                runtime: a.runtime.clone(),
                labels: ask.labels.clone(),
                role: ask.role.clone(),
                ttl_ms: e.ttl_ms,
                max_lifetime_ms: e.max_lifetime_ms,
            };
            match self
                // One lease per request, whichever host: a repeated request reuses the
                // lease its first attempt made (on another host it is refused).
                .lease_lane(&lease, &format!("elastic/{}", a.request_id))
                .await
            {
                Ok(v) if v["state"] == crate::coordinator::states::LeaseState::Active.as_str() => {
                    tracing::info!(host, lease_id = %v["lease_id"], lane_id = %v["lane_id"],
                        "an elastic lane leased for a placement");
                    let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
                    return Ok(ElasticChoice {
                        first_inputs: inputs.clone(),
                        first_inputs_digest,
                        hosts,
                        refused,
                        leased_host: host,
                        lease_id: field("lease_id"),
                        lane_id: field("lane_id"),
                    });
                }
                // A lease was made and its lane is not (yet): no second lease on another
                // host for the same request — this one is the answer (it is quarantined
                // if its host never makes the lane).
                Ok(v) => {
                    return Err(OpError::new(
                        Category::NoEligibleLane,
                        format!(
                            "lease {} on {host}: its lane was not made in time ({}); see mosaic lane leases",
                            v["lease_id"], v["state"]
                        ),
                    ))
                }
                // Only the lease CAS's own refusals pass to the next host: any other
                // error (leadership, the database, an ambiguous commit) ends the choice.
                Err(no)
                    if !matches!(
                        no.category,
                        Category::NoEligibleLane
                            | Category::UnknownRuntime
                            | Category::HostUnreachable
                    ) =>
                {
                    return Err(no)
                }
                Err(no) => {
                    why.push(format!("{host}: {}", no.message));
                    refused.push(ElasticRefusal {
                        host_id: host,
                        why: no.message,
                    });
                }
            }
        }
        Err(OpError::new(
            Category::NoEligibleLane,
            if why.is_empty() {
                "no host the roster declares is connected".to_string()
            } else {
                why.join("; ")
            },
        ))
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
                    // An elastic choice is checked against the roster version it was taken
                    // under: every host that version declares was weighed.
                    let declared = match &d.elastic {
                        Some(e) => self
                            .store
                            .roster_version(d.inputs.roster_version)
                            .await?
                            .is_some_and(|v| e.weighed_all_of(&v.roster)),
                        None => true,
                    };
                    let agrees = declared
                        && crate::coordinator::placement::policy_digest_of(&d.policy)
                            .is_some_and(|known| known == d.policy_digest)
                        && d.inputs.policy == d.policy
                        && crate::coordinator::placement::select(&d.inputs).is_ok_and(|again| {
                            again.lane_id == d.lane_id
                                && again.lane_incarnation_id == d.lane_incarnation_id
                                && d.inputs.digest().is_ok_and(|x| x == d.inputs_digest)
                        })
                        && d.elastic.as_ref().is_none_or(|e| e.agrees() && e.led_to(d));
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
