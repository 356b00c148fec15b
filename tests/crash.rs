//! Faults across the daemons, as separate real processes on real tmux, cgroups and
//! PostgreSQL: the coordinator killed before and after every commit of the chain and of a
//! stop, a second coordinator taking over, the leader paused past its lease, the supervisor
//! killed with lanes RUNNING and mid-chain, the link dropped, the host unreachable during a
//! stop, a host refusing a stage. After each: never two active generations, never a RUNNING
//! without its activation receipt, never an outcome without the host's receipt — and every
//! lane usable again (stop, resume and new work succeed), with no operator action.
//!
//! The crash points need a build with the `failpoints` feature (scripts/test builds one);
//! without it these tests fail with that reason.

mod common;
mod pg;
mod world;

use std::process::Command;
use std::time::{Duration, Instant};

use mosaic::coordinator::service::{operator_call, OpError, OperatorRequest};
use serde_json::Value;
use world::{Spec, World};

/// Every transition of the chain, in order.
const CHAIN: [&str; 8] = [
    "reserve",
    "checkpoint",
    "fence",
    "stage",
    "staged",
    "injected",
    "consume-ack",
    "activate",
];
/// Every transition of a stop.
const STOP: [&str; 3] = ["request-end", "ingest-termination", "finish"];

const LEASE_MS: i64 = 1000;

/// The world of these tests: one host (`lanes` lanes), two coordinators on one database
/// (the second stands by until started), short leases.
struct Split {
    w: World,
}

impl std::ops::Deref for Split {
    type Target = World;
    fn deref(&self) -> &World {
        &self.w
    }
}

impl std::ops::DerefMut for Split {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.w
    }
}

fn require_failpoints() {
    assert!(
        mosaic::coordinator::failpoint::enabled(),
        "the crash tests need a build with `--features failpoints` (scripts/test builds one)"
    );
}

impl Split {
    fn new(lanes: usize) -> Self {
        require_failpoints();
        let mut w = World::new(Spec {
            hosts: 1,
            supervisors: 1,
            coordinators: 2,
            lanes,
            lease_ms: LEASE_MS as u64,
            reservation_ttl_ms: Some(6000),
            reattach_timeout_ms: Some(3000),
            operator_listen: true,
            tag: "split",
            ..Spec::default()
        });
        w.start_coordinator(0, None);
        let mut s = Self { w };
        s.start_supervisor();
        s.wait_lanes(lanes);
        s
    }

    fn coord_pid(&self, i: usize) -> i32 {
        self.coordinator_pid(i)
    }

    /// Waits until the leading coordinator has the host's session (a standby answers
    /// `status` too, but holds no session).
    fn wait_host_connected(&self) {
        let me = format!("host:{}", self.hosts[0]);
        common::wait_until("host connected", || {
            (0..2).find_map(|i| {
                self.coord[i].as_ref()?;
                let st = operator_call(&self.socket(i), &OperatorRequest::Status).ok()?;
                (st["leadership"]["state"] == "leading"
                    && st["hosts_connected"]
                        .as_array()?
                        .iter()
                        .any(|h| h == me.as_str()))
                .then_some(())
            })
        });
    }

    fn start_supervisor(&mut self) {
        self.w.start_supervisor(0);
        let sock = self.runtime_dir(0).join("control.sock");
        common::wait_until("supervisor up", || {
            mosaic::supervisor::control::call(&sock, &mosaic::supervisor::control::Request::Status)
                .ok()
        });
    }

    fn crash_supervisor(&mut self) {
        self.w.crash_supervisor(0);
    }

    fn host_status(&self) -> Value {
        mosaic::supervisor::control::call(
            &self.runtime_dir(0).join("control.sock"),
            &mosaic::supervisor::control::Request::Status,
        )
        .unwrap()
    }

    /// The host's live generation on lane `n`, if any.
    fn host_generation(&self, n: usize) -> Option<u64> {
        let st = self.host_status();
        st["lanes"]
            .as_array()?
            .iter()
            .find(|l| l["lane"] == format!("lane-{n}").as_str())?["generation"]["generation"]
            .as_u64()
    }

    fn lane(&self, n: usize) -> String {
        self.lane_of(0, &format!("lane-{n}"))
    }

    fn assign(&self, n: usize, task: &str) -> Result<Value, OpError> {
        self.op(&assign_req(&self.lane(n), task, None))
    }

    /// An assign in the background (it may be cut short by a crash).
    fn assign_async(
        &self,
        n: usize,
        task: &str,
    ) -> std::thread::JoinHandle<Result<Value, OpError>> {
        let (sock, req) = (self.socket(0), assign_req(&self.lane(n), task, None));
        std::thread::spawn(move || operator_call(&sock, &req))
    }

    fn stop(&self, assignment: &str) -> Result<Value, OpError> {
        self.op(&OperatorRequest::Stop {
            assignment_id: assignment.into(),
            outcome: None,
            evidence_digest: None,
            wait: true,
        })
    }

    /// A stop that must end in CANCELLED: answered at once, or `pending` until the host
    /// (re)connects and its receipt makes the outcome final.
    fn stop_final(&self, assignment: &str) -> Value {
        let out = self
            .stop(assignment)
            .unwrap_or_else(|e| panic!("stop of {assignment} refused: {e}"));
        if out["state"] == "CANCELLED" {
            return out;
        }
        assert!(out["pending"].is_string(), "{out}");
        common::wait_until(&format!("{assignment} final"), || {
            let st = self.op(&OperatorRequest::Status).ok()?;
            st["assignments"]
                .as_array()?
                .iter()
                .find(|a| a["assignment_id"] == assignment && a["state"] == "CANCELLED")
                .cloned()
        })
    }

