//! The coordinator's authority core against a real PostgreSQL (spec §17 rows: replayed
//! ACK, duplicate activation, consumed activation ACK, split-brain / stale epoch, epoch
//! takeover, lane reincarnation, forged ACK fields, reservation-chain substitution, clock
//! rollback/skew, premature completion, activation/lease crash, raw token leakage, and a
//! 32-way activation race). Every rejection row checks that nothing changed.

mod pg;

use mosaic::coordinator::chain::{AssignmentView, LaneView};
use mosaic::coordinator::lifecycle::Reconciliation;
use mosaic::coordinator::{
    AckClaim, Activation, AuthorityError, Candidate, Category, Chain, CoordinatorSecret, Leader,
    Outcome, ReserveRequest, Reserved, Store,
};
use pg::TestDb;
use serde_json::json;

fn d(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn candidate(name: &str) -> Candidate {
    Candidate {
        holder: format!("coordinator:{name}"),
        credential_digest: d('c'),
        launch_id: format!("launch-{}", uuid::Uuid::new_v4().simple()),
    }
}

fn key(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

const TARGET: &str = "host:h1/w1";

struct Fx {
    db: TestDb,
    store: Store,
    leader: Leader,
    lane: LaneView,
}

async fn fx() -> Fx {
    let db = TestDb::new();
    let store = Store::connect(&db.url, CoordinatorSecret::generate().unwrap())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let (leader, _) = store.acquire(&candidate("a"), 60_000).await.unwrap();
    let lane = store.register_lane(&leader, "h1:w1", "h1").await.unwrap();
    Fx {
        db,
        store,
        leader,
        lane,
    }
}

fn identity(pid: i64) -> serde_json::Value {
    json!({ "boot_id": "b-1", "cgroup_id": 158, "cgroup_path": "/mosaic/lanes/w1/gen", "exe_dev": 1, "exe_ino": 2,
            "launch_nonce_digest": "ab".repeat(32), "root_pid": pid, "root_start_time": 1000 + pid })
}

fn request(inc: &str, assignment: Option<&str>, ttl_ms: i64) -> ReserveRequest {
    ReserveRequest {
        lane_incarnation_id: inc.into(),
        assignment_id: assignment.map(String::from),
        target: TARGET.into(),
        runtime_id: "fake@1.0.0".into(),
        scope_digest: d('5'),
        holds_digest: d('6'),
        completion_policy_digest: d('7'),
        next_action: "run the task".into(),
        ttl_ms,
        idempotency_key: key("reserve"),
    }
}

/// A chain driven to AWAITING_ACK, with everything needed to ACK and activate it.
struct Ready {
    res: Reserved,
    generation: i64,
    identity: serde_json::Value,
    contracts: String,
    challenge: String,
}

impl Ready {
    fn chain(&self) -> &Chain {
        &self.res.chain
    }
}

async fn to_awaiting_ack(
    s: &Store,
    l: &Leader,
    inc: &str,
    assignment: Option<&str>,
    ttl_ms: i64,
) -> Ready {
    let res = s
        .reserve(l, &request(inc, assignment, ttl_ms))
        .await
        .unwrap();
    let c = res.chain.clone();
    s.checkpoint(l, &c, &key("ck")).await.unwrap();
    s.fence(l, &c, &key("fe")).await.unwrap();
    let (generation, _) = s.stage(l, &c, &key("st")).await.unwrap();
    let identity = identity(4000 + generation);
    s.record_staged(l, &c, generation, &identity, &key("sd"))
        .await
        .unwrap();
    let (contracts, _) = s
        .record_contract(l, &c, "spawn=3 print=hello", &d('5'), &d('6'), &key("ct"))
        .await
        .unwrap();
    let (challenge, _, _) = s
        .record_injected(l, &c, &contracts, &identity, 60_000, &key("in"))
        .await
        .unwrap();
    Ready {
        res,
        generation,
        identity,
        contracts,
        challenge,
    }
}

fn ack(l: &Leader, r: &Ready) -> AckClaim {
    let c = r.chain();
    AckClaim {
        challenge_id: r.challenge.clone(),
        sot_incarnation: l.sot().into(),
        coordinator_epoch: l.epoch(),
        reservation_id: c.reservation_id.clone(),
        reservation_epoch: c.reservation_epoch,
        reservation_deadline: r.res.deadline.clone(),
        lane_id: c.lane_id.clone(),
        lane_incarnation_id: c.lane_incarnation_id.clone(),
        assignment_id: c.assignment_id.clone(),
        assignment_attempt_id: c.assignment_attempt_id.clone(),
        generation: r.generation,
        process_identity: r.identity.clone(),
        contracts_digest: r.contracts.clone(),
        scope_digest: d('5'),
        holds_digest: d('6'),
        runtime_id: "fake@1.0.0".into(),
        ack_digest: d('a'),
        idempotency_key: key("ack"),
    }
}

fn activation(r: &Ready) -> Activation {
    Activation {
        chain: r.chain().clone(),
        target: TARGET.into(),
        reservation_lease_id: r.res.reservation_lease_id.clone(),
        reservation_deadline: r.res.deadline.clone(),
        generation: r.generation,
        fence_token: r
            .res
            .fence_token
            .clone()
            .expect("fresh reservation carries its token"),
        challenge_id: r.challenge.clone(),
        ack_digest: d('a'),
        contracts_digest: r.contracts.clone(),
        scope_digest: d('5'),
        holds_digest: d('6'),
        process_identity: r.identity.clone(),
        completion_policy_digest: d('7'),
        lease_scopes: vec!["repo-write".into(), "effect".into()],
        lease_ttl_ms: 60_000,
        idempotency_key: key("act"),
    }
}

fn category<T: std::fmt::Debug>(r: Result<T, AuthorityError>) -> Category {
    match r {
        Err(e) => e
            .category()
            .unwrap_or_else(|| panic!("not a rejection: {e}")),
        Ok(v) => panic!("expected a rejection, got {v:?}"),
    }
}

async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

async fn count(url: &str, q: &str) -> i64 {
    sql(url).await.query_one(q, &[]).await.unwrap().get(0)
}

async fn state(s: &Store, lane: &str) -> String {
    s.lane(lane).await.unwrap().unwrap().state
}

async fn assignment(s: &Store, id: &str) -> AssignmentView {
    s.assignment(id).await.unwrap().unwrap()
}

fn receipt_for(r: &Ready, reason: &str, verified: bool) -> serde_json::Value {
    let c = r.chain();
    json!({ "idempotency_key": format!("tr-{}", uuid::Uuid::new_v4().simple()), "lane_id": c.lane_id, "lane_incarnation_id": c.lane_incarnation_id,
            "generation": r.generation, "termination_reason": reason, "observation_source": "shim",
            "cleanup": { "verified_empty": verified, "cgroup_removed": verified } })
}

#[tokio::test]
async fn the_full_chain_round_trips_with_owners_and_receipts() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    assert_eq!(f.lane.state, "IDLE_CLEAN");
    let r = to_awaiting_ack(s, l, &inc, None, 60_000).await;
    let a = assignment(s, &r.chain().assignment_id).await;
    // Initial assignment owners (spec §4): responsibility = pending = target, no executor.
    assert_eq!(
        (
            a.responsibility_owner.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        (TARGET, None, Some(TARGET))
    );
    assert_eq!(state(s, "h1:w1").await, "AWAITING_ACK");
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM leases").await,
        0,
        "staging must hold no effect lease"
    );
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "READY");
    let act = s.activate(l, &activation(&r)).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "RUNNING");
    assert_eq!(act.body["leases"].as_array().unwrap().len(), 2);
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (a.execution_owner.as_deref(), a.pending_target.as_deref()),
        (Some(TARGET), None)
    );
    s.drain(l, r.chain(), Outcome::Completed, &key("dr"))
        .await
        .unwrap();
    assert_eq!(
        assignment(s, &r.chain().assignment_id).await.lifecycle,
        "ACTIVE",
        "draining is not terminal"
    );
    s.retire(l, r.chain(), &d('e'), &key("re")).await.unwrap();
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (a.lifecycle.as_str(), a.execution_owner.as_deref()),
        ("COMPLETED", None)
    );
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM leases WHERE released_at IS NULL"
        )
        .await,
        0
    );
    let tr = receipt_for(&r, "quit", true);
    let (rec, _) = s.ingest_termination(l, &tr).await.unwrap();
    assert_eq!(rec, Reconciliation::RetirementEvidence);
    s.finish(
        l,
        r.chain(),
        tr["idempotency_key"].as_str().unwrap(),
        &key("fi"),
    )
    .await
    .unwrap();
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
    // A receipt for every transition, all under this epoch and timeline.
    let n = count(&f.db.url, &format!("SELECT count(*) FROM transition_receipts WHERE coordinator_epoch = {} AND sot_incarnation = '{}'", l.epoch(), l.sot())).await;
    assert_eq!(
        n,
        1 + 1 + 13,
        "acquire + lane-register + twelve chain transitions + the receipt ingestion"
    );

    // The lane takes a fresh chain, and the generation number moves on.
    let r2 = to_awaiting_ack(s, l, &inc, None, 60_000).await;
    assert_eq!(r2.generation, r.generation + 1);
}

