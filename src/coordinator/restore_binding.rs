//! What a chain's workspace is restored from, bound into its activation (spec §6.2; migration
//! 0025). The driver decides, once per chain and before its stage is sent, which checkpoint
//! the stage restores (the work's latest, a handoff's, a grant's), in a fenced step of its
//! own; the host's `staged` is recorded only when the checkpoint it says its workspace was
//! restored from (or already equal to) is exactly that one; and the activation CAS requires
//! the two to agree. A generation that started from other files than its chain decided can
//! therefore never become RUNNING.
//!
//! **Never:** changes a chain's decided restore point, or records a `staged` whose restore
//! differs from it (a host restoring nothing when one was decided included).

use const_format::concatcp;
use serde_json::json;

use super::error::{AuthorityError, Category};
use super::leader::Leader;
use super::model::Chain;
use super::states::LaneState;
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

const OP: &str = "restore-decided";

impl Store {
    /// Records that the stage of `chain` restores checkpoint `digest`: the same again is the
    /// same receipt; another digest for the same chain is refused (`conflict`).
    pub async fn decide_restore(
        &self,
        l: &Leader,
        chain: &Chain,
        digest: &str,
    ) -> Result<Receipt, AuthorityError> {
        let step = Step::new(
            OP,
            l,
            format!("restore-decided/{}", chain.reservation_id),
            request_digest(OP, &[&chain.key(), digest]),
        )
        .about(Some(&chain.assignment_id), Some(&chain.lane_incarnation_id));
        let (chain, digest) = (chain.clone(), digest.to_string());
        self.transition(
            &step,
            body!([chain, digest] |f| {
                // The chain staging, not yet staged, with nothing decided before.
                let d = f.cas(
                    concatcp!("UPDATE reservations r SET restore_checkpoint_digest = $2 FROM lane_incarnations li \
                     WHERE r.reservation_id = $1 AND r.lane_incarnation_id = $3 AND li.lane_incarnation_id = r.lane_incarnation_id \
                       AND r.released_at IS NULL AND r.process_identity IS NULL AND r.restore_checkpoint_digest IS NULL \
                       AND li.state = ", LaneState::Staging.sql(), " RETURNING r.reservation_id"),
                    &[&chain.reservation_id, &digest, &chain.lane_incarnation_id],
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
}
