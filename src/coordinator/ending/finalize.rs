//! Finalizing a requested outcome once the generation's end is proven, and quarantining a
//! lane inside a decided transition.

use super::*;
use crate::coordinator::states::{GenState, LaneState, Lifecycle};
use const_format::concatcp;

/// Finalizes a requested outcome once the generation's end is proven: the outcome itself if
/// cleanup was verified, QUARANTINED if it was not (never a false completion).
pub(super) async fn finalize(
    d: &crate::coordinator::txn::Decided<'_>,
    assignment: &str,
    lifecycle: Lifecycle,
    requested: Option<&str>,
    supplied: Option<&str>,
    receipt: (&str, &str),
    verified: bool,
) -> Result<Option<String>, AuthorityError> {
    let (receipt_digest, body_text) = receipt;
    let Some(req) = requested else {
        return Ok(None);
    };
    if !NONTERMINAL.contains(&lifecycle) {
        return Ok(None);
    }
    // An effect of the work whose outcome nobody knows keeps it from any outcome but
    // QUARANTINED, with the claim's reconciliation owner named (spec §5.5).
    let open = crate::coordinator::effects::open_claims(d, assignment).await?;
    let (outcome, review) = if open > 0 {
        (
            Lifecycle::Quarantined.as_str(),
            format!("{}: resolve the effect claims whose outcome is unknown (mosaic effects --assignment {assignment}; mosaic effect resolve), then review the work", crate::protocol::effects::RECONCILIATION_OWNER),
        )
    } else if verified {
        (req, String::new())
    } else {
        (
            Lifecycle::Quarantined.as_str(),
            "inspect the lane: cleanup was not verified".to_string(),
        )
    };
    // Work in a repository completes on its final checkpoint — the one this receipt
    // carries — never without it (spec §17, premature completion).
    let mut checkpoint = None;
    let (outcome, review) = if outcome == Lifecycle::Completed.as_str() {
        let repo = repository_of(d, assignment).await?;
        let in_repo = repo.is_some();
        let body: serde_json::Value = serde_json::from_str(body_text).unwrap_or_default();
        // Only the checkpoint this receipt records: well formed, of the work's own repository.
        checkpoint = checkpoint_in(&body)
            .filter(|c| repo.as_deref() == Some(c.repository.as_str()))
            .map(|c| c.digest());
        if in_repo && checkpoint.is_none() {
            (
                Lifecycle::Quarantined.as_str(),
                format!("the work's final generation left no checkpoint of its workspace, so its completion has no evidence: look at the workspace on its host (workspaces/{assignment} in the supervisor's state directory), then resume the work or stop it as failed"),
            )
        } else {
            (outcome, review)
        }
    } else {
        (outcome, review)
    };
    let fe = super::final_evidence_of(outcome, receipt_digest, supplied, checkpoint.as_deref());
    d.exec_one(
        concatcp!("UPDATE assignments SET lifecycle = $2, final_evidence_digest = $3, finalized_at = clock_timestamp(), execution_owner = NULL, \
                pending_target = NULL, next_action = CASE WHEN $2 = ", Lifecycle::Quarantined.sql(), " THEN $4 ELSE 'none: ' || $2 END, \
                final_checkpoint_digest = $5 \
         WHERE assignment_id = $1"),
        &[&assignment, &outcome, &fe, &review, &checkpoint],
    )
    .await?;
    Ok(Some(outcome.to_string()))
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn insert_receipt(
    d: &crate::coordinator::txn::Decided<'_>,
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
    .await?;
    record_checkpoint(d, key, inc, generation, body_text, assignment, attempt).await?;
    let body: serde_json::Value = serde_json::from_str(body_text).unwrap_or_default();
    crate::coordinator::artifacts::record_artifact(
        d, key, inc, generation, &body, assignment, attempt,
    )
    .await
}

/// The checkpoint a receipt carries, if it is one the coordinator records: well formed,
/// its digest the one its ids give.
fn checkpoint_in(body: &serde_json::Value) -> Option<crate::protocol::repo::CheckpointRef> {
    let c = body.get("checkpoint").filter(|c| !c.is_null())?;
    let claimed = body.get("checkpoint_digest").and_then(|v| v.as_str());
    serde_json::from_value::<crate::protocol::repo::CheckpointRef>(c.clone())
        .ok()
        .filter(|c| c.well_formed() && claimed == Some(c.digest().as_str()))
}

/// Why the receipt of `generation` leaves its work without the checkpoint it needs, if it
/// does: work in a repository, a generation that ran a process, and no checkpoint of that
/// repository the coordinator can record.
/// The repository `assignment` works in, if any.
async fn repository_of(
    d: &crate::coordinator::txn::Decided<'_>,
    assignment: &str,
) -> Result<Option<String>, AuthorityError> {
    d.query_one(
        "SELECT repository FROM assignments WHERE assignment_id = $1",
        &[&assignment],
    )
    .await?
    .col("repository")
}

pub(super) async fn missing_checkpoint(
    d: &crate::coordinator::txn::Decided<'_>,
    assignment: &str,
    generation: i64,
    body_text: &str,
) -> Result<Option<String>, AuthorityError> {
    let Some(repo) = repository_of(d, assignment).await? else {
        return Ok(None);
    };
    let body: serde_json::Value = serde_json::from_str(body_text).unwrap_or_default();
    if !body.get("process_identity").is_some_and(|p| p.is_object()) {
        return Ok(None); // nothing ran, nothing was written
    }
    if checkpoint_in(&body).is_some_and(|c| c.repository.as_str() == repo) {
        return Ok(None);
    }
    Ok(Some(format!(
        "generation {generation} of {assignment} (repository {repo}) ended without a checkpoint of its workspace: \
         look at it on its host (workspaces/{assignment} in the supervisor's state directory), then mosaic lane release goes on without one"
    )))
}

/// The checkpoint a receipt carries, recorded with it (same transaction): only if it is
/// well formed, its digest is the one its ids give, and it names its assignment's own
/// repository. Anything else records no checkpoint (the receipt still stands, and says
/// what the host sent): a fact the coordinator cannot check is not recorded as one.
async fn record_checkpoint(
    d: &crate::coordinator::txn::Decided<'_>,
    key: &str,
    inc: &str,
    generation: i64,
    body_text: &str,
    assignment: &str,
    attempt: &str,
) -> Result<(), AuthorityError> {
    use crate::protocol::repo::retention_policy_digest;
    let body: serde_json::Value = serde_json::from_str(body_text).unwrap_or_default();
    if body.get("checkpoint").is_none_or(|c| c.is_null()) {
        return Ok(());
    }
    let Some(c) = checkpoint_in(&body) else {
        tracing::warn!(
            receipt = key,
            "a receipt's checkpoint is malformed or its digest is not its ids': not recorded"
        );
        return Ok(());
    };
    let n = d
        .exec(
            "INSERT INTO checkpoints (checkpoint_digest, commit_id, tree_id, repository, classification, retention_policy_digest, purpose, \
                                      assignment_id, assignment_attempt_id, lane_incarnation_id, generation, host_id, termination_receipt, inputs_digest) \
             SELECT $1, $2, $3, a.repository, 'workspace', \
                    coalesce((SELECT policy_digest FROM retention_policies WHERE classification = 'workspace' AND active), $4), \
                    'same-assignment-recovery', a.assignment_id, $6, $7, $8, ln.host_id, $9, $11 \
             FROM assignments a, lane_incarnations li JOIN lanes ln ON ln.lane_id = li.lane_id \
             WHERE a.assignment_id = $5 AND a.repository = $10 AND li.lane_incarnation_id = $7 \
             ON CONFLICT DO NOTHING",
            &[&c.digest(), &c.commit_id, &c.tree_id, &retention_policy_digest(), &assignment, &attempt, &inc, &generation, &key,
              &c.repository.as_str(), &c.inputs_digest],
        )
        .await?;
    if n == 0 {
        tracing::warn!(receipt = key, assignment, "a receipt's checkpoint names another repository than its work's (or is recorded): not recorded again");
    }
    // Its handoff's checkpoint, already stored: the same objects.
    d.exec(
        crate::coordinator::checkpoint_store::SHARE_OBJECTS,
        &[&inc, &generation, &c.digest()],
    )
    .await?;
    Ok(())
}

/// A receipt that contradicts the coordinator's state: the lane (if current) is quarantined;
/// the receipt itself is recorded in the transition receipt and audit, not ingested.
pub(super) async fn quarantine_for_receipt<'t>(
    f: crate::coordinator::txn::Frame<'t>,
    inc: &str,
    retired: bool,
    state: LaneState,
    reason: String,
) -> Result<crate::coordinator::txn::Decision<'t>, AuthorityError> {
    if retired {
        return Err(reject(
            "ingest-termination",
            Category::Conflict,
            format!("{reason} (the incarnation is retired; nothing to quarantine)"),
        ));
    }
    let d = f
        .cas(
            concatcp!(
                "UPDATE lane_incarnations SET state = ",
                LaneState::Quarantined.sql(),
                ", quarantine_reason = $3 \
             WHERE lane_incarnation_id = $1 AND state = $2 AND retired_at IS NULL RETURNING 1"
            ),
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
    d: &crate::coordinator::txn::Decided<'_>,
    inc: &str,
    reason: &str,
    from_host: bool,
) -> Result<(), AuthorityError> {
    d.exec_one(
        concatcp!(
            "UPDATE lane_incarnations SET state = ",
            LaneState::Quarantined.sql(),
            ", quarantine_reason = $2, \
                host_quarantine_reason = CASE WHEN $3 THEN $2 ELSE host_quarantine_reason END \
         WHERE lane_incarnation_id = $1 AND retired_at IS NULL"
        ),
        &[&inc, &reason, &from_host],
    )
    .await?;
    quarantine_follow_ups(d, inc, reason).await
}

/// What quarantine does besides the lane state: leases and the reservation released, the
/// active assignment to recovery, and a generation still running marked to be stopped.
pub(crate) async fn quarantine_follow_ups(
    d: &crate::coordinator::txn::Decided<'_>,
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
        concatcp!("UPDATE generations SET stop_requested_at = clock_timestamp(), stop_reason = 'lane quarantined' \
         WHERE lane_incarnation_id = $1 AND state <> ", GenState::Ended.sql(), " AND stop_requested_at IS NULL"),
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
