//! One host and two coordinators on one database, short leases: the world of the fault
//! tests (coordinator killed at named points, standby takeover, supervisor killed).

#![allow(dead_code, unused_imports)]

pub use super::{Spec, World};
use crate::common;
pub use mosaic::coordinator::service::{operator_call, OpError, OperatorRequest};
pub use serde_json::Value;
pub use std::process::Command;
pub use std::time::{Duration, Instant};

/// Every transition of the chain, in order.
pub const CHAIN: [&str; 8] = [
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
pub const STOP: [&str; 3] = ["request-end", "ingest-termination", "finish"];

pub const LEASE_MS: i64 = 1000;

/// The world of these tests: one host (`lanes` lanes), two coordinators on one database
/// (the second stands by until started), short leases.
pub struct Split {
    pub w: World,
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

pub fn require_failpoints() {
    assert!(
        mosaic::coordinator::failpoint::enabled(),
        "the crash tests need a build with `--features failpoints` (scripts/test builds one)"
    );
}

impl Split {
    pub fn new(lanes: usize) -> Self {
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

    pub fn coord_pid(&self, i: usize) -> i32 {
        self.coordinator_pid(i)
    }

    /// Waits until the leading coordinator has the host's session (a standby answers
    /// `status` too, but holds no session).
    pub fn wait_host_connected(&self) {
        let me = format!("host:{}", self.hosts[0]);
        common::wait_until("host connected", || {
            (0..2).find_map(|i| {
                self.coord[i].running().then_some(())?;
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

    pub fn start_supervisor(&mut self) {
        self.w.start_supervisor(0);
        let sock = self.runtime_dir(0).join("control.sock");
        common::wait_until("supervisor up", || {
            mosaic::supervisor::control::call(&sock, &mosaic::supervisor::control::Request::Status)
                .ok()
        });
    }

    pub fn crash_supervisor(&mut self) {
        self.w.crash_supervisor(0);
    }

    pub fn host_status(&self) -> Value {
        mosaic::supervisor::control::call(
            &self.runtime_dir(0).join("control.sock"),
            &mosaic::supervisor::control::Request::Status,
        )
        .unwrap()
    }

    /// The host's live generation on lane `n`, if any.
    pub fn host_generation(&self, n: usize) -> Option<u64> {
        let st = self.host_status();
        st["lanes"]
            .as_array()?
            .iter()
            .find(|l| l["lane"] == format!("lane-{n}").as_str())?["generation"]["generation"]
            .as_u64()
    }

    pub fn lane(&self, n: usize) -> String {
        self.lane_of(0, &format!("lane-{n}"))
    }

    pub fn assign(&self, n: usize, task: &str) -> Result<Value, OpError> {
        self.op(&assign_req(&self.lane(n), task, None))
    }

    /// An assign in the background (it may be cut short by a crash).
    pub fn assign_async(
        &self,
        n: usize,
        task: &str,
    ) -> std::thread::JoinHandle<Result<Value, OpError>> {
        let (sock, req) = (self.socket(0), assign_req(&self.lane(n), task, None));
        std::thread::spawn(move || operator_call(&sock, &req))
    }

    pub fn stop(&self, assignment: &str) -> Result<Value, OpError> {
        self.op(&OperatorRequest::Stop {
            assignment_id: assignment.into(),
            outcome: None,
            evidence_digest: None,
            wait: true,
            request_id: None,
        })
    }

    /// A stop that must end in CANCELLED: answered at once, or `pending` until the host
    /// (re)connects and its receipt makes the outcome final.
    pub fn stop_final(&self, assignment: &str) -> Value {
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

    pub async fn lane_row(&self, lane: &str) -> (String, Option<i64>) {
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

    pub async fn assignment_row(
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
    pub fn wait_settled(&self, n: usize, what: &str) -> String {
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
    pub async fn invariants(&self) {
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
    pub async fn usable(&self, n: usize) {
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

/// A waited `assign` of the fake harness on `lane` (`super::assign_request`).
pub fn assign_req(lane: &str, task: &str, resume: Option<&str>) -> OperatorRequest {
    super::assign_request(lane, task, resume, true)
}
