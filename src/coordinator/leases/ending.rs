//! How a lease ends (spec §13): the TTL worker's destruction by one CAS over the snapshot
//! it decided on, an operator's end, and the quarantine of a collision or of a lane its
//! host did not make in time.

use std::sync::LazyLock;

use const_format::concatcp;
use serde_json::json;

use super::{CLOSE_INCARNATION, LOCK_INCARNATION, LOCK_LEASE};
use crate::coordinator::cas::{self, Pred};
use crate::coordinator::error::{reject, AuthorityError, Category};
use crate::coordinator::rows::RowExt;
use crate::coordinator::states::{LaneState, LeaseState};
use crate::coordinator::txn::{body, request_digest, Receipt, Step};
use crate::coordinator::{Leader, Store};

/// The states an operator may end a lease from.
const ENDING: &str = concatcp!(
    "(",
    LeaseState::Requested.sql(),
    ", ",
    LeaseState::Active.sql(),
    ", ",
    LeaseState::Quarantined.sql(),
    ")"
);

/// Everything a destruction is decided on, read by the TTL worker. `decide_destroy`
/// compares each field again inside its CAS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestroySnapshot {
    pub lease_id: String,
    pub lease_epoch: i64,
    pub token_salt: String,
    pub token_proof: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    /// The incarnation's generation counter: a generation started since moves it.
    pub next_generation: i64,
    /// The coordinator epoch that made or last renewed the lease.
    pub owner_epoch: i64,
    pub destroy_key: String,
}

/// The destroy CAS's expected values, in diagnosis order. Parameters: $1 lease, $2 token
/// proof, $3 lease epoch, $4 lane, $5 incarnation, $6 generation counter, $7 owner epoch
/// ($8, the deciding epoch, is written by the CAS).
const DESTROY_PREDS: &[Pred] = &[
    Pred {
        sql: concatcp!("ll.state = ", LeaseState::Active.sql()),
        category: Category::WrongState,
        detail: "the lease is not ACTIVE",
    },
    Pred {
        sql: "ll.token_proof = $2",
        category: Category::Mismatch,
        detail: "the ownership proof is not the lease's",
    },
    Pred {
        sql: "ll.lane_id = $4 AND ll.lane_incarnation_id = $5",
        category: Category::Mismatch,
        detail: "the lane or its incarnation is not the lease's",
    },
    Pred {
        sql: "ll.lease_epoch = $3",
        category: Category::Conflict,
        detail: "the lease was renewed after the destruction was decided",
    },
    Pred {
        sql: "ll.owner_epoch = $7",
        category: Category::Conflict,
        detail: "the lease's owner epoch changed after the destruction was decided",
    },
    Pred {
        sql: "ll.renew_deadline <= clock_timestamp() OR ll.max_deadline <= clock_timestamp()",
        category: Category::WrongState,
        detail: "the lease has not expired (database time)",
    },
    Pred {
        sql: "li.retired_at IS NULL AND li.lane_id = $4",
        category: Category::Mismatch,
        detail: "the lease's incarnation is retired or not its lane's",
    },
    Pred {
        sql: "li.next_generation = $6",
        category: Category::Conflict,
        detail: "a generation started on the lane after the destruction was decided",
    },
    Pred {
        sql: concatcp!(
            "li.state = ",
            LaneState::IdleClean.sql(),
            " AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL)"
        ),
        category: Category::WrongState,
        detail: "the lane holds work",
    },
];

static DESTROY_CAS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE lane_leases ll SET state = {destroying}, destroy_next_generation = $6, \
                destroy_decided_at = clock_timestamp(), destroy_epoch = $8 \
         FROM lane_incarnations li \
         WHERE ll.lease_id = $1 AND li.lane_incarnation_id = ll.lane_incarnation_id AND {} \
         RETURNING ll.lane_id, ll.lane_incarnation_id",
        cas::conjunction(DESTROY_PREDS),
        destroying = LeaseState::Destroying.sql()
    )
});

static DESTROY_DIAGNOSIS: LazyLock<String> = LazyLock::new(|| {
    cas::diagnosis(
        DESTROY_PREDS,
        "FROM lane_leases ll LEFT JOIN lane_incarnations li ON li.lane_incarnation_id = ll.lane_incarnation_id \
         WHERE ll.lease_id = $1",
    )
});

const QUARANTINE_CAS: &str = concatcp!(
    "UPDATE lane_leases SET state = ",
    LeaseState::Quarantined.sql(),
    ", quarantine_reason = $2 WHERE lease_id = $1 AND state NOT IN (",
    LeaseState::Destroyed.sql(),
    ", ",
    LeaseState::Quarantined.sql(),
    ", ",
    LeaseState::Destroying.sql(),
    ") RETURNING lane_id, lane_incarnation_id"
);

