//! Continuations at a harness's settled boundary (spec §14 rule 11), through each family's
//! own surface ([`ContinuationDelivery`]): the fake harness waits in `mosaic lane next`;
//! Claude Code's and Codex's Stop hook waits and answers with a block decision; Pi's
//! extension and OpenCode's plugin ask after each settled boundary and submit what they get
//! as a user message.
//!
//! Whatever the surface, a continuation is visible at most once: it is recorded as given
//! before the answer carrying it is written, and one whose answer may not have arrived (the
//! waiter died, the hook was killed at its timeout, the extension reloaded) is never given
//! again — the coordinator abandons it at its deadline and replaces the generation.
//!
//! The result of a real harness's continuation is what the harness itself produced: the
//! answer its next settled boundary carries (for an extension, of a run started after the
//! delivery), digested here. A real harness cannot report one by `mosaic lane
//! continuation-result`, nor wait in `mosaic lane next`: its shell tool could otherwise
//! answer for it.

use super::*;
use crate::adapter::{Adapter, ContinuationDelivery};

/// A continuation given to a real harness whose result has not come back yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Awaiting {
    pub continuation_id: String,
    /// Turns started when it was given: an extension's result is the answer of a run
    /// started after it.
    pub turns_at: u64,
}

/// Waits, settled, for a continuation this process accepted and has not given yet; gives
/// it (recorded before it is returned). `None`: the generation ended first.
///
/// With `follow_turns` (a real harness, whose turns start and end by events that may
/// arrive in any order): settled only while no turn runs — a turn starting makes it
/// unsettled (nothing is accepted for it) and its end settled again, and a continuation is
/// given only while no turn runs.
async fn wait_continuation(s: &GenSession, follow_turns: bool) -> Option<Continuation> {
    let mut rx = s.next.subscribe();
    let mut busy = s.busy.subscribe();
    // "Waiting settled" lasts at most as long as this wait: a guard clears it however the
    // wait ends (answered, the waiter gone and its request dropped).
    struct Waiting<'a>(&'a watch::Sender<bool>);
    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            self.0.send_replace(false);
        }
    }
    let waiting = Waiting(&s.settled);
    let available =
        |c: &Option<Continuation>| c.as_ref().is_some_and(|c| !s.given(&c.continuation_id));
    let got = loop {
        if follow_turns && *busy.borrow_and_update() {
            s.settled.send_replace(false);
            if busy.changed().await.is_err() {
                break None;
            }
            continue;
        }
        s.settled.send_replace(true);
        tokio::select! {
            c = rx.wait_for(available) => match c.map(|c| c.clone()) {
                Ok(c) if !(follow_turns && *s.busy.borrow()) => break c,
                Ok(_) => continue,
                Err(_) => break None,
            },
            r = busy.changed(), if follow_turns => {
                if r.is_err() {
                    break None;
                }
            }
        }
    };
    drop(waiting);
    let c = got?;
    // Visible exactly once: recorded before the harness sees it.
    let fresh = s
        .visible
        .lock()
        .map(|mut v| v.insert(c.continuation_id.clone()))
        .unwrap_or(false);
    if fresh {
        tracing::info!(continuation_id = %c.continuation_id,
            family = s.family().map(|f| f.name()).unwrap_or("?"),
            "continuation given to the harness at its settled boundary");
    }
    fresh.then_some(c)
}

/// `mosaic lane next`: the fake harness, settled, waits for its next continuation.
pub(super) async fn next(s: &GenSession) -> LaneResponse {
    match s.family().map(|f| f.adapter().continuation_delivery()) {
        Some(ContinuationDelivery::LaneNext) => {}
        Some(_) => {
            return err("this harness takes continuations at its own settled boundary, not here")
        }
        None => return err("no harness is bound to this generation"),
    }
    if !matches!(*s.activation.borrow(), Some(Ok(()))) {
        return err("only an active generation takes continuations");
    }
    match wait_continuation(s, false).await {
        Some(c) => LaneResponse {
            continuation: Some(c),
            ..LaneResponse::ok("continuation")
        },
        None => err("the generation ended"),
    }
}

/// Whether the generation is active, waiting for its activation when its answer was just
/// taken (so a Stop hook that acknowledged goes on to wait for continuations). A
/// generation not yet answered is not waited for: its harness must stay free to take its
/// activation check.
async fn active(s: &GenSession) -> bool {
    if matches!(*s.activation.borrow(), Some(Ok(()))) {
        return true;
    }
    if !*s.ack_requested.borrow() {
        return false;
    }
    let mut act = s.activation.subscribe();
    matches!(
        act.wait_for(|a| a.is_some()).await.map(|a| a.clone()),
        Ok(Some(Ok(())))
    )
}

