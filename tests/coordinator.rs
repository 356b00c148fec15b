//! The coordinator's authority core against a real PostgreSQL (spec §17 rows: replayed
//! ACK, duplicate activation, consumed activation ACK, split-brain / stale epoch, epoch
//! takeover, lane reincarnation, forged ACK fields, reservation-chain substitution, clock
//! rollback/skew and deadline equality, premature completion, activation/lease crash, raw
//! token leakage), plus the faults the transition primitive must survive: an ambiguous
//! commit, races between transitions, and writes that bypass the frame. Every rejection row
//! checks that nothing changed.

mod pg;

use mosaic::coordinator::{
    AckClaim, Activation, AssignmentView, AuthorityError, Candidate, Category, Chain,
    CoordinatorSecret, EndCause, LaneView, Leader, Outcome, Reconciliation, ReserveRequest,
    Reserved, Store,
};
use mosaic::protocol::task;
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

fn uid(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

const TARGET: &str = "h1:w1";
const HOST: &str = "h1";
const SCOPE: [&str; 2] = ["repo:demo", "issues:demo"];
const HOLDS: [&str; 1] = ["issues:demo"];

struct Fx {
    db: TestDb,
    store: Store,
    secret: CoordinatorSecret,
    leader: Leader,
    lane: LaneView,
}

async fn fx_at(url_of: impl Fn(&str) -> String) -> Fx {
    let db = TestDb::new();
    let secret = CoordinatorSecret::generate().unwrap();
    let store = Store::connect(&url_of(&db.name), secret.clone())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let (leader, _) = store.acquire(&candidate("a"), 60_000).await.unwrap();
    let lane = adopt(&store, &leader, "h1:w1").await;
    Fx {
        db,
        store,
        secret,
        leader,
        lane,
    }
}

async fn fx() -> Fx {
    fx_at(|name| pg::server().url(name)).await
}

async fn adopt(s: &Store, l: &Leader, lane: &str) -> LaneView {
    s.adopt_lane_incarnation(l, HOST, lane, &uid("li"))
        .await
        .unwrap()
}

fn identity(pid: i64) -> serde_json::Value {
    json!({ "boot_id": "b-1", "cgroup_id": 158, "cgroup_path": "/mosaic/lanes/w1/gen", "exe_dev": 1, "exe_ino": 2,
            "launch_nonce_digest": "ab".repeat(32), "root_pid": pid, "root_start_time": 1000 + pid })
}

fn request(inc: &str, resume: Option<&str>, ttl_ms: i64) -> ReserveRequest {
    ReserveRequest {
        request_id: uid("rq"),
        lane_incarnation_id: inc.into(),
        assignment_id: resume.map(String::from),
        target: TARGET.into(),
        runtime_id: "fake@1.0.0".into(),
        task_text: "spawn=3 print=hello".into(),
        scope: SCOPE.iter().map(|s| s.to_string()).collect(),
        holds: HOLDS.iter().map(|s| s.to_string()).collect(),
        completion_policy: "operator-evidence/v1".into(),
        inactivity_policy: "default@1".into(),
        ttl_ms,
    }
}

fn scope_digest() -> String {
    task::list_digest(
        "scope",
        &SCOPE.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )
}
fn holds_digest() -> String {
    task::list_digest(
        "holds",
        &HOLDS.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )
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
    resume: Option<&str>,
    ttl_ms: i64,
) -> Ready {
    let res = s.reserve(l, &request(inc, resume, ttl_ms)).await.unwrap();
    let c = res.chain.clone();
    s.checkpoint(l, &c).await.unwrap();
    s.fence(l, &c).await.unwrap();
    let (generation, _) = s.stage(l, &c).await.unwrap();
    let identity = identity(4000 + generation);
    let staged = s.record_staged(l, &c, generation, &identity).await.unwrap();
    let contracts = staged.str("contracts_digest").unwrap();
    assert_eq!(
        contracts,
        mosaic::protocol::contracts_digest("spawn=3 print=hello", &scope_digest(), &holds_digest()),
        "the contract digest is computed from the task, scope and holds the operator supplied"
    );
    let (challenge, _, _) = s
        .record_injected(l, &c, &contracts, &identity, 60_000)
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
        scope_digest: scope_digest(),
        holds_digest: holds_digest(),
        runtime_id: "fake@1.0.0".into(),
        ack_digest: d('a'),
    }
}

