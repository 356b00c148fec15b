//! Preactivation retarget (spec §6.3, §7.3–§7.5): work whose start failed before activation
//! moves to another lane only through a recovery candidate — a candidate row that grants
//! nothing, a challenge signed by the coordinator's recovery key, the candidate host's ACK
//! signed by its own recovery key, and the one reservation CAS that consumes it against the
//! exact failed-target snapshot. On real daemons, tmux, cgroups and PostgreSQL; and the CAS
//! matrix on the store, one row per bound fact.

mod common;
mod pg;
mod recovery;
mod store;
mod world;

use mosaic::coordinator::recovery::RecoveryConsume;
use mosaic::coordinator::service::OperatorRequest;
use mosaic::coordinator::Category;
use recovery::*;
use serde_json::Value;
use world::{assign_request, Spec, World};

/// libfaketime shifts one process's wall clock (`clock_gettime`), nothing else.
fn skew(w: &mut World, h: usize, offset: &str) {
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .unwrap_or_else(|| {
        panic!("this test needs libfaketime (apt-get install faketime; scripts/test installs it)")
    });
    let d = &mut w.sup[h];
    d.set_env("LD_PRELOAD", Some(lib.to_string()));
    d.set_env("FAKETIME", Some(offset.to_string()));
    d.set_env("FAKETIME_DONT_FAKE_MONOTONIC", Some("1".into()));
    d.set_env("FAKETIME_NO_CACHE", Some("1".into()));
}

/// End to end: the target host is frozen mid-chain and then SIGKILLed; the reservation
/// expires (the objective evidence), and the watchdog retargets the work, by policy, to the
/// other host's lane — through one candidate whose ACK came from that host's recovery key —
/// where it reaches RUNNING. One responsibility owner throughout; T's attempt is marked
/// retargeted; nothing was ever activated for T.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_whose_host_dies_moves_to_another_host_only_through_its_recovery_candidate() {
    let mut w = World::new(Spec {
        hosts: 2,
        supervisors: 2,
        lanes: 1,
        reservation_ttl_ms: Some(2000),
        tag: "retarget",
        ..Spec::default()
    });
    w.coord[0].log_level = "debug";
    // §17 Candidate ACK DB-time freshness: the candidate host's wall clock runs two
    // minutes ahead — past every recovery deadline it will be sent (30 s), within the
    // session's skew tolerance. It changes nothing: the ACK asserts no time, and only the
    // database's clock decides freshness.
    skew(&mut w, 1, "+120s");
    w.start_coordinator(0, None);
    w.wait_leading(0);
    w.start_supervisor(0);
    w.start_supervisor(1);
    w.wait_lanes(2);
    let (t_lane, u_lane) = (w.lane_of(0, "lane-1"), w.lane_of(1, "lane-1"));
    // Frozen, host 0 keeps its session open (so the assignment is admitted) but can take
    // no step of the chain.
    let pid = w.sup[0].pid().expect("supervisor 0 runs") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let a = w.op(&assign_request(&t_lane, "hang", None, false)).unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let t_res = a["reservation_id"].as_str().unwrap().to_string();
    w.crash_supervisor(0);

    // The work reaches RUNNING on U, by retarget.
    let q = format!(
        "SELECT count(*) FROM assignments a JOIN lane_incarnations li USING (lane_incarnation_id) \
         WHERE a.assignment_id = '{id}' AND li.lane_id = '{u_lane}' AND li.state = 'RUNNING' AND a.execution_owner = '{u_lane}'"
    );
    w.wait_count(&q, |n| n == 1, "the work RUNNING on the candidate's lane")
        .await;

    let db = w.sql().await;
    let cands = db
        .query(
            "SELECT recovery_candidate_id, state, candidate_principal, candidate_lane_id, expected_retarget_operation, \
                    failed_reservation_id, recovery_deadline, retarget_reservation_id, objective_failure_evidence, \
                    failed_target_snapshot->>'challenge_consumption_state' AS t_challenge, \
                    failed_target_snapshot->>'activation_idempotency_identity' AS t_activation \
             FROM recovery_candidates WHERE assignment_id = $1 ORDER BY issued_at",
            &[&id],
        )
        .await
        .unwrap();
    let consumed: Vec<_> = cands
        .iter()
        .filter(|r| r.get::<_, String>("state") == "CONSUMED")
        .collect();
    assert_eq!(
        consumed.len(),
        1,
        "exactly one candidate's ACK was consumed"
    );
    let c = consumed[0];
    let cand: String = c.get("recovery_candidate_id");
    assert_eq!(
        c.get::<_, String>("candidate_principal"),
        format!("host:{}", w.hosts[1])
    );
    assert_eq!(c.get::<_, String>("candidate_lane_id"), u_lane);
    assert_eq!(c.get::<_, String>("expected_retarget_operation"), "initial");
    assert_eq!(c.get::<_, String>("failed_reservation_id"), t_res);
    assert!(
        c.get::<_, Option<String>>("t_activation").is_none(),
        "T never activated"
    );
    let evidence: Value = c.get("objective_failure_evidence");
    assert!(
        evidence["end_chain"]["cause"]
            .as_str()
            .is_some_and(|c| c.contains("expired")),
        "{evidence}"
    );
    // The deadline the receipt of the consuming CAS records is the candidate row's text,
    // byte for byte.
    let deadline: String = c.get("recovery_deadline");
    let u_res: String = c
        .get::<_, Option<String>>("retarget_reservation_id")
        .unwrap();
    let receipt: Value = db
        .query_one(
            "SELECT body FROM transition_receipts WHERE transition = 'reserve' AND body->'chain'->>'reservation_id' = $1",
            &[&u_res],
        )
        .await
        .unwrap()
        .get("body");
    assert_eq!(receipt["retarget"]["recovery_candidate_id"], cand.as_str());
    assert_eq!(receipt["retarget"]["recovery_deadline"], deadline.as_str());
    assert_eq!(receipt["retarget"]["failed_reservation_id"], t_res.as_str());
    // T's attempt is RETARGETED_FENCED by that candidate; nothing ever activated it.
    let t_attempt: Option<String> = db
        .query_one(
            "SELECT at.retargeted_by FROM reservations r JOIN attempts at USING (assignment_attempt_id) WHERE r.reservation_id = $1",
            &[&t_res],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(t_attempt.as_deref(), Some(cand.as_str()));
    let t_activations = w
        .count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'activate' AND body->'chain'->>'reservation_id' = '{t_res}'"
        ))
        .await;
    assert_eq!(t_activations, 0);
    // One responsibility owner throughout: every receipt of the work names T until the
    // retarget, and U from it on; execution was only ever U's.
    let owners = db
        .query(
            "SELECT transition, body->>'responsibility_owner' AS ro, body->>'execution_owner' AS eo \
             FROM transition_receipts WHERE assignment_id = $1 OR body->'chain'->>'assignment_id' = $1 ORDER BY decided_at",
            &[&id],
        )
        .await
        .unwrap();
    let executing: Vec<String> = owners
        .iter()
        .filter_map(|r| r.get::<_, Option<String>>("eo"))
        .collect();
    assert!(executing.iter().all(|e| *e == u_lane), "{executing:?}");
    let named: Vec<String> = owners
        .iter()
        .filter_map(|r| r.get::<_, Option<String>>("ro"))
        .collect();
    assert_eq!(
        named,
        vec![t_lane.clone(), u_lane.clone()],
        "T's reservation, then U's"
    );
    let row = db
        .query_one(
            "SELECT responsibility_owner, lifecycle FROM assignments WHERE assignment_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), u_lane);
    assert_eq!(row.get::<_, String>(1), "ACTIVE");

    // A second `retarget` of running work is refused and changes nothing.
    let e = w
        .op(&OperatorRequest::Retarget {
            assignment_id: id.clone(),
            request_id: None,
        })
        .unwrap_err();
    assert_eq!(e.category, Category::WrongState, "{e:?}");
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM recovery_candidates WHERE assignment_id = '{id}'"
        ))
        .await,
        cands.len() as i64
    );
}

