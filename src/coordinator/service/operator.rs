//! The operator API: one JSON request per line over the coordinator's local socket (mode
//! 0600: only its owner can open it), or over the mutual-TLS operator listener (the client
//! certificate must name an `operator:` principal). Operator requests are not envelopes:
//! their authority is the socket's owner or the operator certificate.
//!
//! Every request is validated before anything is reserved: a bad request gets a typed
//! error (`{"ok": false, "error": {"category": …, "message": …}}`) and changes nothing.
//!
//! **Never:** answers with task text, fence material or keys; reports an outcome the
//! database has not finalized.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::coordinator::chain::ReserveRequest;
use crate::coordinator::error::{AuthorityError, Category};
use crate::coordinator::model::{ChainRow, Outcome};
use crate::protocol::task;
use crate::protocol::transport::{self, TlsIdentity};

use super::{Service, ServiceError};
use crate::coordinator::states::{ContinuationState, LaneState, Lifecycle, WorkStatus};

/// A refusal as operators see it: a category to count and script on, then prose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", category.as_str())]
pub struct OpError {
    pub category: Category,
    pub message: String,
}

impl<'de> Deserialize<'de> for Category {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Category::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown category {s:?}")))
    }
}

impl OpError {
    pub fn new(category: Category, message: impl Into<String>) -> Self {
        Self {
            category,
            message: message.into(),
        }
    }
}

impl From<AuthorityError> for OpError {
    fn from(e: AuthorityError) -> Self {
        OpError::new(e.operator_category(), e.to_string())
    }
}

