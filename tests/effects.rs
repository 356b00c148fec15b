//! Effect claims (spec §5.5): every protected effect is admitted by one fenced
//! compare-and-swap in PostgreSQL before its broker dispatches it, and settled after — at
//! the store (the CAS and its refusals, idempotency, settlement at a generation's end).

mod common;
mod pg;
mod store;
mod world;

use std::path::{Path, PathBuf};

use common::{cgroup_at, wait_until, Kept, Model};
use mosaic::coordinator::effects::{EffectClaim, Observed};
use mosaic::coordinator::service::OperatorRequest;
use mosaic::coordinator::states::ClaimState;
use mosaic::protocol::effects::{self, Executor, Outcome, Target};
use serde_json::Value;
use store::*;
use world::{Spec, World};

/// The scope every test task here has: model calls, one host on the web ports, one
/// withheld by a hold.
const EFFECT_SCOPE: [&str; 4] = [
    "provider",
    "egress:pypi.org",
    "egress:files.example:443",
    "lane:h1:w1",
];
const EFFECT_HOLDS: [&str; 1] = ["egress:files.example:443"];

async fn running_with_effects(f: &Fx) -> Ready {
    running_scoped(
        &f.store,
        &f.leader,
        &f.lane.lane_incarnation_id,
        None,
        &EFFECT_SCOPE,
        &EFFECT_HOLDS,
    )
    .await
}

/// A claim of `r`'s generation, as its host's broker would present it.
fn claim(r: &Ready, executor: Executor, target: &str, key: &str, op: &str) -> EffectClaim {
    let target = Target::parse(executor, target).unwrap();
    EffectClaim {
        chain: r.chain().clone(),
        generation: r.generation,
        operation_digest: effects::operation_digest(&target, &[op.as_bytes()]),
        target,
        idempotency_key: key.into(),
        responsibility_owner: TARGET.into(),
        execution_owner: TARGET.into(),
        process_identity: r.identity.clone(),
        fence_reference: "fp1:reference".into(),
        scope_digest: r.scope_digest.clone(),
        holds_digest: r.holds_digest.clone(),
    }
}

fn provider(r: &Ready, key: &str) -> EffectClaim {
    claim(r, Executor::Provider, "provider", key, "POST /v1/messages")
}

/// Row counts of the authority tables and the claims: "nothing changed".
async fn counts(url: &str) -> Vec<(String, i64)> {
    let mut v = authority_counts(url).await;
    v.push((
        "effect_claims".into(),
        count(url, "SELECT count(*) FROM effect_claims").await,
    ));
    v
}

async fn claim_state(url: &str, effect_id: &str) -> String {
    sql(url)
        .await
        .query_one(
            "SELECT state FROM effect_claims WHERE effect_id = $1",
            &[&effect_id],
        )
        .await
        .unwrap()
        .get(0)
}

fn refused<T: std::fmt::Debug>(r: Result<T, AuthorityError>, cat: Category, says: &str) {
    match r {
        Err(e) => {
            assert_eq!(e.category(), Some(cat), "{e}");
            assert!(e.to_string().contains(says), "{says:?} not in: {e}");
        }
        Ok(v) => panic!("admitted, expected {cat:?} ({says}): {v:?}"),
    }
}

/// The claim CAS admits only what every expected value allows; each refusal names the
/// predicate that failed and changes nothing. The admitted claim binds the whole authority
/// it was admitted under.
#[tokio::test]
async fn a_claim_is_admitted_only_for_the_running_generation_under_a_lease_that_licenses_it() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running_with_effects(&f).await;
    let before = counts(&f.db.url).await;
    type Bend = fn(&mut EffectClaim);
    let cases: Vec<(&str, Bend, Category, &str)> = vec![
        (
            "not in the scope",
            |c| c.target = Target::parse(Executor::Egress, "egress:evil.example:443").unwrap(),
            Category::OutOfScope,
            "does not license",
        ),
        (
            "withheld by a hold",
            |c| c.target = Target::parse(Executor::Egress, "egress:files.example:443").unwrap(),
            Category::OutOfScope,
            "does not license",
        ),
        (
            "a port its host entry does not cover",
            |c| c.target = Target::parse(Executor::Egress, "egress:pypi.org:22").unwrap(),
            Category::OutOfScope,
            "does not license",
        ),
        (
            "another generation",
            |c| c.generation += 1,
            Category::Mismatch,
            "generation is not the chain's",
        ),
        (
            "another process",
            |c| c.process_identity["root_pid"] = serde_json::json!(1),
            Category::Mismatch,
            "process identity",
        ),
        (
            "another execution owner",
            |c| c.execution_owner = "h1:w2".into(),
            Category::WrongState,
            "owner is not the work's",
        ),
        (
            "another responsibility owner",
            |c| c.responsibility_owner = "h1:w2".into(),
            Category::WrongState,
            "owner is not the work's",
        ),
        (
            "another scope digest",
            |c| c.scope_digest = d('9'),
            Category::Mismatch,
            "scope or holds digest",
        ),
        (
            "a malformed key",
            |c| c.idempotency_key = "two words".into(),
            Category::BadInput,
            "idempotency key",
        ),
    ];
    for (what, bend, cat, says) in cases {
        let mut c = provider(&r, &uid("k"));
        bend(&mut c);
        let got = s.admit_effect(l, &c).await;
        assert!(got.is_err(), "{what}: admitted");
        refused(got, cat, says);
    }
    assert_eq!(
        counts(&f.db.url).await,
        before,
        "a refusal changed something"
    );
    assert!(audited(s, "admit-effect", "out-of-scope").await >= 3);

    // Admitted: the lease that licenses it, the whole binding in the row.
    let web = claim(
        &r,
        Executor::Egress,
        "egress:pypi.org:443",
        "k-web",
        "CONNECT",
    );
    let a = s.admit_effect(l, &web).await.unwrap();
    assert_eq!(a.state, ClaimState::Admitted);
    assert!(!a.replayed);
    assert_eq!(
        a.effect_id,
        effects::effect_id(&r.chain().assignment_id, "k-web")
    );
    let row = sql(&f.db.url)
        .await
        .query_one(
            "SELECT e.lease_id, e.lease_epoch, e.execution_owner, e.responsibility_owner, e.sink_class, e.coordinator_epoch, \
                    e.sot_incarnation, e.generation, e.scope_digest, s.scope, e.fence_reference \
             FROM effect_claims e JOIN leases s USING (lease_id) WHERE e.effect_id = $1",
            &[&a.effect_id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>("lease_id"), a.lease_id);
    assert_eq!(row.get::<_, String>("scope"), "egress:pypi.org");
    assert_eq!(
        row.get::<_, String>("sink_class"),
        "non-retryable-on-ambiguity"
    );
    assert_eq!(row.get::<_, String>("execution_owner"), TARGET);
    assert_eq!(row.get::<_, String>("responsibility_owner"), TARGET);
    assert_eq!(row.get::<_, i64>("coordinator_epoch"), l.epoch());
    assert_eq!(row.get::<_, String>("sot_incarnation"), l.sot());
    assert_eq!(row.get::<_, i64>("generation"), r.generation);
    assert_eq!(row.get::<_, String>("scope_digest"), r.scope_digest);
    assert_eq!(row.get::<_, String>("fence_reference"), "fp1:reference");
    // Its binding cannot change, and it cannot be deleted.
    let c = sql(&f.db.url).await;
    for stmt in [
        "UPDATE effect_claims SET target = 'egress:x:1' WHERE effect_id = $1",
        "UPDATE effect_claims SET state = 'ADMITTED' WHERE effect_id = $1",
        "DELETE FROM effect_claims WHERE effect_id = $1",
    ] {
        let e = c.execute(stmt, &[&a.effect_id]).await.unwrap_err();
        let msg = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(msg.starts_with("mosaic: "), "{stmt}: {e:?}");
    }
}

