//! Lanes and their incarnations: adoption of what a host reports, quarantine (the
//! coordinator's and the host's), its release, and an operator's request to have a lane
//! recreated.
//!
//! **Never:** lets a host register a lane of another host, brings a retired incarnation
//! back, or releases a quarantine while a generation, receipt, lease or reservation of the
//! lane is still open or a cleanup was never verified.

use const_format::concatcp;
use serde_json::json;

use super::ending::quarantine_follow_ups;
use super::error::{reject, AuthorityError, Category};
use super::followups::RecoveryOf;
use super::leader::Leader;
use super::model::LaneView;
use super::rows::RowExt;
use super::states::{GenState, LaneState, LeaseState, Lifecycle};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};

/// The step of a host's lane report about one incarnation (keyed by lane and incarnation,
/// so a repeated report lands on the same receipt), and the owned ids its body captures.
fn lane_step(
    op: &'static str,
    l: &Leader,
    host_id: &str,
    lane_id: &str,
    incarnation: &str,
) -> (Step, String, String, String) {
    let step = Step::new(
        op,
        l,
        format!("{op}/{lane_id}/{incarnation}"),
        request_digest(op, &[lane_id, host_id, incarnation]),
    )
    .about(None, Some(incarnation));
    (
        step,
        host_id.to_string(),
        lane_id.to_string(),
        incarnation.to_string(),
    )
}

fn digest_of(s: &str) -> String {
    crate::util::sha256_hex("mosaic/reason/v1", &[s.as_bytes()])[..16].to_string()
}

impl Store {
    /// What became of lane incarnation `inc` after a stop of `assignment_id` there: its
    /// state (`RETIRED` once retired: no step moves a retired incarnation again), or
    /// `None` when it is not that work's to report (unknown, or another assignment holds
    /// it now).
    pub async fn lane_after_stop(
        &self,
        inc: &str,
        assignment_id: &str,
    ) -> Result<Option<String>, AuthorityError> {
        let key = (inc.to_string(), assignment_id.to_string());
        Ok(self
            .lanes_after_stop(std::slice::from_ref(&key))
            .await?
            .pop()
            .and_then(|(_, s)| s))
    }

    /// [`Store::lane_after_stop`] for many (lane incarnation, assignment) pairs, in one
    /// read: each pair whose incarnation exists, with its answer.
    pub async fn lanes_after_stop(
        &self,
        keys: &[(String, String)],
    ) -> Result<Vec<((String, String), Option<String>)>, AuthorityError> {
        let (incs, asgs): (Vec<&str>, Vec<&str>) =
            keys.iter().map(|(i, a)| (i.as_str(), a.as_str())).unzip();
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(
                "SELECT k.inc, k.asg, li.state, li.retired_at IS NOT NULL AS retired, \
                        EXISTS (SELECT 1 FROM reservations r WHERE r.lane_incarnation_id = li.lane_incarnation_id \
                                AND r.released_at IS NULL AND r.assignment_id <> k.asg) AS taken \
                 FROM unnest($1::text[], $2::text[]) AS k(inc, asg) \
                 JOIN lane_incarnations li ON li.lane_incarnation_id = k.inc",
            )
            .await?;
        c.query(&stmt, &[&incs, &asgs])
            .await?
            .iter()
            .map(|r| {
                let key = (r.col("inc")?, r.col("asg")?);
                let state = if r.col::<bool>("taken")? {
                    None
                } else if r.col::<bool>("retired")? {
                    Some("RETIRED".to_string())
                } else {
                    Some(r.col::<LaneState>("state")?.to_string())
                };
                Ok((key, state))
            })
            .collect()
    }

