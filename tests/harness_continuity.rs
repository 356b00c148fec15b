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
        let r: Value = up
            .cli(&["continue", "--assignment", &id, "--next-action", &next])
            .unwrap_or_else(|e| panic!("continue: {e}"));
        let cn = r["continuation_id"].as_str().unwrap().to_string();
        up.wait_for("the continuation's result recorded", || {
            let state = up.sql(
                "SELECT state FROM continuations WHERE continuation_id = $1",
                &cn,
            )?;
            assert!(
                !matches!(state.as_str(), "EXPIRED" | "ABANDONED"),
                "continuation {cn} ended {state}"
            );
            (state == "RESULT_RECORDED").then_some(())
        });
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