#[tokio::test]
async fn a_replayed_ack_is_rejected_and_changes_nothing() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    let a = ack(l, &r);
    let first = s.consume_ack(l, &a).await.unwrap();
    // The same request again (same idempotency key) is the same answer, not a second use.
    assert_eq!(s.consume_ack(l, &a).await.unwrap(), first);
    // A replay under a new key is a second use: refused, audited, nothing moves.
    let mut again = a.clone();
    again.idempotency_key = key("ack-replay");
    assert_eq!(
        category(s.consume_ack(l, &again).await),
        Category::ChallengeConsumed
    );
    assert_eq!(state(s, "h1:w1").await, "READY");
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM ack_receipts").await,
        1
    );
    assert_eq!(count(&f.db.url, "SELECT count(*) FROM audit WHERE operation = 'consume-ack' AND category = 'challenge-consumed'").await, 1);
    // Same key, different request: refused as a conflict.
    let mut other = a.clone();
    other.ack_digest = d('b');
    assert_eq!(
        category(s.consume_ack(l, &other).await),
        Category::IdempotencyConflict
    );
    // ACK receipts are immutable.
    let c = sql(&f.db.url).await;
    assert!(c
        .execute("UPDATE ack_receipts SET ack_digest = 'x'", &[])
        .await
        .is_err());
    assert!(c.execute("DELETE FROM ack_receipts", &[]).await.is_err());
}

