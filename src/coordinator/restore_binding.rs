//! What a chain's workspace is restored from, bound into its activation (spec §6.2;
//! migration 0025). The driver decides, once per chain and before its first stage
//! leaves, what the stage restores — a checkpoint (the work's latest, a handoff's, a
//! grant's) or nothing (a fresh clone) — in a fenced step of its own, and every resend sends
//! that very point; the host's `staged` is recorded only when the checkpoint it says its
//! workspace was restored from (or kept as equal to) is exactly that one; and the
//! activation CAS requires the two to agree. A generation that started from other files
//! than its chain decided can therefore never become RUNNING.
//!
//! **Never:** changes a chain's decided restore, or records a `staged` whose restore
//! differs from it (a host restoring nothing when one was decided included).

use const_format::concatcp;
use serde_json::json;

use super::error::{AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::rows::RowExt;
use super::states::LaneState;
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};
use crate::protocol::repo::RestorePoint;

const OP: &str = "restore-decided";

impl Store {
    /// Records that the stage of `chain` restores `point` (`None`: a fresh clone): the same
    /// again is the same receipt; anything else for the same chain is refused (an
    /// idempotency conflict).
    pub async fn decide_restore(
        &self,
        l: &Leader,
        chain: &Chain,
        point: Option<&RestorePoint>,
    ) -> Result<Receipt, AuthorityError> {
        let digest = point.map(|p| p.checkpoint_digest.clone());
        let point_json = point.map(serde_json::to_string).transpose().map_err(|e| {
            AuthorityError::Invariant {
                op: OP,
                detail: format!("a restore point that does not serialize: {e}"),
            }
        })?;
        let step = Step::new(
            OP,
            l,
            format!("restore-decided/{}", chain.reservation_id),
            request_digest(OP, &[&chain.key(), digest.as_deref().unwrap_or("-")]),
        )
        .about(Some(&chain.assignment_id), Some(&chain.lane_incarnation_id));
        let chain = chain.clone();
        self.transition(
            &step,
            body!([chain, digest, point_json] |f| {
                // The chain staging, not yet staged, with nothing decided before.
                let d = f.cas(
                    concatcp!("UPDATE reservations r SET restore_decided_at = clock_timestamp(), restore_checkpoint_digest = $2, \
                                                     restore_point = $4::text::jsonb FROM lane_incarnations li \
                     WHERE r.reservation_id = $1 AND r.lane_incarnation_id = $3 AND li.lane_incarnation_id = r.lane_incarnation_id \
                       AND r.released_at IS NULL AND r.process_identity IS NULL AND r.restore_decided_at IS NULL \
                       AND li.state = ", LaneState::Staging.sql(), " RETURNING r.reservation_id"),
                    &[&chain.reservation_id, &digest, &chain.lane_incarnation_id, &point_json],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState,
                        "not a staging chain whose restore is undecided").await?),
                };
                d.decide(json!({ "chain": chain, "restore_checkpoint_digest": digest }))
            }),
        )
        .await
    }

    /// What the stage of reservation `reservation_id` was decided to restore: `None` if
    /// nothing was decided yet, `Some(None)` for a fresh clone.
    pub async fn decided_restore(
        &self,
        reservation_id: &str,
    ) -> Result<Option<Option<RestorePoint>>, AuthorityError> {
        let c = self.pool.get().await?;
        let Some(r) = c
            .query_opt(
                "SELECT restore_decided_at IS NOT NULL AS decided, restore_point::text AS point \
                 FROM reservations WHERE reservation_id = $1",
                &[&reservation_id],
            )
            .await?
        else {
            return Ok(None);
        };
        if !r.col::<bool>("decided")? {
            return Ok(None);
        }
        let point = r
            .col::<Option<String>>("point")?
            .map(|p| serde_json::from_str::<RestorePoint>(&p))
            .transpose()
            .map_err(|e| AuthorityError::Invariant {
                op: OP,
                detail: format!("a recorded restore point that does not read back: {e}"),
            })?;
        Ok(Some(point))
    }
}
