//! Handoff (spec §8.1): responsibility moves only by the target's ACK — at the store, with
//! the coordinator killed around it, and end to end.

mod common;
mod pg;
mod store;
mod up;
mod world;

use store::*;
use up::*;
use world::split::*;

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
    let forged: [Forge; 16] = [
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
        // Work without a workspace has no checkpoint: naming one is a substitution too.
        ("checkpoint", |a| a.checkpoint_digest = Some(d('4'))),
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
        "checkpoint" => "checkpoint_digest differs",
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
    // Not while the source generation drains (execution owner null): only once its
    // receipt proves it ended.
    assert_eq!(
        category(s.activate(l, &activation(s, &t).await).await),
        Category::Unreconciled
    );
    assert_eq!(state(s, "h1:w2").await, "READY");
    s.ingest_termination(l, HOST, &receipt_for(&source, "quit", true))
        .await
        .unwrap();
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

/// §17 Lease-transfer race: a handoff's acceptance racing the source's lease renewals and a
/// second accept of the same challenge. Either order is fine; exactly one accept decides,
/// afterwards the source holds no lease, every renewal after the accept was refused, and
/// every loser is audited.
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
    // Two accepts racing for the one challenge (the same claim with another ACK digest: a
    // second envelope): exactly one decides, the loser is refused and audited.
    let mut rival = good.clone();
    rival.ack_digest = d('7');
    let (a, b) = tokio::join!(s.accept_handoff(l, &good), s.accept_handoff(l, &rival));
    let (accepted, lost) = match (a, b) {
        (Ok(r), Err(e)) | (Err(e), Ok(r)) => (r.decided_at, e),
        (a, b) => panic!("two accepts of one challenge: {a:?} / {b:?}"),
    };
    assert!(
        matches!(
            lost.category(),
            Some(Category::IdempotencyConflict | Category::ChallengeConsumed)
        ),
        "{lost}"
    );
    let mut refused_renewals = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(at) => assert!(
                at < accepted,
                "a renewal decided after the handoff: {at} vs {accepted}"
            ),
            Err(e) => {
                assert_eq!(e.category(), Some(Category::WrongState), "{e}");
                refused_renewals += 1;
            }
        }
    }
    // Every loser of the race is on the audit log: the accept that lost, and each renewal
    // refused after the transfer.
    let audited = |op: &'static str, want: i64| {
        let url = f.db.url.clone();
        async move {
            let q = format!("SELECT count(*) FROM audit WHERE operation = '{op}'");
            let start = std::time::Instant::now();
            loop {
                let n = count(&url, &q).await;
                if n >= want {
                    return n;
                }
                assert!(
                    start.elapsed() < common::PATIENCE,
                    "timed out waiting for {want} audited {op} refusals (have {n})"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    };
    audited("handoff-accept", 1).await;
    audited("renew-leases", refused_renewals).await;
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
    // The target waits for the source's end; the source's receipt ends the source
    // generation, not the work, and the target activates.
    assert_eq!(
        category(s.activate(l, &activation(s, &t2).await).await),
        Category::Unreconciled
    );
    s.ingest_termination(l, HOST, &receipt_for(&source, "quit", true))
        .await
        .unwrap();
    s.activate(l, &activation(s, &t2).await).await.unwrap();
    s.request_end(l, &asg, Outcome::Completed, Some(&d('e')))
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

/// The boundaries of a handoff (`false`) and of an inactivity replacement (`true`) the
/// coordinator is SIGKILLed at: the ownership steps themselves (offer, acceptance and
/// replacement, each of which fences the old generation itself), the old generation's
/// drain (its receipt ingested), the target's
/// activation challenge, and the new generation's activation (the work's second
/// `activate`: `1*off->return` passes the first, the source's own).
const OWNERSHIP_BOUNDARIES: &[(&str, bool)] = &[
    ("before-commit:handoff-offer", false),
    ("after-commit:handoff-offer", false),
    ("before-commit:handoff-accept", false),
    ("after-commit:handoff-accept", false),
    ("after-commit:ingest-termination", false),
    ("after-commit:activation-challenge", false),
    ("after-commit:activate=1*off->return", false),
    ("before-commit:inactivity-replace", true),
    ("after-commit:inactivity-replace", true),
    ("after-commit:ingest-termination", true),
    ("after-commit:activate=1*off->return", true),
];

/// §17 Nonterminal replacement crash and Prior-owner handoff effect under a coordinator
/// SIGKILL at every ownership boundary of a handoff and of an inactivity replacement
/// (`OWNERSHIP_BOUNDARIES`): there is never more than one live (executing) generation of
/// the work, and afterwards never a lease on a lane the work left, never an open offer, and
/// the work is either running with its owner or in recovery — never lost, never doubled.
#[tokio::test(flavor = "multi_thread")]
async fn responsibility_survives_a_coordinator_killed_around_handoff_and_replacement() {
    for &(spec, replace) in OWNERSHIP_BOUNDARIES {
        let mut w = Split::new(2);
        let spec = if spec.contains('=') {
            spec.to_string()
        } else {
            format!("{spec}=return")
        };
        let point = spec.split('=').next().unwrap_or_default().to_string();
        let point = format!(
            "{point} ({})",
            if replace { "replacement" } else { "handoff" }
        );
        let point = point.as_str();
        w.crash_coordinator(0);
        w.start_coordinator(0, Some(&spec));
        w.wait_leading(0);
        w.wait_host_connected();
        let policy = if replace {
            w.op(&OperatorRequest::PolicyPublish {
                policy: mosaic::coordinator::continuity::InactivityPolicy {
                    policy_id: "crash-fast@1".into(),
                    warn_after_ms: 300,
                    escalate_after_ms: 600,
                    replace_after_ms: 1000,
                    replacements_before_reassign: 1,
                    max_attempts: 3,
                    exhaustion: "blocked".into(),
                    evidence_kinds: vec!["test-result".into()],
                },
                request_id: None,
            })
            .unwrap();
            Some("crash-fast@1".to_string())
        } else {
            None
        };
        let mut req = assign_req(&w.lane(1), "hang", None);
        if let OperatorRequest::Assign {
            inactivity_policy, ..
        } = &mut req
        {
            *inactivity_policy = policy;
        }
        let a = w.op(&req).unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        if !replace {
            let (sock, req) = (
                w.socket(0),
                OperatorRequest::Handoff {
                    assignment_id: id.clone(),
                    lane_id: w.lane(2),
                    task: Some("accept-handoff hang".into()),
                    within_ms: None,
                    request_id: None,
                },
            );
            std::thread::spawn(move || operator_call(&sock, &req));
        }
        w.wait_coordinator_died(0, point);
        w.start_coordinator(0, None);
        w.wait_leading(0);
        w.wait_host_connected();
        // Settled: the work runs somewhere, or waits in recovery, with every stopped
        // generation's receipt in.
        let start = Instant::now();
        let (lifecycle, exec) = loop {
            let r = w
                .sql()
                .await
                .query_one(
                    &format!(
                        "SELECT a.lifecycle, a.execution_owner, \
                                (SELECT count(*) FROM reservations r JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id \
                                 AND g.generation = r.generation WHERE r.assignment_id = a.assignment_id AND g.state <> 'ENDED'), \
                                (SELECT count(*) FROM lane_incarnations li WHERE li.state NOT IN ('IDLE_CLEAN', 'RUNNING') AND li.retired_at IS NULL), \
                                (SELECT count(*) FROM reservations r JOIN generations g ON g.lane_incarnation_id = r.lane_incarnation_id \
                                 AND g.generation = r.generation WHERE r.assignment_id = a.assignment_id AND g.state = 'LIVE') \
                         FROM assignments a WHERE a.assignment_id = '{id}'"
                    ),
                    &[],
                )
                .await
                .unwrap();
            let (lifecycle, exec, unended, busy, live): (String, Option<String>, i64, i64, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
            assert!(
                live <= 1,
                "{point}: two live (executing) generations of one assignment"
            );
            if busy == 0
                && ((lifecycle == "ACTIVE" && exec.is_some() && unended == 1)
                    || (lifecycle == "RECOVERY" && unended == 0))
            {
                break (lifecycle, exec);
            }
            assert!(
                start.elapsed() < common::PATIENCE,
                "{point}: never settled ({lifecycle}, {exec:?}, {unended}, {busy})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Owner counts: one responsible owner, at most one executing lane, and open leases
        // only on the lane that executes.
        let leases = w
            .sql()
            .await
            .query(
                &format!(
                    "SELECT DISTINCT li.lane_id FROM leases l JOIN lane_incarnations li USING (lane_incarnation_id) \
                     WHERE l.assignment_id = '{id}' AND l.released_at IS NULL"
                ),
                &[],
            )
            .await
            .unwrap();
        let leased: Vec<String> = leases.iter().map(|r| r.get(0)).collect();
        match (&lifecycle[..], &exec) {
            ("ACTIVE", Some(lane)) => assert_eq!(
                leased,
                vec![lane.clone()],
                "{point}: leases off the executing lane"
            ),
            _ => assert!(
                leased.is_empty(),
                "{point}: work in recovery holds leases {leased:?}"
            ),
        }
        assert_eq!(
            w.count(&format!("SELECT count(*) FROM handoffs WHERE assignment_id = '{id}' AND state IN ('OFFERED', 'CHALLENGED')")).await,
            0,
            "{point}: an offer left open"
        );
        if lifecycle == "ACTIVE" {
            w.stop_final(&id);
        }
    }
}

/// Spec §8.1 and §17 rows Unacknowledged handoff, Prior-owner handoff effect and
/// Handoff/activation confusion, end to end: an offer the target never acknowledges moves
/// nothing; an acknowledged one moves responsibility, fences the source, and the target
/// still goes through its own activation challenge and ACK before it runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_handoff_moves_responsibility_only_by_its_ack_and_the_target_still_activates() {
    let up = Up::start(3);
    let (lane1, lane2, lane3) = (up.lane_id(1), up.lane_id(2), up.lane_id(3));
    let a = up.assign(&lane1, "hang");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let source_generation = a["generation"].as_i64().unwrap();

    // 1. Unacknowledged: the target's harness never says handoff-ack.
    let r = up
        .cli(&[
            "handoff",
            "--assignment",
            &id,
            "--to",
            &lane2,
            "--task",
            "hang",
            "--within-ms",
            "3000",
        ])
        .unwrap_or_else(|e| panic!("handoff: {e}"));
    assert!(r["handoff_id"].is_string(), "{r}");
    let s = up.assignment(&id);
    assert_eq!(s["work_status"], "handoff");
    assert_eq!(
        (
            s["responsibility_owner"].as_str(),
            s["execution_owner"].as_str(),
            s["pending_target"].as_str()
        ),
        (
            Some(lane1.as_str()),
            Some(lane1.as_str()),
            Some(lane2.as_str())
        ),
        "an offer is not a transfer"
    );
    // A stop during the offer is refused, and a second offer is refused.
    let err = up
        .cli(&["stop", "--assignment", &id, "--no-wait"])
        .unwrap_err();
    assert!(err.contains("handoff"), "{err}");
    let err = up
        .cli(&["handoff", "--assignment", &id, "--to", &lane3])
        .unwrap_err();
    assert!(err.contains("wrong-state"), "{err}");
    wait_for("the unacknowledged offer to expire", || {
        let s = up.assignment(&id);
        (s["work_status"] == "active" && s["pending_target"].is_null()).then_some(s)
    });
    let s = up.assignment(&id);
    assert_eq!(
        (
            s["state"].as_str(),
            s["responsibility_owner"].as_str(),
            s["execution_owner"].as_str(),
            s["lane_state"].as_str()
        ),
        (
            Some("ACTIVE"),
            Some(lane1.as_str()),
            Some(lane1.as_str()),
            Some("RUNNING")
        ),
        "the work stayed with its source"
    );
    assert_eq!(s["generation"].as_i64().map(|_| ()), Some(()));
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM handoffs WHERE assignment_id = '{id}' AND state = 'EXPIRED'"
        ))
        .await,
        1
    );
    assert_eq!(
        up.count(&format!("SELECT count(*) FROM generations g JOIN reservations r USING (reservation_id) \
                           WHERE r.assignment_id = '{id}' AND g.lane_incarnation_id = (SELECT lane_incarnation_id FROM lane_incarnations WHERE lane_id = '{lane1}' AND retired_at IS NULL) AND g.state = 'LIVE'")).await,
        1,
        "the source generation still runs"
    );
    wait_for("the target lane to be clean again", || {
        (up.lane_state(&lane2) == "IDLE_CLEAN").then_some(())
    });

    // 2. Acknowledged: the target harness acknowledges the handoff, then its own activation.
    let before_leases = up
        .count(&format!("SELECT count(*) FROM leases l JOIN lane_incarnations li USING (lane_incarnation_id) WHERE li.lane_id = '{lane1}' AND l.released_at IS NULL"))
        .await;
    assert!(before_leases > 0, "the source holds its effect lease");
    up.cli(&[
        "handoff",
        "--assignment",
        &id,
        "--to",
        &lane3,
        "--task",
        "accept-handoff hang",
    ])
    .unwrap_or_else(|e| panic!("handoff: {e}"));
    let s = wait_for("the target to run", || {
        let s = up.assignment(&id);
        (s["lane_id"] == lane3.as_str() && s["lane_state"] == "RUNNING").then_some(s)
    });
    assert_eq!(
        (
            s["responsibility_owner"].as_str(),
            s["execution_owner"].as_str(),
            s["pending_target"].as_str(),
            s["work_status"].as_str()
        ),
        (
            Some(lane3.as_str()),
            Some(lane3.as_str()),
            None,
            Some("active")
        )
    );
    // The order of decisions: accept, then the target's activation challenge and ACK, then
    // activation — the handoff receipt granted nothing by itself.
    let order = |t: &str| {
        format!(
        "SELECT coalesce(min(decided_at) FILTER (WHERE transition = '{t}'), 'infinity') < \
                coalesce(min(decided_at) FILTER (WHERE transition = 'activation-challenge'), '-infinity') \
         FROM transition_receipts WHERE assignment_id = '{id}'"
    )
    };
    let (c, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let accepted_first: bool = c
        .query_one(&order("handoff-accept"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        accepted_first,
        "the activation challenge came before the handoff was accepted"
    );
    let row = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM transition_receipts WHERE assignment_id = '{id}' AND transition = 'handoff-accept'), \
                        (SELECT count(*) FROM transition_receipts WHERE assignment_id = '{id}' AND transition = 'activate'), \
                        (SELECT count(*) FROM challenges c JOIN reservations r USING (reservation_id) WHERE r.assignment_id = '{id}'), \
                        (SELECT count(*) FROM handoffs WHERE assignment_id = '{id}' AND state = 'ACCEPTED')"
            ),
            &[],
        )
        .await
        .unwrap();
    let counts: (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(
        counts,
        (1, 2, 2, 1),
        "(accepts, activations, activation challenges, accepted handoffs)"
    );
    // The prior owner holds nothing: its leases are revoked, its generation ended with a
    // verified receipt, its lane is clean.
    wait_for("the source generation's receipt", || {
        (up.lane_state(&lane1) == "IDLE_CLEAN").then_some(())
    });
    assert_eq!(
        up.count(&format!("SELECT count(*) FROM leases l JOIN lane_incarnations li USING (lane_incarnation_id) WHERE li.lane_id = '{lane1}' AND l.released_at IS NULL")).await,
        0
    );
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM termination_receipts WHERE assignment_id = '{id}' AND lane_id = '{lane1}' AND generation = {source_generation} AND verified_empty"
        ))
        .await,
        1
    );
    up.cli(&["stop", "--assignment", &id]).unwrap();
}

