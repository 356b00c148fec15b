//! Carrying out operator requests: status, assign (reserve and drive to RUNNING), handoff,
//! stop, and the rest of the operator surface.

use super::*;

impl Service {
    /// Runs one operator request. A mutating one is journaled under its idempotency key
    /// first (given, or made here): a key used for another request is refused, an answered
    /// request gets its answer back (with what its subject is now), and one without a
    /// recorded answer is carried out — again, if an earlier try ended ambiguously, landing
    /// on what that try committed. Only an answer that says the request took effect is
    /// recorded as its answer; a refusal changed nothing and is remembered only for `request
    /// show`; an answer that leaves the outcome open is not recorded at all, and says so
    /// (`state: unknown`, with the key).
    pub async fn operate(
        self: &Arc<Self>,
        mut req: OperatorRequest,
        who: &str,
    ) -> Result<serde_json::Value, OpError> {
        let (Some(operation), Some(id)) = (req.mutation(), req.keyed()) else {
            return self.perform(req, who).await;
        };
        let subject = req.subject();
        let opened = self
            .store
            .open_request(&id, operation, &req.digest(), &subject)
            .await
            .map_err(|e| OpError::from(e).of_request(&id))?;
        match &opened {
            Opened::OtherRequest { operation: other } => {
                return Err(OpError::new(
                    Category::IdempotencyConflict,
                    format!("request id {id} belongs to another request ({other}); a new request needs a new id"),
                )
                .of_request(&id))
            }
            Opened::Answered(a) if a["ok"] == true => {
                let mut v = a["result"].clone();
                v["replayed"] = json!(true);
                v["now"] = self.now_of(&subject, &v).await;
                return Ok(v);
            }
            Opened::Answered(_) | Opened::New | Opened::Unanswered => {}
        }
        // An earlier try ended with its outcome open: a refusal of this one does not close it.
        let earlier_open = opened == Opened::Unanswered;
        let settle = matches!(req, OperatorRequest::Stop { wait: true, .. });
        let (out, committed) =
            crate::coordinator::requests::tracking_commits(self.perform(req, who)).await;
        match out {
            Ok(mut v) => {
                if v.is_object() {
                    v["request_id"] = json!(id);
                }
                // The answer stands whether or not it could be recorded: a repeat finds no
                // answer and carries the request out again, landing on this outcome.
                if let Err(e) = self
                    .store
                    .record_answer(&id, &json!({ "ok": true, "result": v }))
                    .await
                {
                    tracing::warn!(request_id = %id, error = %e, "the answer of an operator request could not be recorded");
                }
                if settle {
                    v = self.with_settled_lane(v).await;
                }
                Ok(v)
            }
            Err(e) => {
                let mut e = e.of_request(&id);
                // Part of the request committed (in this try, or in an earlier one whose
                // outcome was left open) and then it failed: unless the refusal is the
                // definite end of what committed (a chain that ended before RUNNING), the
                // rest may still be carried out by a repeat.
                if (committed || earlier_open) && e.category != Category::ChainEnded {
                    e.state = Some(RequestState::Unknown);
                }
                if e.state.is_none() {
                    let _ = self
                        .store
                        .record_answer(
                            &id,
                            &json!({ "ok": false, "error": e, "took_effect": committed }),
                        )
                        .await;
                }
                Err(e)
            }
        }
    }

    /// What the subject of an answered request is now: its assignment's lifecycle and next
    /// action (the one the answer names, else the one the request named), or its lane's
    /// state (lane requests name no assignment).
    async fn now_of(
        &self,
        subject: &serde_json::Value,
        answer: &serde_json::Value,
    ) -> serde_json::Value {
        let assignment = answer["assignment_id"]
            .as_str()
            .or(subject["assignment_id"].as_str());
        if let Some(id) = assignment {
            return match self.store.assignment(id).await {
                Ok(Some(a)) => {
                    json!({ "assignment_id": id, "state": a.lifecycle, "next_action": a.next_action })
                }
                Ok(None) => json!({ "assignment_id": id, "state": null }),
                Err(e) => json!({ "unavailable": e.to_string() }),
            };
        }
        if let Some(lane) = subject["lane_id"].as_str() {
            return match self.store.lane(lane).await {
                Ok(Some(l)) => {
                    json!({ "lane_id": lane, "lane_incarnation_id": l.lane_incarnation_id, "state": l.state })
                }
                Ok(None) => json!({ "lane_id": lane, "state": null }),
                Err(e) => json!({ "unavailable": e.to_string() }),
            };
        }
        serde_json::Value::Null
    }

