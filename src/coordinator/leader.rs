//! Leadership (spec §5.1): one singleton row, rooted in the primary's clock.
//!
//! Acquire only when the previous lease is released or expired by database time; the
//! epoch strictly increases and is never reused (the `epochs` primary key); the new epoch
//! is bound to the holder, a credential digest and a launch id. Renewal requires the lease
//! to be strictly unexpired, and runs on a connection of its own. A lapsed leader takes a
//! new epoch like anyone else (its acquisition key names the epoch it acquires, so a retry
//! after an ambiguous commit finds that same acquisition and never a competing one).
//!
//! A new epoch dispositions every chain still before activation that an older epoch
//! started (spec §5.1): its assignment goes to recovery with no execution owner, its
//! reservation is released, and a staged generation is marked to be stopped — the lane
//! drains (the host is told on its next session) and returns to IDLE_CLEAN once the host's
//! receipt proves the generation ended. No old challenge, ACK or READY can activate under
//! the new epoch.

use const_format::concatcp;
use tokio_postgres::types::ToSql;

use super::error::{reject, AuthorityError, Category};
use super::rows::RowExt;
use super::states::{GenState, HandoffState, LaneState, Lifecycle};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

pub(crate) const LEADER_OK: &str = "mosaic_leader_ok($1, $2, $3, $4, $5)";

/// The leadership row's lease may be taken: given up, never granted, or expired by database
/// time (equality is expired). The pre-check, the acquisition frame's opening and its
/// compare-and-swap all test exactly this.
pub(crate) const LEASE_FREE: &str =
    "(released OR lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp())";

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