/// A work with no execution owner admits nothing: before activation (staging), and a
/// chain of another leader's epoch is refused as stale.
#[tokio::test]
async fn staging_and_a_stale_leader_admit_nothing() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack_scoped(
        s,
        l,
        &f.lane.lane_incarnation_id,
        None,
        60_000,
        &EFFECT_SCOPE,
        &EFFECT_HOLDS,
    )
    .await;
    refused(
        s.admit_effect(l, &provider(&r, "k1")).await,
        Category::WrongState,
        "no execution owner",
    );
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    refused(
        s.admit_effect(l, &provider(&r, "k1")).await,
        Category::WrongState,
        "no execution owner",
    );
    s.activate(l, &activation(s, &r).await).await.unwrap();
    s.admit_effect(l, &provider(&r, "k1")).await.unwrap();
    // A takeover: the old leader's claim is refused, the new one's admitted.
    s.release(l).await.unwrap();
    let (l2, _) = s.acquire(&candidate("b"), 60_000).await.unwrap();
    refused(
        s.admit_effect(l, &provider(&r, "k2")).await,
        Category::StaleLeader,
        "not the current unexpired leadership",
    );
    let a = s.admit_effect(&l2, &provider(&r, "k2")).await.unwrap();
    assert_eq!(a.state, ClaimState::Admitted);
}

/// The same key with the same operation is the same claim (its current state the answer,
/// nothing dispatched twice); the same key with another operation is refused, and the lane
/// of the generation that tried is quarantined.
#[tokio::test]
async fn an_idempotency_key_is_bound_to_its_operation_for_good() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running_with_effects(&f).await;
    let push = |op: &str| claim(&r, Executor::Egress, "egress:pypi.org:443", "push-once", op);
    let first = s.admit_effect(l, &push("update a")).await.unwrap();
    let again = s.admit_effect(l, &push("update a")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.effect_id, first.effect_id);
    assert_eq!(again.state, ClaimState::Admitted);
    let observed = Observed {
        effect_id: first.effect_id.clone(),
        outcome: Outcome::Completed,
        result_digest: d('7'),
        input_tokens: None,
        output_tokens: None,
    };
    s.record_effect_result(l, r.chain(), r.generation, &observed)
        .await
        .unwrap();
    // The same result again is the same step; another result for the claim is refused.
    assert!(
        s.record_effect_result(l, r.chain(), r.generation, &observed)
            .await
            .unwrap()
            .replayed
    );
    let mut other = observed.clone();
    other.outcome = Outcome::Failed;
    refused(
        s.record_effect_result(l, r.chain(), r.generation, &other)
            .await,
        Category::IdempotencyConflict,
        "different request",
    );
    let settled = s.admit_effect(l, &push("update a")).await.unwrap();
    assert_eq!(
        (settled.state, settled.result_digest.as_deref()),
        (ClaimState::Completed, Some(d('7').as_str())),
        "a repeat learns what became of the claim"
    );
    let before = counts(&f.db.url).await;
    refused(
        s.admit_effect(l, &push("update b")).await,
        Category::IdempotencyConflict,
        "different request",
    );
    assert_eq!(counts(&f.db.url).await, before);
    s.quarantine_for_substitution(
        l,
        r.chain(),
        "push-once",
        &push("update b").operation_digest,
    )
    .await
    .unwrap();
    assert_eq!(state(s, TARGET).await, "QUARANTINED");
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        a.lifecycle,
        mosaic::coordinator::states::Lifecycle::Recovery,
        "{a:?}"
    );
    refused(
        s.admit_effect(l, &provider(&r, "after")).await,
        Category::WrongState,
        "",
    );
}

/// A fence closes admission at once: a requested end (stop), an open handoff offer, and an
/// expired lease each refuse the next claim.
#[tokio::test]
async fn every_fence_closes_admission() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    // An end requested.
    let r = running_with_effects(&f).await;
    s.admit_effect(l, &provider(&r, "a")).await.unwrap();
    s.request_end(l, &r.chain().assignment_id, store::Outcome::Cancelled, None)
        .await
        .unwrap();
    refused(
        s.admit_effect(l, &provider(&r, "b")).await,
        Category::WrongState,
        "admission is closed",
    );

    // A handoff offered: the source keeps running, but admits nothing more.
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let target = adopt(s, l, "h1:w2").await;
    let r = running_scoped(
        s,
        l,
        &f.lane.lane_incarnation_id,
        None,
        &EFFECT_SCOPE,
        &EFFECT_HOLDS,
    )
    .await;
    handoff_to_challenge(s, l, &r, &target.lane_incarnation_id).await;
    refused(
        s.admit_effect(l, &provider(&r, "c")).await,
        Category::WrongState,
        "handoff of the work is pending",
    );

    // A lease that ran out (database time): refused as expired, before any watchdog acted.
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = to_awaiting_ack_scoped(
        s,
        l,
        &f.lane.lane_incarnation_id,
        None,
        60_000,
        &EFFECT_SCOPE,
        &EFFECT_HOLDS,
    )
    .await;
    s.consume_ack(l, &ack(l, &r)).await.unwrap();
    let row = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    let short = Activation::of(s, &row, 1000).unwrap();
    s.activate(l, &short).await.unwrap();
    s.admit_effect(l, &provider(&r, "d")).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    refused(
        s.admit_effect(l, &provider(&r, "e")).await,
        Category::Expired,
        "expired",
    );
}

