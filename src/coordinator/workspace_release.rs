//! Releasing a host's copy of done work (migration 0023): a host asks whether it may delete
//! its workspace of an assignment and the checkpoint refs it holds of it; this allows it
//! only when the work has ended (its lifecycle is terminal: no generation of it will run
//! again) and nothing would be lost — the files the host holds are a checkpoint of that
//! work whose objects the store holds whole — and
//! records the host's word that it deleted them as the copy's deletion receipt.
//!
//! **Never:** allows a release of work that may still run, of work the host never held, or
//! of files that are in no checkpoint the store holds (the host's copy would be the only
//! one); records a deletion the host did not report.

use sha2::{Digest, Sha256};

use super::error::AuthorityError;
use super::rows::RowExt;
use super::states::Lifecycle;

/// The lifecycles whose hosts' copies may go.
const RELEASABLE: &[Lifecycle] = &[
    Lifecycle::Completed,
    Lifecycle::Failed,
    Lifecycle::Cancelled,
];
use super::store::Store;
use crate::protocol::messages::{HeldTree, ReleaseStep, ReleaseVerdict, WorkspaceRelease};

fn keep(c: &str) -> ReleaseVerdict {
    ReleaseVerdict::Keep(c.to_string())
}

/// The deletion receipt's digest: what was released, where, how it was known safe, and how
/// many refs went.
fn receipt_digest(
    assignment_id: &str,
    host_id: &str,
    seq: i32,
    held: Option<&HeldTree>,
    matched: &str,
    refs_removed: u64,
) -> String {
    let mut h = Sha256::new();
    let refs = refs_removed.to_string();
    let seq = seq.to_string();
    for part in [
        "workspace-release",
        assignment_id,
        host_id,
        seq.as_str(),
        held.map_or("-", |t| t.tree_id.as_str()),
        held.map_or("-", |t| t.checkpoint_digest.as_str()),
        matched,
        refs.as_str(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

impl Store {
    /// The answer to host `host_id`'s `m`.
    pub async fn workspace_release(
        &self,
        host_id: &str,
        m: &WorkspaceRelease,
    ) -> Result<ReleaseVerdict, AuthorityError> {
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        let a = &m.assignment_id;
        let Some(row) = tx
            .query_opt(
                "SELECT lifecycle FROM assignments WHERE assignment_id = $1 FOR SHARE",
                &[a],
            )
            .await?
        else {
            return Ok(keep("not-found"));
        };
        let lifecycle: String = row.col("lifecycle")?;
        // Done for good: completed, failed or cancelled. Quarantined work's workspace is
        // the operator's evidence (its own commits and ignored files are in no
        // checkpoint); a lifecycle this build does not know is not known to be over.
        match lifecycle.parse::<Lifecycle>() {
            Ok(l) if RELEASABLE.contains(&l) => {}
            Ok(Lifecycle::Quarantined) => return Ok(keep("quarantined")),
            _ => return Ok(keep("active")),
        }
        let held_here: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM reservations r \
                                JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
                                JOIN lanes ln ON ln.lane_id = li.lane_id \
                                WHERE r.assignment_id = $1 AND ln.host_id = $2) \
                     OR EXISTS (SELECT 1 FROM checkpoints WHERE assignment_id = $1 AND host_id = $2) AS held",
                &[a, &host_id],
            )
            .await?
            .col("held")?;
        if !held_here {
            return Ok(keep("not-owner"));
        }
        match &m.step {
            ReleaseStep::Ask { workspace } => {
                let matched = match workspace {
                    None => "none",
                    Some(w) => {
                        let stored: bool = tx
                            .query_one(
                                "SELECT EXISTS (SELECT 1 FROM checkpoints ck \
                                     JOIN checkpoint_objects b ON b.object_digest = ck.bundle_object AND b.stored_at IS NOT NULL \
                                     LEFT JOIN checkpoint_objects bo ON bo.object_digest = ck.base_object \
                                     WHERE ck.assignment_id = $1 AND ck.checkpoint_digest = $2 AND ck.tree_id = $3 \
                                       AND (ck.base_object IS NULL OR bo.stored_at IS NOT NULL)) AS stored",
                                &[a, &w.checkpoint_digest, &w.tree_id],
                            )
                            .await?
                            .col("stored")?;
                        // (A checkpoint retention deleted is not enough: its tree is not
                        // recorded, so the host's files could not be shown to be it.)
                        if !stored {
                            return Ok(keep("not-stored"));
                        }
                        "stored"
                    }
                };
                let (tree, digest) = match workspace {
                    Some(w) => (Some(&w.tree_id), Some(&w.checkpoint_digest)),
                    None => (None, None),
                };
                // The open allowance again, or a new one (a recorded release stays as it was).
                let again = tx
                    .execute(
                        "UPDATE workspace_releases SET tree_id = $3, checkpoint_digest = $4, matched = $5, authorized_at = clock_timestamp() \
                         WHERE assignment_id = $1 AND host_id = $2 AND released_at IS NULL",
                        &[a, &host_id, &tree, &digest, &matched],
                    )
                    .await?;
                if again == 0 {
                    tx.execute(
                        "INSERT INTO workspace_releases (assignment_id, host_id, release_seq, tree_id, checkpoint_digest, matched) \
                         SELECT $1, $2, coalesce(max(release_seq), 0) + 1, $3, $4, $5 FROM workspace_releases \
                         WHERE assignment_id = $1 AND host_id = $2",
                        &[a, &host_id, &tree, &digest, &matched],
                    )
                    .await?;
                }
                tx.commit().await?;
                Ok(ReleaseVerdict::Release)
            }
            ReleaseStep::Done { refs_removed } => {
                let Some(r) = tx
                    .query_opt(
                        "SELECT release_seq, tree_id, checkpoint_digest, matched FROM workspace_releases \
                         WHERE assignment_id = $1 AND host_id = $2 AND released_at IS NULL FOR UPDATE",
                        &[a, &host_id],
                    )
                    .await?
                else {
                    // Its release recorded already (the answer was lost): the same answer.
                    // Otherwise a deletion nobody allowed: not recorded as one.
                    let recorded: bool = tx
                        .query_one(
                            "SELECT EXISTS (SELECT 1 FROM workspace_releases WHERE assignment_id = $1 AND host_id = $2) AS recorded",
                            &[a, &host_id],
                        )
                        .await?
                        .col("recorded")?;
                    return Ok(if recorded {
                        ReleaseVerdict::Recorded
                    } else {
                        keep("not-released")
                    });
                };
                let seq: i32 = r.col("release_seq")?;
                let held = match (
                    r.col::<Option<String>>("tree_id")?,
                    r.col::<Option<String>>("checkpoint_digest")?,
                ) {
                    (Some(tree_id), Some(checkpoint_digest)) => Some(HeldTree {
                        tree_id,
                        checkpoint_digest,
                    }),
                    _ => None,
                };
                let matched: String = r.col("matched")?;
                let receipt =
                    receipt_digest(a, host_id, seq, held.as_ref(), &matched, *refs_removed);
                tx.execute(
                    "UPDATE workspace_releases SET released_at = clock_timestamp(), refs_removed = $3, receipt_digest = $4 \
                     WHERE assignment_id = $1 AND host_id = $2 AND release_seq = $5",
                    &[a, &host_id, &(*refs_removed as i64), &receipt, &seq],
                )
                .await?;
                tx.commit().await?;
                Ok(ReleaseVerdict::Recorded)
            }
        }
    }

    /// Hosts' copies of work released (of one assignment), oldest first.
    pub async fn workspace_releases(
        &self,
        assignment_id: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                "SELECT assignment_id, host_id, release_seq, tree_id, checkpoint_digest, matched, mosaic_ts(authorized_at) AS authorized_at, \
                        mosaic_ts(released_at) AS released_at, refs_removed, receipt_digest \
                 FROM workspace_releases WHERE $1::text IS NULL OR assignment_id = $1 ORDER BY authorized_at",
                &[&assignment_id],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let released: Option<String> = r.col("released_at")?;
                Ok(serde_json::json!({
                    "assignment_id": r.col::<String>("assignment_id")?,
                    "host_id": r.col::<String>("host_id")?,
                    "release_seq": r.col::<i32>("release_seq")?,
                    "state": if released.is_some() { "released" } else { "allowed" },
                    "tree_id": r.col::<Option<String>>("tree_id")?,
                    "checkpoint_digest": r.col::<Option<String>>("checkpoint_digest")?,
                    "matched": r.col::<String>("matched")?,
                    "authorized_at": r.col::<String>("authorized_at")?,
                    "released_at": released,
                    "refs_removed": r.col::<Option<i64>>("refs_removed")?,
                    "receipt_digest": r.col::<Option<String>>("receipt_digest")?,
                }))
            })
            .collect()
    }
}