/// A host whose recovery key is not in the trust registry can never answer a recovery
/// challenge, so the policy never chooses it: the work waits in recovery (for its lane, or
/// an operator), and `mosaic retarget` says why, with no candidate offered to a host that
/// would never ACK.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_without_a_recovery_key_is_never_a_candidate() {
    let mut w = World::new(Spec {
        hosts: 2,
        supervisors: 2,
        lanes: 1,
        reservation_ttl_ms: Some(2000),
        tag: "retarget-nokey",
        ..Spec::default()
    });
    // Host B without a recovery key: none in the registry, none in its configuration.
    let b = format!("host:{}/recovery", w.hosts[1]);
    let trust = w.prov.coordinator.trust_registry.clone();
    let text = std::fs::read_to_string(&trust).unwrap();
    let kept: Vec<&str> = text
        .split("\n[[key]]")
        .filter(|block| !block.contains(&format!("key_id = \"{b}\"")))
        .collect();
    std::fs::write(&trust, kept.join("\n[[key]]")).unwrap();
    let cfg = w.supervisor_config(1);
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("recovery_key"))
        .collect();
    std::fs::write(&cfg, text.join("\n")).unwrap();
    w.start_coordinator(0, None);
    w.wait_leading(0);
    w.start_supervisor(0);
    w.start_supervisor(1);
    w.wait_lanes(2);
    let pid = w.sup[0].pid().expect("supervisor 0 runs") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let a = w
        .op(&assign_request(
            &w.lane_of(0, "lane-1"),
            "hang",
            None,
            false,
        ))
        .unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    w.crash_supervisor(0);
    w.wait_count(
        &format!("SELECT count(*) FROM assignments WHERE assignment_id = '{id}' AND lifecycle = 'RECOVERY'"),
        |n| n == 1,
        "the work in recovery",
    )
    .await;
    let e = w
        .op(&OperatorRequest::Retarget {
            assignment_id: id.clone(),
            request_id: None,
        })
        .unwrap_err();
    assert_eq!(e.category, Category::NoEligibleLane, "{e:?}");
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM recovery_candidates WHERE assignment_id = '{id}'"
        ))
        .await,
        0,
        "no candidate was offered to a host that cannot answer"
    );
}