/// An ended generation's claims are settled with its receipt: by what the receipt says the
/// broker observed, then by rule — a provider call reconciled, an egress connection left
/// unknown for the operator. An unknown outcome keeps the work from any outcome but
/// QUARANTINED and from any later activation until it is resolved.
#[tokio::test]
async fn an_ended_generations_claims_are_settled_by_what_was_observed_then_by_rule() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running_with_effects(&f).await;
    let observed = s.admit_effect(l, &provider(&r, "seen")).await.unwrap();
    let model = s.admit_effect(l, &provider(&r, "unseen")).await.unwrap();
    let web = s
        .admit_effect(
            l,
            &claim(
                &r,
                Executor::Egress,
                "egress:pypi.org:443",
                "conn",
                "CONNECT",
            ),
        )
        .await
        .unwrap();
    s.request_end(l, &r.chain().assignment_id, store::Outcome::Cancelled, None)
        .await
        .unwrap();
    let mut receipt = receipt_for(&r, "stopped", true);
    receipt["effects"] = serde_json::json!([
        { "effect_id": observed.effect_id, "outcome": "completed", "result_digest": d('5'),
          "input_tokens": 120, "output_tokens": 40 },
        // Not the shape of an observation: counts as unobserved.
        { "effect_id": web.effect_id, "outcome": "maybe", "result_digest": d('6') },
    ]);
    let (_, rc) = s.ingest_termination(l, HOST, &receipt).await.unwrap();
    assert_eq!(
        rc.body["effects"],
        serde_json::json!({"observed": 1, "reconciled": 1, "unknown": 1}),
        "{}",
        rc.body
    );
    let url = &f.db.url;
    assert_eq!(claim_state(url, &observed.effect_id).await, "COMPLETED");
    assert_eq!(claim_state(url, &model.effect_id).await, "RECONCILED");
    assert_eq!(claim_state(url, &web.effect_id).await, "UNKNOWN");
    let usage = s.effect_usage().await.unwrap();
    assert_eq!(
        (
            usage[0].input_tokens,
            usage[0].output_tokens,
            usage[0].unknown
        ),
        (120, 40, 1)
    );
    // The requested CANCELLED is not given while an effect's outcome is unknown.
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(a.lifecycle.as_str(), "QUARANTINED", "{a:?}");
    assert!(a.next_action.contains("mosaic effect resolve"), "{a:?}");

    // A resumed chain of the same work cannot activate while it is unknown.
    let f2 = fx().await;
    let (s, l) = (&f2.store, &f2.leader);
    let r = running_with_effects(&f2).await;
    let web = s
        .admit_effect(
            l,
            &claim(
                &r,
                Executor::Egress,
                "egress:pypi.org:443",
                "conn",
                "CONNECT",
            ),
        )
        .await
        .unwrap();
    // The generation dies on its own: recovery, the claim unknown.
    s.ingest_termination(l, HOST, &receipt_for(&r, "crash", true))
        .await
        .unwrap();
    assert_eq!(claim_state(&f2.db.url, &web.effect_id).await, "UNKNOWN");
    s.finish(l, &f2.lane.lane_incarnation_id).await.ok();
    let asg = r.chain().assignment_id.clone();
    let r2 = to_awaiting_ack_scoped(
        s,
        l,
        &f2.lane.lane_incarnation_id,
        Some(&asg),
        60_000,
        &EFFECT_SCOPE,
        &EFFECT_HOLDS,
    )
    .await;
    s.consume_ack(l, &ack(l, &r2)).await.unwrap();
    refused(
        s.activate(l, &activation(s, &r2).await).await,
        Category::Unreconciled,
        "not settled",
    );
    // Its owner resolves it (the evidence: what the sink shows), then it activates.
    refused(
        s.resolve_effect(l, &web.effect_id, true, "not a digest", "rq-1")
            .await,
        Category::BadInput,
        "digest",
    );
    s.resolve_effect(l, &web.effect_id, true, &d('4'), "rq-1")
        .await
        .unwrap();
    assert_eq!(claim_state(&f2.db.url, &web.effect_id).await, "RECONCILED");
    refused(
        s.resolve_effect(l, &web.effect_id, false, &d('4'), "rq-2")
            .await,
        Category::WrongState,
        "only a claim whose outcome is unknown",
    );
    s.activate(l, &activation(s, &r2).await).await.unwrap();
    // A late observation of an unknown claim reconciles it.
    let c3 = s
        .admit_effect(
            l,
            &claim(
                &r2,
                Executor::Egress,
                "egress:pypi.org:443",
                "late",
                "CONNECT",
            ),
        )
        .await
        .unwrap();
    s.ingest_termination(l, HOST, &receipt_for(&r2, "crash", true))
        .await
        .unwrap();
    assert_eq!(claim_state(&f2.db.url, &c3.effect_id).await, "UNKNOWN");
    s.record_effect_result(
        l,
        r2.chain(),
        r2.generation,
        &Observed {
            effect_id: c3.effect_id.clone(),
            outcome: Outcome::Completed,
            result_digest: d('3'),
            input_tokens: None,
            output_tokens: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(claim_state(&f2.db.url, &c3.effect_id).await, "RECONCILED");
}

// ---- The daemons: a real generation's effects through its broker ----------------------

/// A file removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A world whose `fake` runtime has the test model as its provider, with a key in its
/// credentials file.
fn provider_world(model: &Model, token: &str, lanes: usize) -> (World, Scratch) {
    let creds = Scratch(std::env::temp_dir().join(format!(
        "mosaic-creds-{}.env",
        uuid::Uuid::new_v4().simple()
    )));
    std::fs::write(&creds.0, format!("FAKE_PROVIDER_KEY={token}\n")).unwrap();
    std::fs::set_permissions(
        &creds.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let w = World::started(Spec {
        lanes,
        tag: "effects",
        supervisor_extra: format!(
            "[providers]\nfake = \"http://127.0.0.1:{}\"\n[credentials]\nfake = {:?}\n",
            model.port, creds.0
        ),
        ..Spec::default()
    });
    (w, creds)
}

/// An assign of the fake harness with an explicit scope.
fn assign_scoped(w: &World, lane: &str, task: &str, scope: &[String], wait: bool) -> Value {
    let mut r = world::assign_request(lane, task, None, wait);
    if let OperatorRequest::Assign { scope: s, .. } = &mut r {
        *s = scope.to_vec();
    }
    w.op(&r).unwrap_or_else(|e| panic!("assign: {e:?}"))
}

/// The fake harness's `$HOME` of the generation an assign answered with.
fn home(w: &World, a: &Value) -> PathBuf {
    w.area(
        0,
        a["lane_incarnation_id"].as_str().unwrap(),
        a["generation"].as_u64().unwrap(),
    )
    .join("home")
}

/// The attempts recorded in `file` once all were made: (what, allowed, what was said).
fn outcomes(file: &Path) -> Vec<(String, bool, String)> {
    let text = wait_until("the attacker's outcomes", || {
        std::fs::read_to_string(file)
            .ok()
            .filter(|t| t.contains("attacks done"))
    });
    parse(&text)
}

/// `attack WHAT allowed` / `attack WHAT denied: …` lines.
fn parse(text: &str) -> Vec<(String, bool, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("attack "))
        .map(|l| {
            let (what, rest) = l.split_once(' ').unwrap();
            (what.to_string(), rest == "allowed", rest.to_string())
        })
        .collect()
}

/// Every claim of `assignment`: (executor, target, state, input tokens, output tokens).
async fn claims_of(
    w: &World,
    assignment: &str,
) -> Vec<(String, String, String, Option<i64>, Option<i64>)> {
    w.sql()
        .await
        .query(
            "SELECT executor, target, state, input_tokens, output_tokens FROM effect_claims \
             WHERE assignment_id = $1 ORDER BY admitted_at",
            &[&assignment],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

fn posts(model: &Model) -> Vec<Value> {
    model
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "POST")
        .collect()
}

/// A RUNNING generation's provider request is one claim, admitted before it is sent and
/// settled with the usage the answer reported; before activation its model requests are
/// answered by the gateway itself, and nothing reaches the provider.
#[tokio::test(flavor = "multi_thread")]
async fn provider_calls_are_claims_admitted_before_dispatch_and_staging_reaches_no_provider() {
    let model = Model::start();
    let token = format!("mosaic-secret-{}", uuid::Uuid::new_v4().simple());
    let (w, _creds) = provider_world(&model, &token, 1);
    let lane = w.lane_of(0, "lane-1");
    let a = tokio::task::block_in_place(|| {
        w.assign_to(
            &lane,
            "staging-attack=provider:FAKE_PROVIDER_KEY attack=provider:FAKE_PROVIDER_KEY hang",
            true,
        )
        .unwrap()
    });
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let home = home(&w, &a);
    let staged = tokio::task::block_in_place(|| outcomes(&home.join("staging-attacks")));
    let active = tokio::task::block_in_place(|| outcomes(&home.join("attacks")));
    assert!(
        staged[0].1,
        "the gateway answers before activation: {staged:?}"
    );
    assert!(active[0].1, "the provider answers once active: {active:?}");
    // Only the active generation's request reached the provider, with the real key.
    let sent = posts(&model);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0]["headers"]["authorization"],
        format!("Bearer {token}")
    );
    // It is one claim, completed, with the usage the answer itself reported.
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(home.join("provider-answer")).unwrap())
            .unwrap();
    w.wait_count(
        &format!("SELECT count(*) FROM effect_claims WHERE assignment_id = '{asg}' AND state = 'COMPLETED'"),
        |n| n == 1,
        "the provider call's claim settled",
    )
    .await;
    let claims = claims_of(&w, &asg).await;
    assert_eq!(claims.len(), 1, "{claims:?}");
    let (executor, target, state, input, output) = &claims[0];
    assert_eq!(
        (executor.as_str(), target.as_str(), state.as_str()),
        ("provider", "provider", "COMPLETED")
    );
    assert_eq!(*input, answer["usage"]["prompt_tokens"].as_i64());
    assert_eq!(*output, answer["usage"]["completion_tokens"].as_i64());
    // Stopped: every claim settled, nothing left open.
    tokio::task::block_in_place(|| {
        w.op(&OperatorRequest::Stop {
            assignment_id: asg.clone(),
            outcome: None,
            evidence_digest: None,
            wait: true,
            request_id: None,
        })
        .unwrap()
    });
    assert_eq!(
        w.count(&format!("SELECT count(*) FROM effect_claims WHERE assignment_id = '{asg}' AND state IN ('ADMITTED', 'UNKNOWN')")).await,
        0
    );
}

