//! The activation chain and its end: reserve → … → RUNNING, stops and termination receipts,
//! at the store (against a real PostgreSQL: every rejection row checks nothing changed), with
//! the coordinator killed at every commit, and end to end under `mosaic up`.

mod common;
mod pg;
mod store;
mod up;
mod world;

use store::*;
use up::*;
use world::split::*;

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
            .record_staged(l, &c, generation, &id, None)
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
            scope_digest: scope_digest(),
            holds_digest: holds_digest(),
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

/// A stop of work in recovery racing the receipt of its last generation: the receipt
/// commits while the stop waits for the rows it locks; the stop must then see the
/// generation ended and make the outcome final (it once decided on a snapshot taken before
/// it waited, saw the generation still running, and waited for a receipt already in).
#[tokio::test]
async fn a_stop_racing_the_last_receipt_of_work_in_recovery_still_ends_it() {
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let inc = f.lane.lane_incarnation_id.clone();
    let r = to_awaiting_ack(s, l, &inc, None, 60_000).await;
    s.end_chain(l, r.chain(), EndCause::Abandoned)
        .await
        .unwrap();
    let id = r.chain().assignment_id.clone();
    // A third session holds the assignment's row, so the receipt queues for it first and
    // the stop after it.
    let mut holder = sql(&f.db.url).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM assignments WHERE assignment_id = $1 FOR UPDATE",
        &[&id],
    )
    .await
    .unwrap();
    let url = f.db.url.clone();
    let waiting = |n: i64| {
        let url = url.clone();
        async move {
            loop {
                let q = "SELECT count(*) FROM pg_stat_activity \
                         WHERE datname = current_database() AND wait_event_type = 'Lock'";
                if count(&url, q).await == n {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };
    let (s1, l1, rec) = (s.clone(), l.clone(), receipt_for(&r, "quit", true));
    let receipt = tokio::spawn(async move { s1.ingest_termination(&l1, HOST, &rec).await });
    waiting(1).await;
    let (s2, l2, id2) = (s.clone(), l.clone(), id.clone());
    let stop =
        tokio::spawn(async move { s2.request_end(&l2, &id2, Outcome::Cancelled, None).await });
    waiting(2).await;
    tx.rollback().await.unwrap();
    receipt.await.unwrap().unwrap();
    let e = stop.await.unwrap().unwrap();
    assert!(
        !e.awaiting_receipt,
        "the stop waits for a receipt already reconciled"
    );
    assert_eq!(assignment(s, &id).await.lifecycle, "CANCELLED");
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
        ("effect_claims", "state", names(ClaimState::ALL)),
        (
            "workspace_effects",
            "state",
            names(WorkspaceEffectState::ALL),
        ),
        ("lane_leases", "state", names(LeaseState::ALL)),
        ("recovery_candidates", "state", names(CandidateState::ALL)),
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

#[tokio::test(flavor = "multi_thread")]
async fn the_coordinator_killed_before_or_after_any_chain_commit_never_wedges_a_lane() {
    let points: Vec<(&str, &str)> = CHAIN
        .iter()
        .flat_map(|op| [("before-commit", *op), ("after-commit", *op)])
        .collect();
    let mut w = Split::new(points.len());
    w.crash_coordinator(0);
    for (i, (when, op)) in points.iter().enumerate() {
        let n = i + 1;
        let lane = w.lane(n);
        let point = format!("{when}:{op}");
        w.start_coordinator(0, Some(&format!("{point}=return")));
        w.wait_leading(0);
        w.wait_host_connected();
        let waiter = w.assign_async(n, "hang");
        w.wait_coordinator_died(0, &point);
        let _ = waiter.join();
        w.invariants().await;
        // A fresh process drives the chain on from the database: on to RUNNING if the
        // activation committed, otherwise to a fail-closed end (a new epoch ends every
        // chain before activation) with the host's generation stopped.
        w.start_coordinator(0, None);
        w.wait_leading(0);
        let state = w.wait_settled(n, &point);
        let a = w.assignment_row(&lane).await;
        match (point.as_str(), a) {
            ("after-commit:activate", Some((_, life, exec, pending, resp))) => {
                assert_eq!(state, "RUNNING", "{point}");
                assert_eq!(
                    (
                        life.as_str(),
                        exec.as_deref(),
                        pending.as_deref(),
                        resp.as_str()
                    ),
                    ("ACTIVE", Some(lane.as_str()), None, lane.as_str()),
                    "{point}"
                );
            }
            ("before-commit:reserve", a) => {
                assert_eq!(state, "IDLE_CLEAN", "{point}");
                assert!(
                    a.is_none(),
                    "{point}: an uncommitted reservation left an assignment"
                );
            }
            (_, Some((_, life, exec, pending, resp))) => {
                assert_eq!(state, "IDLE_CLEAN", "{point}");
                assert_eq!(
                    (
                        life.as_str(),
                        exec.as_deref(),
                        pending.as_deref(),
                        resp.as_str()
                    ),
                    ("RECOVERY", None, None, lane.as_str()),
                    "{point}: owners"
                );
            }
            (_, None) => panic!("{point}: no assignment"),
        }
        w.invariants().await;
        w.usable(n).await;
        w.crash_coordinator(0);
    }
    assert!(
        w.count("SELECT max(epoch) FROM epochs").await > points.len() as i64,
        "every restart took a new epoch"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_coordinator_killed_before_or_after_any_stop_commit_finishes_the_stop() {
    let points: Vec<(&str, &str)> = STOP
        .iter()
        .flat_map(|op| [("before-commit", *op), ("after-commit", *op)])
        .collect();
    let mut w = Split::new(points.len());
    for (i, (when, op)) in points.iter().enumerate() {
        let n = i + 1;
        let point = format!("{when}:{op}");
        w.crash_coordinator(0);
        w.start_coordinator(0, Some(&format!("{point}=return")));
        w.wait_leading(0);
        w.wait_host_connected();
        let a = w.assign(n, "hang spawn=2").unwrap();
        let id = a["assignment_id"].as_str().unwrap().to_string();
        let generation = a["generation"].as_i64().unwrap();
        // The stop is cut short by the crash (or answers before it).
        let _ = w.stop(&id);
        w.wait_coordinator_died(0, &point);
        w.invariants().await;
        w.start_coordinator(0, None);
        w.wait_leading(0);
        // Repeating the stop is idempotent, and it finishes: the host's receipt proves the
        // end, the outcome is final only then.
        let out = w.stop_final(&id);
        assert_eq!(out["state"], "CANCELLED", "{point}: {out}");
        assert_eq!(w.wait_settled(n, &point), "IDLE_CLEAN");
        assert_eq!(
            w.count(&format!("SELECT count(*) FROM termination_receipts WHERE assignment_id = '{id}' AND generation = {generation} AND verified_empty")).await,
            1,
            "{point}: exactly one verified receipt"
        );
        common::wait_until("receipts acknowledged", || {
            (w.host_status()["unacknowledged_receipts"] == 0).then_some(())
        });
        w.invariants().await;
        w.usable(n).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_supervisor_killed_with_lanes_running_and_mid_chain_leaves_every_lane_usable() {
    let mut w = Split::new(3);
    w.wait_host_connected();
    // Lane 1 RUNNING; lane 2 held before its ACK (the harness never acknowledges); lane 3
    // idle.
    let running = w.assign(1, "hang spawn=2").unwrap();
    let waiter = w.assign_async(2, "no-ack hang");
    let rt = tokio::runtime::Handle::current();
    common::wait_until("lane 2 waiting for its ACK", || {
        let (st, _) = std::thread::scope(|s| {
            s.spawn(|| rt.block_on(w.lane_row(&w.lane(2))))
                .join()
                .unwrap()
        });
        (st == "AWAITING_ACK").then_some(())
    });
    let before = w.host_status();
    w.crash_supervisor();
    w.start_supervisor();
    w.wait_host_connected();
    // The RUNNING generation was re-adopted (same identity) and keeps running; the chain
    // whose hand-off died with the old supervisor is ended by the coordinator and its
    // generation stopped — never activated.
    assert_eq!(w.wait_settled(1, "re-adopted RUNNING"), "RUNNING");
    assert_eq!(
        w.host_status()["lanes"][0]["generation"]["process_identity"],
        before["lanes"][0]["generation"]["process_identity"]
    );
    assert_eq!(w.wait_settled(2, "ended mid-chain"), "IDLE_CLEAN");
    let out = waiter.join().unwrap();
    assert!(
        out.is_err(),
        "a chain whose host lost it reported RUNNING: {out:?}"
    );
    let (id2, life, ..) = w.assignment_row(&w.lane(2)).await.unwrap();
    assert_eq!(life, "RECOVERY");
    // Resume works on the lane; the RUNNING one stops; new work runs everywhere.
    let mut resume = assign_req(&w.lane(2), "hang", Some(&id2));
    if let OperatorRequest::Assign { replace_task, .. } = &mut resume {
        *replace_task = true;
    }
    let b = w.op(&resume).unwrap();
    assert_eq!(
        (b["state"].as_str(), b["assignment_id"].as_str()),
        (Some("RUNNING"), Some(id2.as_str()))
    );
    assert_eq!(
        w.stop(running["assignment_id"].as_str().unwrap()).unwrap()["state"],
        "CANCELLED"
    );
    for n in 1..=3 {
        w.usable(n).await;
    }
    // No receipt lost or duplicated.
    common::wait_until("receipts acknowledged", || {
        (w.host_status()["unacknowledged_receipts"] == 0).then_some(())
    });
    assert_eq!(
        w.count("SELECT count(*) FROM generations WHERE state = 'ENDED' AND end_receipt IS NULL")
            .await,
        0,
        "a generation ended without its receipt"
    );
    w.invariants().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_stages_expired_reservations_and_host_quarantines_end_visibly() {
    let w = Split::new(2);
    w.wait_host_connected();
    let rt = tokio::runtime::Handle::current();
    let row = |lane: String| {
        let w = &w;
        let rt = rt.clone();
        std::thread::scope(move |s| {
            s.spawn(move || rt.block_on(w.lane_row(&lane)))
                .join()
                .unwrap()
        })
    };
    // 1. An expired reservation (the harness never acknowledges): the chain ends, the
    // host's generation is stopped, the lane is reusable.
    let err = w.assign(1, "no-ack hang").unwrap_err();
    assert_eq!(
        err.category,
        mosaic::coordinator::Category::ChainEnded,
        "{err}"
    );
    assert_eq!(w.wait_settled(1, "after expiry"), "IDLE_CLEAN");
    assert_eq!(w.assignment_row(&w.lane(1)).await.unwrap().1, "RECOVERY");
    w.usable(1).await;
    // 2. A host-side quarantine (the lane's tmux server vanished): the host's watch of its
    // lanes' servers or, if the assign comes first, its refusal of the stage quarantines it;
    // either way the assign fails at once (not at the reservation deadline), and the
    // coordinator shows the quarantine. (The stage refusal on its own: tests/stale.rs.)
    let sock = w.runtime_dir(0).join("lanes/lane-2/tmux.sock");
    let _ = Command::new("tmux")
        .arg("-S")
        .arg(&sock)
        .arg("kill-server")
        .status();
    let started = Instant::now();
    let err = w.assign(2, "hang").unwrap_err();
    assert!(
        matches!(
            err.category,
            mosaic::coordinator::Category::ChainEnded | mosaic::coordinator::Category::WrongState
        ),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "the refusal waited for the reservation deadline"
    );
    common::wait_until("host quarantine shown", || {
        let (st, _) = row(w.lane(2));
        (st == "QUARANTINED").then_some(())
    });
    let lanes = w.op(&OperatorRequest::Lanes).unwrap();
    let l2 = lanes
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lane_id"] == w.lane(2).as_str())
        .unwrap()
        .clone();
    assert!(
        l2["host_quarantine_reason"]
            .as_str()
            .is_some_and(|r| r.contains("tmux")),
        "{l2}"
    );
    // Release is refused while the host holds the quarantine; recreate is the way out.
    let e = w
        .op(&OperatorRequest::LaneRelease {
            lane_id: w.lane(2),
            request_id: None,
        })
        .unwrap_err();
    assert_eq!(
        e.category,
        mosaic::coordinator::Category::Unreconciled,
        "{e}"
    );
    let old = l2["lane_incarnation_id"].as_str().unwrap().to_string();
    w.op(&OperatorRequest::LaneRecreate {
        lane_id: w.lane(2),
        request_id: None,
    })
    .unwrap();
    common::wait_until("lane recreated", || {
        let lanes = w.op(&OperatorRequest::Lanes).ok()?;
        let l = lanes
            .as_array()?
            .iter()
            .find(|l| l["lane_id"] == w.lane(2).as_str())?
            .clone();
        (l["lane_incarnation_id"] != old.as_str() && l["state"] == "IDLE_CLEAN").then_some(())
    });
    w.usable(2).await;
    // (A stage for a stale incarnation, an unknown lane or a fenced generation is refused
    // the same way; tests/stale.rs drives each against the host directly.)
    w.invariants().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn assigning_to_a_disconnected_host_reserves_nothing() {
    let mut w = Split::new(1);
    w.wait_host_connected();
    w.crash_supervisor();
    let me = format!("host:{}", w.hosts[0]);
    common::wait_until("host gone", || {
        let st = w.op(&OperatorRequest::Status).ok()?;
        (!st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == me.as_str()))
        .then_some(())
    });
    let err = w.assign(1, "hang").unwrap_err();
    assert_eq!(
        err.category,
        mosaic::coordinator::Category::HostUnreachable,
        "{err}"
    );
    assert_eq!(w.count("SELECT count(*) FROM reservations").await, 0);
    assert_eq!(w.lane_row(&w.lane(1)).await.0, "IDLE_CLEAN");
}

/// A restarted supervisor serves the lane sockets of its activated, re-adopted generations
/// again: their harnesses go on reporting progress (no inactivity replacement) and taking
/// continuations; nothing is run twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_supervisor_serves_its_running_harnesses_again() {
    let mut w = Split::new(2);
    w.op(&OperatorRequest::PolicyPublish {
        policy: mosaic::coordinator::continuity::InactivityPolicy {
            policy_id: "restart-fast@1".into(),
            warn_after_ms: 600,
            escalate_after_ms: 1200,
            replace_after_ms: 2000,
            replacements_before_reassign: 1,
            max_attempts: 3,
            exhaustion: "blocked".into(),
            evidence_kinds: vec!["test-result".into()],
        },
        request_id: None,
    })
    .unwrap();
    let mut req = assign_req(&w.lane(1), "progress-every=0.3", None);
    if let OperatorRequest::Assign {
        inactivity_policy, ..
    } = &mut req
    {
        *inactivity_policy = Some("restart-fast@1".into());
    }
    let a = w.op(&req).unwrap();
    let reporting = a["assignment_id"].as_str().unwrap().to_string();
    let b = w.assign(2, "take-continuations").unwrap();
    let taking = b["assignment_id"].as_str().unwrap().to_string();
    let progress =
        |id: &str| format!("SELECT count(*) FROM progress_receipts WHERE assignment_id = '{id}'");
    w.wait_count(
        &progress(&reporting),
        |n| n >= 2,
        "progress before the restart",
    )
    .await;
    w.crash_supervisor();
    w.start_supervisor();
    w.wait_host_connected();
    let before = w.count(&progress(&reporting)).await;
    // Longer than the policy's whole inactivity period.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(
        w.count(&progress(&reporting)).await > before,
        "the re-adopted harness's progress no longer reaches the coordinator"
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE assignment_id = '{reporting}' AND transition = 'inactivity-replace'"
        ))
        .await,
        0,
        "a reporting harness was replaced"
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM attempts WHERE assignment_id = '{reporting}'"
        ))
        .await,
        1
    );
    // The other harness takes a continuation through its re-served socket, once.
    w.op(&OperatorRequest::Continue {
        assignment_id: taking.clone(),
        next_action: "after the restart".into(),
        within_ms: None,
        request_id: None,
    })
    .unwrap();
    w.wait_count(
        &format!("SELECT count(*) FROM continuations WHERE assignment_id = '{taking}' AND state = 'RESULT_RECORDED'"),
        |n| n == 1,
        "a continuation through the re-served socket",
    )
    .await;
    w.stop_final(&reporting);
    w.stop_final(&taking);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_reaches_running_in_a_fresh_attachable_generation() {
    let up = Up::start(1);
    let lane = up.lane_id(1);
    assert_eq!(up.lane_state(&lane), "IDLE_CLEAN");
    let a = up.assign(&lane, "print=hello-e2e spawn=3");
    assert_eq!(a["state"], "RUNNING");
    assert_eq!(a["lane_id"], lane.as_str());
    let pi = &a["process_identity"];
    // The identity the coordinator activated is the one the supervisor verified.
    let host = up.host(&["status"]);
    let g = &host["lanes"][0]["generation"];
    assert_eq!(pi["root_pid"], g["process_identity"]["root_pid"]);
    assert_eq!(
        pi["launch_nonce_digest"],
        g["process_identity"]["launch_nonce_digest"]
    );
    assert_eq!(pi["cgroup_path"], g["process_identity"]["cgroup_path"]);
    assert_eq!(g["generation"], a["generation"]);
    // Owners after activation (spec §4): execution and responsibility with the lane.
    let s = up.assignment(a["assignment_id"].as_str().unwrap());
    assert_eq!(
        (
            s["state"].as_str(),
            s["lane_state"].as_str(),
            s["execution_owner"].as_str(),
            s["responsibility_owner"].as_str()
        ),
        (
            Some("ACTIVE"),
            Some("RUNNING"),
            Some(lane.as_str()),
            Some(lane.as_str())
        )
    );
    // One effect lease per scoped capability (default: the lane itself and its provider).
    assert_eq!(
        up.count("SELECT count(*) FROM leases WHERE released_at IS NULL AND scope IN ('provider', 'lane:' || (SELECT lane_id FROM lanes LIMIT 1))")
            .await,
        2
    );
    // Attachable: the lane's tmux pane shows the harness, which ran its contract's task.
    let sock = host["lanes"][0]["tmux_socket"]
        .as_str()
        .unwrap()
        .to_string();
    let screen = wait_for("pane output", || {
        let out = Command::new("tmux")
            .args(["-S", &sock, "capture-pane", "-p", "-t", "=lane-1:"])
            .output()
            .ok()?;
        let t = String::from_utf8_lossy(&out.stdout).into_owned();
        t.contains("hello-e2e").then_some(t)
    });
    assert!(screen.contains("generation is active"), "{screen}");
    // Stop: leases revoked, the host stops the generation, its receipt makes the
    // cancellation final, the lane is clean, nothing is left running.
    let stopped = up
        .cli(&["stop", "--assignment", a["assignment_id"].as_str().unwrap()])
        .unwrap();
    assert_eq!(stopped["state"], "CANCELLED");
    let s = up.assignment(a["assignment_id"].as_str().unwrap());
    assert_eq!(
        (s["state"].as_str(), s["execution_owner"].as_str()),
        (Some("CANCELLED"), None)
    );
    wait_for("lane clean", || {
        (up.lane_state(&lane) == "IDLE_CLEAN").then_some(())
    });
    assert_eq!(
        up.count("SELECT count(*) FROM leases WHERE released_at IS NULL")
            .await,
        0
    );
    let receipts = up.cli(&["receipts", "--lane", &lane]).unwrap();
    let r = receipts.as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            r["termination_reason"].as_str(),
            r["reconciliation"].as_str()
        ),
        (Some("quit"), Some("retiring"))
    );
    assert!(up.host(&["status"])["lanes"][0]["generation"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_becomes_a_receipt_and_a_recovery_never_a_completion() {
    let up = Up::start(2);
    let lane = up.lane_id(1);
    let a = up.assign(&lane, "spawn=6");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let harness = up.host(&["status"])["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(harness as i32, nix::sys::signal::Signal::SIGKILL);
    let r = wait_for("reconciled receipt", || {
        let rs = up.cli(&["receipts", "--lane", &lane]).ok()?;
        rs.as_array()?
            .iter()
            .find(|r| r["generation"] == a["generation"] && !r["reconciliation"].is_null())
            .cloned()
    });
    assert_eq!(
        (
            r["termination_reason"].as_str(),
            r["observation_source"].as_str()
        ),
        (Some("sigkill"), Some("shim"))
    );
    assert_eq!(r["reconciliation"], "recovery");
    assert_eq!(r["cleanup"]["verified_empty"], true);
    let s = up.assignment(&id);
    assert_eq!(
        (s["state"].as_str(), s["execution_owner"].as_str()),
        (Some("RECOVERY"), None),
        "a killed run is never completed"
    );
    assert_eq!(
        up.count("SELECT count(*) FROM leases WHERE released_at IS NULL")
            .await,
        0,
        "the dead generation's leases were revoked"
    );
    // The lane is reusable only after that reconciliation: the same assignment resumes, on a
    // fresh generation with a fresh identity and a never-reused attempt.
    assert_eq!(up.lane_state(&lane), "IDLE_CLEAN");
    let b = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "print=again",
            "--wait",
            "running",
            "--replace-task",
            "--resume",
            &id,
        ])
        .unwrap();
    assert_eq!(b["assignment_id"], id.as_str());
    assert_eq!(
        b["generation"].as_i64(),
        a["generation"].as_i64().map(|g| g + 1)
    );
    assert_ne!(
        b["process_identity"]["launch_nonce_digest"],
        a["process_identity"]["launch_nonce_digest"]
    );
    let s = up.assignment(&id);
    assert_eq!(
        (s["state"].as_str(), s["execution_owner"].as_str()),
        (Some("ACTIVE"), Some(lane.as_str()))
    );
    // A resume that does not match an assignment in recovery (here: active again, and its
    // scope is the first lane's) is refused, and the idle lane is left as it was. The store
    // tests isolate each of those checks.
    let other = up.lane_id(2);
    let err = up
        .cli(&[
            "assign",
            "--lane",
            &other,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--replace-task",
            "--resume",
            &id,
        ])
        .unwrap_err();
    assert!(err.contains("only an assignment in recovery"), "{err}");
    assert_eq!(up.lane_state(&other), "IDLE_CLEAN");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_change_neither_status_nor_the_database() {
    let up = Up::start(1);
    let lane = up.lane_id(1);
    let status = up.cli(&["status"]).unwrap();
    let rows = "SELECT (SELECT count(*) FROM assignments) + (SELECT count(*) FROM reservations) \
                + (SELECT count(*) FROM attempts) + (SELECT count(*) FROM generations) + (SELECT count(*) FROM transition_receipts)";
    let before = up.count(rows).await;
    let big =
        std::env::temp_dir().join(format!("mosaic-big-task-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&big, "print=x ".repeat(20_000)).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--runtime", "fake@1.0.0", "--task", "explode"],
            "bad-input",
        ),
        (
            vec!["--runtime", "claude@9.9.9", "--task", "x"],
            "unknown-runtime",
        ),
        (
            vec![
                "--runtime",
                "fake@1.0.0",
                "--task-file",
                big.to_str().unwrap(),
            ],
            "too-large",
        ),
        (
            vec![
                "--runtime",
                "fake@1.0.0",
                "--task",
                "hang",
                "--completion-policy",
                "agent-says-so",
            ],
            "bad-input",
        ),
        (
            vec![
                "--runtime",
                "fake@1.0.0",
                "--task-file",
                "/nonexistent/task",
            ],
            "bad-input",
        ),
        (
            vec![
                "--runtime",
                "fake@1.0.0",
                "--task",
                "hang",
                "--resume",
                "as-doesnotexist",
            ],
            "not-found",
        ),
    ];
    for (args, category) in cases {
        let mut all = vec!["assign", "--lane", lane.as_str()];
        all.extend(args.iter().copied());
        let out = Command::new(common::MOSAIC)
            .args(&all)
            .arg("--state-dir")
            .arg(&up.dir)
            .arg("--json")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{all:?} was accepted");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["error"]["category"], category, "{all:?}: {v}");
    }
    // A lane that does not exist.
    let out = Command::new(common::MOSAIC)
        .args([
            "assign",
            "--lane",
            "nowhere:lane-1",
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--json",
            "--state-dir",
        ])
        .arg(&up.dir)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["category"], "not-found", "{v}");
    let _ = std::fs::remove_file(&big);
    assert_eq!(
        up.count(rows).await,
        before,
        "a bad request changed the database"
    );
    let after = up.cli(&["status"]).unwrap();
    assert_eq!(after["assignments"], status["assignments"]);
    assert_eq!(after["lanes"], status["lanes"]);
    // A task longer than a command line takes (here 120 KB) is accepted from a file.
    std::fs::write(
        &big,
        format!(
            "hang {}",
            "print=abcdefghijklmnopqrstuvwxyz0123456789 ".repeat(3000)
        ),
    )
    .unwrap();
    let a = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            "fake@1.0.0",
            "--task-file",
            big.to_str().unwrap(),
            "--wait",
            "running",
        ])
        .unwrap();
    assert_eq!(a["state"], "RUNNING");
    let _ = std::fs::remove_file(&big);
    // On a busy lane, resuming an assignment that does not exist is still `not-found`.
    let e = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--resume",
            "as-doesnotexist",
        ])
        .unwrap_err();
    assert!(
        e.contains("not-found") || e.contains("no assignment"),
        "{e}"
    );
    // A stop, then a stop asking for another outcome: a conflict, and nothing changes.
    let id = a["assignment_id"].as_str().unwrap();
    let stopped = up.cli(&["stop", "--assignment", id]).unwrap();
    assert_eq!(stopped["state"], "CANCELLED");
    let out = Command::new(common::MOSAIC)
        .args([
            "stop",
            "--assignment",
            id,
            "--fail",
            "--json",
            "--state-dir",
        ])
        .arg(&up.dir)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["category"], "conflict", "{v}");
    // A finished assignment no longer shows its old lane's state as its own.
    let s = up.assignment(id);
    assert_eq!(
        (s["state"].as_str(), s["lane_state"].as_str()),
        (Some("CANCELLED"), None),
        "{s}"
    );
}