/// §17 Recovery-candidate allocation, substitution, snapshot/evidence/policy substitution,
/// deadline consistency, replay/concurrency, expiry/takeover and both-order races — on the
/// store, one row per bound fact, each row able to fail: a row whose check were deleted
/// would reserve U's chain, and `unchanged` would say so.
#[tokio::test(flavor = "multi_thread")]
async fn the_retarget_cas_consumes_one_exact_ack_and_refuses_every_substitution() {
    let f = store::fx().await;
    let url = pg::server().url(&f.db.name);
    let (t, u, v) = failed_start(&f).await;
    let asg = t.chain().assignment_id.clone();

    // Allocation: nothing but the candidate row.
    let counts = || async {
        let mut c = store::authority_counts(&url).await;
        c.retain(|(t, _)| t != "transition_receipts");
        c
    };
    let before = counts().await;
    let o = offer(&f, &asg, &u).await;
    let after = counts().await;
    assert_eq!(
        before, after,
        "a candidate allocates no attempt, reservation, generation, challenge or lease"
    );
    let facts = &o.challenge.facts;
    assert_eq!(facts.expected_retarget_operation, "initial");
    assert_eq!(facts.candidate_principal, "host:h2");
    assert_eq!(o.candidate_lane_incarnation_id, u.lane_incarnation_id);
    // The snapshot names T's exact preactivation facts, and its digest is the database's.
    let snap: serde_json::Value = json_of(&url, &format!(
        "SELECT failed_target_snapshot FROM recovery_candidates WHERE recovery_candidate_id = '{}'", facts.recovery_candidate_id)).await;
    assert_eq!(
        snap["failed_target_attempt_id"],
        t.chain().assignment_attempt_id.as_str()
    );
    assert_eq!(snap["challenge_id"], t.challenge.as_str());
    assert_eq!(snap["challenge_consumption_state"], "invalidated");
    assert_eq!(snap["execution_owner"], serde_json::Value::Null);
    assert_eq!(
        snap["source_assignment_attempt_id"],
        serde_json::Value::Null
    );
    assert_eq!(snap["handoff_receipt_digest"], serde_json::Value::Null);

    // Substitution rows: each bound fact changed alone.
    type Edit = Box<dyn Fn(&mut RecoveryConsume)>;
    let other = |c: char| store::d(c);
    let rows: Vec<(&str, Edit, Category)> = vec![
        (
            "candidate id",
            Box::new(|c| c.ack.facts.recovery_candidate_id = format!("rk-{}", "0".repeat(32))),
            Category::NotFound,
        ),
        (
            "challenge id",
            Box::new(|c| {
                c.ack.facts.recovery_handoff_challenge_id = format!("rh-{}", "0".repeat(64))
            }),
            Category::Mismatch,
        ),
        (
            "candidate principal",
            Box::new(|c| {
                c.ack.facts.candidate_principal = "host:h3".into();
                c.signer_principal = "host:h3".into();
            }),
            Category::Mismatch,
        ),
        (
            "signer",
            Box::new(|c| c.signer_principal = "host:h3".into()),
            Category::NotOwner,
        ),
        (
            "operation",
            Box::new(|c| c.ack.facts.expected_retarget_operation = "post-transfer".into()),
            Category::Mismatch,
        ),
        (
            "snapshot digest",
            Box::new(move |c| c.ack.facts.failed_target_snapshot_digest = other('1')),
            Category::Mismatch,
        ),
        (
            "evidence digest",
            Box::new(move |c| c.ack.facts.objective_failure_evidence_digest = other('2')),
            Category::Mismatch,
        ),
        (
            "selection digest",
            Box::new(move |c| c.ack.facts.policy_selection_digest = other('3')),
            Category::Mismatch,
        ),
        (
            "scope digest",
            Box::new(move |c| c.ack.facts.scope_digest = other('4')),
            Category::Mismatch,
        ),
        (
            "holds digest",
            Box::new(move |c| c.ack.facts.holds_digest = other('5')),
            Category::Mismatch,
        ),
        (
            "contracts digest",
            Box::new(move |c| c.ack.facts.contracts_digest = other('6')),
            Category::Mismatch,
        ),
        (
            "sot incarnation",
            Box::new(|c| c.ack.facts.sot_incarnation = "sot-other".into()),
            Category::Mismatch,
        ),
        (
            "epoch",
            Box::new(|c| c.ack.facts.coordinator_epoch += 1),
            Category::Mismatch,
        ),
        (
            "assignment",
            Box::new(|c| c.ack.facts.assignment_id = "as-other".into()),
            Category::Mismatch,
        ),
        // The same instant in another rendering is another deadline (byte-identical only).
        (
            "deadline rendering",
            Box::new(|c| {
                let d = c.ack.facts.recovery_deadline.replace('Z', "+00:00");
                c.ack.facts.recovery_deadline = d;
            }),
            Category::Mismatch,
        ),
        (
            "deadline later",
            Box::new(|c| c.ack.facts.recovery_deadline = "2999-01-01T00:00:00.000000Z".into()),
            Category::Mismatch,
        ),
        (
            "idempotency key",
            Box::new(|c| c.ack.idempotency_key = "recovery-ack/other".into()),
            Category::Mismatch,
        ),
    ];
    for (what, edit, want) in rows {
        let mut c = ack_of(&o);
        edit(&mut c);
        let e = f
            .store
            .reserve(&f.leader, &retarget_req(&o, c, &u.lane_incarnation_id))
            .await
            .unwrap_err();
        assert_eq!(e.category(), Some(want), "{what}: {e}");
        unchanged(&f, &o, what).await;
    }
    // Candidate (lane) substitution: the exact ACK, presented for another lane.
    let e = f
        .store
        .reserve(
            &f.leader,
            &retarget_req(&o, ack_of(&o), &v.lane_incarnation_id),
        )
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::Mismatch), "{e}");
    unchanged(&f, &o, "lane substitution").await;

    // Both-order race, ACK first: U ACKs snapshot N, then one T mutation (T's host reports
    // its generation ended): the stale retarget performs no mutation.
    f.store
        .ingest_termination(
            &f.leader,
            store::HOST,
            &store::receipt_for(&t, "abandoned", true),
        )
        .await
        .unwrap();
    let e = f
        .store
        .reserve(
            &f.leader,
            &retarget_req(&o, ack_of(&o), &u.lane_incarnation_id),
        )
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::SnapshotChanged), "{e}");
    unchanged(&f, &o, "stale snapshot").await;

    // Fresh evidence, selection and candidate: two candidates race for one failed target;
    // exactly one ACK is consumed, one chain allocated.
    let (ou, ov) = (offer(&f, &asg, &u).await, offer(&f, &asg, &v).await);
    assert_ne!(
        ou.challenge.facts.recovery_candidate_id,
        ov.challenge.facts.recovery_candidate_id
    );
    let (s1, s2, l1, l2) = (
        f.store.clone(),
        f.store.clone(),
        f.leader.clone(),
        f.leader.clone(),
    );
    let (ru, rv) = (
        retarget_req(&ou, ack_of(&ou), &u.lane_incarnation_id),
        retarget_req(&ov, ack_of(&ov), &v.lane_incarnation_id),
    );
    let (a, b) = tokio::join!(
        tokio::spawn(async move { s1.reserve(&l1, &ru).await }),
        tokio::spawn(async move { s2.reserve(&l2, &rv).await })
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        a.is_ok() as u8 + b.is_ok() as u8,
        1,
        "exactly one winner: {a:?} {b:?}"
    );
    let (won, lost_offer) = match (a, b) {
        (Ok(won), _) => (won, &ov),
        (_, Ok(won)) => (won, &ou),
        _ => unreachable!("one of them won"),
    };
    assert_eq!(
        store::count(&url, &format!("SELECT count(*) FROM recovery_candidates WHERE assignment_id = '{asg}' AND state = 'CONSUMED'")).await,
        1
    );
    assert_eq!(
        store::count(
            &url,
            &format!("SELECT count(*) FROM reservations WHERE assignment_id = '{asg}'")
        )
        .await,
        2,
        "T's and the winner's"
    );
    // The loser is invalidated and can never be consumed; the winner's allocation owns the
    // work as (U, NULL, U), T's attempt is marked retargeted by it.
    let e = f
        .store
        .reserve(
            &f.leader,
            &retarget_req(
                lost_offer,
                ack_of(lost_offer),
                &lost_offer.candidate_lane_incarnation_id,
            ),
        )
        .await
        .unwrap_err();
    assert!(matches!(e.category(), Some(Category::WrongState)), "{e}");
    let a = store::assignment(&f.store, &asg).await;
    assert_eq!(
        (
            a.responsibility_owner.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        (
            won.chain.lane_id.as_str(),
            None,
            Some(won.chain.lane_id.as_str())
        )
    );
    let retargeted_by: Option<String> = json_of(
        &url,
        &format!(
            "SELECT to_jsonb(retargeted_by) FROM attempts WHERE assignment_attempt_id = '{}'",
            t.chain().assignment_attempt_id
        ),
    )
    .await
    .as_str()
    .map(String::from);
    assert!(retargeted_by.is_some_and(|c| c.starts_with("rk-")));
    // No ordinary activation challenge exists for U yet: only verified contract injection
    // mints one.
    assert_eq!(
        store::count(
            &url,
            &format!(
                "SELECT count(*) FROM challenges WHERE reservation_id = '{}'",
                won.chain.reservation_id
            )
        )
        .await,
        0
    );
    // A late T artifact after the retarget: T's ACK on its old chain is refused.
    let e = f
        .store
        .consume_ack(&f.leader, &store::ack(&f.leader, &t))
        .await
        .unwrap_err();
    assert!(e.category().is_some(), "{e}");
    assert_eq!(
        store::count(
            &url,
            &format!(
                "SELECT count(*) FROM ack_receipts WHERE reservation_id = '{}'",
                t.chain().reservation_id
            )
        )
        .await,
        0
    );
}