/// The activation the chain's own rows call for (fence token re-derived from the secret).
async fn activation(s: &Store, r: &Ready) -> Activation {
    let row = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    Activation::of(s, &row, 60_000).expect("a READY chain with its consumed ACK")
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

/// Row counts of every authority table: "nothing changed" is this before == after.
async fn authority_counts(url: &str) -> Vec<(String, i64)> {
    let mut v = Vec::new();
    for t in [
        "lane_incarnations",
        "assignments",
        "attempts",
        "reservations",
        "generations",
        "challenges",
        "ack_receipts",
        "leases",
        "transition_receipts",
        "termination_receipts",
    ] {
        v.push((
            t.to_string(),
            count(url, &format!("SELECT count(*) FROM {t}")).await,
        ));
    }
    v
}

async fn state(s: &Store, lane: &str) -> String {
    s.lane(lane).await.unwrap().unwrap().state.to_string()
}

async fn assignment(s: &Store, id: &str) -> AssignmentView {
    s.assignment(id).await.unwrap().unwrap()
}

async fn audited(s: &Store, op: &str, category: &str) -> usize {
    s.audit_log(0)
        .await
        .unwrap()
        .iter()
        .filter(|a| a.operation == op && a.category == category)
        .count()
}

/// A host receipt for `r`'s generation, keyed as the supervisor keys it.
fn receipt_for(r: &Ready, reason: &str, verified: bool) -> serde_json::Value {
    let c = r.chain();
    json!({ "idempotency_key": mosaic::supervisor::receipt::idempotency_key(&c.lane_id, &c.lane_incarnation_id, r.generation as u64),
            "host_id": HOST, "lane_id": c.lane_id, "lane_incarnation_id": c.lane_incarnation_id,
            "generation": r.generation, "termination_reason": reason, "observation_source": "shim",
            "cleanup": { "verified_empty": verified, "cgroup_removed": verified } })
}

async fn running(s: &Store, l: &Leader, inc: &str) -> Ready {
    let r = to_awaiting_ack(s, l, inc, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    s.activate(l, &activation(s, &r).await).await.unwrap();
    r
}

#[tokio::test]
async fn the_full_chain_round_trips_with_owners_evidence_and_receipts() {
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
    assert!(
        !a.next_action.contains("spawn=3"),
        "the next action names the task by digest, not its text"
    );
    assert_eq!(state(s, "h1:w1").await, "AWAITING_ACK");
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM leases").await,
        0,
        "staging holds no effect lease"
    );
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "READY");
    let act = s.activate(l, &activation(s, &r).await).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "RUNNING");
    // One lease per scoped capability, none for the one held back.
    let leases: Vec<&str> = act.body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["scope"].as_str().unwrap())
        .collect();
    assert_eq!(leases, vec!["repo:demo"]);
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (a.execution_owner.as_deref(), a.pending_target.as_deref()),
        (Some(TARGET), None)
    );

    // COMPLETED needs evidence under the completion policy.
    assert_eq!(
        category(
            s.request_end(l, &r.chain().assignment_id, Outcome::Completed, None)
                .await
        ),
        Category::BadInput
    );
    let evidence = d('e');
    let end = s
        .request_end(
            l,
            &r.chain().assignment_id,
            Outcome::Completed,
            Some(&evidence),
        )
        .await
        .unwrap();
    assert!(end.awaiting_receipt);
    // Leases are revoked with the decision; nothing is final before the host's receipt.
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM leases WHERE released_at IS NULL"
        )
        .await,
        0
    );
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (a.lifecycle.as_str(), a.execution_owner.as_deref()),
        ("ACTIVE", None)
    );
    assert_eq!(state(s, "h1:w1").await, "DRAINING");
    // The same request again is the same answer.
    let again = s
        .request_end(
            l,
            &r.chain().assignment_id,
            Outcome::Completed,
            Some(&evidence),
        )
        .await
        .unwrap();
    assert_eq!(again.receipt.receipt_id, end.receipt.receipt_id);
    assert!(again.receipt.replayed);
    // The host's verified receipt finalizes it, with evidence computed from both.
    let tr = receipt_for(&r, "quit", true);
    let (rec, _) = s.ingest_termination(l, HOST, &tr).await.unwrap();
    assert_eq!(
        rec,
        Reconciliation::Retiring {
            outcome: Some("COMPLETED".into())
        }
    );
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(a.lifecycle, "COMPLETED");
    let fe = a.final_evidence_digest.unwrap();
    assert!(fe.starts_with("sha256:") && fe != evidence);
    assert_eq!(state(s, "h1:w1").await, "RETIRING");
    s.finish(l, &inc).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
    // A receipt for every transition, all under this epoch and timeline.
    let n = count(&f.db.url, &format!("SELECT count(*) FROM transition_receipts WHERE coordinator_epoch = {} AND sot_incarnation = '{}'", l.epoch(), l.sot())).await;
    assert_eq!(
        n,
        1 + 1 + 8 + 1 + 1 + 1,
        "acquire, adopt, eight chain steps, end, ingest, finish"
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
    // The very same ACK again is the same answer, not a second use.
    let same = s.consume_ack(l, &a).await.unwrap();
    assert_eq!(
        (same.receipt_id.as_str(), same.replayed),
        (first.receipt_id.as_str(), true)
    );
    // Any other ACK for the consumed challenge is a second use: refused, audited.
    let before = authority_counts(&f.db.url).await;
    let mut again = a.clone();
    again.ack_digest = d('b');
    assert_eq!(
        category(s.consume_ack(l, &again).await),
        Category::ChallengeConsumed
    );
    assert_eq!(
        authority_counts(&f.db.url).await,
        before,
        "a replayed ACK changed something"
    );
    assert_eq!(state(s, "h1:w1").await, "READY");
    assert_eq!(audited(s, "consume-ack", "challenge-consumed").await, 1);
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
    let before = authority_counts(&f.db.url).await;
    for (field, forge, want) in rows {
        let mut a = good.clone();
        forge(&mut a);
        assert_eq!(category(s.consume_ack(l, &a).await), want, "forged {field}");
        assert_eq!(
            state(s, "h1:w1").await,
            "AWAITING_ACK",
            "forged {field} moved the lane"
        );
        assert_eq!(
            authority_counts(&f.db.url).await,
            before,
            "forged {field} changed something"
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
    let x = activation(s, &r).await;
    let first = s.activate(l, &x).await.unwrap();
    let again = s.activate(l, &x).await.unwrap();
    assert_eq!(
        (again.receipt_id.as_str(), again.replayed),
        (first.receipt_id.as_str(), true)
    );
    // The same step with other values is a conflict, never a second activation.
    let mut other = x.clone();
    other.lease_ttl_ms = 120_000;
    other.generation += 0;
    other.target = "h1:w9".into();
    assert_eq!(
        category(s.activate(l, &other).await),
        Category::IdempotencyConflict
    );
    assert_eq!(count(&f.db.url, "SELECT count(*) FROM leases").await, 1);
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
    let row = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(
        Activation::of(s, &row, 60_000).is_none(),
        "no ACK, no activation to present"
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
            |x| x.fence_token = mosaic::coordinator::FenceToken::random().unwrap(),
            Category::FenceMismatch,
        ),
        (
            "target (responsibility / pending)",
            |x| x.target = "h9:w1".into(),
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
    let good = activation(s, &r).await;
    let before = authority_counts(&f.db.url).await;
    for (what, sub, want) in rows {
        let mut x = good.clone();
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
        assert_eq!(
            authority_counts(&f.db.url).await,
            before,
            "substituted {what} changed something"
        );
    }
    s.activate(l, &good).await.unwrap();
}

#[tokio::test]
async fn thirty_two_concurrent_activations_decide_once() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    let base = activation(s, &r).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (s, l, x) = (s.clone(), l.clone(), base.clone());
        tasks.push(tokio::spawn(async move { s.activate(&l, &x).await }));
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut decided = 0;
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        ids.insert(r.receipt_id);
        decided += usize::from(!r.replayed);
    }
    // Every caller gets the one decision; exactly one of them made it.
    assert_eq!((ids.len(), decided), (1, 1));
    assert_eq!(count(&f.db.url, "SELECT count(*) FROM leases").await, 1);
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
async fn consume_ack_racing_the_end_of_its_chain_is_linearizable() {
    // An ACK and the end of its chain (expiry, abandonment) race for the same lane row.
    // Whatever the interleaving, the outcome is one of the serial orders: the ACK alone
    // (READY), the end alone (DRAINING, challenge unconsumed, ACK refused), or the ACK
    // then the end (DRAINING, and the READY can never activate). Never a READY lane whose
    // chain ended.
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let mut orders = std::collections::BTreeMap::new();
    for i in 0..12 {
        let lane = adopt(s, l, &format!("h1:race{i}")).await;
        let mut req = request(&lane.lane_incarnation_id, None, 60_000);
        req.target = lane.lane_id.clone();
        let res = s.reserve(l, &req).await.unwrap();
        let c = res.chain.clone();
        s.checkpoint(l, &c).await.unwrap();
        s.fence(l, &c).await.unwrap();
        let (generation, _) = s.stage(l, &c).await.unwrap();
        let id = identity(9000 + i);
        let cd = s
            .record_staged(l, &c, generation, &id)
            .await
            .unwrap()
            .str("contracts_digest")
            .unwrap();
        let (challenge, _, _) = s.record_injected(l, &c, &cd, &id, 60_000).await.unwrap();
        let r = Ready {
            res,
            generation,
            identity: id,
            contracts: cd,
            challenge,
        };
        let a = ack(l, &r);
        let (s1, l1, s2, l2, c2) = (s.clone(), l.clone(), s.clone(), l.clone(), c.clone());
        let (x, y) = tokio::join!(
            tokio::spawn(async move { s1.consume_ack(&l1, &a).await }),
            tokio::spawn(async move { s2.end_chain(&l2, &c2, EndCause::Abandoned).await })
        );
        let consumed = count(&f.db.url, &format!("SELECT count(*) FROM challenges WHERE challenge_id = '{}' AND consumed_at IS NOT NULL", r.challenge)).await;
        let order = match (x.unwrap(), y.unwrap()) {
            (Ok(_), Err(e)) => {
                panic!("an end refused after a successful ACK: the end applies to READY too: {e}")
            }
            (Err(e), Ok(_)) => {
                assert_eq!(e.category(), Some(Category::WrongState), "{e}");
                assert_eq!(consumed, 0, "a refused ACK consumed its challenge");
                "end-only"
            }
            (Ok(ackr), Ok(endr)) => {
                assert!(
                    ackr.decided_at <= endr.decided_at,
                    "the ACK decided after the end"
                );
                assert_eq!(consumed, 1);
                "ack-then-end"
            }
            (Err(a), Err(b)) => panic!("neither decided: {a} / {b}"),
        };
        *orders.entry(order).or_insert(0) += 1;
        // Either way the chain is over: the lane drains, nothing can activate.
        assert_eq!(state(s, &lane.lane_id).await, "DRAINING");
        let row = s
            .chain_by_reservation(&c.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert!(!row.reservation_open && row.stop_requested);
        if let Some(x) = Activation::of(s, &row, 60_000) {
            assert_eq!(
                category(s.activate(l, &x).await),
                Category::WrongState,
                "an ended chain activated"
            );
        }
    }
    assert_eq!(orders.values().sum::<i32>(), 12, "{orders:?}");
    // Every refused ACK is audited.
    let refused = orders.get("end-only").copied().unwrap_or(0) as usize;
    assert_eq!(audited(s, "consume-ack", "wrong-state").await, refused);
}

#[tokio::test]
async fn two_receipts_for_one_generation_at_once_have_one_decision() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running(s, l, &f.lane.lane_incarnation_id).await;
    // Two different observations of one end, concurrently.
    let a = receipt_for(&r, "sigkill", true);
    let mut b = a.clone();
    b["termination_reason"] = json!("crash");
    let (s1, l1, s2, l2) = (s.clone(), l.clone(), s.clone(), l.clone());
    let (x, y) = tokio::join!(
        tokio::spawn(async move { s1.ingest_termination(&l1, HOST, &a).await }),
        tokio::spawn(async move { s2.ingest_termination(&l2, HOST, &b).await })
    );
    let recs = [x.unwrap().unwrap().0, y.unwrap().unwrap().0];
    let recovery = recs
        .iter()
        .filter(|r| matches!(r, Reconciliation::Recovery { .. }))
        .count();
    let conflict = recs
        .iter()
        .filter(|r| matches!(r, Reconciliation::Quarantined { .. }))
        .count();
    assert_eq!((recovery, conflict), (1, 1), "{recs:?}");
    assert_eq!(
        state(s, "h1:w1").await,
        "QUARANTINED",
        "conflicting observations quarantine"
    );
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM termination_receipts").await,
        1
    );
    assert_eq!(
        assignment(s, &r.chain().assignment_id).await.lifecycle,
        "RECOVERY",
        "never a terminal outcome from observations"
    );
    // The same observation twice at once: one decision, one replay of it.
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running(s, l, &f.lane.lane_incarnation_id).await;
    let a = receipt_for(&r, "sigkill", true);
    let (s1, l1, s2, l2, a2) = (s.clone(), l.clone(), s.clone(), l.clone(), a.clone());
    let (x, y) = tokio::join!(
        tokio::spawn(async move { s1.ingest_termination(&l1, HOST, &a).await }),
        tokio::spawn(async move { s2.ingest_termination(&l2, HOST, &a2).await })
    );
    let (x, y) = (x.unwrap().unwrap().1, y.unwrap().unwrap().1);
    assert_eq!(x.receipt_id, y.receipt_id);
    assert_eq!(usize::from(x.replayed) + usize::from(y.replayed), 1);
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
}

#[tokio::test]
async fn split_brain_the_stale_coordinator_can_do_nothing() {
    let f = fx().await;
    let s = &f.store;
    let inc = f.lane.lane_incarnation_id.clone();
    // A releases; B takes a short lease, starts a chain, then stalls past expiry.
    s.release(&f.leader).await.unwrap();
    let (b, _) = s.acquire(&candidate("b"), 400).await.unwrap();
    let r = to_awaiting_ack(s, &b, &inc, None, 60_000).await;
    let b_ack = ack(&b, &r);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // C takes over (the lease expired by database time).
    let (c, _) = s.acquire(&candidate("c"), 60_000).await.unwrap();
    assert!(c.epoch() > b.epoch());
    let lane2 = adopt(s, &c, "h1:w2").await;
    let before = authority_counts(&f.db.url).await;
    let mut b2 = b.clone();
    assert_eq!(
        category(
            s.reserve(&b, &request(&lane2.lane_incarnation_id, None, 60_000))
                .await
        ),
        Category::StaleLeader
    );
    assert_eq!(
        category(s.consume_ack(&b, &b_ack).await),
        Category::StaleLeader
    );
    assert_eq!(
        category(
            s.ingest_termination(&b, HOST, &receipt_for(&r, "sigkill", true))
                .await
        ),
        Category::StaleLeader
    );
    assert_eq!(
        category(
            s.quarantine(&b, &lane2.lane_incarnation_id, "stale", false)
                .await
        ),
        Category::StaleLeader
    );
    assert_eq!(
        category(s.renew(&mut b2, 60_000).await),
        Category::StaleLeader
    );
    assert_eq!(
        authority_counts(&f.db.url).await,
        before,
        "the stale leader changed something"
    );
    assert_eq!(
        audited(s, "reserve", "stale-leader").await
            + audited(s, "consume-ack", "stale-leader").await
            + audited(s, "ingest-termination", "stale-leader").await
            + audited(s, "quarantine", "stale-leader").await
            + audited(s, "leadership-renew", "stale-leader").await,
        5
    );
    // The takeover ended B's preactivation chain: recovery, and its generation is to be
    // stopped (the lane drains until the host proves it ended).
    assert_eq!(state(s, "h1:w1").await, "DRAINING");
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (a.lifecycle.as_str(), a.execution_owner.as_deref()),
        ("RECOVERY", None)
    );
    let row = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(row.stop_requested && !row.reservation_open);
    // The old ACK cannot activate under the new epoch either.
    let mut c_ack = b_ack.clone();
    c_ack.coordinator_epoch = c.epoch();
    assert_eq!(
        category(s.consume_ack(&c, &c_ack).await),
        Category::StaleLeader,
        "the challenge was issued under epoch B"
    );
    // The host's receipt ends the generation; the lane is clean again.
    s.ingest_termination(&c, HOST, &receipt_for(&r, "quit", true))
        .await
        .unwrap();
    s.finish(&c, &inc).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
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
}

