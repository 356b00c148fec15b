//! Continuations into the four real harnesses (spec §14 rule 11, rule 13's parity), each
//! its real binary in its TUI in a real tmux lane under `mosaic up` (coordinator,
//! supervisor, PostgreSQL), against the deterministic test model.
//!
//! A continuation reaches the harness through its own surface — Claude Code's and Codex's
//! Stop hook answering with a block decision, Pi's extension and OpenCode's plugin
//! submitting it as a user message — at a settled boundary, once; its result is the answer
//! the harness itself produced at its next settled boundary, digested by the supervisor.

mod common;
mod harness;
mod pg;

use harness::*;
use serde_json::Value;

/// Requests of the harness's main conversation (offering tools) whose latest user turn
/// carries `needle`: how many times the harness put it before the model.
fn turns_carrying(model: &Model, needle: &str) -> usize {
    model
        .requests()
        .iter()
        .filter(|r| r["body"]["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .filter_map(|r| {
            let api = mosaic::testmodel::Api::of_path(r["path"].as_str()?)?;
            Some(mosaic::testmodel::latest_turn(api, &r["body"]).1)
        })
        .filter(|latest| latest.contains(needle))
        .count()
}

/// The index (in the model's log) of the first request of the main conversation whose latest
/// user turn carries `needle`, and of the first one answering a tool's result after index
/// `from`.
fn first_carrying(model: &Model, needle: &str) -> Option<usize> {
    model.requests().iter().position(|r| {
        r["body"]["tools"].as_array().is_some_and(|t| !t.is_empty())
            && mosaic::testmodel::Api::of_path(r["path"].as_str().unwrap_or("")).is_some_and(
                |api| {
                    mosaic::testmodel::latest_turn(api, &r["body"])
                        .1
                        .contains(needle)
                },
            )
    })
}

fn first_tool_result_after(model: &Model, from: usize) -> Option<usize> {
    model
        .requests()
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, r)| {
            mosaic::testmodel::Api::of_path(r["path"].as_str().unwrap_or(""))
                .is_some_and(|api| mosaic::testmodel::latest_turn(api, &r["body"]).0)
        })
        .map(|(i, _)| i)
}

fn state_of(up: &Up, cn: &str) -> Option<String> {
    up.sql(
        "SELECT state FROM continuations WHERE continuation_id = $1",
        cn,
    )
}

/// `mosaic continue` for the work `id` (within `within_ms`, if given): the continuation's id.
fn continue_with(up: &Up, id: &str, next_action: &str, within_ms: Option<&str>) -> String {
    let mut args = vec!["continue", "--assignment", id, "--next-action", next_action];
    if let Some(ms) = within_ms {
        args.extend(["--within-ms", ms]);
    }
    let r: Value = up.cli(&args).unwrap_or_else(|e| panic!("continue: {e}"));
    r["continuation_id"].as_str().unwrap().to_string()
}

fn budget(up: &Up, id: &str) -> i64 {
    up.sql(
        "SELECT continuation_budget::text FROM assignments WHERE assignment_id = $1",
        id,
    )
    .and_then(|b| b.parse().ok())
    .unwrap_or_else(|| panic!("no budget for {id}"))
}