/// §17 Recovery expiry/takeover, Recovery deadline boundary, Recovery-envelope replay, and
/// retarget being for preactivation failures only.
#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_dies_with_its_deadline_or_its_epoch_and_is_consumed_once() {
    let f = store::fx().await;
    let url = pg::server().url(&f.db.name);
    let (t, u, _v) = failed_start(&f).await;
    let asg = t.chain().assignment_id.clone();

    // Expiry is the database's: a candidate whose recovery_deadline has passed is refused.
    let short = offer_for(&f, &f.leader, &asg, &u, 1000).await.unwrap();
    let deadline: String = json_of(&url, &format!(
        "SELECT to_jsonb(recovery_deadline) FROM recovery_candidates WHERE recovery_candidate_id = '{}'",
        short.challenge.facts.recovery_candidate_id)).await.as_str().unwrap().to_string();
    assert_eq!(
        deadline, short.challenge.facts.recovery_deadline,
        "one rendering, row and challenge alike"
    );
    store::sql(&url)
        .await
        .execute(
            &format!(
                "SELECT pg_sleep_until('{deadline}'::timestamptz + interval '5 milliseconds')"
            ),
            &[],
        )
        .await
        .unwrap();
    let e = f
        .store
        .reserve(
            &f.leader,
            &retarget_req(&short, ack_of(&short), &u.lane_incarnation_id),
        )
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::Expired), "{e}");
    unchanged(&f, &short, "expired").await;
    assert!(f
        .store
        .open_recovery_candidate(&asg, f.leader.epoch())
        .await
        .unwrap()
        .is_none());

    // Takeover: a candidate of the old epoch grants the new leader nothing.
    let o = offer(&f, &asg, &u).await;
    f.store.release(&f.leader).await.unwrap();
    let (l2, _) = f
        .store
        .acquire(&store::candidate("b"), 60_000)
        .await
        .unwrap();
    assert!(l2.epoch() > f.leader.epoch());
    let e = f
        .store
        .reserve(&l2, &retarget_req(&o, ack_of(&o), &u.lane_incarnation_id))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::Expired), "{e}");
    unchanged(&f, &o, "takeover").await;
    assert!(f
        .store
        .open_recovery_candidate(&asg, l2.epoch())
        .await
        .unwrap()
        .is_none());
    // The new leader offers afresh, from the same evidence (T's end-chain receipt).
    let o2 = offer_for(&f, &l2, &asg, &u, 30_000).await.unwrap();
    let ev: serde_json::Value = json_of(&url, &format!(
        "SELECT objective_failure_evidence FROM recovery_candidates WHERE recovery_candidate_id = '{}'",
        o2.challenge.facts.recovery_candidate_id)).await;
    assert!(ev["end_chain"]["receipt_id"].is_string(), "{ev}");
    assert_eq!(
        ev.get("takeover_epoch"),
        None,
        "a takeover alone is no evidence"
    );

    // Consumed once: the same request again is the original receipt; another ACK of the
    // same candidate (another message) is refused and changes nothing.
    let req = retarget_req(&o2, ack_of(&o2), &u.lane_incarnation_id);
    let first = f.store.reserve(&l2, &req).await.unwrap();
    let again = f.store.reserve(&l2, &req).await.unwrap();
    assert!(again.receipt.replayed);
    assert_eq!(again.chain, first.chain);
    let mut second = ack_of(&o2);
    second.ack.acknowledged_recovery_message_id = "sess-test.8".into();
    let e = f
        .store
        .reserve(&l2, &retarget_req(&o2, second, &u.lane_incarnation_id))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::ChallengeConsumed), "{e}");
    assert_eq!(
        store::count(
            &url,
            &format!("SELECT count(*) FROM reservations WHERE assignment_id = '{asg}'")
        )
        .await,
        2
    );

    // Chained recovery: U fails before activation too; V is reached from U's exact
    // snapshot by a new candidate, and the T-to-U candidate authorizes nothing.
    f.store
        .end_chain(&l2, &first.chain, store::EndCause::Abandoned)
        .await
        .unwrap();
    let v = f
        .store
        .adopt_lane_incarnation(&l2, "h5", "h5:w1", &store::uid("li"))
        .await
        .unwrap();
    let ov = offer_for(&f, &l2, &asg, &v, 30_000).await.unwrap();
    assert_ne!(
        ov.challenge.facts.failed_target_snapshot_digest,
        o2.challenge.facts.failed_target_snapshot_digest
    );
    assert_eq!(ov.failed_reservation_id, first.chain.reservation_id);
    let e = f
        .store
        .reserve(&l2, &retarget_req(&o2, ack_of(&o2), &v.lane_incarnation_id))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::ChallengeConsumed), "{e}");
    let third = f
        .store
        .reserve(&l2, &retarget_req(&ov, ack_of(&ov), &v.lane_incarnation_id))
        .await
        .unwrap();
    let a = store::assignment(&f.store, &asg).await;
    assert_eq!(
        (
            a.responsibility_owner.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        ("h5:w1", None, Some("h5:w1"))
    );
    assert_eq!(
        third.receipt.body["retarget"]["failed_reservation_id"],
        first.chain.reservation_id.as_str()
    );

    // Work whose latest chain was activated is not retargeted: its generation ran.
    let w = f
        .store
        .adopt_lane_incarnation(&l2, "h4", "h4:w1", &store::uid("li"))
        .await
        .unwrap();
    let r = store::running(&f.store, &l2, &w.lane_incarnation_id).await;
    f.store
        .ingest_termination(&l2, "h4", &store::receipt_for(&r, "crashed", true))
        .await
        .unwrap();
    let a = store::assignment(&f.store, &r.chain().assignment_id).await;
    assert_eq!(a.lifecycle.as_str(), "RECOVERY");
    let e = offer_for(&f, &l2, &r.chain().assignment_id, &u, 30_000)
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert!(e.to_string().contains("activated"), "{e}");

    // A start released without objective evidence of its own failure — its chain ended
    // by a leadership takeover alone, before any generation could die — may not be
    // retargeted; and since it is a failed start, nothing may move it by a plain
    // reservation either (the watchdog leaves it to its lane or an operator).
    let x = f
        .store
        .adopt_lane_incarnation(&l2, "h6", "h6:w1", &store::uid("li"))
        .await
        .unwrap();
    let rx = f
        .store
        .reserve(&l2, &store::request(&x.lane_incarnation_id, None, 60_000))
        .await
        .unwrap();
    f.store.release(&l2).await.unwrap();
    let (l3, _) = f
        .store
        .acquire(&store::candidate("c"), 60_000)
        .await
        .unwrap();
    let ax = store::assignment(&f.store, &rx.chain.assignment_id).await;
    assert_eq!(
        ax.lifecycle.as_str(),
        "RECOVERY",
        "the takeover ended the chain"
    );
    match f
        .store
        .retarget_eligible(&rx.chain.assignment_id)
        .await
        .unwrap()
    {
        Some(Err(why)) => assert!(why.contains("objective"), "{why}"),
        other => panic!("a start without evidence is not retargetable: {other:?}"),
    }
    let e = offer_for(&f, &l3, &rx.chain.assignment_id, &u, 30_000)
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
}

