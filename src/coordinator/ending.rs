//! How chains end: an operator's stop, cancel or completion; expiry and abandonment before
//! activation; lease renewal and expiry; the host's termination receipt; and the return of
//! the lane to IDLE_CLEAN.
//!
//! The order is fixed by spec §6.1 and §10: a decision to end is recorded first and revokes
//! every lease in the same commit (RUNNING → DRAINING, nothing is final yet); the host is
//! told to stop the generation (a durable stop intent on the generation row, sent on every
//! session until the host's receipt arrives); the receipt ends the generation and, when an
//! outcome was requested, finalizes it with the receipt as final evidence (DRAINING →
//! RETIRING); `finish` returns the lane to IDLE_CLEAN only if the receipt says cleanup was
//! verified, and quarantines it otherwise.
//!
//! **Never:** finalizes an outcome before the host's receipt; calls an assignment COMPLETED
//! without evidence under its completion policy; turns an unrequested end into anything
//! but recovery; reconciles a receipt from a host that does not own the lane.

use serde::Serialize;
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::followups::RecoveryOf;
use super::leader::Leader;
use super::model::{Chain, Outcome, PREACTIVATION};
use super::rows::RowExt;
use super::states::{GenState, LaneState, Lifecycle, WorkStatus, NONTERMINAL};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

/// How a termination receipt was reconciled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Reconciliation {
    /// The generation's requested stop: the lane is RETIRING (and the outcome final, if one
    /// was requested).
    Retiring { outcome: Option<String> },
    /// A generation that ended without being asked to: the assignment goes to recovery (no
    /// execution owner, no leases); the lane is clean again only if cleanup was verified.
    Recovery { lane_state: String },
    /// Evidence that a generation of a quarantined or retired lane is gone.
    Evidence { lane_state: String },
    /// The observation contradicts the coordinator's state: the lane is quarantined.
    Quarantined { reason: String },
}

impl Reconciliation {
    fn label(&self) -> &'static str {
        match self {
            Self::Retiring { .. } => "retiring",
            Self::Recovery { .. } => "recovery",
            Self::Evidence { .. } => "evidence",
            Self::Quarantined { .. } => "conflict-quarantined",
        }
    }
}

/// Why a chain ended before activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// Its reservation deadline passed (database time).
    Expired,
    /// The host lost its half of the chain (a supervisor restart before activation).
    Abandoned,
}

impl EndCause {
    fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "reservation expired before activation",
            Self::Abandoned => "the host lost the chain before activation",
        }
    }
}

/// The lane's answer once a stop was requested.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndRequested {
    pub assignment_id: String,
    pub outcome: Outcome,
    /// Whether a generation must still be seen to end before the outcome is final.
    pub awaiting_receipt: bool,
    pub receipt: Receipt,
}

/// Final evidence of an outcome: the termination receipt that proved the end, the evidence
/// the operator supplied, and the outcome itself.
fn final_evidence(outcome: &str, receipt_digest: &str, supplied: Option<&str>) -> String {
    format!(
        "sha256:{}",
        crate::util::sha256_hex(
            "mosaic/final-evidence/v1",
            &[
                outcome.as_bytes(),
                receipt_digest.as_bytes(),
                supplied.unwrap_or("").as_bytes()
            ]
        )
    )
}

