//! The roster's versions and the placement records in PostgreSQL (migration 0028); the
//! policy itself is `placement`.
//!
//! **Never:** lets a roster version or a placement record change once written; records a
//! placement apart from the reservation it made (`record` runs in the reservation's own
//! transaction, and the database checks the lane is the reservation's).

use const_format::concatcp;
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::placement::{Candidate, Decision, Inputs, PlacementAsk, Roster, POLICY};
use super::rows::RowExt;
use super::states::{GenState, LaneState, LeaseState};
use super::store::Store;
use super::txn::{body, request_digest, Decided, Step};

/// A roster version as published.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RosterVersion {
    pub version: i64,
    pub digest: String,
    pub roster: Roster,
    pub published_at: String,
}

/// What publishing a roster did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RosterPublished {
    pub version: i64,
    pub digest: String,
    /// False when the declaration already was the current version.
    pub published: bool,
}

/// A reservation's placement, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlacementRecord {
    pub reservation_id: String,
    pub assignment_id: String,
    pub decision: Decision,
    pub decided_at: String,
}

/// Every current lane incarnation with what placement needs to know of it (the reserve
/// CAS's predicates, its host's runtimes and busy count), by lane id.
const CANDIDATES: &str = concatcp!(
    "SELECT li.lane_id, ln.host_id, li.lane_incarnation_id, li.state, \
            (li.state = ", LaneState::IdleClean.sql(), " AND li.recreate_requested_at IS NULL AND li.host_quarantine_reason IS NULL \
             AND NOT EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id AND t.reconciled_at IS NULL) \
             AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> ", GenState::Ended.sql(), ") \
             AND ", super::leases::LEASE_ADMITS_WORK, ") AS reservable, \
            ll.lease_id, ll.runtime AS lease_runtime, ll.labels AS lease_labels, ll.role AS lease_role, \
            coalesce(h.runtimes, '{}'::text[]) AS host_runtimes, \
            count(*) FILTER (WHERE li.state NOT IN (", LaneState::IdleClean.sql(), ", ", LaneState::Quarantined.sql(), ")) \
              OVER (PARTITION BY ln.host_id) AS host_busy \
     FROM lane_incarnations li JOIN lanes ln ON ln.lane_id = li.lane_id LEFT JOIN hosts h ON h.host_id = ln.host_id \
          LEFT JOIN lane_leases ll ON ll.lane_incarnation_id = li.lane_incarnation_id AND ll.state = ", LeaseState::Active.sql(), " \
     WHERE li.retired_at IS NULL ORDER BY li.lane_id"
);

impl Store {
    /// Publishes `roster` as the next version. The same declaration as the current version
    /// is that version (`published: false`, nothing written).
    pub async fn publish_roster(
        &self,
        l: &Leader,
        roster: &Roster,
    ) -> Result<RosterPublished, AuthorityError> {
        const OP: &str = "roster-publish";
        roster
            .validate()
            .map_err(|e| reject(OP, Category::BadInput, e))?;
        let body_json = serde_json::to_value(roster).map_err(|e| AuthorityError::Invariant {
            op: OP,
            detail: format!("a roster does not encode: {e}"),
        })?;
        {
            let c = self.pool.get().await?;
            let same = c
                .query_opt(
                    "SELECT version, digest FROM roster_versions \
                     WHERE version = (SELECT max(version) FROM roster_versions) \
                       AND digest = 'sha256:' || encode(sha256(convert_to($1::jsonb::text, 'UTF8')), 'hex')",
                    &[&body_json],
                )
                .await?;
            if let Some(r) = same {
                return Ok(RosterPublished {
                    version: r.col("version")?,
                    digest: r.col("digest")?,
                    published: false,
                });
            }
        }
        let step = Step::new(
            OP,
            l,
            format!("roster-publish/{}", uuid::Uuid::new_v4().simple()),
            request_digest(OP, &[&body_json.to_string()]),
        );
        let epoch = l.epoch();
        let r = self
            .transition(
                &step,
                body!([body_json, epoch] |f| {
                    // The next version number: two publishers racing collide on the primary
                    // key, and the loser is refused.
                    let d = f.cas(
                        "INSERT INTO roster_versions (version, body, digest, published_epoch) \
                         SELECT coalesce(max(version), 0) + 1, $1, '', $2 FROM roster_versions \
                         ON CONFLICT (version) DO NOTHING RETURNING version, digest",
                        &[&body_json, &epoch],
                    ).await?;
                    let d = match d {
                        Ok(d) => d,
                        Err(u) => return Err(u.reject(Category::Conflict, "another roster version was published concurrently; publish again").await?),
                    };
                    let (version, digest): (i64, String) = (d.row().col("version")?, d.row().col("digest")?);
                    d.decide(json!({ "version": version, "digest": digest }))
                }),
            )
            .await?;
        Ok(RosterPublished {
            version: r.int("version")?,
            digest: r.str("digest")?,
            published: true,
        })
    }

