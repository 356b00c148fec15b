//! Continuation delivery through each real harness's own surface, beside the fake
//! harness's (`mosaic lane next`) in the same run, each under `mosaic up` (coordinator,
//! supervisor, PostgreSQL) against the deterministic test model, in its TUI in a real tmux
//! lane. For each continuation, from `mosaic continue`'s row (database time):
//!
//! - **accepted**: created → acceptance committed (claimed, offered to the settled
//!   harness, accepted by the host, loop budget debited);
//! - **given**: acceptance → the supervisor hands it to the harness at its settled
//!   boundary (its log line; the Stop hook's block decision, Pi's extension, OpenCode's
//!   plugin, the fake's `lane next`);
//! - **at the model**: given → the harness's first request carrying it reaches the model
//!   (real harnesses; the test model's log);
//! - **recorded**: created → the harness's answer recorded as its result (database time).
//!
//! Needs the installed harnesses (`MOSAIC_HARNESS_ROOT`). Run as root:
//! `cargo bench --bench harness_continuations` (`MOSAIC_BENCH_ONLY=pi` runs one family).
//! Prints; asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/harness/mod.rs"]
mod harness;
#[path = "../tests/pg/mod.rs"]
mod pg;

use std::time::{Duration, UNIX_EPOCH};

use harness::*;

const N: usize = 10;

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Seconds since the epoch of an RFC 3339 time.
fn epoch(rfc3339: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339_weak(rfc3339.trim_end_matches('Z')).ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_secs_f64())
}

#[derive(Default)]
struct Row {
    name: String,
    accepted: Vec<f64>,
    given: Vec<f64>,
    at_model: Vec<f64>,
    recorded: Vec<f64>,
}

fn bench(f: &Family) -> Row {
    let fake = f.family_name() == "fake";
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(f, &model, None);
    let task = if fake {
        "take-continuations"
    } else {
        "CONTINUITY: wait for your next action"
    };
    let a = up.assign(f.runtime, task, true).expect("assign");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let mut row = Row {
        name: f.runtime.to_string(),
        ..Default::default()
    };
    for i in 0..N {
        let answer = format!("bench-{i}-{}", uuid::Uuid::new_v4().simple());
        let next = format!("model:say[{answer}]");
        let r = up
            .cli(&["continue", "--assignment", &id, "--next-action", &next])
            .expect("continue");
        let cn = r["continuation_id"].as_str().unwrap().to_string();
        wait_result(&up, &cn);
        let times = up
            .sql(
                "SELECT concat_ws(' ', extract(epoch FROM created_at), extract(epoch FROM accepted_at), \
                        extract(epoch FROM result_at)) FROM continuations WHERE continuation_id = $1",
                &cn,
            )
            .unwrap();
        let t: Vec<f64> = times.split(' ').map(|x| x.parse().unwrap()).collect();
        let (created, accepted, result) = (t[0], t[1], t[2]);
        row.accepted.push((accepted - created) * 1000.0);
        row.recorded.push((result - created) * 1000.0);
        let log = std::fs::read_to_string(up.dir.with_extension("log")).unwrap_or_default();
        let given = log
            .lines()
            .find(|l| l.contains("continuation given to the harness") && l.contains(&cn))
            .and_then(|l| epoch(l.split_whitespace().next()?));
        if let Some(g) = given {
            row.given.push((g - accepted) * 1000.0);
            if !fake {
                let seen = model
                    .requests()
                    .iter()
                    .filter(|r| r["body"]["tools"].as_array().is_some_and(|t| !t.is_empty()))
                    .find(|r| r["body"].to_string().contains(&cn))
                    .and_then(|r| epoch(r["at"].as_str()?));
                if let Some(m) = seen {
                    row.at_model.push((m - g) * 1000.0);
                }
            }
        }
        // Settled again before the next one (the harness's turn ended with its answer).
        std::thread::sleep(Duration::from_millis(200));
    }
    row
}

fn main() {
    common::require_host();
    let only = std::env::var("MOSAIC_BENCH_ONLY").ok();
    let families = [FAKE, CLAUDE, CODEX, PI, OPENCODE];
    let rows: Vec<Row> = families
        .iter()
        .filter(|f| only.as_deref().is_none_or(|o| f.runtime.starts_with(o)))
        .map(bench)
        .collect();
    println!(
        "Mosaic continuation delivery — {N} continuations per harness, each under mosaic up against the test model (ms, p50 / p99)"
    );
    println!(
        "{:<22} {:>20} {:>20} {:>20} {:>20} {:>10}",
        "runtime",
        "created→accepted",
        "accepted→given",
        "given→at model",
        "created→recorded",
        "× fake"
    );
    let fake50 = rows
        .iter()
        .find(|r| r.name.starts_with("fake@"))
        .map(|r| pct(&r.recorded, 0.5));
    for r in &rows {
        let cell = |v: &[f64]| format!("{:>8.1} / {:>8.1}", pct(v, 0.5), pct(v, 0.99));
        println!(
            "{:<22} {:>20} {:>20} {:>20} {:>20} {:>10}",
            r.name,
            cell(&r.accepted),
            cell(&r.given),
            if r.at_model.is_empty() {
                "—".to_string()
            } else {
                cell(&r.at_model)
            },
            cell(&r.recorded),
            fake50
                .map(|f| format!("{:.1}", pct(&r.recorded, 0.5) / f))
                .unwrap_or_default()
        );
    }
}