    /// Registers the lane incarnation its host reports (`lane@incarnation` in a hello). A
    /// new incarnation of a known lane retires the old one: the host only reports a new
    /// incarnation after it destroyed the old lane and verified its cgroup empty, so the old
    /// incarnation's open work goes to recovery and its generations are recorded as ended
    /// with it (a late receipt for one is kept as evidence). Incarnation ids are never
    /// reused (primary key); a retired one is refused.
    pub async fn adopt_lane_incarnation(
        &self,
        l: &Leader,
        host_id: &str,
        lane_id: &str,
        incarnation: &str,
    ) -> Result<LaneView, AuthorityError> {
        const OP: &str = "lane-adopt";
        if let Some(v) = self.lane(lane_id).await? {
            if v.lane_incarnation_id == incarnation {
                return Ok(v);
            }
        }
        if host_id.is_empty()
            || !lane_id.starts_with(&format!("{host_id}:"))
            || lane_id.len() <= host_id.len() + 1
            || !incarnation.starts_with("li-")
        {
            return Err(reject(
                OP,
                Category::BadInput,
                "lane ids are <host>:<lane> of the reporting host, incarnation ids li-…",
            ));
        }
        // A retired incarnation never comes back, whoever asks and however often (checked
        // before the idempotency replay, which would otherwise answer an old hello again).
        if self.incarnation_retired(incarnation).await? {
            let e = reject(
                OP,
                Category::Mismatch,
                format!("incarnation {incarnation} was retired; it never comes back"),
            );
            self.audit.record(
                OP,
                Category::Mismatch,
                Some(l.epoch()),
                None,
                Some(incarnation),
                &e.to_string(),
            );
            return Err(e);
        }
        let (step, host, lane, inc) = lane_step(OP, l, host_id, lane_id, incarnation);
        self.transition(
            &step,
            body!([host, lane, inc] |f| {
                let known = f.read_opt(
                    "SELECT retired_at IS NOT NULL FROM lane_incarnations WHERE lane_incarnation_id = $1",
                    &[&inc],
                ).await?;
                if known.is_some() {
                    return Err(reject(OP, Category::Mismatch, format!("incarnation {inc} was seen before; a retired incarnation never comes back")));
                }
                let owner = f.read_opt("SELECT host_id FROM lanes WHERE lane_id = $1", &[&lane]).await?;
                if let Some(o) = owner {
                    if o.col::<String>("host_id")? != host {
                        return Err(reject(OP, Category::NotOwner, format!("lane {lane} belongs to another host")));
                    }
                }
                let current = f.read_opt(
                    "SELECT lane_incarnation_id, state FROM lane_incarnations WHERE lane_id = $1 AND retired_at IS NULL FOR UPDATE",
                    &[&lane],
                ).await?;
                let epoch = f.leader().epoch();
                let retired = match current {
                    Some(cur) => {
                        let old: String = cur.col("lane_incarnation_id")?;
                        let old_state: LaneState = cur.col("state")?;
                        let d = f.cas(
                            "UPDATE lane_incarnations SET retired_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND state = $2 AND retired_at IS NULL \
                             RETURNING lane_incarnation_id",
                            &[&old, &old_state],
                        ).await?;
                        let Ok(d) = d else {
                            return Err(reject(OP, Category::Conflict, "the lane changed concurrently"));
                        };
                        d.retire_open_work(&old, &inc, "resume on a fresh chain: the host recreated the lane").await?;
                        // An elastic lane's lease ends with the incarnation it held: the host's
                        // report of a new one proves the old one gone (the new one is no
                        // lease's: `close_orphan_lane` has it destroyed).
                        d.exec(
                            concatcp!("UPDATE lane_leases SET state = ", LeaseState::Destroyed.sql(), ", destroyed_at = clock_timestamp() \
                             WHERE lane_incarnation_id = $1 AND state <> ", LeaseState::Destroyed.sql()),
                            &[&old],
                        ).await?;
                        d.exec_one(
                            "INSERT INTO lane_incarnations (lane_incarnation_id, lane_id, created_epoch, lease_closed_at) \
                             SELECT $1, $2, $3, CASE WHEN EXISTS (SELECT 1 FROM lane_leases WHERE lane_id = $2) THEN clock_timestamp() END",
                            &[&inc, &lane, &epoch],
                        ).await?;
                        return d.decide(json!({ "lane_id": lane, "lane_incarnation_id": inc, "retired": old, "retired_state": old_state }));
                    }
                    None => None::<String>,
                };
                // An incarnation of an elastic lane's name is born closed to work: only its
                // lease's binding opens it (`bind_lease`), so nothing is reserved on it in
                // between, and one no lease holds stays closed and is destroyed.
                let d = f.cas(
                    "WITH ln AS (INSERT INTO lanes (lane_id, host_id) VALUES ($2, $4) ON CONFLICT (lane_id) DO NOTHING) \
                     INSERT INTO lane_incarnations (lane_incarnation_id, lane_id, created_epoch, lease_closed_at) \
                     SELECT $1, $2, $3, CASE WHEN EXISTS (SELECT 1 FROM lane_leases WHERE lane_id = $2) THEN clock_timestamp() END WHERE NOT EXISTS (SELECT 1 FROM lane_incarnations WHERE lane_id = $2 AND retired_at IS NULL) \
                     RETURNING lane_incarnation_id",
                    &[&inc, &lane, &epoch, &host],
                ).await?;
                let Ok(d) = d else {
                    return Err(reject(OP, Category::Conflict, "another incarnation of the lane appeared concurrently"));
                };
                d.decide(json!({ "lane_id": lane, "lane_incarnation_id": inc, "retired": retired }))
            }),
        )
        .await?;
        self.lane(lane_id)
            .await?
            .ok_or_else(|| reject(OP, Category::NotFound, lane_id.to_string()))
    }