    async fn lane_row(&self, lane: &str) -> (String, Option<i64>) {
        let r = self
            .sql()
            .await
            .query_one(
                "SELECT state, (SELECT max(g.generation) FROM generations g WHERE g.lane_incarnation_id = li.lane_incarnation_id AND g.state <> 'ENDED') \
                 FROM lane_incarnations li WHERE lane_id = $1 AND retired_at IS NULL",
                &[&lane],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    }

    async fn assignment_row(
        &self,
        lane: &str,
    ) -> Option<(String, String, Option<String>, Option<String>, String)> {
        self.sql()
            .await
            .query_opt(
                "SELECT a.assignment_id, a.lifecycle, a.execution_owner, a.pending_target, a.responsibility_owner \
                 FROM assignments a JOIN lane_incarnations li USING (lane_incarnation_id) WHERE li.lane_id = $1 \
                 ORDER BY a.created_at DESC LIMIT 1",
                &[&lane],
            )
            .await
            .unwrap()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
    }

    /// Waits (blocking the test thread, not the runtime) until lane `n` has settled: the
    /// coordinator's lane is RUNNING with the host running exactly its generation, or
    /// IDLE_CLEAN with nothing unended and the host running nothing.
    fn wait_settled(&self, n: usize, what: &str) -> String {
        let lane = self.lane(n);
        let rt = tokio::runtime::Handle::current();
        common::wait_until(&format!("{lane} settles ({what})"), || {
            let (state, unended) = std::thread::scope(|s| {
                s.spawn(|| rt.block_on(self.lane_row(&lane)))
                    .join()
                    .unwrap()
            });
            let host = self.host_generation(n);
            match state.as_str() {
                "RUNNING" if unended.is_some() && host.map(|g| g as i64) == unended => Some(state),
                "IDLE_CLEAN" if unended.is_none() && host.is_none() => Some(state),
                _ => None,
            }
        })
    }

    /// The invariants that must hold after any crash.
    async fn invariants(&self) {
        assert_eq!(
            self.count("SELECT count(*) FROM (SELECT lane_incarnation_id FROM generations WHERE state <> 'ENDED' GROUP BY 1 HAVING count(*) > 1) x").await,
            0,
            "two active generations on one incarnation"
        );
        assert_eq!(
            self.count(
                "SELECT count(*) FROM lane_incarnations li WHERE li.state = 'RUNNING' AND NOT EXISTS ( \
                   SELECT 1 FROM transition_receipts t WHERE t.transition = 'activate' AND t.lane_incarnation_id = li.lane_incarnation_id)"
            )
            .await,
            0,
            "RUNNING without its activation receipt"
        );
        assert_eq!(
            self.count(
                "SELECT count(*) FROM leases s JOIN lane_incarnations li USING (lane_incarnation_id) \
                 WHERE s.released_at IS NULL AND li.state <> 'RUNNING'"
            )
            .await,
            0,
            "an unreleased effect lease outside RUNNING"
        );
        // An outcome is final only when every generation it ever had is proven ended: a
        // verified receipt, or the host's verified teardown of the whole lane (a retired
        // incarnation). An assignment that never staged a generation has nothing to prove.
        assert_eq!(
            self.count(
                "SELECT count(*) FROM assignments a WHERE a.lifecycle IN ('COMPLETED', 'CANCELLED', 'FAILED') AND EXISTS ( \
                   SELECT 1 FROM reservations r JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation \
                   JOIN lane_incarnations li ON li.lane_incarnation_id = g.lane_incarnation_id \
                   LEFT JOIN termination_receipts t ON t.lane_incarnation_id = g.lane_incarnation_id AND t.generation = g.generation \
                   WHERE r.assignment_id = a.assignment_id AND (g.state <> 'ENDED' OR (t.verified_empty IS NOT TRUE AND li.retired_at IS NULL)))"
            )
            .await,
            0,
            "an outcome without the host's verified receipt"
        );
        assert_eq!(
            self.count("SELECT count(*) FROM (SELECT lane_incarnation_id, generation FROM termination_receipts GROUP BY 1, 2 HAVING count(*) > 1) x").await,
            0,
            "a receipt duplicated"
        );
    }

    /// After any fault: the lane can be stopped (whatever its assignment's state), and new
    /// work reaches RUNNING on it.
    async fn usable(&self, n: usize) {
        let lane = self.lane(n);
        self.wait_host_connected();
        if let Some((id, life, ..)) = self.assignment_row(&lane).await {
            if life == "ACTIVE" || life == "RECOVERY" {
                let out = self.stop_final(&id);
                assert_eq!(out["state"], "CANCELLED", "{out}");
            }
        }
        self.wait_settled(n, "after the stop");
        let a = self
            .assign(n, "hang")
            .unwrap_or_else(|e| panic!("new work on {lane}: {e}"));
        assert_eq!(a["state"], "RUNNING");
        let out = self.stop(a["assignment_id"].as_str().unwrap()).unwrap();
        assert_eq!(out["state"], "CANCELLED");
        self.wait_settled(n, "after the new work");
        self.invariants().await;
    }
}

fn assign_req(lane: &str, task: &str, resume: Option<&str>) -> OperatorRequest {
    OperatorRequest::Assign {
        lane_id: lane.into(),
        runtime: "fake@1.0.0".into(),
        task: task.into(),
        scope: vec![],
        holds: vec![],
        completion_policy: None,
        wait: true,
        resume: resume.map(String::from),
        request_id: None,
        inactivity_policy: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_coordinator_killed_before_or_after_any_chain_commit_never_wedges_a_lane() {
    let points: Vec<(&str, &str)> = CHAIN
        .iter()
        .flat_map(|op| [("before-commit", *op), ("after-commit", *op)])
        .collect();
    let mut w = Split::new(points.len());
    w.crash_coordinator(0);
    for (i, (when, op)) in points.iter().enumerate() {
        let n = i + 1;
        let lane = w.lane(n);
        let point = format!("{when}:{op}");
        w.start_coordinator(0, Some(&format!("{point}=return")));
        w.wait_leading(0);
        w.wait_host_connected();
        let waiter = w.assign_async(n, "hang");
        w.wait_coordinator_died(0, &point);
        let _ = waiter.join();
        w.invariants().await;
        // A fresh process drives the chain on from the database: on to RUNNING if the
        // activation committed, otherwise to a fail-closed end (a new epoch ends every
        // chain before activation) with the host's generation stopped.
        w.start_coordinator(0, None);
        w.wait_leading(0);
        let state = w.wait_settled(n, &point);
        let a = w.assignment_row(&lane).await;
        match (point.as_str(), a) {
            ("after-commit:activate", Some((_, life, exec, pending, resp))) => {
                assert_eq!(state, "RUNNING", "{point}");
                assert_eq!(
                    (
                        life.as_str(),
                        exec.as_deref(),
                        pending.as_deref(),
                        resp.as_str()
                    ),
                    ("ACTIVE", Some(lane.as_str()), None, lane.as_str()),
                    "{point}"
                );
            }
            ("before-commit:reserve", a) => {
                assert_eq!(state, "IDLE_CLEAN", "{point}");
                assert!(
                    a.is_none(),
                    "{point}: an uncommitted reservation left an assignment"
                );
            }
            (_, Some((_, life, exec, pending, resp))) => {
                assert_eq!(state, "IDLE_CLEAN", "{point}");
                assert_eq!(
                    (
                        life.as_str(),
                        exec.as_deref(),
                        pending.as_deref(),
                        resp.as_str()
                    ),
                    ("RECOVERY", None, None, lane.as_str()),
                    "{point}: owners"
                );
            }
            (_, None) => panic!("{point}: no assignment"),
        }
        w.invariants().await;
        w.usable(n).await;
        w.crash_coordinator(0);
    }
    assert!(
        w.count("SELECT max(epoch) FROM epochs").await > points.len() as i64,
        "every restart took a new epoch"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_coordinator_killed_before_or_after_any_stop_commit_finishes_the_stop() {
    let points: Vec<(&str, &str)> = STOP
        .iter()
        .flat_map(|op| [("before-commit", *op), ("after-commit", *op)])
        .collect();
    let mut w = Split::new(points.len());
    for (i, (when, op)) in points.iter().enumerate() {
        let n = i + 1;
        let point = format!("{when}:{op}");
        w.crash_coordinator(0);
        w.start_coordinator(0, Some(&format!("{point}=return")));
        w.wait_leading(0);
        w.wait_host_connected();
        let a = w.assign(n, "hang spawn=2").unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        let generation = a["generation"].as_i64().unwrap();
        // The stop is cut short by the crash (or answers before it).
        let _ = w.stop(&id);
        w.wait_coordinator_died(0, &point);
        w.invariants().await;
        w.start_coordinator(0, None);
        w.wait_leading(0);
        // Repeating the stop is idempotent, and it finishes: the host's receipt proves the
        // end, the outcome is final only then.
        let out = w.stop_final(&id);
        assert_eq!(out["state"], "CANCELLED", "{point}: {out}");
        assert_eq!(w.wait_settled(n, &point), "IDLE_CLEAN");
        assert_eq!(
            w.count(&format!("SELECT count(*) FROM termination_receipts WHERE assignment_id = '{id}' AND generation = {generation} AND verified_empty")).await,
            1,
            "{point}: exactly one verified receipt"
        );
        common::wait_until("receipts acknowledged", || {
            (w.host_status()["unacknowledged_receipts"] == 0).then_some(())
        });
        w.invariants().await;
        w.usable(n).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_supervisor_killed_with_lanes_running_and_mid_chain_leaves_every_lane_usable() {
    let mut w = Split::new(3);
    w.wait_host_connected();
    // Lane 1 RUNNING; lane 2 held before its ACK (the harness never acknowledges); lane 3
    // idle.
    let running = w.assign(1, "hang spawn=2").unwrap();
    let waiter = w.assign_async(2, "no-ack hang");
    let rt = tokio::runtime::Handle::current();
    common::wait_until("lane 2 waiting for its ACK", || {
        let (st, _) = std::thread::scope(|s| {
            s.spawn(|| rt.block_on(w.lane_row(&w.lane(2))))
                .join()
                .unwrap()
        });
        (st == "AWAITING_ACK").then_some(())
    });
    let before = w.host_status();
    w.crash_supervisor();
    w.start_supervisor();
    w.wait_host_connected();
    // The RUNNING generation was re-adopted (same identity) and keeps running; the chain
    // whose hand-off died with the old supervisor is ended by the coordinator and its
    // generation stopped — never activated.
    assert_eq!(w.wait_settled(1, "re-adopted RUNNING"), "RUNNING");
    assert_eq!(
        w.host_status()["lanes"][0]["generation"]["process_identity"],
        before["lanes"][0]["generation"]["process_identity"]
    );
    assert_eq!(w.wait_settled(2, "ended mid-chain"), "IDLE_CLEAN");
    let out = waiter.join().unwrap();
    assert!(
        out.is_err(),
        "a chain whose host lost it reported RUNNING: {out:?}"
    );
    let (id2, life, ..) = w.assignment_row(&w.lane(2)).await.unwrap();
    assert_eq!(life, "RECOVERY");
    // Resume works on the lane; the RUNNING one stops; new work runs everywhere.
    let b = w.op(&assign_req(&w.lane(2), "hang", Some(&id2))).unwrap();
    assert_eq!(
        (b["state"].as_str(), b["assignment_id"].as_str()),
        (Some("RUNNING"), Some(id2.as_str()))
    );
    assert_eq!(
        w.stop(running["assignment_id"].as_str().unwrap()).unwrap()["state"],
        "CANCELLED"
    );
    for n in 1..=3 {
        w.usable(n).await;
    }
    // No receipt lost or duplicated.
    common::wait_until("receipts acknowledged", || {
        (w.host_status()["unacknowledged_receipts"] == 0).then_some(())
    });
    assert_eq!(
        w.count("SELECT count(*) FROM generations WHERE state = 'ENDED' AND end_receipt IS NULL")
            .await,
        0,
        "a generation ended without its receipt"
    );
    w.invariants().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_paused_past_its_lease_reacquires_and_its_inflight_transition_is_refused() {
    let mut w = Split::new(2);
    // The pause lands inside consume-ack: the transaction is open, its commit still ahead.
    w.crash_coordinator(0);
    w.start_coordinator(0, Some("before-commit:consume-ack=1*sleep(3000)"));
    let first = w.wait_leading(0);
    w.wait_host_connected();
    let waiter = w.assign_async(1, "hang");
    let rt = tokio::runtime::Handle::current();
    // In flight: the lane waits for its ACK and a coordinator transaction has sat open far
    // longer than any transition takes (the failpoint holds it before its commit).
    common::wait_until("consume-ack in flight", || {
        let n = std::thread::scope(|s| {
            s.spawn(|| rt.block_on(w.count(&format!(
                "SELECT count(*) FROM pg_stat_activity a, lane_incarnations li \
                 WHERE a.application_name = 'mosaic-coordinator' AND a.state = 'idle in transaction' \
                   AND clock_timestamp() - a.state_change > interval '400 ms' \
                   AND li.lane_id = '{}' AND li.retired_at IS NULL AND li.state = 'AWAITING_ACK'",
                w.lane(1)
            )))).join().unwrap()
        });
        (n > 0).then_some(())
    });
    let pid = nix::unistd::Pid::from_raw(w.coord_pid(0));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(3 * LEASE_MS as u64));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    // The commit came after the lease lapsed: refused. No other coordinator runs, so the
    // same process takes a higher epoch and ends the chain it had in flight.
    let _ = waiter.join();
    let second = w.wait_leading(0);
    assert!(
        second > first,
        "re-acquired with a higher epoch ({first} → {second})"
    );
    assert_eq!(
        w.count("SELECT count(*) FROM transition_receipts WHERE transition = 'consume-ack'")
            .await,
        0,
        "the transition in flight across the lapse committed"
    );
    let st = w.op(&OperatorRequest::Status).unwrap();
    assert!(st["leadership"]["losses"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(w.wait_settled(1, "after the lapse"), "IDLE_CLEAN");
    assert_eq!(w.assignment_row(&w.lane(1)).await.unwrap().1, "RECOVERY");
    // Work continues under the new epoch.
    w.usable(1).await;
    w.usable(2).await;
}

/// Leadership acquisition runs in the transition frame like every other authority change,
/// so it has the same crash points: killed before its commit it minted nothing (the next
/// acquisition takes the very next epoch), killed after it the epoch and its receipt are
/// there and the next one takes the epoch after — and lanes work under either.
#[tokio::test(flavor = "multi_thread")]
async fn a_coordinator_killed_around_its_acquisition_commit_mints_an_epoch_only_with_its_receipt() {
    let mut w = Split::new(1);
    let first = w.wait_leading(0);
    w.crash_coordinator(0);
    // Before the commit: nothing of the acquisition survives.
    w.start_coordinator(0, Some("before-commit:leadership-acquire=return"));
    w.wait_coordinator_died(0, "before-commit:leadership-acquire");
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM epochs WHERE epoch > {first}"
        ))
        .await,
        0,
        "an acquisition killed before its commit minted an epoch"
    );
    w.start_coordinator(0, None);
    let second = w.wait_leading(0);
    assert_eq!(
        second,
        first + 1,
        "the next acquisition takes the very next epoch"
    );
    w.crash_coordinator(0);
    // After the commit: the epoch exists, with its receipt, though its holder is dead.
    w.start_coordinator(0, Some("after-commit:leadership-acquire=return"));
    w.wait_coordinator_died(0, "after-commit:leadership-acquire");
    let receipts = format!(
        "SELECT count(*) FROM transition_receipts r JOIN idempotency i USING (receipt_id) \
         WHERE r.transition = 'leadership-acquire' AND r.coordinator_epoch = {}",
        second + 1
    );
    assert_eq!(
        w.count(&receipts).await,
        1,
        "the committed acquisition has its receipt"
    );
    w.start_coordinator(0, None);
    let third = w.wait_leading(0);
    assert_eq!(
        third,
        second + 2,
        "the dead acquisition's epoch is never reused"
    );
    w.wait_host_connected();
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_standby_takes_over_a_dead_leader_and_drives_every_chain_on() {
    let mut w = Split::new(2);
    // The leader will die mid-chain on the second assignment, after the host's identity
    // was recorded; the first one runs.
    w.crash_coordinator(0);
    w.start_coordinator(0, Some("after-commit:staged=1*print(first)->return"));
    w.wait_leading(0);
    w.wait_host_connected();
    let running = w.assign(1, "hang").unwrap();
    // A second coordinator on the same database stands by.
    w.start_coordinator(1, None);
    let st = operator_call(&w.socket(1), &OperatorRequest::Status).unwrap();
    assert_eq!(st["leadership"]["state"], "standby");
    let waiter = w.assign_async(2, "hang");
    w.wait_coordinator_died(0, "after-commit:staged");
    let _ = waiter.join();
    // The standby leads within the lease plus one renewal interval of the old lease's end
    // (database times, both from its acquisition receipt).
    let epoch = w.wait_leading(1);
    let gap_ms: f64 = w
        .sql()
        .await
        .query_one(
            "SELECT EXTRACT(EPOCH FROM (decided_at - (body->>'previous_lease_expires_at')::timestamptz))::float8 * 1000 \
             FROM transition_receipts WHERE transition = 'leadership-acquire' AND coordinator_epoch = $1",
            &[&epoch],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        gap_ms <= (LEASE_MS + LEASE_MS / 3) as f64,
        "took over {gap_ms} ms after the lease ended"
    );
    // It drives every chain on with no operator action: the host reconnects to it, the
    // interrupted chain ends with its generation stopped, the RUNNING one keeps running.
    assert_eq!(w.wait_settled(2, "driven on by the standby"), "IDLE_CLEAN");
    assert_eq!(w.assignment_row(&w.lane(2)).await.unwrap().1, "RECOVERY");
    assert_eq!(w.wait_settled(1, "kept running"), "RUNNING");
    assert_eq!(
        w.stop_final(running["assignment_id"].as_str().unwrap())["state"],
        "CANCELLED"
    );
    w.usable(1).await;
    w.usable(2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_that_loses_its_lease_to_the_standby_hands_its_hosts_over() {
    let mut w = Split::new(2);
    w.wait_leading(0);
    w.wait_host_connected();
    let running = w.assign(1, "hang").unwrap();
    w.start_coordinator(1, None);
    // Paused for a few leases — far less than the session liveness limit (15 s), so the
    // host sees nothing wrong with its session to the paused leader.
    let pid = nix::unistd::Pid::from_raw(w.coord_pid(0));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let epoch = w.wait_leading(1);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    // The old leader learns it lost (its renewal is refused) and lets its hosts go; the
    // host reconnects, the old leader refuses it as a standby, and it lands on the leader.
    let me = format!("host:{}", w.hosts[0]);
    common::wait_until("the host on the new leader", || {
        let st = operator_call(&w.socket(1), &OperatorRequest::Status).ok()?;
        st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == me.as_str())
            .then_some(())
    });
    let old = operator_call(&w.socket(0), &OperatorRequest::Status).unwrap();
    assert_eq!(old["leadership"]["state"], "standby", "{old}");
    assert!(
        old["hosts_connected"].as_array().unwrap().is_empty(),
        "the old leader kept a host session: {old}"
    );
    assert!(w.wait_leading(1) >= epoch);
    assert_eq!(
        w.stop_final(running["assignment_id"].as_str().unwrap())["state"],
        "CANCELLED"
    );
    w.usable(2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_receipt_the_coordinator_never_got_is_asked_for_again() {
    let mut w = Split::new(1);
    w.wait_host_connected();
    let a = w.assign(1, "hang").unwrap();
    let hp = w.host_status()["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    // The coordinator is down when the harness dies; the receipt is then marked
    // acknowledged on the host without the coordinator ever seeing it (what a lost ack,
    // or a local ack behind its back, would leave).
    w.crash_coordinator(0);
    common::kill(hp as i32, nix::sys::signal::Signal::SIGKILL);
    let outbox = w.state_dir(0).join("outbox");
    let file = common::wait_until("the receipt durable", || {
        std::fs::read_dir(&outbox)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "json"))
    });
    std::fs::rename(
        &file,
        w.state_dir(0).join("acked").join(file.file_name().unwrap()),
    )
    .unwrap();
    // The database still says RUNNING; the host's report no longer lists the generation.
    w.start_coordinator(0, None);
    w.wait_leading(0);
    assert_eq!(
        w.wait_settled(1, "the lost receipt recovered"),
        "IDLE_CLEAN"
    );
    let (id, life, exec, ..) = w.assignment_row(&w.lane(1)).await.unwrap();
    assert_eq!(id, a["assignment_id"].as_str().unwrap());
    assert_eq!((life.as_str(), exec), ("RECOVERY", None));
    assert_eq!(
        w.count("SELECT count(*) FROM termination_receipts").await,
        1,
        "the receipt was not ingested exactly once"
    );
    // And a supervisor under a coordinator refuses to acknowledge receipts or start
    // generations on its own.
    let sock = w.runtime_dir(0).join("control.sock");
    for req in [
        mosaic::supervisor::control::Request::Ack { key: "tr-x".into() },
        mosaic::supervisor::control::Request::Start {
            lane: "lane-1".into(),
            runtime: "fake@1.0.0".into(),
            directives: vec!["hang".into()],
        },
    ] {
        match mosaic::supervisor::control::call(&sock, &req) {
            Err(mosaic::supervisor::control::ClientError::Refused { kind, .. }) => {
                assert_eq!(kind, "coordinated")
            }
            other => panic!("{req:?} was not refused: {other:?}"),
        }
    }
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_with_the_host_unreachable_is_pending_until_it_reconnects() {
    let mut w = Split::new(1);
    w.wait_host_connected();
    let a = w.assign(1, "hang spawn=2").unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    w.crash_supervisor();
    let me = format!("host:{}", w.hosts[0]);
    common::wait_until("host gone", || {
        let st = w.op(&OperatorRequest::Status).ok()?;
        (!st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == me.as_str()))
        .then_some(())
    });
    // Leases revoked at once; no outcome before the host's receipt.
    let out = w.stop(&id).unwrap();
    assert!(
        out["pending"]
            .as_str()
            .unwrap_or("")
            .contains("host unreachable"),
        "{out}"
    );
    assert_eq!(out["state"], "ACTIVE");
    assert_eq!(
        w.count("SELECT count(*) FROM leases WHERE released_at IS NULL")
            .await,
        0
    );
    assert_eq!(w.assignment_row(&w.lane(1)).await.unwrap().1, "ACTIVE");
    // Repeating it is idempotent.
    let again = w.stop(&id).unwrap();
    assert_eq!(again["state"], "ACTIVE");
    assert_eq!(
        w.count("SELECT count(*) FROM transition_receipts WHERE transition = 'request-end'")
            .await,
        1
    );
    // The host comes back: the generation is stopped, the receipt proves it, the outcome
    // is final.
    w.start_supervisor();
    assert_eq!(w.wait_settled(1, "stopped on reconnect"), "IDLE_CLEAN");
    assert_eq!(w.assignment_row(&w.lane(1)).await.unwrap().1, "CANCELLED");
    assert_eq!(w.stop(&id).unwrap()["state"], "CANCELLED");
    w.invariants().await;
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_stages_expired_reservations_and_host_quarantines_end_visibly() {
    let w = Split::new(2);
    w.wait_host_connected();
    let rt = tokio::runtime::Handle::current();
    let row = |lane: String| {
        let w = &w;
        let rt = rt.clone();
        std::thread::scope(move |s| {
            s.spawn(move || rt.block_on(w.lane_row(&lane)))
                .join()
                .unwrap()
        })
    };
    // 1. An expired reservation (the harness never acknowledges): the chain ends, the
    // host's generation is stopped, the lane is reusable.
    let err = w.assign(1, "no-ack hang").unwrap_err();
    assert_eq!(
        err.category,
        mosaic::coordinator::Category::ChainEnded,
        "{err}"
    );
    assert_eq!(w.wait_settled(1, "after expiry"), "IDLE_CLEAN");
    assert_eq!(w.assignment_row(&w.lane(1)).await.unwrap().1, "RECOVERY");
    w.usable(1).await;
    // 2. A host-side quarantine (the lane's tmux server vanished) refuses the stage: the
    // chain ends at once (not at its deadline), and the coordinator shows the quarantine.
    let sock = w.runtime_dir(0).join("lanes/lane-2/tmux.sock");
    let _ = Command::new("tmux")
        .arg("-S")
        .arg(&sock)
        .arg("kill-server")
        .status();
    let started = Instant::now();
    let err = w.assign(2, "hang").unwrap_err();
    assert_eq!(
        err.category,
        mosaic::coordinator::Category::ChainEnded,
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "the refusal waited for the reservation deadline"
    );
    common::wait_until("host quarantine shown", || {
        let (st, _) = row(w.lane(2));
        (st == "QUARANTINED").then_some(())
    });
    let lanes = w.op(&OperatorRequest::Lanes).unwrap();
    let l2 = lanes
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lane_id"] == w.lane(2).as_str())
        .unwrap()
        .clone();
    assert!(
        l2["host_quarantine_reason"]
            .as_str()
            .is_some_and(|r| r.contains("tmux")),
        "{l2}"
    );
    // Release is refused while the host holds the quarantine; recreate is the way out.
    let e = w
        .op(&OperatorRequest::LaneRelease {
            lane_id: w.lane(2),
            request_id: None,
        })
        .unwrap_err();
    assert_eq!(
        e.category,
        mosaic::coordinator::Category::Unreconciled,
        "{e}"
    );
    let old = l2["lane_incarnation_id"].as_str().unwrap().to_string();
    w.op(&OperatorRequest::LaneRecreate { lane_id: w.lane(2) })
        .unwrap();
    common::wait_until("lane recreated", || {
        let lanes = w.op(&OperatorRequest::Lanes).ok()?;
        let l = lanes
            .as_array()?
            .iter()
            .find(|l| l["lane_id"] == w.lane(2).as_str())?
            .clone();
        (l["lane_incarnation_id"] != old.as_str() && l["state"] == "IDLE_CLEAN").then_some(())
    });
    w.usable(2).await;
    // (A stage for a stale incarnation, an unknown lane or a fenced generation is refused
    // the same way; tests/stale.rs drives each against the host directly.)
    w.invariants().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn receipts_written_while_the_link_is_down_arrive_once_after_it_is_restored() {
    let mut w = Split::new(1);
    let lane = w.lane(1);
    let a = w.assign(1, "spawn=3").unwrap();
    assert_eq!(a["state"], "RUNNING");
    w.crash_coordinator(0);
    // While the coordinator (and with it the link) is gone, the harness dies.
    let hp = w.host_status()["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(hp as i32, nix::sys::signal::Signal::SIGKILL);
    common::wait_until("receipt in the outbox", || {
        (w.host_status()["unacknowledged_receipts"] == 1).then_some(())
    });
    w.start_coordinator(0, None);
    w.wait_host_connected();
    common::wait_until("receipt delivered and acknowledged", || {
        (w.host_status()["unacknowledged_receipts"] == 0).then_some(())
    });
    assert_eq!(
        w.count("SELECT count(*) FROM termination_receipts").await,
        1,
        "exactly once"
    );
    let r = w
        .op(&OperatorRequest::Receipts {
            lane_id: Some(lane.clone()),
        })
        .unwrap();
    assert_eq!(r[0]["reconciliation"], "recovery");
    assert_eq!(w.lane_row(&lane).await.0, "IDLE_CLEAN");
    w.invariants().await;
    w.usable(1).await;
}

#[test]
fn remote_operators_need_an_operator_certificate_from_the_ca() {
    let w = Split::new(1);
    let pki = w.dir.join("pki");
    let op = mosaic::pki::issue(&pki, mosaic::pki::Kind::Operator, "alice", 30, false).unwrap();
    let url = format!("tls://{}", w.operator_addr.as_deref().unwrap());
    let run = |cert: &std::path::Path, key: &std::path::Path, ca: &std::path::Path| {
        Command::new(common::MOSAIC)
            .args([
                "lanes",
                "--json",
                "--coordinator",
                &url,
                "--server-name",
                "localhost",
                "--ca",
            ])
            .arg(ca)
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key)
            .output()
            .unwrap()
    };
    let ca = mosaic::pki::ca_cert_path(&pki);
    let ok = run(&op.cert, &op.key, &ca);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let lanes: Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(lanes[0]["lane_id"], w.lane(1).as_str());
    // A host's certificate is from the right CA but names no operator: refused.
    let host_cert = pki.join(format!("host-{}.pem", w.hosts[0]));
    let host_key = pki.join(format!("host-{}-key.pem", w.hosts[0]));
    assert!(
        !run(&host_cert, &host_key, &ca).status.success(),
        "a host certificate got operator access"
    );
    // An operator certificate from another CA: refused at the handshake.
    let other = w.dir.join("other-pki");
    mosaic::pki::init(&other, false).unwrap();
    let stranger =
        mosaic::pki::issue(&other, mosaic::pki::Kind::Operator, "mallory", 30, false).unwrap();
    assert!(
        !run(&stranger.cert, &stranger.key, &ca).status.success(),
        "a foreign operator got access"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn assigning_to_a_disconnected_host_reserves_nothing() {
    let mut w = Split::new(1);
    w.wait_host_connected();
    w.crash_supervisor();
    let me = format!("host:{}", w.hosts[0]);
    common::wait_until("host gone", || {
        let st = w.op(&OperatorRequest::Status).ok()?;
        (!st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == me.as_str()))
        .then_some(())
    });
    let err = w.assign(1, "hang").unwrap_err();
    assert_eq!(
        err.category,
        mosaic::coordinator::Category::HostUnreachable,
        "{err}"
    );
    assert_eq!(w.count("SELECT count(*) FROM reservations").await, 0);
    assert_eq!(w.lane_row(&w.lane(1)).await.0, "IDLE_CLEAN");
}

#[tokio::test(flavor = "multi_thread")]
async fn lanes_created_or_recreated_on_a_connected_host_are_registered_on_the_same_session() {
    use mosaic::supervisor::control::{call, Request};
    let w = Split::new(1);
    let ctl = w.runtime_dir(0).join("control.sock");
    let coordinator_incarnation = |lane: &str| -> Option<String> {
        w.op(&OperatorRequest::Lanes)
            .ok()?
            .as_array()?
            .iter()
            .find(|l| l["lane_id"] == lane)?["lane_incarnation_id"]
            .as_str()
            .map(String::from)
    };
    // A lane made after the session came up becomes assignable without a reconnect.
    let made = call(
        &ctl,
        &Request::LaneCreate {
            lane: "lane-2".into(),
        },
    )
    .unwrap();
    let lane = w.lane(2);
    let inc = made["lane_incarnation_id"].as_str().unwrap().to_string();
    common::wait_until("new lane registered", || {
        (coordinator_incarnation(&lane)? == inc).then_some(())
    });
    let a = w.assign(2, "hang").unwrap();
    assert_eq!(a["state"], "RUNNING");
    // Destroyed and recreated by the host while RUNNING: the new incarnation replaces the
    // old one, whose work goes to recovery (the host verified the old lane empty).
    call(
        &ctl,
        &Request::LaneDestroy {
            lane: "lane-2".into(),
        },
    )
    .unwrap();
    let again = call(
        &ctl,
        &Request::LaneCreate {
            lane: "lane-2".into(),
        },
    )
    .unwrap();
    let inc2 = again["lane_incarnation_id"].as_str().unwrap().to_string();
    assert_ne!(inc2, inc);
    common::wait_until("recreated lane registered", || {
        (coordinator_incarnation(&lane)? == inc2).then_some(())
    });
    assert_eq!(w.lane_row(&lane).await.0, "IDLE_CLEAN");
    assert_eq!(w.count(&format!("SELECT count(*) FROM lane_incarnations WHERE lane_incarnation_id = '{inc}' AND retired_at IS NOT NULL")).await, 1);
    assert_eq!(w.assignment_row(&lane).await.unwrap().1, "RECOVERY");
    // All of it on the one session the supervisor opened.
    let log = std::fs::read_to_string(w.supervisor_log(0)).unwrap();
    assert_eq!(log.matches("coordinator link up").count(), 1, "{log}");
    w.usable(2).await;
}

/// §17 Continuation visibility fault and Stale continuation claimant: the coordinator is
/// killed before and after each commit of a continuation's claim, acceptance and result, and
/// before it sends the continuation; a restarted coordinator (a new epoch: every old claim is
/// stale) drives it on. Afterwards: accepted exactly once, the loop budget debited once, the
/// harness given it once (one result, no refused result), nothing left open.
#[tokio::test(flavor = "multi_thread")]
async fn a_continuation_is_accepted_exactly_once_whatever_the_coordinator_dies_at() {
    for point in [
        "after-commit:continuation-create",
        "after-commit:continuation-claim",
        "before-push:continuation",
        "before-commit:continuation-accept",
        "after-commit:continuation-accept",
        "before-commit:continuation-result",
        "after-commit:continuation-result",
    ] {
        let mut w = Split::new(1);
        let a = w.assign(1, "take-continuations").unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        w.crash_coordinator(0);
        w.start_coordinator(0, Some(&format!("{point}=return")));
        w.wait_leading(0);
        w.wait_host_connected();
        let (sock, req) = (
            w.socket(0),
            OperatorRequest::Continue {
                assignment_id: id.clone(),
                next_action: "run the integration tests".into(),
                within_ms: None,
                request_id: Some(format!("crash-{point}")),
            },
        );
        let asked = std::thread::spawn(move || operator_call(&sock, &req));
        w.wait_coordinator_died(0, point);
        let _ = asked.join();
        w.start_coordinator(0, None);
        w.wait_leading(0);
        w.wait_host_connected();
        // The operator's request may have died with the coordinator before it committed:
        // asking again with the same request id is safe (it lands on the same receipt).
        let again = w.op(&OperatorRequest::Continue {
            assignment_id: id.clone(),
            next_action: "run the integration tests".into(),
            within_ms: None,
            request_id: Some(format!("crash-{point}")),
        });
        assert!(
            again.is_ok()
                || again
                    .as_ref()
                    .is_err_and(|e| e.category == mosaic::coordinator::Category::Conflict),
            "{point}: {again:?}"
        );
        w.wait_count(
            &format!("SELECT count(*) FROM continuations WHERE assignment_id = '{id}' AND state = 'RESULT_RECORDED'"),
            |n| n == 1,
            &format!("{point}: the continuation's result"),
        )
        .await;
        let row = w
            .sql()
            .await
            .query_one(
                &format!(
                    "SELECT (SELECT count(*) FROM continuations WHERE assignment_id = '{id}'), \
                            (SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-accept' AND body->>'assignment_id' = '{id}'), \
                            (SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-result' AND body->>'assignment_id' = '{id}'), \
                            (SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{id}'), \
                            (SELECT count(*) FROM audit WHERE operation LIKE '%continuation-result%')"
                ),
                &[],
            )
            .await
            .unwrap();
        let got: (i64, i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        assert_eq!(
            got,
            (1, 1, 1, 19, 0),
            "{point}: (continuations, accepts, results, budget left, refused results)"
        );
        let st = w.op(&OperatorRequest::Status).unwrap();
        let me = st["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["assignment_id"] == id.as_str())
            .unwrap()
            .clone();
        assert_eq!(
            (
                me["state"].as_str(),
                me["lane_state"].as_str(),
                me["responsibility_owner"].as_str(),
                me["execution_owner"].as_str()
            ),
            (
                Some("ACTIVE"),
                Some("RUNNING"),
                Some(w.lane(1).as_str()),
                Some(w.lane(1).as_str())
            ),
            "{point}: the work keeps running with its owners"
        );
        w.stop_final(&id);
    }
}

/// §17 Continuation injection crash: the supervisor dies after a continuation was accepted
/// and handed to its harness. The restarted supervisor re-adopts the generation and serves its
/// lane socket again, but never shows a continuation another process accepted: it is not
/// accepted or debited again, nothing else is accepted while it is open, and it ends
/// abandoned, never re-injected.
#[tokio::test(flavor = "multi_thread")]
async fn a_supervisor_killed_before_delivery_never_delivers_a_continuation_late() {
    let mut w = Split::new(1);
    let a = w.assign(1, "take-continuations busy=30").unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    // The first continuation keeps the harness busy (unsettled) for 30 s.
    w.op(&OperatorRequest::Continue {
        assignment_id: id.clone(),
        next_action: "first".into(),
        within_ms: None,
        request_id: None,
    })
    .unwrap();
    w.wait_count(
        &format!("SELECT count(*) FROM continuations WHERE assignment_id = '{id}' AND state = 'DELIVERY_ACCEPTED'"),
        |n| n == 1,
        "the first continuation's acceptance",
    )
    .await;
    w.crash_supervisor();
    w.start_supervisor();
    w.wait_host_connected();
    // The accepted one's visibility is the harness's business now; it is never re-sent as
    // a new delivery, and nothing else can be accepted while it is open.
    let second = w.op(&OperatorRequest::Continue {
        assignment_id: id.clone(),
        next_action: "second".into(),
        within_ms: Some(2000),
        request_id: None,
    });
    assert_eq!(
        second.unwrap_err().category,
        mosaic::coordinator::Category::Conflict
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-accept' AND body->>'assignment_id' = '{id}'"
        ))
        .await,
        1
    );
    assert_eq!(
        w.count(&format!(
            "SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{id}'"
        ))
        .await,
        19
    );
    // Stopping the generation abandons the accepted continuation: never re-injected.
    w.stop_final(&id);
    assert_eq!(
        w.count(&format!("SELECT count(*) FROM continuations WHERE assignment_id = '{id}' AND state = 'ABANDONED'")).await,
        1
    );
}

/// §17 Nonterminal replacement crash and Prior-owner handoff effect under a coordinator
/// SIGKILL before and after the commit of a handoff's acceptance and of an inactivity
/// replacement: there is never more than one live (executing) generation of the work, and
/// afterwards never a lease on a lane the work left, and the work is either
/// running or in recovery — never lost, never doubled.
#[tokio::test(flavor = "multi_thread")]
async fn responsibility_survives_a_coordinator_killed_around_handoff_and_replacement() {
    for point in [
        "before-commit:handoff-accept",
        "after-commit:handoff-accept",
        "before-commit:inactivity-replace",
        "after-commit:inactivity-replace",
    ] {
        let mut w = Split::new(2);
        let replace = point.ends_with("inactivity-replace");
        w.crash_coordinator(0);
        w.start_coordinator(0, Some(&format!("{point}=return")));
        w.wait_leading(0);
        w.wait_host_connected();
        let policy = if replace {
            w.op(&OperatorRequest::PolicyPublish {
                policy: mosaic::coordinator::continuity::InactivityPolicy {
                    policy_id: "crash-fast@1".into(),
                    warn_after_ms: 300,
                    escalate_after_ms: 600,
                    replace_after_ms: 1000,
                    replacements_before_reassign: 1,
                    max_attempts: 3,
                    exhaustion: "blocked".into(),
                    evidence_kinds: vec!["test-result".into()],
                },
            })
            .unwrap();
            Some("crash-fast@1".to_string())
        } else {
            None
        };
        let mut req = assign_req(&w.lane(1), "hang", None);
        if let OperatorRequest::Assign {
            inactivity_policy, ..
        } = &mut req
        {
            *inactivity_policy = policy;
        }
        let a = w.op(&req).unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        if !replace {
            let (sock, req) = (
                w.socket(0),
                OperatorRequest::Handoff {
                    assignment_id: id.clone(),
                    lane_id: w.lane(2),
                    task: Some("accept-handoff hang".into()),
                    within_ms: None,
                    request_id: None,
                },
            );
            std::thread::spawn(move || operator_call(&sock, &req));
        }
        w.wait_coordinator_died(0, point);
        w.start_coordinator(0, None);
        w.wait_leading(0);
        w.wait_host_connected();
        // Settled: the work runs somewhere, or waits in recovery, with every stopped
        // generation's receipt in.
        let start = Instant::now();
        let (lifecycle, exec) = loop {
            let r = w
                .sql()
                .await
                .query_one(
                    &format!(
                        "SELECT a.lifecycle, a.execution_owner, \
                                (SELECT count(*) FROM reservations r JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id \
                                 AND g.generation = r.generation WHERE r.assignment_id = a.assignment_id AND g.state <> 'ENDED'), \
                                (SELECT count(*) FROM lane_incarnations li WHERE li.state NOT IN ('IDLE_CLEAN', 'RUNNING') AND li.retired_at IS NULL), \
                                (SELECT count(*) FROM reservations r JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id \
                                 AND g.generation = r.generation WHERE r.assignment_id = a.assignment_id AND g.state = 'LIVE') \
                         FROM assignments a WHERE a.assignment_id = '{id}'"
                    ),
                    &[],
                )
                .await
                .unwrap();
            let (lifecycle, exec, unended, busy, live): (String, Option<String>, i64, i64, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
            assert!(
                live <= 1,
                "{point}: two live (executing) generations of one assignment"
            );
            if busy == 0
                && ((lifecycle == "ACTIVE" && exec.is_some() && unended == 1)
                    || (lifecycle == "RECOVERY" && unended == 0))
            {
                break (lifecycle, exec);
            }
            assert!(
                start.elapsed() < common::PATIENCE,
                "{point}: never settled ({lifecycle}, {exec:?}, {unended}, {busy})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Owner counts: one responsible owner, at most one executing lane, and open leases
        // only on the lane that executes.
        let leases = w
            .sql()
            .await
            .query(
                &format!(
                    "SELECT DISTINCT li.lane_id FROM leases l JOIN lane_incarnations li USING (lane_incarnation_id) \
                     WHERE l.assignment_id = '{id}' AND l.released_at IS NULL"
                ),
                &[],
            )
            .await
            .unwrap();
        let leased: Vec<String> = leases.iter().map(|r| r.get(0)).collect();
        match (&lifecycle[..], &exec) {
            ("ACTIVE", Some(lane)) => assert_eq!(
                leased,
                vec![lane.clone()],
                "{point}: leases off the executing lane"
            ),
            _ => assert!(
                leased.is_empty(),
                "{point}: work in recovery holds leases {leased:?}"
            ),
        }
        assert_eq!(
            w.count(&format!("SELECT count(*) FROM handoffs WHERE assignment_id = '{id}' AND state IN ('OFFERED', 'CHALLENGED')")).await,
            0,
            "{point}: an offer left open"
        );
        if lifecycle == "ACTIVE" {
            w.stop_final(&id);
        }
    }
}

/// A restarted supervisor serves the lane sockets of its activated, re-adopted generations
/// again: their harnesses go on reporting progress (no inactivity replacement) and taking
/// continuations; nothing is run twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_supervisor_serves_its_running_harnesses_again() {
    let mut w = Split::new(2);
    w.op(&OperatorRequest::PolicyPublish {
        policy: mosaic::coordinator::continuity::InactivityPolicy {
            policy_id: "restart-fast@1".into(),
            warn_after_ms: 600,
            escalate_after_ms: 1200,
            replace_after_ms: 2000,
            replacements_before_reassign: 1,
            max_attempts: 3,
            exhaustion: "blocked".into(),
            evidence_kinds: vec!["test-result".into()],
        },
    })
    .unwrap();
    let mut req = assign_req(&w.lane(1), "progress-every=0.3", None);
    if let OperatorRequest::Assign {
        inactivity_policy, ..
    } = &mut req
    {
        *inactivity_policy = Some("restart-fast@1".into());
    }
    let a = w.op(&req).unwrap();
    let reporting = a["assignment_id"].as_str().unwrap().to_string();
    let b = w.assign(2, "take-continuations").unwrap();
    let taking = b["assignment_id"].as_str().unwrap().to_string();
    let progress =
        |id: &str| format!("SELECT count(*) FROM progress_receipts WHERE assignment_id = '{id}'");
    w.wait_count(
        &progress(&reporting),
        |n| n >= 2,
        "progress before the restart",
    )
    .await;
    w.crash_supervisor();
    w.start_supervisor();
    w.wait_host_connected();
    let before = w.count(&progress(&reporting)).await;
    // Longer than the policy's whole inactivity period.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(
        w.count(&progress(&reporting)).await > before,
        "the re-adopted harness's progress no longer reaches the coordinator"
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE assignment_id = '{reporting}' AND transition = 'inactivity-replace'"
        ))
        .await,
        0,
        "a reporting harness was replaced"
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM attempts WHERE assignment_id = '{reporting}'"
        ))
        .await,
        1
    );
    // The other harness takes a continuation through its re-served socket, once.
    w.op(&OperatorRequest::Continue {
        assignment_id: taking.clone(),
        next_action: "after the restart".into(),
        within_ms: None,
        request_id: None,
    })
    .unwrap();
    w.wait_count(
        &format!("SELECT count(*) FROM continuations WHERE assignment_id = '{taking}' AND state = 'RESULT_RECORDED'"),
        |n| n == 1,
        "a continuation through the re-served socket",
    )
    .await;
    w.stop_final(&reporting);
    w.stop_final(&taking);
}
