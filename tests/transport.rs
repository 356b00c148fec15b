//! Mutual TLS, the session handshake, hostile frames, and receipt delivery across a
//! dropped link — over real TCP on loopback.

mod common;
mod fixture;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fixture::*;
use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use mosaic::pki::{self, Kind};
use mosaic::protocol::envelope::s;
use mosaic::protocol::messages::FromHostSession;
use mosaic::protocol::schema::MessageType;
use mosaic::protocol::transport::{
    self, Admission, Handled, Handler, LinkParams, Outgoing, ServerParams, SessionHandle,
    TlsIdentity, Violation,
};
use mosaic::protocol::{Envelope, Verified};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

const MOSAIC: &str = env!("CARGO_BIN_EXE_mosaic");

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mosaic-{tag}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn pki_cli_issues_identities_and_refuses_to_overwrite() {
    let dir = tempdir("pki");
    let run = |args: &[&str]| {
        Command::new(MOSAIC)
            .arg("pki")
            .args(args)
            .arg("--dir")
            .arg(&dir)
            .output()
            .unwrap()
    };
    assert!(run(&["init"]).status.success());
    for (args, stem, principal) in [
        (
            vec!["issue-coordinator", "--name", "main"],
            "coordinator-main",
            "coordinator:main",
        ),
        (vec!["issue-host", "--host-id", "h1"], "host-h1", "host:h1"),
        (
            vec!["issue-operator", "--name", "ops"],
            "operator-ops",
            "operator:ops",
        ),
    ] {
        let out = run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            mode(&dir.join(format!("{stem}-key.pem"))),
            0o600,
            "{stem} key is not owner-only"
        );
        let der = rustls::pki_types::CertificateDer::from_pem_file(dir.join(format!("{stem}.pem")));
        use rustls::pki_types::pem::PemObject;
        assert_eq!(pki::principal_of(&der.unwrap()).as_deref(), Some(principal));
        // Refused without --force, and nothing changes.
        let before = std::fs::read(dir.join(format!("{stem}-key.pem"))).unwrap();
        let again = run(&args);
        assert!(!again.status.success());
        assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
        assert_eq!(
            std::fs::read(dir.join(format!("{stem}-key.pem"))).unwrap(),
            before
        );
        let mut forced = args.clone();
        forced.push("--force");
        assert!(run(&forced).status.success());
        assert_ne!(
            std::fs::read(dir.join(format!("{stem}-key.pem"))).unwrap(),
            before
        );
    }
    assert_eq!(mode(&dir.join("ca-key.pem")), 0o600);
    assert!(!run(&["init"]).status.success(), "init overwrote the CA");
    assert!(!run(&["issue-host", "--host-id", "../evil"])
        .status
        .success());
    let empty = tempdir("pki-empty");
    let out = Command::new(MOSAIC)
        .args(["pki", "issue-host", "--host-id", "h1", "--dir"])
        .arg(&empty)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("pki init"));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&empty).unwrap();
}

/// Coordinator-side test handler: acknowledges receipts, records what it saw.
#[derive(Default)]
struct Collector {
    hellos: Mutex<Vec<String>>,
    receipts: Mutex<HashMap<String, Vec<String>>>,
    closed: Mutex<Vec<(String, bool)>>,
}

impl Handler for Collector {
    fn admit(&self, _peer: &str) -> BoxFuture<'static, Result<Admission, transport::Refusal>> {
        let now = std::time::SystemTime::now();
        Box::pin(async move {
            Ok(Admission {
                sot_incarnation: None,
                coordinator_epoch: None,
                issued_at: humantime::format_rfc3339_micros(now).to_string(),
                expires_at: humantime::format_rfc3339_micros(now + Duration::from_secs(10))
                    .to_string(),
            })
        })
    }

    fn open(
        &self,
        _session: SessionHandle,
        _hello: &Envelope<Verified>,
    ) -> BoxFuture<'static, Result<(), transport::Refusal>> {
        Box::pin(async { Ok(()) })
    }

    fn closed(
        &self,
        _peer: &str,
        _session_id: &str,
        reason: &mosaic::protocol::transport::CloseReason,
    ) {
        self.closed
            .lock()
            .unwrap()
            .push((reason.to_string(), reason.abusive()));
    }

    fn handle(&self, peer: String, env: Envelope<Verified>) -> BoxFuture<'static, Handled> {
        let out = match env.message_type() {
            MessageType::Hello => {
                self.hellos.lock().unwrap().push(peer);
                vec![]
            }
            MessageType::Receipt => {
                let Ok(Some(FromHostSession::Receipt(r))) = FromHostSession::decode(&env) else {
                    panic!("a receipt that does not convert");
                };
                let key = r.receipt_idempotency_key;
                let rid = r.receipt["receipt_id"].as_str().unwrap_or("").to_string();
                self.receipts
                    .lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_default()
                    .push(rid);
                vec![Outgoing::new(
                    &Arc::new(signer("coord-session")),
                    MessageType::ReceiptAck,
                    vec![
                        ("idempotency_key", s(&format!("ack-{key}"))),
                        ("sot_incarnation", mosaic::protocol::canonical::Value::Null),
                        (
                            "coordinator_epoch",
                            mosaic::protocol::canonical::Value::Null,
                        ),
                        ("assignment_id", mosaic::protocol::canonical::Value::Null),
                        ("session_id", s(&r.session_id)),
                        ("receipt_idempotency_key", s(&key)),
                        ("verdict", s("ingested")),
                    ],
                )]
            }
            _ => vec![],
        };
        Box::pin(async move { Handled::reply(out) })
    }
}

