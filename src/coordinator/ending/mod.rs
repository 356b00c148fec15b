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

use const_format::concatcp;
use serde::Serialize;
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::followups::RecoveryOf;
use super::leader::Leader;
use super::model::{Chain, Outcome};
use super::rows::RowExt;
use super::states::{
    GenState, LaneState, Lifecycle, WatchdogStep, WorkStatus, NONTERMINAL, PREACTIVATION,
};
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
    /// A handoff's target chain whose checkpoint cannot reach it (its source host took
    /// none, or the store refused it): the offer ends, the work stays with its source.
    NoHandoffCheckpoint,
    /// A handoff's target chain whose offer was withdrawn (its source ended, or the work
    /// left ACTIVE): it can never be acknowledged, and its generation — one of the work's
    /// — would hold up the work's next attempt until its deadline.
    HandoffWithdrawn,
    /// A remediation assignment's chain whose grant cannot be consumed (spent, revoked,
    /// expired, a bound field not holding) or whose granted checkpoint is gone: the work
    /// never starts from anything else.
    NoGrantedCheckpoint,
    /// Its host's workspace is not what its stage named to restore (another checkpoint, or
    /// none): the generation must never run on it.
    RestoreMismatch,
}

impl EndCause {
    fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "reservation expired before activation",
            Self::Abandoned => "the host lost the chain before activation",
            Self::NoHandoffCheckpoint => "its handoff's checkpoint cannot reach it",
            Self::HandoffWithdrawn => "its handoff was withdrawn",
            Self::NoGrantedCheckpoint => "its granted checkpoint cannot be given to it",
            Self::RestoreMismatch => "its host's workspace is not the checkpoint its stage named",
        }
    }
}

/// The end-chain causes that are a failure of the target itself — objective evidence for a
/// retarget (`recovery.rs`) — as an SQL list (quotes doubled). A withdrawn offer, a
/// checkpoint that cannot reach the target and a grant that cannot be consumed are not:
/// another lane would fail alike. (The test below holds this list to `as_str`.)
pub(crate) const TARGET_FAILURE_CAUSES: &str = "('reservation expired before activation', \
     'the host lost the chain before activation', \
     'its host''s workspace is not the checkpoint its stage named')";

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
    final_evidence_of(outcome, receipt_digest, supplied, None)
}

