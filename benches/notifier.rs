//! Notifications and their cost to the authority loop, in one run on one PostgreSQL:
//!
//! - the authority loop — assign → RUNNING → stop cycles of fake harnesses on 4 lanes in
//!   parallel, each assignment's work blocked at once (one operator notification each) —
//!   with no notifier, with a fast one (the command reads the event and exits) and with a
//!   slow one (each delivery takes 2 s): cycles and authority transitions per second, and
//!   assign → RUNNING p50/p99;
//! - the fast notifier's delivery latency: the event recorded (in its transition) →
//!   delivered to the command (database time);
//! - the slow notifier's backlog when the cycles end: deliveries run one at a time outside
//!   every transition, so they queue and never hold the loop up.
//!
//! Run as root: `cargo bench --bench notifier`. Prints; asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/pg/mod.rs"]
mod pg;
#[path = "../tests/up/mod.rs"]
mod up;

use std::time::Instant;

use up::Up;

const LANES: u32 = 4;
const ROUNDS: usize = 15;

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

struct Run {
    name: &'static str,
    cycles_per_s: f64,
    transitions_per_s: f64,
    running: Vec<f64>,
    /// (delivered, recorded) when the cycles ended, and the delivery latencies.
    delivered: i64,
    recorded: i64,
    latency: Vec<f64>,
}

fn run(name: &'static str, command: Option<&str>) -> Run {
    let tmp = std::env::temp_dir().join(format!("mosaic-bn-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut extra = Vec::new();
    if let Some(body) = command {
        let path = tmp.join("notify.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        extra = vec!["--notify-command".to_string(), path.display().to_string()];
    }
    let up = Up::fleet_with(LANES, 1, &extra);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let transitions = || rt.block_on(up.count("SELECT count(*) FROM transition_receipts"));
    let before = transitions();
    let t = Instant::now();
    let running: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=LANES)
            .map(|n| {
                let up = &up;
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    let c = rt.block_on(async {
                        let (c, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
                            .await
                            .unwrap();
                        tokio::spawn(conn);
                        c
                    });
                    let lane = up.lane_id(n);
                    let mut times = Vec::new();
                    for _ in 0..ROUNDS {
                        let t = Instant::now();
                        let a = up.assign(&lane, "blocked=needs-review hang");
                        times.push(t.elapsed().as_secs_f64() * 1000.0);
                        let id = a["assignment_id"].as_str().unwrap().to_string();
                        // Its work blocked (the notification recorded in that transition).
                        rt.block_on(async {
                            while c
                                .query_one(
                                    "SELECT work_status FROM assignments WHERE assignment_id = $1",
                                    &[&id],
                                )
                                .await
                                .unwrap()
                                .get::<_, String>(0)
                                != "blocked"
                            {
                                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                            }
                        });
                        up.cli(&["stop", "--assignment", &id]).unwrap();
                    }
                    times
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let elapsed = t.elapsed().as_secs_f64();
    let decided = transitions() - before;
    let delivered =
        rt.block_on(up.count("SELECT count(*) FROM notifications WHERE done_at IS NOT NULL"));
    let recorded = rt.block_on(up.count("SELECT count(*) FROM notifications"));
    let latency = rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c.query(
            "SELECT (extract(epoch FROM done_at - created_at) * 1000)::float8 FROM notifications WHERE done_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, f64>(0))
        .collect()
    });
    drop(up);
    let _ = std::fs::remove_dir_all(&tmp);
    Run {
        name,
        cycles_per_s: (LANES as usize * ROUNDS) as f64 / elapsed,
        transitions_per_s: decided as f64 / elapsed,
        running,
        delivered,
        recorded,
        latency,
    }
}

fn main() {
    common::require_host();
    let configs: [(&str, Option<&str>); 3] = [
        ("no notifier", None),
        ("fast notifier", Some("cat > /dev/null")),
        ("slow notifier (2 s)", Some("cat > /dev/null; sleep 2")),
    ];
    // Each configuration twice, in the order A B C C B A, so neither warm-up nor drift
    // favours one.
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for i in [0usize, 1, 2, 2, 1, 0] {
        let (name, command) = configs[i];
        runs[i].push(run(name, command));
    }
    println!(
        "Mosaic notifier cost — {LANES} lanes × {ROUNDS} assign→RUNNING→stop cycles, each work blocked at once (one notification); each configuration run twice (A B C C B A)"
    );
    println!(
        "{:<22} {:>16} {:>20} {:>8} {:>22} {:>20} {:>22}",
        "notifier",
        "cycles/s",
        "transitions/s",
        "× none",
        "assign→RUNNING p50/p99",
        "delivered/recorded",
        "delivery p50/p99 ms"
    );
    let mean = |rs: &[Run], f: fn(&Run) -> f64| rs.iter().map(f).sum::<f64>() / rs.len() as f64;
    let base = mean(&runs[0], |r| r.transitions_per_s);
    for rs in &runs {
        let running: Vec<f64> = rs.iter().flat_map(|r| r.running.clone()).collect();
        let latency: Vec<f64> = rs.iter().flat_map(|r| r.latency.clone()).collect();
        let both = |f: fn(&Run) -> f64| {
            rs.iter()
                .map(|r| format!("{:.1}", f(r)))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "{:<22} {:>16} {:>20} {:>8.2} {:>12.1} / {:>7.1} {:>20} {:>22}",
            rs[0].name,
            both(|r| r.cycles_per_s),
            both(|r| r.transitions_per_s),
            mean(rs, |r| r.transitions_per_s) / base,
            pct(&running, 0.5),
            pct(&running, 0.99),
            rs.iter()
                .map(|r| format!("{}/{}", r.delivered, r.recorded))
                .collect::<Vec<_>>()
                .join(" "),
            if latency.is_empty() {
                "—".to_string()
            } else {
                format!("{:.1} / {:.1}", pct(&latency, 0.5), pct(&latency, 0.99))
            }
        );
    }
}
