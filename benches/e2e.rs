//! End-to-end benchmark on `mosaic up` (coordinator + supervisor + a private PostgreSQL
//! with fsync on): latency from `assign` to RUNNING, and from SIGKILL of the harness to a
//! receipt reconciled by the coordinator, p50 / p99 over 50 runs each; and `assign` placed by
//! the roster's policy (no `--lane`) against `assign --lane`, interleaved in the same run.
//! Prints; asserts nothing about speed. Run as root: `cargo bench --bench e2e`.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mosaic::coordinator::service::{operator_call, OperatorRequest};
use mosaic::supervisor::control::{call, Request};

const RUNS: usize = 50;
const ELASTIC_RUNS: usize = 10;

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

fn main() {
    let dir = std::env::temp_dir().join(format!(
        "mosaic-bench-e2e-{}",
        uuid::Uuid::new_v4().simple()
    ));
    // MOSAIC_BENCH_LOG=FILE keeps both daemons' debug log (each transition with its time).
    let log = std::env::var_os("MOSAIC_BENCH_LOG");
    let mut up = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(["up", "--lanes", "1", "--state-dir"])
        .arg(&dir)
        .env("MOSAIC_LOG", if log.is_some() { "debug" } else { "warn" })
        .stdout(Stdio::piped())
        .stderr(match &log {
            Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
            None => Stdio::null(),
        })
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
    let ops = dir.join("run/coordinator.sock");
    let host = dir.join("run/control.sock");
    let lane = format!(
        "{}:lane-1",
        nix::unistd::gethostname().unwrap().to_string_lossy()
    );
    let host_id = lane.split(':').next().unwrap().to_string();
    let roster: mosaic::coordinator::placement::Roster = toml::from_str(&format!(
        "[[hosts]]\nhost_id = \"{host_id}\"\ncapacity = 1\n\
         [[hosts.lanes]]\nlane = \"lane-1\"\nruntimes = [\"fake\"]\nlabels = {{ zone = \"a\" }}\n"
    ))
    .unwrap();
    operator_call(
        &ops,
        &OperatorRequest::RosterPublish {
            roster,
            request_id: None,
        },
    )
    .unwrap();
    // On `on` (the lane named), or placed by policy when `on` is empty.
    let assign_on = |on: &str, task: &str| {
        let placed = on.is_empty();
        operator_call(
            &ops,
            &OperatorRequest::Assign {
                lane_id: on.to_string(),
                runtime: "fake@1.0.0".into(),
                task: task.into(),
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
                place: placed.then(|| {
                    Box::new(mosaic::coordinator::placement::PlacementAsk {
                        labels: [("zone".to_string(), "a".to_string())].into(),
                        role: None,
                        elastic: None,
                    })
                }),
            },
        )
        .unwrap()
    };
    let assign_by = |task: &str, placed: bool| assign_on(if placed { "" } else { &lane }, task);
    let assign = |task: &str| assign_by(task, false);

    let mut to_running = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let a = assign("hang");
        to_running.push(t.elapsed());
        operator_call(
            &ops,
            &OperatorRequest::Stop {
                assignment_id: a["assignment_id"].as_str().unwrap().into(),
                outcome: None,
                evidence_digest: None,
                wait: true,
                request_id: None,
            },
        )
        .unwrap();
        // Let the host finish the previous stop's bookkeeping, so each sample measures one
        // assignment rather than the tail of the last stop competing for two cores.
        std::thread::sleep(Duration::from_millis(200));
    }

    // Named lane and placed, alternately, so both see the same server and the same lane.
    let (mut named, mut placed) = (Vec::new(), Vec::new());
    for i in 0..RUNS * 2 {
        let by_policy = i % 2 == 1;
        let t = Instant::now();
        let a = assign_by("hang", by_policy);
        let took = t.elapsed();
        assert_eq!(a["placement"].is_null(), !by_policy, "{a}");
        if by_policy { &mut placed } else { &mut named }.push(took);
        operator_call(
            &ops,
            &OperatorRequest::Stop {
                assignment_id: a["assignment_id"].as_str().unwrap().into(),
                outcome: None,
                evidence_digest: None,
                wait: true,
                request_id: None,
            },
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }

    // An elastic lane: lease (answered once the host made it) → assign on it → RUNNING,
    // against the assigns on the existing idle lane above. Each lane is unleased and gone
    // before the next lease (the roster's capacity is 2).
    let (mut lease_made, mut lease_running) = (Vec::new(), Vec::new());
    for _ in 0..ELASTIC_RUNS {
        let t = Instant::now();
        let l = operator_call(
            &ops,
            &OperatorRequest::LaneLease {
                ask: mosaic::coordinator::leases::LeaseAsk {
                    host_id: host_id.clone(),
                    runtime: "fake@1.0.0".into(),
                    labels: Default::default(),
                    role: None,
                    ttl_ms: 60_000,
                    max_lifetime_ms: 600_000,
                },
                request_id: None,
            },
        )
        .unwrap();
        lease_made.push(t.elapsed());
        assert_eq!(l["state"], "ACTIVE", "{l}");
        let a = assign_on(l["lane_id"].as_str().unwrap(), "hang");
        lease_running.push(t.elapsed());
        for r in [
            OperatorRequest::Stop {
                assignment_id: a["assignment_id"].as_str().unwrap().into(),
                outcome: None,
                evidence_digest: None,
                wait: true,
                request_id: None,
            },
            OperatorRequest::LaneUnlease {
                lease_id: l["lease_id"].as_str().unwrap().into(),
                request_id: None,
            },
        ] {
            operator_call(&ops, &r).unwrap();
        }
        let gone = || {
            operator_call(&ops, &OperatorRequest::Leases)
                .unwrap()
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["lease_id"] == l["lease_id"] && x["state"] == "DESTROYED")
        };
        while !gone() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    let mut to_reconciled = Vec::new();
    for _ in 0..RUNS {
        let a = assign("hang");
        let st = call(&host, &Request::Status).unwrap();
        let hp = st["lanes"][0]["generation"]["process_identity"]["harness_pid"]
            .as_i64()
            .unwrap();
        let t = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(hp as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        loop {
            let rs = operator_call(
                &ops,
                &OperatorRequest::Receipts {
                    lane_id: Some(lane.clone()),
                },
            )
            .unwrap();
            if rs
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["generation"] == a["generation"] && !r["reconciliation"].is_null())
            {
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no reconciled receipt"
            );
        }
        to_reconciled.push(t.elapsed());
        // The lane is clean again only after that reconciliation.
        while operator_call(&ops, &OperatorRequest::Lanes).unwrap()[0]["state"] != "IDLE_CLEAN" {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(up.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = up.wait();
    let _ = std::fs::remove_dir_all(&dir);

    println!("Mosaic end-to-end benchmark — mosaic up (coordinator + supervisor, PostgreSQL fsync on), {RUNS} runs each");
    println!("  assign → RUNNING (reserve … stage, fresh generation, contract, injected, challenge, ACK, activation)");
    println!(
        "      p50 {:7.1} ms  p99 {:7.1} ms",
        pct(&mut to_running, 0.5),
        pct(&mut to_running, 0.99)
    );
    let (n50, p50) = (pct(&mut named, 0.5), pct(&mut placed, 0.5));
    println!("  assign → RUNNING, interleaved: --lane named against placed by the placement policy (roster of 1 lane)");
    println!(
        "      --lane  p50 {n50:7.1} ms  p99 {:7.1} ms",
        pct(&mut named, 0.99)
    );
    println!(
        "      placed  p50 {p50:7.1} ms  p99 {:7.1} ms   placement adds {:+.1} ms at p50 ({:.2}×)",
        pct(&mut placed, 0.99),
        p50 - n50,
        p50 / n50
    );
    println!("  elastic lane, {ELASTIC_RUNS} runs: lease (the host makes the lane) → assign on it → RUNNING, against assign on an idle lane");
    println!(
        "      lease → lane made p50 {:7.1} ms · lease → first RUNNING p50 {:7.1} ms  p99 {:7.1} ms   ({:.2}× the idle lane's p50)",
        pct(&mut lease_made, 0.5),
        pct(&mut lease_running, 0.5),
        pct(&mut lease_running, 0.99),
        pct(&mut lease_running, 0.5) / n50
    );
    println!("  SIGKILL of the harness → receipt reconciled by the coordinator (recovery)");
    println!(
        "      p50 {:7.1} ms  p99 {:7.1} ms",
        pct(&mut to_reconciled, 0.5),
        pct(&mut to_reconciled, 0.99)
    );
}