/// The disposition of every preactivation chain of an older epoch, in one statement. An open
/// handoff offer's target chain is among them: releasing it expires the offer and hands the
/// work back to its source (migration 0009), so that work is not moved to recovery.
fn disposition_sql() -> String {
    let preactivation = super::states::sql_list(super::states::PREACTIVATION);
    format!(
        "WITH stale AS ( \
           SELECT r.reservation_id, r.assignment_id, r.lane_incarnation_id, r.generation \
           FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) \
           WHERE r.released_at IS NULL AND r.coordinator_epoch < $1 AND li.state IN {preactivation} \
             AND li.retired_at IS NULL FOR UPDATE OF li), \
         lanes AS (UPDATE lane_incarnations li SET state = CASE WHEN s.generation IS NULL THEN {idle_clean} ELSE {draining} END \
                   FROM stale s WHERE li.lane_incarnation_id = s.lane_incarnation_id RETURNING 1), \
         res AS (UPDATE reservations SET released_at = clock_timestamp() WHERE reservation_id IN (SELECT reservation_id FROM stale) RETURNING 1), \
         gens AS (UPDATE generations g SET stop_requested_at = clock_timestamp(), stop_reason = 'leadership changed before activation' \
                  FROM stale s WHERE g.lane_incarnation_id = s.lane_incarnation_id AND g.generation = s.generation AND g.state <> {ended} RETURNING 1), \
         offers AS (SELECT h.handoff_id, h.assignment_id FROM handoffs h JOIN stale s ON s.reservation_id = h.target_reservation_id \
                    WHERE h.state IN ({offered}, {challenged})), \
         asg AS (UPDATE assignments SET lifecycle = {recovery}, execution_owner = NULL, pending_target = NULL, \
                        next_action = 'resume on a fresh chain: leadership changed to epoch ' || $1 || ' before activation' \
                 WHERE (assignment_id, lane_incarnation_id) IN (SELECT assignment_id, lane_incarnation_id FROM stale) \
                   AND assignment_id NOT IN (SELECT assignment_id FROM offers) \
                   AND lifecycle = {active} RETURNING 1) \
         SELECT (SELECT count(*) FROM lanes) AS lanes, (SELECT count(*) FROM gens) AS gens, (SELECT count(*) FROM asg) AS asg, \
                (SELECT count(*) FROM res) AS res, (SELECT count(*) FROM offers) AS offers, (SELECT count(*) FROM offers) AS back",
        idle_clean = LaneState::IdleClean.sql(),
        draining = LaneState::Draining.sql(),
        ended = GenState::Ended.sql(),
        offered = HandoffState::Offered.sql(),
        challenged = HandoffState::Challenged.sql(),
        recovery = Lifecycle::Recovery.sql(),
        active = Lifecycle::Active.sql()
    )
}

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
        let client = self.pool.get().await?;
        // The singleton's first row (epoch 0, released): a bootstrap, not an authority
        // change — the acquisition below replaces it like any other.
        client
            .execute(
                "INSERT INTO leadership (sot_incarnation, epoch, released) VALUES ($1, 0, true) ON CONFLICT (singleton) DO NOTHING",
                &[&sot],
            )
            .await?;
        let row = client
            .query_one(
                concatcp!(
                    "SELECT epoch, holder, launch_id, ",
                    LEASE_FREE,
                    " AS free, credential_digest FROM leadership"
                ),
                &[],
            )
            .await?;
        drop(client);
        let (epoch, holder, launch, free, cred): (
            i64,
            Option<String>,
            Option<String>,
            bool,
            Option<String>,
        ) = (
            row.col("epoch")?,
            row.col("holder")?,
            row.col("launch_id")?,
            row.col("free")?,
            row.col("credential_digest")?,
        );
        if !free && holder.as_deref() == Some(&c.holder) && launch.as_deref() == Some(&c.launch_id)
        {
            // Our own earlier acquisition committed (an ambiguous commit): no new epoch.
            if cred.as_deref() != Some(&c.credential_digest) {
                return Err(reject(
                    OP,
                    Category::Mismatch,
                    "credential differs from the one this launch acquired with",
                ));
            }
            let l = self.current_leader(c, &sot).await?;
            return Ok((l, self.acquisition_receipt(epoch).await?));
        }
        if !free {
            self.audit.record(
                OP,
                Category::LeadershipHeld,
                Some(epoch),
                None,
                None,
                "previous lease unexpired and not released",
            );
            return Err(reject(
                OP,
                Category::LeadershipHeld,
                format!("epoch {epoch} holds an unexpired lease"),
            ));
        }
        // The acquisition is a transition like every other: the frame opens only while the
        // epoch it replaces is current and free, the compare-and-swap on the leadership row
        // decides it, and its receipt and the epoch it mints commit together.
        let new_epoch = epoch + 1;
        let mut l = Leader {
            epoch: new_epoch,
            holder: c.holder.clone(),
            launch_id: c.launch_id.clone(),
            credential_digest: c.credential_digest.clone(),
            sot,
            lease_expires_at: String::new(),
        };
        let step = Step::acquisition(
            OP,
            &l,
            epoch,
            format!(
                "leadership-acquire/{}/{}/{new_epoch}",
                c.holder, c.launch_id
            ),
            request_digest(OP, &[&c.holder, &c.launch_id, &new_epoch.to_string()]),
        );
        let lease = format!("{lease_ms} milliseconds");
        let next = l.clone();
        let r = self
            .transition(
                &step,
                body!([lease, next] |f| {
                    let held = || reject(OP, Category::LeadershipHeld,
                        format!("epoch {epoch} was replaced by a concurrent acquisition, or its lease renewed"));
                    let Some(prev) = f
                        .read_opt(
                            "SELECT mosaic_ts(lease_expires_at) AS lease_expires_at, released FROM leadership WHERE epoch = $1 FOR UPDATE",
                            &[&epoch],
                        )
                        .await?
                    else {
                        return Err(held());
                    };
                    let previous_lease: Option<String> = prev.col("lease_expires_at")?;
                    // Whether the previous leader gave its lease up (a clean stop) rather
                    // than let it lapse.
                    let previous_released: bool = prev.col("released")?;
                    let d = match f
                        .cas(
                            concatcp!("UPDATE leadership SET sot_incarnation = $1, epoch = $2, holder = $3, credential_digest = $4, launch_id = $5, \
                                acquired_at = clock_timestamp(), lease_expires_at = clock_timestamp() + $6::text::interval, released = false \
                             WHERE epoch = $7 AND ", LEASE_FREE, " \
                             RETURNING mosaic_ts(lease_expires_at) AS lease_expires_at"),
                            &[&next.sot, &new_epoch, &next.holder, &next.credential_digest, &next.launch_id, &lease, &epoch],
                        )
                        .await?
                    {
                        Ok(d) => d,
                        Err(_) => return Err(held()),
                    };
                    let exp: String = d.row().col("lease_expires_at")?;
                    d.exec_one(
                        "INSERT INTO epochs (epoch, sot_incarnation, holder, launch_id) VALUES ($1, $2, $3, $4)",
                        &[&new_epoch, &next.sot, &next.holder, &next.launch_id],
                    )
                    .await?;
                    let moved = d.query_one(&disposition_sql(), &[&new_epoch]).await?;
                    let (lanes, gens, asg, res, offers, back): (i64, i64, i64, i64, i64, i64) = (
                        moved.col("lanes")?,
                        moved.col("gens")?,
                        moved.col("asg")?,
                        moved.col("res")?,
                        moved.col("offers")?,
                        moved.col("back")?,
                    );
                    d.decide(serde_json::json!({ "epoch": new_epoch, "previous_epoch": epoch,
                        "previous_lease_expires_at": previous_lease, "previous_released": previous_released,
                        "holder": next.holder, "launch_id": next.launch_id, "lease_expires_at": exp,
                        "preactivation_chains_dispositioned": { "lanes": lanes, "generations_to_stop": gens,
                            "assignments_to_recovery": asg, "reservations_released": res,
                            "handoff_offers_expired": offers, "assignments_back_with_their_source": back } }))
                }),
            )
            .await?;
        l.lease_expires_at = r.str("lease_expires_at")?;
        let moved = &r.body["preactivation_chains_dispositioned"];
        if moved["lanes"].as_i64().unwrap_or(0) > 0 {
            tracing::warn!(
                epoch = new_epoch,
                lanes = moved["lanes"].as_i64().unwrap_or(0),
                generations_to_stop = moved["generations_to_stop"].as_i64().unwrap_or(0),
                "preactivation chains of older epochs ended in recovery"
            );
        }
        tracing::info!(epoch = new_epoch, holder = %c.holder, replayed = r.replayed, "leadership acquired");
        Ok((l, r))
    }

    async fn current_leader(&self, c: &Candidate, sot: &str) -> Result<Leader, AuthorityError> {
        let client = self.pool.get().await?;
        let r = client
            .query_one(
                "SELECT epoch, mosaic_ts(lease_expires_at) AS lease_expires_at FROM leadership",
                &[],
            )
            .await?;
        Ok(Leader {
            epoch: r.col("epoch")?,
            holder: c.holder.clone(),
            launch_id: c.launch_id.clone(),
            credential_digest: c.credential_digest.clone(),
            sot: sot.to_string(),
            lease_expires_at: r.col("lease_expires_at")?,
        })
    }

    async fn acquisition_receipt(&self, epoch: i64) -> Result<Receipt, AuthorityError> {
        let client = self.pool.get().await?;
        let r = client
            .query_one(
                "SELECT receipt_id, transition, sot_incarnation, coordinator_epoch, assignment_id, lane_incarnation_id, \
                        mosaic_ts(decided_at) AS decided_at, body \
                 FROM transition_receipts WHERE transition = 'leadership-acquire' AND coordinator_epoch = $1",
                &[&epoch],
            )
            .await?;
        super::txn::Receipt::from_row(&r)
    }

    /// Extends the lease on `client` (a connection of the leadership loop's own); refused
    /// unless it is strictly unexpired right now.
    pub async fn renew_on(
        &self,
        client: &tokio_postgres::Client,
        l: &mut Leader,
        lease_ms: i64,
    ) -> Result<(), AuthorityError> {
        let lease = format!("{} milliseconds", lease_ms.clamp(100, 600_000));
        let mut params: Vec<&(dyn ToSql + Sync)> = l.params().to_vec();
        params.push(&lease);
        let row = client
            .query_opt(
                &format!("UPDATE leadership SET lease_expires_at = clock_timestamp() + $6::text::interval WHERE {LEADER_OK} RETURNING mosaic_ts(lease_expires_at) AS lease_expires_at"),
                &params,
            )
            .await?;
        match row {
            Some(r) => {
                l.lease_expires_at = r.col("lease_expires_at")?;
                Ok(())
            }
            None => {
                self.audit.record(
                    "leadership-renew",
                    Category::StaleLeader,
                    Some(l.epoch),
                    None,
                    None,
                    "lease expired or taken over",
                );
                Err(reject(
                    "leadership-renew",
                    Category::StaleLeader,
                    "lease already expired or taken over",
                ))
            }
        }
    }

    /// Extends the lease on a pooled connection (tests; the daemon uses `renew_on`).
    pub async fn renew(&self, l: &mut Leader, lease_ms: i64) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        self.renew_on(&c, l, lease_ms).await
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

    /// The leadership row as it stands (for status and standbys).
    pub async fn leadership(&self) -> Result<LeadershipView, AuthorityError> {
        let c = self.pool.get().await?;
        let r = c
            .query_opt(
                "SELECT epoch, holder, mosaic_ts(lease_expires_at) AS lease_expires_at, \
                        released OR lease_expires_at <= clock_timestamp() AS vacant FROM leadership",
                &[],
            )
            .await?;
        Ok(match r {
            None => LeadershipView {
                epoch: 0,
                holder: None,
                lease_expires_at: None,
                vacant: true,
            },
            Some(r) => LeadershipView {
                epoch: r.col("epoch")?,
                holder: r.col("holder")?,
                lease_expires_at: r.col("lease_expires_at")?,
                vacant: r.col::<Option<bool>>("vacant")?.unwrap_or(true),
            },
        })
    }
}

/// The leadership row, read-only.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LeadershipView {
    pub epoch: i64,
    pub holder: Option<String>,
    pub lease_expires_at: Option<String>,
    /// Released or expired: the next candidate may take it.
    pub vacant: bool,
}
