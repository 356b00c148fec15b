//! Cross-assignment checkpoint grants (migration 0020, spec §11): the only way one
//! assignment's workspace starts from another's checkpoint. A grant is made with its
//! remediation assignment (`mosaic assign --from-checkpoint`, in its reservation's
//! transaction), binds every field of §11, expires at a database-time deadline, can be
//! revoked until used, and is consumed once — by the stage of the chain of the very
//! attempt it names, on the host it names — in one fenced statement that compares every
//! bound field with what the stage presents and writes the one scoped access receipt.
//!
//! **Never:** discloses a checkpoint (a restore point, an object of the store) to another
//! assignment without a grant that chain consumed; consumes a grant twice, after its
//! deadline, after its revocation, under another leader epoch or SOT incarnation, for
//! another attempt, host, checkpoint, purpose, role, classification, field set or
//! retention policy; writes an access receipt apart from the consumption.

use serde::Serialize;
use serde_json::json;
use tokio_postgres::types::ToSql;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::model::ChainRow;
use super::rows::RowExt;
use super::store::Store;
use super::txn::{body, request_digest, Step};

/// The one purpose, role and classification a grant has today.
pub const PURPOSE: &str = "cross-assignment-recovery";
pub const ROLE: &str = "remediation";
pub const CLASSIFICATION: &str = "workspace";

/// What a grant lets its target read of the checkpoint: the workspace's tree, nothing else
/// (no harness artifact, no record of the source's generations).
pub const PERMITTED_FIELDS: &[&str] = &["workspace-tree"];

/// The digest of `PERMITTED_FIELDS`, bound into every grant.
pub fn permitted_fields_digest() -> String {
    let parts: Vec<&[u8]> = PERMITTED_FIELDS.iter().map(|f| f.as_bytes()).collect();
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/checkpoint-grant-fields/v1", &parts)
    )
}

/// How long a grant lives unless the operator says otherwise (the target's first stage
/// consumes it within a round trip).
pub const DEFAULT_GRANT_MS: i64 = 10 * 60 * 1000;

/// Every field a grant binds (§11), as the consuming stage presents it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantBinding {
    pub grant_id: String,
    pub sot_incarnation: String,
    pub coordinator_epoch: i64,
    pub source_assignment_id: String,
    pub source_attempt_id: String,
    pub source_lane_incarnation_id: String,
    pub source_generation: i64,
    pub checkpoint_digest: String,
    pub target_assignment_id: String,
    pub target_attempt_id: String,
    pub recovery_principal: String,
    pub recovery_role: String,
    pub purpose: String,
    pub classification: String,
    pub permitted_fields_digest: String,
    pub transformation_digest: Option<String>,
    pub retention_policy_digest: String,
}

impl GrantBinding {
    /// `$2`…`$18` of `CONSUME`, in order.
    pub fn params(&self) -> [&(dyn ToSql + Sync); 17] {
        [
            &self.grant_id,
            &self.sot_incarnation,
            &self.coordinator_epoch,
            &self.source_assignment_id,
            &self.source_attempt_id,
            &self.source_lane_incarnation_id,
            &self.source_generation,
            &self.checkpoint_digest,
            &self.target_assignment_id,
            &self.target_attempt_id,
            &self.recovery_principal,
            &self.recovery_role,
            &self.purpose,
            &self.classification,
            &self.permitted_fields_digest,
            &self.transformation_digest,
            &self.retention_policy_digest,
        ]
    }