#[tokio::test]
async fn a_lapsed_leader_reacquires_with_a_new_epoch_and_its_old_epoch_is_dead() {
    let f = fx().await;
    let s = &f.store;
    let cand = candidate("lapsing");
    s.release(&f.leader).await.unwrap();
    let (first, _) = s.acquire(&cand, 300).await.unwrap();
    // The same launch retrying after an ambiguous commit finds its own acquisition.
    let (same, _) = s.acquire(&cand, 300).await.unwrap();
    assert_eq!(same.epoch(), first.epoch());
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let mut stale = first.clone();
    assert_eq!(
        category(s.renew(&mut stale, 300).await),
        Category::StaleLeader
    );
    // The lapse heals: the same launch takes a new epoch (its key names the epoch).
    let (again, r) = s.acquire(&cand, 60_000).await.unwrap();
    assert_eq!(again.epoch(), first.epoch() + 1);
    assert_eq!(r.body["previous_epoch"], first.epoch());
    let lane = adopt(s, &again, "h1:w3").await;
    assert_eq!(
        category(
            s.reserve(&first, &request(&lane.lane_incarnation_id, None, 60_000))
                .await
        ),
        Category::StaleLeader
    );
    s.reserve(&again, &request(&lane.lane_incarnation_id, None, 60_000))
        .await
        .unwrap();
}

/// A store whose database clock is frozen at a settable instant, so deadline equality can
/// be hit exactly by the schema's own predicates (not by a query of the test's).
async fn frozen_fx() -> (Fx, tokio_postgres::Client) {
    let db = TestDb::new();
    let admin = sql(&db.url).await;
    admin
        .batch_execute(
            "CREATE SCHEMA frozen; CREATE TABLE frozen.now (t timestamptz NOT NULL); \
             INSERT INTO frozen.now VALUES ('2026-06-01 00:00:00+00'); \
             CREATE FUNCTION frozen.clock_timestamp() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT t FROM frozen.now $$;",
        )
        .await
        .unwrap();
    let secret = CoordinatorSecret::generate().unwrap();
    let url = format!(
        "{} options='-c search_path=frozen,pg_catalog,public'",
        db.url
    );
    let store = Store::connect(&url, secret.clone()).await.unwrap();
    store.migrate().await.unwrap();
    let (leader, _) = store.acquire(&candidate("a"), 60_000).await.unwrap();
    let lane = adopt(&store, &leader, "h1:w1").await;
    // The test moves deadlines by hand, outside any transition (triggers off for it); the
    // schema lives where the store's search path put it.
    admin
        .batch_execute(
            "SET session_replication_role = replica; SET search_path = frozen, pg_catalog, public",
        )
        .await
        .unwrap();
    (
        Fx {
            db,
            store,
            secret,
            leader,
            lane,
        },
        admin,
    )
}

#[tokio::test]
async fn a_deadline_equal_to_database_time_is_expired_and_host_times_are_ignored() {
    let (f, admin) = frozen_fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    // Host-supplied deadlines are not inputs: an ACK naming a later deadline is a mismatch.
    let mut a = ack(l, &r);
    a.reservation_deadline = "2999-12-31T23:59:59.999999Z".into();
    assert_eq!(category(s.consume_ack(l, &a).await), Category::Mismatch);
    // Deadline == database now: expired, by the coordinator's own predicate.
    admin.batch_execute(&format!("UPDATE reservations SET deadline = (SELECT t FROM frozen.now) WHERE reservation_id = '{}'", r.chain().reservation_id)).await.unwrap();
    let mut at_deadline = ack(l, &r);
    at_deadline.reservation_deadline = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap()
        .reservation_deadline;
    assert_eq!(
        category(s.consume_ack(l, &at_deadline).await),
        Category::Expired
    );
    assert_eq!(state(s, "h1:w1").await, "AWAITING_ACK");
    // One microsecond later than now: still valid.
    admin.batch_execute(&format!("UPDATE reservations SET deadline = (SELECT t FROM frozen.now) + interval '1 microsecond' WHERE reservation_id = '{}'", r.chain().reservation_id)).await.unwrap();
    at_deadline.reservation_deadline = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap()
        .reservation_deadline;
    s.consume_ack(l, &at_deadline).await.unwrap();
    // The leadership lease equal to now: stale, at the frame's open and at commit.
    admin
        .batch_execute("UPDATE leadership SET lease_expires_at = (SELECT t FROM frozen.now)")
        .await
        .unwrap();
    let lane2 = s.lane("h1:w1").await.unwrap().unwrap();
    assert_eq!(
        category(
            s.quarantine(l, &lane2.lane_incarnation_id, "x", false)
                .await
        ),
        Category::StaleLeader
    );
    admin.batch_execute("UPDATE leadership SET lease_expires_at = (SELECT t FROM frozen.now) + interval '1 microsecond'").await.unwrap();
    s.quarantine(l, &lane2.lane_incarnation_id, "x", false)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_unverified_cleanup_never_completes_and_completion_needs_a_run() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r = to_awaiting_ack(s, l, &inc, None, 60_000).await;
    // COMPLETED before anything ran is refused and changes nothing.
    let before = authority_counts(&f.db.url).await;
    assert_eq!(
        category(
            s.request_end(
                l,
                &r.chain().assignment_id,
                Outcome::Completed,
                Some(&d('e'))
            )
            .await
        ),
        Category::WrongState
    );
    assert_eq!(authority_counts(&f.db.url).await, before);
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    s.activate(l, &activation(s, &r).await).await.unwrap();
    s.request_end(
        l,
        &r.chain().assignment_id,
        Outcome::Completed,
        Some(&d('e')),
    )
    .await
    .unwrap();
    assert_eq!(
        category(s.finish(l, &inc).await),
        Category::WrongState,
        "finish before the receipt"
    );
    let (rec, _) = s
        .ingest_termination(l, HOST, &receipt_for(&r, "quit", false))
        .await
        .unwrap();
    assert_eq!(
        rec,
        Reconciliation::Retiring {
            outcome: Some("QUARANTINED".into())
        },
        "cleanup failure is never COMPLETED"
    );
    assert_eq!(
        assignment(s, &r.chain().assignment_id).await.lifecycle,
        "QUARANTINED"
    );
    s.finish(l, &inc).await.unwrap();
    assert_eq!(
        state(s, "h1:w1").await,
        "QUARANTINED",
        "unverified cleanup quarantines the lane, never clean"
    );
    assert_eq!(
        category(s.reserve(l, &request(&inc, None, 60_000)).await),
        Category::WrongState
    );
    // Its release is refused: that cleanup was never verified (the way out is a recreate).
    assert_eq!(
        category(s.release_quarantine(l, &inc, &uid("rel")).await),
        Category::Unreconciled
    );
}

#[tokio::test]
async fn a_stop_is_cancelled_only_after_the_hosts_receipt_and_repeats_idempotently() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r = running(s, l, &inc).await;
    let id = r.chain().assignment_id.clone();
    let a = s
        .request_end(l, &id, Outcome::Cancelled, None)
        .await
        .unwrap();
    let b = s
        .request_end(l, &id, Outcome::Cancelled, None)
        .await
        .unwrap();
    assert_eq!(a.receipt.receipt_id, b.receipt.receipt_id);
    // Another outcome for the same assignment is a conflict, not a second decision.
    assert_eq!(
        category(s.request_end(l, &id, Outcome::Failed, None).await),
        Category::IdempotencyConflict
    );
    assert_eq!(
        assignment(s, &id).await.lifecycle,
        "ACTIVE",
        "nothing final before the host's receipt"
    );
    s.ingest_termination(l, HOST, &receipt_for(&r, "quit", true))
        .await
        .unwrap();
    assert_eq!(assignment(s, &id).await.lifecycle, "CANCELLED");
    s.finish(l, &inc).await.unwrap();
    // An assignment in recovery is cancelled at once when nothing of it is left running…
    let r2 = running(s, l, &inc).await;
    s.ingest_termination(l, HOST, &receipt_for(&r2, "sigkill", true))
        .await
        .unwrap();
    let id2 = r2.chain().assignment_id.clone();
    assert_eq!(assignment(s, &id2).await.lifecycle, "RECOVERY");
    let e = s
        .request_end(l, &id2, Outcome::Cancelled, None)
        .await
        .unwrap();
    assert!(!e.awaiting_receipt);
    assert_eq!(assignment(s, &id2).await.lifecycle, "CANCELLED");
    // …and after its receipt when its last generation is still being stopped.
    let r3 = to_awaiting_ack(s, l, &inc, None, 60_000).await;
    s.end_chain(l, r3.chain(), EndCause::Abandoned)
        .await
        .unwrap();
    let id3 = r3.chain().assignment_id.clone();
    let e = s
        .request_end(l, &id3, Outcome::Cancelled, None)
        .await
        .unwrap();
    assert!(e.awaiting_receipt);
    assert_eq!(assignment(s, &id3).await.lifecycle, "RECOVERY");
    s.ingest_termination(l, HOST, &receipt_for(&r3, "quit", true))
        .await
        .unwrap();
    assert_eq!(assignment(s, &id3).await.lifecycle, "CANCELLED");
    s.finish(l, &inc).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
}

