//! Continuations (spec §14 rule 11): accepted once under the current claim, shown at most
//! once — at the store, with either daemon killed at every step, and end to end.

mod common;
mod pg;
mod store;
mod up;
mod world;

use store::*;
use up::*;
use world::split::*;

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

/// §17 Continuation visibility fault and Stale continuation claimant: the coordinator is
/// killed before and after each commit of a continuation's claim (and of the next epoch's
/// reclaim), acceptance and result, and before it sends the continuation; a restarted coordinator (a new epoch: every old claim is
/// stale) drives it on. Afterwards: accepted exactly once, the loop budget debited once, the
/// harness given it once (one result, no refused result), nothing left open.
#[tokio::test(flavor = "multi_thread")]
async fn a_continuation_is_accepted_exactly_once_whatever_the_coordinator_dies_at() {
    // (point, how many coordinators die there in a row): the second death at the claim is
    // right after the reclaim's commit (a new epoch's claim of a claim left by the first).
    for (point, deaths) in [
        ("after-commit:continuation-create", 1),
        ("after-commit:continuation-claim", 1),
        ("after-commit:continuation-claim", 2),
        ("before-push:continuation", 1),
        ("before-commit:continuation-accept", 1),
        ("after-commit:continuation-accept", 1),
        ("before-commit:continuation-result", 1),
        ("after-commit:continuation-result", 1),
    ] {
        let mut w = Split::new(1);
        let a = w.assign(1, "take-continuations").unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        w.crash_coordinator(0);
        w.start_coordinator(0, Some(&format!("{point}=return")));
        w.wait_leading(0);
        w.wait_host_connected();
        let (sock, req) = (
            w.socket(0),
            OperatorRequest::Continue {
                assignment_id: id.clone(),
                next_action: "run the integration tests".into(),
                within_ms: None,
                request_id: Some(format!("crash-{point}-{deaths}")),
            },
        );
        let asked = std::thread::spawn(move || operator_call(&sock, &req));
        w.wait_coordinator_died(0, point);
        let _ = asked.join();
        for _ in 1..deaths {
            w.start_coordinator(0, Some(&format!("{point}=return")));
            w.wait_coordinator_died(0, &format!("{point}, again"));
        }
        w.start_coordinator(0, None);
        w.wait_leading(0);
        w.wait_host_connected();
        // The operator's request may have died with the coordinator before it committed:
        // asking again with the same request id is safe (it lands on the same receipt).
        let again = w.op(&OperatorRequest::Continue {
            assignment_id: id.clone(),
            next_action: "run the integration tests".into(),
            within_ms: None,
            request_id: Some(format!("crash-{point}-{deaths}")),
        });
        assert!(
            again.is_ok()
                || again
                    .as_ref()
                    .is_err_and(|e| e.category == mosaic::coordinator::Category::Conflict),
            "{point}: {again:?}"
        );
        let got = once_answered(
            &w,
            &id,
            "audit WHERE operation LIKE '%continuation-result%'",
        )
        .await;

        assert_eq!(
            got,
            (1, 1, 1, 19, 0),
            "{point}: (continuations, accepts, results, budget left, refused results)"
        );
        let st = w.op(&OperatorRequest::Status).unwrap();
        let me = st["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["assignment_id"] == id.as_str())
            .unwrap()
            .clone();
        assert_eq!(
            (
                me["state"].as_str(),
                me["lane_state"].as_str(),
                me["responsibility_owner"].as_str(),
                me["execution_owner"].as_str()
            ),
            (
                Some("ACTIVE"),
                Some("RUNNING"),
                Some(w.lane(1).as_str()),
                Some(w.lane(1).as_str())
            ),
            "{point}: the work keeps running with its owners"
        );
        w.stop_final(&id);
    }
}

/// Once `id`'s one continuation has its result: (continuations, accepts, results, loop
/// budget left, rows of `also`: `FROM …` of what must not have happened).
async fn once_answered(w: &Split, id: &str, also: &str) -> (i64, i64, i64, i64, i64) {
    once_settled(w, id, "RESULT_RECORDED", also).await
}

/// As `once_answered`, once `id`'s one continuation is in state `settled`.
async fn once_settled(w: &Split, id: &str, settled: &str, also: &str) -> (i64, i64, i64, i64, i64) {
    w.wait_count(
        &format!("SELECT count(*) FROM continuations WHERE assignment_id = '{id}' AND state = '{settled}'"),
        |n| n == 1,
        &format!("{id}: the continuation {settled}"),
    )
    .await;
    let row = w
        .sql()
        .await
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM continuations WHERE assignment_id = '{id}'), \
                        (SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-accept' AND body->>'assignment_id' = '{id}'), \
                        (SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-result' AND body->>'assignment_id' = '{id}'), \
                        (SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{id}'), \
                        (SELECT count(*) FROM {also})"
            ),
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

/// §17 Stale continuation claimant: the leader claims a continuation and is paused (SIGSTOP
/// past its lease) after the claim's commit, before it sends it; the standby takes over under
/// a new epoch, reclaims it and drives it on; then the old claimant resumes and goes on from
/// where it stopped. Its post-claim steps fail (nothing commits under its epoch again: no
/// acceptance, no result), it ends a standby, and the continuation is accepted once, debited
/// once and answered once (one result: the harness was given it once), under the new epoch.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_old_claimant_neither_delivers_nor_accepts_a_continuation() {
    let mut w = Split::new(1);
    let a = w.assign(1, "take-continuations").unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    w.crash_coordinator(0);
    // Held right after its claim commits, until the test lets it go (after its epoch ended).
    let go = w.dir.join("go-claim");
    w.start_coordinator(
        0,
        Some(&format!(
            "hold-after-commit:continuation-claim=1*return({})",
            go.display()
        )),
    );
    let first = w.wait_leading(0);
    w.wait_host_connected();
    w.start_coordinator(1, None);
    let (sock, req) = (
        w.socket(0),
        OperatorRequest::Continue {
            assignment_id: id.clone(),
            next_action: "run the integration tests".into(),
            within_ms: None,
            request_id: Some("stale-claimant".into()),
        },
    );
    let asked = std::thread::spawn(move || operator_call(&sock, &req));
    w.wait_count(
        &format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-claim' \
             AND coordinator_epoch = {first} AND assignment_id = '{id}'"
        ),
        |n| n >= 1,
        "the old leader's claim",
    )
    .await;
    let pid = nix::unistd::Pid::from_raw(w.coord_pid(0));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let second = w.wait_leading(1);
    assert!(second > first, "the standby leads under a new epoch");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    std::fs::write(&go, b"").unwrap();
    let _ = asked.join();
    w.wait_host_connected();
    let got = once_answered(
        &w,
        &id,
        &format!(
            "transition_receipts WHERE coordinator_epoch = {first} \
             AND transition IN ('continuation-accept', 'continuation-result')"
        ),
    )
    .await;
    let reclaimed = w
        .count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-claim' \
             AND (assignment_id = '{id}' OR body->>'assignment_id' = '{id}') AND coordinator_epoch > {first}"
        ))
        .await;

    assert_eq!(
        got,
        (1, 1, 1, 19, 0),
        "(continuations, accepts, results, budget left, accepts or results under the old epoch)"
    );
    assert!(
        reclaimed >= 1,
        "the new epoch reclaimed it before it was accepted"
    );
    let old = operator_call(&w.socket(0), &OperatorRequest::Status).unwrap();
    assert_eq!(old["leadership"]["state"], "standby", "{old}");
    w.invariants().await;
    w.stop_final(&id);
}