    /// The current roster version, if one was published.
    pub async fn roster(&self) -> Result<Option<RosterVersion>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(ROSTER, &[])
            .await?
            .map(|r| roster_of(&r))
            .transpose()
    }

    /// Roster version `version`, as published (a decision's audit reads the version it was
    /// taken under).
    pub async fn roster_version(
        &self,
        version: i64,
    ) -> Result<Option<RosterVersion>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(
            "SELECT version, body, digest, mosaic_ts(published_at) AS published_at \
             FROM roster_versions WHERE version = $1",
            &[&version],
        )
        .await?
        .map(|r| roster_of(&r))
        .transpose()
    }

    /// What `placement::select` decides from, now: every lane the current roster declares
    /// and the coordinator knows, with its state, and whether its host is connected
    /// (`connected`, the caller's view of its sessions).
    pub async fn placement_inputs(
        &self,
        runtime: &str,
        ask: &PlacementAsk,
        connected: impl Fn(&str) -> bool,
    ) -> Result<Inputs, AuthorityError> {
        let c = self.pool.get().await?;
        let (roster_stmt, stmt) =
            tokio::try_join!(c.prepare_cached(ROSTER), c.prepare_cached(CANDIDATES))?;
        let (roster, rows) = tokio::try_join!(c.query_opt(&roster_stmt, &[]), c.query(&stmt, &[]))?;
        inputs_of(runtime, ask, connected, roster, &rows)
    }

    /// What placing an assign needs, on one connection with the reads pipelined: the
    /// placement a request with this key already made (a repeat reuses it), else the
    /// inputs to decide from now.
    pub async fn placement_context(
        &self,
        request_key: &str,
        runtime: &str,
        ask: &PlacementAsk,
        connected: impl Fn(&str) -> bool,
    ) -> Result<Result<PlacementRecord, Inputs>, AuthorityError> {
        let c = self.pool.get().await?;
        // Prepared once per connection: the three reads are one round trip.
        let (by_key, roster_stmt, cands) = tokio::try_join!(
            c.prepare_cached(&PLACEMENT_BY_KEY),
            c.prepare_cached(ROSTER),
            c.prepare_cached(CANDIDATES)
        )?;
        let key: &(dyn tokio_postgres::types::ToSql + Sync) = &request_key;
        let (kept, roster, rows) = tokio::try_join!(
            c.query_opt(&by_key, std::slice::from_ref(&key)),
            c.query_opt(&roster_stmt, &[]),
            c.query(&cands, &[])
        )?;
        if let Some(k) = kept {
            return Ok(Ok(placement_of(&k)?));
        }
        Ok(Err(inputs_of(runtime, ask, connected, roster, &rows)?))
    }

    /// The placement recorded for the reservation an operator request (`reserve/KEY`) made.
    pub async fn placement_of_request(
        &self,
        request_key: &str,
    ) -> Result<Option<PlacementRecord>, AuthorityError> {
        self.placement_where("request_key = $1", request_key).await
    }

    /// The placement recorded for `reservation_id`, if it was placed.
    pub async fn placement(
        &self,
        reservation_id: &str,
    ) -> Result<Option<PlacementRecord>, AuthorityError> {
        self.placement_where("reservation_id = $1", reservation_id)
            .await
    }

    async fn placement_where(
        &self,
        pred: &str,
        arg: &str,
    ) -> Result<Option<PlacementRecord>, AuthorityError> {
        let c = self.pool.get().await?;
        let q = format!("{PLACEMENT_COLUMNS} WHERE {pred}");
        c.query_opt(&q, &[&arg])
            .await?
            .map(|r| placement_of(&r))
            .transpose()
    }
}

/// The current roster version.
const ROSTER: &str = "SELECT version, body, digest, mosaic_ts(published_at) AS published_at \
     FROM roster_versions ORDER BY version DESC LIMIT 1";

fn roster_of(r: &tokio_postgres::Row) -> Result<RosterVersion, AuthorityError> {
    let body: serde_json::Value = r.col("body")?;
    let roster = serde_json::from_value(body).map_err(|e| AuthorityError::Invariant {
        op: "roster",
        detail: format!("the published roster does not decode: {e}"),
    })?;
    Ok(RosterVersion {
        version: r.col("version")?,
        digest: r.col("digest")?,
        roster,
        published_at: r.col("published_at")?,
    })
}

const PLACEMENT_COLUMNS: &str =
    "SELECT reservation_id, assignment_id, policy, policy_digest, inputs, inputs_digest, lane_id, \
        lane_incarnation_id, elastic, mosaic_ts(decided_at) AS decided_at FROM placements";

static PLACEMENT_BY_KEY: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{PLACEMENT_COLUMNS} WHERE request_key = $1"));