    /// The access receipt's digest: every bound field, the reservation and the receipt.
    pub fn receipt_digest(&self, reservation_id: &str, receipt_id: &str) -> String {
        let epoch = self.coordinator_epoch.to_string();
        let generation = self.source_generation.to_string();
        format!(
            "sha256:{}",
            crate::util::sha256_hex(
                "mosaic/checkpoint-access-receipt/v1",
                &[
                    self.grant_id.as_bytes(),
                    self.sot_incarnation.as_bytes(),
                    epoch.as_bytes(),
                    self.source_assignment_id.as_bytes(),
                    self.source_attempt_id.as_bytes(),
                    self.source_lane_incarnation_id.as_bytes(),
                    generation.as_bytes(),
                    self.checkpoint_digest.as_bytes(),
                    self.target_assignment_id.as_bytes(),
                    self.target_attempt_id.as_bytes(),
                    self.recovery_principal.as_bytes(),
                    self.recovery_role.as_bytes(),
                    self.purpose.as_bytes(),
                    self.classification.as_bytes(),
                    self.permitted_fields_digest.as_bytes(),
                    self.transformation_digest
                        .as_deref()
                        .unwrap_or("-")
                        .as_bytes(),
                    self.retention_policy_digest.as_bytes(),
                    reservation_id.as_bytes(),
                    receipt_id.as_bytes(),
                ],
            )
        )
    }
}

/// Consumes a grant and writes its access receipt, in one statement: `$1` the consuming
/// reservation, `$2`…`$18` the presented binding (`GrantBinding::params`), `$19` the
/// receipt id, `$20` its digest. A row only when every bound field equals the presented
/// one, the grant is neither consumed nor revoked and its deadline is ahead (database
/// time), the checkpoint it names is still recorded as it was granted, and the reservation
/// is the open one of its target attempt.
pub const CONSUME: &str = "WITH g AS ( \
     UPDATE checkpoint_grants gr SET consumed_at = clock_timestamp(), consumed_by_reservation = $1 \
     WHERE gr.grant_id = $2 AND gr.consumed_at IS NULL AND gr.revoked_at IS NULL AND gr.deadline > clock_timestamp() \
       AND gr.sot_incarnation = $3 AND gr.coordinator_epoch = $4 AND gr.source_assignment_id = $5 AND gr.source_attempt_id = $6 \
       AND gr.source_lane_incarnation_id = $7 AND gr.source_generation = $8 AND gr.checkpoint_digest = $9 \
       AND gr.target_assignment_id = $10 AND gr.target_attempt_id = $11 AND gr.recovery_principal = $12 \
       AND gr.recovery_role = $13 AND gr.purpose = $14 AND gr.classification = $15 AND gr.permitted_fields_digest = $16 \
       AND gr.transformation_digest IS NOT DISTINCT FROM $17::text AND gr.retention_policy_digest = $18 \
       AND EXISTS (SELECT 1 FROM checkpoints ck WHERE ck.checkpoint_digest = gr.checkpoint_digest \
                   AND ck.assignment_id = gr.source_assignment_id AND ck.assignment_attempt_id = gr.source_attempt_id \
                   AND ck.lane_incarnation_id = gr.source_lane_incarnation_id AND ck.generation = gr.source_generation \
                   AND ck.handoff_id IS NULL AND ck.classification = gr.classification \
                   AND ck.retention_policy_digest = gr.retention_policy_digest) \
       AND EXISTS (SELECT 1 FROM reservations r JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
                   JOIN lanes ln ON ln.lane_id = li.lane_id \
                   WHERE r.reservation_id = $1 AND r.released_at IS NULL AND r.assignment_id = gr.target_assignment_id \
                     AND r.assignment_attempt_id = gr.target_attempt_id AND 'host:' || ln.host_id = gr.recovery_principal) \
     RETURNING gr.grant_id, gr.recovery_principal, gr.checkpoint_digest, gr.purpose) \
 INSERT INTO checkpoint_access_receipts (receipt_id, grant_id, reservation_id, recovery_principal, checkpoint_digest, purpose, receipt_digest) \
 SELECT $19, g.grant_id, $1, g.recovery_principal, g.checkpoint_digest, g.purpose, $20 FROM g \
 RETURNING receipt_id, mosaic_ts(accessed_at) AS accessed_at";

