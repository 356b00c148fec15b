//! The provider gateway beside its anchor, in one run: one chat completion through a
//! RUNNING generation's gateway — its claim admitted by the coordinator in PostgreSQL
//! (fsync on) before it is sent, the credential's placeholder replaced in its headers, the
//! answer streamed back, its result and token usage recorded — against the same request
//! straight to the test model endpoint, interleaved, each on a fresh connection as a
//! harness's tool makes them.
//!
//! The whole system runs as a user runs it (`mosaic up` with the test model as the fake
//! runtime's provider); the gateway's requests are made from inside the generation's own
//! network namespace (a thread of this process joins it), where the gateway is the only
//! listener. Run as root: `cargo bench --bench gateway`. Prints; asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mosaic::coordinator::service::{operator_call, OperatorRequest};
use mosaic::supervisor::control::{call, Request};

const N: usize = 400;
const BODY: &str = r#"{"model":"mosaic-test-model","stream":false,"messages":[{"role":"user","content":"hello"}]}"#;

fn request(port: u16, key: &str) -> Duration {
    let t = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    )
    .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let d = t.elapsed();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    d
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

fn main() {
    let model = common::Model::start();
    let dir = std::env::temp_dir().join(format!(
        "mosaic-bench-gateway-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let creds = dir.join("fake.env");
    std::fs::write(&creds, "FAKE_PROVIDER_KEY=bench-secret\n").unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let state = dir.join("state");
    let mut up = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(["up", "--lanes", "1", "--state-dir"])
        .arg(&state)
        .arg("--provider")
        .arg(format!("fake=http://127.0.0.1:{}", model.port))
        .arg("--credentials")
        .arg(format!("fake={}", creds.display()))
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
    let ops = state.join("run/coordinator.sock");
    let host = state.join("run/control.sock");
    let lane = format!(
        "{}:lane-1",
        nix::unistd::gethostname().unwrap().to_string_lossy()
    );
    let a = operator_call(
        &ops,
        &OperatorRequest::Assign {
            lane_id: lane,
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
        },
    )
    .unwrap();
    assert_eq!(a["state"], "RUNNING", "{a}");
    let st = call(&host, &Request::Status).unwrap();
    let harness = st["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    // A thread in the generation's network namespace: the gateway is its 127.0.0.1:4741.
    let ns = std::fs::File::open(format!("/proc/{harness}/ns/net")).unwrap();
    let (ask, asked) = std::sync::mpsc::channel::<()>();
    let (done, took) = std::sync::mpsc::channel::<Duration>();
    let inside = std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let placeholder = mosaic::supervisor::gateway::placeholder("FAKE_PROVIDER_KEY");
        let port = mosaic::confine::net::GATEWAY_PORT;
        for () in asked {
            done.send(request(port, &placeholder)).unwrap();
        }
    });
    let through = |n: usize| -> Vec<Duration> {
        (0..n)
            .map(|_| {
                ask.send(()).unwrap();
                took.recv().unwrap()
            })
            .collect()
    };
    // Warm both paths (the model's first answers, the gateway's first connections).
    for _ in 0..20 {
        request(model.port, "bench-secret");
        through(1);
    }
    let (mut direct, mut gw) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for _ in 0..N {
        direct.push(request(model.port, "bench-secret"));
        gw.extend(through(1));
    }
    drop(ask);
    inside.join().unwrap();
    let seen = call(&host, &Request::Status).unwrap()["lanes"][0]["generation"]["gateway"].clone();
    let (d50, d99) = (pct(&mut direct, 0.5), pct(&mut direct, 0.99));
    let (g50, g99) = (pct(&mut gw, 0.5), pct(&mut gw, 0.99));
    println!("provider request, n={N} each, interleaved, fresh connection each:");
    println!("  straight to the test model endpoint        p50 {d50:.3} ms  p99 {d99:.3} ms");
    println!("  through the gateway, claim admitted first  p50 {g50:.3} ms  p99 {g99:.3} ms");
    println!(
        "  added by the gateway and its claim         p50 {:.3} ms ({:.2}x); goal <= 3 ms",
        g50 - d50,
        g50 / d50
    );
    println!(
        "  gateway counted {} requests, {} input / {} output tokens",
        seen["requests"], seen["input_tokens"], seen["output_tokens"]
    );
    let effects = operator_call(
        &ops,
        &OperatorRequest::Effects {
            assignment_id: a["assignment_id"].as_str().map(String::from),
            limit: Some(10_000),
        },
    )
    .unwrap();
    println!(
        "  effect claims recorded for the assignment: {}",
        effects.as_array().map_or(0, Vec::len)
    );
    // Where the added time goes: the coordinator's own time per transition (its
    // histogram's mean over every request, warm-up included), the rest being the two hops
    // between gateway, supervisor and coordinator and the signing at each end.
    let metrics = coordinator_metrics(&state);
    for op in ["admit-effect", "effect-result"] {
        let get = |what: &str| {
            metrics.lines().find_map(|l| {
                l.strip_prefix(&format!("mosaic_transition_seconds_{what}{{op=\"{op}\"}} "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
        };
        if let (Some(sum), Some(n)) = (get("sum"), get("count")) {
            println!(
                "  coordinator's {op} transition (BEGIN to COMMIT)  mean {:.3} ms over {n}",
                sum / n * 1000.0
            );
        }
    }
    common::terminate(&mut up, Duration::from_secs(20));
    let _ = std::fs::remove_dir_all(&dir);
    drop(model);
}

/// The coordinator's `/metrics` text (its address is in the state's run directory).
fn coordinator_metrics(state: &std::path::Path) -> String {
    let addr = std::fs::read_to_string(state.join("run/metrics-coordinator.addr")).unwrap();
    let mut s = TcpStream::connect(addr.trim()).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        addr.trim()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}