/// How long `assign --wait running` waits for RUNNING.
const ASSIGN_WAIT: Duration = Duration::from_secs(60);
/// How long `stop` waits for the host's receipt before answering `pending`.
const STOP_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum OperatorRequest {
    Lanes,
    Status,
    Assign {
        lane_id: String,
        runtime: String,
        task: String,
        /// Capabilities the assignment may use (one effect lease each); default: the lane.
        #[serde(default)]
        scope: Vec<String>,
        /// Capabilities it must not use, even where the scope names them.
        #[serde(default)]
        holds: Vec<String>,
        #[serde(default)]
        completion_policy: Option<String>,
        #[serde(default)]
        wait: bool,
        /// Resume this assignment (in recovery) instead of creating a new one.
        #[serde(default)]
        resume: Option<String>,
        /// Makes a retried request land on the same reservation.
        #[serde(default)]
        request_id: Option<String>,
        /// The inactivity policy (`name@version`) of a new assignment; `default@1` if absent.
        #[serde(default)]
        inactivity_policy: Option<String>,
    },
    Receipts {
        lane_id: Option<String>,
    },
    /// Ends an assignment: CANCELLED by default, COMPLETED with evidence, FAILED.
    Stop {
        assignment_id: String,
        #[serde(default)]
        outcome: Option<String>,
        #[serde(default)]
        evidence_digest: Option<String>,
        #[serde(default = "yes")]
        wait: bool,
    },
    LaneRelease {
        lane_id: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    LaneRecreate {
        lane_id: String,
    },
    Audit {
        #[serde(default)]
        since: i64,
    },
    /// Blocks active work with a canonical code, the digest of its evidence and the action
    /// that would unblock it.
    Block {
        assignment_id: String,
        code: String,
        evidence_digest: String,
        next_action: String,
    },
    /// Makes blocked work active again, with a fresh inactivity period and attempt budget.
    Unblock {
        assignment_id: String,
        next_action: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Publishes an inactivity policy version (frozen once published).
    PolicyPublish {
        policy: crate::coordinator::continuity::InactivityPolicy,
    },
    /// Continues RUNNING work with a next action, delivered to the live generation at its
    /// next settled boundary and accepted exactly once.
    Continue {
        assignment_id: String,
        next_action: String,
        /// How long it may wait for delivery (default 10 min).
        #[serde(default)]
        within_ms: Option<i64>,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// One published policy, with its digest.
    Policy {
        policy_id: String,
    },
    /// Offers RUNNING work to an idle lane (spec §8.1): responsibility moves only by the
    /// target generation's handoff ACK, and the target still needs its own activation.
    Handoff {
        assignment_id: String,
        lane_id: String,
        /// The target's task; default: the current attempt's.
        #[serde(default)]
        task: Option<String>,
        /// How long the target has to acknowledge and activate (default: the reservation
        /// ttl); past it the offer expires and the work stays with its source.
        #[serde(default)]
        within_ms: Option<i64>,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// Waits until anything changes after `version` (at most 20 s), then answers with the
    /// status, each lane's last receipt and the new version: a live view without polling.
    Watch {
        #[serde(default)]
        version: u64,
    },
}

/// The inactivity policy of an assignment whose operator named none (migration 0006).
pub const DEFAULT_INACTIVITY_POLICY: &str = "default@1";

/// How long a `watch` waits for a change before answering anyway.
const WATCH_WAIT: Duration = Duration::from_secs(20);

fn yes() -> bool {
    true
}

fn request_id(given: Option<String>) -> String {
    given.unwrap_or_else(|| format!("rq-{}", uuid::Uuid::new_v4().simple()))
}

impl Service {
    /// Runs one operator request.
    pub async fn operate(
        self: &Arc<Self>,
        req: OperatorRequest,
    ) -> Result<serde_json::Value, OpError> {
        Ok(match req {
            OperatorRequest::Lanes => json!(self.store.lanes().await?),
            OperatorRequest::Status => self.status_json().await?,
            OperatorRequest::Watch { version } => {
                let mut changed = self.changed.subscribe();
                // A version from another process (or before a restart) is simply old.
                if *changed.borrow_and_update() == version {
                    let _ = tokio::time::timeout(WATCH_WAIT, changed.changed()).await;
                }
                let now = *changed.borrow();
                let mut v = self.status_json().await?;
                v["version"] = json!(now);
                v["last_receipts"] = json!(self.store.last_receipts().await?);
                v
            }
            OperatorRequest::Assign {
                lane_id,
                runtime,
                task,
                scope,
                holds,
                completion_policy,
                wait,
                resume,
                request_id: rid,
                inactivity_policy,
            } => {
                self.assign(AssignRequest {
                    lane_id,
                    runtime,
                    task,
                    scope,
                    holds,
                    completion_policy: completion_policy
                        .unwrap_or_else(|| task::COMPLETION_POLICIES[0].into()),
                    wait,
                    resume,
                    request_id: request_id(rid),
                    inactivity_policy: inactivity_policy
                        .unwrap_or_else(|| DEFAULT_INACTIVITY_POLICY.into()),
                })
                .await?
            }
            OperatorRequest::Receipts { lane_id } => {
                json!(self.store.termination_receipts(lane_id.as_deref()).await?)
            }
            OperatorRequest::Stop {
                assignment_id,
                outcome,
                evidence_digest,
                wait,
            } => {
                let outcome = match outcome.as_deref() {
                    None => Outcome::Cancelled,
                    Some(o) => Outcome::parse(o).ok_or_else(|| {
                        OpError::new(
                            Category::BadInput,
                            format!("unknown outcome {o:?} (completed, failed, cancelled)"),
                        )
                    })?,
                };
                if outcome == Outcome::Quarantined {
                    return Err(OpError::new(
                        Category::BadInput,
                        "QUARANTINED is decided by the coordinator, not requested",
                    ));
                }
                self.stop(&assignment_id, outcome, evidence_digest.as_deref(), wait)
                    .await?
            }
            OperatorRequest::LaneRelease {
                lane_id,
                request_id: rid,
            } => {
                let l = self.leader().await?;
                let lane = self.known_lane(&lane_id).await?;
                let r = self
                    .store
                    .release_quarantine(&l, &lane.lane_incarnation_id, &request_id(rid))
                    .await;
                let r = self.settled(&l, r).await?;
                json!({ "lane_id": lane_id, "lane_incarnation_id": lane.lane_incarnation_id, "state": LaneState::IdleClean, "receipt_id": r.receipt_id })
            }
            OperatorRequest::LaneRecreate { lane_id } => {
                let l = self.leader().await?;
                let lane = self.known_lane(&lane_id).await?;
                let r = self
                    .store
                    .request_recreate(&l, &lane.lane_incarnation_id)
                    .await;
                let r = self.settled(&l, r).await?;
                let connected = self.hosts.is_connected(&lane.host_id);
                if connected {
                    self.reconcile_host(&l, &lane.host_id, None).await;
                }
                json!({ "lane_id": lane_id, "retiring_incarnation": lane.lane_incarnation_id, "recreate_requested": true,
                        "receipt_id": r.receipt_id,
                        "pending": if connected { "the host destroys and recreates the lane; its new incarnation appears in `mosaic lanes`" }
                                   else { "host unreachable: the lane is recreated when its host reconnects" } })
            }
            OperatorRequest::Audit { since } => json!(self.store.audit_log(since).await?),
            OperatorRequest::Block {
                assignment_id,
                code,
                evidence_digest,
                next_action,
            } => {
                let l = self.leader().await?;
                let r = self
                    .store
                    .block(
                        &l,
                        &assignment_id,
                        &crate::coordinator::continuity::Blocker::Operator,
                        &code,
                        &evidence_digest,
                        &next_action,
                    )
                    .await;
                let r = self.settled(&l, r).await?;
                json!({ "assignment_id": assignment_id, "work_status": WorkStatus::Blocked, "blocker_code": code,
                        "next_action": next_action, "receipt_id": r.receipt_id })
            }
            OperatorRequest::Unblock {
                assignment_id,
                next_action,
                request_id: rid,
            } => {
                let l = self.leader().await?;
                let r = self
                    .store
                    .unblock(&l, &assignment_id, &next_action, &request_id(rid))
                    .await;
                let r = self.settled(&l, r).await?;
                json!({ "assignment_id": assignment_id, "work_status": WorkStatus::Active, "next_action": next_action,
                        "inactivity_deadline": r.body["inactivity_deadline"], "receipt_id": r.receipt_id })
            }
            OperatorRequest::PolicyPublish { policy } => {
                let l = self.leader().await?;
                let r = self.store.publish_policy(&l, &policy).await;
                let r = self.settled(&l, r).await?;
                json!({ "policy_id": policy.policy_id, "digest": r.body["digest"], "receipt_id": r.receipt_id })
            }
            OperatorRequest::Handoff {
                assignment_id,
                lane_id,
                task,
                within_ms,
                request_id: rid,
            } => {
                self.handoff(&assignment_id, &lane_id, task, within_ms, request_id(rid))
                    .await?
            }
            OperatorRequest::Continue {
                assignment_id,
                next_action,
                within_ms,
                request_id: rid,
            } => {
                let l = self.leader().await?;
                let r = self
                    .store
                    .create_continuation(
                        &l,
                        &assignment_id,
                        &next_action,
                        &request_id(rid),
                        within_ms.unwrap_or(600_000),
                    )
                    .await;
                let r = self.settled(&l, r).await?;
                let id = r.str("continuation_id")?;
                self.push_continuations(&l, Some(&id)).await;
                json!({ "assignment_id": assignment_id, "continuation_id": id, "state": ContinuationState::Pending,
                        "expires_at": r.body["expires_at"], "receipt_id": r.receipt_id })
            }
            OperatorRequest::Policy { policy_id } => match self.store.policy(&policy_id).await? {
                Some((p, digest)) => json!({ "policy": p, "digest": digest }),
                None => {
                    return Err(OpError::new(
                        Category::NotFound,
                        format!("no published inactivity policy {policy_id}"),
                    ))
                }
            },
        })
    }

    async fn settled<T>(
        &self,
        l: &crate::coordinator::leader::Leader,
        r: Result<T, AuthorityError>,
    ) -> Result<T, OpError> {
        match r {
            Ok(v) => {
                self.bump();
                Ok(v)
            }
            Err(e) => {
                self.note(l, &e).await;
                Err(e.into())
            }
        }
    }

    async fn known_lane(
        &self,
        lane_id: &str,
    ) -> Result<crate::coordinator::model::LaneView, OpError> {
        if !lane_id.contains(':') {
            return Err(OpError::new(
                Category::BadInput,
                format!("lane ids are host:lane, got {lane_id:?}"),
            ));
        }
        self.store
            .lane(lane_id)
            .await?
            .ok_or_else(|| OpError::new(Category::NotFound, format!("no lane {lane_id}")))
    }

    async fn status_json(&self) -> Result<serde_json::Value, OpError> {
        let epoch = self.leadership.current().await.map(|l| l.epoch());
        Ok(json!({
            "assignments": self.store.assignment_statuses().await?,
            "lanes": self.store.lanes().await?,
            "coordinator_epoch": epoch,
            "leadership": self.leadership_status(),
            "hosts_connected": self.connected_hosts(),
            "host_sessions": self.hosts.views(),
        }))
    }

    /// `mosaic assign`: validates everything, reserves, and drives the chain; with `wait`,
    /// returns once the generation is RUNNING (or the chain ended).
    pub async fn assign(self: &Arc<Self>, a: AssignRequest) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let lane = self.known_lane(&a.lane_id).await?;
        if let Some(r) = &a.resume {
            if self.store.assignment(r).await?.is_none() {
                return Err(OpError::new(
                    Category::NotFound,
                    format!("no assignment {r} to resume"),
                ));
            }
        }
        if !self.hosts.is_connected(&lane.host_id) {
            return Err(OpError::new(
                Category::HostUnreachable,
                format!("host:{} is not connected to this coordinator", lane.host_id),
            ));
        }
        let runtimes = self
            .store
            .host_runtimes(&lane.host_id)
            .await?
            .unwrap_or_default();
        if !runtimes.iter().any(|r| r == &a.runtime) {
            return Err(OpError::new(
                Category::UnknownRuntime,
                format!(
                    "host:{} does not offer runtime {}; it advertises: {}",
                    lane.host_id,
                    a.runtime,
                    if runtimes.is_empty() {
                        "nothing".into()
                    } else {
                        runtimes.join(", ")
                    }
                ),
            ));
        }
        crate::adapter::validate_task(&a.runtime, &a.task).map_err(|e| {
            let cat = match e {
                task::TaskError::TooLarge { .. } => Category::TooLarge,
                task::TaskError::BadRuntime(_) => Category::UnknownRuntime,
                task::TaskError::Empty | task::TaskError::Grammar { .. } => Category::BadInput,
            };
            OpError::new(cat, e.to_string())
        })?;
        if !task::COMPLETION_POLICIES.contains(&a.completion_policy.as_str()) {
            return Err(OpError::new(
                Category::BadInput,
                format!(
                    "unknown completion policy {:?}; known: {}",
                    a.completion_policy,
                    task::COMPLETION_POLICIES.join(", ")
                ),
            ));
        }
        // A new assignment's inactivity policy must be published (a resumed one keeps its own).
        if a.resume.is_none() && self.store.policy(&a.inactivity_policy).await?.is_none() {
            return Err(OpError::new(
                Category::NotFound,
                format!(
                    "no published inactivity policy {:?} (mosaic policy publish FILE)",
                    a.inactivity_policy
                ),
            ));
        }
        let scope = if a.scope.is_empty() {
            vec![format!("lane:{}", a.lane_id)]
        } else {
            a.scope.clone()
        };
        if scope
            .iter()
            .chain(a.holds.iter())
            .any(|s| s.trim().is_empty() || s.len() > 200)
        {
            return Err(OpError::new(
                Category::BadInput,
                "scope and holds entries are non-empty names of at most 200 bytes",
            ));
        }
        let req = ReserveRequest {
            request_id: a.request_id.clone(),
            lane_incarnation_id: lane.lane_incarnation_id.clone(),
            assignment_id: a.resume.clone(),
            target: a.lane_id.clone(),
            runtime_id: a.runtime.clone(),
            task_text: a.task.clone(),
            scope,
            holds: a.holds.clone(),
            completion_policy: a.completion_policy.clone(),
            inactivity_policy: a.inactivity_policy.clone(),
            ttl_ms: self.timing.reservation_ttl_ms,
        };
        let r = self.store.reserve(&l, &req).await;
        let reserved = self.settled(&l, r).await?;
        let res = reserved.chain.reservation_id.clone();
        let c = self.advance(&l, &res).await?;
        let base = json!({ "assignment_id": reserved.chain.assignment_id, "lane_id": a.lane_id,
                           "lane_incarnation_id": reserved.chain.lane_incarnation_id, "reservation_id": res });
        if !a.wait {
            let mut out = base;
            if let Some(c) = c {
                out["state"] = json!(c.lane_state);
                out["generation"] = json!(c.generation);
            }
            return Ok(out);
        }
        let c = self
            .wait_chain(&res, ASSIGN_WAIT, |c| {
                c.lane_state == LaneState::Running || !c.reservation_open || c.lane_retired
            })
            .await?;
        if c.lane_state == LaneState::Running && c.reservation_open {
            let mut out = base;
            out["state"] = json!(LaneState::Running);
            out["generation"] = json!(c.generation);
            let id = c.process_identity.clone().unwrap_or_default();
            out["process_identity"] = json!({
                "root_pid": id["root_pid"], "start_time": id["root_start_time"],
                "cgroup_path": id["cgroup_path"], "launch_nonce_digest": id["launch_nonce_digest"] });
            return Ok(out);
        }
        let a = self.store.assignment(&c.chain.assignment_id).await?;
        Err(OpError::new(
            Category::ChainEnded,
            format!(
                "the chain ended before RUNNING (lane {}): {}",
                c.lane_state,
                a.map(|a| a.next_action).unwrap_or_default()
            ),
        ))
    }

    /// `mosaic handoff`: validated like an assign (lane, host, runtime, task) before anything
    /// is reserved; then the offer and the target chain, driven as far as it goes.
    async fn handoff(
        &self,
        assignment_id: &str,
        lane_id: &str,
        task: Option<String>,
        within_ms: Option<i64>,
        request_id: String,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let lane = self.known_lane(lane_id).await?;
        if within_ms.is_some_and(|w| !(1000..=86_400_000).contains(&w)) {
            return Err(OpError::new(
                Category::BadInput,
                "--within-ms takes 1000..86400000",
            ));
        }
        let Some(a) = self.store.assignment(assignment_id).await? else {
            return Err(OpError::new(
                Category::NotFound,
                format!("no assignment {assignment_id}"),
            ));
        };
        if !self.hosts.is_connected(&lane.host_id) {
            return Err(OpError::new(
                Category::HostUnreachable,
                format!("host:{} is not connected to this coordinator", lane.host_id),
            ));
        }
        let runtime = a.runtime_id;
        let runtimes = self
            .store
            .host_runtimes(&lane.host_id)
            .await?
            .unwrap_or_default();
        if !runtimes.iter().any(|r| r == &runtime) {
            return Err(OpError::new(
                Category::UnknownRuntime,
                format!("host:{} does not offer runtime {runtime}", lane.host_id),
            ));
        }
        if let Some(t) = &task {
            crate::adapter::validate_task(&runtime, t).map_err(|e| {
                OpError::new(
                    match e {
                        task::TaskError::TooLarge { .. } => Category::TooLarge,
                        _ => Category::BadInput,
                    },
                    e.to_string(),
                )
            })?;
        }
        let req = crate::coordinator::handoff::OfferRequest {
            request_id,
            assignment_id: assignment_id.to_string(),
            target_lane_incarnation_id: lane.lane_incarnation_id.clone(),
            task_text: task,
            ttl_ms: within_ms.unwrap_or(self.timing.reservation_ttl_ms),
        };
        let r = self.store.offer_handoff(&l, &req).await;
        let chain = self.settled(&l, r).await?;
        let c = self.advance(&l, &chain.reservation_id).await?;
        let h = self
            .store
            .handoff_of_reservation(&chain.reservation_id)
            .await?;
        Ok(
            json!({ "assignment_id": assignment_id, "handoff_id": h.map(|h| h.handoff_id), "target_lane_id": lane_id,
                   "target_reservation_id": chain.reservation_id, "target_state": c.map(|c| c.lane_state),
                   "pending": "the target's fresh generation acknowledges the handoff (mosaic lane handoff-ack); only then does responsibility move" }),
        )
    }

    /// Waits until the chain of `reservation` satisfies `done` (re-read after every change
    /// this process makes, and at least every 200 ms for changes made by another one).
    async fn wait_chain(
        &self,
        reservation: &str,
        within: Duration,
        done: impl Fn(&ChainRow) -> bool,
    ) -> Result<ChainRow, OpError> {
        let deadline = tokio::time::Instant::now() + within;
        let mut changed = self.changed.subscribe();
        loop {
            let c = self
                .store
                .chain_by_reservation(reservation)
                .await?
                .ok_or_else(|| {
                    OpError::new(Category::NotFound, format!("no reservation {reservation}"))
                })?;
            if done(&c) {
                return Ok(c);
            }
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(OpError::new(Category::Timeout, format!("no answer within {} s; the chain is {}", within.as_secs(), c.lane_state)));
                }
            }
        }
    }

    /// `mosaic stop` / `cancel`: revokes the leases at once, has the host stop the
    /// generation, and answers with the final outcome once the host's receipt proves the
    /// end — or `pending` when the host is unreachable (the outcome becomes final when it
    /// reconnects). Repeating it is idempotent.
    pub async fn stop(
        self: &Arc<Self>,
        assignment_id: &str,
        outcome: Outcome,
        evidence: Option<&str>,
        wait: bool,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let r = self
            .store
            .request_end(&l, assignment_id, outcome, evidence)
            .await;
        let ended = match self.settled(&l, r).await {
            // The end of this assignment was already asked for with another outcome or
            // evidence (the key is the assignment's): that is a conflict, not a bad key.
            Err(e) if e.category == Category::IdempotencyConflict => {
                let asked = self
                    .store
                    .assignment(assignment_id)
                    .await?
                    .and_then(|a| a.requested_outcome)
                    .unwrap_or_default();
                return Err(OpError::new(
                    Category::Conflict,
                    format!(
                        "an end of {assignment_id} was already requested (outcome {asked}); it cannot be changed"
                    ),
                ));
            }
            other => other?,
        };
        let chain = self.store.chain_of_assignment(assignment_id).await?;
        let host = chain
            .as_ref()
            .map(|c| c.host_id.clone())
            .unwrap_or_default();
        if let Some(c) = &chain {
            self.advance(&l, &c.chain.reservation_id).await.ok();
        }
        let view = |a: Option<crate::coordinator::model::AssignmentView>| {
            json!({ "assignment_id": assignment_id, "requested_outcome": outcome.as_str(),
                    "state": a.as_ref().map(|a| a.lifecycle), "final_evidence_digest": a.and_then(|a| a.final_evidence_digest),
                    "leases_revoked": true })
        };
        let done = |s: &Lifecycle| !crate::coordinator::states::NONTERMINAL.contains(s);
        let now = self.store.assignment(assignment_id).await?;
        if !ended.awaiting_receipt || now.as_ref().is_some_and(|a| done(&a.lifecycle)) || !wait {
            let mut v = view(now);
            let final_now = v["state"]
                .as_str()
                .and_then(|s| s.parse::<Lifecycle>().ok())
                .is_some_and(|s| done(&s));
            if ended.awaiting_receipt && !final_now {
                v["pending"] = json!("waiting for the host's termination receipt");
            }
            return Ok(v);
        }
        if !self.hosts.is_connected(&host) {
            let mut v = view(now);
            v["pending"] = json!("host unreachable: the generation is stopped and the outcome made final when the host reconnects");
            return Ok(v);
        }
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        let mut changed = self.changed.subscribe();
        loop {
            let a = self.store.assignment(assignment_id).await?;
            if a.as_ref().is_some_and(|a| done(&a.lifecycle)) {
                return Ok(view(a));
            }
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let mut v = view(a);
                    v["pending"] = json!("waiting for the host's termination receipt");
                    return Ok(v);
                }
            }
        }
    }
}