/// Makes the grant of a new remediation assignment, in its reservation's transaction:
/// `$1` grant id, `$2` SOT incarnation, `$3` epoch, `$4` target assignment, `$5` target
/// attempt, `$6` the target lane incarnation (its host is the principal), `$7` permitted
/// fields digest, `$8` lifetime (an interval), `$9` checkpoint digest, `$10` repository.
/// The source is the checkpoint's latest record in that repository that is not a
/// handoff's — a generation's end, or one it asked for while it ran — of another
/// assignment, held shared until the grant commits (a deletion of it waits, then sees
/// the grant); no row when there is none.
pub(crate) const CREATE: &str = "INSERT INTO checkpoint_grants (grant_id, sot_incarnation, coordinator_epoch, source_assignment_id, \
        source_attempt_id, source_lane_incarnation_id, source_generation, checkpoint_digest, target_assignment_id, target_attempt_id, \
        recovery_principal, recovery_role, purpose, classification, permitted_fields_digest, transformation_digest, retention_policy_digest, deadline) \
     SELECT $1, $2, $3, ck.assignment_id, ck.assignment_attempt_id, ck.lane_incarnation_id, ck.generation, ck.checkpoint_digest, $4, $5, \
            (SELECT 'host:' || ln.host_id FROM lane_incarnations li JOIN lanes ln ON ln.lane_id = li.lane_id WHERE li.lane_incarnation_id = $6), \
            'remediation', 'cross-assignment-recovery', ck.classification, $7, NULL, ck.retention_policy_digest, clock_timestamp() + $8::text::interval \
     FROM checkpoints ck WHERE ck.checkpoint_digest = $9 AND ck.repository = $10 AND ck.handoff_id IS NULL AND ck.assignment_id <> $4 \
     ORDER BY ck.created_at DESC LIMIT 1 FOR SHARE OF ck";

const SELECT: &str = "SELECT grant_id, sot_incarnation, coordinator_epoch, source_assignment_id, source_attempt_id, \
        source_lane_incarnation_id, source_generation, checkpoint_digest, target_assignment_id, target_attempt_id, recovery_principal, \
        recovery_role, purpose, classification, permitted_fields_digest, transformation_digest, retention_policy_digest, \
        mosaic_ts(deadline) AS deadline, mosaic_ts(created_at) AS created_at, mosaic_ts(revoked_at) AS revoked_at, \
        mosaic_ts(consumed_at) AS consumed_at, consumed_by_reservation, deadline <= clock_timestamp() AS expired, \
        (SELECT receipt_id FROM checkpoint_access_receipts k WHERE k.grant_id = checkpoint_grants.grant_id) AS access_receipt \
     FROM checkpoint_grants";

/// A grant as recorded.
#[derive(Debug, Clone, Serialize)]
pub struct GrantView {
    #[serde(flatten)]
    pub binding: GrantBinding,
    pub deadline: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
    pub consumed_at: Option<String>,
    pub consumed_by_reservation: Option<String>,
    pub expired: bool,
    pub access_receipt: Option<String>,
}

impl GrantView {
    fn from_row(r: &tokio_postgres::Row) -> Result<Self, AuthorityError> {
        Ok(Self {
            binding: GrantBinding {
                grant_id: r.col("grant_id")?,
                sot_incarnation: r.col("sot_incarnation")?,
                coordinator_epoch: r.col("coordinator_epoch")?,
                source_assignment_id: r.col("source_assignment_id")?,
                source_attempt_id: r.col("source_attempt_id")?,
                source_lane_incarnation_id: r.col("source_lane_incarnation_id")?,
                source_generation: r.col("source_generation")?,
                checkpoint_digest: r.col("checkpoint_digest")?,
                target_assignment_id: r.col("target_assignment_id")?,
                target_attempt_id: r.col("target_attempt_id")?,
                recovery_principal: r.col("recovery_principal")?,
                recovery_role: r.col("recovery_role")?,
                purpose: r.col("purpose")?,
                classification: r.col("classification")?,
                permitted_fields_digest: r.col("permitted_fields_digest")?,
                transformation_digest: r.col("transformation_digest")?,
                retention_policy_digest: r.col("retention_policy_digest")?,
            },
            deadline: r.col("deadline")?,
            created_at: r.col("created_at")?,
            revoked_at: r.col("revoked_at")?,
            consumed_at: r.col("consumed_at")?,
            consumed_by_reservation: r.col("consumed_by_reservation")?,
            expired: r.col("expired")?,
            access_receipt: r.col("access_receipt")?,
        })
    }

