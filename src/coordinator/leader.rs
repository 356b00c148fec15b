//! Leadership (spec §5.1): one singleton row, rooted in the primary's clock.
//!
//! Acquire only when the previous lease is released or expired by database time; the
//! epoch strictly increases and is never reused (the `epochs` primary key); the new epoch
//! is bound to the holder, a credential digest and a launch id. Renewal requires the lease
//! to be strictly unexpired. A takeover dispositions every chain still before activation
//! that an older epoch started: such a lane is quarantined and its assignment moved to
//! recovery, so no old challenge, ACK or READY can activate under the new epoch.

use tokio_postgres::types::ToSql;

use super::error::{reject, AuthorityError, Category};
use super::store::Store;
use super::txn::{Receipt, LEADER_OK};

/// Proof of current leadership, as last confirmed by the database. Every mutation
/// re-checks it inside its own statement; holding a `Leader` grants nothing by itself.
#[derive(Debug, Clone)]
pub struct Leader {
    epoch: i64,
    holder: String,
    launch_id: String,
    credential_digest: String,
    sot: String,
    lease_expires_at: String,
}

impl Leader {
    pub fn epoch(&self) -> i64 {
        self.epoch
    }
    pub fn holder(&self) -> &str {
        &self.holder
    }
    pub fn sot(&self) -> &str {
        &self.sot
    }
    pub fn lease_expires_at(&self) -> &str {
        &self.lease_expires_at
    }
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.epoch,
            &self.holder,
            &self.launch_id,
            &self.credential_digest,
            &self.sot,
        ]
    }
}

/// Who is asking to lead.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub holder: String,
    /// A digest of the credential this coordinator authenticated with (never the
    /// credential itself).
    pub credential_digest: String,
    /// Unique per coordinator process start.
    pub launch_id: String,
}

const PREACTIVATION: &str =
    "('RESERVED','CHECKPOINTING','FENCED','STAGING','CONTRACT_INJECTING','AWAITING_ACK','READY')";

