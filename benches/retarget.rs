//! Preactivation retarget (spec §6.3), on real daemons: two supervisors, one lane each, a
//! coordinator and PostgreSQL (the test world). Each run freezes host A, assigns work to its
//! lane, SIGKILLs it, and waits for the work to run on host B's lane by retarget. Two spans,
//! database time between receipts: from the objective failure (the end-chain receipt of the
//! expired reservation) to B's activation — which includes the policy's wait until A's host
//! has been without a session long enough to count as gone — and from the candidate's offer
//! to B's activation: the recovery challenge and ACK, the consuming reservation and B's
//! whole chain. The anchor, in the same run and world: a fresh assign on B's idle lane, from
//! its reservation receipt to its activation receipt.
//!
//! Run as root: `cargo bench --bench retarget`. Prints; asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/pg/mod.rs"]
mod pg;
#[path = "../tests/world/mod.rs"]
mod world;

use mosaic::coordinator::service::OperatorRequest;
use world::{assign_request, Spec, World};

const RUNS: usize = 8;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Milliseconds between two receipts of `assignment` (database time).
async fn between(w: &World, assignment: &str, from: &str, to: &str) -> f64 {
    let db = w.sql().await;
    let row = db
        .query_one(
            "SELECT (EXTRACT(EPOCH FROM (t.decided_at - f.decided_at)) * 1000)::float8 \
             FROM transition_receipts f, transition_receipts t \
             WHERE f.receipt_id = (SELECT receipt_id FROM transition_receipts WHERE transition = $2 \
                                   AND (assignment_id = $1 OR body->'chain'->>'assignment_id' = $1) ORDER BY decided_at LIMIT 1) \
               AND t.receipt_id = (SELECT receipt_id FROM transition_receipts WHERE transition = $3 \
                                   AND (assignment_id = $1 OR body->'chain'->>'assignment_id' = $1) ORDER BY decided_at DESC LIMIT 1)",
            &[&assignment, &from, &to],
        )
        .await
        .unwrap();
    row.get::<_, f64>(0)
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut w = World::started(Spec {
        hosts: 2,
        supervisors: 2,
        lanes: 1,
        reservation_ttl_ms: Some(2000),
        tag: "bench-retarget",
        ..Spec::default()
    });
    let (a_lane, b_lane) = (w.lane_of(0, "lane-1"), w.lane_of(1, "lane-1"));
    let stop = |w: &World, id: &str| {
        w.op(&OperatorRequest::Stop {
            assignment_id: id.into(),
            outcome: None,
            evidence_digest: None,
            wait: true,
            request_id: None,
        })
        .unwrap();
    };
    let (mut fresh, mut retarget, mut protocol) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        // The anchor: a fresh assign on B's idle lane.
        let a = w.op(&assign_request(&b_lane, "hang", None, true)).unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        fresh.push(rt.block_on(between(&w, &id, "reserve", "activate")));
        stop(&w, &id);

        // A start that fails with its host: frozen, assigned, SIGKILLed.
        let pid = w.sup[0].pid().unwrap() as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let a = w.op(&assign_request(&a_lane, "hang", None, false)).unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        w.crash_supervisor(0);
        rt.block_on(w.wait_count(
            &format!(
                "SELECT count(*) FROM assignments a JOIN lane_incarnations li USING (lane_incarnation_id) \
                 WHERE a.assignment_id = '{id}' AND li.lane_id = '{b_lane}' AND li.state = 'RUNNING'"
            ),
            |n| n == 1,
            "the retargeted work RUNNING on B",
        ));
        retarget.push(rt.block_on(between(&w, &id, "end-chain", "activate")));
        protocol.push(rt.block_on(between(&w, &id, "retarget-offer", "activate")));
        stop(&w, &id);
        w.start_supervisor(0);
        w.wait_lanes(2);
        common::wait_until("A's lane idle again", || {
            let lanes = w.op(&OperatorRequest::Lanes).ok()?;
            lanes
                .as_array()?
                .iter()
                .all(|l| l["state"] == "IDLE_CLEAN")
                .then_some(())
        });
    }
    let (f50, f99) = (pct(&mut fresh, 0.5), pct(&mut fresh, 0.99));
    let (r50, r99) = (pct(&mut retarget, 0.5), pct(&mut retarget, 0.99));
    let (p50, p99) = (pct(&mut protocol, 0.5), pct(&mut protocol, 0.99));
    println!("retarget, {RUNS} runs (database time between receipts):");
    println!("  fresh assign on B: reserve → activate          p50 {f50:7.1} ms  p99 {f99:7.1} ms");
    println!("  retarget to B: A's end-chain → B's activate    p50 {r50:7.1} ms  p99 {r99:7.1} ms  (includes the policy's wait for A's host to be gone {} ms)",
        mosaic::coordinator::recovery::HOST_GONE_AFTER_MS);
    println!("  retarget to B: candidate offer → B's activate  p50 {p50:7.1} ms  p99 {p99:7.1} ms  ({:.2}× the fresh assign at p50)", p50 / f50);
}