/// §17 Preactivation retarget/activation race and Post-injection ordinary challenge
/// ordering, both orders. T first: T activated, so the work is RUNNING and no candidate can
/// be offered (recovery would use the RUNNING handoff path). Retarget first: T reached READY
/// (its ACK consumed) and failed; a candidate is offered; T's late activation is refused
/// and changes nothing the candidate bound; the retarget then wins, and T's activation is
/// refused again after it. U has no ordinary challenge until its own contract is injected.
#[tokio::test(flavor = "multi_thread")]
async fn activation_and_retarget_race_in_both_orders_and_exactly_one_wins() {
    let f = store::fx().await;
    let (s, l) = (&f.store, &f.leader);
    let url = pg::server().url(&f.db.name);
    let u = s
        .adopt_lane_incarnation(l, "h2", "h2:w1", &store::uid("li"))
        .await
        .unwrap();

    // T first: activated work is not in recovery; no candidate.
    let t1 = store::running(s, l, &f.lane.lane_incarnation_id).await;
    let e = offer_for(&f, l, &t1.chain().assignment_id, &u, 30_000)
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert_eq!(
        store::count(&url, "SELECT count(*) FROM recovery_candidates").await,
        0
    );

    // Retarget first: T at READY, then its host loses the chain.
    let w2 = s
        .adopt_lane_incarnation(l, store::HOST, "h1:w2", &store::uid("li"))
        .await
        .unwrap();
    let t = store::to_awaiting_ack(s, l, &w2.lane_incarnation_id, None, 60_000).await;
    s.consume_ack(l, &store::ack(l, &t)).await.unwrap();
    let late_activation = store::activation(s, &t).await;
    s.end_chain(l, t.chain(), store::EndCause::Abandoned)
        .await
        .unwrap();
    let asg = t.chain().assignment_id.clone();
    let o = offer(&f, &asg, &u).await;
    let snap: serde_json::Value = json_of(
        &url,
        &format!(
        "SELECT failed_target_snapshot FROM recovery_candidates WHERE recovery_candidate_id = '{}'",
        o.challenge.facts.recovery_candidate_id),
    )
    .await;
    assert_eq!(snap["challenge_consumption_state"], "consumed");
    assert_eq!(snap["ready_state"], "READY");
    assert!(snap["ack_receipt_digest"].is_string());
    assert!(
        s.activate(l, &late_activation).await.is_err(),
        "late T activation"
    );
    let won = s
        .reserve(l, &retarget_req(&o, ack_of(&o), &u.lane_incarnation_id))
        .await
        .unwrap();
    assert!(
        s.activate(l, &late_activation).await.is_err(),
        "T after the retarget"
    );
    assert_eq!(
        store::count(&url, &format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'activate' AND body->'chain'->>'reservation_id' = '{}'",
            t.chain().reservation_id)).await,
        0
    );
    // U's chain has no ordinary challenge until its contract injection is recorded; then
    // it gets its own.
    assert!(s
        .issue_activation_challenge(l, &won.chain, 60_000)
        .await
        .is_err());
    assert_eq!(
        store::count(
            &url,
            &format!(
                "SELECT count(*) FROM challenges WHERE reservation_id = '{}'",
                won.chain.reservation_id
            )
        )
        .await,
        0
    );
}