#[tokio::test]
async fn termination_receipts_are_observations_reconciled_into_recovery_or_quarantine() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r = running(s, l, &inc).await;
    // SIGKILL while RUNNING: recovery, never a terminal outcome; leases revoked.
    let tr = receipt_for(&r, "sigkill", true);
    let (rec, first) = s.ingest_termination(l, HOST, &tr).await.unwrap();
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
    // Idempotent: the same receipt again is the same answer.
    let (_, again) = s.ingest_termination(l, HOST, &tr).await.unwrap();
    assert_eq!((again.receipt_id, again.replayed), (first.receipt_id, true));
    assert_eq!(
        count(&f.db.url, "SELECT count(*) FROM termination_receipts").await,
        1
    );
    // The coordinator's copy names what the receipt concerned.
    let rows = s.termination_receipts(Some("h1:w1")).await.unwrap();
    assert_eq!(
        rows[0]["coordinator"]["assignment_id"],
        json!(r.chain().assignment_id)
    );
    assert_eq!(
        rows[0]["coordinator"]["assignment_attempt_id"],
        json!(r.chain().assignment_attempt_id)
    );
    assert_eq!(rows[0]["coordinator"]["execution_owner"], json!(TARGET));
    // A receipt from another host is refused and changes nothing.
    let before = authority_counts(&f.db.url).await;
    assert_eq!(
        category(
            s.ingest_termination(l, "h2", &receipt_for(&r, "quit", true))
                .await
        ),
        Category::NotOwner
    );
    assert_eq!(authority_counts(&f.db.url).await, before);
    // Resuming with other scope is refused and leaves the lane as it was.
    let id = r.chain().assignment_id.clone();
    let mut other_scope = request(&inc, Some(&id), 60_000);
    other_scope.scope = vec!["repo:other".into()];
    assert_eq!(
        category(s.reserve(l, &other_scope).await),
        Category::Mismatch
    );
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
    assert_eq!(assignment(s, &id).await.lifecycle, "RECOVERY");
    // The assignment gets a fresh chain on the now clean lane, with a new generation.
    let r2 = to_awaiting_ack(s, l, &inc, Some(&id), 60_000).await;
    assert_eq!(r2.generation, r.generation + 1);
    assert_ne!(
        r2.chain().assignment_attempt_id,
        r.chain().assignment_attempt_id
    );
    // Now ACTIVE again: a second resume elsewhere is refused and reserves nothing.
    let lane2 = adopt(s, l, "h1:w2").await;
    assert_eq!(
        category(
            s.reserve(l, &request(&lane2.lane_incarnation_id, Some(&id), 60_000))
                .await
        ),
        Category::WrongState
    );
    assert_eq!(state(s, "h1:w2").await, "IDLE_CLEAN");
    // A receipt for a generation never staged contradicts state: quarantine.
    let mut bogus = receipt_for(&r2, "sigkill", true);
    bogus["generation"] = json!(99);
    bogus["idempotency_key"] = json!(mosaic::supervisor::receipt::idempotency_key(
        "h1:w1", &inc, 99
    ));
    let (rec, _) = s.ingest_termination(l, HOST, &bogus).await.unwrap();
    assert!(matches!(rec, Reconciliation::Quarantined { .. }), "{rec:?}");
    assert_eq!(state(s, "h1:w1").await, "QUARANTINED");
    assert_eq!(
        assignment(s, &id).await.lifecycle,
        "RECOVERY",
        "quarantine moves active work to recovery"
    );
    assert_eq!(
        category(s.release_quarantine(l, &inc, &uid("rel")).await),
        Category::Unreconciled,
        "the staged generation has not ended"
    );
    // Its end arrives as evidence; with every cleanup verified, the quarantine is released.
    let (rec, _) = s
        .ingest_termination(l, HOST, &receipt_for(&r2, "quit", true))
        .await
        .unwrap();
    assert_eq!(
        rec,
        Reconciliation::Evidence {
            lane_state: "QUARANTINED".into()
        }
    );
    s.release_quarantine(l, &inc, &uid("rel")).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
}

#[tokio::test]
async fn lane_reincarnation_cannot_reset_generations_or_accept_stale_authority() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let old = f.lane.lane_incarnation_id.clone();
    let r = running(s, l, &old).await;
    // A recreate request needs a lane with no live chain.
    assert_eq!(
        category(s.request_recreate(l, &old).await),
        Category::WrongState
    );
    // The host reports a new incarnation (it destroyed the old lane and verified it empty):
    // the old one retires with its work in recovery and its generation ended.
    let new = adopt(s, l, "h1:w1").await;
    assert_ne!(new.lane_incarnation_id, old);
    assert_eq!((new.state.as_str(), new.next_generation), ("IDLE_CLEAN", 1));
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (a.lifecycle.as_str(), a.execution_owner.as_deref()),
        ("RECOVERY", None)
    );
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM leases WHERE released_at IS NULL"
        )
        .await,
        0
    );
    // A retired incarnation never comes back, and another host cannot claim the lane.
    assert_eq!(
        category(s.adopt_lane_incarnation(l, HOST, "h1:w1", &old).await),
        Category::Mismatch
    );
    assert_eq!(
        category(s.adopt_lane_incarnation(l, "h2", "h1:w1", &uid("li")).await),
        Category::BadInput
    );
    // Nothing addressed to the old incarnation acts any more.
    let mut late = ack(l, &r);
    late.ack_digest = d('f');
    assert_eq!(
        category(s.consume_ack(l, &late).await),
        Category::ChallengeConsumed
    );
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
    // The old generation's late receipt is kept as evidence; nothing moves.
    let (rec, _) = s
        .ingest_termination(l, HOST, &receipt_for(&r, "replace", true))
        .await
        .unwrap();
    assert_eq!(
        rec,
        Reconciliation::Evidence {
            lane_state: "RUNNING".into()
        }
    );
    assert_eq!(state(s, "h1:w1").await, "AWAITING_ACK");
}

#[tokio::test]
async fn an_expired_reservation_chain_cannot_authorize_its_successor() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r1 = to_awaiting_ack(s, l, &inc, None, 1_000).await;
    let r1_ack = ack(l, &r1);
    // R1's activation values, as they would be presented (its own fence token).
    let r1_row = s
        .chain_by_reservation(&r1.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        category(s.end_chain(l, r1.chain(), EndCause::Expired).await),
        Category::WrongState,
        "not expired yet"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(category(s.consume_ack(l, &r1_ack).await), Category::Expired);
    s.end_chain(l, r1.chain(), EndCause::Expired).await.unwrap();
    assert_eq!(
        state(s, "h1:w1").await,
        "DRAINING",
        "the staged generation must be seen to end"
    );
    s.ingest_termination(l, HOST, &receipt_for(&r1, "quit", true))
        .await
        .unwrap();
    s.finish(l, &inc).await.unwrap();
    // R2: same assignment, fresh attempt, reservation, generation and challenge.
    let r2 = to_awaiting_ack(s, l, &inc, Some(&r1.chain().assignment_id), 60_000).await;
    assert_ne!(r2.chain().reservation_id, r1.chain().reservation_id);
    // R1's ACK cannot be replayed onto R2, whole or spliced.
    assert_eq!(category(s.consume_ack(l, &r1_ack).await), Category::Expired);
    let mut spliced = r1_ack.clone();
    spliced.challenge_id = r2.challenge.clone();
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
    // R1's fence and challenge cannot activate R2.
    s.consume_ack(l, &ack(l, &r2)).await.unwrap();
    let good = activation(s, &r2).await;
    let mut x = good.clone();
    x.fence_token = f
        .secret
        .fence_token(&r1_row.chain.reservation_id, &r1_row.fence_salt);
    assert_eq!(category(s.activate(l, &x).await), Category::FenceMismatch);
    let mut x = good.clone();
    x.challenge_id = r1.challenge.clone();
    assert_eq!(category(s.activate(l, &x).await), Category::Mismatch);
    s.activate(l, &good).await.unwrap();
}

/// A reservation's epoch is the version of its lane incarnation's reservation authority: it
/// moves with every reservation that replaces the last (spec §4), the previous chain's epoch
/// no longer binds an ACK, and the database refuses an epoch that does not move forward and
/// any change to one.
#[tokio::test]
async fn the_reservation_epoch_moves_with_every_replacement_and_never_back() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r1 = to_awaiting_ack(s, l, &inc, None, 1_000).await;
    assert_eq!(r1.chain().reservation_epoch, 1);
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    s.end_chain(l, r1.chain(), EndCause::Expired).await.unwrap();
    s.ingest_termination(l, HOST, &receipt_for(&r1, "quit", true))
        .await
        .unwrap();
    s.finish(l, &inc).await.unwrap();
    let r2 = to_awaiting_ack(s, l, &inc, Some(&r1.chain().assignment_id), 60_000).await;
    assert_eq!(
        r2.chain().reservation_epoch,
        2,
        "the replacement moves the epoch"
    );
    let row = s
        .chain_by_reservation(&r2.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.chain.reservation_epoch, 2,
        "the row holds what the receipt said"
    );
    // An ACK bound to the replaced authority's epoch does not bind the new chain.
    let mut old = ack(l, &r2);
    old.reservation_epoch = r1.chain().reservation_epoch;
    assert_eq!(category(s.consume_ack(l, &old).await), Category::Mismatch);
    // The database itself refuses an epoch that does not move forward, and any change.
    let c = sql(&f.db.url).await;
    let e = c
        .batch_execute(&format!(
            "INSERT INTO reservations (reservation_id, reservation_epoch, reservation_lease_id, assignment_id, assignment_attempt_id, \
                                       lane_incarnation_id, sot_incarnation, coordinator_epoch, deadline, fence_digest, fence_salt) \
             SELECT 'rs-forged', 2, 'rl-forged', assignment_id, 'at-forged', lane_incarnation_id, sot_incarnation, coordinator_epoch, \
                    deadline, fence_digest, fence_salt FROM reservations WHERE reservation_id = '{}'",
            r2.chain().reservation_id
        ))
        .await
        .unwrap_err();
    assert!(
        e.as_db_error()
            .is_some_and(|d| d.message().contains("does not replace epoch 2")),
        "{e:?}"
    );
    let e = c
        .batch_execute(&format!(
            "UPDATE reservations SET reservation_epoch = 9 WHERE reservation_id = '{}'",
            r1.chain().reservation_id
        ))
        .await
        .unwrap_err();
    assert!(
        e.as_db_error()
            .is_some_and(|d| d.message().contains("epoch never changes")),
        "{e:?}"
    );
    // The new chain still activates with its own epoch.
    s.consume_ack(l, &ack(l, &r2)).await.unwrap();
    s.activate(l, &activation(s, &r2).await).await.unwrap();
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
    let x = activation(s, &r).await;
    for (name, when) in steps {
        c.batch_execute(&format!(
            "CREATE TRIGGER crash_step {when} EXECUTE FUNCTION crash()"
        ))
        .await
        .unwrap();
        // Each attempt dies with its connection; the primitive retries with the same key
        // (the outcome is unknown to it) and then reports the failure.
        let got = s.activate(l, &x).await;
        assert!(
            matches!(got, Err(AuthorityError::Connection(_))),
            "{name}: {got:?}"
        );
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
    // After the crashes, one clean activation: exactly RUNNING, its lease, one receipt.
    let rcpt = s.activate(l, &x).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "RUNNING");
    assert_eq!(count(&f.db.url, "SELECT count(*) FROM leases").await, 1);
    assert_eq!(rcpt.body["leases"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn an_ambiguous_commit_is_retried_with_the_same_key_and_returns_the_same_receipt() {
    let proxy = pg::CommitDropper::start().await;
    let f = fx_at(|name| proxy.url(name)).await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    let x = activation(s, &r).await;
    // The next COMMIT reaches the server, but its answer never reaches the store.
    proxy.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let got = s.activate(l, &x).await.unwrap();
    assert_eq!(
        proxy.dropped.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the commit was made ambiguous"
    );
    // The first attempt committed; the retry found its receipt and changed nothing.
    assert!(
        got.replayed,
        "the retry must return the committed receipt, not decide again"
    );
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM transition_receipts WHERE transition = 'activate'"
        )
        .await,
        1
    );
    assert_eq!(count(&f.db.url, "SELECT count(*) FROM leases").await, 1);
    assert_eq!(state(s, "h1:w1").await, "RUNNING");
    let again = s.activate(l, &x).await.unwrap();
    assert_eq!(again.receipt_id, got.receipt_id);
}