/// §17 Unacknowledged handoff: while an offer waits for an ACK that never comes, the work
/// stays its sender's and the inactivity watchdog still fires — warned, escalated, and at
/// its deadline the source replaced, which withdraws the offer — and the work goes on
/// under its sender in a fresh generation.
#[tokio::test(flavor = "multi_thread")]
async fn an_unacknowledged_handoff_is_still_watched_for_inactivity() {
    let up = Up::start(2);
    let (lane1, lane2) = (up.lane_id(1), up.lane_id(2));
    publish_policy(&up, "handoff-stall@1", 600, 1200, 2500, 1, 3);
    let a = assign_under(&up, &lane1, "hang", "handoff-stall@1");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let source_generation = a["generation"].as_i64().unwrap();
    up.cli(&[
        "handoff",
        "--assignment",
        &id,
        "--to",
        &lane2,
        "--task",
        "hang",
        "--within-ms",
        "600000",
    ])
    .unwrap_or_else(|e| panic!("handoff: {e}"));
    let s = wait_for("the watchdog escalating the offered work", || {
        let s = up.assignment(&id);
        (s["watchdog_step"] == "escalated").then_some(s)
    });
    assert_eq!(s["work_status"], "handoff", "{s}");
    assert_eq!(s["responsibility_owner"], lane1.as_str(), "{s}");
    wait_for("the offer withdrawn by the source's replacement", || {
        let s = up.assignment(&id);
        (s["work_status"] != "handoff").then_some(())
    });
    let withdrawn = up
        .count(&format!(
            "SELECT count(*) FROM handoffs WHERE assignment_id = '{id}' AND state = 'WITHDRAWN'"
        ))
        .await;
    assert_eq!(withdrawn, 1, "the replacement withdrew the offer");
    // Its target, never to be acknowledged, is ended at once (not at its deadline, ten
    // minutes on): the work's next attempt does not wait for it.
    wait_for("the withdrawn offer's target lane idle again", || {
        (up.lane_state(&lane2) == "IDLE_CLEAN").then_some(())
    });
    let s = wait_for("the work running on under its sender", || {
        let s = up.assignment(&id);
        (s["lane_state"] == "RUNNING"
            && s["generation"]
                .as_i64()
                .is_some_and(|g| g != source_generation)
            && s["execution_owner"].is_string())
        .then_some(s)
    });
    assert_eq!(s["responsibility_owner"], lane1.as_str(), "{s}");
    assert_eq!(s["lane_id"], lane1.as_str(), "{s}");
    let out = up.cli(&["stop", "--assignment", &id]).unwrap();
    assert_eq!(out["state"], "CANCELLED", "{out}");
}