/// What `mosaic assign` asks for.
#[derive(Debug, Clone)]
pub struct AssignRequest {
    pub lane_id: String,
    pub runtime: String,
    pub task: String,
    pub scope: Vec<String>,
    pub holds: Vec<String>,
    pub completion_policy: String,
    pub wait: bool,
    pub resume: Option<String>,
    pub request_id: String,
    pub inactivity_policy: String,
}

impl AssignRequest {
    /// A plain assignment with the defaults (`mosaic up --demo`, tests).
    pub fn new(lane_id: &str, runtime: &str, task: &str, wait: bool) -> Self {
        Self {
            lane_id: lane_id.into(),
            runtime: runtime.into(),
            task: task.into(),
            scope: vec![],
            holds: vec![],
            completion_policy: task::COMPLETION_POLICIES[0].into(),
            wait,
            resume: None,
            request_id: request_id(None),
            inactivity_policy: DEFAULT_INACTIVITY_POLICY.into(),
        }
    }
}

/// Binds the operator socket (mode 0600) so it exists before anyone is told it does.
pub fn bind_operators(path: &Path) -> Result<tokio::net::UnixListener, ServiceError> {
    if let Some(dir) = path.parent() {
        crate::util::durable::ensure_dir(dir, 0o700)
            .map_err(|e| ServiceError::Config(e.to_string()))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub async fn serve_operators(
    svc: Arc<Service>,
    listener: tokio::net::UnixListener,
) -> Result<(), ServiceError> {
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(operator_session(svc.clone(), stream));
    }
}

/// Remote operators: mutual TLS with a CA-issued certificate naming `operator:<name>`.
pub async fn serve_remote_operators(
    svc: Arc<Service>,
    listener: tokio::net::TcpListener,
    tls: TlsIdentity,
) -> Result<(), ServiceError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(transport::server_tls(&tls)?);
    loop {
        let (tcp, addr) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let (svc, acceptor) = (svc.clone(), acceptor.clone());
        tokio::spawn(async move {
            let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                tracing::warn!(%addr, "operator TLS handshake failed");
                return;
            };
            let principal = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| crate::pki::principal_of(c));
            match principal {
                Some(p) if p.starts_with("operator:") => {
                    tracing::info!(operator = %p, %addr, "operator connected");
                    operator_session(svc, stream).await;
                }
                other => tracing::warn!(?other, %addr, "refused: not an operator certificate"),
            }
        });
    }
}