    /// Why it cannot be consumed now, if it cannot.
    pub fn spent(&self) -> Option<String> {
        let id = &self.binding.grant_id;
        if let Some(r) = &self.consumed_by_reservation {
            return Some(format!(
                "grant {id} was consumed by reservation {r}: it is single-use"
            ));
        }
        if self.revoked_at.is_some() {
            return Some(format!("grant {id} was revoked"));
        }
        if self.expired {
            return Some(format!("grant {id} expired at {}", self.deadline));
        }
        None
    }
}

impl Store {
    /// The grant made for attempt `attempt_id`, if any.
    pub async fn grant_of_attempt(
        &self,
        attempt_id: &str,
    ) -> Result<Option<GrantView>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(
            &format!("{SELECT} WHERE target_attempt_id = $1"),
            &[&attempt_id],
        )
        .await?
        .as_ref()
        .map(GrantView::from_row)
        .transpose()
    }

    /// Whether `assignment_id` was ever a grant's target (its workspace starts from one).
    pub async fn has_grant(&self, assignment_id: &str) -> Result<bool, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query_opt(
            "SELECT 1 FROM checkpoint_grants WHERE target_assignment_id = $1 LIMIT 1",
            &[&assignment_id],
        )
        .await?
        .is_some())
    }

    /// The recorded grants (for one assignment, as source or target), newest first.
    pub async fn grants(
        &self,
        assignment_id: Option<&str>,
    ) -> Result<Vec<GrantView>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            &format!(
                "{SELECT} WHERE $1::text IS NULL OR source_assignment_id = $1 OR target_assignment_id = $1 ORDER BY created_at DESC"
            ),
            &[&assignment_id],
        )
        .await?
        .iter()
        .map(GrantView::from_row)
        .collect()
    }

    /// Consumes grant `g` for chain `c` (one fenced step): the binding presented is the
    /// chain's own target, attempt and host, this leader's SOT incarnation and epoch, the
    /// one purpose, role, classification and field set, and the checkpoint the grant names
    /// (which must still be recorded as granted). The access receipt's id.
    pub async fn consume_grant(
        &self,
        l: &Leader,
        c: &ChainRow,
        g: &GrantView,
    ) -> Result<String, AuthorityError> {
        const OP: &str = "checkpoint-grant-consume";
        let presented = GrantBinding {
            sot_incarnation: l.sot().to_string(),
            coordinator_epoch: l.epoch(),
            target_assignment_id: c.chain.assignment_id.clone(),
            target_attempt_id: c.chain.assignment_attempt_id.clone(),
            recovery_principal: format!("host:{}", c.host_id),
            recovery_role: ROLE.into(),
            purpose: PURPOSE.into(),
            classification: CLASSIFICATION.into(),
            permitted_fields_digest: permitted_fields_digest(),
            transformation_digest: None,
            ..g.binding.clone()
        };
        let reservation = c.chain.reservation_id.clone();
        let receipt_id = format!("ca-{}", uuid::Uuid::new_v4().simple());
        let receipt_digest = presented.receipt_digest(&reservation, &receipt_id);
        let step = Step::new(
            OP,
            l,
            format!("grant-consume/{}", presented.grant_id),
            request_digest(
                OP,
                &[
                    &reservation,
                    &presented.grant_id,
                    &presented.checkpoint_digest,
                ],
            ),
        )
        .about(
            Some(&c.chain.assignment_id),
            Some(&c.chain.lane_incarnation_id),
        );
        let r = self
            .transition(
                &step,
                body!([presented, reservation, receipt_id, receipt_digest] |f| {
                    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&reservation];
                    params.extend(presented.params());
                    params.push(&receipt_id);
                    params.push(&receipt_digest);
                    let d = match f.cas(CONSUME, &params).await? {
                        Ok(d) => d,
                        Err(u) => return Err(u.reject(Category::Conflict,
                            "the grant is spent, expired or revoked, or a bound field does not hold").await?),
                    };
                    let at: String = d.row().col("accessed_at")?;
                    d.decide(json!({ "grant_id": presented.grant_id, "access_receipt": receipt_id, "receipt_digest": receipt_digest,
                        "reservation_id": reservation, "checkpoint_digest": presented.checkpoint_digest,
                        "recovery_principal": presented.recovery_principal, "accessed_at": at }))
                }),
            )
            .await?;
        Ok(r.body["access_receipt"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Revokes grant `grant_id` (only while it is neither consumed nor revoked).
    pub async fn revoke_grant(
        &self,
        l: &Leader,
        grant_id: &str,
    ) -> Result<serde_json::Value, AuthorityError> {
        const OP: &str = "checkpoint-grant-revoke";
        let step = Step::new(
            OP,
            l,
            format!("grant-revoke/{grant_id}"),
            request_digest(OP, &[grant_id]),
        );
        let grant = grant_id.to_string();
        let r = self
            .transition(
                &step,
                body!([grant] |f| {
                    let d = match f.cas(
                        "UPDATE checkpoint_grants SET revoked_at = clock_timestamp() \
                         WHERE grant_id = $1 AND revoked_at IS NULL AND consumed_at IS NULL \
                         RETURNING mosaic_ts(revoked_at) AS revoked_at, target_assignment_id",
                        &[&grant],
                    ).await? {
                        Ok(d) => d,
                        Err(u) => return Err(u.reject(Category::Conflict,
                            "no such grant, or it is already consumed or revoked").await?),
                    };
                    let (at, target): (String, String) = (d.row().col("revoked_at")?, d.row().col("target_assignment_id")?);
                    d.decide(json!({ "grant_id": grant, "revoked_at": at, "target_assignment_id": target }))
                }),
            )
            .await?;
        Ok(r.body)
    }

    /// A checkpoint an assignment in `repository` may be granted: an end checkpoint of
    /// another assignment in that repository, and where its bytes are — `(base commit,
    /// its host, stored)`. Refused (not found) otherwise.
    pub async fn grantable(
        &self,
        digest: &str,
        repository: &str,
    ) -> Result<(Option<String>, String, bool), AuthorityError> {
        const OP: &str = "assign";
        if !crate::protocol::envelope::is_digest(digest) {
            return Err(reject(
                OP,
                Category::BadInput,
                "a checkpoint digest is sha256: and 64 lowercase hex digits",
            ));
        }
        let c = self.pool.get().await?;
        let Some(r) = c
            .query_opt(
                "SELECT ck.base_commit_id, ck.host_id, ck.transfer_error, \
                        EXISTS (SELECT 1 FROM checkpoint_objects o WHERE o.object_digest = ck.bundle_object AND o.stored_at IS NOT NULL) AS stored \
                 FROM checkpoints ck WHERE ck.checkpoint_digest = $1 AND ck.repository = $2 AND ck.handoff_id IS NULL \
                 ORDER BY ck.created_at DESC LIMIT 1",
                &[&digest, &repository],
            )
            .await?
        else {
            return Err(reject(
                OP,
                Category::NotFound,
                format!("no checkpoint {digest} of work in repository {repository}"),
            ));
        };
        Ok((
            r.col("base_commit_id")?,
            r.col("host_id")?,
            r.col("stored")?,
        ))
    }
}