#[tokio::test]
async fn the_database_refuses_authority_writes_outside_a_current_leaders_transition() {
    let f = fx().await;
    let c = sql(&f.db.url).await;
    // No receipt in the same transaction: refused at COMMIT.
    let e = c
        .batch_execute("UPDATE lane_incarnations SET state = 'RUNNING'")
        .await
        .unwrap_err();
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("MS002"),
        "{e}"
    );
    assert_eq!(state(&f.store, "h1:w1").await, "IDLE_CLEAN");
    // A receipt under an epoch that is not the current lease: refused at COMMIT.
    let e = c
        .batch_execute(&format!(
            "BEGIN; UPDATE lane_incarnations SET state = 'RUNNING'; \
             INSERT INTO transition_receipts (receipt_id, transition, sot_incarnation, coordinator_epoch, body) VALUES ('tr-forged', 'activate', '{}', {}, '{{}}'); COMMIT;",
            f.leader.sot(),
            f.leader.epoch() + 7
        ))
        .await
        .unwrap_err();
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("MS001"),
        "{e}"
    );
    let _ = c.batch_execute("ROLLBACK").await;
    assert_eq!(state(&f.store, "h1:w1").await, "IDLE_CLEAN");
    assert_eq!(
        count(
            &f.db.url,
            "SELECT count(*) FROM transition_receipts WHERE receipt_id = 'tr-forged'"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn raw_fence_tokens_appear_in_no_column_error_or_audit_line() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    let x = activation(s, &r).await;
    // The token the store itself presents, derived from the secret and the stored salt.
    let row = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    let raw = f
        .secret
        .fence_token(&row.chain.reservation_id, &row.fence_salt)
        .expose_hex();
    assert_eq!(x.fence_token.expose_hex(), raw);
    let mut wrong = x.clone();
    wrong.generation += 1;
    let err = s.activate(l, &wrong).await.unwrap_err();
    s.activate(l, &x).await.unwrap();
    assert!(!err.to_string().contains(&raw) && !format!("{err:?}").contains(&raw));
    assert!(!format!("{:?}", x.fence_token).contains(&raw));
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
        for row in c
            .query(&format!("SELECT row_to_json(x)::text FROM {t} x"), &[])
            .await
            .unwrap()
        {
            let text: String = row.get(0);
            assert!(
                !text.to_lowercase().contains(&raw),
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
async fn bad_requests_are_refused_before_anything_is_reserved() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let before = authority_counts(&f.db.url).await;
    type Bad = (&'static str, fn(&mut ReserveRequest), Category);
    let rows: Vec<Bad> = vec![
        (
            "unknown directive",
            |r| r.task_text = "print=x frobnicate".into(),
            Category::BadInput,
        ),
        (
            "empty task",
            |r| r.task_text = "  ".into(),
            Category::BadInput,
        ),
        (
            "oversized task",
            |r| r.task_text = "print=x ".repeat(20_000),
            Category::TooLarge,
        ),
        (
            "runtime without version",
            |r| r.runtime_id = "fake".into(),
            Category::UnknownRuntime,
        ),
        (
            "unknown completion policy",
            |r| r.completion_policy = "agent-says-so".into(),
            Category::BadInput,
        ),
        (
            "no target (no owner)",
            |r| r.target = String::new(),
            Category::BadInput,
        ),
        ("ttl too short", |r| r.ttl_ms = 10, Category::BadInput),
        (
            "unknown lane",
            |r| r.lane_incarnation_id = "li-unknown".into(),
            Category::NotFound,
        ),
        (
            "resume of an unknown assignment",
            |r| r.assignment_id = Some("as-unknown".into()),
            Category::NotFound,
        ),
    ];
    for (what, bad, want) in rows {
        let mut r = request(&inc, None, 60_000);
        bad(&mut r);
        assert_eq!(category(s.reserve(l, &r).await), want, "{what}");
        assert_eq!(
            authority_counts(&f.db.url).await,
            before,
            "{what} changed something"
        );
    }
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
    assert!(s
        .adopt_lane_incarnation(l, HOST, "no-colon", &uid("li"))
        .await
        .is_err());
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

fn progress(r: &Ready, evidence: &str) -> mosaic::coordinator::continuity::ProgressClaim {
    mosaic::coordinator::continuity::ProgressClaim {
        chain: r.chain().clone(),
        generation: r.generation,
        evidence_kind: "test-result".into(),
        evidence_digest: mosaic::protocol::work::evidence_digest(
            "test-result",
            evidence.as_bytes(),
        ),
        next_action: None,
        message_id: uid("msg"),
    }
}

/// A refused progress report or block names the predicate of its compare-and-swap that
/// failed (each refusal is built from the CAS's own predicate table), and changes nothing.
#[tokio::test]
async fn a_refused_progress_or_block_names_the_predicate_that_failed() {
    use mosaic::coordinator::continuity::Blocker;
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running(s, l, &f.lane.lane_incarnation_id).await;
    let asg = r.chain().assignment_id.clone();
    s.record_progress(l, &progress(&r, "first")).await.unwrap();
    let before = authority_counts(&f.db.url).await;
    let refused = |e: AuthorityError, cat: Category, says: &str| {
        assert_eq!(e.category(), Some(cat), "{e}");
        assert!(e.to_string().contains(says), "{says:?} not in: {e}");
    };
    // The same evidence again is the same step: its receipt, nothing counted twice.
    assert!(
        s.record_progress(l, &progress(&r, "first"))
            .await
            .unwrap()
            .replayed
    );
    // Another generation of the chain.
    let mut other = progress(&r, "second");
    other.generation += 1;
    refused(
        s.record_progress(l, &other).await.unwrap_err(),
        Category::WrongState,
        "generation is not the chain's",
    );
    // A generation that is not RUNNING on the work's open reservation cannot block it.
    let ev = d('e');
    let by = Blocker::Generation {
        chain: r.chain().clone(),
        generation: r.generation + 1,
    };
    refused(
        s.block(l, &asg, &by, "needs-review", &ev, "review it")
            .await
            .unwrap_err(),
        Category::WrongState,
        "RUNNING generation",
    );
    assert_eq!(
        authority_counts(&f.db.url).await,
        before,
        "a refusal changed something"
    );
    // Blocked once, it cannot be blocked again.
    s.block(
        l,
        &asg,
        &Blocker::Operator,
        "needs-review",
        &ev,
        "review it",
    )
    .await
    .unwrap();
    refused(
        s.block(
            l,
            &asg,
            &Blocker::Operator,
            "needs-review",
            &d('f'),
            "review it",
        )
        .await
        .unwrap_err(),
        Category::WrongState,
        "only active work",
    );
    refused(
        s.block(
            l,
            "as-nowhere",
            &Blocker::Operator,
            "needs-review",
            &ev,
            "x",
        )
        .await
        .unwrap_err(),
        Category::NotFound,
        "no such assignment",
    );
}

/// Spec §14 rule 6 / §15 (Watchdog deadline race): progress at the inactivity deadline is
/// expired and cannot extend it; one microsecond before, it does and the watchdog cannot
/// replace. Repeated evidence never counts twice; progress of another generation never
/// counts.
#[tokio::test]
async fn progress_at_the_inactivity_deadline_is_expired_and_only_new_evidence_counts() {
    let (f, admin) = frozen_fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running(s, l, &f.lane.lane_incarnation_id).await;
    let asg = r.chain().assignment_id.clone();
    let set_deadline = |offset: &'static str| {
        let asg = asg.clone();
        let admin = &admin;
        async move {
            admin
                .batch_execute(&format!(
                    "UPDATE assignments SET inactivity_deadline = (SELECT t FROM frozen.now) + interval '{offset}' WHERE assignment_id = '{asg}'"
                ))
                .await
                .unwrap();
        }
    };
    // One microsecond before the deadline: the watchdog cannot replace, progress counts.
    set_deadline("1 microsecond").await;
    assert_eq!(
        category(s.inactivity_replace(l, r.chain()).await),
        Category::WrongState
    );
    s.record_progress(l, &progress(&r, "report 1"))
        .await
        .unwrap();
    // The same evidence again, under a new message, is the same step: it lands on the first
    // receipt and moves nothing.
    set_deadline("1 microsecond").await;
    let again = s
        .record_progress(l, &progress(&r, "report 1"))
        .await
        .unwrap();
    assert!(again.replayed);
    let unmoved = format!(
        "SELECT count(*) FROM assignments WHERE assignment_id = '{asg}' \
         AND inactivity_deadline = '2026-06-01 00:00:00.000001+00'"
    );
    assert_eq!(
        admin_count(&admin, &unmoved).await,
        1,
        "a repeated report extended the deadline"
    );
    // Another generation's progress never counts.
    let mut other = progress(&r, "report 2");
    other.generation += 1;
    assert_eq!(
        category(s.record_progress(l, &other).await),
        Category::WrongState
    );
    // Evidence of a kind the policy does not know is refused before anything is read.
    let mut odd = progress(&r, "report 3");
    odd.evidence_kind = "vibes".into();
    assert_eq!(
        category(s.record_progress(l, &odd).await),
        Category::BadInput
    );
    // At the deadline (equality): expired. Progress cannot extend it; the watchdog replaces.
    set_deadline("0").await;
    assert_eq!(
        category(s.record_progress(l, &progress(&r, "report 4")).await),
        Category::Expired
    );
    let rep = s.inactivity_replace(l, r.chain()).await.unwrap();
    assert_eq!(rep.body["to"], "DRAINING");
    assert_eq!(state(s, "h1:w1").await, "DRAINING");
    let a = assignment(s, &asg).await;
    assert_eq!(
        (a.lifecycle.as_str(), a.execution_owner),
        ("RECOVERY", None)
    );
    assert_eq!(
        admin_count(&admin, "SELECT count(*) FROM progress_receipts").await,
        1
    );
    assert_eq!(
        admin_count(
            &admin,
            "SELECT count(*) FROM leases WHERE released_at IS NULL"
        )
        .await,
        0
    );
    // After the replacement nothing of the old generation counts any more.
    assert_eq!(
        category(s.record_progress(l, &progress(&r, "report 5")).await),
        Category::WrongState
    );
}

/// Concurrent progress and replacement around the deadline (real clock): at most one
/// replacement, and no progress is accepted after it.
#[tokio::test]
async fn concurrent_progress_and_replacement_have_one_order() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running(s, l, &f.lane.lane_incarnation_id).await;
    let admin = sql(&f.db.url).await;
    admin
        .batch_execute(&format!(
            "SET session_replication_role = replica; \
             UPDATE assignments SET inactivity_deadline = clock_timestamp() + interval '40 milliseconds' WHERE assignment_id = '{}'",
            r.chain().assignment_id
        ))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (s, l, claim, chain) = (
            s.clone(),
            l.clone(),
            progress(&r, &format!("report {i}")),
            r.chain().clone(),
        );
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(i * 6)).await;
            if i % 2 == 0 {
                (
                    "progress",
                    s.record_progress(&l, &claim).await.map(|x| x.decided_at),
                )
            } else {
                (
                    "replace",
                    s.inactivity_replace(&l, &chain).await.map(|x| x.decided_at),
                )
            }
        }));
    }
    let mut progress_at = Vec::new();
    let mut replaced_at = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            ("progress", Ok(at)) => progress_at.push(at),
            (_, Ok(at)) => replaced_at.push(at),
            (_, Err(e)) => assert!(
                matches!(e.category(), Some(Category::WrongState | Category::Expired)),
                "{e}"
            ),
        }
    }
    assert!(replaced_at.len() <= 1, "{replaced_at:?}");
    // A replacement after an accepted extension would be a lost update: every accepted
    // progress receipt's new deadline must precede the replacement.
    if let Some(rep) = replaced_at.first() {
        let late = count(
            &f.db.url,
            &format!(
                "SELECT count(*) FROM progress_receipts WHERE mosaic_ts(new_deadline) > '{rep}'"
            ),
        )
        .await;
        assert_eq!(
            late, 0,
            "progress extended a deadline the replacement then ignored"
        );
    }
    if let Some(rep) = replaced_at.first() {
        assert!(
            progress_at.iter().all(|p| p < rep),
            "progress accepted after the replacement: {progress_at:?} vs {rep}"
        );
        assert_eq!(state(s, "h1:w1").await, "DRAINING");
    } else {
        assert_eq!(state(s, "h1:w1").await, "RUNNING");
        assert!(!progress_at.is_empty());
    }
}