impl Store {
    /// A preactivation chain ends (expiry, or a host that lost it): the assignment goes to
    /// recovery, the reservation is released and, if a generation was staged, the lane
    /// drains until the host's receipt proves it ended.
    pub async fn end_chain(
        &self,
        l: &Leader,
        c: &Chain,
        cause: EndCause,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "end-chain";
        let step = Step::new(
            OP,
            l,
            format!("end-chain/{}", c.reservation_id),
            request_digest(OP, &[&c.key(), cause.as_str()]),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let c = c.clone();
        let expired_only = cause == EndCause::Expired;
        let why = cause.as_str();
        self.transition(
            &step,
            body!([c] |f| {
                let d = f.cas(
                    "UPDATE lane_incarnations li SET state = CASE WHEN r.generation IS NULL THEN 'IDLE_CLEAN' ELSE 'DRAINING' END \
                     FROM reservations r, assignments a \
                     WHERE li.lane_incarnation_id = $1 AND r.reservation_id = $2 AND r.lane_incarnation_id = li.lane_incarnation_id \
                       AND r.assignment_id = $3 AND a.assignment_id = r.assignment_id AND r.released_at IS NULL \
                       AND li.state = ANY($4) AND li.retired_at IS NULL AND (NOT $5 OR r.deadline <= clock_timestamp()) \
                     RETURNING li.state, r.generation, a.requested_outcome",
                    &[&c.lane_incarnation_id, &c.reservation_id, &c.assignment_id, &PREACTIVATION, &expired_only],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, if expired_only {
                        "not an open preactivation chain past its deadline (database time; equality is expired)"
                    } else {
                        "not an open preactivation chain"
                    }).await?),
                };
                let to: LaneState = d.row().col("state")?;
                let generation: Option<i64> = d.row().col("generation")?;
                let requested: Option<String> = d.row().col("requested_outcome")?;
                let open_target: bool = d.query_one(super::handoff::IS_OPEN_TARGET, &[&c.reservation_id]).await?.col("open")?;
                d.release_one(&c.reservation_id).await?;
                if let Some(g) = generation {
                    d.request_stop(&c.lane_incarnation_id, Some(g), why).await?;
                }
                // A handoff's target chain that ends before its ACK leaves the work with its
                // source (the release above handed it back, migration 0009); the work of any
                // other chain goes to recovery — if this chain is still the work's current one
                // (a chain orphaned by a withdrawn offer is not).
                if requested.is_none() && !open_target {
                    d.to_recovery(
                        RecoveryOf::AssignmentOnLane { assignment: &c.assignment_id, lane_incarnation: &c.lane_incarnation_id },
                        &format!("resume on a fresh chain: {why}"),
                    ).await?;
                }
                d.decide(json!({ "chain": c, "cause": why, "to": to, "generation_to_stop": generation }))
            }),
        )
        .await
    }

    /// An operator ends an assignment with `outcome` (stop, cancel, complete, fail). The
    /// decision revokes every lease at once; the outcome becomes final only when the host's
    /// termination receipt proves the generation ended (or at once, when no generation of
    /// the assignment is left to end). Repeating the same request returns the same receipt.
    pub async fn request_end(
        &self,
        l: &Leader,
        assignment_id: &str,
        outcome: Outcome,
        evidence_digest: Option<&str>,
    ) -> Result<EndRequested, AuthorityError> {
        const OP: &str = "request-end";
        if let Some(e) = evidence_digest {
            if !crate::protocol::envelope::is_digest(e) {
                return Err(reject(
                    OP,
                    Category::BadInput,
                    "evidence must be a sha256 digest",
                ));
            }
        }
        if outcome == Outcome::Completed && evidence_digest.is_none() {
            return Err(reject(
                OP,
                Category::BadInput,
                "COMPLETED needs evidence under the completion policy (operator-evidence/v1: --evidence FILE)",
            ));
        }
        let step = Step::new(
            OP,
            l,
            format!("request-end/{assignment_id}"),
            request_digest(
                OP,
                &[
                    assignment_id,
                    outcome.as_str(),
                    evidence_digest.unwrap_or(""),
                ],
            ),
        )
        .about(Some(assignment_id), None);
        let (asg, evidence) = (assignment_id.to_string(), evidence_digest.map(String::from));
        let o = outcome.as_str();
        let r = self
            .transition(
                &step,
                body!([asg, evidence] |f| {
                    let row = f.read_opt(
                        "SELECT a.lifecycle, a.requested_outcome, li.state AS lane_state, r.reservation_id, r.generation, \
                                li.lane_incarnation_id, \
                                EXISTS (SELECT 1 FROM reservations r2 JOIN generations g2 ON g2.lane_incarnation_id = r2.lane_incarnation_id \
                                        AND g2.generation = r2.generation WHERE r2.assignment_id = a.assignment_id AND g2.state <> 'ENDED') AS unended, \
                                (SELECT t.verified_empty FROM termination_receipts t WHERE t.assignment_id = a.assignment_id ORDER BY t.ingested_at DESC LIMIT 1) AS last_verified, \
                                (SELECT t.body_digest FROM termination_receipts t WHERE t.assignment_id = a.assignment_id ORDER BY t.ingested_at DESC LIMIT 1) AS last_receipt, \
                                EXISTS (SELECT 1 FROM transition_receipts x WHERE x.transition = 'activate' AND x.assignment_id = a.assignment_id) AS ever_ran, \
                                a.work_status \
                         FROM assignments a JOIN lane_incarnations li ON li.lane_incarnation_id = a.lane_incarnation_id \
                         LEFT JOIN reservations r ON r.assignment_id = a.assignment_id AND r.released_at IS NULL AND r.lane_incarnation_id = a.lane_incarnation_id \
                         WHERE a.assignment_id = $1 FOR UPDATE OF a, li",
                        &[&asg],
                    ).await?;
                    let Some(row) = row else {
                        return Err(reject(OP, Category::NotFound, format!("no assignment {asg}")));
                    };
                    let lifecycle: Lifecycle = row.col("lifecycle")?;
                    let lane_state: LaneState = row.col("lane_state")?;
                    let reservation: Option<String> = row.col("reservation_id")?;
                    let generation: Option<i64> = row.col("generation")?;
                    let inc: String = row.col("lane_incarnation_id")?;
                    let unended: bool = row.col("unended")?;
                    let last_verified: Option<bool> = row.col("last_verified")?;
                    let last_receipt: Option<String> = row.col("last_receipt")?;
                    let ever_ran: bool = row.col("ever_ran")?;
                    if row.col::<WorkStatus>("work_status")? == WorkStatus::Handoff {
                        return Err(reject(OP, Category::WrongState, "a handoff of this assignment is pending: wait for its ACK or its expiry, then stop"));
                    }
                    if outcome == Outcome::Completed && !ever_ran {
                        return Err(reject(OP, Category::WrongState, "COMPLETED needs work that ran: this assignment was never activated"));
                    }
                    if row.col::<Option<String>>("requested_outcome")?.is_some() {
                        return Err(reject(OP, Category::WrongState, "an end was already requested for this assignment with other parameters"));
                    }
                    match lifecycle {
                        Lifecycle::Active => {
                            let Some(res) = reservation else {
                                return Err(reject(OP, Category::Internal, "an active assignment without an open reservation"));
                            };
                            let running = lane_state == LaneState::Running;
                            if !running && !lane_state.is_preactivation() {
                                return Err(reject(OP, Category::WrongState, format!("the lane is {lane_state}")));
                            }
                            if !running && outcome == Outcome::Completed {
                                return Err(reject(OP, Category::WrongState, "COMPLETED needs a RUNNING generation to end, not a chain before activation"));
                            }
                            let d = f.cas(
                                "UPDATE lane_incarnations li SET state = CASE WHEN r.generation IS NULL THEN 'IDLE_CLEAN' ELSE 'DRAINING' END \
                                 FROM reservations r WHERE li.lane_incarnation_id = $1 AND li.state = $2 AND li.retired_at IS NULL \
                                   AND r.reservation_id = $3 AND r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL \
                                 RETURNING li.state",
                                &[&inc, &lane_state, &res],
                            ).await?;
                            let Ok(d) = d else {
                                return Err(reject(OP, Category::WrongState, "the lane changed under the request; retry"));
                            };
                            let to: LaneState = d.row().col("state")?;
                            d.revoke_leases(&res).await?;
                            match generation {
                                Some(g) => {
                                    d.request_stop(&inc, Some(g), &format!("operator: {}", o.to_lowercase())).await?;
                                    d.exec_one(
                                        "UPDATE assignments SET requested_outcome = $2, requested_evidence_digest = $3, execution_owner = NULL, \
                                                next_action = 'wait for the host to prove generation ' || $4 || ' ended, then finalize ' || $2 \
                                         WHERE assignment_id = $1",
                                        &[&asg, &o, &evidence, &g.to_string()],
                                    ).await?;
                                }
                                None => {
                                    // Nothing ran under this chain: final at once.
                                    d.release_one(&res).await?;
                                    let fe = final_evidence(o, "no-generation", evidence.as_deref());
                                    d.exec_one(
                                        "UPDATE assignments SET lifecycle = $2, requested_outcome = $2, requested_evidence_digest = $3, execution_owner = NULL, \
                                                pending_target = NULL, final_evidence_digest = $4, finalized_at = clock_timestamp(), next_action = 'none: ' || $2 \
                                         WHERE assignment_id = $1",
                                        &[&asg, &o, &evidence, &fe],
                                    ).await?;
                                }
                            }
                            d.decide(json!({ "assignment_id": asg, "outcome": o, "lane_incarnation_id": inc, "from": lane_state, "to": to,
                                "generation": generation, "awaiting_receipt": generation.is_some(), "leases_revoked": true }))
                        }
                        Lifecycle::Recovery => {
                            if outcome == Outcome::Completed && !unended && last_verified != Some(true) {
                                return Err(reject(OP, Category::WrongState, "COMPLETED needs the verified end of the assignment's last generation"));
                            }
                            let d = f.cas(
                                "UPDATE assignments SET requested_outcome = $2, requested_evidence_digest = $3 \
                                 WHERE assignment_id = $1 AND lifecycle = 'RECOVERY' AND requested_outcome IS NULL RETURNING assignment_id",
                                &[&asg, &o, &evidence],
                            ).await?;
                            let Ok(d) = d else {
                                return Err(reject(OP, Category::WrongState, "the assignment changed under the request; retry"));
                            };
                            if !unended {
                                let fe = final_evidence(o, last_receipt.as_deref().unwrap_or("no-generation"), evidence.as_deref());
                                d.exec_one(
                                    "UPDATE assignments SET lifecycle = $2, final_evidence_digest = $3, finalized_at = clock_timestamp(), execution_owner = NULL, \
                                            pending_target = NULL, next_action = 'none: ' || $2 WHERE assignment_id = $1",
                                    &[&asg, &o, &fe],
                                ).await?;
                            }
                            d.decide(json!({ "assignment_id": asg, "outcome": o, "from": Lifecycle::Recovery, "awaiting_receipt": unended }))
                        }
                        other => Err(reject(OP, Category::WrongState, format!("assignment is already {other}"))),
                    }
                }),
            )
            .await?;
        Ok(EndRequested {
            assignment_id: assignment_id.to_string(),
            outcome,
            awaiting_receipt: r.body["awaiting_receipt"].as_bool().unwrap_or(false),
            receipt: r,
        })
    }

    /// Ingests a host termination receipt and reconciles it in the same commit. The deciding
    /// compare-and-swap ends the generation (`state <> 'ENDED'`) against the lane state read
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
        let r = self
            .transition(
                &step,
                body!([key, lane_id, inc, body_text, body_digest, host] |f| {
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
                            "UPDATE generations SET end_receipt = $3 WHERE lane_incarnation_id = $1 AND generation = $2 AND state = 'ENDED' AND end_receipt IS NULL RETURNING 1",
                            &[&inc, &generation, &key],
                        ).await?;
                        let Ok(d) = d else {
                            return Err(reject(OP, Category::Conflict, "the generation's end was recorded concurrently"));
                        };
                        let rec = Reconciliation::Evidence { lane_state: state.to_string() };
                        insert_receipt(&d, &key, &lane_id, &inc, generation, &body_text, &body_digest, verified, d.epoch(), &rec,
                            (&reservation, &assignment, &attempt, &resp, exec.as_deref())).await?;
                        return d.decide(json!({ "termination_receipt": key, "generation": generation, "reconciliation": rec }));
                    }
                    // The deciding CAS: this generation ends now, against the lane state read
                    // under lock.
                    let d = f.cas(
                        "UPDATE generations g SET state = 'ENDED', ended_at = clock_timestamp(), end_receipt = $3 \
                         FROM lane_incarnations li WHERE g.lane_incarnation_id = $1 AND g.generation = $2 AND g.state <> 'ENDED' \
                           AND li.lane_incarnation_id = g.lane_incarnation_id AND li.state = $4 AND (li.retired_at IS NOT NULL) = $5 \
                         RETURNING g.stop_requested_at IS NOT NULL",
                        &[&inc, &generation, &key, &state, &retired],
                    ).await?;
                    let Ok(d) = d else {
                        return Err(reject(OP, Category::Conflict, "the generation or its lane changed concurrently"));
                    };
                    let epoch = d.epoch();
                    let is_chain_gen = res_open;
                    let rec = if retired {
                        Reconciliation::Evidence { lane_state: "RETIRED".into() }
                    } else if state == LaneState::Draining {
                        // The requested end (an operator's, or a recovery drain): RETIRING, and
                        // the outcome final if one was requested.
                        d.exec_one("UPDATE lane_incarnations SET state = 'RETIRING' WHERE lane_incarnation_id = $1", &[&inc]).await?;
                        d.revoke_leases(&reservation).await?;
                        d.release_reservation(&reservation).await?;
                        let outcome = if current {
                            finalize(&d, &assignment, lifecycle, requested.as_deref(), supplied.as_deref(), &body_digest, verified).await?
                        } else {
                            None
                        };
                        Reconciliation::Retiring { outcome }
                    } else if is_chain_gen && (state == LaneState::Running || state.is_preactivation()) {
                        // Died while it had (or was about to have) authority: recovery.
                        let to = if verified { LaneState::IdleClean } else { LaneState::Quarantined };
                        d.exec_one(
                            "UPDATE lane_incarnations SET state = $2, quarantine_reason = CASE WHEN $2 = 'QUARANTINED' THEN 'generation ' || $3 || ' died and its cleanup was not verified' END \
                             WHERE lane_incarnation_id = $1",
                            &[&inc, &to, &generation.to_string()],
                        ).await?;
                        let open_target: bool = d.query_one(super::handoff::IS_OPEN_TARGET, &[&reservation]).await?.col("open")?;
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
                            finalize(&d, &assignment, lifecycle, requested.as_deref(), supplied.as_deref(), &body_digest, verified).await?;
                        }
                        Reconciliation::Evidence { lane_state: state.to_string() }
                    } else {
                        let reason = format!("receipt for generation {generation} conflicts with lane state {state}");
                        quarantine_in(&d, &inc, &reason, false).await?;
                        Reconciliation::Quarantined { reason }
                    };
                    insert_receipt(&d, &key, &lane_id, &inc, generation, &body_text, &body_digest, verified, epoch, &rec,
                        (&reservation, &assignment, &attempt, &resp, exec.as_deref())).await?;
                    d.decide(json!({ "termination_receipt": key, "generation": generation, "assignment_id": assignment,
                        "verified_empty": verified, "reconciliation": rec }))
                }),
            )
            .await?;
        let rec: Reconciliation = serde_json::from_value(r.body["reconciliation"].clone())
            .map_err(|e| AuthorityError::Internal(format!("ingest receipt: {e}")))?;
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
                "SELECT max(generation) AS generation FROM generations WHERE lane_incarnation_id = $1 AND state = 'ENDED'",
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
                    "UPDATE lane_incarnations li SET state = CASE WHEN t.verified_empty THEN 'IDLE_CLEAN' ELSE 'QUARANTINED' END, \
                            quarantine_reason = CASE WHEN t.verified_empty THEN NULL ELSE 'cleanup of generation ' || t.generation || ' was not verified' END \
                     FROM termination_receipts t \
                     WHERE li.lane_incarnation_id = $1 AND li.state = 'RETIRING' AND li.retired_at IS NULL \
                       AND t.lane_incarnation_id = li.lane_incarnation_id AND t.generation = $2 \
                       AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> 'ENDED') \
                     RETURNING li.state, t.idempotency_key",
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

    /// Extends the effect leases of a RUNNING chain (its host is connected). Each renewal
    /// bumps the lease epoch; a lease already expired is not revived.
    pub async fn renew_leases(
        &self,
        l: &Leader,
        c: &Chain,
        lease_ttl_ms: i64,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "renew-leases";
        let conn = self.pool.get().await?;
        let epoch: i64 = conn
            .query_opt(
                "SELECT max(lease_epoch) AS lease_epoch FROM leases WHERE reservation_id = $1",
                &[&c.reservation_id],
            )
            .await?
            .map(|r| r.col::<Option<i64>>("lease_epoch"))
            .transpose()?
            .flatten()
            .unwrap_or(0);
        drop(conn);
        let step = Step::new(
            OP,
            l,
            format!("renew-leases/{}/{epoch}", c.reservation_id),
            request_digest(
                OP,
                &[&c.key(), &epoch.to_string(), &lease_ttl_ms.to_string()],
            ),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let c = c.clone();
        let ttl = format!("{} milliseconds", lease_ttl_ms.clamp(1000, 86_400_000));
        self.transition(
            &step,
            body!([c, ttl] |f| {
                let d = f.cas(
                    "UPDATE lane_incarnations li SET state = 'RUNNING' FROM reservations r \
                     WHERE li.lane_incarnation_id = $1 AND li.state = 'RUNNING' AND li.retired_at IS NULL AND r.reservation_id = $2 \
                       AND r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL \
                       AND NOT EXISTS (SELECT 1 FROM leases s WHERE s.reservation_id = r.reservation_id AND s.released_at IS NULL \
                                       AND (s.expires_at <= clock_timestamp() OR s.lease_epoch <> $3)) \
                     RETURNING li.lane_incarnation_id",
                    &[&c.lane_incarnation_id, &c.reservation_id, &epoch],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "not a RUNNING chain with unexpired leases of this epoch").await?),
                };
                let n = d.exec(
                    "UPDATE leases SET expires_at = clock_timestamp() + $2::text::interval, lease_epoch = lease_epoch + 1 \
                     WHERE reservation_id = $1 AND released_at IS NULL",
                    &[&c.reservation_id, &ttl],
                ).await?;
                d.decide(json!({ "chain": c, "leases_renewed": n, "lease_epoch": epoch + 1 }))
            }),
        )
        .await
    }

    /// A RUNNING chain whose effect lease expired (database time) ends in recovery: no
    /// lease is revived, the generation is to be stopped.
    pub async fn expire_leases(&self, l: &Leader, c: &Chain) -> Result<Receipt, AuthorityError> {
        const OP: &str = "lease-expired";
        let step = Step::new(
            OP,
            l,
            format!("lease-expired/{}", c.reservation_id),
            request_digest(OP, &[&c.key()]),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let c = c.clone();
        self.transition(
            &step,
            body!([c] |f| {
                let d = f.cas(
                    "UPDATE lane_incarnations li SET state = 'DRAINING' FROM reservations r \
                     WHERE li.lane_incarnation_id = $1 AND li.state = 'RUNNING' AND li.retired_at IS NULL AND r.reservation_id = $2 \
                       AND r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL \
                       AND EXISTS (SELECT 1 FROM leases s WHERE s.reservation_id = r.reservation_id AND s.released_at IS NULL AND s.expires_at <= clock_timestamp()) \
                     RETURNING r.generation",
                    &[&c.lane_incarnation_id, &c.reservation_id],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "not a RUNNING chain with an expired lease").await?),
                };
                let g: Option<i64> = d.row().col("generation")?;
                d.revoke_leases(&c.reservation_id).await?;
                d.request_stop(&c.lane_incarnation_id, g, "effect lease expired").await?;
                d.to_recovery(RecoveryOf::Assignment(&c.assignment_id), "resume on a fresh chain: its effect lease expired").await?;
                d.decide(json!({ "chain": c, "to": LaneState::Draining, "generation_to_stop": g }))
            }),
        )
        .await
    }
}