    async fn incarnation_retired(&self, incarnation: &str) -> Result<bool, AuthorityError> {
        let c = self.pool.get().await?;
        match c
            .query_opt(
                "SELECT retired_at IS NOT NULL AS retired FROM lane_incarnations WHERE lane_incarnation_id = $1",
                &[&incarnation],
            )
            .await?
        {
            Some(r) => r.col("retired"),
            None => Ok(false),
        }
    }

    /// Any state → QUARANTINED: leases and reservation released, the active assignment to
    /// recovery, a generation still running marked to be stopped. `from_host` records that
    /// the host itself quarantined the lane (shown to operators; released only by
    /// recreating the lane).
    pub async fn quarantine(
        &self,
        l: &Leader,
        lane_incarnation_id: &str,
        reason: &str,
        from_host: bool,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "quarantine";
        let step = Step::new(
            OP,
            l,
            format!(
                "quarantine/{lane_incarnation_id}/{}/{}",
                from_host,
                digest_of(reason)
            ),
            request_digest(OP, &[lane_incarnation_id, reason, &from_host.to_string()]),
        )
        .about(None, Some(lane_incarnation_id));
        let (inc, reason) = (lane_incarnation_id.to_string(), reason.to_string());
        self.transition(
            &step,
            body!([inc, reason] |f| {
                let d = f.cas(
                    concatcp!("UPDATE lane_incarnations SET state = ", LaneState::Quarantined.sql(), ", quarantine_reason = $2, \
                            host_quarantine_reason = CASE WHEN $3 THEN $2 ELSE host_quarantine_reason END \
                     WHERE lane_incarnation_id = $1 AND retired_at IS NULL \
                       AND (state <> ", LaneState::Quarantined.sql(), " OR ($3 AND host_quarantine_reason IS DISTINCT FROM $2)) \
                     RETURNING lane_incarnation_id"),
                    &[&inc, &reason, &from_host],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "no current lane incarnation, or already quarantined").await?),
                };
                quarantine_follow_ups(&d, &inc, &reason).await?;
                d.decide(json!({ "lane_incarnation_id": inc, "to": LaneState::Quarantined, "reason": reason, "from_host": from_host }))
            }),
        )
        .await
    }

    /// QUARANTINED → IDLE_CLEAN, only with nothing left to prove: no host-side quarantine,
    /// every generation ended with a reconciled receipt that verified its cleanup, no active
    /// assignment, no open lease or reservation.
    pub async fn release_quarantine(
        &self,
        l: &Leader,
        lane_incarnation_id: &str,
        request_id: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "release-quarantine";
        let step = Step::new(
            OP,
            l,
            format!("release/{lane_incarnation_id}/{request_id}"),
            request_digest(OP, &[lane_incarnation_id]),
        )
        .about(None, Some(lane_incarnation_id));
        let inc = lane_incarnation_id.to_string();
        self.transition(
            &step,
            body!([inc] |f| {
                let d = f.cas(
                    concatcp!("UPDATE lane_incarnations li SET state = ", LaneState::IdleClean.sql(), ", quarantine_reason = NULL \
                     WHERE li.lane_incarnation_id = $1 AND li.state = ", LaneState::Quarantined.sql(), " AND li.retired_at IS NULL \
                       AND li.host_quarantine_reason IS NULL \
                       AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> ", GenState::Ended.sql(), ") \
                       AND NOT EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.end_receipt IS NULL) \
                       AND NOT EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = li.lane_incarnation_id \
                                       AND (t.reconciled_at IS NULL OR NOT t.verified_empty)) \
                       AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.lane_incarnation_id = li.lane_incarnation_id AND a.lifecycle = ", Lifecycle::Active.sql(), ") \
                       AND NOT EXISTS (SELECT 1 FROM leases s WHERE s.lane_incarnation_id = li.lane_incarnation_id AND s.released_at IS NULL) \
                       AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL) \
                     RETURNING li.lane_incarnation_id"),
                    &[&inc],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let why = u.read_opt(
                            concatcp!("SELECT state, host_quarantine_reason, \
                                    EXISTS (SELECT 1 FROM generations g WHERE g.lane_incarnation_id = $1 AND (g.state <> ", GenState::Ended.sql(), " OR g.end_receipt IS NULL)) AS unended, \
                                    EXISTS (SELECT 1 FROM termination_receipts t WHERE t.lane_incarnation_id = $1 AND NOT t.verified_empty) AS unverified \
                             FROM lane_incarnations WHERE lane_incarnation_id = $1 AND retired_at IS NULL"),
                            &[&inc],
                        ).await?;
                        let why = match why {
                            None => None,
                            Some(r) => Some((
                                r.col::<LaneState>("state")?,
                                r.col::<Option<String>>("host_quarantine_reason")?,
                                r.col::<bool>("unended")?,
                                r.col::<bool>("unverified")?,
                            )),
                        };
                        let detail = match why {
                            None => "no current lane incarnation".to_string(),
                            Some((state, ..)) if state != LaneState::Quarantined => format!("the lane is {state}, not QUARANTINED"),
                            Some((_, Some(reason), ..)) => format!(
                                "the host quarantined this lane ({reason}); recreate it (mosaic lane recreate) to get a fresh incarnation"),
                            Some((_, _, true, _)) => "a generation of this lane has no receipt proving it ended; wait for the host, or recreate the lane".into(),
                            Some((_, _, _, true)) => "a generation's cleanup was never verified; recreate the lane (mosaic lane recreate)".into(),
                            Some(_) => "an assignment, lease or reservation of the lane is still open".into(),
                        };
                        return Err(u.reject(Category::Unreconciled, detail).await?);
                    }
                };
                // Released: the operator goes on without any checkpoint its generations lack
                // (work in a repository whose capture failed), which the fence would
                // otherwise wait for; recorded per generation and in this receipt.
                let waived = d.exec(
                    "UPDATE generations SET checkpoint_waived_at = clock_timestamp() \
                     WHERE lane_incarnation_id = $1 AND checkpoint_owed",
                    &[&inc],
                ).await?;
                d.decide(json!({ "lane_incarnation_id": inc, "to": LaneState::IdleClean, "checkpoints_waived": waived }))
            }),
        )
        .await
    }

    /// Asks the lane's host to destroy and recreate the lane (a fresh incarnation). Only
    /// for a lane with no live chain: IDLE_CLEAN, or QUARANTINED.
    pub async fn request_recreate(
        &self,
        l: &Leader,
        lane_incarnation_id: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "request-recreate";
        let step = Step::new(
            OP,
            l,
            format!("recreate/{lane_incarnation_id}"),
            request_digest(OP, &[lane_incarnation_id]),
        )
        .about(None, Some(lane_incarnation_id));
        let inc = lane_incarnation_id.to_string();
        self.transition(
            &step,
            body!([inc] |f| {
                // An elastic lane is never recreated: its name belongs to its lease.
                if f.read_opt("SELECT 1 FROM lane_leases ll JOIN lane_incarnations li ON li.lane_id = ll.lane_id WHERE li.lane_incarnation_id = $1", &[&inc]).await?.is_some() {
                    return Err(reject(OP, Category::WrongState,
                        "an elastic lane is not recreated: end its lease (mosaic lane unlease) and lease another"));
                }
                let d = f.cas(
                    concatcp!("UPDATE lane_incarnations li SET recreate_requested_at = clock_timestamp() \
                     WHERE li.lane_incarnation_id = $1 AND li.retired_at IS NULL AND li.recreate_requested_at IS NULL \
                       AND li.state IN (", LaneState::IdleClean.sql(), ", ", LaneState::Quarantined.sql(), ") \
                       AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL) \
                     RETURNING li.lane_id"),
                    &[&inc],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState,
                        "only an IDLE_CLEAN or QUARANTINED lane with no open chain can be recreated (stop or cancel its assignment first)").await?),
                };
                let lane: String = d.row().col("lane_id")?;
                d.decide(json!({ "lane_id": lane, "lane_incarnation_id": inc, "recreate_requested": true }))
            }),
        )
        .await
    }

    /// The host reports it quarantined the lane: the coordinator's lane follows (an
    /// operator sees the reason; the way out is `mosaic lane recreate`).
    pub async fn host_quarantine(
        &self,
        l: &Leader,
        lane_incarnation_id: &str,
        reason: &str,
    ) -> Result<Receipt, AuthorityError> {
        self.quarantine(l, lane_incarnation_id, &format!("host: {reason}"), true)
            .await
    }
}