#[tokio::test]
async fn every_forged_ack_field_is_rejected() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    let good = ack(l, &r);
    type Forge = (&'static str, fn(&mut AckClaim), Category);
    let rows: Vec<Forge> = vec![
        (
            "challenge_id",
            |a| a.challenge_id = "ch-forged".into(),
            Category::NotFound,
        ),
        (
            "sot_incarnation",
            |a| a.sot_incarnation = "sot-other".into(),
            Category::StaleLeader,
        ),
        (
            "coordinator_epoch",
            |a| a.coordinator_epoch += 1,
            Category::StaleLeader,
        ),
        (
            "reservation_id",
            |a| a.reservation_id = "rs-other".into(),
            Category::Mismatch,
        ),
        (
            "reservation_epoch",
            |a| a.reservation_epoch += 1,
            Category::Mismatch,
        ),
        (
            "reservation_deadline (a host extending it)",
            |a| a.reservation_deadline = "2999-01-01T00:00:00.000000Z".into(),
            Category::Mismatch,
        ),
        (
            "lane_id",
            |a| a.lane_id = "h1:w2".into(),
            Category::Mismatch,
        ),
        (
            "lane_incarnation_id",
            |a| a.lane_incarnation_id = "li-other".into(),
            Category::Mismatch,
        ),
        (
            "assignment_id",
            |a| a.assignment_id = "as-other".into(),
            Category::Mismatch,
        ),
        (
            "assignment_attempt_id",
            |a| a.assignment_attempt_id = "at-other".into(),
            Category::Mismatch,
        ),
        ("generation", |a| a.generation += 1, Category::Mismatch),
        (
            "process_identity",
            |a| a.process_identity["root_pid"] = json!(1),
            Category::Mismatch,
        ),
        (
            "process identity start time (PID reuse)",
            |a| a.process_identity["root_start_time"] = json!(7),
            Category::Mismatch,
        ),
        (
            "contracts_digest",
            |a| a.contracts_digest = d('0'),
            Category::Mismatch,
        ),
        (
            "scope_digest",
            |a| a.scope_digest = d('0'),
            Category::Mismatch,
        ),
        (
            "holds_digest",
            |a| a.holds_digest = d('0'),
            Category::Mismatch,
        ),
        (
            "runtime_id",
            |a| a.runtime_id = "fake@1.0.1".into(),
            Category::Mismatch,
        ),
    ];
    for (field, forge, want) in rows {
        let mut a = good.clone();
        forge(&mut a);
        a.idempotency_key = key("forged");
        assert_eq!(category(s.consume_ack(l, &a).await), want, "forged {field}");
        assert_eq!(
            state(s, "h1:w1").await,
            "AWAITING_ACK",
            "forged {field} moved the lane"
        );
        assert_eq!(
            count(
                &f.db.url,
                "SELECT count(*) FROM challenges WHERE consumed_at IS NOT NULL"
            )
            .await,
            0,
            "forged {field} consumed the challenge"
        );
    }
    // The genuine ACK still works afterwards.
    s.consume_ack(l, &good).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "READY");
}

