//! Elastic lanes (spec §13): a lane leased for a while, created by its host for the lease and
//! destroyed when the lease ends — each move one fenced CAS at database time.
//!
//! A lease (`lane_leases`, migration 0029) is asked for (`REQUESTED`), bound to the
//! incarnation its host reports for the lane (`ACTIVE`), renewed (its `lease_epoch` moves
//! by one, its deadline to database time plus the TTL, never past its maximum lifetime),
//! and, once its deadline has passed with nothing on the lane, destroyed: the TTL worker
//! takes a [`DestroySnapshot`] of the lease and its lane, and `decide_destroy` moves the
//! lease to `DESTROYING` only if every field it was decided on is still the same — the
//! ownership proof, the lease epoch, the lane and incarnation, the incarnation's generation
//! counter, the lane idle. The host's report that the lane is gone makes it `DESTROYED`.
//!
//! The ownership token is derived from the coordinator secret and the lease's salt when a
//! destruction is decided and dropped after; only its keyed digest is stored or compared
//! in SQL, and it is checked against the stored proof in constant time first.
//!
//! **Never:** destroys a lane whose lease was renewed, whose incarnation or generation
//! moved, or that holds work; lets a lease other than `ACTIVE` and unexpired admit work
//! (`LEASE_ADMITS_WORK`, part of the reserve CAS); decides anything by a host's clock.

use std::collections::BTreeMap;

use const_format::concatcp;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::rows::RowExt;
use super::states::{LaneState, LeaseState};
use super::txn::{body, request_digest, Receipt, Step};
use super::{Leader, Store};

/// Part of every reserve CAS (alias `li`, the lane's incarnation): a leased lane takes work
/// only while its lease is `ACTIVE` and its deadline is ahead (database time).
pub(crate) const LEASE_ADMITS_WORK: &str = concatcp!(
    "li.lease_closed_at IS NULL AND NOT EXISTS (SELECT 1 FROM lane_leases ll WHERE ll.lane_incarnation_id = li.lane_incarnation_id \
       AND (ll.state <> ",
    LeaseState::Active.sql(),
    " OR ll.renew_deadline <= clock_timestamp() OR ll.max_deadline <= clock_timestamp()))"
);

/// Locks a lease's lane incarnation, then the lease (always in that order, as the reserve
/// CAS and a host's report lock the incarnation first): a destruction decided after this
/// sees every reservation and renewal committed before it, and one after waits for it.
pub(super) const LOCK_INCARNATION: &str =
    "SELECT 1 FROM lane_incarnations WHERE lane_incarnation_id = $1 FOR UPDATE";
pub(super) const LOCK_LEASE: &str = "SELECT 1 FROM lane_leases WHERE lease_id = $1 FOR UPDATE";

/// Closes an incarnation to work on its own row (migration 0030).
pub(super) const CLOSE_INCARNATION: &str =
    "UPDATE lane_incarnations SET lease_closed_at = coalesce(lease_closed_at, clock_timestamp()) \
     WHERE lane_incarnation_id = $1";

/// The shortest TTL and the longest lifetime a lease may ask for.
pub const MIN_TTL_MS: u64 = 1_000;
pub const MAX_LIFETIME_MS: u64 = 30 * 24 * 3600 * 1000;

/// What `mosaic lane lease` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseAsk {
    pub host_id: String,
    pub runtime: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub role: Option<String>,
    pub ttl_ms: u64,
    pub max_lifetime_ms: u64,
}

impl LeaseAsk {
    /// Checks the ask before anything is reserved; the first problem, named.
    pub fn validate(&self) -> Result<(), String> {
        let ask = super::placement::PlacementAsk {
            labels: self.labels.clone(),
            role: self.role.clone(),
            elastic: None,
        };
        ask.validate()?;
        if !super::placement::runtime_ok(&self.runtime) || !self.runtime.contains('@') {
            return Err(format!(
                "runtime {:?}: an exact family@version (the lane runs what its host advertises)",
                self.runtime
            ));
        }
        if !super::placement::name_ok(&self.host_id) {
            return Err(format!(
                "host id {:?}: 1–63 of A-Z a-z 0-9 - _ .",
                self.host_id
            ));
        }
        if self.ttl_ms < MIN_TTL_MS {
            return Err(format!("the TTL is at least {MIN_TTL_MS} ms"));
        }
        if self.max_lifetime_ms > MAX_LIFETIME_MS {
            return Err("the maximum lifetime is at most 30 days".into());
        }
        if self.ttl_ms > self.max_lifetime_ms {
            return Err("the TTL cannot be longer than the maximum lifetime".into());
        }
        Ok(())
    }
}