/// §17 Continuation injection crash: the supervisor dies after a continuation was accepted
/// and handed to its harness. The restarted supervisor re-adopts the generation and serves its
/// lane socket again, but never shows a continuation another process accepted: it is not
/// accepted or debited again, nothing else is accepted while it is open, and it ends
/// abandoned, never re-injected.
#[tokio::test(flavor = "multi_thread")]
async fn a_supervisor_killed_before_delivery_never_delivers_a_continuation_late() {
    let mut w = Split::new(1);
    let a = w.assign(1, "take-continuations busy=30").unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    // The first continuation keeps the harness busy (unsettled) for 30 s.
    w.op(&OperatorRequest::Continue {
        assignment_id: id.clone(),
        next_action: "first".into(),
        within_ms: None,
        request_id: None,
    })
    .unwrap();
    w.wait_count(
        &format!("SELECT count(*) FROM continuations WHERE assignment_id = '{id}' AND state = 'DELIVERY_ACCEPTED'"),
        |n| n == 1,
        "the first continuation's acceptance",
    )
    .await;
    w.crash_supervisor();
    w.start_supervisor();
    w.wait_host_connected();
    // The accepted one's visibility is the harness's business now; it is never re-sent as
    // a new delivery, and nothing else can be accepted while it is open.
    let second = w.op(&OperatorRequest::Continue {
        assignment_id: id.clone(),
        next_action: "second".into(),
        within_ms: Some(2000),
        request_id: None,
    });
    assert_eq!(
        second.unwrap_err().category,
        mosaic::coordinator::Category::Conflict
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'continuation-accept' AND body->>'assignment_id' = '{id}'"
        ))
        .await,
        1
    );
    assert_eq!(
        w.count(&format!(
            "SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{id}'"
        ))
        .await,
        19
    );
    // Stopping the generation abandons the accepted continuation: never re-injected.
    w.stop_final(&id);
    assert_eq!(
        w.count(&format!("SELECT count(*) FROM continuations WHERE assignment_id = '{id}' AND state = 'ABANDONED'")).await,
        1
    );
}