/// Post-transfer retarget (§6.3.4): a handoff's target T, accepted (responsibility moved),
/// fails before its activation; the candidate binds the accepted handoff's provenance
/// (operation `post-transfer`, the source attempt and the handoff's ACK digest), and waits
/// for the source's generation to be proven ended before U may be reserved.
#[tokio::test(flavor = "multi_thread")]
async fn a_handoff_target_that_fails_after_acceptance_is_retargeted_post_transfer() {
    let f = store::fx().await;
    let (s, l) = (&f.store, &f.leader);
    let url = pg::server().url(&f.db.name);
    let w2 = s
        .adopt_lane_incarnation(l, store::HOST, "h1:w2", &store::uid("li"))
        .await
        .unwrap();
    let u = s
        .adopt_lane_incarnation(l, "h2", "h2:w1", &store::uid("li"))
        .await
        .unwrap();
    let source = store::running(s, l, &f.lane.lane_incarnation_id).await;
    let (c, good, _target) =
        store::handoff_to_challenge(s, l, &source, &w2.lane_incarnation_id).await;
    s.accept_handoff(l, &good).await.unwrap();
    s.end_chain(l, &c, store::EndCause::Abandoned)
        .await
        .unwrap();
    let asg = c.assignment_id.clone();
    let a = store::assignment(s, &asg).await;
    assert_eq!(a.lifecycle.as_str(), "RECOVERY");
    let o = offer(&f, &asg, &u).await;
    assert_eq!(
        o.challenge.facts.expected_retarget_operation,
        "post-transfer"
    );
    let snap: serde_json::Value = json_of(
        &url,
        &format!(
        "SELECT failed_target_snapshot FROM recovery_candidates WHERE recovery_candidate_id = '{}'",
        o.challenge.facts.recovery_candidate_id),
    )
    .await;
    assert_eq!(
        snap["source_assignment_attempt_id"],
        source.chain().assignment_attempt_id.as_str()
    );
    assert!(snap["handoff_receipt_digest"]
        .as_str()
        .is_some_and(|d| d.starts_with("sha256:")));
    assert_eq!(
        snap["failed_target_attempt_id"],
        c.assignment_attempt_id.as_str()
    );
    // The source's generation ran and is not yet proven ended: no chain for U.
    let e = s
        .reserve(l, &retarget_req(&o, ack_of(&o), &u.lane_incarnation_id))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    unchanged_at(&f, &o, 2, "source unended").await;
    // Its receipt arrives; a candidate is then consumed.
    s.ingest_termination(
        l,
        store::HOST,
        &store::receipt_for(&source, "stopped", true),
    )
    .await
    .unwrap();
    let o2 = offer(&f, &asg, &u).await;
    let won = s
        .reserve(l, &retarget_req(&o2, ack_of(&o2), &u.lane_incarnation_id))
        .await
        .unwrap();
    let a = store::assignment(s, &asg).await;
    assert_eq!(
        (
            a.responsibility_owner.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        ("h2:w1", None, Some("h2:w1"))
    );
    assert_eq!(
        won.receipt.body["retarget"]["expected_retarget_operation"],
        "post-transfer"
    );
}

/// Pre-transfer retarget (§6.3.3): the source S runs; its handoff's target T fails before
/// its ACK (the offer ends, the work is S's alone again); the candidate binds S's attempt
/// and no handoff receipt, and the CAS that consumes its ACK is the offer to U's lane —
/// `(S,S,U)` with U's fresh target chain — never a plain reservation.
#[tokio::test(flavor = "multi_thread")]
async fn a_handoff_target_that_fails_before_its_ack_is_retargeted_pre_transfer() {
    let f = store::fx().await;
    let (s, l) = (&f.store, &f.leader);
    let url = pg::server().url(&f.db.name);
    let w2 = s
        .adopt_lane_incarnation(l, store::HOST, "h1:w2", &store::uid("li"))
        .await
        .unwrap();
    let u = s
        .adopt_lane_incarnation(l, "h2", "h2:w1", &store::uid("li"))
        .await
        .unwrap();
    let source = store::running(s, l, &f.lane.lane_incarnation_id).await;
    let (c, _good, target) =
        store::handoff_to_challenge(s, l, &source, &w2.lane_incarnation_id).await;
    s.end_chain(l, &c, store::EndCause::Abandoned)
        .await
        .unwrap();
    let asg = c.assignment_id.clone();
    let a = store::assignment(s, &asg).await;
    assert_eq!(
        (
            a.lifecycle.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        ("ACTIVE", Some(store::TARGET), None),
        "the failed offer left the work with its source"
    );
    let o = offer(&f, &asg, &u).await;
    assert_eq!(
        o.challenge.facts.expected_retarget_operation,
        "pre-transfer"
    );
    let snap: serde_json::Value = json_of(
        &url,
        &format!(
        "SELECT failed_target_snapshot FROM recovery_candidates WHERE recovery_candidate_id = '{}'",
        o.challenge.facts.recovery_candidate_id),
    )
    .await;
    assert_eq!(
        snap["source_assignment_attempt_id"],
        source.chain().assignment_attempt_id.as_str()
    );
    assert_eq!(snap["handoff_receipt_digest"], serde_json::Value::Null);
    assert_eq!(
        snap["failed_target_attempt_id"],
        c.assignment_attempt_id.as_str()
    );
    let handoff_req = || mosaic::coordinator::handoff::OfferRequest {
        request_id: store::uid("retarget"),
        assignment_id: asg.clone(),
        target_lane_incarnation_id: u.lane_incarnation_id.clone(),
        task_text: None,
        ttl_ms: 60_000,
    };
    // ACK at snapshot N, then one T mutation (T's host reports its generation ended): the
    // stale candidate allocates nothing; a fresh one is offered from the new snapshot.
    s.ingest_termination(l, store::HOST, &store::receipt_for(&target, "ended", true))
        .await
        .unwrap();
    let e = s
        .offer_handoff_retarget(l, &handoff_req(), &ack_of(&o))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::SnapshotChanged), "{e}");
    let o = offer(&f, &asg, &u).await;
    // A plain reservation cannot consume it (the work is not in recovery, and the reserve
    // CAS takes no pre-transfer candidate).
    let e = s
        .reserve(l, &retarget_req(&o, ack_of(&o), &u.lane_incarnation_id))
        .await
        .unwrap_err();
    assert!(e.category().is_some(), "{e}");
    // Substituted operation: refused by the offer's CAS.
    let mut wrong = ack_of(&o);
    wrong.ack.facts.expected_retarget_operation = "initial".into();
    let e = s
        .offer_handoff_retarget(l, &handoff_req(), &wrong)
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::Mismatch), "{e}");
    assert_eq!(
        store::count(
            &url,
            &format!("SELECT count(*) FROM reservations WHERE assignment_id = '{asg}'")
        )
        .await,
        2,
        "S's and T's only"
    );
    // The exact ACK: the offer to U, (S, S, U).
    let chain = s
        .offer_handoff_retarget(l, &handoff_req(), &ack_of(&o))
        .await
        .unwrap();
    assert_eq!(chain.lane_id, "h2:w1");
    let a = store::assignment(s, &asg).await;
    assert_eq!(
        (
            a.responsibility_owner.as_str(),
            a.execution_owner.as_deref(),
            a.pending_target.as_deref()
        ),
        (store::TARGET, Some(store::TARGET), Some("h2:w1"))
    );
    assert_eq!(
        store::count(&url, &format!(
            "SELECT count(*) FROM handoffs WHERE assignment_id = '{asg}' AND state = 'OFFERED' AND target_reservation_id = '{}'",
            chain.reservation_id)).await,
        1
    );
    assert_eq!(
        store::count(&url, &format!(
            "SELECT count(*) FROM recovery_candidates WHERE recovery_candidate_id = '{}' AND state = 'CONSUMED'",
            o.challenge.facts.recovery_candidate_id)).await,
        1
    );
    let retargeted: serde_json::Value = json_of(
        &url,
        &format!(
            "SELECT to_jsonb(retargeted_by) FROM attempts WHERE assignment_attempt_id = '{}'",
            c.assignment_attempt_id
        ),
    )
    .await;
    assert_eq!(retargeted, o.challenge.facts.recovery_candidate_id.as_str());
}