/// A lease as operators see it (never its salt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    pub lease_id: String,
    pub host_id: String,
    pub lane_id: String,
    pub lane_incarnation_id: Option<String>,
    pub runtime: String,
    pub labels: BTreeMap<String, String>,
    pub role: Option<String>,
    pub state: LeaseState,
    pub lease_epoch: i64,
    pub owner_epoch: i64,
    pub ttl_ms: i64,
    pub renew_deadline: String,
    pub max_deadline: String,
    pub expired: bool,
    pub token_proof: String,
    pub destroy_key: String,
    pub quarantine_reason: Option<String>,
    pub destroyed_at: Option<String>,
}

const VIEW_COLUMNS: &str = "ll.lease_id, ll.host_id, ll.lane_id, ll.lane_incarnation_id, ll.runtime, ll.labels, ll.role, \
     ll.state, ll.lease_epoch, ll.owner_epoch, ll.ttl_ms, mosaic_ts(ll.renew_deadline) AS renew_deadline, \
     mosaic_ts(ll.max_deadline) AS max_deadline, \
     (ll.renew_deadline <= clock_timestamp() OR ll.max_deadline <= clock_timestamp()) AS expired, \
     ll.token_proof, ll.destroy_key, ll.quarantine_reason, mosaic_ts(ll.destroyed_at) AS destroyed_at";

fn view(r: &tokio_postgres::Row) -> Result<LeaseView, AuthorityError> {
    let labels: serde_json::Value = r.col("labels")?;
    Ok(LeaseView {
        lease_id: r.col("lease_id")?,
        host_id: r.col("host_id")?,
        lane_id: r.col("lane_id")?,
        lane_incarnation_id: r.col("lane_incarnation_id")?,
        runtime: r.col("runtime")?,
        labels: serde_json::from_value(labels).map_err(|e| AuthorityError::Invariant {
            op: "lane-lease",
            detail: format!("a lease's labels do not decode: {e}"),
        })?,
        role: r.col("role")?,
        state: r.col("state")?,
        lease_epoch: r.col("lease_epoch")?,
        owner_epoch: r.col("owner_epoch")?,
        ttl_ms: r.col("ttl_ms")?,
        renew_deadline: r.col("renew_deadline")?,
        max_deadline: r.col("max_deadline")?,
        expired: r.col("expired")?,
        token_proof: r.col("token_proof")?,
        destroy_key: r.col("destroy_key")?,
        quarantine_reason: r.col("quarantine_reason")?,
        destroyed_at: r.col("destroyed_at")?,
    })
}

/// A `lane_leases` row waiting for its lane's next incarnation: unbound, requested or
/// quarantined (unqualified columns: the one definition `WAITING` and `lanes_registered`
/// share).
const WAITING_LEASE: &str = concatcp!(
    "lane_incarnation_id IS NULL AND state IN (",
    LeaseState::Requested.sql(),
    ", ",
    LeaseState::Quarantined.sql(),
    ")"
);

/// The lease waiting for its lane ($1).
const WAITING: &str = concatcp!(
    "SELECT lease_id FROM lane_leases WHERE lane_id = $1 AND ",
    WAITING_LEASE
);