impl super::txn::Decided<'_> {
    /// The open work of a retired incarnation: final if an end was requested (the host's
    /// verified teardown of the lane is its end), recovery otherwise; its leases and
    /// reservation released, its generations recorded as ended with it (a late receipt
    /// for one is kept as evidence). `cause` names what retired it (digested into the
    /// final evidence).
    async fn retire_open_work(
        &self,
        old: &str,
        cause: &str,
        next_action: &str,
    ) -> Result<(), AuthorityError> {
        let fe = format!(
            "sha256:{}",
            crate::util::sha256_hex(
                "mosaic/lane-recreated/v1",
                &[old.as_bytes(), cause.as_bytes()]
            )
        );
        self.exec(
            concatcp!("UPDATE assignments SET lifecycle = requested_outcome, final_evidence_digest = $2, finalized_at = clock_timestamp(), \
                    execution_owner = NULL, pending_target = NULL, next_action = 'none: ' || requested_outcome \
             WHERE lane_incarnation_id = $1 AND lifecycle IN (", Lifecycle::Active.sql(), ", ", Lifecycle::Recovery.sql(), ") AND requested_outcome IS NOT NULL"),
            &[&old, &fe],
        ).await?;
        self.to_recovery(RecoveryOf::Lane(old), next_action).await?;
        self.exec("UPDATE leases SET released_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND released_at IS NULL", &[&old]).await?;
        self.exec("UPDATE reservations SET released_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND released_at IS NULL", &[&old]).await?;
        self.exec(
            concatcp!(
                "UPDATE generations SET state = ",
                GenState::Ended.sql(),
                ", ended_at = clock_timestamp() WHERE lane_incarnation_id = $1 AND state <> ",
                GenState::Ended.sql()
            ),
            &[&old],
        )
        .await?;
        Ok(())
    }
}