struct World {
    dir: PathBuf,
    coord: TlsIdentity,
    host: TlsIdentity,
    audit: Arc<Mutex<Vec<(String, String)>>>,
    collector: Arc<Collector>,
}

impl World {
    fn new() -> Self {
        let dir = tempdir("tls");
        pki::init(&dir, false).unwrap();
        let c = pki::issue(&dir, Kind::Coordinator, "main", 30, false).unwrap();
        let h = pki::issue(&dir, Kind::Host, "h1", 30, false).unwrap();
        let ca = pki::ca_cert_path(&dir);
        Self {
            coord: TlsIdentity {
                ca: ca.clone(),
                cert: c.cert,
                key: c.key,
            },
            host: TlsIdentity {
                ca,
                cert: h.cert,
                key: h.key,
            },
            dir,
            audit: Arc::default(),
            collector: Arc::default(),
        }
    }

    async fn serve_on(&self, addr: &str) -> (String, watch::Sender<bool>) {
        self.serve_with(addr, Default::default()).await
    }

    async fn serve_with(
        &self,
        addr: &str,
        liveness: transport::Liveness,
    ) -> (String, watch::Sender<bool>) {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let audit = self.audit.clone();
        let params = ServerParams {
            registry: mosaic::protocol::LiveRegistry::new(registry()),
            audience: COORD.into(),
            trust_domain: DOMAIN.into(),
            audit: Arc::new(move |peer: &str, cat: &Violation, _d: &str| {
                audit
                    .lock()
                    .unwrap()
                    .push((peer.into(), cat.as_str().into()))
            }),
            signer: Arc::new(signer("coord-session")),
            liveness,
            limits: Default::default(),
            on_strike: None,
        };
        let (tx, rx) = watch::channel(false);
        let tls = transport::server_tls(&self.coord).unwrap();
        tokio::spawn(transport::serve(
            listener,
            tls,
            params,
            self.collector.clone(),
            rx,
        ));
        (addr, tx)
    }

    fn link(&self, addr: &str, host: &TlsIdentity) -> LinkParams {
        LinkParams {
            addr: addr.into(),
            fallback_addrs: vec![],
            server_name: "localhost".into(),
            coordinator: COORD.into(),
            tls: transport::client_tls(host).unwrap(),
            signer: Arc::new(signer("host-session")),
            registry: Arc::new(registry()),
            trust_domain: DOMAIN.into(),
            host_id: "h1".into(),
            lanes: vec!["w1".into()],
            report: Default::default(),
            runtimes: vec!["fake@1.0.0".into()],
            liveness: Default::default(),
            max_clock_skew_ms: mosaic::protocol::transport::ClockSkew::DEFAULT_TOLERANCE_MS,
        }
    }