/// Binds a waiting lease ($1) to its lane ($2)'s incarnation ($3): `ACTIVE` if it was
/// requested and is within its lifetime, else quarantined with the reason.
const BIND_CAS: &str = concatcp!(
    "UPDATE lane_leases ll SET lane_incarnation_id = $3, \
        state = CASE WHEN ll.state = ", LeaseState::Requested.sql(), " AND ll.max_deadline > clock_timestamp() \
                     THEN ", LeaseState::Active.sql(), " ELSE ", LeaseState::Quarantined.sql(), " END, \
        quarantine_reason = CASE WHEN ll.state = ", LeaseState::Requested.sql(), " AND ll.max_deadline > clock_timestamp() \
                     THEN ll.quarantine_reason ELSE coalesce(ll.quarantine_reason, 'its host made the lane after the lease ended') END \
     FROM lane_incarnations li \
     WHERE ll.lease_id = $1 AND ll.lane_id = $2 AND ll.lane_incarnation_id IS NULL \
       AND ll.state IN (", LeaseState::Requested.sql(), ", ", LeaseState::Quarantined.sql(), ") \
       AND li.lane_incarnation_id = $3 AND li.lane_id = $2 AND li.retired_at IS NULL \
     RETURNING ll.state"
);

/// The incarnations a host is to destroy (`leases_to_destroy`): $1 host. Closed to work,
/// holding none, of an elastic lane's name; neither a quarantined lease's lane (kept for the
/// operator) nor one a lease still waits for (its binding opens it).
const TO_DESTROY: &str = concatcp!(
    "SELECT li.lane_id, li.lane_incarnation_id FROM lane_incarnations li JOIN lanes ln ON ln.lane_id = li.lane_id \
     WHERE ln.host_id = $1 AND li.retired_at IS NULL AND li.lease_closed_at IS NOT NULL \
       AND li.state IN (", LaneState::IdleClean.sql(), ", ", LaneState::Quarantined.sql(), ") \
       AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL) \
       AND EXISTS (SELECT 1 FROM lane_leases x WHERE x.lane_id = li.lane_id) \
       AND NOT EXISTS (SELECT 1 FROM lane_leases q WHERE q.lane_incarnation_id = li.lane_incarnation_id AND q.state = ",
    LeaseState::Quarantined.sql(),
    ") \
       AND NOT EXISTS (SELECT 1 FROM lane_leases w WHERE w.lane_id = li.lane_id AND w.lane_incarnation_id IS NULL AND w.state IN (",
    LeaseState::Requested.sql(),
    ", ",
    LeaseState::Quarantined.sql(),
    ")) ORDER BY li.lane_id"
);

/// Hosts with an elastic lane to make (a requested lease) or to destroy (a closed one).
const HOSTS_WITH_ORDERS: &str = concatcp!(
    "SELECT host_id FROM lane_leases WHERE state = ",
    LeaseState::Requested.sql(),
    " AND max_deadline > clock_timestamp() \
     UNION SELECT ln.host_id FROM lanes ln JOIN lane_incarnations li ON li.lane_id = ln.lane_id \
       WHERE li.retired_at IS NULL AND li.lease_closed_at IS NOT NULL"
);

/// The lane name an elastic lane gets on its host: `e-` and the first 12 hex digits of
/// its lease id.
pub fn lane_name(lease_id: &str) -> String {
    let hex = lease_id.trim_start_matches("ll-");
    format!("e-{}", &hex[..hex.len().min(12)])
}

pub use ending::DestroySnapshot;

mod ending;