/// How long a Stop hook waits, settled, for a continuation on its way (its acceptance is a
/// round trip to the coordinator): within the hook's own timeout. One that comes later is
/// given at a later settled boundary (`CoordinatedHost::wake`).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Block decisions given in a row before a Stop hook stops giving: Claude Code 2.1.332
/// overrides a ninth consecutive block and ends the turn (`CLAUDE_CODE_STOP_HOOK_BLOCK_CAP`,
/// 8), which would leave a continuation given and never seen. The next one then waits for a
/// turn of its own (a wake, or the operator's), which starts a new row.
pub const MAX_BLOCKS_IN_A_ROW: u32 = 6;

/// A real harness's wait for a continuation, answered with what its surface prints for it
/// (`render`), or `state` alone when the wait ends without one. `within`: how long it may
/// wait (`None`: as long as the harness stays settled).
async fn give(
    s: &GenSession,
    adapter: &dyn Adapter,
    state: &str,
    within: Option<std::time::Duration>,
) -> LaneResponse {
    if !active(s).await {
        return LaneResponse::ok(state);
    }
    let waited = match within {
        // Bounded, and over as soon as nothing is on its way any more (an offer lapsed or
        // was refused): the harness is held no longer than a continuation can come.
        Some(d) => {
            let gone = async {
                while s.on_its_way() {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            };
            tokio::select! {
                c = tokio::time::timeout(d, wait_continuation(s, true)) => c.ok().flatten(),
                _ = gone => None,
            }
        }
        None => wait_continuation(s, true).await,
    };
    let Some(c) = waited else {
        return LaneResponse::ok(state);
    };
    if adapter.continuation_delivery() == ContinuationDelivery::SettledHookAnswer {
        // The block decision continues the turn (no prompt-submit event says so): busy
        // until its Stop, so nothing is typed into it.
        s.observe(|o| o.busy = true);
        s.busy.send_replace(true);
    }
    let turns_at = *s.turns.borrow();
    if let Ok(mut a) = s.awaiting.lock() {
        *a = Some(Awaiting {
            continuation_id: c.continuation_id.clone(),
            turns_at,
        });
    }
    let text = crate::adapter::continuation_text(&c.continuation_id, &c.next_action);
    LaneResponse {
        output: Some(adapter.render_continuation(&text)),
        continuation: None,
        ..LaneResponse::ok("continuation")
    }
}

/// A settled boundary of a real harness, after its activation answer was looked for:
/// the answer it carries is the result of the continuation given before (if any); then,
/// for a family answered at this boundary, the wait for the next continuation.
pub(super) async fn at_settled(
    s: &GenSession,
    adapter: &dyn Adapter,
    last_message: Option<&str>,
    chained: bool,
    state: &str,
) -> LaneResponse {
    use std::sync::atomic::Ordering;
    if !chained {
        s.blocks_in_a_row.store(0, Ordering::SeqCst);
    }
    let delivery = adapter.continuation_delivery();
    if let Some(answer) = last_message.filter(|m| !m.trim().is_empty()) {
        let turns = *s.turns.borrow();
        let awaited = s.awaiting.lock().ok().and_then(|mut a| {
            let due = a.as_ref().is_some_and(|w| {
                delivery == ContinuationDelivery::SettledHookAnswer || turns > w.turns_at
            });
            if due {
                a.take()
            } else {
                None
            }
        });
        if let Some(w) = awaited {
            if let Err(e) = record_result(s, &w.continuation_id, answer.as_bytes()) {
                return err(e);
            }
        }
    }
    match delivery {
        // The harness is held while its Stop hook runs: it waits only for a continuation
        // on its way, never for one that may not come (an operator's typed turn waits
        // behind it).
        ContinuationDelivery::SettledHookAnswer
            if s.on_its_way() && s.blocks_in_a_row.load(Ordering::SeqCst) < MAX_BLOCKS_IN_A_ROW =>
        {
            let r = give(s, adapter, state, Some(STOP_WAIT)).await;
            if r.output.is_some() {
                s.blocks_in_a_row.fetch_add(1, Ordering::SeqCst);
            }
            r
        }
        ContinuationDelivery::SettledHookAnswer => LaneResponse::ok(state),
        ContinuationDelivery::LaneNext | ContinuationDelivery::AssetPrompt => {
            LaneResponse::ok(state)
        }
    }
}

/// The harness shows a prompt only a human can answer: the work is reported blocked with
/// code `waiting-for-input`, the prompt's digest its evidence (the operator is notified by
/// the coordinator). Whoever answers it in the lane unblocks the work (`mosaic unblock`).
pub(super) fn waiting_for_input(s: &GenSession, prompt: &str) {
    if !matches!(*s.activation.borrow(), Some(Ok(()))) {
        return; // before activation nothing of the work runs
    }
    tracing::warn!(
        "the harness waits for a human's answer to a prompt; reporting the work blocked"
    );
    let _ = s.reports.send(HarnessReport::Blocked {
        code: "waiting-for-input".into(),
        evidence_digest: evidence_digest("blocker", prompt.as_bytes()),
        next_action: "answer the harness's prompt in its lane (mosaic attach), then mosaic unblock"
            .into(),
        resume_after_ms: None,
    });
}

/// A turn ended in an error: a continuation given for it gets no result from it (nor from
/// a later turn, which answers something else): it stays unanswered, and the coordinator
/// abandons it at its deadline.
pub(super) fn turn_failed(s: &GenSession) {
    if let Some(w) = s.awaiting.lock().ok().and_then(|mut a| a.take()) {
        tracing::warn!(continuation_id = %w.continuation_id,
            "the turn a continuation started ended in an error: it has no result");
    }
}

/// An extension's `next`: it waits for a continuation to submit itself.
pub(super) async fn asked(s: &GenSession, adapter: &dyn Adapter) -> LaneResponse {
    if adapter.continuation_delivery() != ContinuationDelivery::AssetPrompt {
        return err("this harness does not ask for continuations through its extension");
    }
    give(s, adapter, "no continuation", None).await
}

/// The harness replaced the conversation under its active generation (a `/clear`, a
/// resumed or second session its surface could not refuse): what the generation was given
/// is gone from the model's context, so the work is reported blocked with code
/// `conversation-replaced` — the operator is notified, and `mosaic unblock` (or a stop) is
/// the way out; a fresh generation takes the work on. The evidence is the event itself.
pub(super) fn conversation_replaced(s: &GenSession, event: &str, payload: &serde_json::Value) {
    if !matches!(*s.activation.borrow(), Some(Ok(()))) {
        return; // before activation the chain itself refuses it
    }
    let evidence = format!("{event} {payload}");
    let report = HarnessReport::Blocked {
        code: "conversation-replaced".into(),
        evidence_digest: evidence_digest("blocker", evidence.as_bytes()),
        next_action: "start the work in a fresh generation: the harness replaced its conversation"
            .into(),
        resume_after_ms: None,
    };
    tracing::warn!(event, "the harness replaced its conversation under the live generation; reporting the work blocked");
    let _ = s.reports.send(report);
}

/// Records the result of `continuation_id` from its evidence bytes and queues it for the
/// coordinator: kept (on disk) before it is submitted, so it outlives this process.
pub(super) fn record_result(
    s: &GenSession,
    continuation_id: &str,
    evidence: &[u8],
) -> Result<(), &'static str> {
    let digest = evidence_digest("continuation-result", evidence);
    s.keep_result(continuation_id, &digest);
    crate::coordinator::failpoint::host("continuation-result");
    s.reports
        .send(HarnessReport::ContinuationResult {
            evidence_digest: digest,
            continuation_id: continuation_id.to_string(),
        })
        .map_err(|_| "the generation ended")?;
    tracing::info!(continuation_id, "continuation result kept and submitted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::serve::{hook, report};
    use super::*;
    use crate::adapter::Family;
    use serde_json::json;
    use std::time::Duration;

    fn active(family: Family) -> Arc<GenSession> {
        let s = GenSession::new();
        s.bind_harness(family, Some("s1".into()));
        s.activation.send_replace(Some(Ok(())));
        s
    }

    fn offer(s: &GenSession, id: &str, next_action: &str) {
        s.next.send_replace(Some(Continuation {
            continuation_id: id.into(),
            next_action: next_action.into(),
        }));
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// The next report queued for the coordinator, if any.
    fn next_report(s: &GenSession) -> Option<HarnessReport> {
        s.reports_rx.lock().unwrap().as_mut()?.try_recv().ok()
    }

    fn stop(answer: &str) -> serde_json::Value {
        json!({"session_id": "s1", "hook_event_name": "Stop", "last_assistant_message": answer})
    }

    /// Claude Code: the Stop hook gives a continuation on its way as a block decision, once;
    /// the next Stop's answer is its result, digested here; with nothing on its way the
    /// hook returns at once (the harness is never held for one that may not come).
    #[test]
    fn a_stop_hook_gives_a_continuation_once_and_takes_its_result_from_the_next_stop() {
        rt().block_on(async {
            let s = active(Family::ClaudeCode);
            let r = hook(&s, "claude-code", "stop", &stop("ok")).await;
            assert!(r.ok && r.output.is_none(), "{r:?}");
            offer(&s, "cn-1", "run the tests");
            let r = hook(&s, "claude-code", "stop", &stop("ok")).await;
            let out: serde_json::Value =
                serde_json::from_str(r.output.as_deref().unwrap()).unwrap();
            assert_eq!(out["decision"], "block");
            assert_eq!(
                out["reason"],
                crate::adapter::continuation_text("cn-1", "run the tests")
            );
            assert!(!s.on_its_way());
            assert!(next_report(&s).is_none());
            // The turn it started ends: its answer is the result, and nothing is given again.
            let r = hook(&s, "claude-code", "stop", &stop("tests pass")).await;
            assert!(r.ok && r.output.is_none(), "{r:?}");
            let got = next_report(&s).unwrap();
            assert_eq!(
                got,
                HarnessReport::ContinuationResult {
                    continuation_id: "cn-1".into(),
                    evidence_digest: evidence_digest("continuation-result", b"tests pass"),
                }
            );
            // The same continuation, offered again, is never given twice: the hook waits
            // (for another one) instead.
            offer(&s, "cn-1", "run the tests");
            let r = tokio::time::timeout(
                Duration::from_millis(500),
                hook(&s, "claude-code", "stop", &stop("ok")),
            )
            .await;
            assert!(r.is_err() || r.unwrap().output.is_none());
        });
    }

    /// Claude Code ends a turn itself after too many block decisions in a row: the hook
    /// stops giving before that, and gives again once a turn of its own started a new row.
    #[test]
    fn a_stop_hook_gives_no_more_blocks_in_a_row_than_the_harness_honours() {
        rt().block_on(async {
            let s = active(Family::ClaudeCode);
            let chained = |n: usize| {
                json!({"session_id": "s1", "hook_event_name": "Stop", "stop_hook_active": n > 0,
                    "last_assistant_message": format!("answer {n}")})
            };
            for n in 0..MAX_BLOCKS_IN_A_ROW as usize {
                offer(&s, &format!("cn-{n}"), "next");
                let r = hook(&s, "claude-code", "stop", &chained(n)).await;
                assert!(r.output.is_some(), "block {n} not given: {r:?}");
            }
            offer(&s, "cn-last", "next");
            let r = hook(&s, "claude-code", "stop", &chained(9)).await;
            assert!(r.output.is_none(), "one block too many: {r:?}");
            assert!(s.on_its_way(), "the continuation is still on its way");
            let r = hook(&s, "claude-code", "stop", &chained(0)).await;
            assert!(r.output.unwrap().contains("cn-last"));
        });
    }

    /// Pi: an extension's result is the answer of a run started after the delivery; a
    /// settled boundary before it (or an aborted run) is no result.
    #[test]
    fn an_extension_result_is_the_answer_of_the_run_the_continuation_started() {
        rt().block_on(async {
            let s = active(Family::Pi);
            offer(&s, "cn-2", "write the docs");
            let r = hook(&s, "pi", "next", &json!({"session_id": "s1"})).await;
            assert_eq!(
                r.output.as_deref(),
                Some(crate::adapter::continuation_text("cn-2", "write the docs").as_str())
            );
            let settled = |answer: &str, aborted: bool| {
                json!({"session_id": "s1", "aborted": aborted, "last_assistant_message": answer})
            };
            let _ = hook(&s, "pi", "agent-settled", &settled("stale", false)).await;
            let mut rx = s.reports_rx.lock().unwrap().take().unwrap();
            assert!(rx.try_recv().is_err(), "a boundary before its run is no result");
            let _ = hook(&s, "pi", "agent-start", &json!({"session_id": "s1"})).await;
            let _ = hook(&s, "pi", "agent-settled", &settled("partial", true)).await;
            assert!(rx.try_recv().is_err(), "an aborted run answered nothing");
            let _ = hook(&s, "pi", "agent-settled", &settled("docs written", false)).await;
            assert_eq!(
                rx.try_recv().unwrap(),
                HarnessReport::ContinuationResult {
                    continuation_id: "cn-2".into(),
                    evidence_digest: evidence_digest("continuation-result", b"docs written"),
                }
            );
            // A turn running: the extension's wait is not settled (nothing is accepted or
            // given) until the turn ends.
            let _ = hook(&s, "pi", "agent-start", &json!({"session_id": "s1"})).await;
            offer(&s, "cn-3", "more");
            let ask = json!({"session_id": "s1"});
            let waiting = hook(&s, "pi", "next", &ask);
            tokio::pin!(waiting);
            assert!(
                tokio::time::timeout(Duration::from_millis(300), &mut waiting)
                    .await
                    .is_err(),
                "given while a turn runs"
            );
            assert!(!*s.settled.borrow(), "settled while a turn runs");
            let ended = async {
                let _ = hook(&s, "pi", "agent-settled", &settled("more done", false)).await;
                std::future::pending::<()>().await
            };
            let r = tokio::select! {
                r = &mut waiting => r,
                _ = ended => unreachable!(),
            };
            assert!(r.output.unwrap().contains("cn-3"));
        });
    }

    /// A real harness's shell tool cannot stand in for it: no `lane next`, no reported
    /// result; the fake harness keeps both.
    #[test]
    fn a_real_harness_neither_waits_in_lane_next_nor_reports_a_result() {
        rt().block_on(async {
            for f in [
                Family::ClaudeCode,
                Family::Codex,
                Family::Pi,
                Family::OpenCode,
            ] {
                let s = active(f);
                offer(&s, "cn-4", "x");
                let r = next(&s).await;
                assert!(!r.ok && r.continuation.is_none(), "{f:?}: {r:?}");
                let r = report(
                    &s,
                    LaneRequest::ContinuationResult {
                        continuation_id: "cn-4".into(),
                        evidence_hex: hex::encode("forged"),
                    },
                );
                assert!(!r.ok, "{f:?}: {r:?}");
                assert!(s.results.lock().unwrap().is_empty(), "{f:?}");
            }
            let s = active(Family::Fake);
            offer(&s, "cn-5", "x");
            assert_eq!(next(&s).await.continuation.unwrap().continuation_id, "cn-5");
            let r = report(
                &s,
                LaneRequest::ContinuationResult {
                    continuation_id: "cn-5".into(),
                    evidence_hex: hex::encode("done"),
                },
            );
            assert!(r.ok, "{r:?}");
        });
    }

    /// A handoff's target that answers in its own turns: its handoff check passes only with
    /// the handoff answer, its activation check only with the activation answer, and no
    /// process can take the handoff for it over the lane socket.
    #[test]
    fn a_handoff_target_passes_each_check_only_with_that_checks_answer() {
        use crate::adapter::Check;
        rt().block_on(async {
            let s = GenSession::new();
            s.bind_harness(Family::ClaudeCode, Some("s1".into()));
            let key = "00ff00ff00ff".to_string();
            s.contract.send_replace(Some(Contract {
                task_text: "task".into(),
                contracts_digest: "sha256:c".into(),
                key: key.clone(),
            }));
            s.delivered.send_replace(Some("sha256:c".into()));
            let h = crate::adapter::handoff_phrase("hc-1", "inc-1", 2);
            s.handoff_phrase.send_replace(Some(h.clone()));
            s.answer_turns_after
                .store(0, std::sync::atomic::Ordering::SeqCst);
            let turn = |answer: String| {
                let s = s.clone();
                async move {
                    let p = json!({"session_id": "s1", "hook_event_name": "UserPromptSubmit"});
                    assert!(hook(&s, "claude-code", "prompt-submit", &p).await.ok);
                    hook(&s, "claude-code", "stop", &stop(&answer)).await
                }
            };
            // The activation check's form does not pass the handoff check.
            turn(Check::Activation.answer(&h, &key)).await;
            assert!(!*s.handoff_ack_requested.borrow());
            assert_eq!(s.observations().ack_refused, 1);
            // Nor does a request over the lane socket (the harness's shell tool, say).
            let r = tokio::time::timeout(
                Duration::from_millis(200),
                super::super::serve::handoff_ack(&s),
            )
            .await;
            assert!(
                r.is_ok_and(|r| !r.ok),
                "the socket's handoff-ack was not refused"
            );
            assert!(!*s.handoff_ack_requested.borrow());
            // The handoff answer passes it, and acknowledges nothing else.
            turn(Check::Handoff.answer(&h, &key)).await;
            assert!(*s.handoff_ack_requested.borrow());
            assert!(!*s.ack_requested.borrow());
            // Then the activation check: the handoff answer's form, even with its phrase,
            // does not pass it; the activation answer does.
            let a = crate::adapter::ack_phrase("ch-1", "inc-1", 2);
            s.phrase.send_replace(Some(a.clone()));
            turn(Check::Handoff.answer(&a, &key)).await;
            assert!(!*s.ack_requested.borrow());
            turn(Check::Handoff.answer(&h, &key)).await;
            assert!(!*s.ack_requested.borrow());
            turn(Check::Activation.answer(&a, &key)).await;
            assert!(*s.ack_requested.borrow());
        });
    }

    /// A provider's rate limit, seen by the gateway: a long one blocks the work at once and
    /// once; a short one only when the harness's turn ends under it; an answer that
    /// succeeds ends it, and the next limit is its own block.
    #[test]
    fn a_rate_limit_blocks_the_work_once_at_once_or_at_the_turns_end() {
        use crate::supervisor::ratelimit::Limited;
        let limited = |secs: u64, tag: &str| Limited {
            wait: Duration::from_secs(secs),
            evidence: tag.as_bytes().to_vec(),
        };
        let blocked = |r: Option<HarnessReport>| match r {
            Some(HarnessReport::Blocked {
                code,
                resume_after_ms,
                ..
            }) => {
                assert_eq!(code, "rate-limited");
                resume_after_ms.expect("a rate limit names its end")
            }
            other => panic!("not blocked: {other:?}"),
        };
        let s = active(Family::ClaudeCode);
        s.provider_answered(Some(limited(90, "a")));
        let ms = blocked(next_report(&s));
        assert!((89_000..=90_000).contains(&ms), "{ms}");
        s.provider_answered(Some(limited(90, "b")));
        s.limit_at_settled();
        assert!(next_report(&s).is_none(), "the same limit blocked twice");
        // Ended by an answer; a short limit the harness rides out blocks nothing.
        s.provider_answered(None);
        s.provider_answered(Some(limited(5, "c")));
        assert!(next_report(&s).is_none());
        s.provider_answered(None);
        s.limit_at_settled();
        assert!(next_report(&s).is_none());
        // A short limit the harness's turn ended under blocks until it resets.
        s.provider_answered(Some(limited(5, "d")));
        s.limit_at_settled();
        let ms = blocked(next_report(&s));
        assert!((1000..=5000).contains(&ms), "{ms}");
        s.limit_at_settled();
        assert!(next_report(&s).is_none());
    }

    /// A real harness's own word is never progress (nor a blocker the supervisor observes
    /// itself): its `lane progress` asks the observer to look and queues nothing; the fake
    /// harness's report is still taken.
    #[test]
    fn a_real_harness_cannot_report_progress_or_the_supervisors_own_blocks() {
        let progress = || LaneRequest::Progress {
            kind: "commit".into(),
            evidence_hex: hex::encode("ab".repeat(20)),
            next_action: None,
        };
        let blocked = |code: &str| LaneRequest::Blocked {
            code: code.into(),
            evidence_hex: hex::encode("a 429"),
            next_action: "wait".into(),
        };
        rt().block_on(async {
            let s = active(Family::ClaudeCode);
            let looked = s.look.clone();
            let r = report(&s, progress());
            assert!(r.ok, "{r:?}");
            assert!(
                next_report(&s).is_none(),
                "a harness's word counted as progress"
            );
            tokio::time::timeout(Duration::from_secs(1), looked.notified())
                .await
                .expect("the observer was not asked to look");
            for code in crate::protocol::work::SUPERVISOR_BLOCKER_CODES {
                assert!(
                    !report(&s, blocked(code)).ok,
                    "{code} taken from the harness"
                );
            }
            assert!(next_report(&s).is_none());
            assert!(report(&s, blocked("needs-credentials")).ok);
            assert!(next_report(&s).is_some());
            let fake = active(Family::Fake);
            assert!(report(&fake, progress()).ok);
            assert!(matches!(
                next_report(&fake),
                Some(HarnessReport::Progress { .. })
            ));
        });
    }
}
