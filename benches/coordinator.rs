//! Coordinator benchmark: full activation chains per second on a durable (fsync on)
//! PostgreSQL, per-transition latency p50/p99, effect claims admitted (and their results
//! recorded) per second on RUNNING chains, and — same run, same server — pgbench's built-in
//! simple-update TPS as the ceiling. Prints; asserts nothing about speed.
//!
//! `cargo bench --bench coordinator` (as root: the cluster runs as `postgres`).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use mosaic::coordinator::{
    AckClaim, Activation, Candidate, CoordinatorSecret, Leader, Outcome, ReserveRequest, Store,
};
use mosaic::pgcluster::{Cluster, Durability};
use serde_json::json;

const WORKERS: usize = 8;
const CHAINS_PER_WORKER: usize = 100;
const CLAIMS_PER_WORKER: usize = 250;

fn d(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn k(t: &str) -> String {
    format!("{t}-{}", uuid::Uuid::new_v4().simple())
}

type Times = BTreeMap<&'static str, Vec<Duration>>;

macro_rules! timed {
    ($times:expr, $name:literal, $e:expr) => {{
        let t = Instant::now();
        let v = $e;
        $times.entry($name).or_default().push(t.elapsed());
        v
    }};
}

/// A chain driven to RUNNING: its ids, generation, process identity and digests.
struct Running {
    chain: mosaic::coordinator::Chain,
    generation: i64,
    identity: serde_json::Value,
    scope_digest: String,
    holds_digest: String,
}

async fn chain(s: &Store, l: &Leader, inc: &str, lane: &str, n: usize, times: &mut Times) {
    let r = to_running(s, l, inc, lane, n, times).await;
    let (c, g) = (r.chain, r.generation);
    timed!(
        times,
        "request-end",
        s.request_end(l, &c.assignment_id, Outcome::Cancelled, None)
            .await
            .unwrap()
    );
    let key =
        mosaic::supervisor::receipt::idempotency_key(&c.lane_id, &c.lane_incarnation_id, g as u64);
    let receipt = json!({ "idempotency_key": key, "host_id": "bench", "lane_id": c.lane_id, "lane_incarnation_id": c.lane_incarnation_id,
                          "generation": g, "termination_reason": "quit", "cleanup": { "verified_empty": true } });
    timed!(
        times,
        "ingest-termination",
        s.ingest_termination(l, "bench", &receipt).await.unwrap()
    );
    timed!(times, "finish", s.finish(l, inc).await.unwrap());
}

/// Claims of one RUNNING chain, one after another, each with its result recorded.
async fn claims(s: &Store, l: &Leader, r: &Running, times: &mut Times) {
    use mosaic::coordinator::effects::{EffectClaim, Observed};
    use mosaic::protocol::effects::{operation_digest, Outcome as Seen, Target};
    for i in 0..CLAIMS_PER_WORKER {
        let x = EffectClaim {
            chain: r.chain.clone(),
            generation: r.generation,
            target: Target::Provider,
            idempotency_key: k("gw"),
            operation_digest: operation_digest(&Target::Provider, &[i.to_string().as_bytes()]),
            responsibility_owner: r.chain.lane_id.clone(),
            execution_owner: r.chain.lane_id.clone(),
            process_identity: r.identity.clone(),
            fence_reference: "fp1:bench".into(),
            scope_digest: r.scope_digest.clone(),
            holds_digest: r.holds_digest.clone(),
        };
        let a = timed!(times, "admit-effect", s.admit_effect(l, &x).await.unwrap());
        let o = Observed {
            effect_id: a.effect_id,
            outcome: Seen::Completed,
            result_digest: d('7'),
            input_tokens: Some(10),
            output_tokens: Some(5),
        };
        timed!(
            times,
            "effect-result",
            s.record_effect_result(l, &r.chain, r.generation, &o)
                .await
                .unwrap()
        );
    }
}

/// A new assignment's reservation of `lane` (incarnation `inc`), for the fake harness.
fn request(lane: &str, inc: &str) -> ReserveRequest {
    ReserveRequest {
        request_id: k("rq"),
        lane_incarnation_id: inc.into(),
        assignment_id: None,
        target: lane.into(),
        runtime_id: "fake@1.0.0".into(),
        task_text: "hang".into(),
        scope: vec![format!("lane:{lane}"), "provider".into()],
        holds: vec![],
        completion_policy: "operator-evidence/v1".into(),
        inactivity_policy: "default@1".into(),
        ttl_ms: 600_000,
        repository: None,
        grant: None,
        placement: None,
        recovery: None,
    }
}

async fn to_running(
    s: &Store,
    l: &Leader,
    inc: &str,
    lane: &str,
    n: usize,
    times: &mut Times,
) -> Running {
    let req = request(lane, inc);
    let res = timed!(times, "reserve", s.reserve(l, &req).await.unwrap());
    let c = res.chain.clone();
    timed!(times, "checkpoint", s.checkpoint(l, &c).await.unwrap());
    timed!(times, "fence", s.fence(l, &c).await.unwrap());
    let (g, _) = timed!(times, "stage", s.stage(l, &c).await.unwrap());
    let id = json!({ "boot_id": "b", "cgroup_id": 1, "cgroup_path": "/x", "exe_dev": 1, "exe_ino": 1, "launch_nonce_digest": "ab".repeat(32), "root_pid": n, "root_start_time": n });
    let staged = timed!(
        times,
        "staged",
        s.record_staged(l, &c, g, &id, None).await.unwrap()
    );
    let cd = staged.str("contracts_digest").unwrap();
    let (ch, _, _) = timed!(
        times,
        "injected",
        s.record_injected(l, &c, &cd, &id, 600_000).await.unwrap()
    );
    timed!(
        times,
        "consume-ack",
        s.consume_ack(
            l,
            &AckClaim {
                challenge_id: ch.clone(),
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
                process_identity: id.clone(),
                contracts_digest: cd.clone(),
                scope_digest: req.scope_digest(),
                holds_digest: req.holds_digest(),
                runtime_id: "fake@1.0.0".into(),
                ack_digest: d('a'),
            }
        )
        .await
        .unwrap()
    );
    // What the driver does: the chain's own rows give the activation (and the fence token
    // re-derived from the secret).
    let row = s
        .chain_by_reservation(&c.reservation_id)
        .await
        .unwrap()
        .unwrap();
    let x = Activation::of(s, &row, 600_000).unwrap();
    timed!(times, "activate", s.activate(l, &x).await.unwrap());
    Running {
        chain: c,
        generation: g,
        identity: id,
        scope_digest: req.scope_digest(),
        holds_digest: req.holds_digest(),
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

/// CPU time (ms) a process and its reaped children have used (`/proc/PID/stat`).
fn proc_cpu_ms(pid: &str) -> f64 {
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // After the command's closing parenthesis: state is field 3, utime 14 … cstime 17.
    let rest = st.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    if f.len() < 15 {
        return 0.0;
    }
    (f[11] + f[12] + f[13] + f[14]) * 1000.0 / tick
}

/// CPU time (ms) of this process's waited-for children (pgbench).
fn children_cpu_ms() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1000.0 + t.tv_usec() as f64 / 1000.0;
    ms(u.user_time()) + ms(u.system_time())
}

/// CPU time (ms) used so far by this benchmark's own process (the coordinator's store and
/// its workers) and by PostgreSQL (the postmaster, its live backends and every backend it
/// has reaped).
fn cpu_split(cluster: &Cluster) -> (f64, f64) {
    let me = proc_cpu_ms("self");
    let Some(pm) = std::fs::read_to_string(cluster.data_dir().join("postmaster.pid"))
        .ok()
        .and_then(|t| t.lines().next().map(str::to_string))
    else {
        return (me, 0.0);
    };
    let mut pg = proc_cpu_ms(&pm);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|st| {
                st.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().nth(1).map(str::to_string))
            });
        if ppid.as_deref() == Some(pm.as_str()) {
            pg += proc_cpu_ms(&pid);
        }
    }
    (me, pg)
}