#[tokio::test]
async fn duplicate_activation_returns_the_original_receipt_and_no_new_leases() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    let x = activation(&r);
    let first = s.activate(l, &x).await.unwrap();
    assert_eq!(
        s.activate(l, &x).await.unwrap(),
        first,
        "a retry with the same key must return the original receipt"
    );
    let mut again = x.clone();
    again.idempotency_key = key("act-2");
    assert_eq!(category(s.activate(l, &again).await), Category::WrongState);
    assert_eq!(count(&f.db.url, "SELECT count(*) FROM leases").await, 2);
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM transition_receipts WHERE transition = 'activate'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn activation_validates_the_persisted_consumed_ack_and_every_expected_value() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    // Not yet READY: no consumed ACK, no activation.
    assert_eq!(
        category(s.activate(l, &activation(&r)).await),
        Category::WrongState
    );
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    type Sub = (&'static str, fn(&mut Activation), Category);
    let rows: Vec<Sub> = vec![
        (
            "ack receipt digest",
            |x| x.ack_digest = d('b'),
            Category::Mismatch,
        ),
        (
            "challenge id",
            |x| x.challenge_id = "ch-other".into(),
            Category::Mismatch,
        ),
        (
            "fence token",
            |x| x.fence_token = mosaic::coordinator::FenceToken::generate().unwrap(),
            Category::FenceMismatch,
        ),
        (
            "target (responsibility / pending)",
            |x| x.target = "host:h9/w1".into(),
            Category::Mismatch,
        ),
        (
            "reservation lease",
            |x| x.reservation_lease_id = "rl-other".into(),
            Category::Mismatch,
        ),
        (
            "reservation deadline",
            |x| x.reservation_deadline = "2999-01-01T00:00:00.000000Z".into(),
            Category::Mismatch,
        ),
        ("generation", |x| x.generation += 1, Category::Mismatch),
        (
            "contracts digest",
            |x| x.contracts_digest = d('0'),
            Category::Mismatch,
        ),
        (
            "scope digest",
            |x| x.scope_digest = d('0'),
            Category::Mismatch,
        ),
        (
            "holds digest",
            |x| x.holds_digest = d('0'),
            Category::Mismatch,
        ),
        (
            "process identity",
            |x| x.process_identity["root_pid"] = json!(1),
            Category::Mismatch,
        ),
        (
            "completion policy",
            |x| x.completion_policy_digest = d('0'),
            Category::Mismatch,
        ),
        (
            "attempt",
            |x| x.chain.assignment_attempt_id = "at-other".into(),
            Category::Mismatch,
        ),
        (
            "lane id",
            |x| x.chain.lane_id = "h1:w2".into(),
            Category::Mismatch,
        ),
    ];
    for (what, sub, want) in rows {
        let mut x = activation(&r);
        sub(&mut x);
        assert_eq!(
            category(s.activate(l, &x).await),
            want,
            "substituted {what}"
        );
        assert_eq!(
            state(s, "h1:w1").await,
            "READY",
            "substituted {what} activated"
        );
        assert_eq!(count(&f.db.url, "SELECT count(*) FROM leases").await, 0);
    }
    s.activate(l, &activation(&r)).await.unwrap();
}

#[tokio::test]
async fn thirty_two_concurrent_activations_have_exactly_one_winner() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    let base = activation(&r);
    let mut tasks = Vec::new();
    for i in 0..32 {
        let (s, l, mut x) = (s.clone(), l.clone(), base.clone());
        x.idempotency_key = format!("race-{i}");
        tasks.push(tokio::spawn(async move { s.activate(&l, &x).await }));
    }
    let mut wins = 0;
    let mut losses = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => wins += 1,
            Err(e) => {
                assert!(
                    e.category().is_some(),
                    "a loser failed with a non-rejection: {e}"
                );
                losses += 1;
            }
        }
    }
    assert_eq!((wins, losses), (1, 31));
    assert_eq!(count(&f.db.url, "SELECT count(*) FROM leases").await, 2);
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM transition_receipts WHERE transition = 'activate'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM audit WHERE operation = 'activate'"
        )
        .await,
        31,
        "every loser is audited"
    );
}

#[tokio::test]
async fn split_brain_the_stale_coordinator_can_do_nothing() {
    let f = fx().await;
    let s = &f.store;
    let inc = f.lane.lane_incarnation_id.clone();
    // A releases; old leader B takes a short lease, starts a chain, then stalls past expiry.
    s.release(&f.leader).await.unwrap();
    let (b, _) = s.acquire(&candidate("b"), 400).await.unwrap();
    let r = to_awaiting_ack(s, &b, &inc, None, 60_000).await;
    let b_ack = ack(&b, &r);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // C takes over (the lease expired by database time).
    let (c, _) = s.acquire(&candidate("c"), 60_000).await.unwrap();
    assert!(c.epoch() > b.epoch());
    // Everything B tries is refused and audited.
    s.register_lane(&c, "h1:w2", "h1").await.unwrap();
    let inc2 = s.lane("h1:w2").await.unwrap().unwrap().lane_incarnation_id;
    assert_eq!(
        category(s.reserve(&b, &request(&inc2, None, 60_000)).await),
        Category::StaleLeader
    );
    assert_eq!(
        category(s.consume_ack(&b, &b_ack).await),
        Category::StaleLeader
    );
    assert_eq!(
        category(s.activate(&b, &activation(&r)).await),
        Category::StaleLeader
    );
    assert_eq!(
        category(
            s.ingest_termination(&b, &receipt_for(&r, "sigkill", true))
                .await
        ),
        Category::StaleLeader
    );
    let mut b2 = b.clone();
    assert_eq!(
        category(s.renew(&mut b2, 60_000).await),
        Category::StaleLeader
    );
    assert!(
        count(
            &f.db.url,
            "SELECT count(*) FROM audit WHERE category = 'stale-leader'"
        )
        .await
            >= 4
    );
    // The takeover dispositioned B's preactivation chain: quarantined, assignment in recovery.
    assert_eq!(state(s, "h1:w1").await, "QUARANTINED");
    assert_eq!(
        assignment(s, &r.chain().assignment_id).await.lifecycle,
        "RECOVERY"
    );
    // And the old ACK cannot activate under the new epoch either.
    let mut c_ack = b_ack.clone();
    c_ack.coordinator_epoch = c.epoch();
    c_ack.idempotency_key = key("re-ack");
    assert!(s.consume_ack(&c, &c_ack).await.is_err());
}