impl Store {
    /// What the TTL worker decides on: every `ACTIVE` lease past its deadline whose lane
    /// is idle, with the fields `decide_destroy` compares.
    pub async fn due_leases(&self) -> Result<Vec<DestroySnapshot>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                concatcp!("SELECT ll.lease_id, ll.lease_epoch, ll.token_salt, ll.token_proof, ll.lane_id, ll.lane_incarnation_id, \
                        li.next_generation, ll.owner_epoch, ll.destroy_key \
                 FROM lane_leases ll JOIN lane_incarnations li ON li.lane_incarnation_id = ll.lane_incarnation_id \
                 WHERE ll.state = ", LeaseState::Active.sql(), " \
                   AND (ll.renew_deadline <= clock_timestamp() OR ll.max_deadline <= clock_timestamp()) \
                   AND li.state = ", LaneState::IdleClean.sql(), " \
                   AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL) \
                 ORDER BY ll.renew_deadline"),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DestroySnapshot {
                    lease_id: r.col("lease_id")?,
                    lease_epoch: r.col("lease_epoch")?,
                    token_salt: r.col("token_salt")?,
                    token_proof: r.col("token_proof")?,
                    lane_id: r.col("lane_id")?,
                    lane_incarnation_id: r.col("lane_incarnation_id")?,
                    next_generation: r.col("next_generation")?,
                    owner_epoch: r.col("owner_epoch")?,
                    destroy_key: r.col("destroy_key")?,
                })
            })
            .collect()
    }

    /// The TTL destruction: the lease `DESTROYING` by one CAS comparing every field of
    /// `snap` (the token derived here and checked against the proof in constant time
    /// first). Its idempotency key is the lease's destruction key at that lease epoch.
    pub async fn decide_destroy(
        &self,
        l: &Leader,
        snap: &DestroySnapshot,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "lane-lease-destroy";
        let token = self
            .secret
            .ownership_token(&snap.lease_id, &snap.token_salt);
        if !self.secret.ownership_matches(&token, &snap.token_proof) {
            return Err(reject(
                OP,
                Category::Mismatch,
                "the ownership token does not prove the lease's ownership",
            ));
        }
        let proof = self.secret.ownership_proof(&token);
        drop(token);
        let step = Step::new(
            OP,
            l,
            format!("{}@{}", snap.destroy_key, snap.lease_epoch),
            request_digest(
                OP,
                &[
                    &snap.lease_id,
                    &snap.lane_id,
                    &snap.lane_incarnation_id,
                    &snap.lease_epoch.to_string(),
                    &snap.next_generation.to_string(),
                ],
            ),
        )
        .about(None, Some(&snap.lane_incarnation_id));
        let s = snap.clone();
        let epoch = l.epoch();
        self.transition(
            &step,
            body!([s, proof, epoch] |f| {
                f.read(LOCK_INCARNATION, &[&s.lane_incarnation_id]).await?;
                f.read(LOCK_LEASE, &[&s.lease_id]).await?;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                    [&s.lease_id, &proof, &s.lease_epoch, &s.lane_id, &s.lane_incarnation_id, &s.next_generation, &s.owner_epoch, &epoch];
                let d = match f.cas(&DESTROY_CAS, &params).await? {
                    Ok(d) => d,
                    Err(u) => return Err(u.diagnose(&DESTROY_DIAGNOSIS, &params[..7], DESTROY_PREDS, "no such lease").await?),
                };
                d.exec(CLOSE_INCARNATION, &[&s.lane_incarnation_id]).await?;
                d.decide(json!({ "lease_id": s.lease_id, "lane_id": s.lane_id, "lane_incarnation_id": s.lane_incarnation_id,
                                 "lease_epoch": s.lease_epoch, "next_generation": s.next_generation, "token_proof": proof,
                                 "state": LeaseState::Destroying }))
            }),
        )
        .await
    }

    /// Leases whose host did not make their lane before the lease's deadline (`REQUESTED`
    /// and expired): the TTL worker quarantines them — whether the host will still make
    /// the lane is not known.
    pub async fn unmade_leases(&self) -> Result<Vec<String>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                concatcp!("SELECT lease_id FROM lane_leases WHERE state = ", LeaseState::Requested.sql(),
                    " AND (renew_deadline <= clock_timestamp() OR max_deadline <= clock_timestamp())"),
                &[],
            )
            .await?;
        rows.iter().map(|r| r.col("lease_id")).collect()
    }

    /// `mosaic lane unlease`: the operator ends a lease now — the way out of a quarantined
    /// one too. Its lane, if its host made one (the lease's, or a lane of its name made
    /// late), is destroyed like at the TTL: `DESTROYING` in one CAS, only while the lane
    /// holds no work. A lease whose lane no host made is `DESTROYED` at once.
    pub async fn end_lease(
        &self,
        l: &Leader,
        lease_id: &str,
        request_id: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "lane-lease-end";
        let step = Step::new(
            OP,
            l,
            format!("lane-lease-end/{request_id}"),
            request_digest(OP, &[lease_id]),
        );
        let lease = lease_id.to_string();
        let epoch = l.epoch();
        self.transition(
            &step,
            body!([lease, epoch] |f| {
                let lane = f.read_opt(
                    "SELECT li.lane_incarnation_id FROM lane_leases ll JOIN lane_incarnations li \
                       ON li.lane_id = ll.lane_id AND li.retired_at IS NULL WHERE ll.lease_id = $1",
                    &[&lease],
                ).await?;
                let locked: Option<String> = lane.as_ref().map(|r| r.col("lane_incarnation_id")).transpose()?;
                if let Some(inc) = &locked {
                    f.read(LOCK_INCARNATION, &[inc]).await?;
                }
                f.read(LOCK_LEASE, &[&lease]).await?;
                let Some(locked) = locked else {
                    let d = f.cas(
                        concatcp!("UPDATE lane_leases ll SET state = ", LeaseState::Destroyed.sql(), ", destroyed_at = clock_timestamp(), \
                                quarantine_reason = coalesce(ll.quarantine_reason, 'ended by an operator before its host made the lane') \
                         WHERE ll.lease_id = $1 AND ll.lane_incarnation_id IS NULL AND ll.state IN ", ENDING, " \
                           AND NOT EXISTS (SELECT 1 FROM lane_incarnations li WHERE li.lane_id = ll.lane_id AND li.retired_at IS NULL) \
                         RETURNING ll.lane_id"),
                        &[&lease],
                    ).await?;
                    let Ok(d) = d else {
                        return Err(reject(OP, Category::WrongState, format!("lease {lease} does not exist, or is being destroyed or destroyed")));
                    };
                    let lane_id: String = d.row().col("lane_id")?;
                    return d.decide(json!({ "lease_id": lease, "lane_id": lane_id, "state": LeaseState::Destroyed, "made": false }));
                };
                let d = f.cas(
                    concatcp!("UPDATE lane_leases ll SET state = ", LeaseState::Destroying.sql(), ", lane_incarnation_id = li.lane_incarnation_id, \
                            destroy_next_generation = li.next_generation, destroy_decided_at = clock_timestamp(), destroy_epoch = $2 \
                     FROM lane_incarnations li \
                     WHERE ll.lease_id = $1 AND ll.state IN ", ENDING, " AND li.lane_incarnation_id = $3 \
                       AND li.lane_id = ll.lane_id AND li.retired_at IS NULL \
                       AND (ll.lane_incarnation_id IS NULL OR ll.lane_incarnation_id = li.lane_incarnation_id) \
                       AND li.state IN (", LaneState::IdleClean.sql(), ", ", LaneState::Quarantined.sql(), ") \
                       AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL) \
                     RETURNING ll.lane_id, li.lane_incarnation_id, li.next_generation"),
                    &[&lease, &epoch, &locked],
                ).await?;
                let Ok(d) = d else {
                    return Err(reject(OP, Category::WrongState, format!(
                        "lease {lease} cannot be ended now: it is being destroyed or destroyed, or its lane holds work (stop it first)")));
                };
                let (lane_id, inc, g): (String, String, i64) =
                    (d.row().col("lane_id")?, d.row().col("lane_incarnation_id")?, d.row().col("next_generation")?);
                d.exec(CLOSE_INCARNATION, &[&inc]).await?;
                d.decide(json!({ "lease_id": lease, "lane_id": lane_id, "lane_incarnation_id": inc, "next_generation": g,
                                 "state": LeaseState::Destroying, "made": true }))
            }),
        )
        .await
    }

    /// A collision or ambiguity around a lease: it is `QUARANTINED` with the reason, and
    /// its lane (closed to work on its row) takes none until an operator resolves it.
    pub async fn quarantine_lease(
        &self,
        l: &Leader,
        lease_id: &str,
        reason: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "lane-lease-quarantine";
        let step = Step::new(
            OP,
            l,
            format!(
                "lane-lease-quarantine/{lease_id}/{}",
                uuid::Uuid::new_v4().simple()
            ),
            request_digest(OP, &[lease_id, reason]),
        );
        let (lease, why) = (lease_id.to_string(), reason.to_string());
        self.transition(
            &step,
            body!([lease, why] |f| {
                let bound = f.read_opt("SELECT lane_incarnation_id FROM lane_leases WHERE lease_id = $1 AND lane_incarnation_id IS NOT NULL", &[&lease]).await?;
                let bound: Option<String> = bound.map(|r| r.col("lane_incarnation_id")).transpose()?;
                if let Some(inc) = &bound {
                    f.read(LOCK_INCARNATION, &[inc]).await?;
                }
                f.read(LOCK_LEASE, &[&lease]).await?;
                let d = f.cas(QUARANTINE_CAS, &[&lease, &why]).await?;
                let Ok(d) = d else {
                    return Err(reject(OP, Category::WrongState, format!("lease {lease} is being destroyed, destroyed or already quarantined")));
                };
                let lane: String = d.row().col("lane_id")?;
                if let Some(inc) = d.row().col::<Option<String>>("lane_incarnation_id")? {
                    d.exec(CLOSE_INCARNATION, &[&inc]).await?;
                }
                d.decide(json!({ "lease_id": lease, "lane_id": lane, "reason": why }))
            }),
        )
        .await
    }
}
