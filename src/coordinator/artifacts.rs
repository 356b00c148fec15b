//! Harness artifacts on the coordinator's side (migration 0026): the recipient list this
//! coordinator encrypts to, registered at start; the record of each artifact a receipt
//! names, in the receipt's own transaction; the listing operators see. The bytes travel
//! like a checkpoint's (`checkpoint_store`, role `artifact`) and are read back only by
//! operators (`checkpoint_view::artifact_read`, recorded).
//!
//! **Never:** records an artifact a receipt does not name, or one whose fields are not
//! well formed; serves an artifact to a host (nothing a generation runs may read one).

use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::retention::Doomed;
use super::rows::RowExt;
use super::store::Store;
use super::txn::{body, request_digest, Step};
use crate::protocol::artifact::{
    recipients_digest, retention_policy_digest, ArtifactRef, Recipient, CLASSIFICATION, PURPOSE,
};

/// The columns a deletion reads of an artifact record (`h`).
const DOOMED_COLUMNS: &str =
    "h.lane_incarnation_id, h.generation, h.artifact_digest, h.assignment_id, h.purpose, h.retention_policy_digest";

fn doomed_of(r: &tokio_postgres::Row) -> Result<Doomed, AuthorityError> {
    Ok(Doomed {
        checkpoint_digest: r.col("artifact_digest")?,
        assignment_id: r.col("assignment_id")?,
        lane_incarnation_id: r.col("lane_incarnation_id")?,
        generation: r.col("generation")?,
        purpose: r.col("purpose")?,
        handoff_id: None,
        request_seq: None,
        retention_policy_digest: r.col("retention_policy_digest")?,
    })
}

/// Where an artifact record (`h`) is deletable for `reason`: its work done, its upload
/// settled, and for `retention` its policy's time passed since the work was done (or since
/// the artifact was recorded, when that was later: a host back after a long absence).
fn deletable_where(reason: &str) -> String {
    let done = super::states::WorkStatus::Done.sql();
    let kept_out = if reason == "retention" {
        "AND EXISTS (SELECT 1 FROM retention_policies p WHERE p.policy_digest = h.retention_policy_digest \
              AND p.keep_after_done_s IS NOT NULL AND a.finalized_at IS NOT NULL \
              AND greatest(a.finalized_at, h.created_at) + p.keep_after_done_s * interval '1 second' <= clock_timestamp())"
    } else {
        ""
    };
    format!(
        "EXISTS (SELECT 1 FROM assignments a WHERE a.assignment_id = h.assignment_id AND a.work_status = {done} {kept_out}) \
         AND (h.object IS NOT NULL OR h.transfer_error IS NOT NULL)"
    )
}

