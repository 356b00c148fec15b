//! The work record (spec §14): validated progress, the inactivity watchdog, blocked work —
//! at the store and end to end.

mod common;
mod pg;
mod store;
mod up;

use store::*;
use up::*;

/// A refused progress report or block names the predicate of its compare-and-swap that
/// failed (each refusal is built from the CAS's own predicate table), and changes nothing.
#[tokio::test]
async fn a_refused_progress_or_block_names_the_predicate_that_failed() {
    use mosaic::coordinator::continuity::{Blockage, Blocker};
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
        s.block(
            l,
            &asg,
            &by,
            &Blockage::new("needs-review", &ev, "review it"),
        )
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
        &Blockage::new("needs-review", &ev, "review it"),
    )
    .await
    .unwrap();
    refused(
        s.block(
            l,
            &asg,
            &Blocker::Operator,
            &Blockage::new("needs-review", &d('f'), "review it"),
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
            &Blockage::new("needs-review", &ev, "x"),
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

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_harness_is_warned_escalated_replaced_reassigned_and_blocked_by_its_policy() {
    let up = Up::start(2);
    let (lane1, lane2) = (up.lane_id(1), up.lane_id(2));
    // One replacement on the first lane, then another lane; three attempts in all.
    publish_policy(&up, "stall-test@1", 600, 1200, 2000, 1, 3);
    // A published version is frozen: the same id with another body is refused.
    let file = up.dir.join("changed.toml");
    std::fs::write(&file, "policy_id = \"stall-test@1\"\nwarn_after_ms = 1\nescalate_after_ms = 2\nreplace_after_ms = 3\nreplacements_before_reassign = 0\nmax_attempts = 1\nexhaustion = \"blocked\"\nevidence_kinds = [\"commit\"]\n").unwrap();
    let err = up
        .cli(&["policy", "publish", file.to_str().unwrap()])
        .unwrap_err();
    assert!(err.contains("conflict"), "{err}");
    // An unpublished policy is refused before anything is reserved.
    let err = up
        .cli(&[
            "assign",
            "--lane",
            &lane1,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--inactivity-policy",
            "nope@1",
        ])
        .unwrap_err();
    assert!(err.contains("not-found"), "{err}");
    assert_eq!(up.count("SELECT count(*) FROM assignments").await, 0);

    let a = assign_under(&up, &lane1, "hang", "stall-test@1");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let s = up.assignment(&id);
    assert_eq!(s["work_status"], "active");
    assert_eq!(s["inactivity_policy"], "stall-test@1");
    assert!(
        s["last_progress_at"].is_null(),
        "nothing reported progress yet"
    );
    let blocked = wait_for("the policy to run out", || {
        let s = up.assignment(&id);
        (s["work_status"] == "blocked").then_some(s)
    });
    assert_eq!(blocked["blocker_code"], "inactivity-exhausted");
    assert!(blocked["blocker_evidence_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(
        blocked["responsibility_owner"]
            .as_str()
            .map(|o| !o.is_empty()),
        Some(true)
    );
    assert!(
        blocked["next_action"]
            .as_str()
            .unwrap()
            .contains("mosaic unblock"),
        "{blocked}"
    );
    assert_eq!(
        blocked["state"], "RECOVERY",
        "blocked for review, never done"
    );
    // Every step is a receipt: per attempt a warning, an escalation and a replacement.
    let steps = |t: &'static str| {
        let id = id.clone();
        let up = &up;
        async move {
            up.count(&format!(
                "SELECT count(*) FROM transition_receipts WHERE assignment_id = '{id}' AND transition = '{t}'"
            ))
            .await
        }
    };
    assert_eq!(steps("inactivity-warn").await, 3);
    assert_eq!(steps("inactivity-escalate").await, 3);
    assert_eq!(steps("inactivity-replace").await, 3);
    assert_eq!(steps("inactivity-exhausted").await, 1);
    // Three attempts: two on the first lane (one replacement there), then the other lane.
    let on = |lane: &str| {
        format!(
            "SELECT count(*) FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) \
             WHERE r.assignment_id = '{id}' AND li.lane_id = '{lane}'"
        )
    };
    assert_eq!(up.count(&on(&lane1)).await, 2);
    assert_eq!(up.count(&on(&lane2)).await, 1);
    // Each replaced generation ended with a verified receipt and no survivor.
    let ended = format!(
        "SELECT count(*) FROM termination_receipts WHERE assignment_id = '{id}' AND verified_empty AND reconciled_at IS NOT NULL"
    );
    assert_eq!(up.count(&ended).await, 3);
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM progress_receipts WHERE assignment_id = '{id}'"
        ))
        .await,
        0
    );
    // The way out: unblock grants a fresh budget, and the watchdog starts the next attempt.
    let r = up
        .cli(&[
            "unblock",
            "--assignment",
            &id,
            "--next-action",
            "retry after the fixture fix",
        ])
        .unwrap();
    assert_eq!(r["work_status"], "active");
    wait_for("the next attempt to run", || {
        let s = up.assignment(&id);
        (s["state"] == "ACTIVE" && s["lane_state"] == "RUNNING").then_some(())
    });
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM attempts WHERE assignment_id = '{id}'"
        ))
        .await,
        4
    );
    up.cli(&["stop", "--assignment", &id]).unwrap();
    assert_eq!(up.assignment(&id)["work_status"], "done");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_new_evidence_is_progress_and_blocked_work_keeps_its_owner_and_evidence() {
    let up = Up::start(3);
    let (lane1, lane2, lane3) = (up.lane_id(1), up.lane_id(2), up.lane_id(3));
    publish_policy(&up, "progress-test@1", 500, 1000, 2500, 5, 5);
    // Fresh evidence every 300 ms keeps the work alive past its 2.5 s deadline.
    let a = assign_under(&up, &lane1, "progress-every=0.3", "progress-test@1");
    let live = a["assignment_id"].as_str().unwrap().to_string();
    // The same evidence over and over (a heartbeat dressed as progress) counts once.
    let b = assign_under(
        &up,
        &lane2,
        "progress-every=0.3 progress-same",
        "progress-test@1",
    );
    let same = b["assignment_id"].as_str().unwrap().to_string();
    // A harness that says it is blocked, with evidence and an unblock action.
    let c = assign_under(&up, &lane3, "blocked=needs-credentials", "progress-test@1");
    let blocked = c["assignment_id"].as_str().unwrap().to_string();

    wait_for("the repeated evidence's generation to be replaced", || {
        let s = up.assignment(&same);
        (s["watchdog_step"] == "replacing" || s["attempts"].as_i64() > Some(1)).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let s = up.assignment(&live);
    assert_eq!(
        (s["state"].as_str(), s["lane_state"].as_str()),
        (Some("ACTIVE"), Some("RUNNING"))
    );
    assert_eq!(
        s["attempts"], 1,
        "validated progress kept the first generation"
    );
    assert!(s["last_progress_at"].is_string());
    assert!(
        up.count(&format!(
            "SELECT count(*) FROM progress_receipts WHERE assignment_id = '{live}'"
        ))
        .await
            >= 5
    );
    assert_eq!(
        up.count(&format!("SELECT count(*) FROM transition_receipts WHERE assignment_id = '{live}' AND transition = 'inactivity-replace'")).await,
        0
    );
    // Of the repeated evidence exactly one report counted (a repeat is the same step: it lands
    // on the first receipt and extends nothing), so its deadline passed and it was replaced.
    assert_eq!(
        up.count(&format!(
            "SELECT count(*) FROM progress_receipts p JOIN attempts t USING (assignment_attempt_id) \
             WHERE p.assignment_id = '{same}' AND t.created_at = (SELECT min(created_at) FROM attempts WHERE assignment_id = '{same}')"
        ))
        .await,
        1
    );
    // Blocked: owner kept, evidence and next action recorded, and the watchdog leaves it be.
    let s = up.assignment(&blocked);
    assert_eq!(s["work_status"], "blocked");
    assert_eq!(s["blocker_code"], "needs-credentials");
    assert!(s["blocker_evidence_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert!(s["next_action"]
        .as_str()
        .unwrap()
        .contains("resolve needs-credentials"));
    assert_eq!(s["responsibility_owner"], lane3.as_str());
    assert_eq!(s["lane_state"], "RUNNING");
    assert_eq!(
        up.count(&format!("SELECT count(*) FROM transition_receipts WHERE assignment_id = '{blocked}' AND transition LIKE 'inactivity-%'")).await,
        0
    );
    // An operator's blocked claim needs evidence: an empty file is refused, nothing changes.
    let empty = up.dir.join("empty-evidence");
    std::fs::write(&empty, "").unwrap();
    let err = up
        .cli(&[
            "block",
            "--assignment",
            &live,
            "--code",
            "waiting",
            "--evidence",
            empty.to_str().unwrap(),
            "--next-action",
            "x",
        ])
        .unwrap_err();
    assert!(err.contains("empty"), "{err}");
    assert_eq!(up.assignment(&live)["work_status"], "active");
    // Without a next action it is refused by the coordinator too.
    let ev = up.dir.join("evidence");
    std::fs::write(&ev, "CI is red upstream").unwrap();
    let err = up
        .cli(&[
            "block",
            "--assignment",
            &live,
            "--code",
            "waiting",
            "--evidence",
            ev.to_str().unwrap(),
            "--next-action",
            " ",
        ])
        .unwrap_err();
    assert!(err.contains("bad-input"), "{err}");
    assert_eq!(up.assignment(&live)["work_status"], "active");
    // The database itself refuses blocked work without evidence, whatever the code does.
    let (cl, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let e = cl
        .batch_execute(&format!(
            "BEGIN; INSERT INTO transition_receipts (receipt_id, transition, sot_incarnation, coordinator_epoch, body) \
             SELECT 'x', 'x', sot_incarnation, epoch, '{{}}' FROM leadership; \
             UPDATE assignments SET work_status = 'blocked', blocker_code = 'x' WHERE assignment_id = '{live}'; COMMIT"
        ))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("blocked_has_evidence"), "{e:?}");
    let _ = cl.batch_execute("ROLLBACK").await;
    let e = cl
        .batch_execute(&format!(
            "BEGIN; INSERT INTO transition_receipts (receipt_id, transition, sot_incarnation, coordinator_epoch, body) \
             SELECT 'y', 'y', sot_incarnation, epoch, '{{}}' FROM leadership; \
             UPDATE assignments SET next_action = '' WHERE assignment_id = '{live}'; COMMIT"
        ))
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("unfinished_work_is_owned"),
        "{e:?}"
    );
    let _ = cl.batch_execute("ROLLBACK").await;
    // Unblocked by the operator, the work is active again under a fresh inactivity period.
    let r = up
        .cli(&[
            "unblock",
            "--assignment",
            &blocked,
            "--next-action",
            "credentials provided; continue",
        ])
        .unwrap();
    assert_eq!(r["work_status"], "active");
    let s = up.assignment(&blocked);
    assert_eq!(
        (s["work_status"].as_str(), s["blocker_code"].as_str()),
        (Some("active"), None)
    );
    for id in [&live, &same, &blocked] {
        let _ = up.cli(&["stop", "--assignment", id]);
    }
}

/// Issue 23 part 5: a block that names its end (a provider's rate limit) gets
/// `blocked_until` at database time. The watchdog's resume is refused before that time and
/// for any other block; once due it resumes exactly that block, once; an end out of range
/// is refused and changes nothing.
#[tokio::test]
async fn a_block_with_a_known_end_resumes_only_at_that_end_and_only_that_block() {
    use mosaic::coordinator::continuity::{Blockage, Blocker, MAX_RESUME_AFTER_MS};
    use mosaic::coordinator::resume::DueResume;
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running(s, l, &f.lane.lane_incarnation_id).await;
    let asg = r.chain().assignment_id.clone();
    let by = Blocker::Generation {
        chain: r.chain().clone(),
        generation: r.generation,
    };
    fn limited(ev: &str, ms: i64) -> Blockage<'_> {
        Blockage {
            resume_after_ms: Some(ms),
            ..Blockage::new("rate-limited", ev, "wait for the reset")
        }
    }
    let ev = d('a');
    let before = authority_counts(&f.db.url).await;
    for ms in [0, 999, MAX_RESUME_AFTER_MS + 1] {
        let e = s.block(l, &asg, &by, &limited(&ev, ms)).await.unwrap_err();
        assert_eq!(e.category(), Some(Category::BadInput), "{ms}: {e}");
    }
    assert_eq!(
        authority_counts(&f.db.url).await,
        before,
        "a refusal changed something"
    );
    let b = s.block(l, &asg, &by, &limited(&ev, 1500)).await.unwrap();
    assert!(b.body["blocked_until"].is_string(), "{}", b.body);
    let this = DueResume {
        assignment_id: asg.clone(),
        blocker_code: "rate-limited".into(),
        blocker_evidence_digest: ev.clone(),
    };
    assert!(
        s.due_resumes().await.unwrap().is_empty(),
        "due before its end"
    );
    let e = s.resume_blocked(l, &this).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    let start = std::time::Instant::now();
    let due = loop {
        let due = s.due_resumes().await.unwrap();
        if !due.is_empty() {
            break due;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "never due"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(due, vec![this.clone()]);
    let other = DueResume {
        blocker_evidence_digest: d('b'),
        ..this.clone()
    };
    let e = s.resume_blocked(l, &other).await.unwrap_err();
    assert_eq!(
        e.category(),
        Some(Category::WrongState),
        "another block resumed it: {e}"
    );
    let resumed = s.resume_blocked(l, &this).await.unwrap();
    assert!(!resumed.replayed);
    assert!(
        s.resume_blocked(l, &this).await.unwrap().replayed,
        "resumed twice"
    );
    let (c, conn) = tokio_postgres::connect(&f.db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let row = c
        .query_one(
            "SELECT work_status, blocked_until IS NULL, next_action FROM assignments WHERE assignment_id = $1",
            &[&asg],
        )
        .await
        .unwrap();
    let (status, cleared, next): (String, bool, String) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(status, "active");
    assert!(cleared, "blocked_until outlived the block");
    assert_eq!(next, mosaic::coordinator::resume::RESUMED);
    assert!(s.due_resumes().await.unwrap().is_empty());
}

/// The time a block names belongs to that block alone: any other evidence set over it (a
/// quarantine, an ending's block) clears it, so the watchdog never resumes a block that
/// was not the one with a known end.
#[tokio::test]
async fn a_blocks_end_does_not_outlive_its_evidence() {
    use mosaic::coordinator::continuity::{Blockage, Blocker};
    let f = fx().await;
    let (s, l) = (&f.store, &f.leader);
    let r = running(s, l, &f.lane.lane_incarnation_id).await;
    let asg = r.chain().assignment_id.clone();
    let ev = d('a');
    s.block(
        l,
        &asg,
        &Blocker::Operator,
        &Blockage {
            resume_after_ms: Some(60_000),
            ..Blockage::new("rate-limited", &ev, "wait")
        },
    )
    .await
    .unwrap();
    let (c, conn) = tokio_postgres::connect(&f.db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    async fn until(c: &tokio_postgres::Client, asg: &str) -> bool {
        c.query_one(
            "SELECT blocked_until IS NOT NULL FROM assignments WHERE assignment_id = $1",
            &[&asg],
        )
        .await
        .unwrap()
        .get::<_, bool>(0)
    }
    assert!(until(&c, &asg).await);
    // Another block's evidence written straight over it (the receipt check set aside for
    // this statement alone: the rule under test is the row's own).
    c.batch_execute(&format!(
        "BEGIN; ALTER TABLE assignments DISABLE TRIGGER assignments_requires_receipt; \
         UPDATE assignments SET blocker_code = 'needs-review', blocker_evidence_digest = '{}' WHERE assignment_id = '{asg}'; \
         ALTER TABLE assignments ENABLE TRIGGER assignments_requires_receipt; COMMIT",
        d('b')
    ))
    .await
    .unwrap();
    assert!(
        !until(&c, &asg).await,
        "another block kept the first one's end"
    );
}
