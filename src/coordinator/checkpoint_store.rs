//! The checkpoint store (migration 0017): content-addressed objects kept in PostgreSQL in
//! parts, uploaded by the host that took a checkpoint and served to a host restoring it.
//!
//! An object's address is `sha256:` and the hex SHA-256 of its bytes. It is written one
//! part at a time, in order, under a row lock; when its last byte arrives the whole is
//! hashed and compared with its address before it is `stored` (a mismatch discards it and
//! is recorded on the checkpoint); every serve hashes it again first (a byte changed at
//! rest is refused as `corrupt`, never served).
//!
//! **Never:** accepts an upload for a checkpoint of another host, takes an object larger
//! than the configured limit, serves an object to a host whose reservation is not for an
//! assignment that checkpoint belongs to, or logs a byte of an object.

use sha2::{Digest, Sha256};

use const_format::concatcp;

use super::error::AuthorityError;
use super::rows::RowExt;
use super::states::WorkspaceEffectState;
use super::store::Store;
use crate::protocol::messages::{
    CheckpointFetch, CheckpointUpload, DataAnswer, ObjectRole, StoredVerdict, PART_BYTES,
};
use crate::protocol::repo::{object_id_ok, RestorePoint, StoredObject};

/// The store's default limit on one object (a checkpoint's bundle, or its base's).
pub const DEFAULT_MAX_OBJECT_BYTES: u64 = 256 << 20;

/// The content address of `bytes`.
pub fn object_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn refused(c: &str) -> StoredVerdict {
    StoredVerdict::Refused(c.to_string())
}