impl Store {
    /// Registers `list` (this coordinator's `recovery_recipients`) as the active recipient
    /// list (their retention policy is registered with the others: `register_retention`).
    pub async fn register_recipients(&self, list: &[Recipient]) -> Result<(), AuthorityError> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        tx.execute("LOCK TABLE recovery_recipient_lists IN EXCLUSIVE MODE", &[])
            .await?;
        let digest = recipients_digest(list);
        let names: Vec<String> = list.iter().map(|r| r.to_string()).collect();
        tx.execute(
            "INSERT INTO recovery_recipient_lists (recipients_digest, recipients) VALUES ($1, $2) \
             ON CONFLICT (recipients_digest) DO NOTHING",
            &[&digest, &names],
        )
        .await?;
        tx.execute(
            "UPDATE recovery_recipient_lists SET active = false WHERE active AND recipients_digest <> $1",
            &[&digest],
        )
        .await?;
        tx.execute(
            "UPDATE recovery_recipient_lists SET active = true WHERE recipients_digest = $1",
            &[&digest],
        )
        .await?;
        tx.commit().await?;
        if list.is_empty() {
            tracing::warn!("no recovery_recipients are configured: harness artifacts (session transcripts) are not captured");
        }
        Ok(())
    }

    /// Whether `digest` names a harness artifact (`checkpoint delete` takes either).
    pub async fn is_artifact(&self, digest: &str) -> Result<bool, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query_opt(
            "SELECT 1 FROM harness_artifacts WHERE artifact_digest = $1 LIMIT 1",
            &[&digest],
        )
        .await?
        .is_some())
    }

    /// `mosaic checkpoint delete` of an artifact: [`Store::delete_artifact_record`] of the
    /// record its digest names, for `operator`.
    pub async fn delete_artifact(
        &self,
        l: &Leader,
        digest: &str,
    ) -> Result<serde_json::Value, AuthorityError> {
        let c = self.pool.get().await?;
        let Some(r) = c
            .query_opt(
                &format!("SELECT {DOOMED_COLUMNS} FROM harness_artifacts h WHERE h.artifact_digest = $1 LIMIT 1"),
                &[&digest],
            )
            .await?
        else {
            return Err(reject("checkpoint-delete", Category::NotFound, format!("no artifact {digest}")));
        };
        drop(c);
        let r = self
            .delete_artifact_record(l, &doomed_of(&r)?, "operator")
            .await?;
        Ok(json!({ "deleted": [r], "kept": [] }))
    }

    /// The artifact records deletable now under their retention policy: of done work, their
    /// upload settled, their policy's time since the work was done passed.
    pub async fn deletable_artifacts(&self) -> Result<Vec<Doomed>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            &format!(
                "SELECT {DOOMED_COLUMNS} FROM harness_artifacts h WHERE {} ORDER BY h.created_at",
                deletable_where("retention")
            ),
            &[],
        )
        .await?
        .iter()
        .map(doomed_of)
        .collect()
    }

    /// Deletes artifact record `doomed` for `reason` (one fenced step): its record and its
    /// store object, with a deletion receipt (`checkpoint deletions`, purpose
    /// `operator-recovery`). Only of done work, and only once its upload is settled
    /// (stored, or refused for good): an upload under way would otherwise find no record
    /// and leave the host's copy behind for good; for `retention`, only once its policy's
    /// time has passed (decided again in the step).
    pub async fn delete_artifact_record(
        &self,
        l: &Leader,
        doomed: &Doomed,
        reason: &'static str,
    ) -> Result<serde_json::Value, AuthorityError> {
        const OP: &str = "checkpoint-delete";
        let step = Step::new(
            OP,
            l,
            format!(
                "artifact-delete/{}/{}",
                doomed.lane_incarnation_id, doomed.generation
            ),
            request_digest(
                OP,
                &[
                    &doomed.checkpoint_digest,
                    &doomed.lane_incarnation_id,
                    &doomed.generation.to_string(),
                    reason,
                ],
            ),
        )
        .about(
            Some(&doomed.assignment_id),
            Some(&doomed.lane_incarnation_id),
        );
        let sql = format!(
            "DELETE FROM harness_artifacts h WHERE h.lane_incarnation_id = $1 AND h.generation = $2 AND h.artifact_digest = $3 \
               AND {} RETURNING h.object",
            deletable_where(reason)
        );
        let doomed = doomed.clone();
        let r = self
            .transition(
                &step,
                body!([doomed, sql] |f| {
                    let id = format!("cd-{}", uuid::Uuid::new_v4().simple());
                    let d = match f.cas(&sql, &[&doomed.lane_incarnation_id, &doomed.generation, &doomed.checkpoint_digest]).await? {
                        Ok(d) => d,
                        Err(u) => return Err(u.reject(Category::WrongState,
                            "not deletable now: its work is not done, its upload is still under way, or its policy keeps it").await?),
                    };
                    let object: Option<String> = d.row().col("object")?;
                    let mut gone = vec![];
                    if let Some(o) = object {
                        let n = d.exec(
                            "DELETE FROM checkpoint_objects o WHERE o.object_digest = $1 \
                             AND NOT EXISTS (SELECT 1 FROM harness_artifacts h WHERE h.object = $1) \
                             AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.bundle_object = $1 OR c.base_object = $1)",
                            &[&o],
                        ).await?;
                        if n == 1 {
                            gone.push(o);
                        }
                    }
                    let receipt = doomed.receipt_digest(&id, reason, &gone);
                    d.exec_one(
                        "INSERT INTO checkpoint_deletions (deletion_id, checkpoint_digest, assignment_id, lane_incarnation_id, generation, purpose, \
                                                          handoff_id, retention_policy_digest, reason, scope, objects_deleted, receipt_digest, request_seq) \
                         VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, 'coordinator-store', $9, $10, NULL)",
                        &[&id, &doomed.checkpoint_digest, &doomed.assignment_id, &doomed.lane_incarnation_id, &doomed.generation,
                          &doomed.purpose, &doomed.retention_policy_digest, &reason, &gone, &receipt],
                    ).await?;
                    d.decide(json!({ "deletion_id": id, "artifact": doomed, "reason": reason, "scope": "coordinator-store",
                        "objects_deleted": gone, "receipt_digest": receipt }))
                }),
            )
            .await?;
        Ok(r.body)
    }

    /// Harness artifacts (of one assignment), oldest first.
    pub async fn artifacts(
        &self,
        assignment_id: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT a.artifact_digest, a.size, a.files, a.recipients_digest, a.recipients_match, a.classification, \
                        a.retention_policy_digest, a.purpose, a.assignment_id, a.assignment_attempt_id, a.lane_incarnation_id, \
                        a.generation, a.host_id, a.object IS NOT NULL AS stored, a.transfer_error, \
                        mosaic_ts(a.created_at) AS created_at, \
                        (SELECT array_agg(split_part(r, '=', 1) ORDER BY r) FROM recovery_recipient_lists l, unnest(l.recipients) r \
                          WHERE l.recipients_digest = a.recipients_digest) AS principals \
                 FROM harness_artifacts a WHERE $1::text IS NULL OR a.assignment_id = $1 \
                 ORDER BY a.created_at, a.lane_incarnation_id, a.generation",
                &[&assignment_id],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(serde_json::json!({
                    "artifact_digest": r.col::<String>("artifact_digest")?,
                    "size": r.col::<i64>("size")?,
                    "files": r.col::<i32>("files")?,
                    "recipients_digest": r.col::<String>("recipients_digest")?,
                    "recipients_match": r.col::<bool>("recipients_match")?,
                    "principals": r.col::<Option<Vec<String>>>("principals")?,
                    "classification": r.col::<String>("classification")?,
                    "retention_policy_digest": r.col::<String>("retention_policy_digest")?,
                    "purpose": r.col::<String>("purpose")?,
                    "assignment_id": r.col::<String>("assignment_id")?,
                    "assignment_attempt_id": r.col::<String>("assignment_attempt_id")?,
                    "lane_incarnation_id": r.col::<String>("lane_incarnation_id")?,
                    "generation": r.col::<i64>("generation")?,
                    "host_id": r.col::<String>("host_id")?,
                    "stored": r.col::<bool>("stored")?,
                    "transfer_error": r.col::<Option<String>>("transfer_error")?,
                    "created_at": r.col::<String>("created_at")?,
                }))
            })
            .collect()
    }
}