/// Finalizes a requested outcome once the generation's end is proven: the outcome itself if
/// cleanup was verified, QUARANTINED if it was not (never a false completion).
async fn finalize(
    d: &super::txn::Decided<'_>,
    assignment: &str,
    lifecycle: Lifecycle,
    requested: Option<&str>,
    supplied: Option<&str>,
    receipt_digest: &str,
    verified: bool,
) -> Result<Option<String>, AuthorityError> {
    let Some(req) = requested else {
        return Ok(None);
    };
    if !NONTERMINAL.contains(&lifecycle) {
        return Ok(None);
    }
    let outcome = if verified {
        req
    } else {
        Lifecycle::Quarantined.as_str()
    };
    let fe = final_evidence(outcome, receipt_digest, supplied);
    d.exec_one(
        "UPDATE assignments SET lifecycle = $2, final_evidence_digest = $3, finalized_at = clock_timestamp(), execution_owner = NULL, \
                pending_target = NULL, next_action = CASE WHEN $2 = 'QUARANTINED' THEN 'inspect the lane: cleanup was not verified' ELSE 'none: ' || $2 END \
         WHERE assignment_id = $1",
        &[&assignment, &outcome, &fe],
    )
    .await?;
    Ok(Some(outcome.to_string()))
}

#[allow(clippy::too_many_arguments)]
async fn insert_receipt(
    d: &super::txn::Decided<'_>,
    key: &str,
    lane_id: &str,
    inc: &str,
    generation: i64,
    body_text: &str,
    body_digest: &str,
    verified: bool,
    epoch: i64,
    rec: &Reconciliation,
    about: (&str, &str, &str, &str, Option<&str>),
) -> Result<(), AuthorityError> {
    let (reservation, assignment, attempt, resp, exec) = about;
    d.exec_one(
        "INSERT INTO termination_receipts (idempotency_key, lane_id, lane_incarnation_id, generation, body, body_digest, verified_empty, ingested_epoch, \
                                           reconciled_at, reconciliation, reservation_id, assignment_id, assignment_attempt_id, responsibility_owner, execution_owner) \
         VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8, clock_timestamp(), $9, $10, $11, $12, $13, $14)",
        &[&key, &lane_id, &inc, &generation, &body_text, &body_digest, &verified, &epoch, &rec.label(), &reservation, &assignment, &attempt, &resp, &exec],
    )
    .await
}

