//! Queue isolation at the supervisor (spec §12, §17 "stale executor request", "fence
//! revocation race", "old queued message"): once a lane moved to a new generation, a
//! coordinator message for the old one is rejected, audited without payload, and never
//! reaches the new generation. A real supervisor in coordinated mode, real tmux and
//! cgroups; the coordinator's side is played with its real signing key.

mod common;
mod fixture;

use std::time::Duration;

use fixture::*;
use mosaic::protocol::canonical::Value;
use mosaic::protocol::envelope::{n, s};
use mosaic::protocol::messages::{FromHostChain, ToHost};
use mosaic::protocol::schema::MessageType;
use mosaic::protocol::transport::{Outgoing, Sequencer};
use mosaic::protocol::{verify, Envelope, Verified};
use mosaic::supervisor::config::{Config, ConfigFile};
use mosaic::supervisor::coordinated::CoordinatedHost;
use mosaic::supervisor::link::HostDispatch;
use mosaic::supervisor::Supervisor;
use tokio::sync::mpsc;

/// An in-process supervisor (the library's `Supervisor`, not a daemon: these cases call
/// its coordinated host directly), with the shared teardown: every tmux server, cgroup and
/// directory it made removed on drop.
struct World {
    sup: Supervisor,
    dir: std::path::PathBuf,
    root: std::path::PathBuf,
}

impl Drop for World {
    fn drop(&mut self) {
        self.sup.shutdown();
        common::teardown(&self.dir, &self.dir.join("run/lanes"), &self.root, &[]);
    }
}

fn coord(t: MessageType, fields: Vec<(&str, Value)>) -> Envelope<Verified> {
    let bytes = signer("coord-ordinary").sign(t, HOST, fields).unwrap();
    let reg = registry();
    verify(
        &bytes,
        &mosaic::protocol::VerifyContext {
            now: std::time::SystemTime::now(),
            ..ctx(&reg, HOST)
        },
    )
    .unwrap()
}

/// The test coordinator's per-generation fence reveal (the real one derives it from the
/// fence token; the host only ever checks it against the stage's commitment).
fn reveal(reservation: &str, generation: u64) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(format!("test-reveal/{reservation}/{generation}")).into()
}

/// A stage for `generation`: the chain fields with the fence commitment.
fn stage(inc: &str, generation: u64, reservation: &str) -> Envelope<Verified> {
    let mut f = chain(inc, generation, reservation);
    f.retain(|(k, _)| *k != "fence_proof");
    f.push((
        "fence_proof",
        s(&mosaic::protocol::fence::commitment(&reveal(
            reservation,
            generation,
        ))),
    ));
    coord(MessageType::Stage, f)
}

/// The chain fields of a post-stage coordinator message, with the fence reveal.
fn chain(inc: &str, generation: u64, reservation: &str) -> Vec<(&'static str, Value)> {
    vec![
        (
            "message_id",
            s(&format!("m-{}", uuid::Uuid::new_v4().simple())),
        ),
        (
            "idempotency_key",
            s(&format!("k-{}", uuid::Uuid::new_v4().simple())),
        ),
        ("sot_incarnation", s("sot-1")),
        ("coordinator_epoch", n(7)),
        ("assignment_id", s("as-1")),
        ("lane_id", s("h1:lane-1")),
        ("lane_incarnation_id", s(inc)),
        ("assignment_attempt_id", s(&format!("at-{reservation}"))),
        ("reservation_id", s(reservation)),
        ("reservation_epoch", n(1)),
        ("reservation_deadline", s("2099-01-01T00:00:00.000000Z")),
        ("runtime_id", s("fake@1.0.0")),
        ("generation", n(generation)),
        (
            "fence_proof",
            s(&mosaic::protocol::fence::reveal(&reveal(
                reservation,
                generation,
            ))),
        ),
        ("issued_at", s("2026-01-01T00:00:00.000000Z")),
        ("expires_at", s("2099-01-01T00:00:00.000000Z")),
    ]
}