impl Store {
    /// One uploaded part: `(verdict, bytes the store holds)`.
    pub async fn checkpoint_upload(
        &self,
        host: &str,
        m: &CheckpointUpload,
        max_bytes: u64,
    ) -> Result<(StoredVerdict, u64), AuthorityError> {
        let part_ok = m.object_size > 0
            && m.offset < m.object_size
            && m.offset % PART_BYTES as u64 == 0
            && m.data.len() as u64 == (m.object_size - m.offset).min(PART_BYTES as u64)
            && m.object_digest.len() == 71
            && (m.role == ObjectRole::Base) == m.base_commit_id.is_some()
            && (m.role != ObjectRole::Artifact || m.object_digest == m.checkpoint_digest)
            && m.base_commit_id.as_deref().is_none_or(object_id_ok);
        if !part_ok {
            return Ok((refused("bad-input"), 0));
        }
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        // What the object is for: a checkpoint's slot, or a generation's artifact.
        let owner = if m.role == ObjectRole::Artifact {
            "SELECT host_id, assignment_id, artifact_digest AS checkpoint_digest, object AS slot, size \
             FROM harness_artifacts WHERE lane_incarnation_id = $1 AND generation = $2 AND artifact_digest = $3 FOR UPDATE"
        } else if m.role == ObjectRole::Bundle {
            "SELECT host_id, assignment_id, checkpoint_digest, bundle_object AS slot \
             FROM checkpoints WHERE lane_incarnation_id = $1 AND generation = $2 AND checkpoint_digest = $3 \
             ORDER BY purpose LIMIT 1 FOR UPDATE"
        } else {
            "SELECT host_id, assignment_id, checkpoint_digest, base_object AS slot \
             FROM checkpoints WHERE lane_incarnation_id = $1 AND generation = $2 AND checkpoint_digest = $3 \
             ORDER BY purpose LIMIT 1 FOR UPDATE"
        };
        let Some(row) = tx
            .query_opt(
                owner,
                &[
                    &m.lane_incarnation_id,
                    &(m.generation as i64),
                    &m.checkpoint_digest,
                ],
            )
            .await?
        else {
            // Its receipt may not be ingested yet: the host tries again later — unless it
            // was, and recorded no checkpoint (a receipt the coordinator did not take one
            // from never will).
            let ingested = tx
                .query_opt(
                    "SELECT 1 FROM termination_receipts WHERE lane_incarnation_id = $1 AND generation = $2",
                    &[&m.lane_incarnation_id, &(m.generation as i64)],
                )
                .await?
                .is_some();
            return Ok(if ingested {
                (refused("not-found"), 0)
            } else {
                (StoredVerdict::Retry("no-checkpoint".into()), 0)
            });
        };
        let (owner, asg, digest): (String, String, String) = (
            row.col("host_id")?,
            row.col("assignment_id")?,
            row.col("checkpoint_digest")?,
        );
        if owner != host {
            return Ok((refused("not-owner"), 0));
        }
        if asg != m.assignment_id || digest != m.checkpoint_digest {
            return Ok((refused("mismatch"), 0));
        }
        // An artifact is the bytes its receipt sized; and no object is ever both a
        // checkpoint's and an artifact's (a host naming its bundle as its artifact would
        // have operators "recover" a bundle, and hosts be served ciphertext).
        let artifact = m.role == ObjectRole::Artifact;
        let other_named = tx
            .query_opt(
                if artifact {
                    "SELECT 1 FROM checkpoints WHERE bundle_object = $1 OR base_object = $1 LIMIT 1"
                } else {
                    "SELECT 1 FROM harness_artifacts WHERE artifact_digest = $1 OR object = $1 LIMIT 1"
                },
                &[&m.object_digest],
            )
            .await?
            .is_some();
        let artifact_size = artifact.then(|| row.col::<i64>("size")).transpose()?;
        if other_named || artifact_size.is_some_and(|n| n as u64 != m.object_size) {
            return Ok((refused("mismatch"), 0));
        }
        // One object per role: a checkpoint whose slot is filled has its object (an upload
        // made again after a crash bundles the same commit into other bytes).
        let slot: Option<String> = row.col("slot")?;
        if let Some(have) = slot {
            let size: i64 = tx
                .query_one(
                    "SELECT size FROM checkpoint_objects WHERE object_digest = $1",
                    &[&have],
                )
                .await?
                .col("size")?;
            // A generation that ended on its handoff's checkpoint has two records of it:
            // both name what either has.
            if m.role != ObjectRole::Artifact {
                tx.execute(
                    SHARE_OBJECTS,
                    &[
                        &m.lane_incarnation_id,
                        &(m.generation as i64),
                        &m.checkpoint_digest,
                    ],
                )
                .await?;
            }
            tx.commit().await?;
            return Ok((StoredVerdict::Stored, size as u64));
        }
        if m.object_size > max_bytes {
            let why = format!(
                "its {} of {} bytes is larger than the store takes ({max_bytes} bytes): the checkpoint stays on host:{host} only",
                m.role.as_str(),
                m.object_size
            );
            transfer_error(tx, m, &why).await?;
            return Ok((refused("too-large"), 0));
        }
        // A host uploads one object at a time: whatever else of it is incomplete was
        // abandoned (its upload cut; the object made again has other bytes). At most one
        // partial object per host is ever kept; another host's partial is its own until it
        // has been left idle for five minutes.
        if m.offset == 0 {
            tx.execute(
                "DELETE FROM checkpoint_objects WHERE stored_at IS NULL AND object_digest <> $2 AND uploaded_by = $1",
                &[&host, &m.object_digest],
            )
            .await?;
        }
        tx.execute(
            "DELETE FROM checkpoint_objects WHERE object_digest = $1 AND stored_at IS NULL AND uploaded_by <> $2 \
               AND touched_at < clock_timestamp() - interval '5 minutes'",
            &[&m.object_digest, &host],
        )
        .await?;
        tx.execute(
            "INSERT INTO checkpoint_objects (object_digest, size, uploaded_by) VALUES ($1, $2, $3) \
             ON CONFLICT (object_digest) DO NOTHING",
            &[&m.object_digest, &(m.object_size as i64), &host],
        )
        .await?;
        let obj = tx
            .query_one(
                "SELECT size, received, stored_at IS NOT NULL AS stored, uploaded_by FROM checkpoint_objects \
                 WHERE object_digest = $1 FOR UPDATE",
                &[&m.object_digest],
            )
            .await?;
        let (size, mut received, stored): (i64, i64, bool) =
            (obj.col("size")?, obj.col("received")?, obj.col("stored")?);
        let uploader: String = obj.col("uploaded_by")?;
        if size as u64 != m.object_size {
            // Only a stored object's size is known to be right; either way nothing is
            // taken from this upload.
            return Ok((refused("conflict"), 0));
        }
        if stored && uploader != host {
            // Another host stored these bytes: this one names them only once it has sent
            // every part, each equal to the stored one (knowing a digest is not holding
            // the object).
            let inc_gen = (&m.lane_incarnation_id, m.generation as i64);
            tx.execute(
                "INSERT INTO checkpoint_object_proofs (object_digest, lane_incarnation_id, generation) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING",
                &[&m.object_digest, inc_gen.0, &inc_gen.1],
            )
            .await?;
            let proven: i64 = tx
                .query_one(
                    "SELECT proven FROM checkpoint_object_proofs WHERE object_digest = $1 AND lane_incarnation_id = $2 \
                       AND generation = $3 FOR UPDATE",
                    &[&m.object_digest, inc_gen.0, &inc_gen.1],
                )
                .await?
                .col("proven")?;
            if m.offset != proven as u64 {
                tx.commit().await?;
                return Ok((StoredVerdict::More, proven as u64));
            }
            let part = (m.offset / PART_BYTES as u64) as i32;
            let same = tx
                .query_opt(
                    "SELECT 1 FROM checkpoint_object_parts WHERE object_digest = $1 AND part = $2 AND data = $3",
                    &[&m.object_digest, &part, &m.data],
                )
                .await?
                .is_some();
            if !same {
                return Ok((refused("mismatch"), 0));
            }
            let proven = proven + m.data.len() as i64;
            tx.execute(
                "UPDATE checkpoint_object_proofs SET proven = $4 WHERE object_digest = $1 AND lane_incarnation_id = $2 AND generation = $3",
                &[&m.object_digest, inc_gen.0, &inc_gen.1, &proven],
            )
            .await?;
            if proven < size {
                tx.commit().await?;
                return Ok((StoredVerdict::More, proven as u64));
            }
        } else if stored {
            // Its own: named at once.
        } else if uploader != host {
            // Another host is uploading these bytes now: later.
            return Ok((StoredVerdict::Retry("busy".into()), 0));
        } else {
            if m.offset != received as u64 {
                // Not the next part (a resend, a restart): say where to go on from.
                return Ok((StoredVerdict::More, received as u64));
            }
            let part = (m.offset / PART_BYTES as u64) as i32;
            tx.execute(
                "INSERT INTO checkpoint_object_parts (object_digest, part, data) VALUES ($1, $2, $3)",
                &[&m.object_digest, &part, &m.data],
            )
            .await?;
            received += m.data.len() as i64;
            tx.execute(
                "UPDATE checkpoint_objects SET received = $2, touched_at = clock_timestamp() WHERE object_digest = $1",
                &[&m.object_digest, &received],
            )
            .await?;
            if received < size {
                tx.commit().await?;
                return Ok((StoredVerdict::More, received as u64));
            }
            if !whole_matches(&tx, &m.object_digest).await? {
                tx.execute(
                    "DELETE FROM checkpoint_objects WHERE object_digest = $1",
                    &[&m.object_digest],
                )
                .await?;
                let why = format!(
                    "the uploaded bytes of its {} do not match their digest",
                    m.role.as_str()
                );
                transfer_error(tx, m, &why).await?;
                return Ok((refused("corrupt"), 0));
            }
            tx.execute(
                "UPDATE checkpoint_objects SET stored_at = clock_timestamp() WHERE object_digest = $1",
                &[&m.object_digest],
            )
            .await?;
        }
        // The object is whole: it is the checkpoint's (a first upload names it; another
        // upload of the same checkpoint keeps the first).
        match m.role {
            ObjectRole::Bundle => {
                tx.execute(
                    "UPDATE checkpoints SET bundle_object = coalesce(bundle_object, $3), transfer_error = NULL \
                     WHERE lane_incarnation_id = $1 AND generation = $2 AND checkpoint_digest = $4",
                    &[&m.lane_incarnation_id, &(m.generation as i64), &m.object_digest, &m.checkpoint_digest],
                )
                .await?
            }
            ObjectRole::Artifact => {
                tx.execute(
                    "UPDATE harness_artifacts SET object = coalesce(object, $3), transfer_error = NULL \
                     WHERE lane_incarnation_id = $1 AND generation = $2 AND artifact_digest = $4",
                    &[&m.lane_incarnation_id, &(m.generation as i64), &m.object_digest, &m.checkpoint_digest],
                )
                .await?
            }
            ObjectRole::Base => {
                tx.execute(
                    "UPDATE checkpoints SET base_object = coalesce(base_object, $3), \
                            base_commit_id = coalesce(base_commit_id, $4) \
                     WHERE lane_incarnation_id = $1 AND generation = $2 AND checkpoint_digest = $5",
                    &[
                        &m.lane_incarnation_id,
                        &(m.generation as i64),
                        &m.object_digest,
                        &m.base_commit_id,
                        &m.checkpoint_digest,
                    ],
                )
                .await?
            }
        };
        tx.commit().await?;
        Ok((StoredVerdict::Stored, size as u64))
    }