/// A receipt that contradicts the coordinator's state: the lane (if current) is quarantined;
/// the receipt itself is recorded in the transition receipt and audit, not ingested.
async fn quarantine_for_receipt<'t>(
    f: super::txn::Frame<'t>,
    inc: &str,
    retired: bool,
    state: LaneState,
    reason: String,
) -> Result<super::txn::Decision<'t>, AuthorityError> {
    if retired {
        return Err(reject(
            "ingest-termination",
            Category::Conflict,
            format!("{reason} (the incarnation is retired; nothing to quarantine)"),
        ));
    }
    let d = f
        .cas(
            "UPDATE lane_incarnations SET state = 'QUARANTINED', quarantine_reason = $3 \
             WHERE lane_incarnation_id = $1 AND state = $2 AND retired_at IS NULL RETURNING 1",
            &[&inc, &state, &reason],
        )
        .await?;
    let Ok(d) = d else {
        return Err(reject(
            "ingest-termination",
            Category::Conflict,
            "the lane changed concurrently",
        ));
    };
    quarantine_follow_ups(&d, inc, &reason).await?;
    let rec = Reconciliation::Quarantined { reason };
    d.decide(json!({ "reconciliation": rec }))
}

/// Quarantines a lane inside an already decided transition.
pub(crate) async fn quarantine_in(
    d: &super::txn::Decided<'_>,
    inc: &str,
    reason: &str,
    from_host: bool,
) -> Result<(), AuthorityError> {
    d.exec_one(
        "UPDATE lane_incarnations SET state = 'QUARANTINED', quarantine_reason = $2, \
                host_quarantine_reason = CASE WHEN $3 THEN $2 ELSE host_quarantine_reason END \
         WHERE lane_incarnation_id = $1 AND retired_at IS NULL",
        &[&inc, &reason, &from_host],
    )
    .await?;
    quarantine_follow_ups(d, inc, reason).await
}

/// What quarantine does besides the lane state: leases and the reservation released, the
/// active assignment to recovery, and a generation still running marked to be stopped.
pub(crate) async fn quarantine_follow_ups(
    d: &super::txn::Decided<'_>,
    inc: &str,
    reason: &str,
) -> Result<(), AuthorityError> {
    d.exec(
        "UPDATE leases SET released_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND released_at IS NULL",
        &[&inc],
    )
    .await?;
    d.exec(
        "UPDATE reservations SET released_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND released_at IS NULL",
        &[&inc],
    )
    .await?;
    d.exec(
        "UPDATE generations SET stop_requested_at = clock_timestamp(), stop_reason = 'lane quarantined' \
         WHERE lane_incarnation_id = $1 AND state <> 'ENDED' AND stop_requested_at IS NULL",
        &[&inc],
    )
    .await?;
    d.to_recovery(
        RecoveryOf::Lane(inc),
        &format!("lane quarantined: {reason}"),
    )
    .await?;
    Ok(())
}
