//! Checkpoint retention (migration 0021, spec §11): versioned policies, each checkpoint
//! recording the digest of the one in force when it was taken, and deletion with a
//! receipt — by `mosaic checkpoint gc` once a policy's time after the work is done has
//! passed, or by an operator's `mosaic checkpoint delete` of done work. One fenced step
//! per checkpoint removes its record, the store's objects no other checkpoint names, and
//! writes the receipt saying exactly that.
//!
//! **Never:** deletes a checkpoint of work that is not done, or one an unspent grant
//! names; deletes an object another checkpoint names; claims to have removed what it did
//! not (a host's own copies are out of its reach: the receipt's scope says so).

use serde::Serialize;
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::rows::RowExt;
use super::store::Store;
use super::txn::{body, request_digest, Step};
use crate::protocol::repo::RETENTION_POLICY;

/// What a policy is for: workspace checkpoints, or `sensitive` harness artifacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Classification {
    Workspace,
    Sensitive,
}

impl Classification {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Workspace => "workspace",
            Self::Sensitive => crate::protocol::artifact::CLASSIFICATION,
        }
    }

    /// The configuration key that names its policy.
    fn key(self) -> &'static str {
        match self {
            Self::Workspace => "checkpoint_retention_s",
            Self::Sensitive => "artifact_retention_s",
        }
    }
}

/// A retention policy of one classification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetentionPolicy {
    pub classification: Classification,
    pub name: &'static str,
    /// How long after its work is done a record is kept; `None`: until deleted.
    pub keep_after_done_s: Option<u64>,
}

/// The policies that keep after done, by name.
const DONE_PLUS: &str = "mosaic/retention/done-plus/v1";
const SENSITIVE_DONE_PLUS: &str = "mosaic/retention/sensitive/done-plus/v1";

impl RetentionPolicy {
    /// Longest a record may be kept after its work is done: ten years.
    pub const MAX_KEEP_S: u64 = 10 * 365 * 24 * 3600;

    /// The one a coordinator's configuration names for workspace checkpoints
    /// (`checkpoint_retention_s`): 1 s to ten years, or absent (kept until deleted).
    pub fn configured(keep_after_done_s: Option<u64>) -> Result<Self, String> {
        Self::configured_for(Classification::Workspace, keep_after_done_s)
    }

    /// The one a coordinator's configuration names for `classification`.
    pub fn configured_for(
        classification: Classification,
        keep_after_done_s: Option<u64>,
    ) -> Result<Self, String> {
        match keep_after_done_s {
            None => Ok(Self::until_removed_for(classification)),
            Some(s) if (1..=Self::MAX_KEEP_S).contains(&s) => Ok(Self {
                classification,
                name: match classification {
                    Classification::Workspace => DONE_PLUS,
                    Classification::Sensitive => SENSITIVE_DONE_PLUS,
                },
                keep_after_done_s: Some(s),
            }),
            Some(s) => Err(format!(
                "{} = {s}: 1 to {} seconds, or absent (kept until deleted)",
                classification.key(),
                Self::MAX_KEEP_S
            )),
        }
    }

    /// Keep-until-removed: the default, and what every checkpoint before retention records.
    pub fn until_removed() -> Self {
        Self::until_removed_for(Classification::Workspace)
    }

    /// Keep-until-removed of `classification` (its digest is the one records made before
    /// retention was configurable name).
    pub fn until_removed_for(classification: Classification) -> Self {
        Self {
            classification,
            name: match classification {
                Classification::Workspace => RETENTION_POLICY,
                Classification::Sensitive => crate::protocol::artifact::RETENTION_POLICY,
            },
            keep_after_done_s: None,
        }
    }

    /// Its digest: its name and, when it has one, its time (the keep-until-removed
    /// policy's is `protocol::repo::retention_policy_digest`).
    pub fn digest(&self) -> String {
        let secs = self.keep_after_done_s.map(|s| s.to_string());
        let mut parts: Vec<&[u8]> = vec![self.name.as_bytes()];
        if let Some(s) = &secs {
            parts.push(s.as_bytes());
        }
        format!(
            "sha256:{}",
            crate::util::sha256_hex("mosaic/retention-policy", &parts)
        )
    }
}