#[tokio::test]
async fn concurrent_epoch_acquisitions_yield_one_epoch() {
    let f = fx().await;
    let s = &f.store;
    s.release(&f.leader).await.unwrap();
    let before = count(&f.db.url, "SELECT max(epoch) FROM epochs").await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.acquire(&candidate(&format!("n{i}")), 60_000).await
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok((l, _)) => winners.push(l.epoch()),
            Err(e) => assert_eq!(e.category(), Some(Category::LeadershipHeld)),
        }
    }
    assert_eq!(winners, vec![before + 1]);
    assert_eq!(
        count(&f.db.url, "SELECT max(epoch) FROM epochs").await,
        before + 1
    );
    // Epochs are never reused: rewriting history is refused by the schema.
    let c = sql(&f.db.url).await;
    assert!(c
        .execute("UPDATE epochs SET epoch = 1000", &[])
        .await
        .is_err());
    // Retrying the winner's own acquisition (ambiguous commit) allocates nothing new.
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM epochs").await,
        before + 1
    );
}

#[tokio::test]
async fn leases_at_or_past_their_deadline_are_expired_and_host_times_are_ignored() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    // Host-supplied deadlines are not inputs: an ACK naming a later deadline is a mismatch.
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    let mut a = ack(l, &r);
    a.reservation_deadline = "2999-12-31T23:59:59.999999Z".into();
    assert_eq!(category(s.consume_ack(l, &a).await), Category::Mismatch);
    // The database decides: a lease at (or before) clock_timestamp() is expired.
    let c = sql(&f.db.url).await;
    let equal: bool = c
        .query_one("SELECT t > t FROM (SELECT clock_timestamp() AS t) x", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!equal, "equality must not count as unexpired");
    c.execute(
        "UPDATE leadership SET lease_expires_at = clock_timestamp()",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        category(s.reserve(l, &request("li-x", None, 60_000)).await),
        Category::StaleLeader
    );
    // A reservation whose deadline passed cannot be acknowledged or activated.
    let f2 = fx().await;
    let (s2, l2) = (&f2.store, &f2.leader);
    let r2 = to_awaiting_ack(s2, l2, &f2.lane.lane_incarnation_id, None, 1_000).await;
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(
        category(s2.consume_ack(l2, &ack(l2, &r2)).await),
        Category::Expired
    );
    assert_eq!(state(s2, "h1:w1").await, "AWAITING_ACK");
}

#[tokio::test]
async fn premature_completion_is_rejected_and_unverified_cleanup_quarantines() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    assert_eq!(
        category(s.drain(l, r.chain(), Outcome::Completed, &key("dr")).await),
        Category::WrongState,
        "drain before RUNNING"
    );
    s.activate(l, &activation(&r)).await.unwrap();
    assert_eq!(
        category(s.retire(l, r.chain(), &d('e'), &key("re")).await),
        Category::WrongState,
        "retire before drain"
    );
    s.drain(l, r.chain(), Outcome::Completed, &key("dr"))
        .await
        .unwrap();
    assert_eq!(
        assignment(s, &r.chain().assignment_id).await.lifecycle,
        "ACTIVE"
    );
    s.retire(l, r.chain(), &d('e'), &key("re")).await.unwrap();
    assert_eq!(
        category(s.finish(l, r.chain(), "tr-none", &key("fi")).await),
        Category::Unreconciled,
        "finish before the termination receipt"
    );
    let tr = receipt_for(&r, "quit", false);
    s.ingest_termination(l, &tr).await.unwrap();
    s.finish(
        l,
        r.chain(),
        tr["idempotency_key"].as_str().unwrap(),
        &key("fi"),
    )
    .await
    .unwrap();
    assert_eq!(
        state(s, "h1:w1").await,
        "QUARANTINED",
        "unverified cleanup must quarantine, never go clean"
    );
    assert_eq!(
        category(
            s.reserve(l, &request(&f.lane.lane_incarnation_id, None, 60_000))
                .await
        ),
        Category::WrongState
    );
}

