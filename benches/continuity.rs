//! Continuity benchmark, on a durable (fsync on) PostgreSQL, each figure beside its anchor
//! from the same run and server:
//!
//! - a validated progress receipt → `last_progress_at` committed, p50/p99 (one worker per
//!   lane) — beside pgbench simple-update's latency with the same client count;
//! - continuations per second, create → claim → accept → result (one lane per worker) —
//!   beside pgbench simple-update's transactions per second;
//! - the watchdog's scan (`due_work`) over 10 000 active assignments, none due and all due —
//!   beside a bare `SELECT count(*)` of those assignments.
//!
//! Prints; asserts nothing about speed. `cargo bench --bench continuity` (as root).

use std::process::Command;
use std::time::{Duration, Instant};

use mosaic::coordinator::continuity::ProgressClaim;
use mosaic::coordinator::{
    AckClaim, Activation, Candidate, Chain, CoordinatorSecret, Leader, ReserveRequest, Store,
};
use mosaic::pgcluster::{Cluster, Durability};
use serde_json::json;

const WORKERS: usize = 8;
const PROGRESS_PER_WORKER: usize = 100;
const CONTINUATIONS_PER_WORKER: usize = 50;
const SCAN_ROWS: i64 = 10_000;

fn d(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn k(t: &str) -> String {
    format!("{t}-{}", uuid::Uuid::new_v4().simple())
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

/// A chain driven to RUNNING; returns it and its generation.
async fn running(s: &Store, l: &Leader, inc: &str, lane: &str) -> (Chain, i64) {
    let req = ReserveRequest {
        request_id: k("rq"),
        lane_incarnation_id: inc.into(),
        assignment_id: None,
        target: lane.into(),
        runtime_id: "fake@1.0.0".into(),
        task_text: "hang".into(),
        scope: vec![format!("lane:{lane}")],
        holds: vec![],
        completion_policy: "operator-evidence/v1".into(),
        inactivity_policy: "default@1".into(),
        ttl_ms: 600_000,
        repository: None,
        grant: None,
        placement: None,
        recovery: None,
    };
    let res = s.reserve(l, &req).await.unwrap();
    let c = res.chain.clone();
    s.checkpoint(l, &c).await.unwrap();
    s.fence(l, &c).await.unwrap();
    let (g, _) = s.stage(l, &c).await.unwrap();
    let id = json!({ "boot_id": "b", "cgroup_id": 1, "cgroup_path": "/x", "exe_dev": 1, "exe_ino": 1,
                     "launch_nonce_digest": "ab".repeat(32), "root_pid": g, "root_start_time": g });
    let staged = s.record_staged(l, &c, g, &id, None).await.unwrap();
    let cd = staged.str("contracts_digest").unwrap();
    let (ch, _, _) = s.record_injected(l, &c, &cd, &id, 600_000).await.unwrap();
    s.consume_ack(
        l,
        &AckClaim {
            challenge_id: ch,
            sot_incarnation: l.sot().into(),
            coordinator_epoch: l.epoch(),
            reservation_id: c.reservation_id.clone(),
            reservation_epoch: c.reservation_epoch,
            reservation_deadline: res.deadline.clone(),
            lane_id: c.lane_id.clone(),
            lane_incarnation_id: c.lane_incarnation_id.clone(),
            assignment_id: c.assignment_id.clone(),
            assignment_attempt_id: c.assignment_attempt_id.clone(),
            generation: g,
            process_identity: id,
            contracts_digest: cd,
            scope_digest: req.scope_digest(),
            holds_digest: req.holds_digest(),
            runtime_id: "fake@1.0.0".into(),
            ack_digest: d('a'),
        },
    )
    .await
    .unwrap();
    let row = s
        .chain_by_reservation(&c.reservation_id)
        .await
        .unwrap()
        .unwrap();
    s.activate(l, &Activation::of(s, &row, 600_000).unwrap())
        .await
        .unwrap();
    (c, g)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir =
        std::env::temp_dir().join(format!("mosaic-bench-pg-{}", uuid::Uuid::new_v4().simple()));
    let cluster = Cluster::at(&dir).expect("PostgreSQL server binaries");
    cluster.init().expect("initdb");
    cluster.start(Durability::Durable).expect("start");
    let result = {
        use futures_util::FutureExt;
        std::panic::AssertUnwindSafe(run(&cluster))
            .catch_unwind()
            .await
    };
    let _ = cluster.stop();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

async fn run(cluster: &Cluster) {
    cluster.psql("postgres", "CREATE DATABASE mosaic").unwrap();
    cluster.psql("postgres", "CREATE DATABASE pgbench").unwrap();
    let store = Store::connect(
        &cluster.url("mosaic"),
        CoordinatorSecret::generate().unwrap(),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    let (leader, _) = store
        .acquire(
            &Candidate {
                holder: "coordinator:bench".into(),
                credential_digest: d('c'),
                launch_id: k("launch"),
            },
            600_000,
        )
        .await
        .unwrap();
    let (admin, conn) = tokio_postgres::connect(&cluster.url("mosaic"), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut chains = Vec::new();
    for i in 0..WORKERS {
        let lane = format!("bench:w{i}");
        let inc = store
            .adopt_lane_incarnation(&leader, "bench", &lane, &k("li"))
            .await
            .unwrap()
            .lane_incarnation_id;
        chains.push(running(&store, &leader, &inc, &lane).await);
    }
    // The benchmark's own budget (outside any transition: triggers off for this session).
    admin
        .batch_execute("SET session_replication_role = replica; UPDATE assignments SET continuation_budget = 100000; SET session_replication_role = origin")
        .await
        .unwrap();
    println!(
        "Mosaic continuity benchmark — PostgreSQL with fsync on, {WORKERS} lanes, one worker each"
    );

    // 1. Progress receipts.
    let mut tasks = Vec::new();
    for (c, g) in chains.clone() {
        let (s, l) = (store.clone(), leader.clone());
        tasks.push(tokio::spawn(async move {
            let mut t = Vec::new();
            for n in 0..PROGRESS_PER_WORKER {
                let claim = ProgressClaim {
                    chain: c.clone(),
                    generation: g,
                    evidence_kind: "test-result".into(),
                    evidence_digest: mosaic::protocol::work::evidence_digest(
                        "test-result",
                        format!("{} report {n}", c.reservation_id).as_bytes(),
                    ),
                    next_action: None,
                    message_id: k("m"),
                };
                let t0 = Instant::now();
                s.record_progress(&l, &claim).await.unwrap();
                t.push(t0.elapsed());
            }
            t
        }));
    }
    let mut progress = Vec::new();
    for t in tasks {
        progress.extend(t.await.unwrap());
    }

    // 2. Continuations, create → claim → accept → result.
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (c, g) in chains.clone() {
        let (s, l) = (store.clone(), leader.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0..CONTINUATIONS_PER_WORKER {
                let next = format!("step {n}");
                let r = s
                    .create_continuation(&l, &c.assignment_id, &next, &k("rq"), 600_000)
                    .await
                    .unwrap();
                let id = r.str("continuation_id").unwrap();
                let v = s
                    .open_continuations()
                    .await
                    .unwrap()
                    .into_iter()
                    .find(|v| v.continuation_id == id)
                    .unwrap();
                let claim = s.claim_continuation(&l, &v).await.unwrap();
                s.accept_continuation(
                    &l,
                    &mosaic::coordinator::continuation::AcceptClaim {
                        continuation_id: id.clone(),
                        claim_ref: claim.str("claim_ref").unwrap(),
                        reservation_id: c.reservation_id.clone(),
                        lane_incarnation_id: c.lane_incarnation_id.clone(),
                        generation: g,
                        next_action_digest: mosaic::protocol::work::next_action_digest(&next),
                    },
                )
                .await
                .unwrap();
                s.record_continuation_result(&l, &id, &c.lane_incarnation_id, g, &d('e'))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let cont_secs = t0.elapsed().as_secs_f64();
    let continuations = (WORKERS * CONTINUATIONS_PER_WORKER) as f64;

    // 3. The watchdog's scan over 10 000 active assignments (rows written directly, outside
    //    any transition, to size the table; the scan is the code under test).
    admin
        .batch_execute(&format!(
            "SET session_replication_role = replica; \
             INSERT INTO lanes (lane_id, host_id) SELECT 'scan:w' || i, 'scan' FROM generate_series(1, {SCAN_ROWS}) i; \
             INSERT INTO lane_incarnations (lane_incarnation_id, lane_id, state, created_epoch) \
               SELECT 'li-scan-' || i, 'scan:w' || i, 'RUNNING', 1 FROM generate_series(1, {SCAN_ROWS}) i; \
             INSERT INTO assignments (assignment_id, lane_incarnation_id, responsibility_owner, execution_owner, next_action, runtime_id, \
                                      scope_digest, holds_digest, completion_policy_digest, created_epoch, inactivity_policy, \
                                      inactivity_policy_digest, inactivity_base_at, inactivity_deadline) \
               SELECT 'as-scan-' || i, 'li-scan-' || i, 'scan:w' || i, 'scan:w' || i, 'run', 'fake@1.0.0', '{d}', '{d}', '{d}', 1, \
                      'default@1', (SELECT digest FROM inactivity_policies WHERE policy_id = 'default@1'), \
                      clock_timestamp(), clock_timestamp() + interval '30 minutes' \
               FROM generate_series(1, {SCAN_ROWS}) i; \
             SET session_replication_role = origin; ANALYZE",
            d = d('0')
        ))
        .await
        .unwrap();
    let scan = |rounds: usize| {
        let store = store.clone();
        async move {
            let mut t = Vec::new();
            let mut n = 0;
            for _ in 0..rounds {
                let t0 = Instant::now();
                n = store.due_work().await.unwrap().len();
                t.push(t0.elapsed());
            }
            (t, n)
        }
    };
    let (mut none_due, n0) = scan(30).await;
    admin
        .batch_execute("SET session_replication_role = replica; \
                        UPDATE assignments SET inactivity_base_at = clock_timestamp() - interval '15 minutes' WHERE assignment_id LIKE 'as-scan-%'; \
                        SET session_replication_role = origin; ANALYZE")
        .await
        .unwrap();
    let (mut all_due, n1) = scan(30).await;
    let mut bare = Vec::new();
    for _ in 0..30 {
        let t0 = Instant::now();
        let _: i64 = admin
            .query_one(
                "SELECT count(*) FROM assignments WHERE work_status = 'active'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        bare.push(t0.elapsed());
    }

    // The anchor: pgbench simple-update on the same server, same client count.
    let (tps, lat) = pgbench(cluster, WORKERS);
    println!();
    println!(
        "  progress receipt → last_progress_at committed (n={}): p50 {:.2} / p99 {:.2} ms   | pgbench simple-update latency ({WORKERS} clients): {lat:.2} ms avg — {:.1}×",
        progress.len(),
        pct(&mut progress, 0.5),
        pct(&mut progress, 0.99),
        pct(&mut progress.clone(), 0.5) / lat
    );
    println!(
        "  continuations create → claim → accept → result: {:.1}/s ({:.0} transitions/s)   | pgbench simple-update: {tps:.0} tps — transitions/s are {:.0}%",
        continuations / cont_secs,
        4.0 * continuations / cont_secs,
        100.0 * 4.0 * continuations / cont_secs / tps
    );
    println!(
        "  watchdog scan over {SCAN_ROWS} active assignments: none due ({n0} rows) p50 {:.2} / p99 {:.2} ms; all past warning ({n1} rows) p50 {:.2} / p99 {:.2} ms   | bare SELECT count(*): p50 {:.2} ms",
        pct(&mut none_due, 0.5),
        pct(&mut none_due, 0.99),
        pct(&mut all_due, 0.5),
        pct(&mut all_due, 0.99),
        pct(&mut bare, 0.5)
    );
}

/// pgbench simple-update for 15 s: (tps, average latency ms).
fn pgbench(cluster: &Cluster, clients: usize) -> (f64, f64) {
    let mut init = Command::new(cluster.bin("pgbench"));
    init.args(["-i", "-q", "-s", "4", "-d", &cluster.url("pgbench")]);
    as_postgres(&mut init);
    assert!(init.output().unwrap().status.success());
    let mut b = Command::new(cluster.bin("pgbench"));
    b.args([
        "-b",
        "simple-update",
        "-c",
        &clients.to_string(),
        "-j",
        "2",
        "-T",
        "15",
        "-n",
        "-d",
        &cluster.url("pgbench"),
    ]);
    as_postgres(&mut b);
    let out = String::from_utf8_lossy(&b.output().unwrap().stdout).into_owned();
    let num = |prefix: &str| -> f64 {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split('=').nth(1))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    (num("tps"), num("latency average"))
}

fn as_postgres(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    if nix::unistd::geteuid().is_root() {
        if let Ok(Some(u)) = nix::unistd::User::from_name("postgres") {
            c.uid(u.uid.as_raw()).gid(u.gid.as_raw());
        }
    }
}