/// One operator connection: JSON requests, one per line, answered in order.
async fn operator_session<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    svc: Arc<Service>,
    stream: S,
) {
    let (r, mut w) = tokio::io::split(stream);
    let mut lines = tokio::io::BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let resp = match serde_json::from_str::<OperatorRequest>(&line) {
            Err(e) => {
                json!({ "ok": false, "error": OpError::new(Category::BadInput, format!("bad request: {e}")) })
            }
            Ok(req) => match svc.operate(req).await {
                Ok(v) => json!({ "ok": true, "result": v }),
                Err(e) => json!({ "ok": false, "error": e }),
            },
        };
        let mut out = resp.to_string().into_bytes();
        out.push(b'\n');
        if w.write_all(&out).await.is_err() || w.flush().await.is_err() {
            break;
        }
    }
}

/// Where an operator reaches the coordinator.
#[derive(Debug, Clone)]
pub enum OperatorTarget {
    /// The coordinator's local socket.
    Socket(PathBuf),
    /// A remote coordinator's operator listener, with this operator's certificate.
    Remote {
        addr: String,
        server_name: String,
        tls: TlsIdentity,
    },
}

/// Parses `--coordinator`: `HOST:PORT` or `tls://HOST:PORT[/]`, IPv6 hosts in brackets.
/// Returns the address to dial and the host part (the default certificate name).
pub fn parse_coordinator_addr(s: &str) -> Result<(String, String), String> {
    let rest = match s.split_once("://") {
        None => s,
        Some(("tls", rest)) => rest.trim_end_matches('/'),
        Some((scheme, _)) => {
            return Err(format!(
                "--coordinator {s}: scheme {scheme}:// is not supported; use HOST:PORT or tls://HOST:PORT (the operator listener speaks mutual TLS)"
            ))
        }
    };
    let bad = || format!("--coordinator {s}: expected HOST:PORT or tls://HOST:PORT");
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.is_empty() || rest.contains('/') || (bare == host && host.contains(':')) {
        return Err(bad());
    }
    Ok((rest.to_string(), bare.to_string()))
}

