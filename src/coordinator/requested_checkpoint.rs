//! A checkpoint a live generation asked for (`mosaic lane checkpoint`, migration 0022): its
//! host froze the generation's cgroup, captured the workspace and reports it
//! (`checkpoint_taken` with `request_seq`); this records it — a checkpoint row of that
//! generation for the work's own recovery — in one fenced step, so the work survives the
//! loss of the host itself, once the host has uploaded it.
//!
//! **Never:** records a checkpoint for a chain that is not activated and open on that very
//! generation, of another repository than the work's, with a digest the coordinator did
//! not derive from the checkpoint's ids, or a second one under a request number.

use const_format::concatcp;
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::rows::RowExt;
use super::states::WorkStatus;
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};
use crate::protocol::repo::{retention_policy_digest, CheckpointRef, MAX_REQUESTED_CHECKPOINTS};

const OP: &str = "checkpoint-requested";

impl Store {
    /// Records checkpoint number `seq` that generation `generation` of `chain` asked for.
    pub async fn record_requested_checkpoint(
        &self,
        l: &Leader,
        chain: &Chain,
        generation: i64,
        seq: u32,
        taken: &Result<CheckpointRef, String>,
    ) -> Result<Receipt, AuthorityError> {
        let c = match taken {
            Ok(c) if c.well_formed() => c.clone(),
            Ok(_) => {
                return Err(reject(
                    OP,
                    Category::BadInput,
                    "the checkpoint's commit or tree id is not a git object id",
                ))
            }
            Err(_) => {
                return Err(reject(
                    OP,
                    Category::BadInput,
                    "a requested checkpoint is reported only once taken",
                ))
            }
        };
        if seq == 0 || seq > MAX_REQUESTED_CHECKPOINTS {
            return Err(reject(
                OP,
                Category::BadInput,
                format!("a generation asks for at most {MAX_REQUESTED_CHECKPOINTS} checkpoints"),
            ));
        }
        let digest = c.digest();
        let step = Step::new(
            OP,
            l,
            format!(
                "checkpoint-requested/{}/{generation}/{seq}",
                chain.lane_incarnation_id
            ),
            request_digest(OP, &[&chain.key(), &seq.to_string(), &digest]),
        )
        .about(Some(&chain.assignment_id), Some(&chain.lane_incarnation_id));
        let (chain, seq) = (chain.clone(), seq as i32);
        self.transition(
            &step,
            body!([chain, c, digest, seq, generation] |f| {
                // The chain open on exactly this generation, activated, of work in this
                // repository that is not offered to another lane (its workspace is held);
                // the number not yet used.
                let d = f.cas(
                    concatcp!("INSERT INTO checkpoints (checkpoint_digest, commit_id, tree_id, repository, classification, retention_policy_digest, \
                                                  purpose, assignment_id, assignment_attempt_id, lane_incarnation_id, generation, host_id, request_seq, inputs_digest) \
                     SELECT $1, $2, $3, a.repository, 'workspace', \
                            coalesce((SELECT policy_digest FROM retention_policies WHERE classification = 'workspace' AND active), $4), \
                            'same-assignment-recovery', rs.assignment_id, rs.assignment_attempt_id, rs.lane_incarnation_id, rs.generation, ln.host_id, $8, $9 \
                     FROM reservations rs \
                     JOIN assignments a ON a.assignment_id = rs.assignment_id \
                     JOIN lane_incarnations li ON li.lane_incarnation_id = rs.lane_incarnation_id \
                     JOIN lanes ln ON ln.lane_id = li.lane_id \
                     WHERE rs.reservation_id = $5 AND rs.released_at IS NULL AND rs.lane_incarnation_id = $6 AND rs.generation = $7 \
                       AND a.repository = $10 AND a.work_status <> ", WorkStatus::Handoff.sql(), " \
                       AND EXISTS (SELECT 1 FROM ack_receipts ar WHERE ar.reservation_id = rs.reservation_id) \
                       AND NOT EXISTS (SELECT 1 FROM checkpoints k WHERE k.lane_incarnation_id = rs.lane_incarnation_id \
                                       AND k.generation = rs.generation AND k.request_seq = $8) \
                     RETURNING assignment_id"),
                    &[&digest, &c.commit_id, &c.tree_id, &retention_policy_digest(), &chain.reservation_id,
                      &chain.lane_incarnation_id, &generation, &seq, &c.inputs_digest, &c.repository.as_str()],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState,
                        "not the open, activated chain of this generation's work in that repository, or that request number is taken").await?),
                };
                let asg: String = d.row().col("assignment_id")?;
                d.decide(json!({ "assignment_id": asg, "lane_incarnation_id": chain.lane_incarnation_id,
                    "generation": generation, "request_seq": seq, "checkpoint_digest": digest }))
            }),
        )
        .await
    }
}