/// Spec §14 rule 11, end to end: a continuation reaches the live generation only at a
/// settled boundary, is accepted once (loop budget debited once), and its result recorded;
/// one open continuation per assignment.
#[tokio::test(flavor = "multi_thread")]
async fn a_continuation_reaches_a_settled_harness_once_and_its_result_is_recorded() {
    let up = Up::start(2);
    let lane = up.lane_id(1);
    let a = up.assign(&lane, "take-continuations busy=1");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let r = up
        .cli(&[
            "continue",
            "--assignment",
            &id,
            "--next-action",
            "run the integration tests",
        ])
        .unwrap_or_else(|e| panic!("continue: {e}"));
    let cn = r["continuation_id"].as_str().unwrap().to_string();
    // While the first one is open, a second is refused.
    let err = up
        .cli(&[
            "continue",
            "--assignment",
            &id,
            "--next-action",
            "and then the docs",
        ])
        .unwrap_err();
    assert!(err.contains("conflict"), "{err}");
    up.continuation_reaches(&cn, "RESULT_RECORDED", "the continuation's result")
        .await;
    // The second continuation arrives while the harness is busy with nothing (settled) —
    // and a third only after the second's result.
    let r2 = up
        .cli(&[
            "continue",
            "--assignment",
            &id,
            "--next-action",
            "and then the docs",
        ])
        .unwrap();
    let cn2 = r2["continuation_id"].as_str().unwrap().to_string();
    up.continuation_reaches(&cn2, "RESULT_RECORDED", "the second continuation's result")
        .await;
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE assignment_id IS NULL AND transition = 'continuation-accept' \
             AND body->>'assignment_id' = '{id}'"
        ))
        .await,
        2,
        "each continuation accepted exactly once"
    );
    assert_eq!(
        up.count(&format!(
            "SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{id}'"
        ))
        .await,
        18,
        "the loop budget was debited once per continuation"
    );
    assert_eq!(
        up.count("SELECT count(*) FROM audit WHERE operation LIKE '%continuation%' AND operation <> 'continuation-create'")
            .await,
        0,
        "no refused delivery, acceptance or result"
    );
    // `status` shows where the work's continuations stand.
    let st = up.assignment(&id);
    assert_eq!(st["continuation"]["state"], "RESULT_RECORDED");
    assert_eq!(st["continuation"]["continuation_id"], cn2.as_str());
    assert_eq!(st["continuation_budget"], 18);
    // A harness that never settles (it never waits for a continuation) is never given one:
    // the offer lapses undelivered and the loop budget is untouched.
    let lane2 = up.lane_id(2);
    let b = up.assign(&lane2, "hang");
    let busy = b["assignment_id"].as_str().unwrap().to_string();
    let r3 = up
        .cli(&[
            "continue",
            "--assignment",
            &busy,
            "--next-action",
            "anything",
            "--within-ms",
            "2000",
        ])
        .unwrap();
    let cn3 = r3["continuation_id"].as_str().unwrap().to_string();
    up.continuation_reaches(&cn3, "EXPIRED", "the undeliverable continuation's expiry")
        .await;
    assert_eq!(
        up.count(&format!(
            "SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{busy}'"
        ))
        .await,
        20
    );
    up.cli(&["stop", "--assignment", &id]).unwrap();
    up.cli(&["stop", "--assignment", &busy]).unwrap();
    assert_eq!(up.count("SELECT count(*) FROM continuations WHERE state IN ('PENDING', 'CLAIMED', 'DELIVERY_ACCEPTED')").await, 0);
}