async fn admin_count(admin: &tokio_postgres::Client, q: &str) -> i64 {
    admin.query_one(q, &[]).await.unwrap().get(0)
}

/// A handoff offered from RUNNING work on w1 to w2, its target chain driven to its handoff
/// challenge; returns the offer's target chain and the ACK that would be accepted.
async fn handoff_to_challenge(
    s: &Store,
    l: &Leader,
    source: &Ready,
    target_inc: &str,
) -> (Chain, mosaic::coordinator::handoff::HandoffAckClaim, Ready) {
    use mosaic::coordinator::handoff::{HandoffAckClaim, OfferRequest};
    let c = s
        .offer_handoff(
            l,
            &OfferRequest {
                request_id: uid("ho"),
                assignment_id: source.chain().assignment_id.clone(),
                target_lane_incarnation_id: target_inc.into(),
                task_text: None,
                ttl_ms: 60_000,
            },
        )
        .await
        .unwrap();
    s.checkpoint(l, &c).await.unwrap();
    s.fence(l, &c).await.unwrap();
    let (generation, _) = s.stage(l, &c).await.unwrap();
    let id = identity(7000 + generation);
    let staged = s.record_staged(l, &c, generation, &id).await.unwrap();
    let contracts = staged.str("contracts_digest").unwrap();
    let (hc, _, r) = s
        .record_injected(l, &c, &contracts, &id, 60_000)
        .await
        .unwrap();
    assert_eq!(r.body["challenge_kind"], "handoff");
    let h = s
        .handoff_of_reservation(&c.reservation_id)
        .await
        .unwrap()
        .unwrap();
    let claim = HandoffAckClaim {
        handoff_challenge_id: hc.clone(),
        sot_incarnation: l.sot().into(),
        coordinator_epoch: l.epoch(),
        assignment_id: c.assignment_id.clone(),
        source_assignment_attempt_id: source.chain().assignment_attempt_id.clone(),
        target_assignment_attempt_id: c.assignment_attempt_id.clone(),
        responsibility_owner: TARGET.into(),
        execution_owner: TARGET.into(),
        pending_target: "h1:w2".into(),
        next_action_digest: h.next_action_digest.clone(),
        scope_digest: scope_digest(),
        holds_digest: holds_digest(),
        contracts_digest: contracts.clone(),
        lane_incarnation_id: c.lane_incarnation_id.clone(),
        generation,
        challenge_deadline: h.challenge_deadline.clone().unwrap(),
        ack_digest: d('h'),
    };
    let deadline = s
        .chain_by_reservation(&c.reservation_id)
        .await
        .unwrap()
        .unwrap()
        .reservation_deadline;
    let target = Ready {
        res: Reserved {
            chain: c.clone(),
            reservation_lease_id: String::new(),
            deadline,
            receipt: r,
        },
        generation,
        identity: id,
        contracts,
        challenge: hc,
    };
    (c, claim, target)
}