    /// One part of an object a host's stage restores. Served only to the host of the
    /// reservation, for an assignment one of whose checkpoints is made of that object, or
    /// whose chain consumed a grant (migration 0020) of a checkpoint made of it; at
    /// offset 0 the whole object is verified first and the restore recorded.
    pub async fn checkpoint_fetch(
        &self,
        host: &str,
        m: &CheckpointFetch,
    ) -> Result<DataAnswer, AuthorityError> {
        let no = |c: &str| Ok(DataAnswer::Refused(c.to_string()));
        if m.offset % PART_BYTES as u64 != 0 {
            return no("bad-input");
        }
        let c = self.pool.get().await?;
        // A workspace effect's host reads the checkpoint it hands on (migration 0027): only
        // its own effect's, while that effect waits for its claim.
        let effect = crate::protocol::messages::effect_id_ok(&m.reservation_id);
        let sql = if effect {
            concatcp!("SELECT e.assignment_id, a.attempt_id AS assignment_attempt_id, e.host_id, \
                    (e.state <> ", WorkspaceEffectState::Requested.sql(), " OR e.claim_deadline <= clock_timestamp()) AS released, \
                    o.size, o.stored_at IS NOT NULL AS stored \
             FROM workspace_effects e \
             JOIN LATERAL (SELECT r.assignment_attempt_id AS attempt_id FROM reservations r WHERE r.assignment_id = e.assignment_id \
                           ORDER BY r.created_at DESC LIMIT 1) a ON true \
             JOIN checkpoints ck ON ck.assignment_id = e.assignment_id AND ck.checkpoint_digest = e.checkpoint_digest \
                  AND (ck.bundle_object = $2 OR ck.base_object = $2) \
             JOIN checkpoint_objects o ON o.object_digest = $2 \
             WHERE e.effect_id = $1 LIMIT 1")
        } else {
            "SELECT r.assignment_id, r.assignment_attempt_id, ln.host_id, r.released_at IS NOT NULL AS released, \
                    o.size, o.stored_at IS NOT NULL AS stored \
             FROM reservations r \
             JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
             JOIN lanes ln ON ln.lane_id = li.lane_id \
             JOIN checkpoints ck ON (ck.bundle_object = $2 OR ck.base_object = $2) \
                  AND (ck.assignment_id = r.assignment_id \
                       OR EXISTS (SELECT 1 FROM checkpoint_grants gr WHERE gr.consumed_by_reservation = r.reservation_id \
                                  AND gr.checkpoint_digest = ck.checkpoint_digest AND gr.source_assignment_id = ck.assignment_id \
                                  AND gr.source_lane_incarnation_id = ck.lane_incarnation_id AND gr.source_generation = ck.generation \
                                  AND ck.handoff_id IS NULL AND gr.deadline > clock_timestamp())) \
             JOIN checkpoint_objects o ON o.object_digest = $2 \
             WHERE r.reservation_id = $1 LIMIT 1"
        };
        let Some(r) = c
            .query_opt(sql, &[&m.reservation_id, &m.object_digest])
            .await?
        else {
            return no("not-granted");
        };
        let (asg, attempt, owner): (String, String, String) = (
            r.col("assignment_id")?,
            r.col("assignment_attempt_id")?,
            r.col("host_id")?,
        );
        if owner != host || asg != m.assignment_id || r.col::<bool>("released")? {
            return no("not-granted");
        }
        let size: i64 = r.col("size")?;
        if !r.col::<bool>("stored")? || m.offset >= size as u64 {
            return no("not-stored");
        }
        // A restore reads an object from its start: the first read of it for this
        // reservation verifies the whole and records the restore; a read past the start
        // needs that record (the fetching host verifies the whole again at its end).
        if m.offset == 0 {
            let first = c
                .execute(
                    "INSERT INTO checkpoint_restores (reservation_id, object_digest, assignment_id, assignment_attempt_id, host_id, purpose) \
                     SELECT $1, $2, $3, $4, $5, CASE WHEN $6 THEN 'workspace-effect' \
                                                     WHEN r.handoff_id IS NOT NULL THEN 'handoff' \
                                                     WHEN EXISTS (SELECT 1 FROM checkpoint_grants gr WHERE gr.consumed_by_reservation = r.reservation_id) \
                                                     THEN 'cross-assignment-recovery' ELSE 'same-assignment-recovery' END \
                     FROM (SELECT 1) one LEFT JOIN reservations r ON r.reservation_id = $1 ON CONFLICT DO NOTHING",
                    &[&m.reservation_id, &m.object_digest, &asg, &attempt, &host, &effect],
                )
                .await?
                == 1;
            if first && !whole_matches(&c, &m.object_digest).await? {
                c.execute(
                    "DELETE FROM checkpoint_restores WHERE reservation_id = $1 AND object_digest = $2",
                    &[&m.reservation_id, &m.object_digest],
                )
                .await?;
                return no("corrupt");
            }
        } else if c
            .query_opt(
                "SELECT 1 FROM checkpoint_restores WHERE reservation_id = $1 AND object_digest = $2",
                &[&m.reservation_id, &m.object_digest],
            )
            .await?
            .is_none()
        {
            return no("not-granted");
        }
        let part = (m.offset / PART_BYTES as u64) as i32;
        let Some(p) = c
            .query_opt(
                "SELECT data FROM checkpoint_object_parts WHERE object_digest = $1 AND part = $2",
                &[&m.object_digest, &part],
            )
            .await?
        else {
            return no("corrupt");
        };
        Ok(DataAnswer::Data {
            object_size: size as u64,
            data: p.col("data")?,
        })
    }

