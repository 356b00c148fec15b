//! Helpers every authority transition uses, in this order inside one transaction:
//! `lock_leader` (blocks takeover until commit) → `replay` (idempotency) → the
//! transition's own compare-and-swap → `commit_receipt` (receipt + idempotency row +
//! a final leadership check at commit time).

use deadpool_postgres::{Object, Transaction};
use serde::Serialize;
use tokio_postgres::types::ToSql;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;

/// The durable receipt of one authority transition.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Receipt {
    pub receipt_id: String,
    pub transition: String,
    pub sot_incarnation: String,
    pub coordinator_epoch: i64,
    pub assignment_id: Option<String>,
    pub lane_incarnation_id: Option<String>,
    pub decided_at: String,
    pub body: serde_json::Value,
}

pub(crate) const LEADER_OK: &str = "mosaic_leader_ok($1, $2, $3, $4, $5)";

/// Whether `l` still leads (used to explain a failed compare-and-swap).
pub(crate) async fn leader_ok(tx: &Transaction<'_>, l: &Leader) -> Result<bool, AuthorityError> {
    Ok(tx
        .query_one(&format!("SELECT {LEADER_OK}"), &l.params())
        .await?
        .get(0))
}

/// Takes a share lock on the leadership row (a takeover must wait for this transaction)
/// and checks the caller is the current, unexpired leader on the current timeline.
pub(crate) async fn lock_leader(
    tx: &Transaction<'_>,
    op: &'static str,
    l: &Leader,
) -> Result<(), AuthorityError> {
    let ok = tx
        .query_opt(
            &format!("SELECT 1 FROM leadership WHERE {LEADER_OK} FOR SHARE"),
            &l.params(),
        )
        .await?
        .is_some();
    if ok {
        Ok(())
    } else {
        Err(reject(
            op,
            Category::StaleLeader,
            format!(
                "epoch {} is not the current unexpired leadership",
                l.epoch()
            ),
        ))
    }
}

/// Digest of a request for idempotency comparison.
pub(crate) fn request_digest(op: &str, parts: &[&str]) -> String {
    let bytes: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
    crate::util::sha256_hex(&format!("mosaic/request/{op}"), &bytes)
}

/// Same key + same request → the original receipt; same key + other request → refused.
pub(crate) async fn replay(
    tx: &Transaction<'_>,
    op: &'static str,
    key: &str,
    digest: &str,
) -> Result<Option<Receipt>, AuthorityError> {
    let row = tx
        .query_opt(
            "SELECT i.operation, i.request_digest, r.receipt_id, r.transition, r.sot_incarnation, r.coordinator_epoch, \
                    r.assignment_id, r.lane_incarnation_id, mosaic_ts(r.decided_at), r.body \
             FROM idempotency i JOIN transition_receipts r USING (receipt_id) WHERE i.idempotency_key = $1",
            &[&key],
        )
        .await?;
    let Some(r) = row else { return Ok(None) };
    let (rop, rdig): (String, String) = (r.get(0), r.get(1));
    if rop != op || rdig != digest {
        return Err(reject(
            op,
            Category::IdempotencyConflict,
            "idempotency key already used for a different request",
        ));
    }
    Ok(Some(Receipt {
        receipt_id: r.get(2),
        transition: r.get(3),
        sot_incarnation: r.get(4),
        coordinator_epoch: r.get(5),
        assignment_id: r.get(6),
        lane_incarnation_id: r.get(7),
        decided_at: r.get(8),
        body: r.get(9),
    }))
}

/// Writes the transition receipt and idempotency row, re-checks leadership at commit
/// time, and commits. Nothing is reported as done before the commit returns.
pub(crate) async fn commit_receipt(
    tx: Transaction<'_>,
    op: &'static str,
    l: &Leader,
    idempotency: (&str, &str),
    assignment: Option<&str>,
    lane_incarnation: Option<&str>,
    body: serde_json::Value,
) -> Result<Receipt, AuthorityError> {
    let id = format!("tr-{}", uuid::Uuid::new_v4().simple());
    let row = tx
        .query_one(
            "INSERT INTO transition_receipts (receipt_id, transition, sot_incarnation, coordinator_epoch, assignment_id, lane_incarnation_id, body) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING mosaic_ts(decided_at)",
            &[&id, &op, &l.sot(), &l.epoch(), &assignment, &lane_incarnation, &body],
        )
        .await?;
    tx.execute(
        "INSERT INTO idempotency (idempotency_key, operation, request_digest, receipt_id) VALUES ($1, $2, $3, $4)",
        &[&idempotency.0, &op, &idempotency.1, &id],
    )
    .await?;
    // Leadership must still hold at the decisive moment, not only when we began.
    let still: bool = tx
        .query_one(&format!("SELECT {LEADER_OK}"), &l.params())
        .await?
        .get(0);
    if !still {
        return Err(reject(
            op,
            Category::StaleLeader,
            "leadership lease expired before commit",
        ));
    }
    tx.commit().await?;
    Ok(Receipt {
        receipt_id: id,
        transition: op.to_string(),
        sot_incarnation: l.sot().to_string(),
        coordinator_epoch: l.epoch(),
        assignment_id: assignment.map(String::from),
        lane_incarnation_id: lane_incarnation.map(String::from),
        decided_at: row.get(0),
        body,
    })
}

/// A transition's opening: either the original receipt (an idempotent retry), or a fresh
/// transaction holding the leadership share lock.
pub(crate) enum Began<'c> {
    Replayed(Receipt),
    Fresh(Transaction<'c>),
}

pub(crate) async fn begin<'c>(
    c: &'c mut Object,
    op: &'static str,
    l: &Leader,
    key: &str,
    digest: &str,
) -> Result<Began<'c>, AuthorityError> {
    if key.is_empty() {
        return Err(reject(
            op,
            Category::BadInput,
            "an idempotency key is required",
        ));
    }
    let tx = c.transaction().await?;
    lock_leader(&tx, op, l).await?;
    match replay(&tx, op, key, digest).await? {
        Some(r) => Ok(Began::Replayed(r)),
        None => Ok(Began::Fresh(tx)),
    }
}

/// Statement parameters: `$1..$5` are always the leadership tuple, then `rest`.
pub(crate) fn leader_params<'a>(
    l: &'a Leader,
    rest: &[&'a (dyn ToSql + Sync)],
) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut v: Vec<&(dyn ToSql + Sync)> = l.params().to_vec();
    v.extend_from_slice(rest);
    v
}