/// §17 Continuation visibility fault and Continuation injection crash, on the host: the
/// supervisor SIGKILLs itself at each step of its side of a continuation — the harness
/// settled, before its acceptance is sent (`continuation-accept`); the acceptance committed,
/// before the harness is given it (`continuation-deliver`); the harness's result kept, before
/// it is sent (`continuation-result`) — and a fresh supervisor process takes over the living
/// generation. Afterwards the continuation is accepted and debited exactly once and either
/// answered with the harness's one result (never a refused or second one), or — where
/// whether the harness saw it is unknown — abandoned at its deadline and its generation
/// replaced, never given again. The third row failed before a result was kept on disk: it
/// died with the process that heard it, and the work's generation was replaced for a result
/// that had been given.
#[tokio::test(flavor = "multi_thread")]
async fn a_supervisor_killed_at_each_host_step_of_a_continuation_loses_nothing() {
    // (the host's crash point, whether the harness's result survives it)
    for (point, answered) in [
        ("continuation-accept", true),
        ("continuation-deliver", false),
        ("continuation-result", true),
    ] {
        let mut w = Split::new(1);
        w.crash_supervisor();
        w.sup[0].set_env("FAILPOINTS", Some(format!("host:{point}=return")));
        w.start_supervisor();
        w.wait_host_connected();
        let a = w.assign(1, "take-continuations").unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        let first_generation = w.host_generation(1);
        w.op(&OperatorRequest::Continue {
            assignment_id: id.clone(),
            next_action: "run the integration tests".into(),
            within_ms: Some(10_000),
            request_id: None,
        })
        .unwrap();
        let start = Instant::now();
        while w.sup[0].exited().is_none() {
            assert!(
                start.elapsed() < common::PATIENCE,
                "{point}: the supervisor never reached it"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        w.sup[0].set_env("FAILPOINTS", None);
        w.start_supervisor();
        w.wait_host_connected();
        let settled = if answered {
            "RESULT_RECORDED"
        } else {
            "ABANDONED"
        };
        let got = once_settled(
            &w,
            &id,
            settled,
            "audit WHERE operation LIKE '%continuation-result%'",
        )
        .await;
        assert_eq!(
            got,
            (1, 1, i64::from(answered), 19, 0),
            "{point}: (continuations, accepts, results, budget left, refused results)"
        );
        if answered {
            // The same generation goes on with its owners.
            assert_eq!(w.host_generation(1), first_generation, "{point}");
        } else {
            // Its visibility unknown: the generation is replaced, and the work runs on a
            // fresh one that was never given it.
            let start = Instant::now();
            while w.host_generation(1).is_none() || w.host_generation(1) == first_generation {
                assert!(
                    start.elapsed() < common::PATIENCE,
                    "{point}: the generation was never replaced"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            w.wait_count(
                &format!("SELECT count(*) FROM assignments WHERE assignment_id = '{id}' AND lifecycle = 'ACTIVE' AND execution_owner IS NOT NULL"),
                |n| n == 1,
                &format!("{point}: the work running again"),
            )
            .await;
        }
        let log = std::fs::read_to_string(w.supervisor_log(0)).unwrap();
        assert!(
            log.contains(&format!("failpoint=host:{point}")),
            "{point} never fired"
        );
        w.invariants().await;
        w.stop_final(&id);
    }
}

/// A supervisor killed with the coordinator's activation in hand, before it recorded it
/// (the coordinator has the generation RUNNING; the host's record says not activated):
/// the restarted supervisor serves the generation's lane socket again from the chain
/// fields it recorded at injection, takes the activation the coordinator sends again, and
/// the generation takes a continuation once and has its result recorded. (It was once left
/// running but unreachable: every continuation refused as for a generation it could not
/// reach, until it expired.)
#[tokio::test(flavor = "multi_thread")]
async fn a_supervisor_killed_before_it_recorded_the_activation_serves_the_generation_again() {
    let mut w = Split::new(1);
    w.crash_supervisor();
    w.sup[0].set_env("FAILPOINTS", Some("host:activate=return".into()));
    w.start_supervisor();
    w.wait_host_connected();
    let a = w.assign(1, "take-continuations").unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let start = Instant::now();
    while w.sup[0].exited().is_none() {
        assert!(
            start.elapsed() < common::PATIENCE,
            "the supervisor never reached the activation"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let generation = w
        .sql()
        .await
        .query_one(
            "SELECT max(generation) FROM reservations WHERE assignment_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get::<_, i64>(0) as u64;
    w.sup[0].set_env("FAILPOINTS", None);
    w.start_supervisor();
    w.wait_host_connected();
    assert_eq!(
        w.host_generation(1),
        Some(generation),
        "the generation was replaced"
    );
    w.op(&OperatorRequest::Continue {
        assignment_id: id.clone(),
        next_action: "run the integration tests".into(),
        within_ms: Some(30_000),
        request_id: None,
    })
    .unwrap();
    let got = once_answered(
        &w,
        &id,
        "audit WHERE operation LIKE '%continuation-result%'",
    )
    .await;
    assert_eq!(
        got,
        (1, 1, 1, 19, 0),
        "(continuations, accepts, results, budget left, refused results)"
    );
    assert_eq!(
        w.host_generation(1),
        Some(generation),
        "the generation was replaced"
    );
    let log = std::fs::read_to_string(w.supervisor_log(0)).unwrap();
    assert!(log.contains("failpoint=host:activate"), "never fired");
    assert!(
        !log.contains("continuation-unreachable-generation"),
        "the re-adopted generation was unreachable"
    );
    w.invariants().await;
    w.stop_final(&id);
}