    /// `mosaic request show ID`: the journal's row, read as `answered` (with the answer and
    /// what its subject is now), `refused` (nothing changed; it may be repeated), `failed`
    /// (it took effect, then ended short of its goal: the error says how) or `unknown` (no
    /// answer recorded: its try was cut short or is still running; for an assign, whether
    /// its reservation committed).
    async fn show_request(&self, id: &str) -> Result<serde_json::Value, OpError> {
        let Some(e) = self.store.journal_entry(id).await? else {
            return Err(OpError::new(
                Category::NotFound,
                format!("no operator request {id} (requests are kept 30 days)"),
            ));
        };
        let answer = e.answer.clone().unwrap_or(serde_json::Value::Null);
        let state = match (answer["ok"].as_bool(), answer["took_effect"] == true) {
            (Some(true), _) => "answered",
            (Some(false), true) => "failed",
            (Some(false), false) => "refused",
            (None, _) => "unknown",
        };
        let mut out = json!({ "request_id": e.request_id, "operation": e.operation, "subject": e.subject,
                              "received_at": e.received_at, "answered_at": e.answered_at, "state": state });
        if state == "answered" {
            out["answer"] = answer["result"].clone();
            out["now"] = self.now_of(&e.subject, &answer["result"]).await;
            return Ok(out);
        }
        // An assign's assignment is known once its reservation committed, answer or not.
        let mut known = serde_json::Value::Null;
        if e.operation == "assign" {
            if let Some(a) = self.store.assignment_of_request(id).await? {
                known = json!({ "assignment_id": a });
            }
            out["reserved"] = json!(!known.is_null());
        }
        out["now"] = self.now_of(&e.subject, &known).await;
        if state == "unknown" {
            out["next"] = json!(format!("repeat the request with --request-id {id}: it returns the outcome, and carries out only what had not been"));
        } else {
            out["error"] = answer["error"].clone();
        }
        Ok(out)
    }