fn unavailable(e: impl std::fmt::Display) -> OpError {
    OpError::new(Category::Unavailable, e.to_string())
}

/// Sends one operator request to `target` (blocking; for the CLI and tests).
pub fn operator_request(
    target: &OperatorTarget,
    req: &OperatorRequest,
) -> Result<serde_json::Value, OpError> {
    match target {
        OperatorTarget::Socket(p) => operator_call(p, req),
        OperatorTarget::Remote {
            addr,
            server_name,
            tls,
        } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(unavailable)?;
            rt.block_on(async {
                let cfg = transport::client_tls(tls).map_err(unavailable)?;
                let tcp = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| unavailable(format!("cannot reach {addr}: {e}")))?;
                let _ = tcp.set_nodelay(true);
                let name = rustls::pki_types::ServerName::try_from(server_name.clone())
                    .map_err(unavailable)?;
                let mut s = tokio_rustls::TlsConnector::from(cfg)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| unavailable(format!("TLS: {e}")))?;
                let mut line = serde_json::to_vec(req).map_err(unavailable)?;
                line.push(b'\n');
                s.write_all(&line).await.map_err(unavailable)?;
                s.flush().await.map_err(unavailable)?;
                let mut out = String::new();
                tokio::io::BufReader::new(s)
                    .read_line(&mut out)
                    .await
                    .map_err(unavailable)?;
                decode_operator_response(
                    &out,
                    "is this an operator certificate from its CA? did the coordinator stop?",
                )
            })
        }
    }
}

