//! Reading chains: every chain row is read from its reservation by `CHAIN_OF_ONE`, and
//! each reader only chooses which reservations (by id, by assignment, by generation, the
//! live ones). A read costs index probes from those reservations, never a scan of the
//! history (issue 22).
//!
//! The one narrower read is `chain_progress`, for the waiting hub: the three columns of
//! `ChainProgress` from a reservation and its lane incarnation, decoded by the same
//! `ChainProgress::from_row` as a whole chain row's.
//!
//! **Never:** writes; reads a whole chain row by any path but `CHAIN_OF_ONE`.

use const_format::concatcp;

use super::error::AuthorityError;
use super::model::{ChainProgress, ChainRow};
use super::rows::RowExt;
use super::states::{GenState, LaneState};
use super::store::Store;

/// One chain's row: the reservation `want.reservation_id` and what hangs off it. `OFFSET 0`
/// keeps the subquery whole, so the planner joins from that one reservation by index
/// probes; flattened into the outer query, its generic plan hash-joined whole tables and a
/// chain read cost O(history) (issue 22).
const CHAIN_OF_ONE: &str = "SELECT r.created_at AS reservation_created_at, li.lane_id, r.lane_incarnation_id, r.assignment_id, r.assignment_attempt_id, r.reservation_id, r.reservation_epoch, \
        ln.host_id, li.state AS lane_state, li.retired_at IS NOT NULL AS lane_retired, a.lifecycle, a.runtime_id, a.scope_digest, \
        a.holds_digest, a.completion_policy_digest, a.responsibility_owner, a.execution_owner, a.pending_target, a.requested_outcome, \
        r.reservation_lease_id, mosaic_ts(r.deadline) AS reservation_deadline, r.released_at IS NULL AS reservation_open, \
        r.coordinator_epoch AS reservation_coordinator_epoch, r.fence_salt, at.task_text, \
        r.generation, g.state AS generation_state, g.stop_requested_at IS NOT NULL AS stop_requested, g.process_identity, r.contracts_digest, \
        c.challenge_id, mosaic_ts(c.expires_at) AS challenge_expires_at, c.consumed_at IS NOT NULL AS challenge_consumed, k.ack_digest, \
        (SELECT mosaic_ts(max(t.decided_at)) FROM transition_receipts t WHERE t.assignment_id = r.assignment_id) AS last_decided_at, \
        a.repository, a.base_ref, rp.source_kind AS repository_kind, rp.source AS repository_source, \
        rp.setup_copy, rp.setup_commands, rp.setup_timeout_s \
     FROM reservations r \
     JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
     JOIN lanes ln ON ln.lane_id = li.lane_id \
     JOIN assignments a ON a.assignment_id = r.assignment_id \
     JOIN attempts at ON at.assignment_attempt_id = r.assignment_attempt_id \
     LEFT JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
     LEFT JOIN challenges c ON c.reservation_id = r.reservation_id \
     LEFT JOIN ack_receipts k ON k.challenge_id = c.challenge_id \
     LEFT JOIN repositories rp ON rp.name = a.repository \
     WHERE r.reservation_id = want.reservation_id OFFSET 0";

/// The chain rows of the reservations `keys` selects (one column), each read by
/// `CHAIN_OF_ONE`; `then` orders them (`x.reservation_created_at`).
fn chain_select(keys: &str, then: &str) -> String {
    format!("SELECT x.* FROM ({keys}) AS want(reservation_id) CROSS JOIN LATERAL ({CHAIN_OF_ONE}) x {then}")
}

impl Store {
    /// The chains of the reservations `keys` selects (see `chain_select`).
    async fn chain_query(
        &self,
        keys: &str,
        then: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<ChainRow>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c.prepare_cached(&chain_select(keys, then)).await?;
        c.query(&stmt, params)
            .await?
            .iter()
            .map(ChainRow::from_row)
            .collect()
    }

    /// The chains of `reservations` that exist (one read however many are asked for).
    pub async fn chains_by_reservations(
        &self,
        reservations: &[String],
    ) -> Result<Vec<ChainRow>, AuthorityError> {
        self.chain_query("SELECT DISTINCT unnest($1::text[])", "", &[&reservations])
            .await
    }