/// Where a checkpoint record (alias `ck`) is deletable now, with why: its work done, no
/// live grant naming it (unrevoked and before its deadline, consumed or not: its target
/// may still be restoring), no open push or merge handing it on, its upload settled (stored, or refused for good), and (for
/// `retention`) its policy's time since the work was done passed.
/// `$1` the reason, `$2` an assignment (or NULL), `$3` a digest (or NULL).
fn deletable_from(ck: &str) -> String {
    use super::states::WorkspaceEffectState as E;
    let done = super::states::WorkStatus::Done.sql();
    let (requested, admitted, unknown) = (E::Requested.sql(), E::Admitted.sql(), E::Unknown.sql());
    format!(
        "FROM checkpoints {ck} JOIN assignments a ON a.assignment_id = {ck}.assignment_id \
         LEFT JOIN retention_policies p ON p.policy_digest = {ck}.retention_policy_digest \
         WHERE a.work_status = {done} \
           AND ($2::text IS NULL OR {ck}.assignment_id = $2) AND ($3::text IS NULL OR {ck}.checkpoint_digest = $3) \
           AND NOT EXISTS (SELECT 1 FROM checkpoint_grants g WHERE g.checkpoint_digest = {ck}.checkpoint_digest \
                           AND g.revoked_at IS NULL AND g.deadline > clock_timestamp()) \
           AND NOT EXISTS (SELECT 1 FROM workspace_effects e WHERE e.checkpoint_digest = {ck}.checkpoint_digest \
                           AND (e.state IN ({admitted}, {unknown}) \
                                OR (e.state = {requested} AND e.claim_deadline > clock_timestamp()))) \
           AND ({ck}.bundle_object IS NOT NULL OR {ck}.transfer_error IS NOT NULL) \
           AND ($1::text = 'operator' OR (p.keep_after_done_s IS NOT NULL AND a.finalized_at IS NOT NULL \
                AND a.finalized_at + p.keep_after_done_s * interval '1 second' <= clock_timestamp()))"
    )
}

/// One checkpoint record to delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Doomed {
    pub checkpoint_digest: String,
    pub assignment_id: String,
    pub lane_incarnation_id: String,
    pub generation: i64,
    pub purpose: String,
    pub handoff_id: Option<String>,
    /// A record a live generation asked for: its number.
    #[serde(default)]
    pub request_seq: Option<i32>,
    pub retention_policy_digest: String,
}

impl Doomed {
    fn from_row(r: &tokio_postgres::Row) -> Result<Self, AuthorityError> {
        Ok(Self {
            checkpoint_digest: r.col("checkpoint_digest")?,
            assignment_id: r.col("assignment_id")?,
            lane_incarnation_id: r.col("lane_incarnation_id")?,
            generation: r.col("generation")?,
            purpose: r.col("purpose")?,
            handoff_id: r.col("handoff_id")?,
            request_seq: r.col("request_seq")?,
            retention_policy_digest: r.col("retention_policy_digest")?,
        })
    }

    /// The deletion receipt's digest: every field, the reason, the scope, the objects.
    pub fn receipt_digest(&self, deletion_id: &str, reason: &str, objects: &[String]) -> String {
        let generation = self.generation.to_string();
        let mut parts: Vec<&[u8]> = vec![
            deletion_id.as_bytes(),
            self.checkpoint_digest.as_bytes(),
            self.assignment_id.as_bytes(),
            self.lane_incarnation_id.as_bytes(),
            generation.as_bytes(),
            self.purpose.as_bytes(),
            self.handoff_id.as_deref().unwrap_or("-").as_bytes(),
            self.retention_policy_digest.as_bytes(),
            reason.as_bytes(),
            b"coordinator-store",
        ];
        // Only a requested record's digest names its number (an end's or a handoff's reads
        // as it always did).
        let seq = self.request_seq.map(|n| format!("request:{n}"));
        if let Some(n) = &seq {
            parts.push(n.as_bytes());
        }
        parts.extend(objects.iter().map(|o| o.as_bytes()));
        format!(
            "sha256:{}",
            crate::util::sha256_hex("mosaic/checkpoint-deletion/v1", &parts)
        )
    }
}