fn continuations(f: &Family) {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(f, &model, None);
    let a = up
        .assign(f.runtime, "CONTINUITY: wait for your next action", true)
        .expect("assign reaches RUNNING");
    assert_eq!(a["state"], "RUNNING", "{a}");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let budget_at_start = budget(&up, &id);
    // Twice: the second proves the harness takes a continuation again after a result.
    for round in 0..2 {
        let answer = format!("result-{round}-{}", uuid::Uuid::new_v4().simple());
        let next = format!("model:say[{answer}]");
        let cn = continue_with(&up, &id, &next, None);
        wait_result(&up, &cn);
        // The result is the harness's own answer to it, digested by the supervisor.
        let recorded = up.sql(
            "SELECT result_evidence_digest FROM continuations WHERE continuation_id = $1",
            &cn,
        );
        assert_eq!(
            recorded,
            Some(mosaic::protocol::work::evidence_digest(
                "continuation-result",
                answer.as_bytes()
            )),
            "round {round}: the recorded result is not the harness's answer"
        );
        // Visible once: one turn of the conversation carried it to the model.
        assert_eq!(
            turns_carrying(&model, &cn),
            1,
            "round {round}: continuation {cn} reached the model other than once"
        );
    }
    assert_eq!(
        budget(&up, &id),
        budget_at_start - 2,
        "the loop budget was debited once per continuation"
    );

    // Queued while a tool runs: it waits for the harness to settle, then is given once.
    let from = model.requests().len();
    up.type_turn("model:run[sleep 3]");
    up.wait_for("the tool running", || {
        members_running(&up.cgroup(), "sleep 3").first().map(|_| ())
    });
    let answer = format!("result-queued-{}", uuid::Uuid::new_v4().simple());
    let queued = continue_with(&up, &id, &format!("model:say[{answer}]"), None);
    up.wait_for("the queued continuation's result recorded", || {
        (state_of(&up, &queued)? == "RESULT_RECORDED").then_some(())
    });
    let tool_done = first_tool_result_after(&model, from).expect("the tool's result");
    let given = first_carrying(&model, &queued).expect("the continuation reached the model");
    assert!(
        given > tool_done,
        "the continuation reached the model (request {given}) before the tool's turn settled (request {tool_done})"
    );
    assert_eq!(turns_carrying(&model, &queued), 1);

    // Expired while the harness is busy: never given, and the budget untouched.
    let settled = up.settled();
    up.type_turn("model:run[sleep 6]");
    up.wait_for("the long tool running", || {
        members_running(&up.cgroup(), "sleep 6").first().map(|_| ())
    });
    let before = budget(&up, &id);
    let late = continue_with(&up, &id, "model:say[never]", Some("1500"));
    up.wait_for("the undeliverable continuation expired", || {
        (state_of(&up, &late)? == "EXPIRED").then_some(())
    });
    up.wait_for("the long turn settled", || {
        (members_running(&up.cgroup(), "sleep 6").is_empty() && up.settled() > settled)
            .then_some(())
    });
    assert_eq!(
        turns_carrying(&model, &late),
        0,
        "an expired continuation was shown"
    );
    assert_eq!(
        budget(&up, &id),
        before,
        "an expired continuation debited the budget"
    );
}

#[test]
fn claude_code_takes_continuations_at_its_stop_hook() {
    continuations(&CLAUDE);
}

#[test]
fn codex_takes_continuations_at_its_stop_hook() {
    continuations(&CODEX);
}

#[test]
fn pi_takes_continuations_through_its_extension() {
    continuations(&PI);
}

#[test]
fn opencode_takes_continuations_through_its_plugin() {
    continuations(&OPENCODE);
}

/// The result recorded for continuation `cn` is the digest of the harness's `answer`.
fn assert_result(up: &Up, cn: &str, answer: &str) {
    assert_eq!(
        up.sql(
            "SELECT result_evidence_digest FROM continuations WHERE continuation_id = $1",
            cn
        ),
        Some(mosaic::protocol::work::evidence_digest(
            "continuation-result",
            answer.as_bytes()
        )),
        "the recorded result of {cn} is not the harness's answer"
    );
}

/// Gives one continuation to the running work `id` and waits for its result; returns its
/// id.
fn continue_once(up: &Up, id: &str, answer: &str) -> String {
    let cn = continue_with(up, id, &format!("model:say[{answer}]"), None);
    wait_result(up, &cn);
    cn
}