impl Store {
    /// Acquires (or takes over) leadership. Retrying with the same launch id after an
    /// ambiguous commit returns the existing leadership instead of a competing epoch.
    pub async fn acquire(
        &self,
        c: &Candidate,
        lease_ms: i64,
    ) -> Result<(Leader, Receipt), AuthorityError> {
        const OP: &str = "leadership-acquire";
        if c.holder.is_empty()
            || c.launch_id.is_empty()
            || c.credential_digest.is_empty()
            || !(100..=600_000).contains(&lease_ms)
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "holder, launch id and credential are required; lease 100..600000 ms",
            ));
        }
        let sot = self.ensure_sot().await?;
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "INSERT INTO leadership (sot_incarnation, epoch, released) VALUES ($1, 0, true) ON CONFLICT (singleton) DO NOTHING",
            &[&sot],
        )
        .await?;
        let row = tx
            .query_one(
                "SELECT epoch, holder, launch_id, released OR lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp(), \
                        sot_incarnation = $1 \
                 FROM leadership FOR UPDATE",
                &[&sot],
            )
            .await?;
        let (epoch, holder, launch, free, same_sot): (
            i64,
            Option<String>,
            Option<String>,
            bool,
            bool,
        ) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        if !free && holder.as_deref() == Some(&c.holder) && launch.as_deref() == Some(&c.launch_id)
        {
            // Our own earlier acquisition committed: no new epoch.
            tx.rollback().await?;
            let l = self.current_leader(c, &sot).await?;
            return Ok((l, self.acquisition_receipt(epoch).await?));
        }
        if !free {
            drop(tx);
            self.audit(
                OP,
                Category::LeadershipHeld,
                Some(epoch),
                None,
                None,
                "previous lease unexpired and not released",
            )
            .await;
            return Err(reject(
                OP,
                Category::LeadershipHeld,
                format!("epoch {epoch} holds an unexpired lease"),
            ));
        }
        let _ = same_sot;
        let new_epoch = epoch + 1;
        tx.execute("INSERT INTO epochs (epoch, sot_incarnation, holder, launch_id) VALUES ($1, $2, $3, $4)", &[&new_epoch, &sot, &c.holder, &c.launch_id])
            .await?;
        let lease = format!("{lease_ms} milliseconds");
        let exp: String = tx
            .query_one(
                "UPDATE leadership SET sot_incarnation = $1, epoch = $2, holder = $3, credential_digest = $4, launch_id = $5, \
                    acquired_at = clock_timestamp(), lease_expires_at = clock_timestamp() + $6::text::interval, released = false \
                 RETURNING mosaic_ts(lease_expires_at)",
                &[&sot, &new_epoch, &c.holder, &c.credential_digest, &c.launch_id, &lease],
            )
            .await?
            .get(0);
        // Disposition every chain an older epoch left before activation.
        let moved = tx
            .execute(
                &format!(
                    "WITH stale AS ( \
                       UPDATE lane_incarnations li SET state = 'QUARANTINED', \
                              quarantine_reason = 'leadership changed to epoch ' || $1 || ' during the activation chain' \
                       FROM reservations r \
                       WHERE li.state IN {PREACTIVATION} AND r.lane_incarnation_id = li.lane_incarnation_id \
                         AND r.released_at IS NULL AND r.coordinator_epoch < $1 \
                       RETURNING r.reservation_id, r.assignment_id) \
                     , rel AS (UPDATE reservations SET released_at = clock_timestamp() WHERE reservation_id IN (SELECT reservation_id FROM stale)) \
                     UPDATE assignments SET lifecycle = 'RECOVERY', execution_owner = NULL, \
                            next_action = 'leadership changed before activation: re-reserve on a fresh chain' \
                     WHERE assignment_id IN (SELECT assignment_id FROM stale) AND lifecycle = 'ACTIVE'"
                ),
                &[&new_epoch],
            )
            .await?;
        let l = Leader {
            epoch: new_epoch,
            holder: c.holder.clone(),
            launch_id: c.launch_id.clone(),
            credential_digest: c.credential_digest.clone(),
            sot,
            lease_expires_at: exp,
        };
        let idem = format!("leadership-acquire/{}/{}", c.holder, c.launch_id);
        let digest = super::txn::request_digest(OP, &[&c.holder, &c.launch_id]);
        let body = serde_json::json!({ "epoch": new_epoch, "holder": c.holder, "launch_id": c.launch_id,
            "lease_expires_at": l.lease_expires_at, "preactivation_chains_dispositioned": moved });
        let r = super::txn::commit_receipt(tx, OP, &l, (&idem, &digest), None, None, body).await?;
        tracing::info!(epoch = new_epoch, holder = %c.holder, "leadership acquired");
        Ok((l, r))
    }

    async fn current_leader(&self, c: &Candidate, sot: &str) -> Result<Leader, AuthorityError> {
        let client = self.pool.get().await?;
        let r = client
            .query_one(
                "SELECT epoch, mosaic_ts(lease_expires_at), credential_digest FROM leadership",
                &[],
            )
            .await?;
        let cred: Option<String> = r.get(2);
        if cred.as_deref() != Some(&c.credential_digest) {
            return Err(reject(
                "leadership-acquire",
                Category::Mismatch,
                "credential differs from the one this launch acquired with",
            ));
        }
        Ok(Leader {
            epoch: r.get(0),
            holder: c.holder.clone(),
            launch_id: c.launch_id.clone(),
            credential_digest: c.credential_digest.clone(),
            sot: sot.to_string(),
            lease_expires_at: r.get(1),
        })
    }

    async fn acquisition_receipt(&self, epoch: i64) -> Result<Receipt, AuthorityError> {
        let client = self.pool.get().await?;
        let r = client
            .query_one(
                "SELECT receipt_id, transition, sot_incarnation, coordinator_epoch, assignment_id, lane_incarnation_id, mosaic_ts(decided_at), body \
                 FROM transition_receipts WHERE transition = 'leadership-acquire' AND coordinator_epoch = $1",
                &[&epoch],
            )
            .await?;
        Ok(Receipt {
            receipt_id: r.get(0),
            transition: r.get(1),
            sot_incarnation: r.get(2),
            coordinator_epoch: r.get(3),
            assignment_id: r.get(4),
            lane_incarnation_id: r.get(5),
            decided_at: r.get(6),
            body: r.get(7),
        })
    }

    /// Extends the lease; refused unless it is strictly unexpired right now.
    pub async fn renew(&self, l: &mut Leader, lease_ms: i64) -> Result<(), AuthorityError> {
        let client = self.pool.get().await?;
        let lease = format!("{} milliseconds", lease_ms.clamp(100, 600_000));
        let mut params: Vec<&(dyn ToSql + Sync)> = l.params().to_vec();
        params.push(&lease);
        let row = client
            .query_opt(
                &format!("UPDATE leadership SET lease_expires_at = clock_timestamp() + $6::text::interval WHERE {LEADER_OK} RETURNING mosaic_ts(lease_expires_at)"),
                &params,
            )
            .await?;
        match row {
            Some(r) => {
                l.lease_expires_at = r.get(0);
                Ok(())
            }
            None => {
                self.audit(
                    "leadership-renew",
                    Category::StaleLeader,
                    Some(l.epoch),
                    None,
                    None,
                    "lease expired or taken over",
                )
                .await;
                Err(reject(
                    "leadership-renew",
                    Category::StaleLeader,
                    "lease already expired or taken over",
                ))
            }
        }
    }

    /// Gives leadership up; the next acquisition need not wait for expiry.
    pub async fn release(&self, l: &Leader) -> Result<(), AuthorityError> {
        let client = self.pool.get().await?;
        let n = client
            .execute(
                &format!("UPDATE leadership SET released = true WHERE {LEADER_OK}"),
                &l.params(),
            )
            .await?;
        if n == 1 {
            Ok(())
        } else {
            Err(reject(
                "leadership-release",
                Category::StaleLeader,
                "not the current leader",
            ))
        }
    }
}
