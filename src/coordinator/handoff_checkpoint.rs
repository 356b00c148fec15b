//! The checkpoint of a handoff of work in a repository (spec §8.1, §11): the offer holds
//! the source generation's workspace read-only, its host checkpoints it and answers
//! (`checkpoint_taken`), and this records the answer — a checkpoint row of the source
//! generation with purpose `handoff`, its digest on the handoff — in one fenced step. Only
//! then is the target staged, its workspace restored from exactly that checkpoint, and
//! its handoff ACK must bind the digest (`handoff::ACCEPT_PREDS`).
//!
//! **Never:** records a digest the coordinator did not derive from the checkpoint's ids,
//! a checkpoint of another repository than the work's, or one for an offer that is no
//! longer open on its source's open reservation; a second answer never replaces the first.

use const_format::concatcp;
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::rows::RowExt;
use super::states::HandoffState;
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};
use crate::protocol::repo::{retention_policy_digest, CheckpointRef, RestorePoint};

impl Store {
    /// The source host's answer for handoff `handoff_id`: the checkpoint of the held
    /// workspace of `source`'s generation, or why it took none (the offer then waits for
    /// its expiry: nothing moves without the checkpoint).
    pub async fn record_handoff_checkpoint(
        &self,
        l: &Leader,
        source: &Chain,
        generation: i64,
        handoff_id: &str,
        taken: &Result<CheckpointRef, String>,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "handoff-checkpoint";
        let (digest, error) = match taken {
            Ok(c) if c.well_formed() => (Some(c.digest()), None),
            Ok(_) => {
                return Err(reject(
                    OP,
                    Category::BadInput,
                    "the checkpoint's commit or tree id is not a git object id",
                ))
            }
            Err(e) => {
                let mut e: String = e.chars().filter(|c| !c.is_control()).take(400).collect();
                if e.is_empty() {
                    e = "no reason given".into();
                }
                (None, Some(e))
            }
        };
        let step = Step::new(
            OP,
            l,
            format!("handoff-checkpoint/{handoff_id}"),
            request_digest(
                OP,
                &[
                    &source.key(),
                    handoff_id,
                    digest.as_deref().unwrap_or(""),
                    error.as_deref().unwrap_or(""),
                ],
            ),
        )
        .about(
            Some(&source.assignment_id),
            Some(&source.lane_incarnation_id),
        );
        let (source, handoff, checkpoint) = (
            source.clone(),
            handoff_id.to_string(),
            taken.as_ref().ok().cloned(),
        );
        self.transition(
            &step,
            body!([source, handoff, checkpoint, digest, error] |f| {
                let repo = checkpoint.as_ref().map(|c| c.repository.as_str().to_string());
                // The work's repository must be the checkpoint's (an error names none).
                let d = f.cas(
                    concatcp!("UPDATE handoffs h SET checkpoint_digest = $4, checkpoint_error = $5 \
                     FROM reservations rs, assignments a, lane_incarnations li, lanes ln \
                     WHERE h.handoff_id = $1 AND h.state = ", HandoffState::Offered.sql(), " AND h.needs_checkpoint \
                       AND h.checkpoint_digest IS NULL AND h.checkpoint_error IS NULL \
                       AND h.source_reservation_id = $2 AND rs.reservation_id = h.source_reservation_id \
                       AND rs.released_at IS NULL AND rs.lane_incarnation_id = $3 AND rs.generation = $7 \
                       AND a.assignment_id = h.assignment_id AND ($6::text IS NULL OR a.repository = $6) \
                       AND li.lane_incarnation_id = rs.lane_incarnation_id AND ln.lane_id = li.lane_id \
                     RETURNING h.assignment_id, h.source_attempt_id, h.target_reservation_id, ln.host_id"),
                    &[&handoff, &source.reservation_id, &source.lane_incarnation_id, &digest, &error, &repo, &generation],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState,
                        "not an open handoff of this generation's work in that repository waiting for its checkpoint").await?),
                };
                let (asg, attempt, target, host): (String, String, String, String) = (d.row().col("assignment_id")?,
                    d.row().col("source_attempt_id")?, d.row().col("target_reservation_id")?, d.row().col("host_id")?);
                if let (Some(c), Some(dg)) = (&checkpoint, &digest) {
                    d.exec_one(
                        "INSERT INTO checkpoints (checkpoint_digest, commit_id, tree_id, repository, classification, retention_policy_digest, \
                                                  purpose, assignment_id, assignment_attempt_id, lane_incarnation_id, generation, host_id, handoff_id, inputs_digest) \
                         VALUES ($1, $2, $3, $4, 'workspace', \
                                 coalesce((SELECT policy_digest FROM retention_policies WHERE classification = 'workspace' AND active), $5), \
                                 'handoff', $6, $7, $8, $9, $10, $11, $12)",
                        &[dg, &c.commit_id, &c.tree_id, &c.repository.as_str(), &retention_policy_digest(), &asg, &attempt,
                          &source.lane_incarnation_id, &generation, &host, &handoff, &c.inputs_digest],
                    ).await?;
                }
                d.decide(json!({ "handoff_id": handoff, "assignment_id": asg, "target_reservation_id": target,
                    "source_lane_incarnation_id": source.lane_incarnation_id,
                    "source_generation": generation, "checkpoint_digest": digest, "checkpoint_error": error }))
            }),
        )
        .await
    }

    /// The checkpoint handoff `handoff_id` carries, with the objects of it the store holds.
    pub async fn handoff_restore_point(
        &self,
        handoff_id: &str,
    ) -> Result<Option<RestorePoint>, AuthorityError> {
        self.point_where("ck.handoff_id = $1", handoff_id).await
    }

    /// Why the store refused handoff `handoff_id`'s checkpoint for good, if it did.
    pub async fn handoff_transfer_error(
        &self,
        handoff_id: &str,
    ) -> Result<Option<String>, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query_opt(
            "SELECT transfer_error FROM checkpoints WHERE handoff_id = $1",
            &[&handoff_id],
        )
        .await?
        .map(|r| r.col::<Option<String>>("transfer_error"))
        .transpose()?
        .flatten())
    }

    /// The open target chains of withdrawn handoffs (their reservations).
    pub async fn withdrawn_targets(&self) -> Result<Vec<String>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            concatcp!("SELECT r.reservation_id FROM reservations r JOIN handoffs h ON h.handoff_id = r.handoff_id \
             WHERE h.state = ", HandoffState::Withdrawn.sql(), " AND r.released_at IS NULL"),
            &[],
        )
        .await?
        .iter()
        .map(|r| r.col("reservation_id"))
        .collect()
    }
}