/// Spec §14 rule 10, Pi: `/new`, `/resume`, `/fork` and `/clone` would replace the
/// conversation under the live generation — the extension refuses each (and the supervisor
/// counts it); `/reload` imports the extension again in the same conversation, which gets
/// the same contract back and takes the next continuation once.
#[test]
fn pi_keeps_its_conversation_and_its_continuations_across_its_session_commands() {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(&PI, &model, None);
    let a = up
        .assign(PI.runtime, "CONTINUITY-PI: wait for your next action", true)
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let conversation = up.generation()["conversation_id"].clone();
    assert!(conversation.is_string(), "no conversation bound");
    let refused = || {
        up.generation()["harness"]["replacements_refused"]
            .as_u64()
            .unwrap_or(0)
    };
    // `/fork` asks which message to fork from (Enter takes the latest); `/resume` shares
    // `/new`'s event (session_before_switch) and shows a picker with no other session here.
    for (n, (command, then)) in [("/new", None), ("/clone", None), ("/fork", Some("Enter"))]
        .into_iter()
        .enumerate()
    {
        up.type_turn(command);
        // The picker takes the key once it is drawn; until the refusal comes, the key is
        // pressed again (on an empty editor Enter does nothing).
        up.wait_for(&format!("{command} refused"), || {
            if let Some(key) = then {
                up.key(key);
            }
            wait_until_or(std::time::Duration::from_secs(2), || {
                (refused() > n as u64).then_some(())
            })
        });
    }
    assert_eq!(
        up.generation()["conversation_id"],
        conversation,
        "the conversation changed under the live generation"
    );
    let cn = continue_once(&up, &id, "after-the-refusals");
    assert_eq!(turns_carrying(&model, &cn), 1);

    up.type_turn("/reload");
    up.wait_for("the reload", || {
        (up.generation()["harness"]["reloads"].as_u64().unwrap_or(0) >= 1).then_some(())
    });
    let answer = format!("after-the-reload-{}", uuid::Uuid::new_v4().simple());
    let cn = continue_once(&up, &id, &answer);
    assert_eq!(turns_carrying(&model, &cn), 1, "given other than once");
    // The reloaded extension put the contract back into the system prompt.
    let carrying = model
        .conversation()
        .into_iter()
        .find(|b| b.contains(&cn))
        .expect("the continuation's request");
    assert!(
        carrying.contains("CONTINUITY-PI:"),
        "the contract is missing after the reload"
    );
    assert_result(&up, &cn, &answer);
}

/// Claude Code's `/clear` cannot be refused by any hook (2.1.332 runs no UserPromptSubmit
/// for a local command): the supervisor sees the conversation end with reason `clear` and
/// reports the work blocked (`conversation-replaced`), instead of leaving a generation
/// whose model no longer holds its contract looking healthy.
#[test]
fn claude_code_reports_a_cleared_conversation_as_blocked() {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(&CLAUDE, &model, None);
    let a = up
        .assign(
            CLAUDE.runtime,
            "CONTINUITY-CLEAR: wait for your next action",
            true,
        )
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    continue_once(&up, &id, "before-the-clear");
    up.type_turn("/clear");
    let code = up.wait_for("the work blocked", || {
        up.sql(
            "SELECT blocker_code FROM assignments WHERE assignment_id = $1 AND work_status = 'blocked'",
            &id,
        )
    });
    assert_eq!(code, "conversation-replaced");
}