impl Store {
    /// Retires the lane incarnation its host reports destroyed (`mosaic host lane-destroy`,
    /// a decommission): the host reports that only after it stopped the lane's generation,
    /// killed its tmux server and removed its cgroup, so the lane is gone here at once and
    /// no assignment can be reserved on it. Its open work goes to recovery, as when a lane
    /// is recreated. A lane the host creates again arrives as a new incarnation.
    pub async fn retire_destroyed_lane(
        &self,
        l: &Leader,
        host_id: &str,
        lane_id: &str,
        incarnation: &str,
    ) -> Result<(), AuthorityError> {
        const OP: &str = "lane-destroyed";
        let (step, host, lane, inc) = lane_step(OP, l, host_id, lane_id, incarnation);
        self.transition(
            &step,
            body!([host, lane, inc] |f| {
                let d = f.cas(
                    "UPDATE lane_incarnations li SET retired_at = clock_timestamp() FROM lanes ln \
                     WHERE li.lane_incarnation_id = $1 AND li.lane_id = $2 AND ln.lane_id = li.lane_id AND ln.host_id = $3 AND li.retired_at IS NULL \
                     RETURNING li.lane_incarnation_id, li.state",
                    &[&inc, &lane, &host],
                ).await?;
                let Ok(d) = d else {
                    return Err(reject(OP, Category::Conflict, format!("incarnation {inc} of {lane} is not the current one of this host's lane")));
                };
                let old_state: LaneState = d.row().col("state")?;
                d.retire_open_work(&inc, "destroyed", "resume on another lane: its host destroyed the lane").await?;
                // An elastic lane's lease ends with its lane: the host's verified teardown is
                // the destruction's receipt (this transition's).
                let lease = d.query(
                    concatcp!("WITH old AS (SELECT lease_id, state FROM lane_leases WHERE lane_incarnation_id = $1 AND state <> ", LeaseState::Destroyed.sql(), " FOR UPDATE) \
                     UPDATE lane_leases ll SET state = ", LeaseState::Destroyed.sql(), ", destroyed_at = clock_timestamp() \
                     FROM old WHERE ll.lease_id = old.lease_id RETURNING ll.lease_id, old.state"),
                    &[&inc],
                ).await?;
                let lease = match lease.first() {
                    Some(r) => json!({ "lease_id": r.col::<String>("lease_id")?, "state_before": r.col::<LeaseState>("state")? }),
                    None => serde_json::Value::Null,
                };
                d.decide(json!({ "lane_id": lane, "lane_incarnation_id": inc, "retired_state": old_state, "cause": "destroyed on its host",
                                 "lease": lease }))
            }),
        )
        .await?;
        Ok(())
    }
}