fn contract(inc: &str, generation: u64, reservation: &str, task: &str) -> Envelope<Verified> {
    let (scope, holds) = (
        format!("sha256:{}", "5".repeat(64)),
        format!("sha256:{}", "6".repeat(64)),
    );
    let mut f = chain(inc, generation, reservation);
    f.extend([
        (
            "contracts_digest",
            s(&mosaic::protocol::contracts_digest(task, &scope, &holds)),
        ),
        ("scope_digest", s(&scope)),
        ("holds_digest", s(&holds)),
        ("task_text", s(task)),
    ]);
    coord(MessageType::Contract, f)
}

/// Hands the host a coordinator envelope as its link does: converted to its typed message
/// first (a test envelope that does not convert is a bug in the test).
trait Deliver {
    async fn deliver(&self, env: Envelope<Verified>);
}

impl Deliver for std::sync::Arc<CoordinatedHost> {
    async fn deliver(&self, env: Envelope<Verified>) {
        let msg = ToHost::decode(&env)
            .expect("a well-formed coordinator message")
            .expect("a message the coordinator sends hosts");
        self.dispatch(env, msg).await
    }
}

/// The contract digest an `injected` reports delivered.
fn delivered(env: &Envelope<Verified>) -> String {
    match FromHostChain::decode(env) {
        Ok(Some(FromHostChain::Injected(m))) => m.delivered_contracts_digest,
        other => panic!("not an injected: {other:?}"),
    }
}

async fn next(rx: &mut mpsc::Receiver<Outgoing>, within: Duration) -> Option<Envelope<Verified>> {
    let out = tokio::time::timeout(within, rx.recv()).await.ok()??;
    let bytes = Sequencer::new("sess-test").seal(out, COORD).unwrap();
    let reg = registry();
    Some(
        verify(
            &bytes,
            &mosaic::protocol::VerifyContext {
                now: std::time::SystemTime::now(),
                ..ctx(&reg, COORD)
            },
        )
        .unwrap(),
    )
}

/// A real supervisor (no coordinator link: the test plays the coordinator) with its own
/// cgroup root and state, removed on drop.
fn world() -> (Supervisor, World) {
    common::require_host();
    let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let dir = std::env::temp_dir().join(format!("mosaic-stale-{id}"));
    let root = mosaic::cgroup::discover_mount()
        .unwrap()
        .path
        .join(format!("mosaic-test-{id}"));
    let cfg = Config::from_file(ConfigFile {
        host_id: Some("h1".into()),
        cgroup_root: Some(root.clone()),
        bin_dir: Some(
            std::path::Path::new(common::MOSAIC)
                .parent()
                .unwrap()
                .to_path_buf(),
        ),
        ..ConfigFile::new(dir.join("state"), dir.join("run"))
    })
    .unwrap();
    let sup = Supervisor::open(cfg).unwrap();
    let w = World {
        sup: sup.clone(),
        dir,
        root,
    };
    (sup, w)
}

