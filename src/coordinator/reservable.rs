//! Why a reservation was refused: the reserve CAS (`chain::reserve`) names its refusal
//! from the lane's row, the resumed work's row, or — for a retarget — the recovery
//! candidate's facts (`recovery::why_not`), read after the CAS matched nothing.
//!
//! **Never:** writes, or decides anything the CAS did not.

use const_format::concatcp;

use super::chain::ReserveRequest;
use super::error::{reject, AuthorityError, Category};
use super::rows::RowExt;
use super::states::{GenState, LaneState, Lifecycle};
use super::txn::Undecided;

/// Explains why a lane could not be reserved (or a retarget's candidate not consumed).
pub(crate) async fn why_not(
    u: Undecided<'_>,
    req: &ReserveRequest,
    epoch: i64,
) -> Result<AuthorityError, AuthorityError> {
    if let Some(c) = &req.recovery {
        if let Some(e) = super::recovery::why_not(u, c, &req.lane_incarnation_id, epoch).await? {
            return Ok(e);
        }
        return Ok(reject(
            "reserve",
            Category::WrongState,
            "the recovery candidate holds, but its lane or the work cannot take a fresh chain now",
        ));
    }
    let inc = &req.lane_incarnation_id;
    let row = u
        .read_opt(
            concatcp!("SELECT state, retired_at IS NOT NULL AS retired, \
                    EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = $1 AND t.reconciled_at IS NULL) AS unreconciled, \
                    EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = $1 AND g.state <> ", GenState::Ended.sql(), ") AS unended, \
                    recreate_requested_at IS NOT NULL AS recreating, host_quarantine_reason, \
                    NOT EXISTS (SELECT 1 FROM lane_incarnations li WHERE li.lane_incarnation_id = $1 AND ", super::leases::LEASE_ADMITS_WORK, ") AS lease_ended \
             FROM lane_incarnations WHERE lane_incarnation_id = $1"),
            &[inc],
        )
        .await?;
    let Some(r) = row else {
        return u
            .reject(Category::NotFound, format!("no lane incarnation {inc}"))
            .await;
    };
    if r.col::<bool>("retired")? {
        return u
            .reject(
                Category::WrongState,
                "that incarnation was retired (the lane was recreated)",
            )
            .await;
    }
    if let Some(reason) = r.col::<Option<String>>("host_quarantine_reason")? {
        return u
            .reject(
                Category::WrongState,
                format!("the host quarantined this lane: {reason}"),
            )
            .await;
    }
    if r.col::<bool>("lease_ended")? {
        return u
            .reject(
                Category::WrongState,
                "the lane's lease has ended, or is being destroyed or quarantined (an elastic lane takes work only while its lease is ACTIVE and unexpired)",
            )
            .await;
    }
    if r.col::<bool>("recreating")? {
        return u
            .reject(
                Category::WrongState,
                "the lane is being recreated by its host",
            )
            .await;
    }
    if r.col::<bool>("unreconciled")? {
        return u
            .reject(
                Category::Unreconciled,
                "a termination receipt for this lane is not reconciled yet",
            )
            .await;
    }
    if r.col::<bool>("unended")? {
        return u
            .reject(
                Category::Unreconciled,
                "a generation of this lane has not been observed to end",
            )
            .await;
    }
    let state: LaneState = r.col("state")?;
    if state != LaneState::IdleClean {
        return u
            .reject(
                Category::WrongState,
                format!("lane is {state}, not IDLE_CLEAN"),
            )
            .await;
    }
    if let Some(a) = &req.assignment_id {
        let ar = u
            .read_opt(
                "SELECT lifecycle, requested_outcome IS NOT NULL AS outcome_requested, runtime_id, scope_digest, holds_digest, completion_policy_digest \
                 FROM assignments WHERE assignment_id = $1",
                &[a],
            )
            .await?;
        let Some(ar) = ar else {
            return u
                .reject(Category::NotFound, format!("no assignment {a}"))
                .await;
        };
        let life: Lifecycle = ar.col("lifecycle")?;
        if life != Lifecycle::Recovery || ar.col::<bool>("outcome_requested")? {
            return u
                .reject(
                    Category::WrongState,
                    format!(
                        "assignment {a} is {life}; only an assignment in recovery can be resumed"
                    ),
                )
                .await;
        }
        if ar.col::<String>("runtime_id")? != req.runtime_id
            || ar.col::<String>("scope_digest")? != req.scope_digest()
            || ar.col::<String>("holds_digest")? != req.holds_digest()
            || ar.col::<String>("completion_policy_digest")? != req.policy_digest()
        {
            return u
                .reject(
                    Category::Mismatch,
                    "a resumed assignment keeps its runtime, scope, holds and completion policy",
                )
                .await;
        }
        return u
            .reject(
                Category::Unreconciled,
                "an earlier generation of this assignment has not been observed to end",
            )
            .await;
    }
    u.reject(Category::WrongState, "the lane cannot be reserved")
        .await
}
