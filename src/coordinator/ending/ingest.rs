//! A host's termination receipt ingested and reconciled in the same commit, and the
//! lane's return from RETIRING once it proves cleanup.

use super::*;
use crate::coordinator::states::{GenState, LaneState};
use const_format::concatcp;

impl Store {
    /// Ingests a host termination receipt and reconciles it in the same commit. The deciding
    /// compare-and-swap ends the generation (a generation not yet ended) against the lane state read
    /// under lock, so of two receipts for one generation exactly one decides. A receipt is
    /// an observation: it moves work into recovery or a lane into quarantine, and finalizes
    /// only an outcome an operator already requested.
    pub async fn ingest_termination(
        &self,
        l: &Leader,
        host_id: &str,
        receipt: &serde_json::Value,
    ) -> Result<(Reconciliation, Receipt), AuthorityError> {
        const OP: &str = "ingest-termination";
        let s = |k: &str| {
            receipt
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        let (key, lane_id, inc) = (s("idempotency_key"), s("lane_id"), s("lane_incarnation_id"));
        let generation = receipt
            .get("generation")
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        let verified = receipt
            .pointer("/cleanup/verified_empty")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        if key.is_empty() || lane_id.is_empty() || inc.is_empty() || generation < 1 {
            return Err(reject(
                OP,
                Category::BadInput,
                "receipt needs idempotency_key, lane_id, lane_incarnation_id and generation",
            ));
        }
        let body_text = receipt.to_string();
        let body_digest = format!(
            "sha256:{}",
            crate::util::sha256_hex(
                "mosaic/termination-receipt-body/v1",
                &[body_text.as_bytes()]
            )
        );
        // Keyed by content too: the very same observation replays; a different observation
        // under the same key is a conflict to reconcile, not a mere refusal.
        let step = Step::new(
            OP,
            l,
            format!("ingest/{key}/{body_digest}"),
            request_digest(OP, &[&body_digest, host_id]),
        )
        .about(None, Some(&inc));
        let host = host_id.to_string();
        // What the host's broker observed of this generation's effects and had not seen
        // recorded yet: settled with the receipt (an entry not of the expected shape
        // counts as unobserved).
        let observed: Vec<crate::coordinator::effects::Observed> = receipt
            .get("effects")
            .and_then(|e| e.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(crate::coordinator::effects::Observed::from_receipt_entry)
                    .collect()
            })
            .unwrap_or_default();
        let r = self
            .transition(
                &step,
                body!([key, lane_id, inc, body_text, body_digest, host, observed] |f| {
                    let lane = f.read_opt(
                        "SELECT li.lane_id, li.state, li.retired_at IS NOT NULL AS retired, ln.host_id FROM lane_incarnations li JOIN lanes ln USING (lane_id) \
                         WHERE li.lane_incarnation_id = $1 FOR UPDATE OF li",
                        &[&inc],
                    ).await?;
                    let Some(lane) = lane else {
                        return Err(reject(OP, Category::NotFound, format!("unknown lane incarnation {inc}")));
                    };
                    let lane_of: String = lane.col("lane_id")?;
                    if lane.col::<String>("host_id")? != host {
                        return Err(reject(OP, Category::NotOwner, format!("lane {lane_of} belongs to another host")));
                    }
                    if lane_of != lane_id {
                        return Err(reject(OP, Category::Mismatch, "lane id does not match the incarnation"));
                    }
                    let state: LaneState = lane.col("state")?;
                    let retired: bool = lane.col("retired")?;
                    let g = f.read_opt(
                        "SELECT g.state, g.end_receipt, r.reservation_id, r.assignment_id, r.assignment_attempt_id, r.released_at IS NULL AS reservation_open, \
                                a.lifecycle, a.requested_outcome, a.requested_evidence_digest, a.responsibility_owner, a.execution_owner, \
                                a.lane_incarnation_id = r.lane_incarnation_id AS current \
                         FROM generations g JOIN reservations r USING (reservation_id) JOIN assignments a ON a.assignment_id = r.assignment_id \
                         WHERE g.lane_incarnation_id = $1 AND g.generation = $2 FOR UPDATE OF g, a",
                        &[&inc, &generation],
                    ).await?;
                    let Some(g) = g else {
                        // A generation this coordinator never staged: a contradiction.
                        let reason = format!("receipt for generation {generation}, which this coordinator never staged");
                        return quarantine_for_receipt(f, &inc, retired, state, reason).await;
                    };
                    let (gstate, end_receipt): (GenState, Option<String>) = (g.col("state")?, g.col("end_receipt")?);
                    let (reservation, assignment, attempt): (String, String, String) =
                        (g.col("reservation_id")?, g.col("assignment_id")?, g.col("assignment_attempt_id")?);
                    let res_open: bool = g.col("reservation_open")?;
                    let (lifecycle, requested, supplied): (Lifecycle, Option<String>, Option<String>) =
                        (g.col("lifecycle")?, g.col("requested_outcome")?, g.col("requested_evidence_digest")?);
                    let (resp, exec): (String, Option<String>) = (g.col("responsibility_owner")?, g.col("execution_owner")?);
                    // Whether this generation's chain is the work's current one (after a
                    // handoff the source's is not: its end must not decide the work's outcome).
                    let current: bool = g.col("current")?;
                    if gstate == GenState::Ended {
                        if end_receipt.is_some() {
                            let reason = format!("a second, different end observed for generation {generation}");
                            return quarantine_for_receipt(f, &inc, retired, state, reason).await;
                        }
                        // Ended when its incarnation was retired: the receipt is the evidence.
                        let d = f.cas(
                            concatcp!("UPDATE generations SET end_receipt = $3 WHERE lane_incarnation_id = $1 AND generation = $2 AND state = ", GenState::Ended.sql(), " AND end_receipt IS NULL RETURNING 1"),
                            &[&inc, &generation, &key],
                        ).await?;
                        let Ok(d) = d else {
                            return Err(reject(OP, Category::Conflict, "the generation's end was recorded concurrently"));
                        };
                        let settled = crate::coordinator::effects::settle_at_end(&d, &inc, generation, &observed).await?;
                        let rec = Reconciliation::Evidence { lane_state: state.to_string() };
                        insert_receipt(&d, &key, &lane_id, &inc, generation, &body_text, &body_digest, verified, d.epoch(), &rec,
                            (&reservation, &assignment, &attempt, &resp, exec.as_deref())).await?;
                        return d.decide(json!({ "termination_receipt": key, "generation": generation, "reconciliation": rec, "effects": settled }));
                    }
                    // The deciding CAS: this generation ends now, against the lane state read
                    // under lock.
                    let d = f.cas(
                        concatcp!("UPDATE generations g SET state = ", GenState::Ended.sql(), ", ended_at = clock_timestamp(), end_receipt = $3 \
                         FROM lane_incarnations li WHERE g.lane_incarnation_id = $1 AND g.generation = $2 AND g.state <> ", GenState::Ended.sql(), " \
                           AND li.lane_incarnation_id = g.lane_incarnation_id AND li.state = $4 AND (li.retired_at IS NOT NULL) = $5 \
                         RETURNING g.stop_requested_at IS NOT NULL"),
                        &[&inc, &generation, &key, &state, &retired],
                    ).await?;
                    let Ok(d) = d else {
                        return Err(reject(OP, Category::Conflict, "the generation or its lane changed concurrently"));
                    };
                    let epoch = d.epoch();
                    // Its effects are settled first: a final outcome below depends on them.
                    let settled = crate::coordinator::effects::settle_at_end(&d, &inc, generation, &observed).await?;
                    let is_chain_gen = res_open;
                    let rec = if retired {
                        Reconciliation::Evidence { lane_state: "RETIRED".into() }
                    } else if state == LaneState::Draining {
                        // The requested end (an operator's, or a recovery drain): RETIRING, and
                        // the outcome final if one was requested.
                        d.exec_one(concatcp!("UPDATE lane_incarnations SET state = ", LaneState::Retiring.sql(), " WHERE lane_incarnation_id = $1"), &[&inc]).await?;
                        d.revoke_leases(&reservation).await?;
                        d.release_reservation(&reservation).await?;
                        let outcome = if current {
                            finalize(&d, &assignment, lifecycle, requested.as_deref(), supplied.as_deref(), (&body_digest, &body_text), verified).await?
                        } else {
                            None
                        };
                        Reconciliation::Retiring { outcome }
                    } else if is_chain_gen && (state == LaneState::Running || state.is_preactivation()) {
                        // Died while it had (or was about to have) authority: recovery.
                        let to = if verified { LaneState::IdleClean } else { LaneState::Quarantined };
                        d.exec_one(
                            concatcp!("UPDATE lane_incarnations SET state = $2, quarantine_reason = CASE WHEN $2 = ", LaneState::Quarantined.sql(), " THEN 'generation ' || $3 || ' died and its cleanup was not verified' END \
                             WHERE lane_incarnation_id = $1"),
                            &[&inc, &to, &generation.to_string()],
                        ).await?;
                        let open_target: bool = d.query_one(crate::coordinator::handoff::IS_OPEN_TARGET, &[&reservation]).await?.col("open")?;
                        d.revoke_leases(&reservation).await?;
                        d.release_reservation(&reservation).await?;
                        // A handoff target dying before its ACK leaves the work with its source
                        // (the release handed it back); otherwise the work, if this is its
                        // current chain, goes to recovery.
                        if !open_target {
                            d.to_recovery(
                                RecoveryOf::AssignmentOnLane { assignment: &assignment, lane_incarnation: &inc },
                                &format!("resume on a fresh generation: generation {generation} ended unexpectedly"),
                            ).await?;
                        }
                        Reconciliation::Recovery { lane_state: to.to_string() }
                    } else if state == LaneState::Quarantined {
                        // Evidence the quarantined lane's generation is gone; an outcome the
                        // operator asked for is final now (if this was the work's current chain).
                        if current {
                            finalize(&d, &assignment, lifecycle, requested.as_deref(), supplied.as_deref(), (&body_digest, &body_text), verified).await?;
                        }
                        Reconciliation::Evidence { lane_state: state.to_string() }
                    } else {
                        let reason = format!("receipt for generation {generation} conflicts with lane state {state}");
                        quarantine_in(&d, &inc, &reason, false).await?;
                        Reconciliation::Quarantined { reason }
                    };
                    // Work in a repository whose generation ran, ended cleanly, and left no
                    // checkpoint the coordinator can record: its lane waits for the operator
                    // (who may look at the workspace, then release it and go on without).
                    let rec = match super::finalize::missing_checkpoint(&d, &assignment, generation, &body_text).await? {
                        Some(reason) if verified && !retired && !matches!(rec, Reconciliation::Quarantined { .. }) => {
                            quarantine_in(&d, &inc, &reason, false).await?;
                            Reconciliation::Quarantined { reason }
                        }
                        _ => rec,
                    };
                    insert_receipt(&d, &key, &lane_id, &inc, generation, &body_text, &body_digest, verified, epoch, &rec,
                        (&reservation, &assignment, &attempt, &resp, exec.as_deref())).await?;
                    d.decide(json!({ "termination_receipt": key, "generation": generation, "assignment_id": assignment,
                        "verified_empty": verified, "reconciliation": rec, "effects": settled }))
                }),
            )
            .await?;
        let rec: Reconciliation = serde_json::from_value(r.body["reconciliation"].clone())
            .map_err(|e| AuthorityError::Invariant {
                op: "ingest-termination",
                detail: format!("its receipt body does not decode: {e}"),
            })?;
        Ok((rec, r))
    }