    /// What a stage of `assignment_id` restores its workspace from: the checkpoint of its
    /// latest chain that ran (by the order its reservations were made, never by when a
    /// receipt came in: a late receipt of a superseded chain is not the latest work; a
    /// chain that was never activated — a handoff target whose offer expired, a resume
    /// that failed before its ACK — changed nothing of the work, so its checkpoint is
    /// latest only when no chain ran), with the objects of it the store holds.
    pub async fn restore_point(
        &self,
        assignment_id: &str,
    ) -> Result<Option<RestorePoint>, AuthorityError> {
        // A handoff's checkpoint is its target's alone: the work's own is its generations'
        // ends (the source's end names the same tree when it held still since).
        self.point_where(
            "ck.assignment_id = $1 AND ck.handoff_id IS NULL",
            assignment_id,
        )
        .await
    }

    /// The first checkpoint `filter` (over `checkpoints ck`, `$1` = `param`) selects, in
    /// restore order: of the latest chain that ran, its latest generation; of a generation,
    /// its end, else the last one it asked for.
    pub(crate) async fn point_where(
        &self,
        filter: &str,
        param: &str,
    ) -> Result<Option<RestorePoint>, AuthorityError> {
        let c = self.pool.get().await?;
        let Some(r) = c
            .query_opt(
                &format!(
                    "SELECT ck.checkpoint_digest, ck.commit_id, ck.tree_id, ck.host_id, ck.base_commit_id, \
                        ck.base_object, bo.size AS base_size, ck.bundle_object, ko.size AS bundle_size \
                 FROM checkpoints ck \
                 LEFT JOIN checkpoint_objects bo ON bo.object_digest = ck.base_object AND bo.stored_at IS NOT NULL \
                 LEFT JOIN checkpoint_objects ko ON ko.object_digest = ck.bundle_object AND ko.stored_at IS NOT NULL \
                 JOIN generations g ON g.lane_incarnation_id = ck.lane_incarnation_id AND g.generation = ck.generation \
                 JOIN reservations rv ON rv.reservation_id = g.reservation_id \
                 WHERE {filter} \
                 ORDER BY EXISTS (SELECT 1 FROM ack_receipts ar WHERE ar.reservation_id = rv.reservation_id) DESC, \
                          rv.created_at DESC, ck.generation DESC, \
                          (ck.termination_receipt IS NOT NULL) DESC, ck.request_seq DESC NULLS LAST, ck.created_at DESC LIMIT 1"
                ),
                &[&param],
            )
            .await?
        else {
            return Ok(None);
        };
        let object = |d: &str, s: &str| -> Result<Option<StoredObject>, AuthorityError> {
            let digest: Option<String> = r.col(d)?;
            let size: Option<i64> = r.col(s)?;
            Ok(digest.zip(size).map(|(digest, size)| StoredObject {
                digest,
                size: size as u64,
            }))
        };
        Ok(Some(RestorePoint {
            checkpoint_digest: r.col("checkpoint_digest")?,
            commit_id: r.col("commit_id")?,
            tree_id: r.col("tree_id")?,
            host_id: r.col("host_id")?,
            base_commit_id: r.col("base_commit_id")?,
            base_object: object("base_object", "base_size")?,
            bundle_object: object("bundle_object", "bundle_size")?,
        }))
    }