    /// Runs one operator request (after the journal, for a mutating one) for operator `who`.
    async fn perform(
        self: &Arc<Self>,
        req: OperatorRequest,
        who: &str,
    ) -> Result<serde_json::Value, OpError> {
        Ok(match req {
            OperatorRequest::Request { request_id } => self.show_request(&request_id).await?,
            OperatorRequest::Lanes => self.lanes_json().await?,
            OperatorRequest::LaneLease {
                ask,
                request_id: rid,
            } => self.lease_lane(&ask, &request_id(rid)).await?,
            OperatorRequest::LaneRenew {
                lease_id,
                request_id: rid,
            } => self.renew_lease(&lease_id, &request_id(rid)).await?,
            OperatorRequest::LaneUnlease {
                lease_id,
                request_id: rid,
            } => self.end_lease(&lease_id, &request_id(rid)).await?,
            OperatorRequest::Leases => json!(self.store.leases().await?),
            OperatorRequest::Notifications => json!(self.store.notifications(200).await?),
            OperatorRequest::Retarget { assignment_id, .. } => {
                self.retarget_json(&assignment_id).await?
            }
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
                repo,
                base,
                replace_task,
                from_checkpoint,
                grant_within_s,
                place,
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
                    repo,
                    base,
                    replace_task,
                    from_checkpoint,
                    grant_within_s,
                    place: place.map(|p| *p),
                })
                .await?
            }
            r @ (OperatorRequest::RepoAdd { .. }
            | OperatorRequest::Repos
            | OperatorRequest::Checkpoints { .. }
            | OperatorRequest::CheckpointShow { .. }
            | OperatorRequest::CheckpointRead { .. }
            | OperatorRequest::Artifacts { .. }
            | OperatorRequest::ArtifactRead { .. }
            | OperatorRequest::CheckpointGrants { .. }
            | OperatorRequest::CheckpointGrantRevoke { .. }
            | OperatorRequest::CheckpointGc { .. }
            | OperatorRequest::CheckpointDelete { .. }
            | OperatorRequest::CheckpointDeletions { .. }
            | OperatorRequest::WorkspaceReleases { .. }
            | OperatorRequest::CheckpointReads { .. }) => self.workspace_request(r, who).await?,
            r @ (OperatorRequest::WorkspaceEffect { .. }
            | OperatorRequest::WorkspaceEffects { .. }
            | OperatorRequest::WorkspaceResolve { .. }) => self.hand_on_request(r, who).await?,
            OperatorRequest::TrustRevoke { subject, .. } => self.revoke(&subject).await?,
            OperatorRequest::Trust => self.trust_listing(),
            OperatorRequest::Receipts { lane_id } => {
                json!(self.store.termination_receipts(lane_id.as_deref()).await?)
            }
            OperatorRequest::Stop {
                assignment_id,
                outcome,
                evidence_digest,
                wait,
                request_id: _,
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
            OperatorRequest::LaneRecreate {
                lane_id,
                request_id: _,
            } => {
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
            OperatorRequest::Effects {
                assignment_id,
                limit,
            } => json!(
                self.store
                    .effect_claims(
                        assignment_id.as_deref(),
                        limit.unwrap_or(200).clamp(1, 10_000)
                    )
                    .await?
            ),
            OperatorRequest::EffectResolve {
                effect_id,
                applied,
                evidence_digest,
                request_id: rid,
            } => {
                let l = self.leader().await?;
                let r = self
                    .store
                    .resolve_effect(&l, &effect_id, applied, &evidence_digest, &request_id(rid))
                    .await;
                let r = self.settled(&l, r).await?;
                // A chain that waited for this claim (an activation) may go on now.
                self.bump();
                self.advance_all(&l, None).await;
                json!({ "effect_id": effect_id, "assignment_id": r.body["assignment_id"], "state": r.body["state"],
                        "reconciliation": r.body["reconciliation"], "receipt_id": r.receipt_id })
            }
            OperatorRequest::Block {
                assignment_id,
                code,
                evidence_digest,
                next_action,
                request_id: _,
            } => {
                let l = self.leader().await?;
                let r = self
                    .store
                    .block(
                        &l,
                        &assignment_id,
                        &crate::coordinator::continuity::Blocker::Operator,
                        &crate::coordinator::continuity::Blockage::new(
                            &code,
                            &evidence_digest,
                            &next_action,
                        ),
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
            OperatorRequest::RosterPublish {
                roster,
                request_id: _,
            } => self.roster_publish(&roster).await?,
            OperatorRequest::Roster { reservation_id } => {
                self.roster_show(reservation_id.as_deref()).await?
            }
            OperatorRequest::PolicyPublish {
                policy,
                request_id: _,
            } => {
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

    pub(crate) async fn settled<T>(
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

    pub(super) async fn known_lane(
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

    /// The status; with the database unreachable, what this process knows without it
    /// (its leadership, its host sessions) and the database's error in place of the rows.
    pub(super) async fn status_json(&self) -> Result<serde_json::Value, OpError> {
        let mut unreachable = None;
        let mut rows = |r: Result<serde_json::Value, AuthorityError>| {
            r.unwrap_or_else(|e| {
                unreachable.get_or_insert(e.to_string());
                serde_json::Value::Null
            })
        };
        let mut assignments = rows(self.store.assignment_statuses().await.map(|v| json!(v)));
        // Each assignment's effect claims (by state) and the token usage its provider calls
        // reported (spec §18).
        if let Ok(usage) = self.store.effect_usage().await {
            if let Some(list) = assignments.as_array_mut() {
                for a in list {
                    let u = usage
                        .iter()
                        .find(|u| a["assignment_id"] == u.assignment_id.as_str());
                    a["effects"] = match u {
                        Some(u) => {
                            json!({ "claims": u.claims, "open": u.open, "unknown": u.unknown,
                                           "input_tokens": u.input_tokens, "output_tokens": u.output_tokens })
                        }
                        None => {
                            json!({ "claims": 0, "open": 0, "unknown": 0, "input_tokens": 0, "output_tokens": 0 })
                        }
                    };
                }
            }
        }
        let lanes = rows(self.store.lanes().await.map(|v| json!(v)));
        // One snapshot of the leadership for both its fields, taken after the rows (which
        // may take long when the database is away), so they never disagree.
        let leadership = self.leadership_status();
        let epoch = leadership.epoch;
        Ok(json!({
            "database_unreachable": unreachable,
            "assignments": assignments,
            "lanes": lanes,
            "coordinator_epoch": epoch,
            "leadership": leadership,
            "hosts_connected": self.connected_hosts(),
            "host_sessions": self.hosts.views(),
        }))
    }

    /// `mosaic assign`: validates everything, reserves, and drives the chain; with `wait`,
    /// returns once the generation is RUNNING (or the chain ended).
    pub async fn assign(
        self: &Arc<Self>,
        mut a: AssignRequest,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let placed = self.place(&mut a).await?;
        let lane = self.known_lane(&a.lane_id).await?;
        if placed
            .as_ref()
            .is_some_and(|p| p.lane_incarnation_id != lane.lane_incarnation_id)
        {
            return Err(OpError::new(
                Category::Conflict,
                format!(
                    "lane {} was recreated while it was being chosen; ask again",
                    a.lane_id
                ),
            ));
        }
        if a.resume.is_some() && a.from_checkpoint.is_some() {
            return Err(OpError::new(
                Category::BadInput,
                "--from-checkpoint starts a new assignment, not a resume",
            ));
        }
        if let Some(r) = &a.resume {
            if self.store.assignment(r).await?.is_none() {
                return Err(OpError::new(
                    Category::NotFound,
                    format!("no assignment {r} to resume"),
                ));
            }
            // A resume continues the assignment's own task; another text only on purpose
            // (the new attempt records it, and its contract digest binds it).
            match self.store.latest_task(r).await? {
                Some(own) if a.task.is_empty() => a.task = own,
                Some(own) if own != a.task && !a.replace_task => {
                    return Err(OpError::new(
                        Category::Mismatch,
                        format!(
                            "assignment {r} has another task (sha256 {}…); omit --task to resume it as it is, or pass --replace-task to give it this one",
                            &crate::util::sha256_hex("mosaic/task/v1", &[own.as_bytes()])[..12]
                        ),
                    ));
                }
                _ => {}
            }
        } else if a.replace_task {
            return Err(OpError::new(
                Category::BadInput,
                "--replace-task is for --resume",
            ));
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
        let repository = self.workspace_for(&a, &lane).await?;
        let grant = self.grant_for(&a, repository.as_ref(), &lane).await?;
        // The default scope: the lane itself and its model provider. Egress and pushes are
        // named explicitly (`egress:HOST[:PORT]`, `push:REPO[:REF]`).
        // A resume that names none keeps its assignment's (on whichever lane it resumes).
        let kept = match (&a.resume, a.scope.is_empty()) {
            (Some(asg), true) => self
                .store
                .next_attempt(asg)
                .await?
                .map(|n| n.scope)
                .filter(|s| !s.is_empty()),
            _ => None,
        };
        let scope = if let Some(kept) = kept {
            kept
        } else if a.scope.is_empty() {
            vec![format!("lane:{}", a.lane_id), "provider".to_string()]
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
            repository,
            grant,
            placement: placed.clone(),
            recovery: None,
        };
        let r = self.store.reserve(&l, &req).await;
        let reserved = self.settled(&l, r).await?;
        let res = reserved.chain.reservation_id.clone();
        let c = self.advance(&l, &res).await?;
        let mut base = json!({ "assignment_id": reserved.chain.assignment_id, "lane_id": a.lane_id,
                           "lane_incarnation_id": reserved.chain.lane_incarnation_id, "reservation_id": res });
        if let Some(p) = &placed {
            base["placement"] = json!({ "policy": p.policy, "policy_digest": p.policy_digest,
                                        "inputs_digest": p.inputs_digest, "roster_version": p.inputs.roster_version });
        }
        if !a.wait {
            let mut out = base;
            if let Some(c) = c {
                out["state"] = json!(c.lane_state);
                out["generation"] = json!(c.generation);
            }
            return Ok(out);
        }
        let (c, seen) = self
            .wait_chain(&res, ASSIGN_WAIT, |c| {
                c.lane_state == LaneState::Running || !c.reservation_open || c.lane_retired
            })
            .await?;
        // Decided on what was seen: a chain seen RUNNING reached it, even if it has ended
        // by the time its row was read.
        if seen.lane_state == LaneState::Running && seen.reservation_open {
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
        let said = self.host_said(&c).await?;
        Err(OpError::new(
            Category::ChainEnded,
            format!(
                "the chain ended before RUNNING (lane {}): {}{said}",
                c.lane_state,
                a.map(|a| a.next_action).unwrap_or_default()
            ),
        ))
    }

    /// Waits until the chain of `reservation` satisfies `done`: read once, then as the
    /// waiting hub reads where it stands for every waiter together (after every change this
    /// process makes, and at least every 200 ms for changes made by another one). Returns
    /// where it stood when it satisfied `done` — a committed state the database returned —
    /// and its whole row, read after that (which may have moved on since: a chain seen
    /// RUNNING may have ended by then, and it still reached RUNNING). A failed read of the
    /// row waits for the hub's next reading (every 200 ms at the latest) and reads again.
    pub(super) async fn wait_chain(
        &self,
        reservation: &str,
        within: Duration,
        done: impl Fn(&ChainProgress) -> bool,
    ) -> Result<(ChainRow, ChainProgress), OpError> {
        let deadline = tokio::time::Instant::now() + within;
        // Registered before the first read: every change after it reaches this waiter.
        let mut w = self.waiting.chains.join(reservation);
        let read = || async {
            self.store
                .chain_by_reservation(reservation)
                .await?
                .ok_or_else(|| {
                    OpError::new(Category::NotFound, format!("no reservation {reservation}"))
                })
        };
        let c = read().await?;
        let first = c.progress();
        if done(&first) {
            return Ok((c, first));
        }
        let mut state = first.lane_state;
        loop {
            tokio::select! {
                p = w.next() => {
                    state = p.lane_state;
                    if done(&p) {
                        match read().await {
                            Ok(row) => return Ok((row, p)),
                            Err(e) => tracing::debug!(reservation, error = %e.message, "chain re-read failed; waiting for the next reading"),
                        }
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(OpError::new(Category::Timeout, format!("no answer within {} s; the chain is {}", within.as_secs(), state)));
                }
            }
        }
    }
}