fn placement_of(r: &tokio_postgres::Row) -> Result<PlacementRecord, AuthorityError> {
    let inputs: serde_json::Value = r.col("inputs")?;
    let inputs = serde_json::from_value(inputs).map_err(|e| AuthorityError::Invariant {
        op: "placement",
        detail: format!("a recorded placement's inputs do not decode: {e}"),
    })?;
    let elastic: Option<serde_json::Value> = r.col("elastic")?;
    let elastic = elastic
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| AuthorityError::Invariant {
            op: "placement",
            detail: format!("a recorded elastic choice does not decode: {e}"),
        })?;
    Ok(PlacementRecord {
        reservation_id: r.col("reservation_id")?,
        assignment_id: r.col("assignment_id")?,
        decision: Decision {
            lane_id: r.col("lane_id")?,
            lane_incarnation_id: r.col("lane_incarnation_id")?,
            policy: r.col("policy")?,
            policy_digest: r.col("policy_digest")?,
            inputs,
            inputs_digest: r.col("inputs_digest")?,
            elastic,
        },
        decided_at: r.col("decided_at")?,
    })
}

/// The inputs from the current roster version and every current lane (`CANDIDATES`).
fn inputs_of(
    runtime: &str,
    ask: &PlacementAsk,
    connected: impl Fn(&str) -> bool,
    roster: Option<tokio_postgres::Row>,
    rows: &[tokio_postgres::Row],
) -> Result<Inputs, AuthorityError> {
    let Some(roster) = roster.map(|r| roster_of(&r)).transpose()? else {
        return Err(reject(
            "assign",
            Category::NotFound,
            "no roster is published: name a lane with --lane, or publish one (mosaic roster publish FILE)",
        ));
    };
    let mut candidates = Vec::new();
    for r in rows {
        let lane_id: String = r.col("lane_id")?;
        let host_id: String = r.col("host_id")?;
        let lease_id: Option<String> = r.col("lease_id")?;
        // What the lane is for: its lease's terms (an elastic lane), else the roster's.
        let (host, runtimes, labels, roles) = match (&lease_id, roster.roster.lane(&lane_id)) {
            (Some(_), _) => {
                let Some(host) = roster.roster.hosts.iter().find(|h| h.host_id == host_id) else {
                    continue; // a lease on a host the roster no longer declares
                };
                let labels: serde_json::Value = r.col("lease_labels")?;
                let labels =
                    serde_json::from_value(labels).map_err(|e| AuthorityError::Invariant {
                        op: "placement",
                        detail: format!("a lease's labels do not decode: {e}"),
                    })?;
                let role: Option<String> = r.col("lease_role")?;
                (
                    host,
                    vec![r.col::<String>("lease_runtime")?],
                    labels,
                    role.into_iter().collect(),
                )
            }
            (None, Some((host, lane))) => {
                if host_id != host.host_id {
                    continue; // a lane id the roster gives another host: not this lane
                }
                (
                    host,
                    lane.runtimes.clone(),
                    lane.labels.clone(),
                    lane.roles.clone(),
                )
            }
            (None, None) => continue,
        };
        let busy: i64 = r.col("host_busy")?;
        candidates.push(Candidate {
            lane_id,
            host_connected: connected(&host_id),
            host_id,
            lane_incarnation_id: r.col("lane_incarnation_id")?,
            state: r.col("state")?,
            reservable: r.col("reservable")?,
            host_runtimes: r.col("host_runtimes")?,
            host_busy: u32::try_from(busy).unwrap_or(u32::MAX),
            host_capacity: host.capacity,
            runtimes,
            labels,
            roles,
            lease_id,
        });
    }
    Ok(Inputs {
        policy: POLICY.into(),
        runtime: runtime.into(),
        ask: ask.clone(),
        roster_version: roster.version,
        roster_digest: roster.digest,
        candidates,
    })
}

/// Records `p` inside the reservation's transition (`reservation` of `assignment`, made for
/// the operator request `request_key`).
pub(crate) async fn record(
    d: &Decided<'_>,
    p: &Decision,
    reservation: &str,
    assignment: &str,
    request_key: &str,
) -> Result<(), AuthorityError> {
    let inputs = serde_json::to_value(&p.inputs).map_err(|e| AuthorityError::Invariant {
        op: "reserve",
        detail: format!("placement inputs do not encode: {e}"),
    })?;
    let elastic = p
        .elastic
        .as_ref()
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| AuthorityError::Invariant {
            op: "reserve",
            detail: format!("an elastic choice does not encode: {e}"),
        })?;
    d.exec_one(
        "INSERT INTO placements (reservation_id, request_key, assignment_id, policy, policy_digest, roster_version, inputs, \
                                 inputs_digest, lane_id, lane_incarnation_id, coordinator_epoch, elastic) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        &[&reservation, &request_key, &assignment, &p.policy, &p.policy_digest, &p.inputs.roster_version, &inputs,
          &p.inputs_digest, &p.lane_id, &p.lane_incarnation_id, &d.epoch(), &elastic],
    )
    .await
}
