//! Fleet benchmark on one machine: `mosaic up --hosts 4 --lanes 16` (four supervisor
//! processes, each its own host, against one coordinator on a private PostgreSQL with
//! fsync on). Prints; asserts nothing about speed. Run as root: `cargo bench --bench fleet`.
//!
//! 1. Assignment storm: every lane assigned (all at once), then stopped, 10 rounds —
//!    assignments/s and assign → RUNNING p50/p99.
//! 2. The same storm with one host's supervisor SIGKILLed in the middle of a round: the
//!    other hosts' latency beside the undisturbed figure; the killed host's lanes after
//!    `mosaic up` restarted its supervisor.
//! 3. A sustained flood for 20 s — connections that never finish TLS, and host 4's own
//!    credentials opening sessions and sending invalid frames whenever it is let in —
//!    sampling the coordinator's RSS and leadership, and assign → RUNNING latency on host
//!    1 beside the same measurement without the flood.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mosaic::coordinator::service::{operator_call, OperatorRequest};
use serde_json::Value;

const HOSTS: u32 = 4;
const LANES: u32 = 16;
const ROUNDS: usize = 10;

fn pct(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

fn assign_req(lane: &str) -> OperatorRequest {
    OperatorRequest::Assign {
        lane_id: lane.into(),
        runtime: "fake@1.0.0".into(),
        task: "hang".into(),
        scope: vec![],
        holds: vec![],
        completion_policy: None,
        wait: true,
        resume: None,
        request_id: None,
        inactivity_policy: None,
        repo: None,
        base: None,
        replace_task: false,
        from_checkpoint: None,
        grant_within_s: None,
        place: None,
    }
}

fn stop_req(id: &str) -> OperatorRequest {
    OperatorRequest::Stop {
        assignment_id: id.into(),
        outcome: None,
        evidence_digest: None,
        wait: true,
        request_id: None,
    }
}

/// One assignment of a storm: its latency to RUNNING, id and request time (Unix seconds),
/// or why not.
type Assigned = Result<(Duration, String, f64), String>;

/// CPU time (ms) spent so far, by where: the whole machine busy and idle (`/proc/stat`);
/// from the cgroups under `mosaic up`'s host roots (which keep the usage of removed
/// children) the supervisors, the lanes' tmux servers and the generations; and, from
/// `/proc`, `mosaic up` itself (the coordinator) and PostgreSQL (each process's own and
/// its reaped children's time).
#[derive(Default, Clone, Copy)]
struct Cpu {
    busy: f64,
    idle: f64,
    generations: f64,
    supervisors: f64,
    tmux: f64,
    coordinator: f64,
    postgres: f64,
}

fn cpu_now(dir: &std::path::Path) -> Cpu {
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let ms = |ticks: f64| ticks * 1000.0 / tick;
    let mut c = Cpu::default();
    if let Some(line) = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().next().map(str::to_string))
    {
        let v: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        if v.len() >= 8 {
            c.idle = ms(v[3] + v[4]);
            c.busy = ms(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
        }
    }
    // `mosaic up`'s cgroup root for this state dir; its hosts' roots are it, suffixed.
    let Some(up_root) = mosaic::up::up_cgroup_root(dir, "").ok().flatten() else {
        return c;
    };
    let tag = up_root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mount = up_root
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let usage = |p: &std::path::Path| {
        std::fs::read_to_string(p.join("cpu.stat"))
            .ok()
            .and_then(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .map_or(0.0, |us| us / 1000.0)
    };
    // Each host's root: `supervisor/` (the daemon), `lanes/*/tmux` (a lane's tmux server)
    // and the lanes' generations, which are the rest.
    for e in std::fs::read_dir(mount).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with(&tag) {
            let root = e.path();
            let sup = usage(&root.join("supervisor"));
            let tmux: f64 = std::fs::read_dir(root.join("lanes"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|l| usage(&l.path().join("tmux")))
                .sum();
            c.supervisors += sup;
            c.tmux += tmux;
            c.generations += usage(&root) - sup - tmux;
        }
    }
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let f: Vec<f64> = stat[close + 2..]
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        // Fields from the state (index 0): utime 11, stime 12, cutime 13, cstime 14.
        if f.len() < 15 {
            continue;
        }
        // A process in a host's cgroups is counted there.
        let cg = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if cg.contains(&tag) {
            continue;
        }
        let t = ms(f[11] + f[12] + f[13] + f[14]);
        match comm {
            "mosaic" => c.coordinator += t,
            "postgres" => c.postgres += t,
            _ => {}
        }
    }
    c
}

/// Runs `q` on `mosaic up`'s private database (in `dir/pg`), on a connection of its own.
fn up_db(
    dir: &std::path::Path,
    q: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, String> {
    let url = mosaic::pgcluster::Cluster::at(&dir.join("pg"))
        .map_err(|e| e.to_string())?
        .url("mosaic");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        c.query(q, params).await
    })
    .map_err(|e| e.to_string())
}