/// §17 Authority-owner handoff binding and Handoff/activation confusion: every bound field
/// of a handoff ACK is checked (one mismatch at a time is refused and changes nothing), a
/// handoff challenge cannot be consumed as an activation challenge, an activation is
/// impossible before the handoff is accepted, and the handoff receipt grants no lease.
#[tokio::test]
async fn a_handoff_ack_binds_every_field_and_never_stands_in_for_activation() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let w2 = adopt(s, l, "h1:w2").await;
    let source = running(s, l, &f.lane.lane_incarnation_id).await;
    // An offer is refused by the predicate of its compare-and-swap that failed, by name:
    // onto the lane the work already runs on, or of work that does not exist.
    let offer = |target: &str, asg: &str| mosaic::coordinator::handoff::OfferRequest {
        request_id: uid("ho"),
        assignment_id: asg.into(),
        target_lane_incarnation_id: target.into(),
        task_text: None,
        ttl_ms: 60_000,
    };
    let e = s
        .offer_handoff(
            l,
            &offer(&f.lane.lane_incarnation_id, &source.chain().assignment_id),
        )
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::BadInput), "{e}");
    assert!(e.to_string().contains("already runs on"), "{e}");
    let e = s
        .offer_handoff(l, &offer(&w2.lane_incarnation_id, "as-nowhere"))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::NotFound), "{e}");
    let (c, good, target) = handoff_to_challenge(s, l, &source, &w2.lane_incarnation_id).await;
    // A second offer while one is pending names that.
    let e = s
        .offer_handoff(
            l,
            &offer(&w2.lane_incarnation_id, &source.chain().assignment_id),
        )
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert!(e.to_string().contains("only RUNNING active work"), "{e}");
    let before = authority_counts(&f.db.url).await;
    type Forge = (
        &'static str,
        fn(&mut mosaic::coordinator::handoff::HandoffAckClaim),
    );
    let forged: [Forge; 15] = [
        ("challenge", |a| a.handoff_challenge_id = "hc-forged".into()),
        ("timeline", |a| a.sot_incarnation = "sot-other".into()),
        ("epoch", |a| a.coordinator_epoch += 1),
        ("assignment", |a| a.assignment_id = "as-other".into()),
        ("source attempt", |a| {
            a.source_assignment_attempt_id = "at-other".into()
        }),
        ("target attempt", |a| {
            a.target_assignment_attempt_id = "at-other".into()
        }),
        ("responsibility owner", |a| {
            a.responsibility_owner = "h1:w2".into()
        }),
        ("execution owner", |a| a.execution_owner = "h1:w9".into()),
        ("pending target", |a| a.pending_target = "h1:w1".into()),
        ("next action", |a| a.next_action_digest = d('0')),
        ("scope", |a| a.scope_digest = d('1')),
        ("holds", |a| a.holds_digest = d('2')),
        ("contracts", |a| a.contracts_digest = d('3')),
        ("generation", |a| a.generation += 1),
        ("deadline", |a| {
            a.challenge_deadline = "2999-01-01T00:00:00.000000Z".into()
        }),
    ];
    // Each forged field is refused by the predicate that compares it, and the refusal
    // names that field (the diagnosis is built from the CAS's own predicate table).
    let names = |what: &str| match what {
        "challenge" => "",
        "timeline" => "timeline",
        "epoch" => "epoch",
        "assignment" => "assignment_id",
        "source attempt" => "source_assignment_attempt_id",
        "target attempt" => "target_assignment_attempt_id",
        "responsibility owner" => "responsibility_owner differs",
        "execution owner" => "execution_owner differs",
        "pending target" => "pending_target differs",
        "next action" => "next_action_digest",
        "scope" => "scope_digest",
        "holds" => "holds_digest",
        "contracts" => "contracts_digest",
        "generation" => "generation differs",
        "deadline" => "challenge_deadline differs",
        other => panic!("no expectation for {other}"),
    };
    for (what, forge) in forged {
        let mut a = good.clone();
        forge(&mut a);
        let e = s.accept_handoff(l, &a).await.unwrap_err();
        let cat = e.category();
        if what == "challenge" {
            assert_eq!(cat, Some(Category::NotFound), "forged {what}: {e}");
        } else {
            assert_eq!(cat, Some(Category::Mismatch), "forged {what}: {e}");
            assert!(e.to_string().contains(names(what)), "forged {what}: {e}");
        }
    }
    assert_eq!(
        authority_counts(&f.db.url).await,
        before,
        "a refused handoff ACK changed something"
    );
    // The handoff challenge is not an activation challenge.
    assert_eq!(
        category(s.consume_ack(l, &ack(l, &target)).await),
        Category::NotFound
    );
    // No activation challenge exists for the target before the handoff is accepted.
    assert_eq!(
        category(s.issue_activation_challenge(l, &c, 60_000).await),
        Category::WrongState
    );
    // The real ACK: responsibility moves, the source is fenced, nothing is granted.
    let r = s.accept_handoff(l, &good).await.unwrap();
    assert_eq!(r.body["execution_owner"], serde_json::Value::Null);
    let a = assignment(s, &c.assignment_id).await;
    assert_eq!(
        (
            a.responsibility_owner.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        ("h1:w2", None, Some("h1:w2"))
    );
    assert_eq!(state(s, "h1:w1").await, "DRAINING");
    assert_eq!(
        state(s, "h1:w2").await,
        "AWAITING_ACK",
        "a handoff grants no READY"
    );
    assert_eq!(
        count(
            &f.db.url,
            &format!(
                "SELECT count(*) FROM leases WHERE assignment_id = '{}' AND released_at IS NULL",
                c.assignment_id
            )
        )
        .await,
        0,
        "the source's leases are revoked and the target has none"
    );
    // Replayed: the same ACK returns the same receipt; another ACK of the used challenge fails.
    assert!(s.accept_handoff(l, &good).await.unwrap().replayed);
    let mut other = good.clone();
    other.ack_digest = d('9');
    assert_eq!(
        category(s.accept_handoff(l, &other).await),
        Category::IdempotencyConflict
    );
    // The prior owner's authority is gone: its progress and lease renewal are refused.
    assert_eq!(
        category(s.record_progress(l, &progress(&source, "late")).await),
        Category::WrongState
    );
    assert_eq!(
        category(s.renew_leases(l, source.chain(), 60_000).await),
        Category::WrongState
    );
    // Only now the target's own activation challenge, ACK and activation.
    let ch = s.issue_activation_challenge(l, &c, 60_000).await.unwrap();
    let mut t = target;
    t.challenge = ch.str("challenge_id").unwrap();
    s.consume_ack(l, &ack(l, &t)).await.unwrap();
    s.activate(l, &activation(s, &t).await).await.unwrap();
    let a = assignment(s, &c.assignment_id).await;
    assert_eq!(
        (
            a.responsibility_owner.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        ("h1:w2", Some("h1:w2"), None)
    );
    assert_eq!(state(s, "h1:w2").await, "RUNNING");
}

/// §17 Stale continuation claimant and Partial-authority continuation, at the store: a
/// delivery under a lapsed or replaced claim is refused; acceptance is once, debits the loop
/// budget once and needs the generation it was bound to; a continuation carries the
/// assignment's own scope and holds (it cannot widen them), and none is created without
/// budget.
#[tokio::test]
async fn a_continuation_is_accepted_once_under_its_current_claim_only() {
    use mosaic::coordinator::continuation::AcceptClaim;
    let (f, admin) = frozen_fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running(s, l, &f.lane.lane_incarnation_id).await;
    let asg = r.chain().assignment_id.clone();
    let created = s
        .create_continuation(l, &asg, "run the integration tests", &uid("rq"), 60_000)
        .await
        .unwrap();
    let cn = created.str("continuation_id").unwrap();
    // One open continuation per assignment, and none for work that does not exist: each
    // refusal names the predicate of the creating CAS that failed.
    let e = s
        .create_continuation(l, &asg, "another", &uid("rq"), 60_000)
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::Conflict), "{e}");
    assert!(e.to_string().contains("open continuation"), "{e}");
    let e = s
        .create_continuation(l, "as-nowhere", "x", &uid("rq"), 60_000)
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::NotFound), "{e}");
    // Partial authority: bound to the assignment's own scope, holds and contract.
    let bound = admin_count(
        &admin,
        &format!(
            "SELECT count(*) FROM continuations c JOIN assignments a USING (assignment_id) JOIN reservations r ON r.reservation_id = c.reservation_id \
             WHERE c.continuation_id = '{cn}' AND c.scope_digest = a.scope_digest AND c.holds_digest = a.holds_digest \
               AND c.contracts_digest = r.contracts_digest"
        ),
    )
    .await;
    assert_eq!(bound, 1);
    let view = |s: &Store| {
        let cn = cn.clone();
        let s = s.clone();
        async move {
            s.open_continuations()
                .await
                .unwrap()
                .into_iter()
                .find(|v| v.continuation_id == cn)
                .unwrap()
        }
    };
    let first = s.claim_continuation(l, &view(s).await).await.unwrap();
    let old_ref = first.str("claim_ref").unwrap();
    // A live claim of this epoch is not reclaimed.
    assert_eq!(
        category(s.claim_continuation(l, &view(s).await).await),
        Category::WrongState
    );
    // Its deadline passes (equality): reclaimed, with a new reference.
    admin
        .batch_execute(&format!("UPDATE continuations SET claim_deadline = (SELECT t FROM frozen.now) WHERE continuation_id = '{cn}'"))
        .await
        .unwrap();
    let second = s.claim_continuation(l, &view(s).await).await.unwrap();
    let new_ref = second.str("claim_ref").unwrap();
    assert_ne!(old_ref, new_ref);
    let claim = |claim_ref: &str| AcceptClaim {
        continuation_id: cn.clone(),
        claim_ref: claim_ref.into(),
        reservation_id: r.chain().reservation_id.clone(),
        lane_incarnation_id: r.chain().lane_incarnation_id.clone(),
        generation: r.generation,
        next_action_digest: mosaic::protocol::work::next_action_digest("run the integration tests"),
    };
    // The stale claimant is refused.
    assert_eq!(
        category(s.accept_continuation(l, &claim(&old_ref)).await),
        Category::Mismatch
    );
    // Another generation, or another next action, is refused.
    let mut other = claim(&new_ref);
    other.generation += 1;
    let e = s.accept_continuation(l, &other).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState));
    assert!(e.to_string().contains("generation is not"), "{e}");
    let mut other = claim(&new_ref);
    other.next_action_digest = d('7');
    let e = s.accept_continuation(l, &other).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState));
    assert!(e.to_string().contains("next_action_digest"), "{e}");
    let mut other = claim(&new_ref);
    other.reservation_id = r.chain().reservation_id.replace("rs-", "rs-0");
    let e = s.accept_continuation(l, &other).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState));
    assert!(e.to_string().contains("reservation_id"), "{e}");
    let budget_q = format!(
        "SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{asg}'"
    );
    assert_eq!(
        admin_count(&admin, &budget_q).await,
        20,
        "a refused acceptance debited the budget"
    );
    let ok = s.accept_continuation(l, &claim(&new_ref)).await.unwrap();
    assert_eq!(ok.body["loop_budget_left"], 19);
    // The same acceptance again is the same step; the budget is debited once.
    assert!(
        s.accept_continuation(l, &claim(&new_ref))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(admin_count(&admin, &budget_q).await, 19);
    // The result comes from the generation that accepted it, once.
    assert_eq!(
        category(
            s.record_continuation_result(
                l,
                &cn,
                &r.chain().lane_incarnation_id,
                r.generation + 1,
                &d('5')
            )
            .await
        ),
        Category::WrongState
    );
    s.record_continuation_result(
        l,
        &cn,
        &r.chain().lane_incarnation_id,
        r.generation,
        &d('5'),
    )
    .await
    .unwrap();
    // No budget, no continuation.
    admin
        .batch_execute(&format!(
            "UPDATE assignments SET continuation_budget = 0 WHERE assignment_id = '{asg}'"
        ))
        .await
        .unwrap();
    assert_eq!(
        category(
            s.create_continuation(l, &asg, "more", &uid("rq"), 60_000)
                .await
        ),
        Category::WrongState
    );
}