/// One event of a handoff's ownership move, after its challenge reached the target.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Move {
    /// The target's handoff ACK.
    Ack,
    /// The source generation's end (its termination receipt): the source's execution is
    /// revoked for good, whatever the handoff's state.
    SourceEnd,
    /// The source broker's late report of the effect claim it held when the handoff began:
    /// the claim's reconciliation (observed, or reconciled after the source's end).
    ClaimResult,
    /// The target's activation: its activation challenge, ACK, and the activation CAS.
    Activate,
}

/// Every order of the four moves (24).
fn interleavings() -> Vec<[Move; 4]> {
    const ALL: [Move; 4] = [
        Move::Ack,
        Move::SourceEnd,
        Move::ClaimResult,
        Move::Activate,
    ];
    let mut out = Vec::new();
    for a in 0..4 {
        for b in 0..4 {
            for c in 0..4 {
                for d in 0..4 {
                    let idx = [a, b, c, d];
                    let mut seen = [false; 4];
                    idx.iter().for_each(|&i| seen[i] = true);
                    if seen.iter().all(|&x| x) {
                        out.push(idx.map(|i| ALL[i]));
                    }
                }
            }
        }
    }
    out
}

/// Every row the handoff's ownership lives in, as text: "a refused move changed nothing"
/// is this before == after.
async fn ownership_rows(url: &str, asg: &str) -> String {
    let q = format!(
        "SELECT concat_ws(' | ', \
           (SELECT string_agg(a::text, ';') FROM assignments a WHERE assignment_id = '{asg}'), \
           (SELECT string_agg(h::text, ';' ORDER BY h.handoff_id) FROM handoffs h WHERE assignment_id = '{asg}'), \
           (SELECT string_agg(l::text, ';' ORDER BY l.lease_id) FROM leases l WHERE assignment_id = '{asg}'), \
           (SELECT string_agg(r::text, ';' ORDER BY r.reservation_id) FROM reservations r WHERE assignment_id = '{asg}'), \
           (SELECT string_agg(g::text, ';' ORDER BY g.lane_incarnation_id, g.generation) FROM generations g \
              JOIN reservations r USING (reservation_id) WHERE r.assignment_id = '{asg}'), \
           (SELECT string_agg(e::text, ';' ORDER BY e.effect_id) FROM effect_claims e WHERE assignment_id = '{asg}'))"
    );
    sql(url).await.query_one(&q, &[]).await.unwrap().get(0)
}