/// `hint`: what an unanswered request most likely means on this kind of connection.
fn decode_operator_response(out: &str, hint: &str) -> Result<serde_json::Value, OpError> {
    if out.is_empty() {
        return Err(unavailable(format!(
            "the coordinator closed the connection without an answer ({hint})"
        )));
    }
    let v: serde_json::Value = serde_json::from_str(out).map_err(unavailable)?;
    if v["ok"] == true {
        Ok(v["result"].clone())
    } else {
        Err(serde_json::from_value(v["error"].clone())
            .unwrap_or_else(|_| OpError::new(Category::Internal, v["error"].to_string())))
    }
}

/// Sends one operator request over the local socket (blocking; for the CLI and tests).
pub fn operator_call(path: &Path, req: &OperatorRequest) -> Result<serde_json::Value, OpError> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path).map_err(|e| {
        unavailable(format!(
            "cannot reach the coordinator at {}: {e}",
            path.display()
        ))
    })?;
    let mut line = serde_json::to_vec(req).map_err(unavailable)?;
    line.push(b'\n');
    s.write_all(&line).map_err(unavailable)?;
    let mut out = String::new();
    std::io::BufReader::new(s)
        .read_line(&mut out)
        .map_err(unavailable)?;
    decode_operator_response(
        &out,
        "it stopped or restarted while answering; the request may or may not have been applied — `status` shows which",
    )
}

#[cfg(test)]
mod tests {
    use super::parse_coordinator_addr as p;

    #[test]
    fn coordinator_addresses_parse_or_fail_with_the_reason() {
        let ok = |a: &str, h: &str| Ok((a.to_string(), h.to_string()));
        assert_eq!(
            p("coord.example:7443"),
            ok("coord.example:7443", "coord.example")
        );
        assert_eq!(
            p("tls://coord.example:7443/"),
            ok("coord.example:7443", "coord.example")
        );
        assert_eq!(p("[::1]:7443"), ok("[::1]:7443", "::1"));
        for bad in [
            "coord.example",
            "coord:http",
            ":7443",
            "::1:7443",
            "tls://c:1/x",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(p("https://c:1").unwrap_err().contains("not supported"));
    }
}