impl Store {
    /// Registers `policy` (and keep-until-removed of its classification, which older
    /// records name) and makes it the active one of its classification. A declaration, not
    /// authority: every coordinator of a fleet should be configured alike.
    pub async fn register_retention(&self, policy: &RetentionPolicy) -> Result<(), AuthorityError> {
        let class = policy.classification.as_str();
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        // One coordinator at a time: two starting together see each other's choice.
        tx.execute("LOCK TABLE retention_policies IN EXCLUSIVE MODE", &[])
            .await?;
        let was: Option<String> = tx
            .query_opt(
                "SELECT policy_digest FROM retention_policies WHERE classification = $1 AND active",
                &[&class],
            )
            .await?
            .map(|r| r.col("policy_digest"))
            .transpose()?;
        if was.as_deref().is_some_and(|w| w != policy.digest()) {
            tracing::warn!(classification = class, from = ?was, to = %policy.digest(), policy = policy.name, keep_after_done_s = ?policy.keep_after_done_s,
                "the active retention policy changes with this coordinator's configuration (new records name it; existing ones keep theirs)");
        }
        for p in [
            RetentionPolicy::until_removed_for(policy.classification),
            policy.clone(),
        ] {
            let keep = p.keep_after_done_s.map(|s| s as i64);
            tx.execute(
                "INSERT INTO retention_policies (policy_digest, classification, name, keep_after_done_s) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (policy_digest) DO NOTHING",
                &[&p.digest(), &class, &p.name, &keep],
            )
            .await?;
        }
        tx.execute(
            "UPDATE retention_policies SET active = false WHERE classification = $2 AND active AND policy_digest <> $1",
            &[&policy.digest(), &class],
        )
        .await?;
        tx.execute(
            "UPDATE retention_policies SET active = true WHERE policy_digest = $1",
            &[&policy.digest()],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The checkpoint records deletable now for `reason` (of one assignment, of one
    /// digest).
    pub async fn deletable(
        &self,
        reason: &str,
        assignment_id: Option<&str>,
        digest: Option<&str>,
    ) -> Result<Vec<Doomed>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            &format!(
                "SELECT ck.checkpoint_digest, ck.assignment_id, ck.lane_incarnation_id, ck.generation, ck.purpose, \
                        ck.handoff_id, ck.request_seq, ck.retention_policy_digest {} ORDER BY ck.created_at",
                deletable_from("ck")
            ),
            &[&reason, &assignment_id, &digest],
        )
        .await?
        .iter()
        .map(Doomed::from_row)
        .collect()
    }

    /// Deletes checkpoint record `d` for `reason` (one fenced step): the record, the
    /// store's objects no other checkpoint names, and the receipt. Refused when it is no
    /// longer deletable.
    pub async fn delete_checkpoint(
        &self,
        l: &Leader,
        d: &Doomed,
        reason: &'static str,
    ) -> Result<serde_json::Value, AuthorityError> {
        const OP: &str = "checkpoint-delete";
        // Which record of its generation: a handoff's, a requested one, or its end's.
        let which = match (&d.handoff_id, d.request_seq) {
            (Some(h), _) => h.clone(),
            (None, Some(n)) => format!("request-{n}"),
            (None, None) => "end".into(),
        };
        let step = Step::new(
            OP,
            l,
            format!(
                "checkpoint-delete/{}/{}/{}",
                d.lane_incarnation_id, d.generation, which
            ),
            request_digest(
                OP,
                &[
                    &d.checkpoint_digest,
                    &d.lane_incarnation_id,
                    &d.generation.to_string(),
                    &which,
                    reason,
                ],
            ),
        )
        .about(Some(&d.assignment_id), Some(&d.lane_incarnation_id));
        let doomed = d.clone();
        let r = self
            .transition(
                &step,
                body!([doomed] |f| {
                    let id = format!("cd-{}", uuid::Uuid::new_v4().simple());
                    // Still deletable, and this very record (a handoff's, a requested one or an end's).
                    let sql = format!(
                        "DELETE FROM checkpoints ck WHERE ck.lane_incarnation_id = $4 AND ck.generation = $5 \
                           AND ck.checkpoint_digest = $3 AND ck.handoff_id IS NOT DISTINCT FROM $6 \
                           AND ck.request_seq IS NOT DISTINCT FROM $7 \
                           AND EXISTS (SELECT 1 {} AND k2.lane_incarnation_id = $4 AND k2.generation = $5 \
                                       AND k2.handoff_id IS NOT DISTINCT FROM $6 AND k2.request_seq IS NOT DISTINCT FROM $7) \
                         RETURNING ck.bundle_object, ck.base_object",
                        deletable_from("k2")
                    );
                    // The record locked first: a grant being made of it (which holds it
                    // shared) commits before the deciding statement reads the grants.
                    f.read(
                        "SELECT 1 FROM checkpoints WHERE lane_incarnation_id = $1 AND generation = $2 \
                           AND handoff_id IS NOT DISTINCT FROM $3 FOR UPDATE",
                        &[&doomed.lane_incarnation_id, &doomed.generation, &doomed.handoff_id],
                    ).await?;
                    let d = match f.cas(&sql, &[&reason, &doomed.assignment_id, &doomed.checkpoint_digest,
                        &doomed.lane_incarnation_id, &doomed.generation, &doomed.handoff_id, &doomed.request_seq]).await? {
                        Ok(d) => d,
                        Err(u) => return Err(u.reject(Category::WrongState,
                            "not deletable now: its work is not done, a grant names it, or its retention has not passed").await?),
                    };
                    let named: Vec<String> = [d.row().col::<Option<String>>("bundle_object")?, d.row().col::<Option<String>>("base_object")?]
                        .into_iter().flatten().collect();
                    // The store's objects no remaining checkpoint names.
                    let mut gone = vec![];
                    for o in &named {
                        let n = d.exec(
                            "DELETE FROM checkpoint_objects o WHERE o.object_digest = $1 \
                             AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.bundle_object = $1 OR c.base_object = $1) \
                             AND NOT EXISTS (SELECT 1 FROM harness_artifacts h WHERE h.object = $1) \
                             AND NOT EXISTS (SELECT 1 FROM checkpoint_object_proofs pr JOIN checkpoints c \
                                             ON c.lane_incarnation_id = pr.lane_incarnation_id AND c.generation = pr.generation \
                                             WHERE pr.object_digest = $1)",
                            &[o],
                        ).await?;
                        if n == 1 {
                            gone.push(o.clone());
                        }
                    }
                    let receipt = doomed.receipt_digest(&id, reason, &gone);
                    d.exec_one(
                        "INSERT INTO checkpoint_deletions (deletion_id, checkpoint_digest, assignment_id, lane_incarnation_id, generation, purpose, \
                                                          handoff_id, retention_policy_digest, reason, scope, objects_deleted, receipt_digest, request_seq) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'coordinator-store', $10, $11, $12)",
                        &[&id, &doomed.checkpoint_digest, &doomed.assignment_id, &doomed.lane_incarnation_id, &doomed.generation,
                          &doomed.purpose, &doomed.handoff_id, &doomed.retention_policy_digest, &reason, &gone, &receipt, &doomed.request_seq],
                    ).await?;
                    d.decide(json!({ "deletion_id": id, "checkpoint": doomed, "reason": reason, "scope": "coordinator-store",
                        "objects_deleted": gone, "receipt_digest": receipt }))
                }),
            )
            .await?;
        Ok(r.body)
    }

    /// The deletion receipts (of one assignment), oldest first.
    pub async fn checkpoint_deletions(
        &self,
        assignment_id: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT deletion_id, checkpoint_digest, assignment_id, lane_incarnation_id, generation, purpose, handoff_id, request_seq, \
                        retention_policy_digest, reason, scope, objects_deleted, receipt_digest, mosaic_ts(deleted_at) AS deleted_at \
                 FROM checkpoint_deletions WHERE $1::text IS NULL OR assignment_id = $1 ORDER BY deleted_at",
                &[&assignment_id],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let t = |c: &str| r.col::<String>(c);
                Ok(json!({
                    "deletion_id": t("deletion_id")?, "checkpoint_digest": t("checkpoint_digest")?,
                    "assignment_id": t("assignment_id")?, "lane_incarnation_id": t("lane_incarnation_id")?,
                    "generation": r.col::<i64>("generation")?, "purpose": t("purpose")?,
                    "handoff_id": r.col::<Option<String>>("handoff_id")?,
                    "request_seq": r.col::<Option<i32>>("request_seq")?,
                    "retention_policy_digest": t("retention_policy_digest")?, "reason": t("reason")?,
                    "scope": t("scope")?, "objects_deleted": r.col::<Vec<String>>("objects_deleted")?,
                    "receipt_digest": t("receipt_digest")?, "deleted_at": t("deleted_at")?,
                }))
            })
            .collect()
    }

    /// `mosaic checkpoint gc` (`reason` retention: what the policies let go) or `delete`
    /// (`reason` operator: the records of `digest`, of done work): each deleted in its own
    /// step; with `dry_run`, only listed.
    pub async fn checkpoint_gc(
        &self,
        l: &Leader,
        reason: &'static str,
        digest: Option<&str>,
        dry_run: bool,
    ) -> Result<serde_json::Value, AuthorityError> {
        if let Some(d) = digest {
            if !crate::protocol::envelope::is_digest(d) {
                return Err(reject(
                    "checkpoint-delete",
                    Category::BadInput,
                    "a checkpoint digest is sha256: and 64 lowercase hex digits",
                ));
            }
        }
        let doomed = self.deletable(reason, None, digest).await?;
        if let (Some(d), true) = (digest, doomed.is_empty()) {
            let exists = !self.checkpoints(None, Some(d)).await?.is_empty();
            return Err(reject(
                "checkpoint-delete",
                if exists {
                    Category::WrongState
                } else {
                    Category::NotFound
                },
                if exists {
                    format!("checkpoint {d} is of work that is not done, or an unspent grant names it: not deleted")
                } else {
                    format!("no checkpoint {d}")
                },
            ));
        }
        // A gc takes the artifacts its policies let go too (a named deletion is the
        // checkpoint's own: an artifact's digest goes by `delete_artifact`).
        let artifacts = if digest.is_none() && reason == "retention" {
            self.deletable_artifacts().await?
        } else {
            vec![]
        };
        if dry_run {
            return Ok(
                json!({ "dry_run": true, "deletable": doomed, "deletable_artifacts": artifacts }),
            );
        }
        // Each record in its own step: one that is no longer deletable (a grant made of it
        // meanwhile) is reported, and the rest go on.
        let (mut deleted, mut kept) = (vec![], vec![]);
        for d in &doomed {
            match self.delete_checkpoint(l, d, reason).await {
                Ok(r) => deleted.push(r),
                Err(e) if e.category().is_some() => {
                    kept.push(json!({ "checkpoint": d, "refused": e.to_string() }))
                }
                Err(e) => return Err(e),
            }
        }
        for d in &artifacts {
            match self.delete_artifact_record(l, d, reason).await {
                Ok(r) => deleted.push(r),
                Err(e) if e.category().is_some() => {
                    kept.push(json!({ "artifact": d, "refused": e.to_string() }))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(json!({ "deleted": deleted, "kept": kept }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_named_by_their_content_and_checked() {
        // Keep-until-removed is what every checkpoint before retention records.
        assert_eq!(
            RetentionPolicy::until_removed().digest(),
            crate::protocol::repo::retention_policy_digest()
        );
        let day = RetentionPolicy::configured(Some(86_400)).unwrap();
        assert_ne!(day.digest(), RetentionPolicy::until_removed().digest());
        assert_ne!(
            day.digest(),
            RetentionPolicy::configured(Some(86_401)).unwrap().digest()
        );
        assert!(RetentionPolicy::configured(Some(0)).is_err());
        assert!(RetentionPolicy::configured(Some(RetentionPolicy::MAX_KEEP_S + 1)).is_err());
        assert!(RetentionPolicy::configured(Some(RetentionPolicy::MAX_KEEP_S)).is_ok());
        // Artifacts' keep-until-removed is what every artifact before retention records;
        // the same time is another policy for another classification.
        let sensitive = Classification::Sensitive;
        assert_eq!(
            RetentionPolicy::until_removed_for(sensitive).digest(),
            crate::protocol::artifact::retention_policy_digest()
        );
        assert_ne!(
            RetentionPolicy::configured_for(sensitive, Some(86_400))
                .unwrap()
                .digest(),
            day.digest()
        );
        let e = RetentionPolicy::configured_for(sensitive, Some(0)).unwrap_err();
        assert!(e.starts_with("artifact_retention_s = 0"), "{e}");
    }
}