/// An address of this host that is not loopback (where its default route leaves from), for
/// a server a tunnel may reach: egress never reaches the host's loopback.
fn host_address() -> std::net::Ipv4Addr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    // Connecting a UDP socket sends nothing: it only picks the route's source address.
    s.connect("192.0.2.1:9")
        .expect("the egress tests need a route off this host (a non-loopback address)");
    match s.local_addr().unwrap().ip() {
        std::net::IpAddr::V4(a) if !a.is_loopback() => a,
        other => panic!("the egress tests need a non-loopback IPv4 address; this host has {other}"),
    }
}

/// A TCP server on `host_address()` that answers each connection's first line with
/// `echo: <line>`; its port.
fn echo_server() -> u16 {
    use std::io::{BufRead, Write};
    let l = std::net::TcpListener::bind((host_address(), 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut line = String::new();
                if std::io::BufReader::new(&s).read_line(&mut line).is_ok() {
                    let _ = s.write_all(format!("echo: {line}").as_bytes());
                }
            });
        }
    });
    port
}

/// From inside a RUNNING generation: a tunnel to a host its scope names is admitted and
/// carried; one its scope does not name, one to the host's own loopback (even when the
/// scope names it) and a direct connection are not. Each tunnel the coordinator admitted
/// is a claim settled with what happened to it; refused ones are audited.
#[tokio::test(flavor = "multi_thread")]
async fn egress_reaches_only_what_the_scope_names_and_never_the_host_itself() {
    let model = Model::start();
    let (w, _creds) = provider_world(&model, "k", 1);
    let lane = w.lane_of(0, "lane-1");
    let ip = host_address();
    let (open, closed) = (echo_server(), echo_server());
    let scope: Vec<String> = vec![
        format!("lane:{lane}"),
        "provider".into(),
        format!("egress:{ip}:{open}"),
        format!("egress:127.0.0.1:{}", model.port),
    ];
    let task = format!(
        "attack=egress:{ip}:{open} attack=egress:{ip}:{closed} attack=egress:127.0.0.1:{} \
         attack=tcp:{ip}:{open} hang",
        model.port
    );
    let a = tokio::task::block_in_place(|| assign_scoped(&w, &lane, &task, &scope, true));
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let home = home(&w, &a);
    let got = tokio::task::block_in_place(|| outcomes(&home.join("attacks")));
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(got[0].1, "the scoped host: {got:?}");
    assert_eq!(
        std::fs::read_to_string(home.join("egress-answer")).unwrap(),
        "echo: ping\n",
        "the tunnel carried both ways"
    );
    assert!(
        !got[1].1 && got[1].2.contains("out-of-scope"),
        "another port: {got:?}"
    );
    assert!(
        !got[2].1 && got[2].2.contains("never reaches"),
        "loopback: {got:?}"
    );
    assert!(!got[3].1, "a direct connection: {got:?}");
    // The model's port on loopback got nothing from the tunnel.
    assert!(posts(&model).is_empty());
    w.wait_count(
        &format!("SELECT count(*) FROM effect_claims WHERE assignment_id = '{asg}' AND state = 'COMPLETED'"),
        |n| n == 1,
        "the tunnel's claim settled once it closed",
    )
    .await;
    // The refused tunnel's result reaches the coordinator after the harness's answer (the
    // broker reports what it observed, resending until recorded): waited for, not raced.
    w.wait_count(
        &format!("SELECT count(*) FROM effect_claims WHERE assignment_id = '{asg}' AND state = 'ADMITTED'"),
        |n| n == 0,
        "every claim's result recorded",
    )
    .await;
    let claims = claims_of(&w, &asg).await;
    let states: Vec<(&str, &str)> = claims
        .iter()
        .map(|c| (c.1.as_str(), c.2.as_str()))
        .collect();
    assert_eq!(
        states,
        vec![
            (format!("egress:{ip}:{open}").as_str(), "COMPLETED"),
            (
                format!("egress:127.0.0.1:{}", model.port).as_str(),
                "FAILED"
            ),
        ],
        "one claim per admitted tunnel; none for the out-of-scope one"
    );
    assert!(tokio::task::block_in_place(|| w.audited("does not license")) >= 1);
}