impl Store {
    /// `mosaic lane lease`: a lease for a new lane on `ask.host_id`, within the capacity the
    /// current roster declares for that host (its live leases and busy lanes together).
    /// The host creates the lane when it is told (`leases_to_create`).
    pub async fn lease_lane(
        &self,
        l: &Leader,
        ask: &LeaseAsk,
        request_id: &str,
    ) -> Result<LeaseView, AuthorityError> {
        const OP: &str = "lane-lease";
        ask.validate()
            .map_err(|e| reject(OP, Category::BadInput, e))?;
        let ask_json = serde_json::to_value(ask).map_err(|e| AuthorityError::Invariant {
            op: OP,
            detail: e.to_string(),
        })?;
        let step = Step::new(
            OP,
            l,
            format!("lane-lease/{request_id}"),
            request_digest(OP, &[&ask_json.to_string()]),
        );
        let lease_id = format!("ll-{}", uuid::Uuid::new_v4().simple());
        let salt =
            super::secret::fence_salt().map_err(|e| AuthorityError::Entropy(e.to_string()))?;
        let proof = self
            .secret
            .ownership_proof(&self.secret.ownership_token(&lease_id, &salt));
        let lane_id = format!("{}:{}", ask.host_id, lane_name(&lease_id));
        let labels = json!(ask.labels);
        let (host, runtime, role) = (ask.host_id.clone(), ask.runtime.clone(), ask.role.clone());
        let (ttl, max) = (
            format!("{} milliseconds", ask.ttl_ms),
            format!("{} milliseconds", ask.max_lifetime_ms),
        );
        let epoch = l.epoch();
        let r = self
            .transition(
                &step,
                body!([lease_id, salt, proof, lane_id, labels, host, runtime, role, ttl, max, epoch] |f| {
                    // One lease decision per host at a time: the capacity count below sees
                    // every lease of the host committed before it.
                    f.read("SELECT pg_advisory_xact_lock(hashtext('mosaic/lane-lease/' || $1::text))", &[&host]).await?;
                    let d = f.cas(
                        concatcp!("INSERT INTO lane_leases (lease_id, host_id, lane_id, runtime, labels, role, token_salt, token_proof, \
                                                   owner_epoch, ttl_ms, renew_deadline, max_deadline, destroy_key) \
                         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, extract(epoch FROM $10::text::interval) * 1000, \
                                LEAST(clock_timestamp() + $10::text::interval, clock_timestamp() + $11::text::interval), \
                                clock_timestamp() + $11::text::interval, 'destroy/' || $1 \
                         FROM roster_versions rv, jsonb_array_elements(rv.body->'hosts') h \
                         WHERE rv.version = (SELECT max(version) FROM roster_versions) AND h->>'host_id' = $2 \
                           AND EXISTS (SELECT 1 FROM hosts hh WHERE hh.host_id = $2 AND $4 = ANY(hh.runtimes)) \
                           AND (h->>'capacity')::bigint > \
                               (SELECT count(*) FROM lane_leases x WHERE x.host_id = $2 AND x.state <> ", LeaseState::Destroyed.sql(), ") \
                             + (SELECT count(*) FROM lane_incarnations li JOIN lanes ln USING (lane_id) \
                                WHERE ln.host_id = $2 AND li.retired_at IS NULL \
                                  AND li.state NOT IN (", LaneState::IdleClean.sql(), ", ", LaneState::Quarantined.sql(), ") \
                                  AND NOT EXISTS (SELECT 1 FROM lane_leases y WHERE y.lane_incarnation_id = li.lane_incarnation_id)) \
                         RETURNING lease_id"),
                        &[&lease_id, &host, &lane_id, &runtime, &labels, &role, &salt, &proof, &epoch, &ttl, &max],
                    ).await?;
                    let d = match d {
                        Ok(d) => d,
                        Err(u) => {
                            let declared = u.read_opt(
                                "SELECT 1 FROM roster_versions rv, jsonb_array_elements(rv.body->'hosts') h \
                                 WHERE rv.version = (SELECT max(version) FROM roster_versions) AND h->>'host_id' = $1",
                                &[&host],
                            ).await?.is_some();
                            let advertised = u.read_opt(
                                "SELECT 1 FROM hosts WHERE host_id = $1 AND $2 = ANY(runtimes)",
                                &[&host, &runtime],
                            ).await?.is_some();
                            return Err(if !advertised {
                                u.reject(Category::UnknownRuntime, format!("host {host} does not advertise {runtime}")).await?
                            } else if declared {
                                u.reject(Category::NoEligibleLane, format!("host {host} is at its declared capacity (its live leases and busy lanes)")).await?
                            } else {
                                u.reject(Category::NoEligibleLane, format!("the current roster declares no capacity for host {host} (mosaic roster publish)")).await?
                            });
                        }
                    };
                    d.decide(json!({ "lease_id": lease_id, "lane_id": lane_id, "host_id": host, "runtime": runtime }))
                }),
            )
            .await?;
        let id = r.str("lease_id")?;
        self.lease(&id)
            .await?
            .ok_or_else(|| AuthorityError::Invariant {
                op: OP,
                detail: format!("lease {id} committed and not found"),
            })
    }

