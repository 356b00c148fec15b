//! The gateway's handling of requests and answers: what goes upstream, where credentials
//! go, what comes back. Admission is not what these test: their broker admits everything
//! (`Admits`), and records what the gateway reports; admission itself is the coordinator's,
//! tested against it in `tests/effects.rs`.

use std::sync::Mutex;

use super::answer::Usage;
use super::*;
use crate::supervisor::broker::{Admitted, Broker, Claim, Denied, EffectObservation, Phase};

/// Admits every claim of an active generation, and keeps what was observed.
#[derive(Default)]
struct Admits {
    observed: Mutex<Vec<EffectObservation>>,
}

impl Broker for Admits {
    fn phase(&self, _: &str, _: u64) -> Phase {
        Phase::Active
    }
    fn admit(
        &self,
        _: &str,
        _: u64,
        c: Claim,
    ) -> futures_util::future::BoxFuture<'static, Result<Admitted, Denied>> {
        Box::pin(async move {
            Ok(Admitted::Fresh {
                effect_id: crate::protocol::effects::effect_id("as-test", &c.idempotency_key),
            })
        })
    }
    fn may_dispatch(&self, _: &str, _: u64) -> bool {
        true
    }
    fn observed(&self, _: &str, _: u64, o: EffectObservation) {
        self.observed.lock().unwrap().push(o);
    }
    fn unrecorded(&self, _: &str, _: u64) -> Vec<EffectObservation> {
        vec![]
    }
}

fn admitting() -> (BrokerSlot, Arc<Admits>) {
    let b = Arc::new(Admits::default());
    let slot = BrokerSlot::default();
    slot.install(b.clone());
    (slot, b)
}

#[test]
fn upstreams_are_checked() {
    let u = Upstream::parse("https://api.example.com/v1/").unwrap();
    assert_eq!(
        (u.https, u.host.as_str(), u.port, u.base_path.as_str()),
        (true, "api.example.com", 443, "/v1")
    );
    let u = Upstream::parse("http://127.0.0.1:8080").unwrap();
    assert_eq!((u.port, u.base_path.as_str()), (8080, ""));
    assert_eq!(u.authority(), "127.0.0.1:8080");
    for bad in [
        "ftp://x",
        "api.example.com",
        "https://user:pw@x.example",
        "https://x.example/?key=1",
        "https://x.example/#f",
        "",
    ] {
        assert!(Upstream::parse(bad).is_err(), "{bad} accepted");
    }
}

/// An upstream that quotes the request's Authorization header back, in a header and
/// in its body split across two writes (the key cut in the middle); records what it got.
fn echo_upstream() -> (u16, std::sync::mpsc::Receiver<String>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            let auth = head
                .lines()
                .find_map(|l| l.strip_prefix("authorization: "))
                .unwrap_or("")
                .trim()
                .to_string();
            let _ = tx.send(head.clone());
            let body = format!("{{\"error\":\"bad key {auth}\"}}");
            let (a, b) = body.split_at(body.len() / 2 + 3);
            let _ = write!(
                s,
                "HTTP/1.1 401 Unauthorized\r\nx-echo: {auth}\r\ncontent-length: {}\r\n\r\n{a}",
                body.len()
            );
            let _ = s.flush();
            std::thread::sleep(std::time::Duration::from_millis(30));
            let _ = s.write_all(b.as_bytes());
        }
    });
    (port, rx)
}