/// The final evidence, binding the final checkpoint too when the work completed in a
/// repository (without one, the same digest as ever).
fn final_evidence_of(
    outcome: &str,
    receipt_digest: &str,
    supplied: Option<&str>,
    checkpoint: Option<&str>,
) -> String {
    let mut parts: Vec<&[u8]> = vec![
        outcome.as_bytes(),
        receipt_digest.as_bytes(),
        supplied.unwrap_or("").as_bytes(),
    ];
    if let Some(c) = checkpoint {
        parts.push(c.as_bytes());
    }
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/final-evidence/v1", &parts)
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
                    concatcp!("UPDATE lane_incarnations li SET state = CASE WHEN r.generation IS NULL THEN ", LaneState::IdleClean.sql(), " ELSE ", LaneState::Draining.sql(), " END \
                     FROM reservations r, assignments a \
                     WHERE li.lane_incarnation_id = $1 AND r.reservation_id = $2 AND r.lane_incarnation_id = li.lane_incarnation_id \
                       AND r.assignment_id = $3 AND a.assignment_id = r.assignment_id AND r.released_at IS NULL \
                       AND li.state = ANY($4) AND li.retired_at IS NULL AND (NOT $5 OR r.deadline <= clock_timestamp()) \
                     RETURNING li.state, r.generation, a.requested_outcome"),
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
                    // Work that starts from a granted checkpoint and has none of its own
                    // cannot start again without a new grant: blocked, so the watchdog does
                    // not spend attempt after attempt on it.
                    if cause == EndCause::NoGrantedCheckpoint {
                        let evidence = format!("sha256:{}", crate::util::sha256_hex("mosaic/no-granted-checkpoint/v1", &[c.reservation_id.as_bytes()]));
                        d.exec(
                            concatcp!("UPDATE assignments a SET work_status = ", WorkStatus::Blocked.sql(), ", blocker_code = 'no-granted-checkpoint', \
                                    blocker_evidence_digest = $2, next_action = $3, watchdog_step = ", WatchdogStep::None.sql(), " \
                             WHERE a.assignment_id = $1 AND a.lifecycle = ", Lifecycle::Recovery.sql(), " \
                               AND NOT EXISTS (SELECT 1 FROM checkpoints k WHERE k.assignment_id = a.assignment_id AND k.handoff_id IS NULL)"),
                            &[&c.assignment_id, &evidence,
                              &"its granted checkpoint cannot be given to it: stop it, and start the work again with a new assignment (assign --from-checkpoint makes a new grant)"],
                        ).await?;
                    }
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
                    // The rows first, then what is decided on, in a statement of its own: a
                    // statement that waited for a lock still reads the snapshot it started
                    // with, so a receipt committed meanwhile (its generation ended, the work
                    // not finalized since no end was asked for yet) would be read as still
                    // running, and the end would wait for a receipt already reconciled.
                    f.read_opt(
                        "SELECT 1 FROM assignments a JOIN lane_incarnations li ON li.lane_incarnation_id = a.lane_incarnation_id \
                         WHERE a.assignment_id = $1 FOR UPDATE OF a, li",
                        &[&asg],
                    ).await?;
                    let row = f.read_opt(
                        concatcp!("SELECT a.lifecycle, a.requested_outcome, li.state AS lane_state, r.reservation_id, r.generation, \
                                li.lane_incarnation_id, \
                                EXISTS (SELECT 1 FROM reservations r2 JOIN generations g2 ON g2.lane_incarnation_id = r2.lane_incarnation_id \
                                        AND g2.generation = r2.generation WHERE r2.assignment_id = a.assignment_id AND g2.state <> ", GenState::Ended.sql(), ") AS unended, \
                                (SELECT t.verified_empty FROM termination_receipts t WHERE t.assignment_id = a.assignment_id ORDER BY t.ingested_at DESC LIMIT 1) AS last_verified, \
                                (SELECT t.body_digest FROM termination_receipts t WHERE t.assignment_id = a.assignment_id ORDER BY t.ingested_at DESC LIMIT 1) AS last_receipt, \
                                a.repository IS NOT NULL AS in_repository, \
                                (SELECT ck.checkpoint_digest FROM termination_receipts t JOIN checkpoints ck ON ck.termination_receipt = t.idempotency_key \
                                  WHERE t.assignment_id = a.assignment_id AND t.ingested_at = (SELECT max(t2.ingested_at) FROM termination_receipts t2 WHERE t2.assignment_id = a.assignment_id)) AS last_checkpoint, \
                                EXISTS (SELECT 1 FROM transition_receipts x WHERE x.transition = 'activate' AND x.assignment_id = a.assignment_id) AS ever_ran, \
                                a.work_status \
                         FROM assignments a JOIN lane_incarnations li ON li.lane_incarnation_id = a.lane_incarnation_id \
                         LEFT JOIN reservations r ON r.assignment_id = a.assignment_id AND r.released_at IS NULL AND r.lane_incarnation_id = a.lane_incarnation_id \
                         WHERE a.assignment_id = $1 FOR UPDATE OF a, li"),
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
                    let in_repository: bool = row.col("in_repository")?;
                    let last_checkpoint: Option<String> = row.col("last_checkpoint")?;
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
                                concatcp!("UPDATE lane_incarnations li SET state = CASE WHEN r.generation IS NULL THEN ", LaneState::IdleClean.sql(), " ELSE ", LaneState::Draining.sql(), " END \
                                 FROM reservations r WHERE li.lane_incarnation_id = $1 AND li.state = $2 AND li.retired_at IS NULL \
                                   AND r.reservation_id = $3 AND r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL \
                                 RETURNING li.state"),
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
                            // Work in a repository completes on its final checkpoint, never before.
                            if outcome == Outcome::Completed && !unended && in_repository && last_checkpoint.is_none() {
                                return Err(reject(OP, Category::WrongState, "COMPLETED of work in a repository needs the checkpoint of its last generation, which has none (its capture failed or was waived): resume it, or stop it as failed or cancelled"));
                            }
                            let d = f.cas(
                                concatcp!("UPDATE assignments SET requested_outcome = $2, requested_evidence_digest = $3 \
                                 WHERE assignment_id = $1 AND lifecycle = ", Lifecycle::Recovery.sql(), " AND requested_outcome IS NULL RETURNING assignment_id"),
                                &[&asg, &o, &evidence],
                            ).await?;
                            let Ok(d) = d else {
                                return Err(reject(OP, Category::WrongState, "the assignment changed under the request; retry"));
                            };
                            if !unended {
                                let ck = last_checkpoint.as_deref().filter(|_| outcome == Outcome::Completed);
                                let fe = final_evidence_of(o, last_receipt.as_deref().unwrap_or("no-generation"), evidence.as_deref(), ck);
                                d.exec_one(
                                    "UPDATE assignments SET lifecycle = $2, final_evidence_digest = $3, finalized_at = clock_timestamp(), execution_owner = NULL, \
                                            pending_target = NULL, next_action = 'none: ' || $2, final_checkpoint_digest = $4 WHERE assignment_id = $1",
                                    &[&asg, &o, &fe, &ck],
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
}

mod finalize;
mod ingest;
mod leases;

pub(crate) use finalize::*;

#[cfg(test)]
mod cause_tests {
    use super::*;

    #[test]
    fn the_target_failure_causes_are_exactly_these_three() {
        let quoted = |c: EndCause| format!("'{}'", c.as_str().replace('\'', "''"));
        for c in [
            EndCause::Expired,
            EndCause::Abandoned,
            EndCause::RestoreMismatch,
        ] {
            assert!(TARGET_FAILURE_CAUSES.contains(&quoted(c)), "{}", c.as_str());
        }
        for c in [
            EndCause::NoHandoffCheckpoint,
            EndCause::HandoffWithdrawn,
            EndCause::NoGrantedCheckpoint,
        ] {
            assert!(
                !TARGET_FAILURE_CAUSES.contains(&quoted(c)),
                "{}",
                c.as_str()
            );
        }
    }
}
