//! The supervisor's end of a generation's lane socket: each request answered only for a
//! process in the generation's cgroup (`SO_PEERCRED`), as its `GenSession` allows.

use super::*;

/// Serves the socket at `path` until the task is aborted. Only peers whose cgroup is
/// `cgroup_rel` are answered.
/// A generation's lane socket being served: ended with the generation (or its failed
/// launch).
pub(crate) struct LaneServer {
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) session: Arc<GenSession>,
    pub(crate) path: PathBuf,
}

impl LaneServer {
    /// Stops serving (every request still waiting ends with it) and removes the socket; a
    /// harness still waiting for its activation is told `why` it will not come.
    pub(crate) fn end(self, why: &str) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
        if self.session.activation.borrow().is_none() {
            self.session.activation.send_replace(Some(Err(why.into())));
        }
    }
}

/// Serves generation's lane socket at `path`, answering only processes in `cgroup_rel`.
/// `owner`: the lane's uid, which alone may open the socket and its directory (a confined
/// harness runs as it); `None`: the supervisor's user.
pub(crate) fn serve(
    path: &Path,
    cgroup_rel: String,
    s: Arc<GenSession>,
    owner: Option<u32>,
) -> Result<LaneServer, crate::supervisor::SupervisorError> {
    if let Some(dir) = path.parent() {
        // Kept across a supervisor restart: a confined harness sees this directory.
        crate::util::durable::ensure_dir(dir, 0o700)?;
    }
    let listener: UnixListener = crate::supervisor::generation::bind_socket(path)?;
    if let Some(uid) = owner {
        for p in path.parent().into_iter().chain([path]) {
            std::os::unix::fs::lchown(p, Some(uid), Some(uid)).map_err(|source| {
                crate::supervisor::SupervisorError::Io {
                    what: "chown",
                    path: p.to_path_buf(),
                    source,
                }
            })?;
        }
    }
    let session = s.clone();
    let task = tokio::spawn(async move {
        // Every connection is a task of this set, owned by the server task: when the
        // generation's socket is ended (its task aborted), every request still waiting on
        // it (a `lane next` waiting settled, a challenge) ends with it.
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    // Out of descriptors, an aborted connection: transient. Ending here
                    // would end every request still waiting on this socket.
                    Err(e) => {
                        tracing::warn!(error = %e, "lane socket accept failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            };
            let peer_ok = stream
                .peer_cred()
                .ok()
                .and_then(|c| c.pid())
                .and_then(|pid| crate::cgroup::cgroup_of(Some(pid)).ok())
                .is_some_and(|cg| cg == cgroup_rel);
            let s = s.clone();
            conns.spawn(async move {
                let (r, mut w) = stream.into_split();
                // One request line, bounded: evidence (hex) or a hook event at most.
                let cap = (2 * MAX_EVIDENCE_BYTES).max(1 << 20) as u64 + 65_536;
                let mut lines = BufReader::new(tokio::io::AsyncReadExt::take(r, cap)).lines();
                let Ok(Some(line)) = lines.next_line().await else {
                    return;
                };
                // A waiter that goes away (its process killed, a hook past its timeout) ends
                // its request: nothing is handed to a peer no longer there, and a settled
                // wait does not outlive its waiter.
                let gone = async {
                    let _ = lines.next_line().await;
                };
                let handle = async {
                    if !peer_ok {
                        err("this socket only answers processes of its own generation")
                    } else {
                        match serde_json::from_str::<LaneRequest>(&line) {
                            Ok(LaneRequest::Contract) => contract(&s).await,
                            Ok(LaneRequest::Challenge) => challenge(&s).await,
                            Ok(LaneRequest::Ack { response }) => ack(&s, &response).await,
                            Ok(LaneRequest::Hook {
                                family,
                                event,
                                payload,
                            }) => hook(&s, &family, &event, &payload).await,
                            Ok(LaneRequest::HandoffAck) => handoff_ack(&s).await,
                            Ok(LaneRequest::Next) => settled::next(&s).await,
                            Ok(
                                r @ (LaneRequest::Progress { .. }
                                | LaneRequest::Blocked { .. }
                                | LaneRequest::ContinuationResult { .. }),
                            ) => report(&s, r),
                            Ok(LaneRequest::Push(r)) => push(&s, r).await,
                            Ok(LaneRequest::Checkpoint) => checkpoint(&s).await,
                            Err(e) => err(&format!("bad request: {e}")),
                        }
                    }
                };
                let resp = tokio::select! {
                    r = handle => r,
                    _ = gone => return,
                };
                if let Ok(mut out) = serde_json::to_vec(&resp) {
                    out.push(b'\n');
                    let written = w.write_all(&out).await;
                    // A continuation whose answer did not reach its waiter: given (never
                    // again), but no later turn's answer is its result.
                    if written.is_err() && resp.state.as_deref() == Some("continuation") {
                        if let Ok(mut a) = s.awaiting.lock() {
                            *a = None;
                        }
                    }
                }
            });
        }
    });
    Ok(LaneServer {
        task,
        session,
        path: path.to_path_buf(),
    })
}

pub(super) fn err(msg: &str) -> LaneResponse {
    LaneResponse {
        ok: false,
        contract: None,
        state: None,
        error: Some(msg.into()),
        continuation: None,
        challenge: None,
        output: None,
        push: None,
        checkpoint: None,
    }
}

/// A checkpoint of the workspace, once the generation is RUNNING (asked of the chain
/// driver, which knows its lane and chain).
async fn checkpoint(s: &GenSession) -> LaneResponse {
    let mut act = s.activation.subscribe();
    match act.wait_for(|a| a.is_some()).await.map(|a| a.clone()) {
        Ok(Some(Ok(()))) => {}
        Ok(Some(Err(e))) => return err(&e),
        _ => return err("the generation ended"),
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    if s.checkpoints.send(tx).is_err() {
        return err("this generation cannot be checkpointed here (no coordinated chain drives it)");
    }
    match rx.await {
        Ok(Ok(v)) => {
            let mut r = LaneResponse::ok("checkpointed");
            r.checkpoint = Some(v);
            r
        }
        Ok(Err(e)) => err(&e),
        Err(_) => err("the generation ended before its checkpoint was taken"),
    }
}

/// A push, once the generation is RUNNING (its claim is the coordinator's to admit).
async fn push(s: &GenSession, r: crate::supervisor::push::PushRequest) -> LaneResponse {
    let (Some(ctx), Some(assignment)) = (s.push.get(), s.assignment_id.get()) else {
        return err("push is not available to this generation (not a confined, coordinated one)");
    };
    match crate::supervisor::push::push(ctx, assignment, r).await {
        Ok(a) => {
            let mut resp = LaneResponse::ok(&a.state);
            resp.ok = matches!(a.state.as_str(), "pushed" | "up-to-date" | "settled-before");
            resp.push = Some(a);
            resp
        }
        Err(e) => err(&format!("{e} [{}]", e.category())),
    }
}

pub(super) async fn wait_contract(s: &GenSession) -> Result<Contract, LaneResponse> {
    let mut rx = s.contract.subscribe();
    let c = match rx.wait_for(|c| c.is_some()).await {
        Ok(c) => c.clone(),
        Err(_) => return Err(err("the generation ended")),
    };
    c.ok_or_else(|| err("no contract"))
}

pub(super) async fn contract(s: &GenSession) -> LaneResponse {
    match s.family() {
        Some(f) if f.adapter().surfaces().0 == ContractInjection::SocketFetch => {}
        Some(_) => {
            return err("this harness receives its contract through its own session-start surface")
        }
        None => return err("no harness is bound to this generation"),
    }
    match wait_contract(s).await {
        Ok(c) => {
            s.delivered.send_replace(Some(c.contracts_digest.clone()));
            LaneResponse {
                contract: Some(c),
                state: None,
                ..LaneResponse::ok("")
            }
        }
        Err(e) => e,
    }
}

/// Waits for the activation challenge and hands over the phrase to answer (families that
/// fetch it here; the others get it as a turn in their pane).
pub(super) async fn challenge(s: &GenSession) -> LaneResponse {
    match s.family() {
        Some(f) if f.adapter().challenge_delivery() == ChallengeDelivery::SocketFetch => {}
        Some(_) => return err("this harness receives its activation check in its pane, not here"),
        None => return err("no harness is bound to this generation"),
    }
    if matches!(*s.activation.borrow(), Some(Ok(()))) {
        // Already active (a restarted supervisor serving an activated generation again).
        return LaneResponse::ok("active");
    }
    if s.delivered.borrow().is_none() {
        return err("fetch the contract before asking for the challenge");
    }
    let mut rx = s.phrase.subscribe();
    let mut act = s.activation.subscribe();
    tokio::select! {
        r = rx.wait_for(|p| p.is_some()) => match r.map(|p| p.clone()) {
            Ok(Some(p)) => LaneResponse {
                challenge: Some(crate::adapter::ackline::challenge(&p)),
                ..LaneResponse::ok("challenged")
            },
            _ => err("the generation ended"),
        },
        // Decided meanwhile: a restarted supervisor serving a generation whose activation
        // it had not recorded yet (its check went to the previous process) takes the
        // activation the coordinator sends again, and the waiting harness is active.
        r = act.wait_for(|a| a.is_some()) => match r.map(|v| v.clone()) {
            Ok(Some(Ok(()))) => LaneResponse::ok("active"),
            Ok(Some(Err(e))) => err(&e),
            _ => err("the generation ended"),
        },
    }
}

pub(super) async fn ack(s: &GenSession, response: &str) -> LaneResponse {
    match s.family() {
        Some(f) if f.adapter().challenge_delivery() == ChallengeDelivery::SocketFetch => {}
        Some(_) => return err("this harness acknowledges through its own turn, not here"),
        None => return err("no harness is bound to this generation"),
    }
    if let Err(e) = s.take_answer(response) {
        return err(e);
    }
    let mut rx = s.activation.subscribe();
    let v = match rx.wait_for(|a| a.is_some()).await {
        Ok(v) => v.clone(),
        Err(_) => return err("the generation ended"),
    };
    match v {
        Some(Ok(())) => LaneResponse::ok("active"),
        Some(Err(e)) => err(&e),
        None => err("no activation"),
    }
}

/// One event from the harness's hook assets: interpreted by its family's adapter, checked
/// against the generation's conversation id; never waits for the chain.
pub(super) async fn hook(
    s: &GenSession,
    family: &str,
    event: &str,
    payload: &serde_json::Value,
) -> LaneResponse {
    let bound = s.harness.lock().ok().and_then(|h| h.clone());
    let Some((fam, conversation)) = bound else {
        return err("no harness is bound to this generation");
    };
    if Family::parse(family) != Some(fam) {
        s.observe(|o| o.refused_events += 1);
        return err(&format!(
            "this generation runs {}, not {family}",
            fam.name()
        ));
    }
    let adapter = fam.adapter();
    // A harness that names its own conversation: its first naming binds it.
    let conversation = match (conversation, adapter.names_conversation(event, payload)) {
        (None, Some(named)) => {
            s.name_conversation(&named);
            s.conversation()
        }
        (c, _) => c,
    };
    let ev = match adapter.hook(event, payload, conversation.as_deref()) {
        Ok(ev) => ev,
        Err(e) => {
            s.observe(|o| o.refused_events += 1);
            tracing::warn!(category = e.category(), refusal = %e, "hook event refused");
            // Only an event about this generation's own conversation says it was replaced.
            if matches!(e, crate::adapter::HookRefusal::Replaced(_))
                && conversation.is_some()
                && payload["session_id"].as_str() == conversation.as_deref()
            {
                settled::conversation_replaced(s, event, payload);
            }
            return err(&e.to_string());
        }
    };
    match ev {
        HookEvent::SessionStart => {
            if s.delivered.borrow().is_some() {
                s.observe(|o| o.refused_events += 1);
                return err("the contract was already delivered to this generation");
            }
            let c = match wait_contract(s).await {
                Ok(c) => c,
                Err(e) => return e,
            };
            let text = crate::adapter::contract_context(&c.task_text, &c.contracts_digest, &c.key);
            let output = adapter.render_contract(&text);
            s.delivered.send_replace(Some(c.contracts_digest.clone()));
            LaneResponse {
                output: Some(output),
                ..LaneResponse::ok("contract delivered")
            }
        }
        ev @ (HookEvent::ContextCompacted | HookEvent::Reloaded) => {
            let compacted = ev == HookEvent::ContextCompacted;
            // Only the contract this generation already received, never a first delivery
            // (that is SessionStart's, checked before any challenge).
            let Some(delivered) = s.delivered.borrow().clone() else {
                s.observe(|o| o.refused_events += 1);
                return err(if compacted {
                    "a compaction before any contract was delivered"
                } else {
                    "a reload before any contract was delivered"
                });
            };
            let c = match wait_contract(s).await {
                Ok(c) => c,
                Err(e) => return e,
            };
            if c.contracts_digest != delivered {
                s.observe(|o| o.refused_events += 1);
                return err("the contract changed since it was delivered");
            }
            let text = crate::adapter::contract_context(&c.task_text, &c.contracts_digest, &c.key);
            s.observe(|o| {
                if compacted {
                    o.compactions += 1
                } else {
                    o.reloads += 1
                }
            });
            LaneResponse {
                output: Some(adapter.render_contract(&text)),
                ..LaneResponse::ok(if compacted {
                    "contract delivered again after a compaction"
                } else {
                    "contract delivered again after a reload"
                })
            }
        }
        HookEvent::ReplacementRefused { what } => {
            s.observe(|o| o.replacements_refused += 1);
            tracing::warn!(attempt = %what,
                "the harness was asked to replace its conversation under a live generation; its extension refused");
            LaneResponse::ok("replacement refused")
        }
        HookEvent::TurnStarted => {
            s.observe(|o| {
                o.turns_started += 1;
                o.busy = true;
            });
            s.turns.send_modify(|t| *t += 1);
            s.busy.send_replace(true);
            LaneResponse::ok("turn started")
        }
        HookEvent::Settled { last_message } => {
            let answered = last_message
                .as_deref()
                .is_some_and(|m| !m.trim().is_empty());
            s.turn_ended(false);
            // Only the end of a turn that started after the activation check was submitted
            // answers it (a turn already running then, like Codex's bootstrap, does not).
            let after = s
                .answer_turns_after
                .load(std::sync::atomic::Ordering::SeqCst);
            let answering = s.observations().turns_started > after;
            // A handoff's target answers its handoff check first (the activation challenge
            // comes only once the handoff was accepted); each answer binds only its check.
            let unacked_handoff =
                s.handoff_phrase.borrow().is_some() && !*s.handoff_ack_requested.borrow();
            let unacked = s.phrase.borrow().is_some() && !*s.ack_requested.borrow();
            let (state, result) = match (unacked_handoff, unacked, answering, last_message) {
                (true, _, true, Some(m)) => match s.take_handoff_answer(&m) {
                    Err(e) => {
                        tracing::warn!(
                            reason = e,
                            "a harness turn ended without acknowledging its handoff check"
                        );
                        (
                            "settled; the answer did not acknowledge the handoff check",
                            None,
                        )
                    }
                    Ok(()) => ("settled; handoff acknowledged", None),
                },
                (false, true, true, Some(m)) => match s.take_answer(&m) {
                    Err(e) => {
                        tracing::warn!(
                            reason = e,
                            "a harness turn ended without acknowledging its challenge"
                        );
                        (
                            "settled; the answer did not acknowledge the challenge",
                            None,
                        )
                    }
                    Ok(()) => ("settled; acknowledged", None),
                },
                // Not a check's answer: perhaps a continuation's result.
                (_, _, _, m) => ("settled", m),
            };
            // A turn that ended under a provider's rate limit the harness gave up on (no
            // answer: a turn that answered met the limit only on a side request).
            if !answered {
                s.limit_at_settled();
            }
            // A Stop that follows a block decision (Claude Code and Codex say so).
            let chained = payload["stop_hook_active"].as_bool() == Some(true);
            settled::at_settled(s, adapter, result.as_deref(), chained, state).await
        }
        HookEvent::TurnFailed { error } => {
            s.turn_ended(true);
            tracing::warn!(error = %error, "the harness's turn ended in an error, not an answer");
            // A rate limit the harness gave up on blocks the work until it resets.
            s.limit_at_settled();
            settled::turn_failed(s);
            LaneResponse::ok("turn failure noted")
        }
        HookEvent::WaitingForInput { prompt } => {
            s.observe(|o| o.waiting_for_input += 1);
            settled::waiting_for_input(s, &prompt);
            LaneResponse::ok("waiting for input noted")
        }
        HookEvent::AwaitContinuation => settled::asked(s, adapter).await,
        HookEvent::SessionEnd { reason } => {
            // Claude Code's `/clear` (no hook can stop it) ends the conversation and starts
            // another in the same process: the generation's conversation is gone.
            if reason == "clear" {
                settled::conversation_replaced(s, event, payload);
            }
            s.observe(|o| o.session_end = Some(reason));
            LaneResponse::ok("session end noted")
        }
        HookEvent::Conversation { id } => {
            if s.name_conversation(&id) {
                LaneResponse::ok("conversation bound")
            } else {
                s.observe(|o| o.refused_events += 1);
                err("this generation's conversation is already bound (or the id is malformed)")
            }
        }
        HookEvent::Ignored => LaneResponse::ok("noted"),
    }
}

pub(super) async fn handoff_ack(s: &GenSession) -> LaneResponse {
    // A harness that answers its checks in its own turns answers its handoff check there:
    // a process in its cgroup (its shell tool, say) cannot take the handoff for it.
    match s.family() {
        Some(f) if f.adapter().challenge_delivery() == ChallengeDelivery::SocketFetch => {}
        Some(_) => {
            return err("this harness acknowledges its handoff through its own turn, not here")
        }
        None => return err("no harness is bound to this generation"),
    }
    if s.delivered.borrow().is_none() {
        return err("fetch the contract before acknowledging a handoff");
    }
    s.handoff_ack_requested.send_replace(true);
    let mut rx = s.challenged.subscribe();
    let mut act = s.activation.subscribe();
    tokio::select! {
        r = rx.wait_for(|c| *c) => match r {
            Ok(_) => LaneResponse::ok("responsibility accepted; acknowledge the activation challenge next (mosaic lane ack)"),
            Err(_) => err("the generation ended"),
        },
        r = act.wait_for(|a| matches!(a, Some(Err(_)))) => match r {
            Ok(v) => match v.clone() {
                Some(Err(e)) => err(&e),
                _ => err("the generation ended"),
            },
            Err(_) => err("the generation ended"),
        },
    }
}

/// A report of the RUNNING harness: checked, digested here, and queued for the coordinator.
pub(super) fn report(s: &GenSession, r: LaneRequest) -> LaneResponse {
    if !matches!(*s.activation.borrow(), Some(Ok(()))) {
        return err("only an active generation reports progress or a blocker");
    }
    let decode = |h: &str| -> Result<Vec<u8>, String> {
        if h.len() > 2 * MAX_EVIDENCE_BYTES {
            return Err(format!("evidence is limited to {MAX_EVIDENCE_BYTES} bytes"));
        }
        match hex::decode(h) {
            Ok(b) if !b.is_empty() => Ok(b),
            _ => Err("evidence is required (non-empty)".into()),
        }
    };
    // A harness whose progress the supervisor observes itself: its word is never evidence.
    // Asking is a request to look now; what the supervisor finds is reported, if anything.
    let observed = s.family().is_some_and(|f| f.adapter().observes_progress());
    let report = match r {
        LaneRequest::Progress { .. } if observed => {
            s.look.notify_one();
            return LaneResponse::ok(
                "the supervisor observes this harness's progress in its working directory itself: it looks now",
            );
        }
        LaneRequest::Blocked { code, .. }
            if observed && work::SUPERVISOR_BLOCKER_CODES.contains(&code.as_str()) =>
        {
            return err(&format!(
                "blocker code {code} is the supervisor's own observation, never a harness's report"
            ));
        }
        LaneRequest::Progress {
            kind,
            evidence_hex,
            next_action,
        } => {
            if !work::EVIDENCE_KINDS.contains(&kind.as_str()) {
                return err(&format!(
                    "unknown evidence kind {kind:?}; known: {}",
                    work::EVIDENCE_KINDS.join(", ")
                ));
            }
            let bytes = match decode(&evidence_hex) {
                Ok(b) => b,
                Err(e) => return err(&e),
            };
            if kind == "commit" && !work::commit_id_ok(&bytes) {
                return err("a commit id is 40 or 64 lower-case hex digits");
            }
            if next_action
                .as_deref()
                .is_some_and(|n| !work::next_action_ok(n))
            {
                return err("a next action is one non-blank line of at most 1000 bytes");
            }
            HarnessReport::Progress {
                evidence_digest: evidence_digest(&kind, &bytes),
                kind,
                next_action,
            }
        }
        LaneRequest::Blocked {
            code,
            evidence_hex,
            next_action,
        } => {
            if !work::code_ok(&code) {
                return err("a blocker code is lower-case words joined by dashes");
            }
            if !work::next_action_ok(&next_action) {
                return err("blocked needs an executable next action (one non-blank line)");
            }
            let bytes = match decode(&evidence_hex) {
                Ok(b) => b,
                Err(e) => return err(&e),
            };
            HarnessReport::Blocked {
                evidence_digest: evidence_digest("blocker", &bytes),
                code,
                next_action,
                resume_after_ms: None,
            }
        }
        LaneRequest::ContinuationResult {
            continuation_id,
            evidence_hex,
        } => {
            // A real harness's result is its own answer at its settled boundary
            // (`settled`), never a report its shell tool could make for it.
            if s.family().map(|f| f.adapter().continuation_delivery())
                != Some(crate::adapter::ContinuationDelivery::LaneNext)
            {
                return err("this harness's continuation results are taken from its own settled boundary, not reported here");
            }
            if !crate::protocol::report::id_ok(&continuation_id) {
                return err("malformed continuation id");
            }
            let bytes = match decode(&evidence_hex) {
                Ok(b) => b,
                Err(e) => return err(&e),
            };
            return match settled::record_result(s, &continuation_id, &bytes) {
                Ok(()) => LaneResponse::ok("submitted"),
                Err(e) => err(e),
            };
        }
        LaneRequest::Contract
        | LaneRequest::Challenge
        | LaneRequest::Ack { .. }
        | LaneRequest::Hook { .. }
        | LaneRequest::HandoffAck
        | LaneRequest::Next
        | LaneRequest::Push(_)
        | LaneRequest::Checkpoint => return err("not a report"),
    };
    if s.reports.send(report).is_err() {
        return err("the generation ended");
    }
    LaneResponse::ok("submitted")
}
