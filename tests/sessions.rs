//! Host sessions under attack (spec §5.3, §7, §12, §16): a real coordinator and a real
//! supervisor (host A) as separate processes on a real PostgreSQL, and a raw client that
//! holds a real enrolled host's certificate and keys — host B's, which no supervisor uses,
//! or host A's own. It can do anything that host could; it must not be able to act for
//! another host, displace a live session, replay what was said, or flood its way to
//! anything but its own disconnection.

mod common;
mod pg;
mod world;

use std::path::PathBuf;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use mosaic::coordinator::service::{operator_call, OpError, OperatorRequest};
use mosaic::protocol::canonical::Value;
use mosaic::protocol::envelope::{n, s};
use mosaic::protocol::messages::{ChainAuthority, Digests, ToHost};
use mosaic::protocol::schema::MessageType;
use mosaic::protocol::transport::{self, HostSession, LinkParams, Outgoing, TlsIdentity};
use mosaic::protocol::{verify, Envelope, Signer, TrustRegistry, Verified, VerifyContext};
use serde_json::Value as Json;
use tokio_tungstenite::tungstenite::Message;

const COORD: &str = "coordinator:main";

/// The world of these tests: two provisioned hosts (A runs a real supervisor with two lanes;
/// B exists only as certificates and keys, for raw sessions), one coordinator.
struct World {
    w: world::World,
    /// A proxy between host A and the coordinator that can go silent (no FIN).
    proxy: Option<Blackhole>,
}

impl std::ops::Deref for World {
    type Target = world::World;
    fn deref(&self) -> &world::World {
        &self.w
    }
}

impl std::ops::DerefMut for World {
    fn deref_mut(&mut self) -> &mut world::World {
        &mut self.w
    }
}

#[derive(Default)]
struct Opts {
    heartbeat_ms: Option<u64>,
    via_proxy: bool,
}

impl World {
    fn new(o: Opts) -> Self {
        let mut w = world::World::new(world::Spec {
            hosts: 2,
            supervisors: 1,
            coordinators: 1,
            lanes: 2,
            heartbeat_ms: o.heartbeat_ms,
            tag: "sess",
            ..world::Spec::default()
        });
        let proxy = o.via_proxy.then(|| Blackhole::start(&w.listen[0]));
        if let Some(p) = &proxy {
            w.write_supervisor_config(0, &[format!("127.0.0.1:{}", p.port)]);
        }
        w.start_coordinator(0, None);
        w.wait_leading(0);
        w.start_supervisor(0);
        w.wait_lanes(2);
        Self { w, proxy }
    }

    /// The coordinator's operator socket.
    fn operator_socket(&self) -> PathBuf {
        self.socket(0)
    }

    fn assign(&self, lane: &str, task: &str, wait: bool) -> Result<Json, OpError> {
        self.assign_to(lane, task, wait)
    }

    fn stop(&self, assignment: &str) -> Json {
        self.op(&OperatorRequest::Stop {
            assignment_id: assignment.into(),
            outcome: None,
            evidence_digest: None,
            wait: true,
            request_id: None,
        })
        .unwrap()
    }

    fn lane(&self, host: usize, n: &str) -> String {
        self.lane_of(host, n)
    }

    /// Everything that says where authority stands, to compare before and after an attack.
    async fn authority_snapshot(&self) -> Vec<String> {
        let c = self.sql().await;
        let mut out = Vec::new();
        for q in [
            "SELECT count(*)::text FROM transition_receipts",
            "SELECT count(*)::text FROM termination_receipts",
            "SELECT string_agg(lane_incarnation_id || '=' || state, ',' ORDER BY lane_incarnation_id) FROM lane_incarnations",
            "SELECT string_agg(assignment_id || '=' || lifecycle, ',' ORDER BY assignment_id) FROM assignments",
            "SELECT count(*)::text FROM leases WHERE released_at IS NULL",
        ] {
            out.push(
                c.query_one(q, &[])
                    .await
                    .unwrap()
                    .get::<_, Option<String>>(0)
                    .unwrap_or_default(),
            );
        }
        out
    }

    /// Link parameters for a raw client holding host `i`'s certificate and keys, reporting
    /// `lanes` (`lane@incarnation`).
    fn raw(&self, i: usize, lanes: Vec<String>) -> (LinkParams, Arc<Signer>) {
        let l = &self.prov.links[i];
        let principal = format!("host:{}", self.hosts[i]);
        let seed = |p: &PathBuf| mosaic::coordinator::service::read_seed(p).unwrap();
        let registry =
            TrustRegistry::from_toml(&std::fs::read_to_string(&l.trust_registry).unwrap()).unwrap();
        let p = LinkParams {
            addr: self.listen[0].clone(),
            fallback_addrs: vec![],
            server_name: l.server_name.clone(),
            coordinator: COORD.into(),
            tls: transport::client_tls(&TlsIdentity {
                ca: l.ca.clone(),
                cert: l.cert.clone(),
                key: l.key.clone(),
            })
            .unwrap(),
            signer: Arc::new(Signer::new(
                &format!("{principal}/session"),
                &principal,
                &l.trust_domain,
                seed(&l.session_key),
            )),
            registry: Arc::new(registry),
            trust_domain: l.trust_domain.clone(),
            host_id: self.hosts[i].clone(),
            lanes,
            report: Default::default(),
            runtimes: vec!["fake@1.0.0".into()],
            liveness: Default::default(),
            max_clock_skew_ms: mosaic::protocol::transport::ClockSkew::DEFAULT_TOLERANCE_MS,
        };
        let ordinary = Arc::new(Signer::new(
            &format!("{principal}/ordinary"),
            &principal,
            &l.trust_domain,
            seed(&l.ordinary_key),
        ));
        (p, ordinary)
    }

    /// Host B played by a raw client with one lane of its own (`lane-x`, a fresh
    /// incarnation): its link parameters, signer and open session, once the coordinator
    /// has registered the lane; and the lane's id.
    async fn raw_lane(&self) -> (LinkParams, Arc<Signer>, HostSession, String) {
        let inc = incarnation();
        let (p, ordinary) = self.raw(1, vec![format!("lane-x@{inc}")]);
        let hs = transport::connect(&p).await.unwrap();
        let lane = self.lane(1, "lane-x");
        common::wait_until("B's lane registered", || {
            self.op(&OperatorRequest::Lanes)
                .ok()?
                .as_array()?
                .iter()
                .any(|l| l["lane_id"] == lane.as_str())
                .then_some(())
        });
        (p, ordinary, hs, lane)
    }