    /// Where each of `reservations` stands (`ChainProgress`), by reservation id: the
    /// waiting hub's read for every waiter at once.
    pub async fn chain_progress(
        &self,
        reservations: &[String],
    ) -> Result<Vec<(String, ChainProgress)>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(
                "SELECT r.reservation_id, li.state AS lane_state, r.released_at IS NULL AS reservation_open, \
                        li.retired_at IS NOT NULL AS lane_retired \
                 FROM reservations r JOIN lane_incarnations li ON li.lane_incarnation_id = r.lane_incarnation_id \
                 WHERE r.reservation_id = ANY($1)",
            )
            .await?;
        c.query(&stmt, &[&reservations])
            .await?
            .iter()
            .map(|r| Ok((r.col("reservation_id")?, ChainProgress::from_row(r)?)))
            .collect()
    }

    /// The chain of a reservation.
    pub async fn chain_by_reservation(&self, id: &str) -> Result<Option<ChainRow>, AuthorityError> {
        Ok(self.chains_by_reservations(&[id.into()]).await?.pop())
    }

    /// The latest chain of an assignment.
    pub async fn chain_of_assignment(
        &self,
        assignment_id: &str,
    ) -> Result<Option<ChainRow>, AuthorityError> {
        Ok(self
            .chain_query(
                "SELECT reservation_id FROM reservations WHERE assignment_id = $1 \
                 ORDER BY created_at DESC LIMIT 1",
                "",
                &[&assignment_id],
            )
            .await?
            .into_iter()
            .next())
    }

    /// The chains of these lane incarnations' generations, in one read.
    pub async fn chains_of_generations(
        &self,
        of: &[(String, i64)],
    ) -> Result<Vec<ChainRow>, AuthorityError> {
        let (incs, gens): (Vec<&str>, Vec<i64>) = of.iter().map(|(i, g)| (i.as_str(), *g)).unzip();
        self.chain_query(
            "SELECT DISTINCT r.reservation_id FROM unnest($1::text[], $2::int8[]) AS o(li, gen) \
             CROSS JOIN LATERAL (SELECT reservation_id FROM reservations \
                                 WHERE lane_incarnation_id = o.li AND generation = o.gen OFFSET 0) r",
            "",
            &[&incs, &gens],
        )
        .await
    }

    /// The running chains whose work is offered to another lane (`workspace_held`).
    pub async fn held_sources(&self) -> Result<Vec<ChainRow>, AuthorityError> {
        self.chain_query(
            concatcp!(
                "SELECT r.reservation_id FROM lane_incarnations li \
                 JOIN reservations r ON r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL \
                 JOIN assignments a ON a.assignment_id = r.assignment_id \
                 WHERE li.state = ",
                LaneState::Running.sql(),
                " AND a.pending_target IS NOT NULL AND a.pending_target <> li.lane_id \
                 AND r.generation IS NOT NULL"
            ),
            "ORDER BY x.reservation_created_at",
            &[],
        )
        .await
    }

    /// Every chain that still needs something: an open reservation, or a generation not
    /// yet seen to end, or any of a retiring lane's (optionally only the lanes of one host).
    /// Found per live lane incarnation through the partial indexes on open reservations
    /// and unended generations, never by scanning the history.
    pub async fn live_chains(
        &self,
        host_id: Option<&str>,
    ) -> Result<Vec<ChainRow>, AuthorityError> {
        self.chain_query(
            concatcp!(
                "SELECT DISTINCT r.reservation_id FROM lane_incarnations li JOIN lanes ln ON ln.lane_id = li.lane_id \
                 CROSS JOIN LATERAL ( \
                   SELECT reservation_id FROM reservations \
                    WHERE lane_incarnation_id = li.lane_incarnation_id AND released_at IS NULL \
                   UNION ALL SELECT rg.reservation_id FROM generations g \
                    JOIN reservations rg ON rg.lane_incarnation_id = g.lane_incarnation_id AND rg.generation = g.generation \
                    WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> ",
                GenState::Ended.sql(),
                " UNION ALL SELECT reservation_id FROM reservations \
                    WHERE lane_incarnation_id = li.lane_incarnation_id AND li.state = ",
                LaneState::Retiring.sql(),
                ") r WHERE ($1::text IS NULL OR ln.host_id = $1) AND li.retired_at IS NULL"
            ),
            "ORDER BY x.reservation_created_at",
            &[&host_id],
        )
        .await
    }
}