/// §17 Reservation-chain substitution: T's reservation R1 expires (database time) before
/// T's ACK, and — for another work — after T reached READY. Either way the expiry's
/// end-chain receipt is the evidence, the candidate binds R1's exact facts, T's late
/// activation is refused, and U's chain is a fresh reservation, never R1.
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_reservation_is_retargeted_before_the_ack_and_after_ready() {
    let f = store::fx().await;
    let (s, l) = (&f.store, &f.leader);
    let url = pg::server().url(&f.db.name);
    let u = s
        .adopt_lane_incarnation(l, "h2", "h2:w1", &store::uid("li"))
        .await
        .unwrap();
    let w2 = s
        .adopt_lane_incarnation(l, store::HOST, "h1:w2", &store::uid("li"))
        .await
        .unwrap();
    let v = s
        .adopt_lane_incarnation(l, "h3", "h3:w1", &store::uid("li"))
        .await
        .unwrap();
    // Before the ACK, and after READY (its ACK consumed), each with a 1 s reservation.
    let before = store::to_awaiting_ack(s, l, &f.lane.lane_incarnation_id, None, 1000).await;
    let ready = store::to_awaiting_ack(s, l, &w2.lane_incarnation_id, None, 1000).await;
    s.consume_ack(l, &store::ack(l, &ready)).await.unwrap();
    let late_activation = store::activation(s, &ready).await;
    let deadline = before.res.deadline.clone().max(ready.res.deadline.clone());
    store::sql(&url)
        .await
        .execute(
            &format!(
                "SELECT pg_sleep_until('{deadline}'::timestamptz + interval '5 milliseconds')"
            ),
            &[],
        )
        .await
        .unwrap();
    for (t, target) in [(&before, &u), (&ready, &v)] {
        s.end_chain(l, t.chain(), store::EndCause::Expired)
            .await
            .unwrap();
        let asg = t.chain().assignment_id.clone();
        let o = offer(&f, &asg, target).await;
        let ev: serde_json::Value = json_of(&url, &format!(
            "SELECT objective_failure_evidence FROM recovery_candidates WHERE recovery_candidate_id = '{}'",
            o.challenge.facts.recovery_candidate_id)).await;
        assert!(
            ev["end_chain"]["cause"]
                .as_str()
                .is_some_and(|c| c.contains("expired")),
            "{ev}"
        );
        assert_eq!(ev["reservation_id"], t.chain().reservation_id.as_str());
        let won = s
            .reserve(
                l,
                &retarget_req(&o, ack_of(&o), &target.lane_incarnation_id),
            )
            .await
            .unwrap();
        assert_ne!(won.chain.reservation_id, t.chain().reservation_id);
        assert_eq!(won.chain.lane_incarnation_id, target.lane_incarnation_id);
    }
    assert!(
        s.activate(l, &late_activation).await.is_err(),
        "T's activation after R1 expired"
    );
}