#[tokio::test]
async fn termination_receipts_are_observations_reconciled_into_recovery_or_quarantine() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r = to_awaiting_ack(s, l, &inc, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    s.activate(l, &activation(&r)).await.unwrap();
    // SIGKILL while RUNNING: recovery, never a terminal outcome; leases revoked.
    let tr = receipt_for(&r, "sigkill", true);
    let (rec, _) = s.ingest_termination(l, &tr).await.unwrap();
    assert_eq!(
        rec,
        Reconciliation::Recovery {
            lane_state: "IDLE_CLEAN".into()
        }
    );
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (
            a.lifecycle.as_str(),
            a.execution_owner.as_deref(),
            a.responsibility_owner.as_str()
        ),
        ("RECOVERY", None, TARGET)
    );
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM leases WHERE released_at IS NULL"
        )
        .await,
        0
    );
    // Idempotent: the same receipt again is a duplicate.
    assert_eq!(
        s.ingest_termination(l, &tr).await.unwrap().0,
        Reconciliation::Duplicate
    );
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM termination_receipts").await,
        1
    );
    // Resuming it with other digests is refused and leaves the lane as it was.
    let id = r.chain().assignment_id.clone();
    let mut other_scope = request(&inc, Some(&id), 60_000);
    other_scope.scope_digest = d('8');
    assert_eq!(
        category(s.reserve(l, &other_scope).await),
        Category::WrongState
    );
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
    assert_eq!(assignment(s, &id).await.lifecycle, "RECOVERY");
    // The assignment gets a fresh chain on the now clean lane, with a new generation.
    let r2 = to_awaiting_ack(s, l, &inc, Some(&id), 60_000).await;
    // Now ACTIVE again: a second resume, even with matching digests on another idle lane,
    // is refused and reserves nothing.
    s.register_lane(l, "h1:w2", "h1").await.unwrap();
    let inc2 = s.lane("h1:w2").await.unwrap().unwrap().lane_incarnation_id;
    assert_eq!(
        category(s.reserve(l, &request(&inc2, Some(&id), 60_000)).await),
        Category::WrongState
    );
    assert_eq!(state(s, "h1:w2").await, "IDLE_CLEAN");
    assert_eq!(r2.generation, r.generation + 1);
    assert_ne!(
        r2.chain().assignment_attempt_id,
        r.chain().assignment_attempt_id
    );
    // A receipt for a generation never staged contradicts state: quarantine, and the lane
    // cannot be reserved until it is reconciled and released.
    let mut bogus = receipt_for(&r2, "sigkill", true);
    bogus["generation"] = json!(99);
    let (rec, _) = s.ingest_termination(l, &bogus).await.unwrap();
    assert!(matches!(rec, Reconciliation::Quarantined { .. }), "{rec:?}");
    assert_eq!(state(s, "h1:w1").await, "QUARANTINED");
    assert_eq!(
        category(s.release_quarantine(l, &inc, &key("rq")).await),
        Category::Unreconciled,
        "the staged generation has not ended"
    );
    s.ingest_termination(l, &receipt_for(&r2, "sigkill", true))
        .await
        .unwrap();
    assert_eq!(
        category(s.release_quarantine(l, &inc, &key("rq")).await),
        Category::Unreconciled,
        "the bogus receipt is not reconciled"
    );
}

#[tokio::test]
async fn conflicting_observations_of_one_end_quarantine_the_lane() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    s.activate(l, &activation(&r)).await.unwrap();
    let tr = receipt_for(&r, "sigkill", true);
    s.ingest_termination(l, &tr).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
    let mut other = tr.clone();
    other["termination_reason"] = json!("quit");
    let (rec, _) = s.ingest_termination(l, &other).await.unwrap();
    assert!(matches!(rec, Reconciliation::Quarantined { .. }), "{rec:?}");
    assert_eq!(state(s, "h1:w1").await, "QUARANTINED");
    // Never a terminal outcome from observations alone.
    assert_eq!(
        assignment(s, &r.chain().assignment_id).await.lifecycle,
        "RECOVERY"
    );
}