fn lane_state(up: &Up, lane: &str) -> String {
    up.cli(&["lanes"])
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lane_id"] == lane)
        .and_then(|l| l["state"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// (responsibility owner, execution owner, pending target) of a status entry.
fn owners(w: &Value) -> (Option<String>, Option<String>, Option<String>) {
    let s = |k: &str| w[k].as_str().map(str::to_string);
    (
        s("responsibility_owner"),
        s("execution_owner"),
        s("pending_target"),
    )
}

fn count(up: &Up, query: &str, id: &str) -> i64 {
    up.sql(&format!("SELECT ({query})::text"), id)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count from {query}"))
}

/// Spec §8.1 and §17 Cross-harness handoff separation, through each real harness: the
/// target's harness gets its handoff check typed into its pane and answers it in its own
/// turn. Answered in the activation check's form, the check does not pass and the work
/// stays with its source; answered as asked, responsibility moves, and only then is the
/// target's own activation check issued and answered — the handoff ACK never stands in for
/// it. The target then runs the work, continuations included.
fn handoff(f: &Family) {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family_lanes(f, &model, None, 2, &[]);
    let (source, target) = (up.lane_n(1), up.lane_n(2));
    let a = up
        .assign(
            f.runtime,
            "CONTINUITY-HANDOFF: wait for your next action",
            true,
        )
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let mine = (Some(source.clone()), Some(source.clone()), None);

    // 1. The target answers in the wrong form: the offer expires, the work stays.
    let r = up
        .cli(&[
            "handoff",
            "--assignment",
            &id,
            "--to",
            &target,
            "--task",
            "model:handoff-as-activation HANDOFF-WRONG-FORM: take over",
            "--within-ms",
            "60000",
        ])
        .unwrap_or_else(|e| panic!("handoff: {e}"));
    assert!(r["handoff_id"].is_string(), "{r}");
    // Before its activation a generation reaches no model: its answer is the one the
    // gateway gives from its own request (here in the wrong form), refused at its turn end.
    // The offer lasts a minute (OpenCode's TUI alone takes up to 20 s to start): both
    // waits outlast it.
    let offer = std::time::Duration::from_secs(90);
    wait_for("the target's wrong answer refused", offer, || {
        let status = up.host_status();
        let refused = status["lanes"]
            .as_array()?
            .iter()
            .find(|l| l["lane_id"] == target.as_str())?["generation"]["harness"]["ack_refused"]
            .as_u64()?;
        (refused >= 1).then_some(())
    });
    wait_for("the unacknowledged offer to end", offer, || {
        let w = work(&up, &id);
        (w["work_status"] == "active" && w["pending_target"].is_null()).then_some(())
    });
    assert_eq!(owners(&work(&up, &id)), mine, "the work left its source");
    assert_eq!(
        count(
            &up,
            "SELECT count(*) FROM transition_receipts WHERE assignment_id = $1 AND transition = 'handoff-accept'",
            &id
        ),
        0,
        "an answer in the activation check's form took the handoff"
    );
    up.wait_for("the target lane clean again", || {
        (lane_state(&up, &target) == "IDLE_CLEAN").then_some(())
    });

    // 2. Answered as asked: responsibility moves, then the target activates on its own.
    up.cli(&[
        "handoff",
        "--assignment",
        &id,
        "--to",
        &target,
        "--task",
        "HANDOFF-TAKEN: take over and wait for your next action",
    ])
    .unwrap_or_else(|e| panic!("handoff: {e}"));
    up.wait_for("the target to run the work", || {
        let w = work(&up, &id);
        (w["lane_id"] == target.as_str() && w["lane_state"] == "RUNNING").then_some(())
    });
    assert_eq!(
        owners(&work(&up, &id)),
        (Some(target.clone()), Some(target.clone()), None)
    );
    assert_eq!(
        up.sql(
            "SELECT (coalesce(min(decided_at) FILTER (WHERE transition = 'handoff-accept'), 'infinity') < \
                     coalesce(max(decided_at) FILTER (WHERE transition = 'activation-challenge'), '-infinity'))::text \
             FROM transition_receipts WHERE assignment_id = $1",
            &id
        )
        .as_deref(),
        Some("true"),
        "the target's activation challenge did not follow the handoff's acceptance"
    );
    let counts = [
        "SELECT count(*) FROM transition_receipts WHERE assignment_id = $1 AND transition = 'handoff-accept'",
        "SELECT count(*) FROM transition_receipts WHERE assignment_id = $1 AND transition = 'activate'",
        "SELECT count(*) FROM handoffs WHERE assignment_id = $1 AND state = 'ACCEPTED'",
    ]
    .map(|q| count(&up, q, &id));
    assert_eq!(
        counts,
        [1, 2, 1],
        "(accepts, activations: the source's and the target's own, accepted handoffs)"
    );
    up.wait_for("the source lane clean", || {
        (lane_state(&up, &source) == "IDLE_CLEAN").then_some(())
    });
    // The target's harness does the work: a continuation is given to it and answered.
    let answer = format!("after-the-handoff-{}", uuid::Uuid::new_v4().simple());
    let cn = continue_once(&up, &id, &answer);
    assert_eq!(turns_carrying(&model, &cn), 1);
    assert_result(&up, &cn, &answer);
}

#[test]
fn claude_code_takes_a_handoff_only_by_its_own_answer() {
    handoff(&CLAUDE);
}

#[test]
fn codex_takes_a_handoff_only_by_its_own_answer() {
    handoff(&CODEX);
}

#[test]
fn pi_takes_a_handoff_only_by_its_own_answer() {
    handoff(&PI);
}

#[test]
fn opencode_takes_a_handoff_only_by_its_own_answer() {
    handoff(&OPENCODE);
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// Issue 23 part 3, through each real harness: progress is what the supervisor sees in the
/// working directory — a changed file set, a test result at the declared path, a commit
/// whose object is there — never the harness's talk. A turn that only answers earns
/// nothing: the one file-set receipt's digest is that of exactly the file the tool wrote.
fn progress(f: &Family) {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(f, &model, None);
    let a = up
        .assign(f.runtime, "PROGRESS: wait for your next action", true)
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let receipts = |kind: &str| {
        up.sql(
            &format!(
                "SELECT string_agg(evidence_digest, ',' ORDER BY accepted_at) FROM progress_receipts \
                 WHERE assignment_id = $1 AND evidence_kind = '{kind}'"
            ),
            &id,
        )
        .map(|s| s.split(',').map(str::to_string).collect::<Vec<_>>())
        .unwrap_or_default()
    };
    let g = up.generation();
    let work = up
        .dir
        .join("supervisor/harness")
        .join(g["lane_incarnation_id"].as_str().unwrap())
        .join(format!("gen-{}", g["generation"]))
        .join("work");
    assert!(work.is_dir(), "no working directory at {}", work.display());

    // Talk alone, then a file written by the harness's tool.
    let settled = up.settled();
    up.type_turn("model:say[I am making progress, trust me]");
    up.wait_for("the talking turn settled", || {
        (up.settled() > settled).then_some(())
    });
    up.type_turn("model:run[printf 'hello' > notes.txt]");
    let files = up.wait_for("the changed file set counted", || {
        let r = receipts("file-set");
        (!r.is_empty()).then_some(r)
    });
    let listing = serde_json::to_vec(&vec![("notes.txt", Some(sha256_hex(b"hello")))]).unwrap();
    assert_eq!(
        files,
        vec![mosaic::protocol::work::evidence_digest(
            "file-set", &listing
        )],
        "the file-set evidence is not exactly the file the tool wrote"
    );

    // A test result at the declared path.
    up.type_turn("model:run[mkdir -p .mosaic && printf 'ok 1 - notes\\n' > .mosaic/test-result]");
    let results = up.wait_for("the test result counted", || {
        let r = receipts("test-result");
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(
        results,
        vec![mosaic::protocol::work::evidence_digest(
            "test-result",
            b"ok 1 - notes\n"
        )]
    );

    // A commit of that file: its id, read from the repository the tool made.
    up.type_turn(
        "model:run[git init -q && git add notes.txt && git -c user.email=a@b -c user.name=a commit -qm notes]",
    );
    let commits = up.wait_for("the commit counted", || {
        let r = receipts("commit");
        (!r.is_empty()).then_some(r)
    });
    let head = std::process::Command::new("git")
        .args([
            "-c",
            &format!("safe.directory={}", work.display()),
            "rev-parse",
            "HEAD",
        ])
        .current_dir(&work)
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert_eq!(
        commits,
        vec![mosaic::protocol::work::evidence_digest(
            "commit",
            head.as_bytes()
        )]
    );
    // Nothing else was ever counted, and the work's progress moved.
    assert_eq!(
        receipts("file-set").len(),
        1,
        "the commit changed the file set"
    );
    assert!(up
        .sql(
            "SELECT last_progress_at::text FROM assignments WHERE assignment_id = $1",
            &id
        )
        .is_some());
}

#[test]
fn claude_code_earns_progress_in_its_working_directory() {
    progress(&CLAUDE);
}

#[test]
fn codex_earns_progress_in_its_working_directory() {
    progress(&CODEX);
}

#[test]
fn pi_earns_progress_in_its_working_directory() {
    progress(&PI);
}

#[test]
fn opencode_earns_progress_in_its_working_directory() {
    progress(&OPENCODE);
}

/// Issue 23 part 5, through each real harness: the provider answers the harness's turn with
/// its real rate-limit refusal (429, reset headers, error body) for 40 s. The supervisor
/// sees it in the provider's own answer and reports the work blocked (`rate-limited`) until
/// the reset, decided at database time; at the reset the watchdog resumes the work without
/// an operator and gives the running generation a continuation, which it answers.
fn rate_limit(f: &Family) {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(f, &model, None);
    let a = up
        .assign(f.runtime, "RATE-LIMIT: wait for your next action", true)
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    // Claude Code gives up at once on a `retry-after` over a minute, ending its turn with
    // StopFailure (never Stop): that path too.
    let window: i64 = if f.family_name() == "claude-code" {
        70
    } else {
        40
    };
    up.type_turn(&format!(
        "model:rate-limit[rl:{window}] model:say[after-the-limit]"
    ));
    let left = up.wait_for("the work blocked by the rate limit", || {
        up.sql(
            "SELECT blocker_code || ' ' || extract(epoch FROM blocked_until - clock_timestamp())::int \
             FROM assignments WHERE assignment_id = $1 AND work_status = 'blocked'",
            &id,
        )
    });
    let (code, secs) = left.split_once(' ').unwrap();
    assert_eq!(code, "rate-limited");
    let secs: i64 = secs.parse().unwrap();
    assert!(
        (window - 20..=window + 1).contains(&secs),
        "blocked until {secs} s from now, not the provider's reset in {window} s"
    );
    // No operator acts: at the reset the watchdog resumes it and a continuation follows.
    if f.family_name() == "claude-code" {
        up.wait_for("the failed turn seen", || {
            (up.generation()["harness"]["turns_failed"].as_u64()? >= 1).then_some(())
        });
    }
    let resumed = std::time::Duration::from_secs(150);
    let cn = wait_for("the resumed work's continuation answered", resumed, || {
        let cn = up.sql(
            "SELECT continuation_id FROM continuations WHERE assignment_id = $1 AND state = 'RESULT_RECORDED' \
             AND next_action LIKE 'the provider''s rate limit has reset%'",
            &id,
        )?;
        Some(cn)
    });
    assert!(cn.starts_with("cn-"));
    let w = work(&up, &id);
    assert_eq!(w["work_status"], "active", "{w}");
    assert_eq!(
        count(
            &up,
            "SELECT count(*) FROM transition_receipts WHERE assignment_id = $1 AND transition IN ('resume', 'unblock')",
            &id
        ),
        1,
        "resumed other than once, or by an operator"
    );
}

#[test]
fn claude_code_work_waits_out_a_rate_limit_and_resumes() {
    rate_limit(&CLAUDE);
}

#[test]
fn codex_work_waits_out_a_rate_limit_and_resumes() {
    rate_limit(&CODEX);
}

#[test]
fn pi_work_waits_out_a_rate_limit_and_resumes() {
    rate_limit(&PI);
}

#[test]
fn opencode_work_waits_out_a_rate_limit_and_resumes() {
    rate_limit(&OPENCODE);
}

/// §17 Adapter restart duplicate suppression, through each real harness: `mosaic up`
/// (supervisor and coordinator alike) is SIGKILLed at two points of a continuation, and
/// restarted; its generation lives on in its lane and is re-adopted.
/// - After the harness was shown the continuation and its result kept, before the result
///   went out: the restarted supervisor submits the kept result, and the harness was shown
///   the continuation once.
/// - After the continuation's acceptance, before the harness was shown it: whether it was
///   shown is unknown to the restarted supervisor, so it never shows it. The continuation
///   is abandoned at its deadline, the generation replaced, and the work goes on in a fresh
///   one that was never given it; the loop budget was debited once.
fn restarts(f: &Family) {
    let model = Model::start();
    let (_creds, mut up, _token) = Up::for_family(f, &model, None);
    let a = up
        .assign(f.runtime, "CONTINUITY: wait for your next action", true)
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let budget_at_start = budget(&up, &id);
    let accepts = |up: &Up, cn: &str| {
        count(
            up,
            "SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-accept' AND body->>'continuation_id' = $1",
            cn,
        )
    };

    // Shown, its result kept, killed before the result went out.
    up.restart(Some("host:continuation-result=return"));
    let kept = format!("result-kept-{}", uuid::Uuid::new_v4().simple());
    let cn = continue_with(&up, &id, &format!("model:say[{kept}]"), None);
    up.wait_exited("the crash after the result was kept");
    up.restart(None);
    up.wait_for("the kept result recorded", || {
        (state_of(&up, &cn)? == "RESULT_RECORDED").then_some(())
    });
    assert_result(&up, &cn, &kept);
    assert_eq!(turns_carrying(&model, &cn), 1, "{cn} shown other than once");
    assert_eq!(accepts(&up, &cn), 1);

    // Accepted, killed before the harness was shown it.
    let first_generation = up.generation()["generation"].clone();
    up.restart(Some("host:continuation-deliver=return"));
    let lost = continue_with(&up, &id, "model:say[never-shown]", Some("10000"));
    up.wait_exited("the crash between acceptance and visibility");
    up.restart(None);
    up.wait_for("the continuation abandoned", || {
        (state_of(&up, &lost)? == "ABANDONED").then_some(())
    });
    assert_eq!(accepts(&up, &lost), 1);
    assert_eq!(
        budget(&up, &id),
        budget_at_start - 2,
        "the loop budget was debited once per accepted continuation"
    );
    up.wait_for("the work running in a fresh generation", || {
        let g = up.generation();
        (g["generation"].is_number() && g["generation"] != first_generation).then_some(())
    });
    up.wait_for("the work's fresh generation active", || {
        (work(&up, &id)["lane_state"] == "RUNNING").then_some(())
    });
    let answer = format!("result-fresh-{}", uuid::Uuid::new_v4().simple());
    let cn2 = continue_once(&up, &id, &answer);
    assert_result(&up, &cn2, &answer);
    assert_eq!(turns_carrying(&model, &cn2), 1);
    assert_eq!(
        turns_carrying(&model, &lost),
        0,
        "a continuation whose visibility was unknown was shown"
    );
    let log = std::fs::read_to_string(up.dir.with_extension("log")).unwrap();
    for point in ["continuation-result", "continuation-deliver"] {
        assert!(
            log.contains(&format!("failpoint=host:{point}")),
            "{point} never fired"
        );
    }
}

#[test]
fn claude_code_never_shows_a_continuation_twice_across_restarts() {
    restarts(&CLAUDE);
}

#[test]
fn codex_never_shows_a_continuation_twice_across_restarts() {
    restarts(&CODEX);
}

#[test]
fn pi_never_shows_a_continuation_twice_across_restarts() {
    restarts(&PI);
}

#[test]
fn opencode_never_shows_a_continuation_twice_across_restarts() {
    restarts(&OPENCODE);
}

/// The hostile tool, from inside each real harness's own shell tool: the lane socket is the
/// tool's channel too, so everything a real harness must not say for itself is tried from
/// there — the supervisor's own blocker codes, a handoff ACK, a continuation result, an
/// activation answer, a continuation wait: each refused (read back from what the tool
/// printed) — and a progress report, whose word is ignored (the supervisor only looks at
/// the working directory). Nothing changed: the work is active, unblocked, with no
/// reported progress but what the supervisor observed, no continuation, no handoff.
fn hostile_tool(f: &Family) {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(f, &model, None);
    let a = up
        .assign(f.runtime, "HOSTILE: wait for your next action", true)
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let g = up.generation();
    let area = up
        .dir
        .join("supervisor/harness")
        .join(g["lane_incarnation_id"].as_str().unwrap())
        .join(format!("gen-{}", g["generation"]))
        .join("work");
    let tries = [
        ("progress", "progress --kind test-result --evidence ev"),
        (
            "rate-limited",
            "blocked --code rate-limited --evidence ev --next-action wait",
        ),
        (
            "waiting-for-input",
            "blocked --code waiting-for-input --evidence ev --next-action answer",
        ),
        ("handoff-ack", "handoff-ack"),
        (
            "continuation-result",
            "continuation-result --id cn-forged --evidence ev",
        ),
        ("ack", "ack --response mosaic-ack:forged-forged"),
        ("next", "next"),
    ];
    // The script is placed in the working directory (a turn that long is folded by the
    // TUIs); the harness's own shell tool runs it.
    let script: String = std::iter::once("printf forged > ev".to_string())
        .chain(tries.iter().map(|(name, args)| {
            format!("timeout 20 \"$MOSAIC_BIN\" lane {args} > try-{name} 2>&1; echo rc=$? >> try-{name}")
        }))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(area.join("hostile.sh"), script + "\n").unwrap();
    std::fs::set_permissions(
        area.join("hostile.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let settled = up.settled();
    up.type_turn("model:run[sh hostile.sh]");
    up.wait_for("every try made and the turn settled", || {
        (up.settled() > settled
            && tries
                .iter()
                .all(|(name, _)| area.join(format!("try-{name}")).exists()))
        .then_some(())
    });
    for (name, _) in tries {
        let out = std::fs::read_to_string(area.join(format!("try-{name}"))).unwrap();
        if name == "progress" {
            // Not refused: its word is ignored, and the supervisor looks for itself.
            assert!(
                out.contains("observes this harness's progress") && out.contains("rc=0"),
                "{}: `progress` from the shell tool:\n{out}",
                f.runtime
            );
            continue;
        }
        let rc = out
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("rc="))
            .unwrap_or("?");
        // Refused by the supervisor: not a command that never ran, not a timeout.
        assert!(
            !matches!(rc, "0" | "124" | "126" | "127" | "?"),
            "{}: `{name}` from the shell tool ended {rc}:\n{out}",
            f.runtime
        );
        assert!(
            out.contains("\"ok\":false,\"error\""),
            "{}: `{name}` was not refused by the supervisor:\n{out}",
            f.runtime
        );
    }
    let w = work(&up, &id);
    assert_eq!(w["work_status"], "active", "{w}");
    assert_eq!(w["state"], "ACTIVE", "{w}");
    assert_eq!(
        count(
            &up,
            "SELECT count(*) FROM progress_receipts WHERE assignment_id = $1 AND evidence_kind <> 'file-set'",
            &id
        ),
        0,
        "progress reported from the shell tool"
    );
    assert_eq!(
        count(
            &up,
            "SELECT count(*) FROM continuations WHERE assignment_id = $1",
            &id
        ),
        0
    );
    assert_eq!(
        count(
            &up,
            "SELECT count(*) FROM handoffs WHERE assignment_id = $1",
            &id
        ),
        0
    );
}

#[test]
fn claude_code_refuses_what_its_shell_tool_says_for_it() {
    hostile_tool(&CLAUDE);
}

#[test]
fn codex_refuses_what_its_shell_tool_says_for_it() {
    hostile_tool(&CODEX);
}

#[test]
fn pi_refuses_what_its_shell_tool_says_for_it() {
    hostile_tool(&PI);
}

#[test]
fn opencode_refuses_what_its_shell_tool_says_for_it() {
    hostile_tool(&OPENCODE);
}