    /// One lease.
    pub async fn lease(&self, lease_id: &str) -> Result<Option<LeaseView>, AuthorityError> {
        let c = self.pool.get().await?;
        let q = format!("SELECT {VIEW_COLUMNS} FROM lane_leases ll WHERE ll.lease_id = $1");
        c.query_opt(&q, &[&lease_id])
            .await?
            .map(|r| view(&r))
            .transpose()
    }

    /// Every lease not yet destroyed (and the destroyed ones of the last hour).
    pub async fn leases(&self) -> Result<Vec<LeaseView>, AuthorityError> {
        let c = self.pool.get().await?;
        let q = format!(
            "SELECT {VIEW_COLUMNS} FROM lane_leases ll \
             WHERE ll.state <> {} OR ll.destroyed_at > clock_timestamp() - interval '1 hour' ORDER BY ll.lane_id",
            LeaseState::Destroyed.sql()
        );
        c.query(&q, &[]).await?.iter().map(view).collect()
    }

    /// The lanes a host is to create for leases (`REQUESTED`), by name.
    pub async fn leases_to_create(&self, host_id: &str) -> Result<Vec<String>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c
            .query(
                concatcp!(
                    "SELECT lane_id FROM lane_leases WHERE host_id = $1 AND state = ",
                    LeaseState::Requested.sql(),
                    " \
                   AND max_deadline > clock_timestamp() ORDER BY lane_id"
                ),
                &[&host_id],
            )
            .await?;
        rows.iter().map(|r| r.col("lane_id")).collect()
    }

    /// The hosts with a lease waiting on them (a lane to make or to destroy).
    pub async fn hosts_with_lease_orders(&self) -> Result<Vec<String>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c.query(HOSTS_WITH_ORDERS, &[]).await?;
        rows.iter().map(|r| r.col("host_id")).collect()
    }

    /// The incarnations a host is to destroy: every current incarnation of an elastic
    /// lane's name closed to work (its lease `DESTROYING`, or a lane made outside its
    /// lease), but a quarantined lease's, kept for the operator.
    pub async fn leases_to_destroy(
        &self,
        host_id: &str,
    ) -> Result<Vec<(String, String)>, AuthorityError> {
        let c = self.pool.get().await?;
        let rows = c.query(TO_DESTROY, &[&host_id]).await?;
        rows.iter()
            .map(|r| Ok((r.col("lane_id")?, r.col("lane_incarnation_id")?)))
            .collect()
    }

    /// A host's lanes as the coordinator has them registered: each lane's current
    /// incarnation (none if retired) and whether a lease waits for its next one. A report
    /// that names exactly these has nothing to adopt or bind: its lanes are skipped
    /// without a read each (issue 22: two reads per lane per report).
    pub async fn lanes_registered(
        &self,
        host_id: &str,
    ) -> Result<std::collections::HashMap<String, (Option<String>, bool)>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(concatcp!(
                "SELECT ln.lane_id, li.lane_incarnation_id, \
                        EXISTS (SELECT 1 FROM lane_leases WHERE lane_id = ln.lane_id AND ",
                WAITING_LEASE,
                ") AS lease_waiting \
                 FROM lanes ln LEFT JOIN lane_incarnations li ON li.lane_id = ln.lane_id AND li.retired_at IS NULL \
                 WHERE ln.host_id = $1"
            ))
            .await?;
        c.query(&stmt, &[&host_id])
            .await?
            .iter()
            .map(|r| {
                Ok((
                    r.col("lane_id")?,
                    (r.col("lane_incarnation_id")?, r.col("lease_waiting")?),
                ))
            })
            .collect()
    }

    /// A host reported the lane of a lease waiting for it under `incarnation`: a
    /// `REQUESTED` lease is `ACTIVE` on it; a quarantined one (its host made the lane after
    /// the lease's deadline) is bound and stays quarantined, its lane closed to work.
    /// `None` when no lease waits for the lane (an operator's own lane is an ordinary one).
    pub async fn bind_lease(
        &self,
        l: &Leader,
        lane_id: &str,
        incarnation: &str,
    ) -> Result<Option<Receipt>, AuthorityError> {
        const OP: &str = "lane-lease-bind";
        let waiting = {
            let c = self.pool.get().await?;
            c.query_opt(WAITING, &[&lane_id]).await?
        };
        let Some(row) = waiting else { return Ok(None) };
        let lease_id: String = row.col("lease_id")?;
        let step = Step::new(
            OP,
            l,
            format!("lane-lease-bind/{lease_id}"),
            request_digest(OP, &[&lease_id, incarnation]),
        )
        .about(None, Some(incarnation));
        let (lease, lane, inc) = (lease_id, lane_id.to_string(), incarnation.to_string());
        let r = self
            .transition(
                &step,
                body!([lease, lane, inc] |f| {
                    f.read(LOCK_INCARNATION, &[&inc]).await?;
                    f.read(LOCK_LEASE, &[&lease]).await?;
                    let d = f.cas(BIND_CAS, &[&lease, &lane, &inc]).await?;
                    let Ok(d) = d else {
                        return Err(reject(OP, Category::Conflict, format!("lease {lease} is not waiting for incarnation {inc} of {lane}")));
                    };
                    let state: LeaseState = d.row().col("state")?;
                    if state == LeaseState::Active {
                        d.exec("UPDATE lane_incarnations SET lease_closed_at = NULL WHERE lane_incarnation_id = $1", &[&inc]).await?;
                    } else {
                        d.exec(CLOSE_INCARNATION, &[&inc]).await?;
                    }
                    d.decide(json!({ "lease_id": lease, "lane_id": lane, "lane_incarnation_id": inc, "state": state }))
                }),
            )
            .await?;
        Ok(Some(r))
    }

    /// `mosaic lane renew`: the lease's deadline moved to database time plus its TTL (never
    /// past its maximum lifetime), its epoch by one — only while it is `ACTIVE` and its
    /// deadline is still ahead: an expired lease is not brought back.
    pub async fn renew_lease(
        &self,
        l: &Leader,
        lease_id: &str,
        request_id: &str,
    ) -> Result<LeaseView, AuthorityError> {
        const OP: &str = "lane-lease-renew";
        let step = Step::new(
            OP,
            l,
            format!("lane-lease-renew/{request_id}"),
            request_digest(OP, &[lease_id]),
        );
        let lease = lease_id.to_string();
        let epoch = l.epoch();
        self.transition(
            &step,
            body!([lease, epoch] |f| {
                let d = f.cas(
                    concatcp!("UPDATE lane_leases ll SET lease_epoch = ll.lease_epoch + 1, owner_epoch = $2, \
                            renew_deadline = LEAST(clock_timestamp() + ll.ttl_ms * interval '1 millisecond', ll.max_deadline) \
                     WHERE ll.lease_id = $1 AND ll.state = ", LeaseState::Active.sql(), " \
                       AND ll.renew_deadline > clock_timestamp() AND ll.max_deadline > clock_timestamp() \
                     RETURNING ll.lease_epoch, mosaic_ts(ll.renew_deadline) AS renew_deadline"),
                    &[&lease, &epoch],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let found = u.read_opt("SELECT 1 FROM lane_leases WHERE lease_id = $1", &[&lease]).await?.is_some();
                        return Err(if found {
                            u.reject(Category::Expired, "only an ACTIVE lease whose deadline is ahead (database time) can be renewed").await?
                        } else {
                            u.reject(Category::NotFound, format!("no lease {lease}")).await?
                        });
                    }
                };
                let (e, until): (i64, String) = (d.row().col("lease_epoch")?, d.row().col("renew_deadline")?);
                d.decide(json!({ "lease_id": lease, "lease_epoch": e, "renew_deadline": until }))
            }),
        )
        .await?;
        self.lease(lease_id)
            .await?
            .ok_or_else(|| AuthorityError::Invariant {
                op: OP,
                detail: format!("lease {lease_id} renewed and not found"),
            })
    }
}
