//! The store-level fixture: a coordinator `Store` on a database of the test binary's
//! PostgreSQL server, leading, with one adopted lane, and the helpers that drive a chain to
//! each of its states.

#![allow(dead_code, unused_imports)]

use crate::pg;
pub use crate::pg::TestDb;
pub use mosaic::coordinator::{
    AckClaim, Activation, AssignmentView, AuthorityError, Candidate, Category, Chain,
    CoordinatorSecret, EndCause, LaneView, Leader, Outcome, Reconciliation, ReserveRequest,
    Reserved, Store,
};
pub use mosaic::protocol::task;
pub use serde_json::json;

pub fn d(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

pub fn candidate(name: &str) -> Candidate {
    Candidate {
        holder: format!("coordinator:{name}"),
        credential_digest: d('c'),
        launch_id: format!("launch-{}", uuid::Uuid::new_v4().simple()),
    }
}

pub fn uid(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

pub const TARGET: &str = "h1:w1";
pub const HOST: &str = "h1";
pub const SCOPE: [&str; 2] = ["repo:demo", "issues:demo"];
pub const HOLDS: [&str; 1] = ["issues:demo"];

pub struct Fx {
    pub db: TestDb,
    pub store: Store,
    pub secret: CoordinatorSecret,
    pub leader: Leader,
    pub lane: LaneView,
}

pub async fn fx_at(url_of: impl Fn(&str) -> String) -> Fx {
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

pub async fn fx() -> Fx {
    fx_at(|name| pg::server().url(name)).await
}

pub async fn adopt(s: &Store, l: &Leader, lane: &str) -> LaneView {
    s.adopt_lane_incarnation(l, HOST, lane, &uid("li"))
        .await
        .unwrap()
}

pub fn identity(pid: i64) -> serde_json::Value {
    json!({ "boot_id": "b-1", "cgroup_id": 158, "cgroup_path": "/mosaic/lanes/w1/gen", "exe_dev": 1, "exe_ino": 2,
            "launch_nonce_digest": "ab".repeat(32), "root_pid": pid, "root_start_time": 1000 + pid })
}

pub fn request(inc: &str, resume: Option<&str>, ttl_ms: i64) -> ReserveRequest {
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
        repository: None,
        grant: None,
        placement: None,
        recovery: None,
    }
}

pub fn scope_digest() -> String {
    task::list_digest(
        "scope",
        &SCOPE.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )
}
pub fn holds_digest() -> String {
    task::list_digest(
        "holds",
        &HOLDS.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )
}

/// A chain driven to AWAITING_ACK, with everything needed to ACK and activate it.
pub struct Ready {
    pub res: Reserved,
    pub generation: i64,
    pub identity: serde_json::Value,
    pub contracts: String,
    pub challenge: String,
    pub scope_digest: String,
    pub holds_digest: String,
}

impl Ready {
    pub fn chain(&self) -> &Chain {
        &self.res.chain
    }
}

pub async fn to_awaiting_ack(
    s: &Store,
    l: &Leader,
    inc: &str,
    resume: Option<&str>,
    ttl_ms: i64,
) -> Ready {
    to_awaiting_ack_scoped(s, l, inc, resume, ttl_ms, &SCOPE, &HOLDS).await
}

/// As `to_awaiting_ack`, for a task with this scope and these holds.
pub async fn to_awaiting_ack_scoped(
    s: &Store,
    l: &Leader,
    inc: &str,
    resume: Option<&str>,
    ttl_ms: i64,
    scope: &[&str],
    holds: &[&str],
) -> Ready {
    let mut req = request(inc, resume, ttl_ms);
    req.scope = scope.iter().map(|x| x.to_string()).collect();
    req.holds = holds.iter().map(|x| x.to_string()).collect();
    let (scope_digest, holds_digest) = (
        task::list_digest("scope", &req.scope),
        task::list_digest("holds", &req.holds),
    );
    let res = s.reserve(l, &req).await.unwrap();
    let c = res.chain.clone();
    s.checkpoint(l, &c).await.unwrap();
    s.fence(l, &c).await.unwrap();
    let (generation, _) = s.stage(l, &c).await.unwrap();
    let identity = identity(4000 + generation);
    let staged = s
        .record_staged(l, &c, generation, &identity, None)
        .await
        .unwrap();
    let contracts = staged.str("contracts_digest").unwrap();
    assert_eq!(
        contracts,
        mosaic::protocol::contracts_digest("spawn=3 print=hello", &scope_digest, &holds_digest),
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
        scope_digest,
        holds_digest,
    }
}

pub fn ack(l: &Leader, r: &Ready) -> AckClaim {
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
        scope_digest: r.scope_digest.clone(),
        holds_digest: r.holds_digest.clone(),
        runtime_id: "fake@1.0.0".into(),
        ack_digest: d('a'),
    }
}

/// The activation the chain's own rows call for (fence token re-derived from the secret).
pub async fn activation(s: &Store, r: &Ready) -> Activation {
    let row = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    Activation::of(s, &row, 60_000).expect("a READY chain with its consumed ACK")
}

pub fn category<T: std::fmt::Debug>(r: Result<T, AuthorityError>) -> Category {
    match r {
        Err(e) => e
            .category()
            .unwrap_or_else(|| panic!("not a rejection: {e}")),
        Ok(v) => panic!("expected a rejection, got {v:?}"),
    }
}

pub async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

pub async fn count(url: &str, q: &str) -> i64 {
    sql(url).await.query_one(q, &[]).await.unwrap().get(0)
}

/// Row counts of every authority table: "nothing changed" is this before == after.
pub async fn authority_counts(url: &str) -> Vec<(String, i64)> {
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

pub async fn state(s: &Store, lane: &str) -> String {
    s.lane(lane).await.unwrap().unwrap().state.to_string()
}

pub async fn assignment(s: &Store, id: &str) -> AssignmentView {
    s.assignment(id).await.unwrap().unwrap()
}

pub async fn audited(s: &Store, op: &str, category: &str) -> usize {
    s.audit_log(0)
        .await
        .unwrap()
        .iter()
        .filter(|a| a.operation == op && a.category == category)
        .count()
}

/// A host receipt for `r`'s generation, keyed as the supervisor keys it.
pub fn receipt_for(r: &Ready, reason: &str, verified: bool) -> serde_json::Value {
    let c = r.chain();
    json!({ "idempotency_key": mosaic::supervisor::receipt::idempotency_key(&c.lane_id, &c.lane_incarnation_id, r.generation as u64),
            "host_id": HOST, "lane_id": c.lane_id, "lane_incarnation_id": c.lane_incarnation_id,
            "generation": r.generation, "termination_reason": reason, "observation_source": "shim",
            "cleanup": { "verified_empty": verified, "cgroup_removed": verified } })
}

pub async fn running(s: &Store, l: &Leader, inc: &str) -> Ready {
    let r = to_awaiting_ack(s, l, inc, None, 60_000).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    s.activate(l, &activation(s, &r).await).await.unwrap();
    r
}

/// A RUNNING chain whose task has this scope and these holds.
pub async fn running_scoped(
    s: &Store,
    l: &Leader,
    inc: &str,
    resume: Option<&str>,
    scope: &[&str],
    holds: &[&str],
) -> Ready {
    let r = to_awaiting_ack_scoped(s, l, inc, resume, 60_000, scope, holds).await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    s.activate(l, &activation(s, &r).await).await.unwrap();
    r
}

/// A store whose database clock is frozen at a settable instant, so deadline equality can
/// be hit exactly by the schema's own predicates (not by a query of the test's).
pub async fn frozen_fx() -> (Fx, tokio_postgres::Client) {
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

pub fn progress(r: &Ready, evidence: &str) -> mosaic::coordinator::continuity::ProgressClaim {
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

pub async fn admin_count(admin: &tokio_postgres::Client, q: &str) -> i64 {
    admin.query_one(q, &[]).await.unwrap().get(0)
}

/// A handoff offered from RUNNING work on w1 to w2, its target chain driven to its handoff
/// challenge; returns the offer's target chain and the ACK that would be accepted.
pub async fn handoff_to_challenge(
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
    let staged = s.record_staged(l, &c, generation, &id, None).await.unwrap();
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
        // Before the transfer both owners are the source's lane; the target is pending.
        responsibility_owner: source.chain().lane_id.clone(),
        execution_owner: source.chain().lane_id.clone(),
        pending_target: c.lane_id.clone(),
        next_action_digest: h.next_action_digest.clone(),
        scope_digest: source.scope_digest.clone(),
        holds_digest: source.holds_digest.clone(),
        contracts_digest: contracts.clone(),
        lane_incarnation_id: c.lane_incarnation_id.clone(),
        generation,
        challenge_deadline: h.challenge_deadline.clone().unwrap(),
        checkpoint_digest: h.checkpoint_digest.clone(),
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
        scope_digest: source.scope_digest.clone(),
        holds_digest: source.holds_digest.clone(),
    };
    (c, claim, target)
}

/// The values a column's `CHECK (col IN (…))` constraint allows, read back from the
/// migrated database (`pg_get_constraintdef`), so a migration that adds or drops a state is
/// seen here whatever file it is in.
pub async fn check_values(
    url: &str,
    table: &str,
    column: &str,
) -> std::collections::BTreeSet<String> {
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