/// A bare repository standing in for a host's remote; removed on drop.
struct Remote(PathBuf);

impl Remote {
    fn new() -> Self {
        let p = std::env::temp_dir().join(format!(
            "mosaic-remote-{}.git",
            uuid::Uuid::new_v4().simple()
        ));
        let ok = std::process::Command::new("git")
            .args(["init", "--bare", "-q"])
            .arg(&p)
            .status()
            .expect("the push tests need git on this host");
        assert!(ok.success());
        Self(p)
    }

    /// The commit `reference` names, if it exists.
    fn at(&self, reference: &str) -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&self.0)
            .args(["rev-parse", "--verify", "-q", reference])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A push goes out only through the push executor, after the coordinator admitted the
/// exact ref update: the assignment's own branch under `push:REPO`, nothing outside the
/// scope; the same commit again claims and pushes nothing; another update under a key
/// already bound is refused, and the lane of the generation that tried is quarantined.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_is_an_admitted_claim_bound_to_its_exact_ref_update() {
    let remote = Remote::new();
    let w = World::started(Spec {
        lanes: 1,
        tag: "push",
        supervisor_extra: format!("[repositories.app]\nurl = {:?}\n", remote.0),
        ..Spec::default()
    });
    let lane = w.lane_of(0, "lane-1");
    let scope = vec![format!("lane:{lane}"), "push:app".into()];
    // The generation's area is removed once it ends: the last attempt, which ends it,
    // waits for `go` until its first four answers have been read.
    let home = w.area(0, &w.incarnation_of(0, "lane-1"), 1).join("home");
    let a = tokio::task::block_in_place(|| {
        assign_scoped(
            &w,
            &lane,
            &format!(
                "attack=push:app attack=repush:app attack=push-ref:app:refs/heads/main \
                 attack=push:app:k1 attack=wait:{} attack=push:app:k1 hang",
                home.join("go").display()
            ),
            &scope,
            true,
        )
    });
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let got = tokio::task::block_in_place(|| {
        wait_until("the first four attempts", || {
            let text = std::fs::read_to_string(home.join("attacks")).ok()?;
            let got = parse(&text);
            (got.len() >= 4).then_some(got)
        })
    });
    assert!(got[0].1, "its own branch: {got:?}");
    assert!(
        got[1].1,
        "the same commit again (up to date, nothing pushed): {got:?}"
    );
    assert!(
        !got[2].1 && got[2].2.contains("out-of-scope"),
        "another ref: {got:?}"
    );
    assert!(got[3].1, "a new commit under a key of its own: {got:?}");
    let answers: Vec<Value> = std::fs::read_to_string(home.join("push-answers"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    std::fs::write(home.join("go"), "").unwrap();
    // The substitution quarantines the lane, and its generation is stopped: its refusal
    // is read if the area was still there.
    tokio::task::block_in_place(|| {
        wait_until("the lane quarantined", || {
            let lanes = w.op(&OperatorRequest::Lanes).ok()?;
            (lanes[0]["state"] == "QUARANTINED").then_some(())
        })
    });
    let got = std::fs::read_to_string(home.join("attacks")).map(|t| parse(&t));
    if let Some(last) = got.as_ref().ok().and_then(|g| g.get(5)) {
        assert!(
            !last.1 && last.2.contains("idempotency-conflict"),
            "another update under a bound key: {got:?}"
        );
    }
    let branch = format!("refs/heads/mosaic/{asg}");
    assert_eq!(
        remote.at(&branch).as_deref(),
        answers[3]["push"]["new"].as_str(),
        "the remote has the last admitted update"
    );
    assert_eq!(answers[1]["push"]["state"], "up-to-date");
    assert_eq!(answers[1]["push"]["effect_id"], "");
    assert!(remote.at("refs/heads/main").is_none());
    let claims = claims_of(&w, &asg).await;
    let pushes: Vec<(&str, &str)> = claims
        .iter()
        .map(|c| (c.1.as_str(), c.2.as_str()))
        .collect();
    assert_eq!(
        pushes,
        vec![
            (format!("push:app:{branch}").as_str(), "COMPLETED"),
            (format!("push:app:{branch}").as_str(), "COMPLETED"),
        ]
    );
    assert!(tokio::task::block_in_place(|| w.audited("idempotency key already used")) >= 1);
}

// ---- Effect admission races (spec §17): a revocation, a takeover, a crash or a handoff
// between a claim and its dispatch, its sink and its result ------------------------------

/// A world as `provider_world`, with `coordinators` coordinators and its supervisor started
/// under `failpoints` (`effect:pre-dispatch` / `effect:post-sink` hold an effect until a
/// file exists).
fn race_world(
    model: &Model,
    lanes: usize,
    coordinators: usize,
    failpoints: &str,
    extra_scope_world: &str,
) -> (World, Scratch) {
    assert!(
        mosaic::coordinator::failpoint::enabled(),
        "the race tests hold effects with failpoints: cargo test --features failpoints (scripts/test does)"
    );
    let creds = Scratch(std::env::temp_dir().join(format!(
        "mosaic-creds-{}.env",
        uuid::Uuid::new_v4().simple()
    )));
    std::fs::write(&creds.0, "FAKE_PROVIDER_KEY=race-key\n").unwrap();
    std::fs::set_permissions(
        &creds.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let mut w = World::new(Spec {
        lanes,
        coordinators,
        tag: "race",
        supervisor_extra: format!(
            "[providers]\nfake = \"http://127.0.0.1:{}\"\n[credentials]\nfake = {:?}\n{extra_scope_world}",
            model.port, creds.0
        ),
        ..Spec::default()
    });
    w.start_coordinator(0, None);
    w.wait_leading(0);
    for i in 1..coordinators {
        w.start_coordinator(i, None);
    }
    w.sup[0].start(Some(failpoints));
    w.wait_lanes(lanes);
    (w, creds)
}

/// A file that does not exist yet (created to release a held effect), removed on drop.
fn hold_file() -> Scratch {
    Scratch(std::env::temp_dir().join(format!("mosaic-hold-{}", uuid::Uuid::new_v4().simple())))
}

fn supervisor_says(w: &World, what: &str) {
    wait_until(what, || {
        std::fs::read_to_string(w.supervisor_log(0))
            .ok()?
            .contains(what)
            .then_some(())
    });
}

fn stop(w: &World, asg: &str, wait: bool) -> Value {
    w.op(&OperatorRequest::Stop {
        assignment_id: asg.into(),
        outcome: None,
        evidence_digest: None,
        wait,
        request_id: None,
    })
    .unwrap()
}

/// Waits until a stop of `asg` answers with its final state, cancelled.
fn stop_final(w: &World, asg: &str) {
    tokio::task::block_in_place(|| {
        wait_until("the stop final", || {
            (stop(w, asg, true)["state"] == "CANCELLED").then_some(())
        })
    });
}

async fn claim_states(w: &World, asg: &str) -> Vec<String> {
    claims_of(w, asg).await.into_iter().map(|c| c.2).collect()
}

/// Post-claim, pre-dispatch: the claim was admitted, then the work was stopped. The host
/// learns of the stop, and the executor's own fence check (right before dispatch) sends
/// nothing: the claim is settled NOT_DISPATCHED, the provider never sees the request.
#[tokio::test(flavor = "multi_thread")]
async fn an_admitted_effect_is_not_dispatched_once_its_generation_is_fenced() {
    let model = Model::start();
    let hold = hold_file();
    let (w, _c) = race_world(
        &model,
        1,
        1,
        &format!("effect:pre-dispatch=return({})", hold.0.display()),
        "",
    );
    let lane = w.lane_of(0, "lane-1");
    let a = tokio::task::block_in_place(|| {
        w.assign_to(
            &lane,
            "ignore-term attack=provider:FAKE_PROVIDER_KEY hang",
            true,
        )
        .unwrap()
    });
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    tokio::task::block_in_place(|| supervisor_says(&w, "failpoint: holding this effect"));
    assert_eq!(claim_states(&w, &asg).await, vec!["ADMITTED"]);
    tokio::task::block_in_place(|| {
        stop(&w, &asg, false);
        supervisor_says(&w, "generation fenced on the coordinator's order");
    });
    std::fs::write(&hold.0, "").unwrap();
    let home = home(&w, &a);
    let got = tokio::task::block_in_place(|| outcomes(&home.join("attacks")));
    assert!(!got[0].1, "{got:?}");
    let said = std::fs::read_to_string(home.join("provider-answer")).unwrap();
    assert!(said.contains("fenced"), "{said}");
    assert!(
        posts(&model).is_empty(),
        "the provider saw a fenced request"
    );
    w.wait_count(
        &format!("SELECT count(*) FROM effect_claims WHERE assignment_id = '{asg}' AND state = 'NOT_DISPATCHED'"),
        |n| n == 1,
        "the claim settled as not dispatched",
    )
    .await;
    stop_final(&w, &asg);
}

/// Sink accepted, then revoked: the provider is answering when the work is stopped and its
/// generation killed. The claim preceded the revocation (admission orders it); what is
/// observed is that it was cut part-way: ABORTED, carried by the generation's receipt, and
/// the requested outcome stands (the effect's outcome is known).
#[tokio::test(flavor = "multi_thread")]
async fn an_effect_cut_by_its_generations_end_is_settled_aborted() {
    let model = Model::start();
    let hold = hold_file();
    let (w, _c) = race_world(
        &model,
        1,
        1,
        &format!("effect:post-sink=return({})", hold.0.display()),
        "",
    );
    let lane = w.lane_of(0, "lane-1");
    let a = tokio::task::block_in_place(|| {
        w.assign_to(&lane, "attack=provider:FAKE_PROVIDER_KEY hang", true)
            .unwrap()
    });
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    tokio::task::block_in_place(|| supervisor_says(&w, "failpoint: holding this effect"));
    assert_eq!(posts(&model).len(), 1, "the sink took the request");
    let stopped = tokio::task::block_in_place(|| stop(&w, &asg, true));
    assert_eq!(stopped["state"], "CANCELLED", "{stopped}");
    assert_eq!(claim_states(&w, &asg).await, vec!["ABORTED"]);
    let receipts = w
        .sql()
        .await
        .query_one(
            "SELECT body->'effects' FROM termination_receipts WHERE assignment_id = $1",
            &[&asg],
        )
        .await
        .unwrap()
        .get::<_, serde_json::Value>(0);
    assert_eq!(receipts[0]["outcome"], "aborted", "{receipts}");
    std::fs::write(&hold.0, "").unwrap();
}

/// Post-sink, pre-result, with the broker gone: the supervisor is SIGKILLed while a tunnel
/// it was admitted for is in flight. Nobody observed its outcome, and a tunnel's sink cannot
/// be asked: when the generation's end is ingested the claim is UNKNOWN, owned by the
/// operator, and the requested CANCELLED becomes QUARANTINED. The operator's resolve, with
/// evidence, settles it.
#[tokio::test(flavor = "multi_thread")]
async fn an_effect_nobody_observed_is_unknown_until_its_owner_resolves_it() {
    let model = Model::start();
    let hold = hold_file();
    let ip = host_address();
    let port = echo_server();
    let (mut w, _c) = race_world(
        &model,
        1,
        1,
        &format!("effect:pre-dispatch=return({})", hold.0.display()),
        "",
    );
    let lane = w.lane_of(0, "lane-1");
    let scope = vec![format!("lane:{lane}"), format!("egress:{ip}:{port}")];
    let a = tokio::task::block_in_place(|| {
        assign_scoped(
            &w,
            &lane,
            &format!("attack=egress:{ip}:{port} hang"),
            &scope,
            true,
        )
    });
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    tokio::task::block_in_place(|| supervisor_says(&w, "failpoint: holding this effect"));
    w.crash_supervisor(0);
    w.start_supervisor(0);
    // Final once the restarted host reconnects and its receipt is ingested.
    tokio::task::block_in_place(|| {
        wait_until("the stop final", || {
            (stop(&w, &asg, true)["state"] == "QUARANTINED").then_some(())
        })
    });
    let claims = claims_of(&w, &asg).await;
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].2, "UNKNOWN");
    let listed = tokio::task::block_in_place(|| {
        w.op(&OperatorRequest::Effects {
            assignment_id: Some(asg.clone()),
            limit: None,
        })
        .unwrap()
    });
    assert_eq!(listed[0]["reconciliation_owner"], "operator");
    let st = tokio::task::block_in_place(|| w.status());
    let mine = st["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["assignment_id"] == asg.as_str())
        .cloned()
        .unwrap();
    assert_eq!(mine["effects"]["unknown"], 1, "{mine}");
    assert!(mine["next_action"]
        .as_str()
        .unwrap()
        .contains("mosaic effect resolve"));
    let effect = listed[0]["effect_id"].as_str().unwrap().to_string();
    let resolved = tokio::task::block_in_place(|| {
        w.op(&OperatorRequest::EffectResolve {
            effect_id: effect.clone(),
            applied: false,
            evidence_digest: mosaic::protocol::work::evidence_digest(
                "effect-reconciliation",
                b"the echo server's log shows no connection",
            ),
            request_id: None,
        })
        .unwrap()
    });
    assert_eq!(resolved["state"], "RECONCILED", "{resolved}");
    assert_eq!(claim_states(&w, &asg).await, vec!["RECONCILED"]);
    std::fs::write(&hold.0, "").unwrap();
}

/// A takeover between a claim and its result: admitted by the first leader, the effect is
/// carried (admission ordered it), and its result — sent again until answered — is
/// recorded by the next leader.
#[tokio::test(flavor = "multi_thread")]
async fn an_effects_result_is_recorded_across_a_takeover() {
    let model = Model::start();
    let hold = hold_file();
    let (mut w, _c) = race_world(
        &model,
        1,
        2,
        &format!("effect:post-sink=return({})", hold.0.display()),
        "",
    );
    let lane = w.lane_of(0, "lane-1");
    let a = tokio::task::block_in_place(|| {
        w.assign_to(&lane, "attack=provider:FAKE_PROVIDER_KEY hang", true)
            .unwrap()
    });
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    tokio::task::block_in_place(|| supervisor_says(&w, "failpoint: holding this effect"));
    let first = w.status()["coordinator_epoch"].as_i64().unwrap();
    w.crash_coordinator(0);
    let second = tokio::task::block_in_place(|| w.wait_leading(1));
    assert!(second > first);
    std::fs::write(&hold.0, "").unwrap();
    w.wait_count(
        &format!("SELECT count(*) FROM effect_claims WHERE assignment_id = '{asg}' AND state = 'COMPLETED'"),
        |n| n == 1,
        "the result recorded by the new leader",
    )
    .await;
    let c = w.sql().await;
    let admitted: i64 = c
        .query_one(
            "SELECT coordinator_epoch FROM effect_claims WHERE assignment_id = $1",
            &[&asg],
        )
        .await
        .unwrap()
        .get(0);
    let recorded: i64 = c
        .query_one(
            "SELECT coordinator_epoch FROM transition_receipts WHERE transition = 'effect-result' AND assignment_id = $1",
            &[&asg],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!((admitted, recorded), (first, second));
}

/// A handoff offered: the source keeps running until the target acknowledges, but admits
/// nothing more (spec §6.1: the source's new-effect admission is fenced at the offer).
#[tokio::test(flavor = "multi_thread")]
async fn a_handoff_offer_fences_the_sources_admission() {
    let model = Model::start();
    let hold = hold_file();
    let (w, _c) = race_world(
        &model,
        2,
        1,
        // Nothing held: the failpoint names a file created before any effect.
        &format!("effect:pre-dispatch=return({})", hold.0.display()),
        "",
    );
    std::fs::write(&hold.0, "").unwrap();
    let (src, dst) = (w.lane_of(0, "lane-1"), w.lane_of(0, "lane-2"));
    let go = w.area(0, &w.incarnation_of(0, "lane-1"), 1).join("home/go");
    let a = tokio::task::block_in_place(|| {
        w.assign_to(
            &src,
            &format!(
                "attack=provider:FAKE_PROVIDER_KEY attack=wait:{} attack=provider:FAKE_PROVIDER_KEY hang",
                go.display()
            ),
            true,
        )
        .unwrap()
    });
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    w.wait_count(
        &format!("SELECT count(*) FROM effect_claims WHERE assignment_id = '{asg}' AND state = 'COMPLETED'"),
        |n| n == 1,
        "the first request carried",
    )
    .await;
    // The target never acknowledges: the offer stays open.
    tokio::task::block_in_place(|| {
        w.op(&OperatorRequest::Handoff {
            assignment_id: asg.clone(),
            lane_id: dst,
            task: Some("no-ack".into()),
            within_ms: Some(60_000),
            request_id: None,
        })
        .unwrap()
    });
    std::fs::write(&go, "").unwrap();
    let got = tokio::task::block_in_place(|| outcomes(&home(&w, &a).join("attacks")));
    assert!(got[0].1, "before the offer: {got:?}");
    assert!(!got[2].1, "after the offer: {got:?}");
    let said = std::fs::read_to_string(home(&w, &a).join("provider-answer")).unwrap();
    assert!(said.contains("wrong-state"), "{said}");
    assert!(tokio::task::block_in_place(|| w.audited("a handoff of the work is pending")) >= 1);
    assert_eq!(claim_states(&w, &asg).await, vec!["COMPLETED"]);
}

/// §6.1 `RUNNING → HANDOFF_PENDING` for the workspace: an open handoff offer holds the
/// source's workspace read-only while it runs on (as its admission is closed), and an offer
/// that ends without moving the work — here its target generation killed before it
/// acknowledges — gives the source its workspace back.
#[tokio::test(flavor = "multi_thread")]
async fn a_handoff_offer_holds_the_sources_workspace_until_it_ends() {
    let model = Model::start();
    let (w, _c) = provider_world(&model, "ws-key", 2);
    let (src, dst) = (w.lane_of(0, "lane-1"), w.lane_of(0, "lane-2"));
    let area = w.area(0, &w.incarnation_of(0, "lane-1"), 1);
    let (work, home) = (area.join("work"), area.join("home"));
    let task = format!(
        "attack=write:{0}/before attack=wait:{1}/go attack=write:{0}/offered \
         attack=wait:{1}/back attack=write:{0}/back hang",
        work.display(),
        home.display()
    );
    let a = tokio::task::block_in_place(|| w.assign_to(&src, &task, true).unwrap());
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let first = tokio::task::block_in_place(|| first_outcomes(&home.join("attacks"), 1));
    assert!(first[0].1, "the activated source cannot write: {first:?}");
    tokio::task::block_in_place(|| {
        w.op(&OperatorRequest::Handoff {
            assignment_id: asg.clone(),
            lane_id: dst,
            task: Some("no-ack".into()),
            within_ms: Some(600_000),
            request_id: None,
        })
        .unwrap();
        supervisor_says(&w, "the held generation's workspace is read-only");
    });
    std::fs::write(home.join("go"), "").unwrap();
    let held = tokio::task::block_in_place(|| first_outcomes(&home.join("attacks"), 3));
    assert!(
        !held[2].1,
        "the source wrote its workspace under an open offer: {held:?}"
    );
    assert!(held[2].2.contains("Read-only"), "{held:?}");
    // The target dies before it acknowledges: the offer ends, the work stays with its
    // source, whose workspace opens again.
    let target = w.incarnation_of(0, "lane-2");
    let cg: String = tokio::task::block_in_place(|| {
        wait_until("the target's identity", || {
            tokio::runtime::Handle::current().block_on(async {
                w.sql()
                    .await
                    .query_opt(
                        "SELECT process_identity->>'cgroup_path' FROM generations \
                     WHERE lane_incarnation_id = $1 AND process_identity IS NOT NULL",
                        &[&target],
                    )
                    .await
                    .unwrap()
                    .map(|r| r.get::<_, String>(0))
            })
        })
    });
    std::fs::write(cgroup_at(&cg).join("cgroup.kill"), "1").unwrap();
    tokio::task::block_in_place(|| {
        supervisor_says(&w, "the released generation's workspace is writable again")
    });
    std::fs::write(home.join("back"), "").unwrap();
    let back = tokio::task::block_in_place(|| first_outcomes(&home.join("attacks"), 5));
    assert!(
        back[4].1,
        "the source's workspace stayed closed after the offer ended: {back:?}"
    );
    assert!(work.join("before").exists() && work.join("back").exists());
    assert!(!work.join("offered").exists());
    stop_final(&w, &asg);
}

/// The attempts recorded in `file` so far, once there are at least `n`.
fn first_outcomes(file: &Path, n: usize) -> Vec<(String, bool, String)> {
    wait_until("the attacker's first outcomes", || {
        let got = parse(&std::fs::read_to_string(file).ok()?);
        (got.len() >= n).then_some(got)
    })
}

/// §17 "Staging write attempt" and "Fence revocation race" for the workspace: before its
/// activation commits, a generation's workspace (its working directory) is read-only to
/// it; its activation opens it; the coordinator's fence closes it again before the stop's
/// grace period runs out, while the harness lives on (it ignores its graceful signal).
#[tokio::test(flavor = "multi_thread")]
async fn the_workspace_is_writable_only_between_activation_and_fence() {
    let model = Model::start();
    let (w, _c) = provider_world(&model, "ws-key", 1);
    let lane = w.lane_of(0, "lane-1");
    let area = w.area(0, &w.incarnation_of(0, "lane-1"), 1);
    let (work, home) = (area.join("work"), area.join("home"));
    let task = format!(
        "ignore-term staging-attack=write:{0}/staged attack=write:{0}/active \
         attack=wait:{1}/go attack=write:{0}/fenced hang",
        work.display(),
        home.display()
    );
    let a = tokio::task::block_in_place(|| w.assign_to(&lane, &task, true).unwrap());
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let staged = tokio::task::block_in_place(|| outcomes(&home.join("staging-attacks")));
    assert!(!staged[0].1, "staging wrote its workspace: {staged:?}");
    assert!(staged[0].2.contains("Read-only"), "{staged:?}");
    let active = tokio::task::block_in_place(|| first_outcomes(&home.join("attacks"), 1));
    assert!(
        active[0].1,
        "the activated generation cannot write: {active:?}"
    );
    // The area is removed once the stop's grace ends: what the generation writes in it
    // during the grace is read through a descriptor opened before.
    let attacks = Kept::open("the attacker's outcomes", &home.join("attacks"));
    tokio::task::block_in_place(|| {
        stop(&w, &asg, false);
        supervisor_says(&w, "the fenced generation's workspace is read-only");
    });
    std::fs::write(home.join("go"), "").unwrap();
    let got = tokio::task::block_in_place(|| {
        wait_until("the attempt after the fence", || {
            let text = attacks.text();
            text.contains("attacks done").then(|| parse(&text))
        })
    });
    assert!(
        !got[2].1,
        "the fenced generation wrote its workspace: {got:?}"
    );
    assert!(!work.join("staged").exists() && !work.join("fenced").exists());
    stop_final(&w, &asg);
}

/// A file held open for writing keeps the kernel from making the workspace read-only at
/// the fence: the generation is frozen instead, so the write it makes afterwards through
/// that descriptor never happens; its stop still ends it.
#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_generation_holding_a_workspace_file_open_is_frozen() {
    let model = Model::start();
    let (w, _c) = provider_world(&model, "ws-key", 1);
    let lane = w.lane_of(0, "lane-1");
    let area = w.area(0, &w.incarnation_of(0, "lane-1"), 1);
    let (work, home) = (area.join("work"), area.join("home"));
    let task = format!(
        "ignore-term attack=write:{0}/active attack=hold-write:{0}/held hang",
        work.display()
    );
    let a = tokio::task::block_in_place(|| w.assign_to(&lane, &task, true).unwrap());
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let active = tokio::task::block_in_place(|| first_outcomes(&home.join("attacks"), 1));
    assert!(active[0].1, "{active:?}");
    let cg = cgroup_at(a["process_identity"]["cgroup_path"].as_str().unwrap());
    // The held file exists (opened) before the fence; read through a descriptor of our
    // own, as the area is removed once the stop's grace ends.
    let held = tokio::task::block_in_place(|| Kept::open("the held file", &work.join("held")));
    tokio::task::block_in_place(|| {
        stop(&w, &asg, false);
        supervisor_says(&w, "the fenced generation is frozen");
    });
    // The kernel's word: nothing of it runs (so what follows is not a race).
    tokio::task::block_in_place(|| {
        wait_until("the generation frozen", || {
            std::fs::read_to_string(cg.join("cgroup.events"))
                .ok()?
                .contains("frozen 1")
                .then_some(())
        })
    });
    // Its go (it writes once `go` exists); the area may already be gone, and with it the
    // generation.
    let _ = std::fs::write(home.join("go"), "");
    assert_eq!(
        held.text(),
        "",
        "the fenced generation wrote through its held descriptor"
    );
    stop_final(&w, &asg);
}