    /// Why `assignment_id`'s work cannot start on `host_id` with its workspace, if it
    /// cannot: its workspace is elsewhere and its latest checkpoint is not in the store.
    pub async fn workspace_cannot_move(
        &self,
        assignment_id: &str,
        host_id: &str,
    ) -> Result<Option<String>, AuthorityError> {
        let Some((_, home)) = self.workspace_of(assignment_id).await? else {
            return Ok(None);
        };
        let point = self.restore_point(assignment_id).await?;
        let c = self.pool.get().await?;
        let why = match point {
            // The host that took it keeps it in its own checkpoint repository.
            Some(p) if p.host_id == host_id => None,
            Some(p) if p.bundle_object.is_some() => None,
            Some(p) => {
                let err: Option<String> = c
                    .query_opt(
                        "SELECT transfer_error FROM checkpoints WHERE checkpoint_digest = $1 AND assignment_id = $2 \
                         ORDER BY created_at DESC LIMIT 1",
                        &[&p.checkpoint_digest, &assignment_id],
                    )
                    .await?
                    .map(|r| r.col("transfer_error"))
                    .transpose()?
                    .flatten();
                Some(match err {
                    Some(e) => format!(
                        "its latest checkpoint cannot move: {e}; resume it on a lane of host:{}",
                        p.host_id
                    ),
                    None => format!(
                        "its latest checkpoint is not in the store yet (host:{} has not uploaded it); wait, or resume it on a lane of that host",
                        p.host_id
                    ),
                })
            }
            None if home == host_id => None,
            None => Some(format!(
                "its workspace is on host:{home} and it has no checkpoint to restore elsewhere; resume it on a lane of that host"
            )),
        };
        Ok(why)
    }
}