    fn coordinator_rss_kb(&self) -> u64 {
        let pid = self.coordinator_pid(0);
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        st.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

/// A TCP proxy that forwards new connections and can make every existing one go silent:
/// bytes stop flowing both ways, but no FIN or RST is ever sent (a cable pulled).
struct Blackhole {
    port: u16,
    silent: Arc<std::sync::atomic::AtomicU64>,
}

impl Blackhole {
    fn start(target: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // Connections accepted before this generation number are silenced.
        let silent = Arc::new(AtomicU64::new(0));
        let (target, sil) = (target.to_string(), silent.clone());
        std::thread::spawn(move || {
            let mut next = 1u64;
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { return };
                let Ok(outbound) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                let me = next;
                next += 1;
                for (mut from, mut to) in [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound, inbound),
                ] {
                    let sil = sil.clone();
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buf = [0u8; 16384];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if me <= sil.load(Ordering::SeqCst) {
                                // Swallow everything, keep both sockets open forever.
                                std::thread::park();
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Self { port, silent }
    }

    /// Silences the first `n` connections it accepted (later ones keep flowing).
    fn silence_up_to(&self, n: u64) {
        self.silent.store(n, std::sync::atomic::Ordering::SeqCst);
    }
}

fn ctx<'a>(p: &'a LinkParams) -> VerifyContext<'a> {
    VerifyContext {
        registry: &p.registry,
        audience: &p.signer.principal,
        trust_domain: &p.trust_domain,
        now: std::time::SystemTime::now(),
    }
}

/// The next coordinator envelope of one of `types` on the raw session (others skipped).
async fn next_of(
    hs: &mut HostSession,
    p: &LinkParams,
    types: &[MessageType],
) -> Envelope<Verified> {
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let m = tokio::time::timeout_at(deadline, hs.ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {types:?} from the coordinator"))
            .expect("session ended")
            .expect("transport error");
        if let Message::Text(t) = m {
            let env = verify(t.as_bytes(), &ctx(p)).unwrap();
            if types.contains(&env.message_type()) {
                return env;
            }
        }
    }
}

/// A coordinator message as the host's link converts it.
fn typed(env: &Envelope<Verified>) -> ToHost {
    ToHost::decode(env)
        .expect("a well-formed coordinator message")
        .expect("a message the coordinator sends hosts")
}

/// The chain authority a coordinator message carries.
fn authority(env: &Envelope<Verified>) -> ChainAuthority {
    typed(env).authority().expect("an ordinary message").clone()
}

/// The contract digests of a `contract`.
fn contract_digests(env: &Envelope<Verified>) -> Digests {
    match typed(env) {
        ToHost::Contract(c) => c.digests,
        other => panic!("not a contract: {other:?}"),
    }
}

/// The verdict of a `receipt_ack`, as its wire text.
fn verdict_text(env: &Envelope<Verified>) -> String {
    match typed(env) {
        ToHost::ReceiptAck(a) => a.verdict.encode(),
        other => panic!("not a receipt ack: {other:?}"),
    }
}

/// The fields a host repeats from the stage (as `coordinated.rs` builds them).
fn chain_fields(stage: &Envelope<Verified>) -> Vec<(&'static str, Value)> {
    let a = authority(stage);
    vec![
        ("sot_incarnation", s(&a.sot_incarnation)),
        ("coordinator_epoch", n(a.coordinator_epoch)),
        ("assignment_id", s(&a.assignment_id)),
        ("lane_id", s(&a.lane_id)),
        ("lane_incarnation_id", s(&a.lane_incarnation_id)),
        ("assignment_attempt_id", s(&a.assignment_attempt_id)),
        ("reservation_id", s(&a.reservation_id)),
        ("generation", n(a.generation)),
        ("fence_proof", s(&a.fence_proof)),
    ]
}

fn identity() -> Value {
    Value::Object(vec![
        ("boot_id".into(), s("7c05100e-bed7-4ad1-a9a2-95904c9be726")),
        ("cgroup_id".into(), n(158)),
        ("cgroup_path".into(), s("/raw/client")),
        ("exe_dev".into(), n(1)),
        ("exe_ino".into(), n(2)),
        ("launch_nonce_digest".into(), s(&"ab".repeat(32))),
        ("root_pid".into(), n(4242)),
        ("root_start_time".into(), n(4243)),
    ])
}

fn incarnation() -> String {
    format!("li-{}", uuid::Uuid::new_v4().simple())
}

/// The chain row of host A's RUNNING `lane` as an attacker who knows every id would
/// address it.
async fn chain_of(w: &World, lane: &str) -> Json {
    let c = w.sql().await;
    let r = c
        .query_one(
            "SELECT r.reservation_id, r.lane_incarnation_id, r.assignment_id, r.assignment_attempt_id, \
                    g.generation, (SELECT sot_incarnation FROM leadership) \
             FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) \
             JOIN generations g ON g.reservation_id = r.reservation_id \
             WHERE li.lane_id = $1 AND li.retired_at IS NULL AND r.released_at IS NULL",
            &[&lane],
        )
        .await
        .unwrap();
    serde_json::json!({
        "reservation_id": r.get::<_, String>(0), "lane_incarnation_id": r.get::<_, String>(1),
        "assignment_id": r.get::<_, String>(2), "assignment_attempt_id": r.get::<_, String>(3),
        "generation": r.get::<_, i64>(4), "sot": r.get::<_, String>(5),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn another_hosts_credentials_cannot_act_for_a_hosts_lanes() {
    let w = World::new(Opts::default());
    let lane = w.lane(0, "lane-1");
    let running = w.assign(&lane, "hang", true).unwrap();
    assert_eq!(running["state"], "RUNNING");
    let ch = chain_of(&w, &lane).await;
    let epoch = w.status()["coordinator_epoch"].as_u64().unwrap();

    // Host B, with its own valid session, speaks about host A's chain.
    let (p, ordinary) = w.raw(1, vec![]);
    let mut hs = transport::connect(&p).await.unwrap();
    let before = w.authority_snapshot().await;
    let chain = || -> Vec<(&'static str, Value)> {
        vec![
            ("sot_incarnation", s(ch["sot"].as_str().unwrap())),
            ("coordinator_epoch", n(epoch)),
            ("assignment_id", s(ch["assignment_id"].as_str().unwrap())),
            ("lane_id", s(&lane)),
            (
                "lane_incarnation_id",
                s(ch["lane_incarnation_id"].as_str().unwrap()),
            ),
            (
                "assignment_attempt_id",
                s(ch["assignment_attempt_id"].as_str().unwrap()),
            ),
            ("reservation_id", s(ch["reservation_id"].as_str().unwrap())),
            ("generation", n(ch["generation"].as_u64().unwrap())),
            ("fence_proof", s(&format!("fc1:{}", "0".repeat(64)))),
        ]
    };
    let mut staged = chain();
    staged.extend([
        ("idempotency_key", s("forged-staged")),
        ("process_identity", identity()),
    ]);
    hs.send(Outgoing::new(&ordinary, MessageType::Staged, staged), COORD)
        .await
        .unwrap();
    let digest = || s(&format!("sha256:{}", "c".repeat(64)));
    let post = |extra: Vec<(&'static str, Value)>| {
        let mut f = chain();
        f.extend([
            ("reservation_epoch", n(1)),
            ("reservation_deadline", s("2099-01-01T00:00:00.000000Z")),
            ("runtime_id", s("fake@1.0.0")),
            ("contracts_digest", digest()),
            ("scope_digest", digest()),
            ("holds_digest", digest()),
        ]);
        f.extend(extra);
        f
    };
    hs.send(
        Outgoing::new(
            &ordinary,
            MessageType::Injected,
            post(vec![
                ("idempotency_key", s("forged-injected")),
                ("delivered_contracts_digest", digest()),
                ("process_identity", identity()),
            ]),
        ),
        COORD,
    )
    .await
    .unwrap();
    hs.send(
        Outgoing::new(
            &ordinary,
            MessageType::Ack,
            post(vec![
                ("idempotency_key", s("forged-ack")),
                ("challenge_id", s("ch-forged")),
                ("process_identity", identity()),
            ]),
        ),
        COORD,
    )
    .await
    .unwrap();
    // A termination receipt for host A's generation — and one for a lane of B's own whose
    // body speaks of host A's lane.
    let b_session = hs.session_id.clone();
    let receipt = |lane_id: &str, body_lane: &str, key: &str| -> Outgoing {
        let body = serde_json::json!({
            "receipt_id": format!("rcpt-{key}"), "idempotency_key": key, "host_id": w.hosts[1],
            "lane_id": body_lane, "lane_incarnation_id": ch["lane_incarnation_id"],
            "generation": ch["generation"], "termination_reason": "sigkill",
            "cleanup": {"method": "cgroup-kill", "verified_empty": true, "cgroup_removed": true, "members_killed": 1, "error": null},
        });
        Outgoing::new(
            &p.signer,
            MessageType::Receipt,
            vec![
                ("idempotency_key", s(key)),
                ("sot_incarnation", Value::Null),
                ("coordinator_epoch", Value::Null),
                ("assignment_id", Value::Null),
                ("session_id", s(&b_session)),
                ("lane_id", s(lane_id)),
                (
                    "lane_incarnation_id",
                    s(ch["lane_incarnation_id"].as_str().unwrap()),
                ),
                ("generation", n(ch["generation"].as_u64().unwrap())),
                ("receipt_idempotency_key", s(key)),
                (
                    "receipt",
                    mosaic::protocol::canonical::from_json(&body).unwrap(),
                ),
            ],
        )
    };
    hs.send(receipt(&lane, &lane, "tr-forged-1"), COORD)
        .await
        .unwrap();
    let verdict = next_of(&mut hs, &p, &[MessageType::ReceiptAck]).await;
    assert_eq!(verdict_text(&verdict), "refused:not-owner");
    let own = w.lane(1, "lane-x");
    hs.send(receipt(&own, &lane, "tr-forged-2"), COORD)
        .await
        .unwrap();
    let verdict = next_of(&mut hs, &p, &[MessageType::ReceiptAck]).await;
    assert_eq!(verdict_text(&verdict), "refused:mismatch");

    // Every message refused and audited; nothing about authority changed.
    common::wait_until("four refusals audited as not-owner", || {
        (w.audited(&format!("host:{}", w.hosts[1])) >= 4).then_some(())
    });
    let audit = w.op(&OperatorRequest::Audit { since: 0 }).unwrap();
    for op in ["host-staged", "host-injected", "host-ack", "host-receipt"] {
        assert!(
            audit
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["operation"] == op
                    && (r["category"] == "not-owner" || r["category"] == "mismatch")),
            "no refusal of {op} audited: {audit}"
        );
    }
    assert_eq!(
        w.authority_snapshot().await,
        before,
        "an attack changed authority"
    );
    assert!(
        !audit.to_string().contains("hang"),
        "task text reached the audit log"
    );
    // Host A's work is untouched and still answers to its operator.
    let st = w.status();
    assert!(st["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l["lane_id"] == lane.as_str() && l["state"] == "RUNNING"));
    assert_eq!(
        w.stop(running["assignment_id"].as_str().unwrap())["state"],
        "CANCELLED"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_session_or_a_replayed_hello_cannot_displace_the_live_one() {
    let w = World::new(Opts::default());
    let lane = w.lane(0, "lane-1");
    let running = w.assign(&lane, "hang", true).unwrap();
    let epoch_of = |h: &str| -> Option<i64> {
        w.status()["host_sessions"]
            .as_array()?
            .iter()
            .find(|s| s["host_id"] == h)?["session_epoch"]
            .as_i64()
    };
    let a_epoch = epoch_of(&w.hosts[0]).unwrap();

    // Host A's own credentials, a second session while the supervisor's is alive: refused.
    let (pa, _) = w.raw(0, vec![]);
    let e = transport::connect(&pa)
        .await
        .err()
        .expect("a second session of host A was admitted");
    assert!(e.to_string().contains("has a live session"), "{e}");

    // Host B opens a session; a second hello on it is refused and audited.
    let (pb, _) = w.raw(1, vec![]);
    let mut hs = transport::connect(&pb).await.unwrap();
    let sid = hs.session_id.clone();
    hs.send(
        transport::report_outgoing(&pb, &sid, &[], &Default::default()).unwrap(),
        COORD,
    )
    .await
    .unwrap();
    let hello_again = Outgoing::new(
        &pb.signer,
        MessageType::Hello,
        vec![
            ("idempotency_key", s("hello-again")),
            ("sot_incarnation", Value::Null),
            ("coordinator_epoch", Value::Null),
            ("assignment_id", Value::Null),
            ("session_id", s(&sid)),
            ("host_id", s(&w.hosts[1])),
        ],
    );
    hs.send(hello_again, COORD).await.unwrap();
    common::wait_until("second hello audited", || {
        (w.audited("second-hello") >= 1).then_some(())
    });
    // The hello B would send on this session, recorded; the session ends; the recording is
    // replayed as the first frame of a new connection: it answers another challenge.
    let recorded = transport::Sequencer::new(&sid)
        .seal(
            Outgoing::new(
                &pb.signer,
                MessageType::Hello,
                vec![
                    ("idempotency_key", s("recorded")),
                    ("sot_incarnation", Value::Null),
                    ("coordinator_epoch", Value::Null),
                    ("assignment_id", Value::Null),
                    ("session_id", s(&sid)),
                    ("host_id", s(&w.hosts[1])),
                ],
            ),
            COORD,
        )
        .unwrap();
    let _ = hs.ws.close(None).await;
    common::wait_until("B's session gone", || {
        (!w.status()["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == format!("host:{}", w.hosts[1]).as_str()))
        .then_some(())
    });
    let (mut ws, challenge) = transport::open(&pb, &w.listen[0]).await.unwrap();
    assert_ne!(challenge.session_id().unwrap(), sid);
    ws.send(Message::text(String::from_utf8(recorded).unwrap()))
        .await
        .unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Close(f) = m {
                return f.map(|f| f.reason.to_string()).unwrap_or_default();
            }
        }
        String::new()
    })
    .await
    .unwrap();
    assert!(closed.contains("hello refused"), "{closed:?}");
    common::wait_until("replayed hello audited", || {
        (w.audited("session challenge (replayed?)") >= 1).then_some(())
    });

    // The real session never moved, its RUNNING work is untouched, new work still runs.
    assert_eq!(epoch_of(&w.hosts[0]), Some(a_epoch));
    let second = w.assign(&w.lane(0, "lane-2"), "hang", true).unwrap();
    assert_eq!(second["state"], "RUNNING");
    for a in [&running, &second] {
        assert_eq!(
            w.stop(a["assignment_id"].as_str().unwrap())["state"],
            "CANCELLED"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_host_envelope_is_refused_on_the_same_and_on_another_session() {
    let w = World::new(Opts::default());
    // Host B, played by the raw client, with a lane of its own; an operator assigns it.
    let (p, ordinary, mut hs, lane) = w.raw_lane().await;
    let a = w.assign(&lane, "hang", false).unwrap();
    let stage = next_of(&mut hs, &p, &[MessageType::Stage]).await;
    let seal = |hs: &mut HostSession, t: MessageType, extra: Vec<(&'static str, Value)>| {
        let mut f = chain_fields(&stage);
        f.extend(extra);
        hs.seq.seal(Outgoing::new(&ordinary, t, f), COORD).unwrap()
    };
    let send = |bytes: &Vec<u8>| Message::text(String::from_utf8(bytes.clone()).unwrap());
    let staged = seal(
        &mut hs,
        MessageType::Staged,
        vec![
            ("idempotency_key", s("staged-1")),
            ("process_identity", identity()),
        ],
    );
    hs.ws.send(send(&staged)).await.unwrap();
    let contract = next_of(&mut hs, &p, &[MessageType::Contract]).await;
    // Replayed on the same session: refused before anything reads it.
    hs.ws.send(send(&staged)).await.unwrap();
    let mut post = vec![
        ("reservation_epoch", n(authority(&stage).reservation_epoch)),
        (
            "reservation_deadline",
            s(&authority(&stage).reservation_deadline),
        ),
        ("runtime_id", s(&authority(&stage).runtime_id)),
        (
            "contracts_digest",
            s(&contract_digests(&contract).contracts_digest),
        ),
        ("scope_digest", s(&contract_digests(&contract).scope_digest)),
        ("holds_digest", s(&contract_digests(&contract).holds_digest)),
    ];
    let mut f = post.clone();
    f.extend([
        ("idempotency_key", s("injected-1")),
        (
            "delivered_contracts_digest",
            s(&contract_digests(&contract).contracts_digest),
        ),
        ("process_identity", identity()),
    ]);
    let injected = seal(&mut hs, MessageType::Injected, f);
    hs.ws.send(send(&injected)).await.unwrap();
    // The next thing the coordinator says is the challenge: the replayed `staged` got no
    // second contract (frames on a session are ordered).
    let next = next_of(
        &mut hs,
        &p,
        &[MessageType::Contract, MessageType::Challenge],
    )
    .await;
    assert_eq!(
        next.message_type(),
        MessageType::Challenge,
        "a replay re-issued the contract"
    );
    hs.ws.send(send(&injected)).await.unwrap();
    post.extend([
        ("idempotency_key", s("ack-1")),
        (
            "challenge_id",
            s(&match typed(&next) {
                ToHost::Challenge(c) => c.challenge_id,
                other => panic!("not a challenge: {other:?}"),
            }),
        ),
        ("process_identity", identity()),
    ]);
    let ack = seal(&mut hs, MessageType::Ack, post);
    hs.ws.send(send(&ack)).await.unwrap();
    let activated = next_of(&mut hs, &p, &[MessageType::Control, MessageType::Challenge]).await;
    assert!(
        matches!(typed(&activated), ToHost::Activate(_)),
        "{:?}",
        activated.message_type()
    );
    hs.ws.send(send(&ack)).await.unwrap();
    common::wait_until("three replays refused on the same session", || {
        (w.audited("replayed") >= 3).then_some(())
    });
    let snapshot = w.authority_snapshot().await;

    // The same bytes on a new session of the same host: refused as another session's.
    let _ = hs.ws.close(None).await;
    let mut hs2 = common_retry_connect(&p).await;
    for bytes in [&staged, &injected, &ack] {
        hs2.ws.send(send(bytes)).await.unwrap();
    }
    common::wait_until("three replays refused on another session", || {
        (w.audited("other-session") >= 3).then_some(())
    });
    assert_eq!(
        w.authority_snapshot().await,
        snapshot,
        "a replay changed authority"
    );
    for (op, n) in [
        ("staged", 1),
        ("injected", 1),
        ("consume-ack", 1),
        ("activate", 1),
    ] {
        assert_eq!(
            w.count(&format!(
                "SELECT count(*) FROM transition_receipts WHERE transition = '{op}' AND assignment_id = '{}'",
                a["assignment_id"].as_str().unwrap()
            ))
            .await,
            n,
            "{op} decided more than once"
        );
    }
    assert_eq!(w.count("SELECT count(*) FROM ack_receipts").await, 1);
}

/// A chain waiting for its host is sent its message once per session (issue 22): any
/// other caller that finds it waiting sends nothing more. Here the operator's `assign` is
/// held right after its reservation commits; the watchdog drives the chain meanwhile and
/// sends the stage; released, the operator's own drive finds the chain waiting and must
/// not send it again. Only the watchdog's resend, `RESEND_AFTER` (5 s) after the first,
/// sends it again, and it still does.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_chains_message_is_sent_once_per_session_until_its_resend() {
    let mut w = World::new(Opts::default());
    let go = w.dir.join("go-reserve");
    w.crash_coordinator(0);
    w.start_coordinator(
        0,
        Some(&format!(
            "hold-after-commit:reserve=1*return({})",
            go.display()
        )),
    );
    w.wait_leading(0);
    let (p, _ordinary, mut hs, lane) = w.raw_lane().await;
    let (sock, req) = (
        w.operator_socket(),
        world::assign_request(&lane, "hang", None, false),
    );
    let held = std::thread::spawn(move || operator_call(&sock, &req));
    // The watchdog's stage, while the operator's request is held.
    let stage = next_of(&mut hs, &p, &[MessageType::Stage]).await;
    std::fs::write(&go, b"").unwrap();
    let answered = held.join().unwrap().unwrap();
    let received = Instant::now();
    assert_eq!(
        authority(&stage).reservation_id,
        answered["reservation_id"].as_str().unwrap()
    );
    let resent = next_of(&mut hs, &p, &[MessageType::Stage]).await;
    assert_eq!(
        authority(&resent).reservation_id,
        authority(&stage).reservation_id
    );
    // The operator's duplicate would arrive at once; the resend only once the first is
    // `RESEND_AFTER` old (measured here from after the operator's answer).
    assert!(
        received.elapsed() >= Duration::from_secs(3),
        "a second stage {:?} after the operator's answer: a duplicate, not the watchdog's resend",
        received.elapsed()
    );
}

/// Connects, retrying while the coordinator still sees the previous session as live.
async fn common_retry_connect(p: &LinkParams) -> HostSession {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        match transport::connect(p).await {
            Ok(hs) => return hs,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot reconnect: {e}"),
        }
    }
}

/// Writes `frames` as fast as the session takes them (stopping at the first write error),
/// then returns how many were written and the coordinator's close reason.
async fn blast(hs: &mut HostSession, frames: impl Iterator<Item = Message>) -> (u64, String) {
    let mut sent = 0u64;
    for m in frames {
        if hs.ws.feed(m).await.is_err() {
            break;
        }
        sent += 1;
        if sent % 256 == 0 && hs.ws.flush().await.is_err() {
            break;
        }
    }
    let _ = hs.ws.flush().await;
    (sent, close_reason(hs).await)
}

/// Reads until the coordinator ends the session; its close reason (or the error).
async fn close_reason(hs: &mut HostSession) -> String {
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = hs.ws.next().await {
            match m {
                Ok(Message::Close(f)) => {
                    return f.map(|f| f.reason.to_string()).unwrap_or_default()
                }
                Ok(_) => continue,
                Err(e) => return e.to_string(),
            }
        }
        String::new()
    })
    .await
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_costs_only_the_flooding_session() {
    let w = World::new(Opts::default());
    let baseline = w.coordinator_rss_kb();
    let (p, _) = w.raw(1, vec![]);

    // Valid, signed frames past the session's rate: closed for its rate.
    let mut hs = transport::connect(&p).await.unwrap();
    let sid = hs.session_id.clone();
    let heartbeats: Vec<Message> = (0..5000)
        .map(|i| {
            let bytes = hs
                .seq
                .seal(
                    Outgoing::new(
                        &p.signer,
                        MessageType::Heartbeat,
                        vec![
                            ("idempotency_key", s(&format!("hb-{i}"))),
                            ("sot_incarnation", Value::Null),
                            ("coordinator_epoch", Value::Null),
                            ("assignment_id", Value::Null),
                            ("session_id", s(&sid)),
                        ],
                    ),
                    COORD,
                )
                .unwrap();
            Message::text(String::from_utf8(bytes).unwrap())
        })
        .collect();
    let (_, reason) = blast(&mut hs, heartbeats.into_iter()).await;
    assert!(reason.contains("frame rate"), "closed for {reason:?}");

    // Then, once let back in, 100 000 invalid frames on one authenticated session, while
    // host A's work goes on.
    let mut hs = common_retry_connect(&p).await;
    let lane = w.lane(0, "lane-1");
    let assign = {
        let sock = w.operator_socket();
        let req = OperatorRequest::Assign {
            lane_id: lane.clone(),
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
        };
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            operator_call(&sock, &req)
        })
    };
    let junk = Message::text("{\"message_type\":\"hello\",\"x\":1}");
    let (sent, reason) = blast(&mut hs, std::iter::repeat_n(junk, 100_000)).await;
    assert!(
        reason.contains("invalid-frame budget"),
        "closed for {reason:?} after {sent} frames"
    );
    let during = assign.join().unwrap().unwrap();
    assert_eq!(
        during["state"], "RUNNING",
        "an assign during the flood did not run"
    );

    let st = w.status();
    assert_eq!(
        st["leadership"]["losses"], 0,
        "the flood cost leadership: {st}"
    );
    assert_eq!(st["leadership"]["state"], "leading");
    // Audit stayed bounded: a few rows per session and reason, not one per frame.
    let rows = w.op(&OperatorRequest::Audit { since: 0 }).unwrap();
    let wire = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["operation"] == "wire")
        .count();
    assert!(
        wire <= 16,
        "{wire} wire audit rows for two flooding sessions"
    );
    // Memory: bounded by the per-session limits, not by the flood. The bound is the
    // baseline plus 64 MiB of slack for allocator and pool growth; the unbounded behaviour
    // this guards against grew by more than 200 MB.
    let rss = w.coordinator_rss_kb();
    assert!(
        rss < baseline + 64 * 1024,
        "coordinator RSS {rss} kB after the flood (baseline {baseline} kB)"
    );
    eprintln!("flood: {sent} frames written; coordinator RSS {baseline} → {rss} kB; {wire} wire audit rows");
    // Host B was told to back off: right after its abusive session it is refused.
    let e = transport::connect(&p)
        .await
        .err()
        .expect("B was let back in at once");
    assert!(e.to_string().contains("abusing its session"), "{e}");
    assert_eq!(
        w.stop(during["assignment_id"].as_str().unwrap())["state"],
        "CANCELLED"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_gone_silent_without_a_fin_is_detected_and_the_host_reconnects() {
    let w = World::new(Opts {
        heartbeat_ms: Some(300),
        via_proxy: true,
    });
    let lane = w.lane(0, "lane-1");
    let running = w.assign(&lane, "hang", true).unwrap();
    let first = w.status()["host_sessions"][0]["session_epoch"]
        .as_i64()
        .unwrap();
    // The one proxied connection so far goes silent; new ones flow.
    w.proxy.as_ref().unwrap().silence_up_to(1);
    let st = common::wait_until("host A back on a new session", || {
        let st = w.status();
        let s = st["host_sessions"]
            .as_array()?
            .iter()
            .find(|s| s["host_id"] == w.hosts[0].as_str())?
            .clone();
        (s["session_epoch"].as_i64()? > first).then_some(st)
    });
    assert_eq!(st["leadership"]["losses"], 0);
    let reason: String = w
        .sql()
        .await
        .query_one(
            "SELECT close_reason FROM host_sessions WHERE host_id = $1 AND session_epoch = $2",
            &[&w.hosts[0], &first],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        reason.contains("silent"),
        "old session closed for {reason:?}"
    );
    // The host's work survived the outage and its lanes answer again.
    let second = w.assign(&w.lane(0, "lane-2"), "hang", true).unwrap();
    assert_eq!(second["state"], "RUNNING");
    for a in [&running, &second] {
        assert_eq!(
            w.stop(a["assignment_id"].as_str().unwrap())["state"],
            "CANCELLED"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_names_cycling_sessions_and_a_host_that_refuses_the_coordinator_cost_nothing() {
    let w = World::new(Opts::default());
    let lanes_before = w.op(&OperatorRequest::Lanes).unwrap();
    // Lane names and identifiers as no host makes them: refused, nothing adopted, nothing
    // echoed into the log.
    let bad = [
        format!("../../etc@{}", incarnation()),
        format!("a b@{}", incarnation()),
        format!("{}@{}", "x".repeat(5000), incarnation()),
        "lane-1@li-nothex".to_string(),
    ];
    for lane in bad {
        let (p, _) = w.raw(1, vec![lane]);
        // The session opens; the hello's report is refused and the session closed.
        let mut hs = common_retry_connect(&p).await;
        let reason = close_reason(&mut hs).await;
        assert!(reason.contains("hello refused"), "{reason:?}");
        // Penalized as abusive: wait it out before the next attempt.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let key = "K".repeat(60_000);
    let (p, _) = w.raw(1, vec![]);
    let mut hs = common_retry_connect(&p).await;
    let sid = hs.session_id.clone();
    hs.send(
        Outgoing::new(
            &p.signer,
            MessageType::Receipt,
            vec![
                ("idempotency_key", s("r")),
                ("sot_incarnation", Value::Null),
                ("coordinator_epoch", Value::Null),
                ("assignment_id", Value::Null),
                ("session_id", s(&sid)),
                ("lane_id", s(&w.lane(1, "lane-x"))),
                ("lane_incarnation_id", s(&incarnation())),
                ("generation", n(1)),
                ("receipt_idempotency_key", s(&key)),
                ("receipt", Value::Object(vec![])),
            ],
        ),
        COORD,
    )
    .await
    .unwrap();
    common::wait_until("the malformed reports and key refused", || {
        (w.audited("malformed-receipt_idempotency_key") >= 1 && w.audited("refused-bad-input") >= 1)
            .then_some(())
    });
    let _ = hs.ws.close(None).await;
    assert_eq!(
        w.op(&OperatorRequest::Lanes).unwrap(),
        lanes_before,
        "a malformed lane was adopted"
    );
    let log = std::fs::read_to_string(w.coordinator_log(0)).unwrap();
    assert!(
        !log.contains(&key[..100]),
        "an attacker's key reached the log"
    );
    assert!(
        !log.contains("../../etc"),
        "an attacker's lane name reached the log"
    );

    // Cycling sessions: past 30 a minute, the host is refused until the minute rolls on.
    // (A session the coordinator refuses only after the hello still looks opened to the
    // client, so attempts are bounded rather than admissions counted.)
    let mut refused = None;
    for _ in 0..120 {
        match transport::connect(&p).await {
            Ok(mut hs) => {
                let _ = hs.ws.close(None).await;
            }
            // The previous session is still closing on the coordinator's side.
            Err(e) if e.to_string().contains("has a live session") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let refused = refused.expect("120 session attempts in a row were never refused");
    assert!(refused.contains("sessions in the last minute"), "{refused}");

    // A host that will not answer to this coordinator (it has seen a higher epoch) opens
    // no session at all, and backs off.
    let state = w.dir.join("fenced-host");
    std::fs::create_dir_all(&state).unwrap();
    let sot: String = w
        .sql()
        .await
        .query_one("SELECT sot_incarnation FROM leadership", &[])
        .await
        .unwrap()
        .get(0);
    std::fs::write(
        state.join("coordinator-authority.json"),
        serde_json::json!({ "sot_incarnation": sot, "coordinator_epoch": 99 }).to_string(),
    )
    .unwrap();
    let fence = Arc::new(mosaic::supervisor::authority::AuthorityFence::load(&state).unwrap());
    let outbox = mosaic::supervisor::outbox::Outbox::open(&state).unwrap();
    let (pa, _) = w.raw(0, vec![]);
    async fn rows(w: &World) -> i64 {
        w.sql()
            .await
            .query_one(
                "SELECT count(*) FROM host_sessions WHERE host_id = $1",
                &[&w.hosts[0]],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    }
    // Host A's real supervisor holds its session; stop it so the fenced link may try.
    let mut w = w;
    w.crash_supervisor(0);
    let before = rows(&w).await;
    let (stop, rx) = tokio::sync::watch::channel(false);
    let link = tokio::spawn(mosaic::supervisor::link::run_receipt_link(
        pa, outbox, fence, rx,
    ));
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.send(true).unwrap();
    let _ = link.await;
    assert_eq!(
        rows(&w).await,
        before,
        "a host that refused the coordinator opened sessions"
    );
    assert!(
        w.audited("session-refused") >= 1,
        "the coordinator saw no refused session"
    );
}

/// The coordinator's own check of every claim a host presents (spec §5.5, §17 "Unknown
/// executor", "Revoked cached lease"): host B, played by the raw client through its own
/// chain to RUNNING, names an executor nobody registered, an effect id its key does not
/// name, a target its scope does not license, and presents an admitted claim again. The
/// first three are refused and audited; the repeat is the same claim, answered `settled`,
/// never a second admission to dispatch.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_claim_is_checked_against_the_registry_its_key_and_its_scope() {
    let w = World::new(Opts::default());
    let (p, ordinary, mut hs, lane) = w.raw_lane().await;
    let a = w.assign(&lane, "hang", false).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let (rc, challenge) = RawChain::to_challenge(&mut hs, &p, &ordinary).await;
    rc.ack(&mut hs, &p, &challenge).await;
    let send = |hs: &mut HostSession, t, extra| rc.msg(hs, t, extra);
    let post = |extra| rc.post(extra);

    let claim = |executor: &str, target: &str, key: &str, effect_id: &str| {
        post(vec![
            ("idempotency_key", s(key)),
            ("effect_id", s(effect_id)),
            ("executor", s(executor)),
            ("target", s(target)),
            ("operation_digest", s(&format!("sha256:{}", "e".repeat(64)))),
            ("responsibility_owner", s(&lane)),
            ("execution_owner", s(&lane)),
            ("process_identity", identity()),
        ])
    };
    let id_of = |key: &str| mosaic::protocol::effects::effect_id(&asg, key);
    let verdict = |env: &Envelope<Verified>| match typed(env) {
        ToHost::EffectVerdict(v) => v,
        other => panic!("not an effect verdict: {other:?}"),
    };
    use mosaic::protocol::messages::EffectAnswer;
    // An executor nobody registered.
    let m = send(
        &mut hs,
        MessageType::Effect,
        claim("deploy", "deploy:prod", "k-deploy", &id_of("k-deploy")),
    );
    hs.ws.send(m).await.unwrap();
    let v = verdict(&next_of(&mut hs, &p, &[MessageType::EffectVerdict]).await);
    assert_eq!(
        v.answer,
        EffectAnswer::Refused {
            category: "bad-input".into()
        }
    );
    // An effect id its key does not name.
    let m = send(
        &mut hs,
        MessageType::Effect,
        claim("provider", "provider", "k-1", &id_of("k-other")),
    );
    hs.ws.send(m).await.unwrap();
    let v = verdict(&next_of(&mut hs, &p, &[MessageType::EffectVerdict]).await);
    assert_eq!(
        v.answer,
        EffectAnswer::Refused {
            category: "bad-input".into()
        }
    );
    // A target its scope does not license (the default scope: the lane and its provider).
    let m = send(
        &mut hs,
        MessageType::Effect,
        claim("egress", "egress:example.com:443", "k-web", &id_of("k-web")),
    );
    hs.ws.send(m).await.unwrap();
    let v = verdict(&next_of(&mut hs, &p, &[MessageType::EffectVerdict]).await);
    assert_eq!(
        v.answer,
        EffectAnswer::Refused {
            category: "out-of-scope".into()
        }
    );
    // Admitted once; the same claim again is answered with what it is, never admitted anew.
    let m = send(
        &mut hs,
        MessageType::Effect,
        claim("provider", "provider", "k-model", &id_of("k-model")),
    );
    hs.ws.send(m).await.unwrap();
    let v = verdict(&next_of(&mut hs, &p, &[MessageType::EffectVerdict]).await);
    assert!(matches!(v.answer, EffectAnswer::Admitted { .. }), "{v:?}");
    let m = send(
        &mut hs,
        MessageType::Effect,
        claim("provider", "provider", "k-model", &id_of("k-model")),
    );
    hs.ws.send(m).await.unwrap();
    let v = verdict(&next_of(&mut hs, &p, &[MessageType::EffectVerdict]).await);
    assert_eq!(
        v.answer,
        EffectAnswer::Settled {
            claim_state: "ADMITTED".into(),
            result_digest: None
        }
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM effect_claims WHERE assignment_id = '{asg}'"
        ))
        .await,
        1
    );
    common::wait_until("the refusals audited", || {
        (w.audited("unknown executor") >= 1
            && w.audited("the effect id is not the one its key names") >= 1
            && w.audited("does not license") >= 1)
            .then_some(())
    });
}

/// §17 checkpoint disclosure, at the session: host B — its own valid session, no lane of
/// the work — is served no part of host A's checkpoint, whether it names the work's
/// reservation, the object's digest, or an offset past the start; and cannot add a part to
/// A's checkpoint. Nothing is recorded as restored.
#[tokio::test(flavor = "multi_thread")]
async fn another_host_can_neither_read_nor_write_a_checkpoint() {
    use mosaic::protocol::messages::{
        CheckpointFetch, CheckpointUpload, DataAnswer, ObjectRole, StoredVerdict,
    };
    let w = World::new(Opts::default());
    let lane = w.lane(0, "lane-1");
    let (repo, asg, ck, ch) = stored_work(&w, &lane, End::Cancel).await;
    let bundle = ck["bundle_object"].as_str().unwrap().to_string();

    let (p, _) = w.raw(1, vec![]);
    let mut hs = transport::connect(&p).await.unwrap();
    for offset in [0, 49152] {
        let m = CheckpointFetch {
            assignment_id: asg.clone(),
            reservation_id: ch["reservation_id"].as_str().unwrap().into(),
            object_digest: bundle.clone(),
            offset,
        };
        match ask_coord(
            &mut hs,
            &p,
            MessageType::CheckpointFetch,
            m.fields(),
            MessageType::CheckpointData,
        )
        .await
        {
            ToHost::CheckpointData(d) => assert_eq!(
                d.answer,
                DataAnswer::Refused("not-granted".into()),
                "offset {offset}"
            ),
            other => panic!("{other:?}"),
        }
    }
    let up = CheckpointUpload {
        assignment_id: asg.clone(),
        lane_incarnation_id: ck["lane_incarnation_id"].as_str().unwrap().into(),
        generation: ck["generation"].as_u64().unwrap(),
        checkpoint_digest: ck["checkpoint_digest"].as_str().unwrap().into(),
        role: ObjectRole::Bundle,
        base_commit_id: None,
        object_digest: format!("sha256:{}", "a".repeat(64)),
        object_size: 3,
        offset: 0,
        data: b"abc".to_vec(),
    };
    match ask_coord(
        &mut hs,
        &p,
        MessageType::CheckpointUpload,
        up.fields(),
        MessageType::CheckpointStored,
    )
    .await
    {
        ToHost::CheckpointStored(s) => {
            assert_eq!(s.verdict, StoredVerdict::Refused("not-owner".into()))
        }
        other => panic!("{other:?}"),
    }
    let c = w.sql().await;
    let restores: i64 = c
        .query_one("SELECT count(*) FROM checkpoint_restores", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(restores, 0);
    let objects: i64 = c
        .query_one(
            "SELECT count(*) FROM checkpoint_objects WHERE uploaded_by = $1",
            &[&w.hosts[1]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(objects, 0);

    // Nor release it: B never held the work, whether it asks (naming the stored
    // checkpoint's very tree) or says it deleted it. A, which held it, releases its copy.
    use mosaic::protocol::messages::{HeldTree, ReleaseStep, ReleaseVerdict, WorkspaceRelease};
    for (step, done) in [
        (
            ReleaseStep::Ask {
                workspace: Some(HeldTree {
                    tree_id: ck["tree_id"].as_str().unwrap().into(),
                    checkpoint_digest: ck["checkpoint_digest"].as_str().unwrap().into(),
                }),
            },
            false,
        ),
        (ReleaseStep::Done { refs_removed: 1 }, true),
    ] {
        let m = WorkspaceRelease {
            assignment_id: asg.clone(),
            step,
        };
        match ask_coord(
            &mut hs,
            &p,
            MessageType::WorkspaceRelease,
            m.fields(),
            MessageType::WorkspaceReleaseAnswer,
        )
        .await
        {
            ToHost::WorkspaceReleaseAnswer(a) => {
                assert_eq!(a.done, done);
                assert_eq!(a.verdict, ReleaseVerdict::Keep("not-owner".into()));
            }
            other => panic!("{other:?}"),
        }
    }
    let released = tokio::task::block_in_place(|| {
        common::wait_until("A released its copy", || {
            let v = w
                .op(&OperatorRequest::WorkspaceReleases {
                    assignment_id: Some(asg.clone()),
                })
                .ok()?;
            let rows = v.as_array()?.clone();
            rows.iter()
                .any(|r| r["state"] == "released")
                .then_some(rows)
        })
    });
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(released[0]["host_id"], w.hosts[0].as_str());
    let _ = std::fs::remove_dir_all(&repo);
}

/// A checkpoint a live generation asked for (`checkpoint_taken` with `request_seq`) is a
/// fact only for the open, activated chain of exactly that generation's work, in its own
/// repository, under a number not yet used. Host B, played by the raw client through its
/// own chain: before its ACK, naming another declared repository, or reusing a number,
/// nothing is recorded; the one well-formed report is recorded once, its digest derived
/// from its ids.
#[tokio::test(flavor = "multi_thread")]
async fn a_requested_checkpoint_is_recorded_only_for_its_own_activated_work() {
    let w = World::new(Opts::default());
    let (p, ordinary, mut hs, lane) = w.raw_lane().await;
    let host = lane.split_once(':').unwrap().0.to_string();
    for name in ["demo", "other"] {
        w.op(&OperatorRequest::RepoAdd {
            name: name.into(),
            path: Some(format!("/srv/{name}")),
            url: None,
            host_id: Some(host.clone()),
            copy: vec![],
            setup: vec![],
            setup_timeout_s: None,
        })
        .unwrap();
    }
    let mut req = world::assign_request(&lane, "hang", None, false);
    if let OperatorRequest::Assign { repo, .. } = &mut req {
        *repo = Some("demo".into());
    }
    let a = w.op(&req).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let (rc, challenge) = RawChain::to_challenge(&mut hs, &p, &ordinary).await;
    let send = |hs: &mut HostSession, t, extra| rc.msg(hs, t, extra);
    let post = |extra| rc.post(extra);
    let taken = |key: &str, seq: u64, repo: &str, commit: char| {
        post(vec![
            ("idempotency_key", s(key)),
            ("request_seq", n(seq)),
            ("repository", s(repo)),
            ("commit_id", s(&commit.to_string().repeat(40))),
            ("tree_id", s(&"e".repeat(40))),
        ])
    };
    let recorded = || async {
        w.sql()
            .await
            .query(
                "SELECT request_seq, commit_id, checkpoint_digest FROM checkpoints WHERE assignment_id = $1 ORDER BY request_seq",
                &[&asg],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, i32>(0), r.get::<_, String>(1), r.get::<_, String>(2)))
            .collect::<Vec<_>>()
    };
    // Before its ACK: the generation holds no authority yet.
    let m = send(
        &mut hs,
        MessageType::CheckpointTaken,
        taken("early", 1, "demo", 'a'),
    );
    hs.ws.send(m).await.unwrap();
    rc.ack(&mut hs, &p, &challenge).await;
    assert!(recorded().await.is_empty(), "recorded before its ACK");

    // Another declared repository than the work's, then the work's own.
    for (key, repo, commit) in [("other-repo", "other", 'f'), ("own", "demo", 'b')] {
        let m = send(
            &mut hs,
            MessageType::CheckpointTaken,
            taken(key, 1, repo, commit),
        );
        hs.ws.send(m).await.unwrap();
    }
    let rows = rows_when(&recorded, 1).await;
    let want = mosaic::protocol::repo::CheckpointRef {
        repository: mosaic::protocol::repo::RepoName::parse("demo").unwrap(),
        commit_id: "b".repeat(40),
        tree_id: "e".repeat(40),
        inputs_digest: None,
    };
    assert_eq!(rows, vec![(1, "b".repeat(40), want.digest())]);

    // Number 1 again with another commit, then number 2: only number 2 is new.
    for (key, seq, commit) in [("again", 1, 'c'), ("second", 2, 'd')] {
        let m = send(
            &mut hs,
            MessageType::CheckpointTaken,
            taken(key, seq, "demo", commit),
        );
        hs.ws.send(m).await.unwrap();
    }
    let rows = rows_when(&recorded, 2).await;
    assert_eq!(rows[0].1, "b".repeat(40), "number 1 was replaced");
    assert_eq!(rows[1].1, "d".repeat(40));

    // B holds the work, but it runs: B may not release its copy, even naming a checkpoint
    // of it exactly.
    use mosaic::protocol::messages::{HeldTree, ReleaseStep, ReleaseVerdict, WorkspaceRelease};
    let m = WorkspaceRelease {
        assignment_id: asg.clone(),
        step: ReleaseStep::Ask {
            workspace: Some(HeldTree {
                tree_id: "e".repeat(40),
                checkpoint_digest: rows[1].2.clone(),
            }),
        },
    };
    match ask_coord(
        &mut hs,
        &p,
        MessageType::WorkspaceRelease,
        m.fields(),
        MessageType::WorkspaceReleaseAnswer,
    )
    .await
    {
        ToHost::WorkspaceReleaseAnswer(a) => {
            assert_eq!(a.verdict, ReleaseVerdict::Keep("active".into()))
        }
        other => panic!("{other:?}"),
    }
}

/// §6.2 (activation carries the checkpoint digests): a generation is activated only on the
/// checkpoint its stage named. Host B, played by the raw client, stages the resume of work
/// whose generation on host A was killed, its checkpoint stored: a `staged` saying its
/// workspace was restored from another checkpoint (on one lane), or from nothing (on
/// another), is refused as a mismatch and ends that chain — the work back in recovery,
/// nothing activated; saying the stored one (on a third lane), the chain goes on, and the
/// reservation and the activation receipt bind it.
#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_restored_from_other_files_is_never_activated() {
    let w = World::new(Opts::default());
    let lane = w.lane(0, "lane-1");
    let (repo, asg, ck, _) = stored_work(&w, &lane, End::Kill).await;
    let digest = ck["checkpoint_digest"].as_str().unwrap().to_string();
    let names = ["lane-x", "lane-y", "lane-z"];
    let (p, ordinary) = w.raw(
        1,
        names
            .iter()
            .map(|n| format!("{n}@{}", incarnation()))
            .collect(),
    );
    let mut hs = transport::connect(&p).await.unwrap();
    let lanes: Vec<String> = names.iter().map(|n| w.lane(1, n)).collect();
    common::wait_until("B's lanes registered", || {
        let known = w.op(&OperatorRequest::Lanes).ok()?;
        let known = known.as_array()?;
        lanes
            .iter()
            .all(|l| known.iter().any(|k| k["lane_id"] == l.as_str()))
            .then_some(())
    });
    let c = w.sql().await;
    let lifecycle = || async {
        c.query_one(
            "SELECT lifecycle FROM assignments WHERE assignment_id = $1",
            &[&asg],
        )
        .await
        .unwrap()
        .get::<_, String>(0)
    };
    // The work resumes on B: each stage restores the stored checkpoint.
    let resume = |lane: &str| {
        tokio::task::block_in_place(|| {
            w.op(&world::assign_request(lane, "hang", Some(&asg), false))
                .unwrap()
        })
    };
    let other = format!("sha256:{}", "d".repeat(64));
    for (lane, restored) in [(&lanes[0], Some(other.as_str())), (&lanes[1], None)] {
        resume(lane);
        let stage = next_of(&mut hs, &p, &[MessageType::Stage]).await;
        match typed(&stage) {
            ToHost::Stage(s) => assert_eq!(
                s.restore.as_ref().map(|r| r.checkpoint_digest.as_str()),
                Some(digest.as_str())
            ),
            other => panic!("{other:?}"),
        }
        let reservation = authority(&stage).reservation_id;
        let mut f = vec![
            ("idempotency_key", s("staged-1")),
            ("process_identity", identity()),
        ];
        f.extend(restored.map(|d| ("restored_checkpoint_digest", s(d))));
        let m = seal(&mut hs, &stage, &ordinary, MessageType::Staged, f);
        hs.ws.send(m).await.unwrap();
        // Refused, and its chain ended: released, the work in recovery, nothing staged.
        let ended = || async {
            c.query(
                "SELECT 1 FROM reservations WHERE reservation_id = $1 AND released_at IS NOT NULL \
                   AND process_identity IS NULL AND restored_checkpoint_digest IS NULL",
                &[&reservation],
            )
            .await
            .unwrap()
            .len()
        };
        let released = || async { vec![(); ended().await] };
        rows_when(&released, 1).await;
        let start = Instant::now();
        while lifecycle().await != "RECOVERY" {
            assert!(
                start.elapsed() < common::PATIENCE,
                "the work never went back to recovery"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // B says the refused generation is gone (the work's next chain waits for that).
        let a = authority(&stage);
        let key = format!("tr-{}", a.reservation_id);
        let body = serde_json::json!({
            "receipt_id": format!("rcpt-{key}"), "idempotency_key": key, "host_id": w.hosts[1],
            "lane_id": a.lane_id, "lane_incarnation_id": a.lane_incarnation_id,
            "generation": a.generation, "termination_reason": "stopped",
            "cleanup": {"method": "cgroup-kill", "verified_empty": true, "cgroup_removed": true, "members_killed": 1, "error": null},
        });
        let session = hs.session_id.clone();
        hs.send(
            Outgoing::new(
                &p.signer,
                MessageType::Receipt,
                vec![
                    ("idempotency_key", s(&key)),
                    ("sot_incarnation", Value::Null),
                    ("coordinator_epoch", Value::Null),
                    ("assignment_id", Value::Null),
                    ("session_id", s(&session)),
                    ("lane_id", s(&a.lane_id)),
                    ("lane_incarnation_id", s(&a.lane_incarnation_id)),
                    ("generation", n(a.generation)),
                    ("receipt_idempotency_key", s(&key)),
                    (
                        "receipt",
                        mosaic::protocol::canonical::from_json(&body).unwrap(),
                    ),
                ],
            ),
            COORD,
        )
        .await
        .unwrap();
        let verdict = next_of(&mut hs, &p, &[MessageType::ReceiptAck]).await;
        assert_eq!(verdict_text(&verdict), "ingested");
    }
    let refused = || async {
        c.query(
            "SELECT category FROM audit WHERE operation = 'host-staged' AND assignment_id = $1",
            &[&asg],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
    };
    assert_eq!(
        rows_when(&refused, 2).await,
        vec!["mismatch".to_string(), "mismatch".to_string()],
        "the two staged naming other files were refused"
    );

    resume(&lanes[2]);
    let stage = next_of(&mut hs, &p, &[MessageType::Stage]).await;
    let (rc, challenge) = RawChain::staged(&mut hs, &p, &ordinary, stage, Some(&digest)).await;
    rc.ack(&mut hs, &p, &challenge).await;
    let row = c
        .query_one(
            "SELECT r.restore_checkpoint_digest, r.restored_checkpoint_digest, t.body->>'restored_checkpoint_digest' \
             FROM reservations r JOIN transition_receipts t ON t.transition = 'activate' AND t.body->'chain'->>'reservation_id' = r.reservation_id \
             WHERE r.reservation_id = $1",
            &[&rc.authority.reservation_id],
        )
        .await
        .unwrap();
    let got: (Option<String>, Option<String>, Option<String>) =
        (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        got,
        (
            Some(digest.clone()),
            Some(digest.clone()),
            Some(digest.clone())
        )
    );
    let activations: i64 = c
        .query_one(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'activate' AND assignment_id = $1",
            &[&asg],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        activations, 2,
        "A's first generation and the third chain only"
    );
    let _ = std::fs::remove_dir_all(&repo);
}

/// What `read` returns once it holds `n` rows (the coordinator handles a session's
/// messages in order: the refused ones sent before were handled by then).
async fn rows_when<T, F, Fut>(read: &F, n: usize) -> Vec<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<T>>,
{
    let start = Instant::now();
    loop {
        let rows = read().await;
        if rows.len() >= n {
            return rows;
        }
        assert!(
            start.elapsed() < common::PATIENCE,
            "timed out waiting for {n} rows"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A chain host B (the raw client) plays: staged and injected from its stage and contract,
/// so its messages carry what the host's link would put in them.
struct RawChain {
    stage: Envelope<Verified>,
    ordinary: Arc<Signer>,
    authority: ChainAuthority,
    digests: Digests,
}

impl RawChain {
    /// Takes the next stage, answers `staged`, takes the contract, answers `injected`;
    /// the chain and its challenge.
    async fn to_challenge(
        hs: &mut HostSession,
        p: &LinkParams,
        ordinary: &Arc<Signer>,
    ) -> (Self, Envelope<Verified>) {
        let stage = next_of(hs, p, &[MessageType::Stage]).await;
        Self::staged(hs, p, ordinary, stage, None).await
    }

    /// Answers `stage` with `staged` (saying its workspace was restored from `restored`),
    /// then as `to_challenge`.
    async fn staged(
        hs: &mut HostSession,
        p: &LinkParams,
        ordinary: &Arc<Signer>,
        stage: Envelope<Verified>,
        restored: Option<&str>,
    ) -> (Self, Envelope<Verified>) {
        let mut f = vec![
            ("idempotency_key", s("staged-1")),
            ("process_identity", identity()),
        ];
        f.extend(restored.map(|d| ("restored_checkpoint_digest", s(d))));
        let m = seal(hs, &stage, ordinary, MessageType::Staged, f);
        hs.ws.send(m).await.unwrap();
        let contract = next_of(hs, p, &[MessageType::Contract]).await;
        let rc = RawChain {
            authority: authority(&stage),
            digests: contract_digests(&contract),
            stage,
            ordinary: ordinary.clone(),
        };
        let m = rc.msg(
            hs,
            MessageType::Injected,
            rc.post(vec![
                ("idempotency_key", s("injected-1")),
                (
                    "delivered_contracts_digest",
                    s(&rc.digests.contracts_digest),
                ),
                ("process_identity", identity()),
            ]),
        );
        hs.ws.send(m).await.unwrap();
        let challenge = next_of(hs, p, &[MessageType::Challenge]).await;
        (rc, challenge)
    }

    /// Answers `challenge` and takes the activation.
    async fn ack(&self, hs: &mut HostSession, p: &LinkParams, challenge: &Envelope<Verified>) {
        let challenge_id = match typed(challenge) {
            ToHost::Challenge(c) => c.challenge_id,
            other => panic!("not a challenge: {other:?}"),
        };
        let m = self.msg(
            hs,
            MessageType::Ack,
            self.post(vec![
                ("idempotency_key", s("ack-1")),
                ("challenge_id", s(&challenge_id)),
                ("process_identity", identity()),
            ]),
        );
        hs.ws.send(m).await.unwrap();
        let activated = next_of(hs, p, &[MessageType::Control]).await;
        assert!(matches!(typed(&activated), ToHost::Activate(_)));
    }

    /// A chain message of type `t`: the stage's chain fields and `extra`, sealed.
    fn msg(
        &self,
        hs: &mut HostSession,
        t: MessageType,
        extra: Vec<(&'static str, Value)>,
    ) -> Message {
        seal(hs, &self.stage, &self.ordinary, t, extra)
    }

    /// The fields a post-contract message repeats, and `extra`.
    fn post(&self, extra: Vec<(&'static str, Value)>) -> Vec<(&'static str, Value)> {
        let (a, d) = (&self.authority, &self.digests);
        let mut f = vec![
            ("reservation_epoch", n(a.reservation_epoch)),
            ("reservation_deadline", s(&a.reservation_deadline)),
            ("runtime_id", s(&a.runtime_id)),
            ("contracts_digest", s(&d.contracts_digest)),
            ("scope_digest", s(&d.scope_digest)),
            ("holds_digest", s(&d.holds_digest)),
        ];
        f.extend(extra);
        f
    }
}

/// A chain message of type `t` for the chain `stage` staged: its chain fields and `extra`.
fn seal(
    hs: &mut HostSession,
    stage: &Envelope<Verified>,
    ordinary: &Arc<Signer>,
    t: MessageType,
    extra: Vec<(&'static str, Value)>,
) -> Message {
    let mut f = chain_fields(stage);
    f.extend(extra);
    let bytes = hs.seq.seal(Outgoing::new(ordinary, t, f), COORD).unwrap();
    Message::text(String::from_utf8(bytes).unwrap())
}

/// Host A's work in a repository (`demo`, declared on A), stopped (or, with `kill`, its
/// generation SIGKILLed into recovery) once its checkpoint is stored: the repository's
/// directory, the assignment, its checkpoint row and its chain.
/// Handing done work on (`mosaic workspace push`) is a fenced claim of one host's exact
/// update. Host B, played by the raw client: for an effect ordered to it, a claim whose
/// operation digest is not its update's, or that would push another commit than the final
/// checkpoint's, is refused; the right one is admitted once (the same claim again is the
/// same admission while it holds; another update under it is refused, and after its
/// settlement the same claim is no admission); its outcome is settled once. For an effect
/// ordered to another host, B can neither read its checkpoint nor claim nor settle it;
/// an order made while its host is away goes out when its host's session opens, and an
/// admitted one it never reported is UNKNOWN once its next session opens;
/// and a claim after the effect's deadline is refused, the next request closing it
/// EXPIRED. One effect of a work is open at a time.
#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_effect_is_claimed_only_by_its_host_for_its_exact_update() {
    use mosaic::protocol::messages::{
        hand_on_operation_digest, CheckpointFetch, DataAnswer, EffectStep, HandOnOutcome,
        HandOnVerdict, WorkspaceEffect,
    };
    let w = World::new(Opts::default());
    let lane = w.lane(0, "lane-1");
    let (repo, asg, ck, _) = stored_work(&w, &lane, End::Complete).await;
    let commit = ck["commit_id"].as_str().unwrap().to_string();
    let bundle = ck["bundle_object"].as_str().unwrap().to_string();
    let b = w.hosts[1].clone();
    let order = |host: &str| OperatorRequest::WorkspaceEffect {
        assignment_id: asg.clone(),
        kind: "push".into(),
        into: None,
        host_id: Some(host.into()),
        wait: false,
        request_id: None,
    };
    // Ordered while B is away: its order goes out when B's session opens.
    let v = tokio::task::block_in_place(|| w.op(&order(&b))).unwrap();
    let id = v["effect_id"].as_str().unwrap().to_string();
    assert!(
        v["note"].as_str().unwrap().contains("when it connects"),
        "{v}"
    );
    let (p, _) = w.raw(1, vec![]);
    let mut hs = transport::connect(&p).await.unwrap();
    let ToHost::WorkspaceOrder(o) =
        typed(&next_of(&mut hs, &p, &[MessageType::WorkspaceOrder]).await)
    else {
        panic!("not an order")
    };
    assert_eq!(o.effect_id, id);
    assert_eq!(o.checkpoint.commit_id, commit);
    let reference = format!("refs/heads/mosaic/{asg}");
    assert_eq!(o.reference, reference);
    let zero = "0".repeat(40);
    let digest = |id: &str, new: &str| {
        hand_on_operation_digest(id, "push", "demo", &reference, &commit, &zero, new)
    };
    let send = |id: &str, step: EffectStep| WorkspaceEffect {
        effect_id: id.to_string(),
        assignment_id: asg.clone(),
        step,
    };
    let claim = |id: &str, new: &str, operation_digest: String| {
        send(
            id,
            EffectStep::Claim {
                old_id: zero.clone(),
                new_id: new.to_string(),
                operation_digest,
            },
        )
    };
    let settle = |id: &str, outcome: HandOnOutcome| {
        send(
            id,
            EffectStep::Settle {
                outcome,
                result_digest: format!("sha256:{}", "d".repeat(64)),
                detail: None,
            },
        )
    };
    async fn answer(hs: &mut HostSession, p: &LinkParams, m: WorkspaceEffect) -> HandOnVerdict {
        match ask_coord(
            hs,
            p,
            MessageType::WorkspaceEffect,
            m.fields(),
            MessageType::WorkspaceEffectAnswer,
        )
        .await
        {
            ToHost::WorkspaceEffectAnswer(a) => a.verdict,
            other => panic!("{other:?}"),
        }
    }
    let refused = |c: &str| HandOnVerdict::Refused(c.into());
    let other = "f".repeat(40);
    // Its update's digest, or nothing.
    let m = claim(&id, &commit, digest(&id, &other));
    assert_eq!(answer(&mut hs, &p, m).await, refused("mismatch"));
    // Another commit than the final checkpoint's, however well digested.
    let m = claim(&id, &other, digest(&id, &other));
    assert_eq!(answer(&mut hs, &p, m).await, refused("mismatch"));
    // One effect of a work open at a time.
    let e = tokio::task::block_in_place(|| w.op(&order(&b))).expect_err("one open");
    assert!(e.message.contains("still open"), "{e:?}");
    // The checkpoint it hands on is B's to read now, recorded as such.
    let fetch = |via: &str| CheckpointFetch {
        assignment_id: asg.clone(),
        reservation_id: via.to_string(),
        object_digest: bundle.clone(),
        offset: 0,
    };
    async fn read(hs: &mut HostSession, p: &LinkParams, m: CheckpointFetch) -> DataAnswer {
        match ask_coord(
            hs,
            p,
            MessageType::CheckpointFetch,
            m.fields(),
            MessageType::CheckpointData,
        )
        .await
        {
            ToHost::CheckpointData(d) => d.answer,
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(
        read(&mut hs, &p, fetch(&id)).await,
        DataAnswer::Data { .. }
    ));
    // The exact update: admitted; again, the same admission; another, refused.
    let m = claim(&id, &commit, digest(&id, &commit));
    assert_eq!(
        answer(&mut hs, &p, m.clone()).await,
        HandOnVerdict::Admitted
    );
    assert_eq!(answer(&mut hs, &p, m).await, HandOnVerdict::Admitted);
    let m = send(
        &id,
        EffectStep::Claim {
            old_id: other.clone(),
            new_id: commit.clone(),
            operation_digest: hand_on_operation_digest(
                &id, "push", "demo", &reference, &commit, &other, &commit,
            ),
        },
    );
    assert_eq!(
        answer(&mut hs, &p, m).await,
        refused("idempotency-conflict")
    );
    // Admitted, its checkpoint is no longer read for it.
    assert_eq!(
        read(&mut hs, &p, fetch(&id)).await,
        DataAnswer::Refused("not-granted".into())
    );
    // Settled once: the same settlement again is the same; another is refused.
    let done = settle(&id, HandOnOutcome::Completed);
    assert_eq!(
        answer(&mut hs, &p, done.clone()).await,
        HandOnVerdict::Recorded
    );
    assert_eq!(answer(&mut hs, &p, done).await, HandOnVerdict::Recorded);
    let m = settle(&id, HandOnOutcome::Failed);
    assert_eq!(
        answer(&mut hs, &p, m).await,
        refused("idempotency-conflict")
    );
    // Settled, its claim repeated is no admission (nothing would be pushed again).
    let m = claim(&id, &commit, digest(&id, &commit));
    assert_eq!(answer(&mut hs, &p, m).await, refused("expired"));

    // An effect ordered to another host (away, so it stays claimable): B can neither read
    // its checkpoint, claim, nor settle it.
    let c = w.sql().await;
    let elsewhere = "h-elsewhere";
    let v = tokio::task::block_in_place(|| w.op(&order(elsewhere))).unwrap();
    let a_id = v["effect_id"].as_str().unwrap().to_string();
    assert_eq!(v["state"], "REQUESTED", "{v}");
    assert_eq!(v["claimable"], true, "{v}");
    assert_eq!(
        read(&mut hs, &p, fetch(&a_id)).await,
        DataAnswer::Refused("not-granted".into())
    );
    let m = claim(&a_id, &commit, digest(&a_id, &commit));
    assert_eq!(answer(&mut hs, &p, m).await, refused("not-owner"));
    let m = settle(&a_id, HandOnOutcome::Declined);
    assert_eq!(answer(&mut hs, &p, m).await, refused("not-owner"));
    // While it may be claimed, nothing else of the work is requested.
    let e = tokio::task::block_in_place(|| w.op(&order(&b))).expect_err("one open");
    assert!(e.message.contains("still open (REQUESTED)"), "{e:?}");
    let past = |id: &str| {
        format!(
            "ALTER TABLE workspace_effects DISABLE TRIGGER workspace_effect_moves; \
             UPDATE workspace_effects SET claim_deadline = now() - interval '1 second' WHERE effect_id = '{id}'; \
             ALTER TABLE workspace_effects ENABLE TRIGGER workspace_effect_moves;"
        )
    };
    c.batch_execute(&past(&a_id)).await.unwrap();

    // Past its deadline (database time, moved here by hand), a claim is refused, and the
    // next request closes it EXPIRED.
    let v = tokio::task::block_in_place(|| w.op(&order(&b))).unwrap();
    let late = v["effect_id"].as_str().unwrap().to_string();
    c.batch_execute(&past(&late)).await.unwrap();
    assert_eq!(
        read(&mut hs, &p, fetch(&late)).await,
        DataAnswer::Refused("not-granted".into())
    );
    let m = claim(&late, &commit, digest(&late, &commit));
    assert_eq!(answer(&mut hs, &p, m).await, refused("expired"));
    let v = tokio::task::block_in_place(|| w.op(&order(&b))).unwrap();
    assert_eq!(v["state"], "REQUESTED", "{v}");
    let rows: Vec<(String, String)> = c
        .query(
            "SELECT effect_id, state FROM workspace_effects WHERE assignment_id = $1 ORDER BY requested_at",
            &[&asg],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let states: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(
        states,
        ["COMPLETED", "EXPIRED", "EXPIRED", "REQUESTED"],
        "{rows:?}"
    );
    // A settled effect never moves again, and nothing an effect was requested for ever
    // changes, whatever statement tries.
    let refusal = |e: tokio_postgres::Error| {
        e.as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default()
    };
    let e = c
        .execute(
            "UPDATE workspace_effects SET state = 'RECONCILED', reconciliation = 'x' WHERE effect_id = $1",
            &[&id],
        )
        .await
        .expect_err("the trigger refuses");
    assert!(refusal(e).contains("cannot move from COMPLETED"));
    let e = c
        .execute(
            "UPDATE workspace_effects SET state = 'EXPIRED', resolved_at = now(), commit_id = $2 WHERE effect_id = $1",
            &[&rows[3].0, &other],
        )
        .await
        .expect_err("the trigger refuses");
    assert!(refusal(e).contains("never changes"));
    let reads: i64 = c
        .query_one(
            "SELECT count(*) FROM checkpoint_restores WHERE purpose = 'workspace-effect' AND host_id = $1",
            &[&b],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(reads, 1, "B's one read is recorded");

    // An outcome its host could not tell keeps the work's effects closed until the
    // operator resolves it with evidence (a settled one is not resolved by hand), or its
    // host observes it late.
    let mut last = rows[3].0.clone();
    for late in [false, true] {
        let m = claim(&last, &commit, digest(&last, &commit));
        assert_eq!(answer(&mut hs, &p, m).await, HandOnVerdict::Admitted);
        let m = settle(&last, HandOnOutcome::Unknown);
        assert_eq!(answer(&mut hs, &p, m).await, HandOnVerdict::Recorded);
        let e = tokio::task::block_in_place(|| w.op(&order(&b))).expect_err("unknown is open");
        assert!(e.message.contains("still open (UNKNOWN)"), "{e:?}");
        let resolve = |effect_id: &str| OperatorRequest::WorkspaceResolve {
            effect_id: effect_id.into(),
            applied: true,
            evidence_digest: format!("sha256:{}", "9".repeat(64)),
            request_id: None,
        };
        let how = if late {
            let m = settle(&last, HandOnOutcome::Completed);
            assert_eq!(answer(&mut hs, &p, m).await, HandOnVerdict::Recorded);
            "observed-late: completed".to_string()
        } else {
            let e = tokio::task::block_in_place(|| w.op(&resolve(&id))).expect_err("settled");
            assert!(e.message.contains("resolved by hand"), "{e:?}");
            let r = tokio::task::block_in_place(|| w.op(&resolve(&last))).unwrap();
            assert_eq!(r["state"], "RECONCILED", "{r}");
            format!("operator: applied (evidence sha256:{})", "9".repeat(64))
        };
        let row = effect_row(&w, &asg, &last, |_| true);
        assert_eq!(row["state"], "RECONCILED", "{row}");
        assert_eq!(row["reconciliation"], how.as_str(), "{row}");
        let v = tokio::task::block_in_place(|| w.op(&order(&b))).unwrap();
        assert_eq!(v["state"], "REQUESTED", "{v}");
        last = v["effect_id"].as_str().unwrap().to_string();
    }
    // Admitted, then no report past its window: B's next session finds it UNKNOWN.
    let m = claim(&last, &commit, digest(&last, &commit));
    assert_eq!(answer(&mut hs, &p, m).await, HandOnVerdict::Admitted);
    c.batch_execute(&format!(
        "ALTER TABLE workspace_effects DISABLE TRIGGER workspace_effect_moves; \
         UPDATE workspace_effects SET dispatch_until = now() - interval '1 second' WHERE effect_id = '{last}'; \
         ALTER TABLE workspace_effects ENABLE TRIGGER workspace_effect_moves;"
    ))
    .await
    .unwrap();
    drop(hs);
    let _hs = common_retry_connect(&p).await;
    let state = effect_row(&w, &asg, &last, |r| r["state"] != "ADMITTED")["state"].clone();
    assert_eq!(state, "UNKNOWN");
    let _ = std::fs::remove_dir_all(&repo);
}

/// The recorded effect `id` of `asg` (`mosaic workspace effects`), once `ready` holds.
fn effect_row(w: &World, asg: &str, id: &str, ready: impl Fn(&Json) -> bool) -> Json {
    tokio::task::block_in_place(|| {
        common::wait_until(&format!("effect {id}"), || {
            let v = w
                .op(&OperatorRequest::WorkspaceEffects {
                    assignment_id: Some(asg.to_string()),
                })
                .ok()?;
            let row = v.as_array()?.iter().find(|r| r["effect_id"] == id)?.clone();
            ready(&row).then_some(row)
        })
    })
}

/// How [`stored_work`] ends its work.
#[derive(PartialEq)]
enum End {
    /// Its generation SIGKILLed: the work in recovery.
    Kill,
    /// Stopped: CANCELLED.
    Cancel,
    /// Stopped COMPLETED, on its final checkpoint.
    Complete,
}

async fn stored_work(w: &World, lane: &str, end: End) -> (PathBuf, String, Json, Json) {
    let repo = std::env::temp_dir().join(format!("mosaic-repo-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&repo).unwrap();
    for args in [
        vec!["init", "-q", "-b", "main"],
        vec![
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "one",
        ],
    ] {
        assert!(std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(&args)
            .status()
            .unwrap()
            .success());
    }
    std::fs::write(repo.join("a.txt"), "secret work\n").unwrap();
    tokio::task::block_in_place(|| {
        w.op(&OperatorRequest::RepoAdd {
            name: "demo".into(),
            path: Some(repo.display().to_string()),
            url: None,
            host_id: Some(w.hosts[0].clone()),
            copy: vec![],
            setup: vec![],
            setup_timeout_s: None,
        })
        .unwrap();
    });
    let mut r = world::assign_request(lane, "hang", None, true);
    if let OperatorRequest::Assign { repo: rp, .. } = &mut r {
        *rp = Some("demo".into());
    }
    let a = tokio::task::block_in_place(|| w.op(&r)).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let ch = chain_of(w, lane).await;
    if end == End::Kill {
        let cg = common::cgroup_at(a["process_identity"]["cgroup_path"].as_str().unwrap());
        std::fs::write(cg.join("cgroup.kill"), "1").unwrap();
        tokio::task::block_in_place(|| {
            common::wait_until("the work in recovery", || {
                let v = w.op(&OperatorRequest::Status).ok()?;
                v.to_string().contains("RECOVERY").then_some(())
            })
        });
    } else if end == End::Complete {
        let out = tokio::task::block_in_place(|| {
            w.op(&OperatorRequest::Stop {
                assignment_id: asg.clone(),
                outcome: Some("COMPLETED".into()),
                evidence_digest: Some(format!("sha256:{}", "e".repeat(64))),
                wait: true,
                request_id: None,
            })
        })
        .unwrap();
        assert_eq!(out["state"], "COMPLETED", "{out}");
    } else {
        tokio::task::block_in_place(|| w.stop(&asg));
    }
    let ck = tokio::task::block_in_place(|| {
        common::wait_until("the checkpoint stored", || {
            let v = w
                .op(&OperatorRequest::Checkpoints {
                    assignment_id: Some(asg.clone()),
                    checkpoint_digest: None,
                })
                .ok()?;
            let row = v.as_array()?.first()?.clone();
            (row["stored"] == true).then_some(row)
        })
    });
    (repo, asg, ck, ch)
}

/// Sends `fields` as a message of type `t` on the raw host's session and takes the next
/// message of type `answer`.
async fn ask_coord(
    hs: &mut HostSession,
    p: &LinkParams,
    t: MessageType,
    fields: Vec<(&'static str, Value)>,
    answer: MessageType,
) -> ToHost {
    hs.send(Outgoing::new(&p.signer, t, fields), COORD)
        .await
        .unwrap();
    typed(&next_of(hs, p, &[answer]).await)
}

/// A session the coordinator closes says why in the host's log: a coordinator shutting
/// down sends its reason in the close frame, and the supervisor's "link down" line carries
/// the close code and that reason (it used to say only "closed by the coordinator").
#[test]
fn the_host_logs_why_the_coordinator_closed_its_session() {
    let mut w = World::new(Opts::default());
    common::kill(w.coordinator_pid(0), nix::sys::signal::Signal::SIGTERM);
    w.wait_coordinator_died(0, "its shutdown");
    let log = w.supervisor_log(0);
    let line = common::wait_until("the host's link-down line", || {
        std::fs::read_to_string(&log)
            .ok()?
            .lines()
            .find(|l| l.contains("coordinator link down"))
            .map(String::from)
    });
    assert!(
        line.contains("closed by the coordinator (") && line.contains("coordinator shutting down"),
        "{line}"
    );
}

/// Sets `pid`'s open-file soft limit (`None`: leaves it); the limits it had.
fn nofile(pid: i32, soft: Option<u64>) -> libc::rlimit {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    assert_eq!(
        unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) },
        0
    );
    if let Some(soft) = soft {
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        assert_eq!(
            unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) },
            0
        );
    }
    old
}

/// An accept the kernel refuses (here: the coordinator out of descriptors, as a connection
/// flood makes it) pauses the host listener and the operator socket. It used to end them:
/// each returned the error, and the coordinator ran on without serving any host (or
/// operator) again.
#[tokio::test(flavor = "multi_thread")]
async fn the_host_listener_outlives_an_accept_the_kernel_refuses() {
    let w = World::new(Opts::default());
    let (p, _) = w.raw(1, vec![]);
    let pid = w.coordinator_pid(0);
    let log = w.coordinator_log(0);
    // No new descriptor at all (those it has stay open), whatever closes meanwhile.
    let before = nofile(pid, Some(0));
    let flood: Vec<std::net::TcpStream> = (0..4)
        .map(|_| std::net::TcpStream::connect(&p.addr).unwrap())
        .collect();
    let operators: Vec<std::os::unix::net::UnixStream> = (0..2)
        .map(|_| std::os::unix::net::UnixStream::connect(w.socket(0)).unwrap())
        .collect();
    common::wait_until("both refused accepts in the coordinator's log", || {
        let text = std::fs::read_to_string(&log).ok()?;
        let refused = |listener: &str| {
            text.lines()
                .any(|l| l.contains("cannot accept a connection") && l.contains(listener))
        };
        (refused("host sessions") && refused("operator socket")).then_some(())
    });
    drop((flood, operators));
    nofile(pid, Some(before.rlim_cur));
    // Served again: a host's session is admitted, an operator answered.
    let hs = common_retry_connect(&p).await;
    assert!(!hs.session_id.is_empty());
    // (Leading again: its renewals could not connect either.)
    w.wait_leading(0);
}
