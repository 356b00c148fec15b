//! The follow-up writes a decided transition makes, as methods of [`Decided`]: written once,
//! so every transition that moves work to recovery, revokes leases, releases a reservation
//! or asks for a generation's stop does it the same way.
//!
//! **Never:** called before the transition's compare-and-swap decided (they exist only on
//! `Decided`), and never decide anything themselves: each applies the decision the CAS
//! made, and reports how many rows it touched.

use super::error::AuthorityError;
use super::states::{GenState, LaneState, Lifecycle};
use super::txn::Decided;

/// Which work a move to recovery applies to. Only ACTIVE work moves: work already in
/// recovery, or ended, is left as it is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RecoveryOf<'a> {
    /// One assignment, while it still runs on this lane incarnation (the ending chain is
    /// still its current one: after a handoff it is not).
    AssignmentOnLane {
        assignment: &'a str,
        lane_incarnation: &'a str,
    },
    /// One assignment, wherever it is.
    Assignment(&'a str),
    /// Every assignment of a lane incarnation that has no end requested.
    Lane(&'a str),
}

const RELEASE_RESERVATION: &str = "UPDATE reservations SET released_at = clock_timestamp() \
     WHERE reservation_id = $1 AND released_at IS NULL";

impl Decided<'_> {
    /// The work goes to RECOVERY: no execution owner, no pending target, and `next_action`
    /// as the work record's next step. Returns the assignments moved.
    pub(crate) async fn to_recovery(
        &self,
        of: RecoveryOf<'_>,
        next_action: &str,
    ) -> Result<u64, AuthorityError> {
        let (to, from) = (Lifecycle::Recovery, Lifecycle::Active);
        match of {
            RecoveryOf::AssignmentOnLane {
                assignment,
                lane_incarnation,
            } => {
                self.exec(
                    "UPDATE assignments SET lifecycle = $1, execution_owner = NULL, pending_target = NULL, next_action = $2 \
                     WHERE assignment_id = $3 AND lifecycle = $4 AND lane_incarnation_id = $5",
                    &[&to, &next_action, &assignment, &from, &lane_incarnation],
                )
                .await
            }
            RecoveryOf::Assignment(assignment) => {
                self.exec(
                    "UPDATE assignments SET lifecycle = $1, execution_owner = NULL, pending_target = NULL, next_action = $2 \
                     WHERE assignment_id = $3 AND lifecycle = $4",
                    &[&to, &next_action, &assignment, &from],
                )
                .await
            }
            RecoveryOf::Lane(lane_incarnation) => {
                self.exec(
                    "UPDATE assignments SET lifecycle = $1, execution_owner = NULL, pending_target = NULL, next_action = $2 \
                     WHERE lane_incarnation_id = $3 AND lifecycle = $4 AND requested_outcome IS NULL",
                    &[&to, &next_action, &lane_incarnation, &from],
                )
                .await
            }
        }
    }

    /// Every unreleased effect lease of `reservation` is revoked. Returns how many.
    pub(crate) async fn revoke_leases(&self, reservation: &str) -> Result<u64, AuthorityError> {
        self.exec(
            "UPDATE leases SET released_at = clock_timestamp() WHERE reservation_id = $1 AND released_at IS NULL",
            &[&reservation],
        )
        .await
    }

    /// The reservation is released (its chain can advance no further).
    pub(crate) async fn release_reservation(
        &self,
        reservation: &str,
    ) -> Result<u64, AuthorityError> {
        self.exec(RELEASE_RESERVATION, &[&reservation]).await
    }

    /// The reservation is released, and it must have been open (the compare-and-swap
    /// proved it was: anything else aborts the transition).
    pub(crate) async fn release_one(&self, reservation: &str) -> Result<(), AuthorityError> {
        self.exec_one(RELEASE_RESERVATION, &[&reservation]).await
    }

    /// The durable intent that `generation` of `lane_incarnation` be stopped (for
    /// `reason`), which the host is told until its receipt arrives. A generation already
    /// ended, or already asked to stop, is left as it is.
    pub(crate) async fn request_stop(
        &self,
        lane_incarnation: &str,
        generation: Option<i64>,
        reason: &str,
    ) -> Result<u64, AuthorityError> {
        self.exec(
            "UPDATE generations SET stop_requested_at = clock_timestamp(), stop_reason = $3 \
             WHERE lane_incarnation_id = $1 AND generation = $2 AND state <> $4 AND stop_requested_at IS NULL",
            &[&lane_incarnation, &generation, &reason, &GenState::Ended],
        )
        .await
    }

    /// A RUNNING generation's authority is taken away (an inactivity replacement, an
    /// abandoned continuation, an accepted handoff's source, an expired lease): its lane
    /// DRAINING, its leases revoked, its stop requested. Returns how many leases were
    /// revoked.
    pub(crate) async fn drain_running(
        &self,
        lane_incarnation: &str,
        reservation: &str,
        generation: Option<i64>,
        reason: &str,
    ) -> Result<u64, AuthorityError> {
        self.exec_one(
            "UPDATE lane_incarnations SET state = $2 WHERE lane_incarnation_id = $1 AND state = $3",
            &[&lane_incarnation, &LaneState::Draining, &LaneState::Running],
        )
        .await?;
        let revoked = self.revoke_leases(reservation).await?;
        self.request_stop(lane_incarnation, generation, reason)
            .await?;
        Ok(revoked)
    }
}