    fn audited(&self, cat: &str) -> bool {
        self.audit.lock().unwrap().iter().any(|(_, c)| c == cat)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn mtls_refuses_missing_foreign_and_expired_client_certificates() {
    let w = World::new();
    let (addr, _stop) = w.serve_on("127.0.0.1:0").await;
    // A valid identity gets through the handshake and its hello is seen.
    transport::connect(&w.link(&addr, &w.host)).await.unwrap();
    eventually("hello", || w.collector.hellos.lock().unwrap().len() == 1).await;

    // No client certificate at all.
    let bare = {
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_file(&w.coord.ca).unwrap())
            .unwrap();
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
    };
    let mut p = w.link(&addr, &w.host);
    p.tls = Arc::new(bare);
    assert!(
        transport::connect(&p).await.is_err(),
        "a client without a certificate got a session"
    );

    // A certificate from another CA (trusting our CA for the server side).
    let other = tempdir("tls-other");
    pki::init(&other, false).unwrap();
    let foreign = pki::issue(&other, Kind::Host, "h1", 30, false).unwrap();
    let id = TlsIdentity {
        ca: w.host.ca.clone(),
        cert: foreign.cert,
        key: foreign.key,
    };
    assert!(
        transport::connect(&w.link(&addr, &id)).await.is_err(),
        "a foreign-CA client got a session"
    );

    // An expired certificate from the right CA.
    let now = time::OffsetDateTime::now_utc();
    let old = pki::issue_with_validity(
        &w.dir,
        Kind::Host,
        "expired",
        now - time::Duration::days(10),
        now - time::Duration::days(1),
        false,
    )
    .unwrap();
    let id = TlsIdentity {
        ca: w.host.ca.clone(),
        cert: old.cert,
        key: old.key,
    };
    assert!(
        transport::connect(&w.link(&addr, &id)).await.is_err(),
        "an expired client got a session"
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        w.collector.hellos.lock().unwrap().len(),
        1,
        "a refused client reached the handler"
    );
    std::fs::remove_dir_all(&other).unwrap();
}

#[tokio::test]
async fn the_hello_issuer_must_be_the_tls_peer() {
    let w = World::new();
    let (addr, _stop) = w.serve_on("127.0.0.1:0").await;
    // TLS says host:h2, the envelope keys say host:h1: transport identity is not enough,
    // and message identity must match it.
    let h2 = pki::issue(&w.dir, Kind::Host, "h2", 30, false).unwrap();
    let id = TlsIdentity {
        ca: w.host.ca.clone(),
        cert: h2.cert,
        key: h2.key,
    };
    let _ = transport::connect(&w.link(&addr, &id)).await;
    eventually("refusal audit", || w.audited("session-refused")).await;
    assert!(w.collector.hellos.lock().unwrap().is_empty());
}

fn receipt(lane: &str, generation: u64) -> mosaic::supervisor::receipt::TerminationReceipt {
    let key = mosaic::supervisor::receipt::idempotency_key(lane, "li-1", generation);
    serde_json::from_value(serde_json::json!({
        "receipt_id": format!("rcpt-{}", uuid::Uuid::new_v4().simple()), "idempotency_key": key,
        "sot_incarnation": null, "coordinator_epoch": null, "assignment_id": null, "assignment_attempt_id": null,
        "responsibility_owner": null, "execution_owner": null, "host_id": "h1", "lane_id": lane,
        "lane_incarnation_id": "li-1", "generation": generation, "runtime": "fake@1.0.0", "process_identity": null,
        "observation_source": "shim", "termination_reason": "sigkill", "exit_code": null, "signal": 9,
        "core_dumped": false, "stop": null,
        "cleanup": {"method": "cgroup-kill", "verified_empty": true, "cgroup_removed": true, "members_killed": 3, "error": null},
        "started_at": null, "observed_at": "2026-11-30T00:00:00Z", "written_at": "2026-11-30T00:00:00Z",
        "unfinished_status": true, "next_action_digest": null, "checkpoint_digest": null, "handoff_state_digest": null,
        "last_validated_progress_at": null, "last_progress_receipt_digest": null, "detail": null
    }))
    .unwrap()
}

#[tokio::test]
async fn hostile_frames_close_nothing_but_themselves() {
    let w = World::new();
    let (addr, _stop) = w.serve_on("127.0.0.1:0").await;
    let p = w.link(&addr, &w.host);
    let mut hs = transport::connect(&p).await.unwrap();
    let wrong_audience = signer("host-session")
        .sign(MessageType::Heartbeat, HOST, fields(MessageType::Heartbeat))
        .unwrap();
    for m in [
        Message::text("not json at all"),
        Message::text("{\"message_type\":\"hello\"}"),
        Message::binary(vec![0u8, 159, 146, 150]),
        Message::text(String::from_utf8(wrong_audience).unwrap()),
    ] {
        hs.ws.send(m).await.unwrap();
    }
    // The session is still up: a real receipt is processed and acknowledged.
    let r = receipt("h1:w1", 1);
    let sid = hs.session_id.clone();
    let env = mosaic::supervisor::link::receipt_outgoing(&p, &sid, &r).unwrap();
    hs.send(env, COORD).await.unwrap();
    let ack = next_text(&mut hs).await;
    assert!(ack.contains("receipt_ack"));
    for cat in ["malformed", "binary-frame", "wrong-audience"] {
        assert!(
            w.audited(cat),
            "no {cat} audit: {:?}",
            w.audit.lock().unwrap()
        );
    }
    assert_eq!(w.collector.receipts.lock().unwrap().len(), 1);
}

/// The next text frame from the coordinator (pings skipped).
async fn next_text(hs: &mut transport::HostSession) -> String {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), hs.ws.next())
            .await
            .expect("no frame within 10 s")
            .expect("session ended")
            .expect("transport error");
        match m {
            Message::Text(t) => return t.to_string(),
            Message::Close(f) => panic!("session closed: {f:?}"),
            _ => continue,
        }
    }
}