/// The host's side of the chain over `sup`, with the channel its outgoing envelopes land on.
async fn coordinated(
    sup: &Supervisor,
) -> (std::sync::Arc<CoordinatedHost>, mpsc::Receiver<Outgoing>) {
    let (tx, rx) = mpsc::channel(64);
    let host = CoordinatedHost::new(
        sup.clone(),
        std::sync::Arc::new(signer("host-ordinary")),
        std::sync::Arc::new(signer("host-session")),
        tx,
    )
    .await;
    (host, rx)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_for_a_replaced_generation_is_rejected_and_never_reaches_the_new_one() {
    let (sup, w) = world();
    let inc = sup.lane_create("lane-1").await.unwrap().lane_incarnation_id;
    let (host, mut rx) = coordinated(&sup).await;

    // Generation 1 is staged, then replaced by generation 2 (new reservation).
    host.deliver(stage(&inc, 1, "rs-1")).await;
    let staged = next(&mut rx, Duration::from_secs(20))
        .await
        .expect("staged for generation 1");
    assert_eq!(
        (staged.message_type(), staged.address().generation),
        (MessageType::Staged, Some(1))
    );
    host.deliver(stage(&inc, 2, "rs-2")).await;
    let staged = next(&mut rx, Duration::from_secs(20))
        .await
        .expect("staged for generation 2");
    assert_eq!(staged.address().generation, Some(2));

    // The old generation's contract (and an activation for it) arrive late: rejected and
    // audited.
    host.deliver(contract(&inc, 1, "rs-1", "print=stale-task"))
        .await;
    let mut activate = chain(&inc, 1, "rs-1");
    activate.extend([
        ("contracts_digest", s(&format!("sha256:{}", "c".repeat(64)))),
        ("scope_digest", s(&format!("sha256:{}", "5".repeat(64)))),
        ("holds_digest", s(&format!("sha256:{}", "6".repeat(64)))),
        ("control_op", s("activate")),
    ]);
    host.deliver(coord(MessageType::Control, activate)).await;
    let audit = std::fs::read_to_string(sup.audit_path()).unwrap();
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains(
                "\"category\":\"stale-generation\",\"lane\":\"h1:lane-1\",\"generation\":1"
            ))
            .count(),
        2,
        "{audit}"
    );

    assert!(
        !audit.contains("stale-task"),
        "payload leaked into the audit log: {audit}"
    );
    let st = sup.status().await.unwrap();
    assert_eq!(
        st.lanes[0].current_generation,
        Some(2),
        "the late activation reached the new generation"
    );

    // The current generation's own contract does get through — and it is the first thing
    // generation 2's harness was given: had the stale contract reached it (it was handled
    // first, on the same ordered path), the harness would have fetched that one and the
    // digest it reports delivered would be the stale task's.
    host.deliver(contract(&inc, 2, "rs-2", "print=fresh-task"))
        .await;
    let injected = next(&mut rx, Duration::from_secs(20))
        .await
        .expect("injected for generation 2");
    assert_ne!(
        delivered(&injected),
        mosaic::protocol::contracts_digest(
            "print=stale-task",
            &format!("sha256:{}", "5".repeat(64)),
            &format!("sha256:{}", "6".repeat(64))
        ),
        "the stale contract reached generation 2"
    );
    assert_eq!(
        (injected.message_type(), injected.address().generation),
        (MessageType::Injected, Some(2))
    );
    assert_eq!(
        delivered(&injected),
        mosaic::protocol::contracts_digest(
            "print=fresh-task",
            &format!("sha256:{}", "5".repeat(64)),
            &format!("sha256:{}", "6".repeat(64))
        )
    );
    drop(w);
}