/// `MOSAIC_BENCH_STATEMENTS=N`: load pg_stat_statements (nested statements too, so
/// triggers show) and print the N statements that took the most server time during the
/// full chains. Off by default: the headline figures run without it.
fn statements_wanted() -> Option<i64> {
    std::env::var("MOSAIC_BENCH_STATEMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
}

async fn pg_client(cluster: &Cluster, db: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(&cluster.url(db), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir =
        std::env::temp_dir().join(format!("mosaic-bench-pg-{}", uuid::Uuid::new_v4().simple()));
    let cluster = Cluster::at(&dir).expect("PostgreSQL server binaries");
    cluster.init().expect("initdb");
    if statements_wanted().is_some() {
        use std::io::Write;
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(cluster.data_dir().join("postgresql.auto.conf"))
            .unwrap();
        writeln!(conf, "shared_preload_libraries = 'pg_stat_statements'").unwrap();
        writeln!(conf, "pg_stat_statements.track = all").unwrap();
    }
    cluster.start(Durability::Durable).expect("start");
    let result = std::panic::AssertUnwindSafe(run(&cluster))
        .catch_unwind_compat()
        .await;
    let _ = cluster.stop();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

trait CatchUnwindCompat: std::future::Future + Sized {
    async fn catch_unwind_compat(self) -> std::thread::Result<Self::Output>;
}
impl<F: std::future::Future + std::panic::UnwindSafe> CatchUnwindCompat for F {
    async fn catch_unwind_compat(self) -> std::thread::Result<Self::Output> {
        use futures_util::FutureExt;
        self.catch_unwind().await
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
    let mut lanes = Vec::new();
    let mut lanes2 = Vec::new();
    for i in 0..WORKERS {
        for (set, tag) in [(&mut lanes, "w"), (&mut lanes2, "e")] {
            let lane = format!("bench:{tag}{i}");
            let inc = store
                .adopt_lane_incarnation(&leader, "bench", &lane, &k("li"))
                .await
                .unwrap()
                .lane_incarnation_id;
            set.push((lane, inc));
        }
    }
    println!("Mosaic coordinator benchmark — PostgreSQL {} with fsync on, {WORKERS} concurrent workers, {} chains", pg_version(cluster), WORKERS * CHAINS_PER_WORKER);
    let top = statements_wanted();
    if top.is_some() {
        let c = pg_client(cluster, "mosaic").await;
        c.batch_execute(
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()",
        )
        .await
        .unwrap();
    }
    let cpu0 = cpu_split(cluster);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (lane, inc) in lanes {
        let (s, l) = (store.clone(), leader.clone());
        tasks.push(tokio::spawn(async move {
            let mut times = Times::new();
            for n in 0..CHAINS_PER_WORKER {
                chain(&s, &l, &inc, &lane, n, &mut times).await;
            }
            times
        }));
    }
    let mut all = Times::new();
    for t in tasks {
        for (k, v) in t.await.unwrap() {
            all.entry(k).or_default().extend(v);
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu1 = cpu_split(cluster);
    let chains = (WORKERS * CHAINS_PER_WORKER) as f64;
    let transitions: usize = all.values().map(Vec::len).sum();
    println!();
    println!("  full chains (reserve → … → RUNNING → DRAINING → RETIRING → IDLE_CLEAN, {} transitions each): {:.1} chains/s, {:.0} authority transitions/s", transitions / (WORKERS * CHAINS_PER_WORKER), chains / elapsed, transitions as f64 / elapsed);
    let per = |a: f64, b: f64| (b - a) / transitions as f64;
    println!(
        "  CPU per transition: {:.2} ms in PostgreSQL, {:.2} ms in the coordinator's store (this process); {:.0}% of the machine's {} cores busy with them",
        per(cpu0.1, cpu1.1),
        per(cpu0.0, cpu1.0),
        100.0 * ((cpu1.0 - cpu0.0) + (cpu1.1 - cpu0.1)) / 1000.0
            / elapsed
            / std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if let Some(n) = top {
        let c = pg_client(cluster, "mosaic").await;
        let rows = c
            .query(
                "SELECT s.calls, s.total_exec_time, s.rows, s.toplevel, \
                        left(regexp_replace(s.query, '\\s+', ' ', 'g'), 150) AS q \
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                 WHERE d.datname = 'mosaic' ORDER BY s.total_exec_time DESC LIMIT $1",
                &[&n],
            )
            .await
            .unwrap();
        let executing: f64 = c
            .query_one(
                "SELECT coalesce(sum(s.total_exec_time), 0) AS t FROM pg_stat_statements s \
                 JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = 'mosaic' AND s.toplevel",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        println!(
            "  executing the statements (top-level, triggers within): {:.3} ms of server time per transition",
            executing / transitions as f64
        );
        println!();
        println!(
            "  server time by statement (pg_stat_statements, nested included; ms per transition):"
        );
        for r in rows {
            let (calls, total, top): (i64, f64, bool) = (r.get(0), r.get(1), r.get(3));
            println!(
                "  {:>7.3} {:>7} calls {} {}",
                total / transitions as f64,
                calls,
                if top { " " } else { "+" },
                r.get::<_, String>(4)
            );
        }
    }
    println!();
    println!("  {:<20} {:>9} {:>9}", "transition", "p50 ms", "p99 ms");
    for (name, mut v) in all {
        println!(
            "  {:<20} {:>9.2} {:>9.2}",
            name,
            pct(&mut v, 0.5),
            pct(&mut v, 0.99)
        );
    }
    // Effect claims: one RUNNING chain per worker, each admitting claims one after another
    // and recording each one's result (what a broker does for every provider request).
    let mut tasks = Vec::new();
    for (i, (lane, inc)) in lanes2.into_iter().enumerate() {
        let (s, l) = (store.clone(), leader.clone());
        tasks.push(tokio::spawn(async move {
            let mut setup = Times::new();
            let r = to_running(&s, &l, &inc, &lane, 100_000 + i, &mut setup).await;
            let mut times = Times::new();
            let t = Instant::now();
            claims(&s, &l, &r, &mut times).await;
            (times, t.elapsed())
        }));
    }
    let mut claim_times = Times::new();
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let (times, took) = t.await.unwrap();
        slowest = slowest.max(took);
        for (k, v) in times {
            claim_times.entry(k).or_default().extend(v);
        }
    }
    let admitted = (WORKERS * CLAIMS_PER_WORKER) as f64;
    let claims_per_s = admitted / slowest.as_secs_f64();
    println!();
    println!(
        "  effect claims ({WORKERS} RUNNING chains, {CLAIMS_PER_WORKER} each; admit, then record its result): {claims_per_s:.0} claims/s, {:.0} transitions/s",
        2.0 * claims_per_s
    );
    for (name, mut v) in claim_times {
        println!(
            "  {:<20} {:>9.2} {:>9.2}",
            name,
            pct(&mut v, 0.5),
            pct(&mut v, 0.99)
        );
    }
    placement(&store, &leader).await;
    // The ceiling: pgbench's simple-update on the same server, same concurrency.
    let mut init = Command::new(cluster.bin("pgbench"));
    init.args(["-i", "-q", "-s", "4", "-d", &cluster.url("pgbench")]);
    run_as_postgres(&mut init);
    assert!(init.output().unwrap().status.success());
    let mut b = Command::new(cluster.bin("pgbench"));
    b.args([
        "-b",
        "simple-update",
        "-c",
        &WORKERS.to_string(),
        "-j",
        "2",
        "-T",
        "15",
        "-n",
        "-d",
        &cluster.url("pgbench"),
    ]);
    run_as_postgres(&mut b);
    let (pg0, pgbench0) = (cpu_split(cluster).1, children_cpu_ms());
    let out = b.output().unwrap();
    let (pg1, pgbench1) = (cpu_split(cluster).1, children_cpu_ms());
    let text = String::from_utf8_lossy(&out.stdout);
    let processed: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split('/').next()?.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps"))
        .unwrap_or("tps = ?")
        .to_string();
    let tps_num: f64 = tps
        .split_whitespace()
        .nth(2)
        .and_then(|x| x.parse().ok())
        .unwrap_or(f64::NAN);
    println!();
    println!("  pgbench simple-update ({WORKERS} clients, 15 s): {tps}");
    println!(
        "  CPU per pgbench transaction: {:.2} ms in PostgreSQL, {:.2} ms in pgbench; a transition's PostgreSQL CPU is {:.1}× it",
        (pg1 - pg0) / processed,
        (pgbench1 - pgbench0) / processed,
        (cpu1.1 - cpu0.1) / transitions as f64 / ((pg1 - pg0) / processed)
    );
    let ours = transitions as f64 / elapsed;
    println!(
        "  ratio: authority transitions/s are {:.0}% of pgbench simple-update tps (one transition ≈ {:.2} simple-update transactions)",
        100.0 * ours / tps_num,
        tps_num / ours
    );
    println!(
        "  ratio: effect claims admitted/s are {:.0}% of pgbench simple-update tps (with each result recorded: {:.0}% in transitions)",
        100.0 * claims_per_s / tps_num,
        200.0 * claims_per_s / tps_num
    );
}

fn run_as_postgres(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    if nix::unistd::geteuid().is_root() {
        if let Ok(Some(u)) = nix::unistd::User::from_name("postgres") {
            c.uid(u.uid.as_raw()).gid(u.gid.as_raw());
        }
    }
}

fn pg_version(c: &Cluster) -> String {
    Command::new(c.bin("postgres"))
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .replace("postgres (PostgreSQL) ", "")
        })
        .unwrap_or_default()
}

const PLACEMENT_RUNS: usize = 200;

/// What placement adds to a reservation, on the store alone (no host, no session: the
/// noise of a generation start is not in it): a roster of 16 lanes on 4 hosts, one worker,
/// `reserve` of a named lane interleaved with a placed one (the pipelined reads of the
/// roster, the lanes and any earlier placement, the decision and its digest, the reserve
/// with its placement row), each chain ended before the next (not timed).
async fn placement(s: &Store, l: &Leader) {
    use mosaic::coordinator::placement::{Decision, PlacementAsk, Roster};
    let mut roster = String::new();
    let mut lanes = Vec::new();
    for h in 1..=4 {
        let host = format!("pl{h}");
        s.record_host(&host, &["fake@1.0.0".to_string()])
            .await
            .unwrap();
        roster.push_str(&format!("[[hosts]]\nhost_id = \"{host}\"\ncapacity = 4\n"));
        for n in 1..=4 {
            let lane = format!("{host}:lane-{n}");
            let inc = s
                .adopt_lane_incarnation(l, &host, &lane, &k("li"))
                .await
                .unwrap()
                .lane_incarnation_id;
            roster.push_str(&format!(
                "[[hosts.lanes]]\nlane = \"lane-{n}\"\nruntimes = [\"fake\"]\nlabels = {{ zone = \"a\" }}\n"
            ));
            lanes.push((lane, inc));
        }
    }
    let roster: Roster = toml::from_str(&roster).unwrap();
    s.publish_roster(l, &roster).await.unwrap();
    let ask = PlacementAsk {
        labels: [("zone".to_string(), "a".to_string())].into(),
        role: None,
        elastic: None,
    };
    let (mut named, mut placed) = (Vec::new(), Vec::new());
    let (mut reads, mut decide) = (Vec::new(), Vec::new());
    for i in 0..PLACEMENT_RUNS * 2 {
        let t = Instant::now();
        let res = if i % 2 == 0 {
            let (lane, inc) = &lanes[(i / 2) % lanes.len()];
            let r = s.reserve(l, &request(lane, inc)).await.unwrap();
            named.push(t.elapsed());
            r
        } else {
            let mut req = request("", "");
            let ctx = s
                .placement_context(
                    &format!("reserve/{}", req.request_id),
                    &req.runtime_id,
                    &ask,
                    |_| true,
                )
                .await
                .unwrap();
            reads.push(t.elapsed());
            let t2 = Instant::now();
            let d = Decision::decide(ctx.unwrap_err()).unwrap();
            decide.push(t2.elapsed());
            req.target = d.lane_id.clone();
            req.lane_incarnation_id = d.lane_incarnation_id.clone();
            req.scope = vec![format!("lane:{}", d.lane_id), "provider".into()];
            req.placement = Some(d);
            let r = s.reserve(l, &req).await.unwrap();
            placed.push(t.elapsed());
            r
        };
        s.end_chain(l, &res.chain, mosaic::coordinator::EndCause::Abandoned)
            .await
            .unwrap();
    }
    let (n50, p50) = (pct(&mut named, 0.5), pct(&mut placed, 0.5));
    println!();
    println!("  placement ({PLACEMENT_RUNS} each, interleaved, one worker, roster of 16 lanes on 4 hosts): reserve of a named lane against placed");
    println!(
        "      --lane  p50 {n50:6.2} ms  p99 {:6.2} ms",
        pct(&mut named, 0.99)
    );
    println!(
        "      placed  p50 {p50:6.2} ms  p99 {:6.2} ms   placement adds {:+.2} ms at p50 ({:.2}×)",
        pct(&mut placed, 0.99),
        p50 - n50,
        p50 / n50
    );
    println!(
        "      of which: the reads p50 {:6.2} ms, the decision and its digest p50 {:6.3} ms",
        pct(&mut reads, 0.5),
        pct(&mut decide, 0.5)
    );
}