/// Reads until the session ends; returns the close reason.
async fn close_reason(hs: &mut transport::HostSession) -> String {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), hs.ws.next())
            .await
            .expect("the session was not closed within 10 s")
        {
            Some(Ok(Message::Close(f))) => {
                return f.map(|f| f.reason.to_string()).unwrap_or_default()
            }
            None | Some(Err(_)) => return String::new(),
            Some(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn an_oversized_frame_or_an_invalid_frame_flood_closes_the_session() {
    let w = World::new();
    let (addr, _stop) = w.serve_on("127.0.0.1:0").await;
    let p = w.link(&addr, &w.host);
    // One frame larger than any envelope can be.
    let mut hs = transport::connect(&p).await.unwrap();
    let _ = hs.ws.send(Message::text("x".repeat(300 * 1024))).await;
    let _ = close_reason(&mut hs).await;
    eventually("the oversized frame's session closed as abusive", || {
        w.collector
            .closed
            .lock()
            .unwrap()
            .iter()
            .any(|(r, abusive)| *abusive && r.contains("too long"))
    })
    .await;
    let r = receipt("h1:w1", 1);
    let sid = hs.session_id.clone();
    let env = mosaic::supervisor::link::receipt_outgoing(&p, &sid, &r).unwrap();
    assert!(
        hs.send(env, COORD).await.is_err() || w.collector.receipts.lock().unwrap().is_empty(),
        "the session outlived an oversized frame"
    );
    // A flood of invalid frames: past the budget the session is closed with the reason.
    let mut hs = transport::connect(&p).await.unwrap();
    for _ in 0..(transport::Limits::default().invalid_frames + 1) {
        if hs.ws.send(Message::text("not json at all")).await.is_err() {
            break;
        }
    }
    let reason = close_reason(&mut hs).await;
    assert!(
        reason.contains("invalid-frame budget"),
        "closed with {reason:?}"
    );
    assert!(w.audited("session-closed-abusive"));
    assert!(w.collector.receipts.lock().unwrap().is_empty());
}

/// The host's receipt link to `addr`, running until the returned switch flips.
fn receipt_link(
    w: &World,
    addr: &str,
    state: &Path,
    outbox: &mosaic::supervisor::outbox::Outbox,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, rx) = watch::channel(false);
    let fence = Arc::new(mosaic::supervisor::authority::AuthorityFence::load(state).unwrap());
    let link = tokio::spawn(mosaic::supervisor::link::run_receipt_link(
        w.link(addr, &w.host),
        outbox.clone(),
        fence,
        rx,
    ));
    (stop, link)
}

#[tokio::test]
async fn receipts_are_redelivered_across_a_dropped_link_until_acknowledged() {
    let w = World::new();
    let state = tempdir("link-state");
    let outbox = mosaic::supervisor::outbox::Outbox::open(&state).unwrap();
    let mut keys = Vec::new();
    for g in 1..=3 {
        let r = receipt("h1:w1", g);
        keys.push((r.idempotency_key.clone(), r.receipt_id.clone()));
        outbox.write(&r).unwrap();
    }
    // Reserve a port, then start the link before any server exists: it must keep trying.
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let (link_stop, link) = receipt_link(&w, &addr, &state, &outbox);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, stop_a) = w.serve_on(&addr).await;
    eventually("first three acknowledged", || {
        outbox.list(false).unwrap().is_empty()
    })
    .await;
    // The coordinator goes away; receipts keep being written; it comes back.
    stop_a.send(true).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for g in 4..=6 {
        let r = receipt("h1:w1", g);
        keys.push((r.idempotency_key.clone(), r.receipt_id.clone()));
        outbox.write(&r).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        outbox.list(false).unwrap().len(),
        3,
        "receipts were dropped while the link was down"
    );
    let (_, _stop_b) = w.serve_on(&addr).await;
    eventually("all acknowledged", || {
        outbox.list(false).unwrap().is_empty()
    })
    .await;
    link_stop.send(true).unwrap();
    link.await.unwrap();
    // Every receipt arrived, always as the same receipt (never rewritten), and is kept.
    let got = w.collector.receipts.lock().unwrap().clone();
    assert_eq!(got.len(), 6);
    for (key, rid) in &keys {
        let seen = got
            .get(key)
            .unwrap_or_else(|| panic!("{key} never delivered"));
        assert!(
            seen.iter().all(|x| x == rid),
            "{key} delivered with another receipt id"
        );
    }
    assert_eq!(outbox.list(true).unwrap().len(), 6);
    std::fs::remove_dir_all(&state).unwrap();
}