fn ask(port: u16, head: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{head}Host: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn credentials_go_only_where_a_key_goes_and_never_come_back() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (up, got) = echo_upstream();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let secret = "sk-real-secret-value-0123456789";
    let (slot, admits) = admitting();
    let _gw = rt.block_on(async {
        serve(
            l,
            Route {
                lane_id: "h:l".into(),
                generation: 1,
                runtime: "r".into(),
                upstream: Some(Upstream::parse(&format!("http://127.0.0.1:{up}")).unwrap()),
                secrets: Ok(vec![
                    (placeholder("KEY"), SecretValue(secret.into())),
                    (
                        placeholder("KEY_2"),
                        SecretValue("other-secret-value".into()),
                    ),
                ]),
                broker: slot,
            },
            Arc::new(HostMetrics::new()),
        )
        .unwrap()
    });
    // The key reaches the upstream in its header; quoted back, it is cut out of the
    // answer's header and body (split across two chunks).
    let answer = ask(
        port,
        "POST /v1/x HTTP/1.1\r\nAuthorization: Bearer mosaic-credential-KEY\r\n",
    );
    let sent = got.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
    assert!(
        sent.contains(&format!("authorization: Bearer {secret}")),
        "{sent}"
    );
    assert!(!answer.contains(secret), "{answer}");
    assert!(answer.contains("x-echo: [redacted by mosaic]"), "{answer}");
    // (The body arrives chunked: its length changed.)
    assert!(answer.contains("bad key Bearer "), "{answer}");
    assert!(answer.contains("[redacted by mosaic]\"}"), "{answer}");
    // A name that begins another's is that other one, exactly.
    ask(
        port,
        "POST /v1/x HTTP/1.1\r\nAuthorization: Bearer mosaic-credential-KEY_2\r\n",
    );
    let sent = got.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
    assert!(
        sent.contains("authorization: Bearer other-secret-value\r\n"),
        "{sent}"
    );
    // Refused before anything is sent: a placeholder in a header a provider might
    // quote back, a path that leaves the base, a method that is not GET or POST.
    for (head, status) in [
        (
            "POST /v1/x HTTP/1.1\r\nanthropic-beta: mosaic-credential-KEY\r\n",
            "400",
        ),
        (
            "POST /v1/x HTTP/1.1\r\nx-api-key: pre-mosaic-credential-KEY\r\n",
            "400",
        ),
        ("POST /v1/../admin HTTP/1.1\r\n", "400"),
        ("POST /v1/%2e%2e/admin HTTP/1.1\r\n", "400"),
        ("POST //evil.example/x HTTP/1.1\r\n", "400"),
        ("DELETE /v1/x HTTP/1.1\r\n", "405"),
    ] {
        let answer = ask(port, head);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{head}: {answer}"
        );
        assert!(!answer.contains(secret));
    }
    assert!(
        got.recv_timeout(std::time::Duration::from_millis(200))
            .is_err(),
        "a refused request reached the upstream"
    );
    // Each carried request was one claim, observed once to its end; a refused one made
    // no claim.
    let observed = admits.observed.lock().unwrap().clone();
    assert_eq!(observed.len(), 2, "{observed:?}");
    assert!(
        observed.iter().all(|o| o.outcome == "completed"),
        "{observed:?}"
    );
    assert_ne!(observed[0].effect_id, observed[1].effect_id);
}

#[test]
fn usage_is_read_across_chunks_at_its_largest() {
    let m = Arc::new(HostMetrics::new());
    let stats = Arc::new(Stats::default());
    let mut u = Usage {
        tail: Vec::new(),
        input: 0,
        output: 0,
        stats: stats.clone(),
        metrics: m,
        runtime: "x".into(),
        settle: None,
    };
    // Anthropic streaming: input in message_start, a running output total later; a
    // cache field that must not count as input; a field split across two chunks.
    u.feed(br#"data: {"message":{"usage":{"input_tokens":120,"cache_read_input_tokens":9999,"output_tokens":1}}}"#);
    u.feed(br#"data: {"usage":{"output_tok"#);
    u.feed(br#"ens": 37}}"#);
    u.feed(br#"data: {"usage":{"output_tokens":40}}"#);
    drop(u);
    assert_eq!(stats.input_tokens.load(Ordering::Relaxed), 120);
    assert_eq!(stats.output_tokens.load(Ordering::Relaxed), 40);
}