/// The database's own counters (`pg_stat_database`, `pg_stat_user_tables`): transactions
/// committed, rows returned by scans, and sequential and index scans.
fn pg_counts(dir: &std::path::Path) -> [f64; 4] {
    up_db(
        dir,
        "SELECT d.xact_commit::float8, d.tup_returned::float8, \
                (SELECT sum(seq_scan)::float8 FROM pg_stat_user_tables), \
                (SELECT sum(idx_scan)::float8 FROM pg_stat_user_tables) \
         FROM pg_stat_database d WHERE d.datname = 'mosaic'",
        &[],
    )
    .ok()
    .and_then(|rows| rows.into_iter().next())
    .map_or([f64::NAN; 4], |r| [r.get(0), r.get(1), r.get(2), r.get(3)])
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The chain's transitions in order, as the receipts name them.
const STAGES: [&str; 8] = [
    "reserve",
    "checkpoint",
    "fence",
    "stage",
    "staged",
    "injected",
    "consume-ack",
    "activate",
];

/// Where each storm assignment's time went: from the operator's request to each chain
/// transition's commit (the receipts' database time; the database runs on this machine,
/// so its clock is the bench's) and from the activation to the operator's answer. Per gap,
/// p50 / p99 / mean over the assignments, and the mean's share of the whole.
fn breakdown(dir: &std::path::Path, runs: &[(String, f64, f64)]) -> Vec<String> {
    let ids: Vec<String> = runs.iter().map(|r| r.0.clone()).collect();
    let rows = up_db(
        dir,
        // A new assignment's reserve receipt names it in its body only (its id is made
        // inside that transition).
        "SELECT coalesce(assignment_id, body->'chain'->>'assignment_id'), transition, \
                extract(epoch FROM decided_at)::float8 \
         FROM transition_receipts \
         WHERE coalesce(assignment_id, body->'chain'->>'assignment_id') = ANY($1) AND transition = ANY($2)",
        &[&ids, &STAGES.to_vec()],
    );
    let rows = match rows {
        Ok(r) => r,
        Err(e) => return vec![format!("no breakdown: {e}")],
    };
    let mut at = std::collections::HashMap::<(String, String), f64>::new();
    for r in rows {
        at.insert((r.get(0), r.get(1)), r.get(2));
    }
    let names: Vec<String> = std::iter::once("request".to_string())
        .chain(STAGES.iter().map(|s| s.to_string()))
        .chain(std::iter::once("answer".to_string()))
        .collect();
    let mut gaps: Vec<Vec<f64>> = vec![Vec::new(); names.len() - 1];
    for (id, start, end) in runs {
        let mut t: Vec<f64> = vec![*start];
        for s in STAGES {
            match at.get(&(id.clone(), s.to_string())) {
                Some(x) => t.push(*x),
                None => break,
            }
        }
        if t.len() != STAGES.len() + 1 {
            continue;
        }
        t.push(*end);
        for (i, w) in t.windows(2).enumerate() {
            gaps[i].push((w[1] - w[0]) * 1000.0);
        }
    }
    let total: f64 = gaps
        .iter()
        .map(|g| g.iter().sum::<f64>() / g.len().max(1) as f64)
        .sum();
    let mut out = vec![format!(
        "where the time goes ({} assignments; ms from one step's commit to the next's):",
        gaps[0].len()
    )];
    for (i, g) in gaps.iter_mut().enumerate() {
        g.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| {
            g.get(((g.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        let mean = g.iter().sum::<f64>() / g.len().max(1) as f64;
        out.push(format!(
            "{:>12} → {:<12} p50 {:8.1}  p99 {:8.1}  mean {:8.1}  ({:4.1} %)",
            names[i],
            names[i + 1],
            q(0.5),
            q(0.99),
            mean,
            100.0 * mean / total
        ));
    }
    out
}

struct Fleet {
    dir: std::path::PathBuf,
    ops: std::path::PathBuf,
    host: String,
    up: std::process::Child,
}

impl Fleet {
    fn lane(&self, h: u32, l: u32) -> String {
        format!("{}-{h}:lane-{l}", self.host)
    }

    fn op(&self, r: &OperatorRequest) -> Result<Value, String> {
        operator_call(&self.ops, r).map_err(|e| format!("{}: {}", e.category.as_str(), e.message))
    }

    /// Assigns `lanes` all at once; returns each latency (RUNNING) and assignment id.
    fn assign_all(&self, lanes: &[String]) -> Vec<(String, Assigned)> {
        std::thread::scope(|s| {
            let hs: Vec<_> = lanes
                .iter()
                .map(|l| {
                    s.spawn(move || {
                        let (t, start) = (Instant::now(), unix_now());
                        let r = self.op(&assign_req(l)).and_then(|v| {
                            if v["state"] == "RUNNING" {
                                Ok((
                                    t.elapsed(),
                                    v["assignment_id"].as_str().unwrap_or("").to_string(),
                                    start,
                                ))
                            } else {
                                Err(v.to_string())
                            }
                        });
                        (l.clone(), r)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn stop_all(&self, ids: &[String]) {
        std::thread::scope(|s| {
            for id in ids {
                s.spawn(move || {
                    let _ = self.op(&stop_req(id));
                });
            }
        });
    }

    fn supervisor_pid(&self, h: u32) -> Option<i32> {
        let cfg = self
            .dir
            .join(format!("hosts/{}-{h}/supervisor.toml", self.host));
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(" supervisor --config ") && cmd.contains(cfg.to_str()?) {
                return Some(pid);
            }
        }
        None
    }

    fn coordinator_rss_kb(&self) -> u64 {
        let st =
            std::fs::read_to_string(format!("/proc/{}/status", self.up.id())).unwrap_or_default();
        st.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

fn main() {
    let dir = std::env::temp_dir().join(format!(
        "mosaic-bench-fleet-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let mut up = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args([
            "up",
            "--hosts",
            &HOSTS.to_string(),
            "--lanes",
            &LANES.to_string(),
            "--state-dir",
        ])
        .arg(&dir)
        .env("MOSAIC_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(up.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "mosaic up ended early"
        );
        if line.contains("Ctrl-C stops everything") {
            break;
        }
    }
    std::thread::spawn(move || for _ in out.lines() {});
    let f = Fleet {
        ops: dir.join("run/coordinator.sock"),
        host: nix::unistd::gethostname()
            .unwrap()
            .to_string_lossy()
            .into_owned(),
        dir: dir.clone(),
        up,
    };
    let all: Vec<String> = (1..=HOSTS)
        .flat_map(|h| (1..=LANES).map(move |l| (h, l)))
        .map(|(h, l)| f.lane(h, l))
        .collect();

    // 1. The storm.
    let mut lat = Vec::new();
    let mut runs = Vec::new();
    let mut failures = 0usize;
    let cpu0 = cpu_now(&dir);
    let pg0 = pg_counts(&dir);
    let t = Instant::now();
    for _ in 0..ROUNDS {
        let res = f.assign_all(&all);
        let ids: Vec<String> = res
            .iter()
            .filter_map(|(_, r)| {
                r.as_ref().ok().map(|(d, id, start)| {
                    lat.push(*d);
                    runs.push((id.clone(), *start, *start + d.as_secs_f64()));
                    id.clone()
                })
            })
            .collect();
        failures += res.len() - ids.len();
        f.stop_all(&ids);
    }
    let storm_secs = t.elapsed().as_secs_f64();
    let cpu1 = cpu_now(&dir);
    let pg1 = pg_counts(&dir);
    let n = lat.len();
    let where_it_goes = breakdown(&dir, &runs);

    // 2. The storm with host 4's supervisor SIGKILLed a moment into one round.
    let others: Vec<String> = all
        .iter()
        .filter(|l| !l.starts_with(&format!("{}-{HOSTS}:", f.host)))
        .cloned()
        .collect();
    let killed: Vec<String> = all
        .iter()
        .filter(|l| l.starts_with(&format!("{}-{HOSTS}:", f.host)))
        .cloned()
        .collect();
    let pid = f.supervisor_pid(HOSTS).expect("host 4's supervisor");
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(15));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    });
    let res = f.assign_all(&all);
    killer.join().unwrap();
    let mut other_lat = Vec::new();
    let mut ids = Vec::new();
    let mut killed_outcomes = std::collections::BTreeMap::<String, usize>::new();
    for (lane, r) in &res {
        match r {
            Ok((d, id, _)) => {
                ids.push(id.clone());
                if others.contains(lane) {
                    other_lat.push(*d);
                } else {
                    *killed_outcomes.entry("RUNNING".into()).or_default() += 1;
                }
            }
            Err(e) => {
                let cat = e.split(':').next().unwrap_or("?").to_string();
                *killed_outcomes.entry(cat).or_default() += 1;
            }
        }
    }
    f.stop_all(&ids);
    // Host 4 comes back (mosaic up restarts its supervisor); its lanes reconcile.
    let back = Instant::now();
    let settled = loop {
        let lanes = f.op(&OperatorRequest::Lanes).unwrap_or(Value::Null);
        let mine: Vec<&Value> = lanes
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|l| killed.contains(&l["lane_id"].as_str().unwrap_or("").to_string()))
                    .collect()
            })
            .unwrap_or_default();
        if mine.len() == killed.len() && mine.iter().all(|l| l["state"] == "IDLE_CLEAN") {
            break Some(back.elapsed());
        }
        if back.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // …and takes work again.
    let again = f.assign_all(&killed);
    let again_ok = again.iter().filter(|(_, r)| r.is_ok()).count();
    let again_ids: Vec<String> = again
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok().map(|(_, id, _)| id.clone()))
        .collect();
    f.stop_all(&again_ids);

    // 3. Latency on host 1 alone, without and then with a flood.
    let probe = |lanes: &[String], stop: &AtomicBool| -> Vec<Duration> {
        let mut v = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            let lane = &lanes[i % lanes.len()];
            i += 1;
            let t = Instant::now();
            if let Ok(a) = f.op(&assign_req(lane)) {
                v.push(t.elapsed());
                let _ = f.op(&stop_req(a["assignment_id"].as_str().unwrap_or("")));
            }
        }
        v
    };
    let host1: Vec<String> = (1..=4).map(|l| f.lane(1, l)).collect();
    let quiet_stop = AtomicBool::new(false);
    let mut quiet = std::thread::scope(|s| {
        let h = s.spawn(|| probe(&host1, &quiet_stop));
        std::thread::sleep(Duration::from_secs(10));
        quiet_stop.store(true, Ordering::SeqCst);
        h.join().unwrap()
    });
    // Host 4's session must be gone before its credentials can flood: pause its
    // supervisor past the liveness limit.
    let pid4 = f
        .supervisor_pid(HOSTS)
        .expect("host 4's supervisor after restart");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid4),
        nix::sys::signal::Signal::SIGSTOP,
    );
    std::thread::sleep(Duration::from_secs(17));
    let flood_stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(AtomicU64::new(0));
    let sessions = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let garbage = Arc::new(AtomicU64::new(0));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let params = link_params(&dir, &format!("{}-{HOSTS}", f.host));
    let flooders: Vec<_> = {
        let (stop, frames, sessions, refused) = (
            flood_stop.clone(),
            frames.clone(),
            sessions.clone(),
            refused.clone(),
        );
        let p = params.clone();
        let a = rt.spawn(async move {
            use futures_util::{SinkExt, StreamExt};
            let junk =
                tokio_tungstenite::tungstenite::Message::text("{\"message_type\":\"hello\"}");
            while !stop.load(Ordering::SeqCst) {
                match mosaic::protocol::transport::connect(&p).await {
                    Ok(mut hs) => {
                        sessions.fetch_add(1, Ordering::SeqCst);
                        while !stop.load(Ordering::SeqCst) && hs.ws.send(junk.clone()).await.is_ok()
                        {
                            frames.fetch_add(1, Ordering::SeqCst);
                        }
                        while let Some(Ok(_)) = hs.ws.next().await {}
                    }
                    Err(_) => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
        let (stop, garbage) = (flood_stop.clone(), garbage.clone());
        let addr = params.addr.clone();
        let b = rt.spawn(async move {
            use tokio::io::AsyncWriteExt;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await {
                    let _ = s.write_all(b"\x16\x03\x01 not a client hello at all").await;
                    garbage.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        vec![a, b]
    };
    let rss_before = f.coordinator_rss_kb();
    let probe_stop = AtomicBool::new(false);
    let (mut loud, rss_max) = std::thread::scope(|s| {
        let h = s.spawn(|| probe(&host1, &probe_stop));
        let mut rss_max = 0;
        for _ in 0..20 {
            std::thread::sleep(Duration::from_secs(1));
            rss_max = rss_max.max(f.coordinator_rss_kb());
        }
        probe_stop.store(true, Ordering::SeqCst);
        (h.join().unwrap(), rss_max)
    });
    flood_stop.store(true, Ordering::SeqCst);
    for fl in flooders {
        let _ = rt.block_on(fl);
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid4),
        nix::sys::signal::Signal::SIGCONT,
    );
    let st = f.op(&OperatorRequest::Status).unwrap_or(Value::Null);

    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(f.up.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let mut up = f.up;
    let _ = up.wait();
    let _ = std::fs::remove_dir_all(&dir);

    println!("Mosaic fleet benchmark — mosaic up --hosts {HOSTS} --lanes {LANES} (separate supervisor processes, one coordinator, PostgreSQL fsync on)");
    println!(
        "  storm: {ROUNDS} rounds × {} lanes assigned at once, then stopped",
        all.len()
    );
    println!(
        "      {n} assignments in {storm_secs:.1} s = {:.1} assignments/s (with their stops); {failures} not RUNNING",
        n as f64 / storm_secs
    );
    println!(
        "      assign → RUNNING p50 {:7.1} ms  p99 {:7.1} ms",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99)
    );
    for line in &where_it_goes {
        println!("      {line}");
    }
    let per = |a: f64, b: f64| (b - a) / n.max(1) as f64;
    let busy = cpu1.busy - cpu0.busy;
    let cores = (busy + cpu1.idle - cpu0.idle) / (storm_secs * 1000.0);
    println!(
        "      the machine's CPUs during the storm: {:.0} % busy ({:.1} cores' worth of {cores:.1}); CPU per assignment with its stop {:.1} ms:",
        100.0 * busy / (busy + cpu1.idle - cpu0.idle),
        busy / (storm_secs * 1000.0),
        per(cpu0.busy, cpu1.busy)
    );
    let parts = [
        (
            "generations (shim, init, the harness, its `mosaic lane` calls)",
            per(cpu0.generations, cpu1.generations),
        ),
        ("supervisors", per(cpu0.supervisors, cpu1.supervisors)),
        ("the lanes' tmux servers", per(cpu0.tmux, cpu1.tmux)),
        (
            "coordinator (`mosaic up`)",
            per(cpu0.coordinator, cpu1.coordinator),
        ),
        ("PostgreSQL", per(cpu0.postgres, cpu1.postgres)),
    ];
    let named: f64 = parts.iter().map(|p| p.1).sum();
    for (what, v) in parts {
        println!("          {v:7.1} ms  {what}");
    }
    println!(
        "          {:7.1} ms  the rest (kernel work outside these, the bench's own clients)",
        per(cpu0.busy, cpu1.busy) - named
    );
    let pgd = |i: usize| (pg1[i] - pg0[i]) / n.max(1) as f64;
    println!(
        "      PostgreSQL per assignment with its stop: {:.0} transactions, {:.0} rows scanned, {:.0} sequential and {:.0} index scans",
        pgd(0),
        pgd(1),
        pgd(2),
        pgd(3)
    );
    println!(
        "      at that CPU cost the two cores bound the storm at {:.1} assignments/s (with stops); it ran at {:.0} % of that",
        cores * 1000.0 / per(cpu0.busy, cpu1.busy),
        100.0 * (n as f64 / storm_secs) / (cores * 1000.0 / per(cpu0.busy, cpu1.busy))
    );
    println!("  one round with host {HOSTS}'s supervisor SIGKILLed 15 ms in:");
    println!(
        "      other hosts: assign → RUNNING p50 {:7.1} ms  p99 {:7.1} ms ({} lanes)",
        pct(&mut other_lat, 0.5),
        pct(&mut other_lat, 0.99),
        other_lat.len()
    );
    println!(
        "      host {HOSTS}'s {} assignments: {killed_outcomes:?}",
        killed.len()
    );
    match settled {
        Some(d) => println!("      host {HOSTS}'s lanes all IDLE_CLEAN {:.1} s after the round; then {again_ok}/{} new assignments RUNNING", d.as_secs_f64(), killed.len()),
        None => println!("      host {HOSTS}'s lanes did NOT settle within 60 s"),
    }
    println!("  host 1, sequential assign → RUNNING (+ stop), 4 lanes:");
    println!(
        "      quiet          p50 {:7.1} ms  p99 {:7.1} ms  (n={})",
        pct(&mut quiet, 0.5),
        pct(&mut quiet, 0.99),
        quiet.len()
    );
    println!(
        "      during flood   p50 {:7.1} ms  p99 {:7.1} ms  (n={})",
        pct(&mut loud, 0.5),
        pct(&mut loud, 0.99),
        loud.len()
    );
    println!(
        "  flood, 20 s: {} invalid frames written over {} admitted sessions, {} refused session attempts, {} garbage TCP connections",
        frames.load(Ordering::SeqCst),
        sessions.load(Ordering::SeqCst),
        refused.load(Ordering::SeqCst),
        garbage.load(Ordering::SeqCst)
    );
    println!(
        "      coordinator RSS {rss_before} kB before, max {rss_max} kB during; leadership {} with {} losses",
        st["leadership"]["state"],
        st["leadership"]["losses"]
    );
}

/// A raw client's link parameters with `host`'s credentials from a `mosaic up` state dir.
fn link_params(dir: &std::path::Path, host: &str) -> mosaic::protocol::transport::LinkParams {
    let cfg: mosaic::supervisor::config::ConfigFile = toml::from_str(
        &std::fs::read_to_string(dir.join(format!("hosts/{host}/supervisor.toml"))).unwrap(),
    )
    .unwrap();
    let l = cfg.coordinator.unwrap();
    let principal = format!("host:{host}");
    let seed = |p: &std::path::Path| mosaic::coordinator::service::read_seed(p).unwrap();
    mosaic::protocol::transport::LinkParams {
        addr: l.address.clone(),
        fallback_addrs: vec![],
        server_name: l.server_name.clone(),
        coordinator: l.principal.clone(),
        tls: mosaic::protocol::transport::client_tls(&mosaic::protocol::transport::TlsIdentity {
            ca: l.ca.clone(),
            cert: l.cert.clone(),
            key: l.key.clone(),
        })
        .unwrap(),
        signer: Arc::new(mosaic::protocol::Signer::new(
            &format!("{principal}/session"),
            &principal,
            &l.trust_domain,
            seed(&l.session_key),
        )),
        registry: Arc::new(
            mosaic::protocol::TrustRegistry::from_toml(
                &std::fs::read_to_string(&l.trust_registry).unwrap(),
            )
            .unwrap(),
        ),
        trust_domain: l.trust_domain.clone(),
        host_id: host.into(),
        lanes: vec![],
        report: Default::default(),
        runtimes: vec![],
        liveness: Default::default(),
        max_clock_skew_ms: mosaic::protocol::transport::ClockSkew::DEFAULT_TOLERANCE_MS,
    }
}