#[tokio::test]
async fn the_server_serves_many_concurrent_host_sessions() {
    let w = World::new();
    // 24 hosts at once, each with its own certificate and its own receipt.
    let mut tasks = Vec::new();
    for i in 0..24 {
        let issued = pki::issue(&w.dir, Kind::Host, &format!("m{i}"), 30, false).unwrap();
        let id = TlsIdentity {
            ca: w.host.ca.clone(),
            cert: issued.cert,
            key: issued.key,
        };
        let principal = format!("host:m{i}");
        let mut p = w.link("", &id);
        // Each host signs with its own session key, registered for its own principal.
        let secret = seed(&principal);
        p.signer = Arc::new(mosaic::protocol::Signer::new(
            &principal, &principal, DOMAIN, secret,
        ));
        tasks.push((principal, p));
    }
    // The server's registry must know every host key, and the coordinator's session key
    // must be allowed to address every host (its challenge and acks go to each of them).
    let mut coord_session = entry(&KEYS[1]);
    coord_session
        .audiences
        .extend(tasks.iter().map(|(principal, _)| principal.clone()));
    let mut reg = mosaic::protocol::TrustRegistry::new();
    for k in KEYS.iter().filter(|k| k.key_id != "coord-session") {
        reg.insert(entry(k)).unwrap();
    }
    reg.insert(coord_session).unwrap();
    for (principal, p) in &tasks {
        let mut e = entry(&KEYS[4]);
        e.key_id = principal.clone();
        e.principal = principal.clone();
        e.public_key = p.signer.public_key();
        reg.insert(e).unwrap();
    }
    let reg = Arc::new(reg);
    for (_, p) in tasks.iter_mut() {
        p.registry = reg.clone();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr2 = listener.local_addr().unwrap().to_string();
    let audit = w.audit.clone();
    let params = ServerParams {
        registry: mosaic::protocol::LiveRegistry::new((*reg).clone()),
        audience: COORD.into(),
        trust_domain: DOMAIN.into(),
        audit: Arc::new(move |peer: &str, cat: &Violation, _d: &str| {
            audit
                .lock()
                .unwrap()
                .push((peer.into(), cat.as_str().into()))
        }),
        signer: Arc::new(signer("coord-session")),
        liveness: Default::default(),
        limits: Default::default(),
        on_strike: None,
    };
    let (_tx, rx) = watch::channel(false);
    tokio::spawn(transport::serve(
        listener,
        transport::server_tls(&w.coord).unwrap(),
        params,
        w.collector.clone(),
        rx,
    ));
    let mut joins = Vec::new();
    for (i, (principal, mut p)) in tasks.into_iter().enumerate() {
        p.addr = addr2.clone();
        joins.push(tokio::spawn(async move {
            let _ = i;
            let mut hs = transport::connect(&p).await.unwrap();
            let r = receipt(&format!("{}:w1", principal.trim_start_matches("host:")), 1);
            let sid = hs.session_id.clone();
            let env = mosaic::supervisor::link::receipt_outgoing(&p, &sid, &r).unwrap();
            hs.send(env, COORD).await.unwrap();
            let ack = next_text(&mut hs).await;
            assert!(ack.contains("receipt_ack"));
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
    assert_eq!(w.collector.hellos.lock().unwrap().len(), 24);
    assert_eq!(w.collector.receipts.lock().unwrap().len(), 24);
}

#[tokio::test]
async fn connections_that_never_finish_a_handshake_cannot_lock_hosts_out() {
    let w = World::new();
    let (addr, _stop) = w.serve_on("127.0.0.1:0").await;
    // 200 connections from one source (127.0.0.2) that send nothing at all.
    let mut idle = Vec::new();
    for _ in 0..200 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        if let Ok(s) = sock.connect(addr.parse().unwrap()).await {
            idle.push(s);
        }
    }
    // A real host from another source gets its session at once.
    let started = std::time::Instant::now();
    let hs = tokio::time::timeout(
        Duration::from_secs(3),
        transport::connect(&w.link(&addr, &w.host)),
    )
    .await
    .expect("a host was locked out by idle connections")
    .unwrap();
    eventually("hello", || w.collector.hellos.lock().unwrap().len() == 1).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        w.audited("session-refused"),
        "{:?}",
        w.audit.lock().unwrap()
    );
    drop(hs);
    drop(idle);
}

#[tokio::test]
async fn a_peer_that_stops_reading_loses_its_session_within_the_liveness_limit() {
    let w = World::new();
    let liveness = transport::Liveness {
        interval: Duration::from_millis(200),
        limit: Duration::from_millis(600),
    };
    let (addr, _stop) = w.serve_with("127.0.0.1:0", liveness).await;
    let p = w.link(&addr, &w.host);
    let mut hs = transport::connect(&p).await.unwrap();
    let sid = hs.session_id.clone();
    // Receipts whose acknowledgements (each echoing a 60 KB key) fill every buffer between
    // the server and a client that never reads again.
    let key = "k".repeat(60_000);
    let mut sent = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline && w.collector.closed.lock().unwrap().is_empty() {
        let mut r = receipt("h1:w1", sent + 1);
        r.idempotency_key = format!("{key}{sent}");
        let env = mosaic::supervisor::link::receipt_outgoing(&p, &sid, &r).unwrap();
        if tokio::time::timeout(Duration::from_millis(500), hs.send(env, COORD))
            .await
            .map_or(true, |r| r.is_err())
        {
            break;
        }
        sent += 1;
    }
    eventually("the session ended", || {
        !w.collector.closed.lock().unwrap().is_empty()
    })
    .await;
    // Whichever bound trips first — our write to a peer that does not read, or that peer
    // falling silent once its own sends block — the session ends; without the write bound
    // the session task would hang in the write and never get to either.
    let closed = w.collector.closed.lock().unwrap().clone();
    assert!(
        closed
            .iter()
            .any(|(r, _)| r.contains("did not read") || r.contains("peer silent")),
        "closed for {closed:?} after {sent} receipts"
    );
}

/// A backlog of receipts larger than the coordinator's frame burst drains without the
/// session being closed as abusive: the link paces receipts to half the session's budget.
/// It sent the whole backlog at once, and past the burst every reconnect was closed again.
#[tokio::test]
async fn a_receipt_backlog_past_the_frame_burst_drains_without_an_abusive_close() {
    let w = World::new();
    let state = tempdir("link-backlog");
    let outbox = mosaic::supervisor::outbox::Outbox::open(&state).unwrap();
    // Twice the burst: unpaced, the collector (which answers at once) took them at about
    // 700 a second, past the burst after ~3000 whatever the sustained rate gave back.
    let n = 2 * u64::from(transport::Limits::default().burst);
    for g in 1..=n {
        outbox.write(&receipt("h1:w1", g)).unwrap();
    }
    let addr = format!("127.0.0.1:{}", common::free_port());
    let (_, _stop) = w.serve_on(&addr).await;
    let (link_stop, link) = receipt_link(&w, &addr, &state, &outbox);
    // Paced, the last of them goes out about (n - burst/2) / (rate/2) seconds in.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !outbox.list(false).unwrap().is_empty() {
        let abusive: Vec<String> = w
            .collector
            .closed
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, abusive)| *abusive)
            .map(|(r, _)| r.clone())
            .collect();
        assert!(
            abusive.is_empty(),
            "the host's session was closed as abusive: {abusive:?}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} receipts still unacknowledged",
            outbox.list(false).unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !w.collector
            .closed
            .lock()
            .unwrap()
            .iter()
            .any(|(_, abusive)| *abusive),
        "the host's session was closed as abusive"
    );
    assert_eq!(w.collector.receipts.lock().unwrap().len() as u64, n);
    link_stop.send(true).unwrap();
    let _ = link.await;
}