/// The receipts in the host's outbox (pending or acknowledged) for one lane id.
fn receipts_of(
    sup: &Supervisor,
    lane_id: &str,
) -> Vec<mosaic::supervisor::receipt::TerminationReceipt> {
    sup.receipts(None, true)
        .unwrap()
        .into_iter()
        .filter(|r| r.lane_id == lane_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stage_the_host_cannot_start_is_refused_with_a_never_started_receipt() {
    use mosaic::supervisor::receipt::TerminationReason;
    let (sup, w) = world();
    let inc = sup.lane_create("lane-1").await.unwrap().lane_incarnation_id;
    let (host, mut rx) = coordinated(&sup).await;
    let settle = || tokio::time::sleep(Duration::from_millis(200));

    // A stale incarnation: nothing starts, a never-started receipt ends the chain.
    host.deliver(stage("li-stale", 1, "rs-a")).await;
    settle().await;
    let r = receipts_of(&sup, "h1:lane-1");
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (
            r[0].lane_incarnation_id.as_str(),
            r[0].generation,
            r[0].termination_reason
        ),
        ("li-stale", 1, TerminationReason::NeverStarted)
    );
    assert!(r[0].cleanup.verified_empty && r[0].process_identity.is_none());
    assert!(
        sup.status().await.unwrap().lanes[0].generation.is_none(),
        "something started"
    );

    // Ended by the coordinator before it ever started: fenced for good, so a late stage
    // for that number is refused and writes nothing new.
    let orders = mosaic::protocol::report::to_value(&std::collections::BTreeMap::from([(
        "h1:lane-1".to_string(),
        mosaic::protocol::report::LaneOrderWire {
            lane_incarnation_id: inc.clone(),
            end: vec![5],
            hold: vec![],
            release: vec![],
            recreate: false,
            create: false,
            destroy: false,
        },
    )]))
    .unwrap();
    let rec = signer("coord-session")
        .sign(
            MessageType::Reconcile,
            HOST,
            vec![
                ("message_id", s("m-rec")),
                ("idempotency_key", s("k-rec")),
                ("sot_incarnation", s("sot-1")),
                ("coordinator_epoch", n(7)),
                ("assignment_id", Value::Null),
                ("session_id", s("sess-1")),
                ("lanes", orders),
            ],
        )
        .unwrap();
    let reg = registry();
    let rec = verify(
        &rec,
        &mosaic::protocol::VerifyContext {
            now: std::time::SystemTime::now(),
            ..ctx(&reg, HOST)
        },
    )
    .unwrap();
    host.deliver(rec).await;
    common::wait_until("generation 5 fenced", || {
        receipts_of(&sup, "h1:lane-1")
            .iter()
            .any(|r| r.generation == 5)
            .then_some(())
    });
    host.deliver(stage(&inc, 5, "rs-b")).await;
    settle().await;
    let fenced: Vec<_> = receipts_of(&sup, "h1:lane-1")
        .into_iter()
        .filter(|r| r.lane_incarnation_id == inc)
        .collect();
    assert_eq!(
        fenced.len(),
        1,
        "one receipt for generation 5, never a second: {fenced:?}"
    );
    assert!(
        sup.status().await.unwrap().lanes[0].generation.is_none(),
        "a fenced generation started"
    );
    // The lane itself still works: the next generation starts and reports `staged`.
    host.deliver(stage(&inc, 6, "rs-c")).await;
    let staged = next(&mut rx, Duration::from_secs(20))
        .await
        .expect("staged for generation 6");
    assert_eq!(staged.address().generation, Some(6));

    // An unknown lane of this host: refused the same way.
    host.deliver(coord(MessageType::Stage, {
        let mut f = chain("li-x", 1, "rs-d");
        f.retain(|(k, _)| *k != "lane_id" && *k != "fence_proof");
        f.push(("lane_id", s("h1:lane-9")));
        f.push((
            "fence_proof",
            s(&mosaic::protocol::fence::commitment(&reveal("rs-d", 1))),
        ));
        f
    }))
    .await;
    settle().await;
    assert_eq!(
        receipts_of(&sup, "h1:lane-9")[0].termination_reason,
        TerminationReason::NeverStarted
    );

    // A lane the host quarantined (its tmux server vanished) refuses to stage.
    let _ = std::process::Command::new("tmux")
        .arg("-S")
        .arg(w.dir.join("run/lanes/lane-1/tmux.sock"))
        .arg("kill-server")
        .status();
    host.deliver(stage(&inc, 7, "rs-e")).await;
    common::wait_until("generation 7 refused", || {
        receipts_of(&sup, "h1:lane-1")
            .into_iter()
            .find(|r| r.generation == 7 && r.lane_incarnation_id == inc)
    });
    let st = sup.status().await.unwrap();
    assert_eq!(format!("{:?}", st.lanes[0].status), "Quarantined");
    drop(w);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_without_its_generations_authority_is_refused_by_the_host() {
    let (sup, w) = world();
    let inc = sup.lane_create("lane-1").await.unwrap().lane_incarnation_id;
    let (host, mut rx) = coordinated(&sup).await;
    host.deliver(stage(&inc, 1, "rs-1")).await;
    next(&mut rx, Duration::from_secs(20))
        .await
        .expect("staged for generation 1");
    // The contract of generation 1, wrong in exactly one authority field each time.
    let bad: [(&str, &str, Value); 4] = [
        (
            "fence-proof-refused",
            "fence_proof",
            s(&mosaic::protocol::fence::reveal(&[9u8; 32])),
        ),
        (
            "fence-proof-refused",
            "fence_proof",
            s(&mosaic::protocol::fence::commitment(&reveal("rs-1", 1))),
        ),
        ("other-epoch", "coordinator_epoch", n(8)),
        ("other-timeline", "sot_incarnation", s("sot-2")),
    ];
    for (i, (_, field, value)) in bad.iter().enumerate() {
        let task = format!("print=forged-{i}");
        let mut f = chain(&inc, 1, "rs-1");
        f.retain(|(k, _)| k != field);
        f.push((field, value.clone()));
        let (scope, holds) = (
            format!("sha256:{}", "5".repeat(64)),
            format!("sha256:{}", "6".repeat(64)),
        );
        f.extend([
            (
                "contracts_digest",
                s(&mosaic::protocol::contracts_digest(&task, &scope, &holds)),
            ),
            ("scope_digest", s(&scope)),
            ("holds_digest", s(&holds)),
            ("task_text", s(&task)),
        ]);
        host.deliver(coord(MessageType::Contract, f)).await;
    }
    let audit = std::fs::read_to_string(sup.audit_path()).unwrap();
    for (category, _, _) in &bad {
        assert!(
            audit.contains(&format!("\"category\":\"{category}\"")),
            "no {category} refusal: {audit}"
        );
    }
    assert!(
        !audit.contains("forged-"),
        "payload in the audit log: {audit}"
    );
    // None reached the harness: the first contract it is given is the genuine one.
    host.deliver(contract(&inc, 1, "rs-1", "print=genuine"))
        .await;
    let injected = next(&mut rx, Duration::from_secs(20))
        .await
        .expect("injected for generation 1");
    assert_eq!(
        delivered(&injected),
        mosaic::protocol::contracts_digest(
            "print=genuine",
            &format!("sha256:{}", "5".repeat(64)),
            &format!("sha256:{}", "6".repeat(64))
        ),
        "a contract without its generation's authority reached the harness"
    );
    drop(w);
}

/// Regression (the launch defect, coordinated half): a coordinated launch that fails after
/// its cgroup exists — here serving its lane socket — ends with its own observed
/// launch-failed receipt (exactly one: the refusal that follows adds none), and the lane
/// takes the next stage.
#[tokio::test(flavor = "multi_thread")]
async fn launch_failing_at_the_lane_socket_keeps_its_observed_receipt() {
    use mosaic::supervisor::receipt::TerminationReason;
    assert!(
        mosaic::coordinator::failpoint::enabled(),
        "this test injects a failure and needs a failpoints build (scripts/test makes one)"
    );
    let (sup, w) = world();
    let inc = sup.lane_create("lane-1").await.unwrap().lane_incarnation_id;
    // Scoped to this lane incarnation (the other tests of this process stage too), and
    // removed once it has fired, so the lane's next stage goes through.
    let point = mosaic::supervisor::LaunchStep::LaneSocket.failpoint();
    #[cfg(feature = "failpoints")]
    fail::cfg(&point, &format!("return({inc})")).unwrap();
    let (host, mut rx) = coordinated(&sup).await;
    host.deliver(stage(&inc, 1, "rs-1")).await;
    let started = std::time::Instant::now();
    let r = loop {
        let r = receipts_of(&sup, "h1:lane-1");
        if !r.is_empty() {
            break r;
        }
        assert!(
            started.elapsed() < common::PATIENCE,
            "no receipt for the failed launch"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    #[cfg(feature = "failpoints")]
    fail::remove(&point);
    let _ = &point;
    // Give the refusal path its chance to (wrongly) write a second receipt.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r2 = receipts_of(&sup, "h1:lane-1");
    assert_eq!(r2.len(), 1, "{r2:?}");
    assert_eq!(r[0].receipt_id, r2[0].receipt_id);
    assert_eq!(r2[0].generation, 1);
    assert_eq!(r2[0].termination_reason, TerminationReason::LaunchFailed);
    assert!(
        r2[0]
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("launch:lane-socket"),
        "{:?}",
        r2[0].detail
    );
    assert!(r2[0].cleanup.verified_empty && r2[0].cleanup.cgroup_removed);
    let st = sup.status().await.unwrap();
    assert!(st.lanes[0].generation.is_none(), "something still runs");
    assert_eq!(
        st.lanes[0].status,
        mosaic::supervisor::state::LaneStatus::Active
    );

    host.deliver(stage(&inc, 2, "rs-2")).await;
    let staged = loop {
        let m = next(&mut rx, Duration::from_secs(20))
            .await
            .expect("staged for generation 2");
        if m.message_type() == MessageType::Staged {
            break m;
        }
    };
    assert_eq!(staged.address().generation, Some(2));
    drop(w);
}

/// Regression (a false receipt): a never-started receipt may be written only for a
/// generation that was never begun here. One that was begun (its record exists) and has
/// no receipt yet — it runs, or its receipt is not durable yet — is refused that shortcut,
/// and nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn a_begun_generation_is_never_receipted_as_never_started() {
    let (sup, w) = world();
    let inc = sup.lane_create("lane-1").await.unwrap().lane_incarnation_id;
    let g = sup
        .start("lane-1", "fake@1.0.0", &["hang".to_string()])
        .await
        .unwrap();
    assert_eq!(g.generation, 1);
    let refused = sup.refuse_generation("h1:lane-1", &inc, 1, "fake@1.0.0", "test");
    assert!(
        refused.is_err(),
        "a never-started receipt was accepted for a running generation"
    );
    assert!(receipts_of(&sup, "h1:lane-1").is_empty());
    // A number never begun here is fenced as before.
    sup.refuse_generation("h1:lane-1", &inc, 7, "fake@1.0.0", "test")
        .unwrap();
    let r = receipts_of(&sup, "h1:lane-1");
    assert_eq!((r.len(), r[0].generation), (1, 7));
    sup.stop("lane-1").await.unwrap();
    drop(w);
}

/// A reconcile that recreates a lane names the incarnation it means: the same order again
/// (the coordinator sends it on every report until it sees the new incarnation) finds
/// another incarnation and does nothing — it once destroyed the fresh incarnation and what
/// had just been staged on it.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_recreate_order_leaves_the_fresh_incarnation_alone() {
    let (sup, w) = world();
    let old = sup.lane_create("lane-1").await.unwrap().lane_incarnation_id;
    let (host, _rx) = coordinated(&sup).await;
    let reg = registry();
    let recreate = |id: &str| {
        let orders = mosaic::protocol::report::to_value(&std::collections::BTreeMap::from([(
            "h1:lane-1".to_string(),
            mosaic::protocol::report::LaneOrderWire {
                lane_incarnation_id: old.clone(),
                end: vec![],
                hold: vec![],
                release: vec![],
                recreate: true,
                create: false,
                destroy: false,
            },
        )]))
        .unwrap();
        let env = signer("coord-session")
            .sign(
                MessageType::Reconcile,
                HOST,
                vec![
                    ("message_id", s(&format!("m-{id}"))),
                    ("idempotency_key", s(&format!("k-{id}"))),
                    ("sot_incarnation", s("sot-1")),
                    ("coordinator_epoch", n(7)),
                    ("assignment_id", Value::Null),
                    ("session_id", s("sess-1")),
                    ("lanes", orders),
                ],
            )
            .unwrap();
        verify(
            &env,
            &mosaic::protocol::VerifyContext {
                now: std::time::SystemTime::now(),
                ..ctx(&reg, HOST)
            },
        )
        .unwrap()
    };
    let current = || async {
        sup.status()
            .await
            .unwrap()
            .lanes
            .first()
            .map(|l| l.lane_incarnation_id.clone())
    };
    host.deliver(recreate("1")).await;
    let fresh = loop {
        if let Some(i) = current().await.filter(|i| *i != old) {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    host.deliver(recreate("2")).await;
    // The host's own word that it refused the repeat (the audit line), then the lane.
    let path = sup.audit_path();
    tokio::task::block_in_place(|| {
        common::wait_until("the repeat refused", || {
            std::fs::read_to_string(&path)
                .ok()?
                .contains("recreate-of-another-incarnation")
                .then_some(())
        })
    });
    assert_eq!(
        current().await.as_deref(),
        Some(fresh.as_str()),
        "the repeated order recreated the fresh incarnation"
    );
    drop(w);
}