#[tokio::test]
async fn lane_reincarnation_cannot_reset_generations_or_accept_stale_authority() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let old = f.lane.lane_incarnation_id.clone();
    let r = to_awaiting_ack(s, l, &old, None, 60_000).await;
    // Busy incarnations cannot be recreated.
    assert_eq!(
        category(s.recreate_lane(l, "h1:w1", &key("rc")).await),
        Category::WrongState
    );
    s.quarantine(l, &old, "operator: host rebuilt", &key("q"))
        .await
        .unwrap();
    assert_eq!(
        category(s.recreate_lane(l, "h1:w1", &key("rc")).await),
        Category::WrongState,
        "its generation has not been observed to end"
    );
    s.ingest_termination(l, &receipt_for(&r, "host-loss", true))
        .await
        .unwrap();
    let (new, _) = s.recreate_lane(l, "h1:w1", &key("rc")).await.unwrap();
    assert_ne!(new.lane_incarnation_id, old);
    assert_eq!((new.state.as_str(), new.next_generation), ("IDLE_CLEAN", 1));
    // Nothing addressed to the old incarnation acts any more.
    assert!(s.consume_ack(l, &ack(l, &r)).await.is_err());
    assert_eq!(
        category(s.reserve(l, &request(&old, None, 60_000)).await),
        Category::WrongState
    );
    let r2 = to_awaiting_ack(s, l, &new.lane_incarnation_id, None, 60_000).await;
    assert_eq!(
        r2.generation, 1,
        "generations are scoped to the incarnation"
    );
    let mut cross = ack(l, &r2);
    cross.lane_incarnation_id = old.clone();
    assert_eq!(category(s.consume_ack(l, &cross).await), Category::Mismatch);
}

#[tokio::test]
async fn an_expired_reservation_chain_cannot_authorize_its_successor() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r1 = to_awaiting_ack(s, l, &inc, None, 1_000).await;
    let r1_ack = ack(l, &r1);
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(category(s.consume_ack(l, &r1_ack).await), Category::Expired);
    s.expire(l, r1.chain(), &key("ex")).await.unwrap();
    assert_eq!(
        state(s, "h1:w1").await,
        "QUARANTINED",
        "a staged generation outlived its reservation"
    );
    s.ingest_termination(l, &receipt_for(&r1, "replace", true))
        .await
        .unwrap();
    s.release_quarantine(l, &inc, &key("rq")).await.unwrap();
    // R2: same assignment, fresh attempt, reservation, generation and challenge.
    let r2 = to_awaiting_ack(s, l, &inc, Some(&r1.chain().assignment_id), 60_000).await;
    assert_ne!(r2.chain().reservation_id, r1.chain().reservation_id);
    // R1's ACK cannot be replayed onto R2, whole or spliced.
    let mut replay = r1_ack.clone();
    replay.idempotency_key = key("r1-replay");
    assert!(s.consume_ack(l, &replay).await.is_err());
    let mut spliced = r1_ack.clone();
    spliced.challenge_id = r2.challenge.clone();
    spliced.idempotency_key = key("splice");
    assert_eq!(
        category(s.consume_ack(l, &spliced).await),
        Category::Mismatch
    );
    let mut spliced = ack(l, &r2);
    spliced.reservation_deadline = r1.res.deadline.clone();
    assert_eq!(
        category(s.consume_ack(l, &spliced).await),
        Category::Mismatch
    );
    // R1's READY/activation values cannot activate R2.
    s.consume_ack(l, &ack(l, &r2)).await.unwrap();
    let mut x = activation(&r2);
    x.fence_token = r1.res.fence_token.clone().unwrap();
    assert_eq!(category(s.activate(l, &x).await), Category::FenceMismatch);
    let mut x = activation(&r2);
    x.challenge_id = r1.challenge.clone();
    assert_eq!(category(s.activate(l, &x).await), Category::Mismatch);
    s.activate(l, &activation(&r2)).await.unwrap();
}