/// §17 Lease-transfer race: a handoff's acceptance racing the source's lease renewals. Either
/// order is fine; afterwards the source holds no lease and every renewal after the accept
/// was refused.
#[tokio::test]
async fn a_handoff_racing_lease_renewals_leaves_the_source_no_lease() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let w2 = adopt(s, l, "h1:w2").await;
    let source = running(s, l, &f.lane.lane_incarnation_id).await;
    let (_c, good, _t) = handoff_to_challenge(s, l, &source, &w2.lane_incarnation_id).await;
    let mut tasks = Vec::new();
    for i in 0..12u64 {
        let (s, l, chain) = (s.clone(), l.clone(), source.chain().clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(i)).await;
            s.renew_leases(&l, &chain, 60_000)
                .await
                .map(|r| r.decided_at)
        }));
    }
    let accepted = s.accept_handoff(l, &good).await.unwrap().decided_at;
    for t in tasks {
        match t.await.unwrap() {
            Ok(at) => assert!(
                at < accepted,
                "a renewal decided after the handoff: {at} vs {accepted}"
            ),
            Err(e) => assert_eq!(e.category(), Some(Category::WrongState), "{e}"),
        }
    }
    assert_eq!(
        count(
            &f.db.url,
            &format!(
                "SELECT count(*) FROM leases WHERE reservation_id = '{}' AND released_at IS NULL",
                source.chain().reservation_id
            )
        )
        .await,
        0
    );
}

/// Regressions from the outside review of the handoff: (1) the source's late termination
/// receipt never finalizes work its target now runs; (2) a target lane quarantined under an
/// open offer expires the offer and hands the work back to its source with a fresh
/// inactivity period — the work is never left in `handoff` with no way out.
#[tokio::test]
async fn a_handoff_never_strands_work_or_lets_the_source_finalize_it() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let w2 = adopt(s, l, "h1:w2").await;
    let w3 = adopt(s, l, "h1:w3").await;
    let source = running(s, l, &f.lane.lane_incarnation_id).await;
    let asg = source.chain().assignment_id.clone();
    // (2) An offer to w3, whose lane is then quarantined (its host said so).
    let (_c3, _good3, _t3) = handoff_to_challenge(s, l, &source, &w3.lane_incarnation_id).await;
    let base_before = count(&f.db.url, &format!("SELECT extract(epoch from inactivity_base_at)::bigint FROM assignments WHERE assignment_id = '{asg}'")).await;
    s.quarantine(l, &w3.lane_incarnation_id, "host-side quarantine", true)
        .await
        .unwrap();
    let a = assignment(s, &asg).await;
    assert_eq!(
        (
            a.lifecycle.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        ("ACTIVE", Some("h1:w1"), None),
        "the work went back to its source"
    );
    assert_eq!(
        count(
            &f.db.url,
            &format!(
                "SELECT count(*) FROM handoffs WHERE assignment_id = '{asg}' AND state = 'EXPIRED'"
            )
        )
        .await,
        1
    );
    assert_eq!(count(&f.db.url, &format!("SELECT count(*) FROM assignments WHERE assignment_id = '{asg}' AND work_status = 'active'")).await, 1);
    assert!(
        count(&f.db.url, &format!("SELECT extract(epoch from inactivity_base_at)::bigint FROM assignments WHERE assignment_id = '{asg}'")).await >= base_before,
        "the inactivity period restarted"
    );
    // (1) A new offer to w2, accepted; the target activates; the operator asks to complete.
    let (c2, good2, mut t2) = handoff_to_challenge(s, l, &source, &w2.lane_incarnation_id).await;
    s.accept_handoff(l, &good2).await.unwrap();
    let ch = s.issue_activation_challenge(l, &c2, 60_000).await.unwrap();
    t2.challenge = ch.str("challenge_id").unwrap();
    s.consume_ack(l, &ack(l, &t2)).await.unwrap();
    s.activate(l, &activation(s, &t2).await).await.unwrap();
    s.request_end(l, &asg, Outcome::Completed, Some(&d('e')))
        .await
        .unwrap();
    // The source's receipt arrives late: it ends the source generation, not the work.
    s.ingest_termination(l, HOST, &receipt_for(&source, "quit", true))
        .await
        .unwrap();
    let a = assignment(s, &asg).await;
    assert_eq!(
        (a.lifecycle.as_str(), a.requested_outcome.as_deref()),
        ("ACTIVE", Some("COMPLETED")),
        "the source's end decided the target's work"
    );
    // The target's own receipt makes it final.
    s.ingest_termination(l, HOST, &receipt_for(&t2, "quit", true))
        .await
        .unwrap();
    assert_eq!(assignment(s, &asg).await.lifecycle, "COMPLETED");
}

/// The values a column's `CHECK (col IN (…))` constraint allows, read back from the
/// migrated database (`pg_get_constraintdef`), so a migration that adds or drops a state is
/// seen here whatever file it is in.
async fn check_values(url: &str, table: &str, column: &str) -> std::collections::BTreeSet<String> {
    let rows = sql(url)
        .await
        .query(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::text::regclass AND contype = 'c'",
            &[&table],
        )
        .await
        .unwrap();
    // The one constraint that is exactly "CHECK ((col = ANY (ARRAY['A'::text, …])))".
    let prefix = format!("CHECK (({column} = ANY (ARRAY[");
    let defs: Vec<String> = rows
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|d| d.starts_with(&prefix))
        .collect();
    assert_eq!(defs.len(), 1, "{table}.{column}: constraints {defs:?}");
    defs[0]
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

/// Every state enum is the whole of its column's CHECK list, no more and no less: a state
/// added to the schema without the enum (or the other way round) fails here, by name.
#[tokio::test]
async fn every_state_enum_matches_its_column_constraint() {
    use mosaic::coordinator::states::*;
    use std::collections::BTreeSet;
    fn names(all: &[impl Copy + Into<&'static str>]) -> BTreeSet<String> {
        all.iter().map(|s| (*s).into().to_string()).collect()
    }
    let f = fx().await;
    let url = pg::server().url(&f.db.name);
    let cases = [
        ("lane_incarnations", "state", names(LaneState::ALL)),
        ("assignments", "lifecycle", names(Lifecycle::ALL)),
        ("generations", "state", names(GenState::ALL)),
        ("handoffs", "state", names(HandoffState::ALL)),
        ("continuations", "state", names(ContinuationState::ALL)),
        ("assignments", "work_status", names(WorkStatus::ALL)),
        ("assignments", "watchdog_step", names(WatchdogStep::ALL)),
    ];
    for (table, column, enum_values) in cases {
        let db_values = check_values(&url, table, column).await;
        assert_eq!(db_values, enum_values, "{table}.{column}: schema vs enum");
    }
}

/// A state the binary does not know fails at decode, naming the column, instead of being
/// carried on as text or panicking.
#[tokio::test]
async fn an_unknown_lane_state_fails_at_decode_with_the_column_name() {
    use mosaic::coordinator::rows::RowExt;
    use mosaic::coordinator::states::LaneState;
    let f = fx().await;
    let c = sql(&pg::server().url(&f.db.name)).await;
    let row = c
        .query_one(
            "SELECT 'RUNNING'::text AS lane_state, 'SLEEPING'::text AS other",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.col::<LaneState>("lane_state").unwrap(),
        LaneState::Running
    );
    let e = row.col::<LaneState>("other").unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("other") && text.contains("SLEEPING"),
        "{text}"
    );
    assert_eq!(e.operator_category(), Category::Internal);
    let e = row.col::<LaneState>("missing").unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

/// A decision the database derives by itself (a trigger) leaves an audit row an operator
/// sees, in the same commit as the change that caused it: here the work record's status
/// derived from a final lifecycle.
#[tokio::test]
async fn a_trigger_derived_decision_is_audited_with_its_cause() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r = running(s, l, &inc).await;
    let id = r.chain().assignment_id.clone();
    let derived = || async {
        s.audit_log(0)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.operation == "derived" && a.assignment_id.as_deref() == Some(id.as_str()))
            .collect::<Vec<_>>()
    };
    assert!(derived().await.is_empty(), "nothing derived yet");
    s.request_end(l, &id, Outcome::Cancelled, None)
        .await
        .unwrap();
    s.ingest_termination(l, HOST, &receipt_for(&r, "quit", true))
        .await
        .unwrap();
    assert_eq!(assignment(s, &id).await.lifecycle, "CANCELLED");
    let rows = derived().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].category, "work-record");
    assert!(
        rows[0].detail.contains("active -> done") && rows[0].detail.contains("CANCELLED"),
        "{}",
        rows[0].detail
    );
    assert_eq!(rows[0].coordinator_epoch, Some(l.epoch()));
}

/// A chain step's refusal names the first of its expected values that does not hold, from
/// the same predicate table its compare-and-swap is built from: every substituted chain
/// field, a step out of order, and nothing changed by any of them.
#[tokio::test]
async fn a_refused_chain_step_names_the_predicate_that_failed() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let res = s.reserve(l, &request(&inc, None, 60_000)).await.unwrap();
    let good = res.chain.clone();
    type Sub = (&'static str, fn(&mut Chain), Category);
    let rows: Vec<Sub> = vec![
        (
            "lane incarnation",
            |c| c.lane_incarnation_id = "li-other".into(),
            Category::NotFound,
        ),
        (
            "lane id",
            |c| c.lane_id = "h1:w9".into(),
            Category::Mismatch,
        ),
        (
            "reservation",
            |c| c.reservation_id = "rs-other".into(),
            Category::NotFound,
        ),
        (
            "reservation epoch",
            |c| c.reservation_epoch += 1,
            Category::Mismatch,
        ),
        (
            "assignment",
            |c| c.assignment_id = "as-other".into(),
            Category::Mismatch,
        ),
        (
            "attempt",
            |c| c.assignment_attempt_id = "at-other".into(),
            Category::Mismatch,
        ),
    ];
    let before = authority_counts(&f.db.url).await;
    for (what, sub, want) in rows {
        let mut c = good.clone();
        sub(&mut c);
        assert_eq!(
            category(s.checkpoint(l, &c).await),
            want,
            "substituted {what}"
        );
    }
    // Out of order: fencing a chain that is still RESERVED.
    assert_eq!(category(s.fence(l, &good).await), Category::WrongState);
    assert_eq!(
        authority_counts(&f.db.url).await,
        before,
        "a refused step changed something"
    );
    assert_eq!(state(s, "h1:w1").await, "RESERVED");
    // The good chain goes on.
    s.checkpoint(l, &good).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "CHECKPOINTING");
}
