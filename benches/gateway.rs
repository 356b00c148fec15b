//! The provider gateway beside its anchor, in one run: one chat completion through the
//! gateway (the credential's placeholder replaced in its headers, the answer streamed back,
//! its token usage counted) against the same request straight to the test model endpoint,
//! interleaved, each on a fresh connection as the fake harness makes them.
//!
//! The gateway is served in this process on a loopback listener (in a generation it is the
//! listener its shim bound in the generation's network namespace; the path through the
//! kernel is the same loopback). Not measured: an effect claim per request, which is not
//! built. Run: `cargo bench --bench gateway`. Prints; asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mosaic::shim::proto::SecretValue;
use mosaic::supervisor::gateway::{self, Route, Upstream};
use mosaic::supervisor::metrics::HostMetrics;

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
    let port = model.port;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gw_port = listener.local_addr().unwrap().port();
    let metrics = Arc::new(HostMetrics::new());
    let served = rt.block_on(async {
        gateway::serve(
            listener,
            Route {
                lane_id: "bench:l".into(),
                generation: 1,
                runtime: "fake".into(),
                upstream: Upstream::parse(&format!("http://127.0.0.1:{port}")).unwrap(),
                secrets: Ok(vec![(
                    gateway::placeholder("KEY"),
                    SecretValue("bench-secret".into()),
                )]),
            },
            metrics,
        )
        .unwrap()
    });
    let placeholder = gateway::placeholder("KEY");
    // Warm both paths (the model's first answers, the gateway's first connections).
    for _ in 0..20 {
        request(port, "bench-secret");
        request(gw_port, &placeholder);
    }
    let (mut direct, mut through) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for _ in 0..N {
        direct.push(request(port, "bench-secret"));
        through.push(request(gw_port, &placeholder));
    }
    let seen = served.view();
    let (d50, d99) = (pct(&mut direct, 0.5), pct(&mut direct, 0.99));
    let (g50, g99) = (pct(&mut through, 0.5), pct(&mut through, 0.99));
    println!("provider request, n={N} each, interleaved, fresh connection each:");
    println!("  straight to the test model endpoint   p50 {d50:.3} ms  p99 {d99:.3} ms");
    println!("  through the gateway (no claim)        p50 {g50:.3} ms  p99 {g99:.3} ms");
    println!(
        "  added by the gateway                  p50 {:.3} ms ({:.2}x); goal <= 3 ms with its claim",
        g50 - d50,
        g50 / d50
    );
    println!(
        "  gateway counted {} requests, {} input / {} output tokens",
        seen.requests, seen.input_tokens, seen.output_tokens
    );
    drop(served);
    drop(model);
}