/// One interleaving of `Move`s, checked after every move against what the ownership must
/// be (see the test below); a mismatch panics naming the order and the moves so far.
async fn bind_interleaving(order: [Move; 4]) {
    use mosaic::coordinator::effects::{EffectClaim, Observed};
    use mosaic::protocol::effects::{self, Executor, Outcome as Observation, Target};
    let f = fx().await;
    let (s, l, url) = (&f.store, &f.leader, f.db.url.as_str());
    let w2 = adopt(s, l, "h1:w2").await;
    let scope = ["repo:demo", "provider", "egress:pypi.org"];
    let source = running_scoped(s, l, &f.lane.lane_incarnation_id, None, &scope, &[]).await;
    let asg = source.chain().assignment_id.clone();
    let (src, tgt) = (source.chain().lane_id.clone(), "h1:w2".to_string());
    let claim = |executor: Executor, target: &str, key: &str| {
        let target = Target::parse(executor, target).unwrap();
        EffectClaim {
            chain: source.chain().clone(),
            generation: source.generation,
            operation_digest: effects::operation_digest(&target, &[key.as_bytes()]),
            target,
            idempotency_key: key.into(),
            responsibility_owner: src.clone(),
            execution_owner: src.clone(),
            process_identity: source.identity.clone(),
            fence_reference: "fp1:reference".into(),
            scope_digest: source.scope_digest.clone(),
            holds_digest: source.holds_digest.clone(),
        }
    };
    // The source holds an egress claim (settled only by an observation or by hand) when
    // the handoff begins.
    let held = s
        .admit_effect(l, &claim(Executor::Egress, "egress:pypi.org:443", "held"))
        .await
        .unwrap();
    let (c, good, mut t) = handoff_to_challenge(s, l, &source, &w2.lane_incarnation_id).await;
    let (mut acked, mut ended, mut resulted, mut activated) = (false, false, false, false);
    let mut target_ack_consumed = false;
    let mut probe = 0;
    let run = format!("{order:?}");
    let mut done: Vec<Move> = Vec::new();
    // The target's activation, from wherever it got to: a refusal at any sub-step changes
    // nothing and the next attempt resumes there.
    macro_rules! activate {
        () => {{
            let mut r: Result<(), AuthorityError> = Ok(());
            if !target_ack_consumed {
                r = match s.issue_activation_challenge(l, &c, 60_000).await {
                    Ok(ch) => {
                        t.challenge = ch.str("challenge_id").unwrap();
                        s.consume_ack(l, &ack(l, &t)).await.map(|_| ())
                    }
                    Err(e) => Err(e),
                };
                target_ack_consumed = r.is_ok();
            }
            if r.is_ok() {
                r = s.activate(l, &activation(s, &t).await).await.map(|_| ());
            }
            r
        }};
    }
    for (i, &m) in order.iter().chain([Move::Activate].iter()).enumerate() {
        // After the four moves, one more activation: the interleaving's settled end.
        if i == 4 && (activated || !acked) {
            break;
        }
        let at = format!("{run}: after {done:?}, {m:?}");
        let before = ownership_rows(url, &asg).await;
        let (result, want_ok) = match m {
            Move::Ack => {
                let r = s.accept_handoff(l, &good).await.map(|_| ());
                // Only the source's live execution can hand on: once it ended first, the
                // offer was withdrawn with it and the work went to recovery.
                (r, !acked && !ended)
            }
            Move::SourceEnd => {
                let r = s
                    .ingest_termination(l, HOST, &receipt_for(&source, "quit", true))
                    .await
                    .map(|_| ());
                (r, !ended)
            }
            Move::ClaimResult => {
                let o = Observed {
                    effect_id: held.effect_id.clone(),
                    outcome: Observation::Completed,
                    result_digest: d('9'),
                    input_tokens: None,
                    output_tokens: None,
                };
                let r = s
                    .record_effect_result(l, source.chain(), source.generation, &o)
                    .await
                    .map(|_| ());
                (r, !resulted)
            }
            // The target activates only after its ACK moved the responsibility, the
            // source's execution is proven ended, and no effect the source claimed is left
            // unsettled.
            Move::Activate => (activate!(), acked && ended && resulted && !activated),
        };
        assert_eq!(result.is_ok(), want_ok, "{at}: {result:?}");
        if let Err(e) = &result {
            // Whatever the sub-step that refused, the activation's own rows aside, nothing
            // about the ownership moved.
            if m != Move::Activate {
                assert_eq!(
                    ownership_rows(url, &asg).await,
                    before,
                    "{at}: a refusal changed rows"
                );
            }
            assert!(e.category().is_some(), "{at}: untyped refusal {e}");
        }
        if result.is_ok() {
            match m {
                Move::Ack => acked = true,
                Move::SourceEnd => ended = true,
                Move::ClaimResult => resulted = true,
                Move::Activate => activated = true,
            }
        }
        done.push(m);
        // The owners: exactly one responsible owner; the source executes only before the
        // transfer, nobody during the drain, the target only from its activation; the
        // pending target is kept until the activation.
        let a = assignment(s, &asg).await;
        let owners = (
            a.lifecycle.to_string(),
            a.responsibility_owner.clone(),
            a.execution_owner.clone(),
            a.pending_target.clone(),
        );
        let want = if activated {
            ("ACTIVE", tgt.clone(), Some(tgt.clone()), None)
        } else if acked {
            ("ACTIVE", tgt.clone(), None, Some(tgt.clone()))
        } else if ended {
            ("RECOVERY", src.clone(), None, None)
        } else {
            ("ACTIVE", src.clone(), Some(src.clone()), Some(tgt.clone()))
        };
        assert_eq!(
            owners,
            (want.0.to_string(), want.1, want.2, want.3),
            "{at}: owners"
        );
        // The source renews its leases only while it owns the execution, and claims no new
        // effect at all once an offer is pending; each refusal changes nothing.
        let source_may = !acked && !ended;
        probe += 1;
        let before = ownership_rows(url, &asg).await;
        let renewed = s.renew_leases(l, source.chain(), 60_000).await;
        assert_eq!(
            renewed.is_ok(),
            source_may,
            "{at}: source renewal {renewed:?}"
        );
        let claimed = s
            .admit_effect(
                l,
                &claim(Executor::Provider, "provider", &format!("probe-{probe}")),
            )
            .await;
        assert_eq!(
            claimed.as_ref().map_err(|e| e.category()).err(),
            Some(Some(Category::WrongState)),
            "{at}: a source claim under a pending handoff"
        );
        if !source_may {
            assert_eq!(
                ownership_rows(url, &asg).await,
                before,
                "{at}: a source's refused act changed rows"
            );
        }
        // Open leases only where the execution is.
        let open = |res: String| {
            format!("SELECT count(*) FROM leases WHERE reservation_id = '{res}' AND released_at IS NULL")
        };
        let source_leases = count(url, &open(source.chain().reservation_id.clone())).await;
        let target_leases = count(url, &open(c.reservation_id.clone())).await;
        assert_eq!(
            (source_leases > 0, target_leases > 0),
            (source_may, activated),
            "{at}: leases"
        );
        let live = count(
            url,
            &format!(
                "SELECT count(*) FROM generations g JOIN reservations r USING (reservation_id) \
             WHERE r.assignment_id = '{asg}' AND g.state = 'LIVE'"
            ),
        )
        .await;
        assert!(live <= 1, "{at}: {live} live generations of one work");
        // The held claim: settled by its observation; left for its reconciliation owner
        // by the source's end without one.
        let claim_state: String = sql(url)
            .await
            .query_one(
                "SELECT state FROM effect_claims WHERE effect_id = $1",
                &[&held.effect_id],
            )
            .await
            .unwrap()
            .get(0);
        let want_claim = match (resulted, ended) {
            (false, false) => "ADMITTED",
            (false, true) => "UNKNOWN",
            (true, _)
                if order.iter().position(|&x| x == Move::SourceEnd)
                    < order.iter().position(|&x| x == Move::ClaimResult) =>
            {
                "RECONCILED"
            }
            (true, _) => "COMPLETED",
        };
        assert_eq!(claim_state, want_claim, "{at}: the held claim");
    }
    // The settled end: the target runs the work, or (the source ended before the ACK) the
    // work waits in recovery with no offer open and nothing leased.
    let open_offers = count(url, &format!(
        "SELECT count(*) FROM handoffs WHERE assignment_id = '{asg}' AND state IN ('OFFERED', 'CHALLENGED')"
    ))
    .await;
    assert_eq!(open_offers, 0, "{run}: an offer left open");
    if acked {
        assert!(activated, "{run}: the target never activated");
        assert_eq!(state(s, "h1:w2").await, "RUNNING", "{run}");
    } else {
        assert_eq!(assignment(s, &asg).await.lifecycle, "RECOVERY", "{run}");
    }
}

/// §17 Authority-owner handoff binding: every interleaving of the target's handoff ACK, the
/// source's revocation (its generation's end), the reconciliation of an effect claim the
/// source held, and the target's activation (24 orders). After every move: exactly one
/// responsibility owner; the execution owner is the source only before the transfer, nobody
/// during the drain, the target only from its activation CAS (which waits for the ACK, the
/// source's end and the claim's settlement); the pending target stays until the
/// activation; the source renews only while it executes and claims nothing once an offer
/// is pending; leases only where the execution is; never two live generations; every
/// refused move changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn every_interleaving_of_ack_revocation_reconciliation_and_activation_keeps_one_owner() {
    let all = interleavings();
    assert_eq!(all.len(), 24);
    let runs: Vec<_> = all
        .into_iter()
        .map(|order| tokio::spawn(bind_interleaving(order)))
        .collect();
    let mut failed = Vec::new();
    for r in runs {
        if let Err(e) = r.await {
            failed.push(e.to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{} interleavings failed: {failed:#?}",
        failed.len()
    );
}