#[tokio::test]
async fn a_connection_dropped_at_any_activation_step_leaves_no_running_state() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    let c = sql(&f.db.url).await;
    c.batch_execute("CREATE FUNCTION crash() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$;").await.unwrap();
    let steps = [
        (
            "state to RUNNING",
            "AFTER UPDATE ON lane_incarnations FOR EACH ROW WHEN (NEW.state = 'RUNNING')",
        ),
        (
            "owner swap",
            "AFTER UPDATE ON assignments FOR EACH ROW WHEN (NEW.execution_owner IS NOT NULL)",
        ),
        ("first lease", "AFTER INSERT ON leases FOR EACH ROW"),
        (
            "activation receipt",
            "AFTER INSERT ON transition_receipts FOR EACH ROW WHEN (NEW.transition = 'activate')",
        ),
        (
            "idempotency record",
            "AFTER INSERT ON idempotency FOR EACH ROW WHEN (NEW.operation = 'activate')",
        ),
    ];
    for (name, when) in steps {
        c.batch_execute(&format!(
            "CREATE TRIGGER crash_step {when} EXECUTE FUNCTION crash()"
        ))
        .await
        .unwrap();
        let got = s.activate(l, &activation(&r)).await;
        assert!(matches!(got, Err(AuthorityError::Db(_))), "{name}: {got:?}");
        assert_eq!(
            state(s, "h1:w1").await,
            "READY",
            "{name}: RUNNING without its commit"
        );
        assert_eq!(
            count(&f.db.url, "SELECT count(*) FROM leases").await,
            0,
            "{name}: a lease outlived the crash"
        );
        assert_eq!(
            count(
                &f.db.url,
                "SELECT count(*) FROM transition_receipts WHERE transition = 'activate'"
            )
            .await,
            0,
            "{name}"
        );
        let table = when
            .split(" ON ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        c.batch_execute(&format!("DROP TRIGGER crash_step ON {table}"))
            .await
            .unwrap();
    }
    // After the crashes, one clean activation: exactly RUNNING, its leases, one receipt.
    let rcpt = s.activate(l, &activation(&r)).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "RUNNING");
    assert_eq!(count(&f.db.url, "SELECT count(*) FROM leases").await, 2);
    assert_eq!(rcpt.body["leases"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn raw_fence_tokens_appear_in_no_column_error_or_audit_line() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    let token = r.res.fence_token.clone().unwrap();
    let raw = token.expose_hex();
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    let mut wrong = activation(&r);
    wrong.generation += 1;
    let err = s.activate(l, &wrong).await.unwrap_err();
    s.activate(l, &activation(&r)).await.unwrap();
    assert!(!err.to_string().contains(&raw) && !format!("{err:?}").contains(&raw));
    assert!(!format!("{token:?}").contains(&raw));
    // Every row of every table, rendered as text.
    let c = sql(&f.db.url).await;
    let tables: Vec<String> = c
        .query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tables.len() >= 15);
    for t in tables {
        let rows = c
            .query(&format!("SELECT row_to_json(x)::text FROM {t} x"), &[])
            .await
            .unwrap();
        for row in rows {
            let text: String = row.get(0);
            assert!(!text.contains(&raw), "raw fence token stored in {t}");
            assert!(
                !text.to_uppercase().contains(&raw.to_uppercase()),
                "raw fence token stored in {t}"
            );
        }
    }
    let stored: String = c
        .query_one("SELECT fence_digest FROM reservations", &[])
        .await
        .unwrap()
        .get(0);
    assert!(stored.starts_with("hmac-sha256:"));
}

#[tokio::test]
async fn bad_input_and_unknown_ids_change_nothing() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let mut bad = request(&inc, None, 60_000);
    bad.scope_digest = "sha256:short".into();
    assert_eq!(category(s.reserve(l, &bad).await), Category::BadInput);
    assert_eq!(
        category(s.reserve(l, &request("li-unknown", None, 60_000)).await),
        Category::NotFound
    );
    assert_eq!(
        category(
            s.reserve(l, &request(&inc, Some("as-unknown"), 60_000))
                .await
        ),
        Category::WrongState
    );
    let mut r = request(&inc, None, 60_000);
    r.ttl_ms = 10;
    assert_eq!(category(s.reserve(l, &r).await), Category::BadInput);
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM assignments").await,
        0
    );
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM reservations").await,
        0
    );
    assert!(s.register_lane(l, "no-colon", "h1").await.is_err());
    // Continuity (spec §14): approved unfinished work always has an owner and a next action.
    let mut r = request(&inc, None, 60_000);
    r.next_action = String::new();
    assert_eq!(category(s.reserve(l, &r).await), Category::BadInput);
    let mut r = request(&inc, None, 60_000);
    r.target = String::new();
    assert_eq!(category(s.reserve(l, &r).await), Category::BadInput);
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM assignments").await,
        0
    );
}

#[tokio::test]
async fn quarantine_as_a_terminal_outcome_takes_the_fenced_path_too() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    s.activate(l, &activation(&r)).await.unwrap();
    s.drain(l, r.chain(), Outcome::Quarantined, &key("dr"))
        .await
        .unwrap();
    assert_eq!(
        assignment(s, &r.chain().assignment_id).await.lifecycle,
        "ACTIVE",
        "not terminal before retirement"
    );
    s.retire(l, r.chain(), &d('e'), &key("re")).await.unwrap();
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (a.lifecycle.as_str(), a.execution_owner.as_deref()),
        ("QUARANTINED", None)
    );
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM leases WHERE released_at IS NULL"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn the_schema_is_versioned_and_a_newer_one_is_refused() {
    let f = fx().await;
    assert_eq!(
        f.store.migrate().await.unwrap(),
        mosaic::coordinator::store::SCHEMA_VERSION,
        "migrating twice is a no-op"
    );
    sql(&f.db.url)
        .await
        .execute("UPDATE mosaic_schema SET version = 99", &[])
        .await
        .unwrap();
    match f.store.migrate().await {
        Err(AuthorityError::SchemaTooNew { found: 99, .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn authority_refuses_to_run_on_a_standby() {
    // A real streaming standby of this test server.
    let server = pg::server();
    let Some(url) = server.standby_url() else {
        panic!("standby test needs the harness-managed cluster (unset MOSAIC_TEST_DATABASE_URL)");
    };
    match Store::connect(&url, CoordinatorSecret::generate().unwrap()).await {
        Err(AuthorityError::Standby) => {}
        other => panic!("a standby was accepted: {other:?}"),
    }
}