/// Every record of checkpoint `$3` of generation (`$1`, `$2`) names the objects any of them
/// has (a generation ending on its handoff's checkpoint has two records of one tree).
pub(crate) const SHARE_OBJECTS: &str = "UPDATE checkpoints s SET base_object = coalesce(s.base_object, k.base_object), \
        base_commit_id = coalesce(s.base_commit_id, k.base_commit_id), bundle_object = coalesce(s.bundle_object, k.bundle_object) \
     FROM checkpoints k WHERE s.lane_incarnation_id = $1 AND s.generation = $2 AND s.checkpoint_digest = $3 \
       AND k.lane_incarnation_id = $1 AND k.generation = $2 AND k.checkpoint_digest = $3 AND k.bundle_object IS NOT NULL \
       AND s.bundle_object IS NULL";

/// Records why `m`'s checkpoint cannot be moved, and commits.
async fn transfer_error(
    tx: deadpool_postgres::Transaction<'_>,
    m: &CheckpointUpload,
    why: &str,
) -> Result<(), AuthorityError> {
    tx.execute(
        if m.role == ObjectRole::Artifact {
            "UPDATE harness_artifacts SET transfer_error = $3 WHERE lane_incarnation_id = $1 AND generation = $2 AND artifact_digest = $4"
        } else {
            "UPDATE checkpoints SET transfer_error = $3 WHERE lane_incarnation_id = $1 AND generation = $2 AND checkpoint_digest = $4"
        },
        &[&m.lane_incarnation_id, &(m.generation as i64), &why, &m.checkpoint_digest],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Whether the parts of `digest`, in order, hash to it.
pub(super) async fn whole_matches(
    c: &impl deadpool_postgres::GenericClient,
    digest: &str,
) -> Result<bool, AuthorityError> {
    let rows = c
        .query(
            "SELECT data FROM checkpoint_object_parts WHERE object_digest = $1 ORDER BY part",
            &[&digest],
        )
        .await?;
    let mut h = Sha256::new();
    for r in &rows {
        let d: Vec<u8> = r.col("data")?;
        h.update(&d);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())) == digest)
}