    /// RETIRING → IDLE_CLEAN once the ended generation's receipt says cleanup was verified;
    /// QUARANTINED when it does not.
    pub async fn finish(
        &self,
        l: &Leader,
        lane_incarnation_id: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "finish";
        let c = self.pool.get().await?;
        let g: Option<i64> = c
            .query_opt(
                concatcp!("SELECT max(generation) AS generation FROM generations WHERE lane_incarnation_id = $1 AND state = ", GenState::Ended.sql()),
                &[&lane_incarnation_id],
            )
            .await?
            .map(|r| r.col::<Option<i64>>("generation"))
            .transpose()?
            .flatten();
        drop(c);
        let generation = g.unwrap_or(0);
        let step = Step::new(
            OP,
            l,
            format!("finish/{lane_incarnation_id}/{generation}"),
            request_digest(OP, &[lane_incarnation_id, &generation.to_string()]),
        )
        .about(None, Some(lane_incarnation_id));
        let inc = lane_incarnation_id.to_string();
        self.transition(
            &step,
            body!([inc] |f| {
                let d = f.cas(
                    concatcp!("UPDATE lane_incarnations li SET state = CASE WHEN t.verified_empty THEN ", LaneState::IdleClean.sql(), " ELSE ", LaneState::Quarantined.sql(), " END, \
                            quarantine_reason = CASE WHEN t.verified_empty THEN NULL ELSE 'cleanup of generation ' || t.generation || ' was not verified' END \
                     FROM termination_receipts t \
                     WHERE li.lane_incarnation_id = $1 AND li.state = ", LaneState::Retiring.sql(), " AND li.retired_at IS NULL \
                       AND t.lane_incarnation_id = li.lane_incarnation_id AND t.generation = $2 \
                       AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> ", GenState::Ended.sql(), ") \
                     RETURNING li.state, t.idempotency_key"),
                    &[&inc, &generation],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "the lane is not RETIRING with its generation's receipt ingested").await?),
                };
                let to: LaneState = d.row().col("state")?;
                let key: String = d.row().col("idempotency_key")?;
                d.decide(json!({ "lane_incarnation_id": inc, "generation": generation, "to": to, "termination_receipt": key }))
            }),
        )
        .await
    }
}
