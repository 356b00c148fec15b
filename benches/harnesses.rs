//! Real-harness benchmark, every family side by side with the fake harness in one run, each
//! under `mosaic up` (coordinator, supervisor, PostgreSQL) against the deterministic test
//! model, in its interactive TUI in a real tmux lane:
//!
//! - assign → RUNNING (fresh generation, private harness area, contract through the
//!   harness's own hook/plugin/extension, activation check typed into the pane, ACK taken
//!   from its turn-end event, activation), p50/p99 over N runs;
//! - generation start → verified identity inside the supervisor (number burned … identity
//!   durable), from its launch-phase log;
//! - stop of the harness with a 100-process tool tree → verified empty, with survivors;
//! - bytes its private harness area holds after one activation and one tool turn.
//!
//! Needs the installed harnesses (`MOSAIC_HARNESS_ROOT`, as scripts/test sets it). Run as
//! root: `MOSAIC_HARNESS_ROOT=… MOSAIC_HARNESS_LOG=debug cargo bench --bench harnesses`
//! (the debug log carries the launch phases; `MOSAIC_BENCH_ONLY=pi` runs one family).
//! Prints; asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/harness/mod.rs"]
mod harness;
#[path = "../tests/pg/mod.rs"]
mod pg;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::*;

const N: usize = 20;
const TREE_RUNS: usize = 3;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn du(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

struct Row {
    name: String,
    running: Vec<f64>,
    identity: Vec<f64>,
    stop: Vec<f64>,
    survivors: Vec<usize>,
    disk: u64,
}

fn bench(f: &Family) -> Row {
    let (name, _) = f.runtime.split_once('@').unwrap();
    let fake = name == "fake";
    let model = Model::start();
    let tmp = TempDir::new("mosaic-bh");
    let dir = tmp.0.clone();
    let creds = dir.join("creds.env");
    std::fs::write(&creds, (f.credentials)("bench-token")).unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let files = (f.overlay)();
    let overlay = (!files.is_empty()).then(|| {
        let d = dir.join("overlay");
        std::fs::create_dir_all(&d).unwrap();
        for (n, t) in &files {
            std::fs::write(d.join(n), t).unwrap();
        }
        d
    });
    let up = Up::start(
        name,
        &creds,
        overlay.as_deref(),
        None,
        &format!("http://127.0.0.1:{}", model.port),
    );
    let task = if fake {
        "hang"
    } else {
        "bench: keep the lane tidy"
    };

    let mut running = Vec::new();
    for _ in 0..N {
        let t = Instant::now();
        let a = up.assign(f.runtime, task, true).expect("assign");
        running.push(t.elapsed().as_secs_f64() * 1000.0);
        up.stop(a["assignment_id"].as_str().unwrap());
        std::thread::sleep(Duration::from_millis(200));
    }
    let identity: Vec<f64> = std::fs::read_to_string(up.dir.with_extension("log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("identity durable"))
        .filter_map(|l| {
            l.split("elapsed_us=")
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<f64>()
                .ok()
        })
        .map(|us| us / 1000.0)
        .collect();

    let mut stop = Vec::new();
    let mut survivors = Vec::new();
    let mut disk = 0;
    for _ in 0..TREE_RUNS {
        let a = up
            .assign(f.runtime, if fake { "spawn=100" } else { task }, true)
            .expect("assign");
        let cg = up.cgroup();
        if !fake {
            up.type_turn("model:run[for i in $(seq 100); do sleep 1000 & done; wait]");
        }
        let tree = wait_for("100 tool processes", common::PATIENCE, || {
            let m = common::members(&cg);
            (m.len() >= 100).then_some(m)
        });
        disk = du(&up.dir.join("supervisor/harness"));
        let g = up.generation()["generation"].clone();
        let t = Instant::now();
        up.cli(&["stop", "--assignment", a["assignment_id"].as_str().unwrap()])
            .unwrap();
        let r = up.receipt(&g);
        stop.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r["cleanup"]["verified_empty"], true);
        survivors.push(survivors_of(&tree));
    }
    drop(up);
    drop(tmp);
    Row {
        name: f.runtime.to_string(),
        running,
        identity,
        stop,
        survivors,
        disk,
    }
}

fn survivors_of(before: &[(i32, u64)]) -> usize {
    before
        .iter()
        .filter(|(p, st)| !common::is_dead(*p, *st))
        .count()
}

fn main() {
    common::require_host();
    assert_eq!(
        std::env::var("MOSAIC_HARNESS_LOG").as_deref(),
        Ok("debug"),
        "run with MOSAIC_HARNESS_LOG=debug: start→identity is read from the supervisor's launch phases"
    );
    let only = std::env::var("MOSAIC_BENCH_ONLY").ok();
    let families = [FAKE, CLAUDE, PI, OPENCODE, CODEX];
    let mut rows = Vec::new();
    for f in families
        .iter()
        .filter(|f| only.as_deref().is_none_or(|o| f.runtime.starts_with(o)))
    {
        rows.push(bench(f));
    }
    let dynmods = mosaic::cgroup::discover_mount()
        .map(|m| m.favordynmods)
        .unwrap_or(false);
    println!(
        "Mosaic real-harness benchmark — each under mosaic up, against the test model (cgroup2 favordynmods {})",
        if dynmods { "on" } else { "off" }
    );
    println!(
        "{:<22} {:>21} {:>21} {:>24} {:>10} {:>12}",
        "runtime",
        "assign→RUNNING p50/p99",
        "start→identity p50",
        "stop 100-proc tree med",
        "survivors",
        "area bytes"
    );
    for mut r in rows {
        let (r50, r99) = (pct(&mut r.running, 0.5), pct(&mut r.running, 0.99));
        let i50 = if r.identity.is_empty() {
            f64::NAN
        } else {
            pct(&mut r.identity, 0.5)
        };
        let s50 = pct(&mut r.stop, 0.5);
        println!(
            "{:<22} {:>9.1} / {:>7.1} ms {:>18.2} ms {:>21.1} ms {:>10} {:>12}",
            r.name,
            r50,
            r99,
            i50,
            s50,
            format!("{:?}", r.survivors),
            r.disk
        );
    }
}