/// The artifact a receipt names, recorded with it (same transaction), if it is well
/// formed; anything else records none (the receipt still stands and says what the host
/// sent). Whether it was encrypted to the active recipient list is recorded beside it.
pub(crate) async fn record_artifact(
    d: &crate::coordinator::txn::Decided<'_>,
    key: &str,
    inc: &str,
    generation: i64,
    body: &serde_json::Value,
    assignment: &str,
    attempt: &str,
) -> Result<(), AuthorityError> {
    let Some(v) = body.get("harness_artifact").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let Some(a) = serde_json::from_value::<ArtifactRef>(v.clone())
        .ok()
        .filter(ArtifactRef::well_formed)
    else {
        tracing::warn!(
            receipt = key,
            "a receipt's harness artifact is malformed: not recorded"
        );
        return Ok(());
    };
    let n = d
        .exec(
            "INSERT INTO harness_artifacts (lane_incarnation_id, generation, artifact_digest, size, files, recipients_digest, recipients_match, \
                                            classification, retention_policy_digest, purpose, assignment_id, assignment_attempt_id, host_id, termination_receipt) \
             SELECT $1, $2, $3, $4, $5, $6, \
                    EXISTS (SELECT 1 FROM recovery_recipient_lists WHERE recipients_digest = $6 AND active), \
                    $7, coalesce((SELECT policy_digest FROM retention_policies WHERE classification = $7 AND active), $8), \
                    $9, $10, $11, ln.host_id, $12 \
             FROM lane_incarnations li JOIN lanes ln ON ln.lane_id = li.lane_id WHERE li.lane_incarnation_id = $1 \
             ON CONFLICT DO NOTHING",
            &[
                &inc,
                &generation,
                &a.digest,
                &(a.size as i64),
                &(a.files as i32),
                &a.recipients_digest,
                &CLASSIFICATION,
                &retention_policy_digest(),
                &PURPOSE,
                &assignment,
                &attempt,
                &key,
            ],
        )
        .await?;
    if n == 1 {
        let matched: bool = d
            .query_one(
                "SELECT recipients_match FROM harness_artifacts WHERE lane_incarnation_id = $1 AND generation = $2",
                &[&inc, &generation],
            )
            .await?
            .col("recipients_match")?;
        if !matched {
            tracing::warn!(receipt = key, artifact_digest = %a.digest, recipients_digest = %a.recipients_digest,
                "a harness artifact is encrypted to another recipient list than this coordinator's: recorded, marked");
        }
    }
    Ok(())
}
