//! §17 Post-injection ordinary challenge ordering, through the daemons: the coordinator is
//! SIGKILLed (a failpoint) at each moment of a retarget's start on the candidate's lane — the
//! retarget's allocation before and after its commit, the candidate's process created, its
//! contract injected but not recorded, its challenge issued but not sent — and started
//! again (the work, ended in recovery at the takeover, resumed on U's lane by the operator
//! where U's chain had committed). Whatever the crash, an ordinary challenge exists for a chain only with the record
//! of its verified injection (the same commit, naming the same contract digest), only that
//! challenge is ever ACKed, and only an ACKed chain activates; T never does. A candidate
//! that dies at its injection is never READY and never executes. And a candidate
//! that fails in turn is retargeted again (T → U → V), each move its own candidate.
//!
//! Needs the `failpoints` feature (scripts/test builds it); without it every test fails and
//! says so.

mod common;
mod pg;
mod world;

use world::{assign_request, Spec, World};

/// The world of the end-to-end retarget: two hosts with one lane each, two-second
/// reservations, one coordinator started with `failpoints`. Host 0 is frozen, given the
/// work and killed: its reservation expires (the objective evidence) and the watchdog
/// retargets the work to host 1. Returns the world, the assignment, T's reservation and
/// U's lane.
fn start_retarget(
    tag: &'static str,
    task: &str,
    failpoints: Option<&str>,
) -> (World, String, String, String) {
    world::split::require_failpoints();
    let mut w = World::new(Spec {
        hosts: 2,
        supervisors: 2,
        lanes: 1,
        reservation_ttl_ms: Some(2000),
        tag,
        ..Spec::default()
    });
    w.start_coordinator(0, failpoints);
    w.wait_leading(0);
    w.start_supervisor(0);
    w.start_supervisor(1);
    w.wait_lanes(2);
    let (t_lane, u_lane) = (w.lane_of(0, "lane-1"), w.lane_of(1, "lane-1"));
    let pid = w.sup[0].pid().expect("supervisor 0 runs") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let a = w.op(&assign_request(&t_lane, task, None, false)).unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let t_res = a["reservation_id"].as_str().unwrap().to_string();
    w.crash_supervisor(0);
    (w, id, t_res, u_lane)
}

/// The ordering every chain of the work keeps, read from the database: for each of its
/// reservations, an ordinary challenge exists only once its injection was recorded (issued
/// by the `injected` commit itself, or for a handoff's target by the `activation-challenge`
/// step after it; bound to the reservation's own contract, which the injection delivered);
/// every consumed ACK is of that challenge; only a chain whose ACK was consumed activated. Returns the reservations that activated.
async fn challenge_order_holds(w: &World, id: &str) -> Vec<String> {
    let db = w.sql().await;
    let rows = db
        .query(
            "SELECT r.reservation_id, r.contracts_digest, \
                    (SELECT count(*) FROM challenges c WHERE c.reservation_id = r.reservation_id) AS challenges, \
                    (SELECT c.challenge_id FROM challenges c WHERE c.reservation_id = r.reservation_id) AS challenge, \
                    (SELECT c.contracts_digest FROM challenges c WHERE c.reservation_id = r.reservation_id) AS challenge_digest, \
                    (SELECT count(*) FROM transition_receipts t WHERE t.transition = 'injected' \
                       AND t.body->'chain'->>'reservation_id' = r.reservation_id) AS injected, \
                    coalesce((SELECT t.body->>'challenge_id' FROM transition_receipts t WHERE t.transition = 'injected' \
                                AND t.body->>'challenge_kind' = 'activation' \
                                AND t.body->'chain'->>'reservation_id' = r.reservation_id), \
                             (SELECT t.body->>'challenge_id' FROM transition_receipts t WHERE t.transition = 'activation-challenge' \
                                AND t.body->'chain'->>'reservation_id' = r.reservation_id \
                                AND t.decided_at > (SELECT i.decided_at FROM transition_receipts i WHERE i.transition = 'injected' \
                                                     AND i.body->'chain'->>'reservation_id' = r.reservation_id))) AS issued_challenge, \
                    (SELECT t.body->>'contracts_digest' FROM transition_receipts t WHERE t.transition = 'injected' \
                       AND t.body->'chain'->>'reservation_id' = r.reservation_id) AS injected_digest, \
                    (SELECT count(*) FROM ack_receipts k WHERE k.reservation_id = r.reservation_id) AS acks, \
                    (SELECT count(*) FROM ack_receipts k JOIN challenges c USING (challenge_id) \
                       WHERE k.reservation_id = r.reservation_id AND c.reservation_id = r.reservation_id \
                         AND c.issued_at <= k.consumed_at) AS acks_of_own_challenge, \
                    (SELECT count(*) FROM transition_receipts t WHERE t.transition = 'activate' \
                       AND t.body->'chain'->>'reservation_id' = r.reservation_id) AS activations \
             FROM reservations r WHERE r.assignment_id = $1 ORDER BY r.created_at",
            &[&id],
        )
        .await
        .unwrap();
    let mut activated = Vec::new();
    for r in &rows {
        let res: String = r.get("reservation_id");
        let (challenges, injected): (i64, i64) = (r.get("challenges"), r.get("injected"));
        let challenge: Option<String> = r.get("challenge");
        let issued: Option<String> = r.get("issued_challenge");
        // Issued by the injection's own commit, or — a handoff's target, whose injection
        // carried the handoff challenge — by the activation-challenge step after it.
        assert_eq!(
            challenge, issued,
            "{res}: a challenge only as the receipt of its verified injection or a later step issued it"
        );
        assert!(
            challenges <= injected,
            "{res}: no challenge before its injection was recorded"
        );
        if challenges == 1 {
            let own: String = r.get("contracts_digest");
            let bound: Option<String> = r.get("challenge_digest");
            let delivered: Option<String> = r.get("injected_digest");
            assert_eq!(
                bound.as_deref(),
                Some(own.as_str()),
                "{res}: the challenge binds the chain's contract"
            );
            assert_eq!(
                delivered.as_deref(),
                Some(own.as_str()),
                "{res}: the injection delivered it"
            );
        }
        let (acks, own_acks, activations): (i64, i64, i64) = (
            r.get("acks"),
            r.get("acks_of_own_challenge"),
            r.get("activations"),
        );
        assert_eq!(
            acks, own_acks,
            "{res}: every ACK is of the chain's own post-injection challenge"
        );
        assert!(acks <= injected, "{res}: no ACK without an injection");
        assert!(
            activations <= acks,
            "{res}: no activation without a consumed ACK"
        );
        if activations > 0 {
            activated.push(res);
        }
    }
    activated
}

/// The work reached RUNNING on U's lane; T's chain never activated; exactly one candidate
/// was consumed, and its reservation is the chain right after T's.
async fn ends_running_on_the_candidate(w: &World, id: &str, t_res: &str, u_lane: &str) {
    w.wait_count(
        &running_on(id, u_lane),
        |n| n == 1,
        "the work RUNNING on the candidate's lane",
    )
    .await;
    let activated = challenge_order_holds(w, id).await;
    assert_eq!(activated.len(), 1, "one chain activated: {activated:?}");
    assert_ne!(activated[0], t_res, "T never activated");
    let db = w.sql().await;
    let chains: Vec<String> = db
        .query(
            "SELECT reservation_id FROM reservations WHERE assignment_id = $1 ORDER BY created_at",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(chains[0], t_res);
    let consumed: Vec<Option<String>> = db
        .query(
            "SELECT retarget_reservation_id FROM recovery_candidates WHERE assignment_id = $1 AND state = 'CONSUMED'",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        consumed,
        vec![Some(chains[1].clone())],
        "one candidate consumed, by the chain after T's"
    );
}

fn running_on(id: &str, lane: &str) -> String {
    format!(
        "SELECT count(*) FROM assignments a JOIN lane_incarnations li USING (lane_incarnation_id) \
         WHERE a.assignment_id = '{id}' AND li.lane_id = '{lane}' AND li.state = 'RUNNING' \
           AND a.execution_owner = '{lane}'"
    )
}

/// How the work goes on after the restart.
#[derive(PartialEq)]
enum After {
    /// Nothing of U's chain committed: the retarget completes by itself.
    ByItself,
    /// U's chain was reserved under the dead coordinator's epoch: the new leader ends it in
    /// recovery at its takeover (a takeover is no evidence of U's failure, so no candidate
    /// follows), and the operator resumes the work on U's lane — a fresh chain there.
    Resumed,
}

/// One row: the coordinator dies at `point` during the retarget, and the one started after
/// it leaves the ordering intact until the work runs on U.
async fn crash_during_retarget(tag: &'static str, point: &str, after: After) {
    let (mut w, id, t_res, u_lane) = start_retarget(tag, "hang", Some(point));
    w.wait_coordinator_died(0, point);
    let log = std::fs::read_to_string(w.coordinator_log(0)).unwrap_or_default();
    let name = point.split('=').next().unwrap_or(point);
    assert!(
        log.contains(&format!("failpoint={name}"))
            && log.contains("failpoint: killing this process"),
        "the coordinator died at {name}"
    );
    // What the crash left is already ordered, before anybody repairs anything.
    challenge_order_holds(&w, &id).await;
    w.start_coordinator(0, None);
    w.wait_leading(0);
    if after == After::Resumed {
        w.wait_count(
            &format!(
                "SELECT count(*) FROM assignments a WHERE a.assignment_id = '{id}' AND a.lifecycle = 'RECOVERY' \
                   AND (SELECT count(*) FROM reservations r WHERE r.assignment_id = a.assignment_id \
                          AND r.released_at IS NOT NULL) = 2"
            ),
            |n| n == 1,
            "U's chain ended in recovery at the takeover",
        )
        .await;
        challenge_order_holds(&w, &id).await;
        // T's generation was never observed to end (its host died): until it is, no new
        // chain of the work may start anywhere. The operator brings T's host back, which
        // reports that generation never started.
        w.start_supervisor(0);
        // U's lane clean again (a generation the takeover stopped may have it recreated).
        w.wait_count(
            &format!(
                "SELECT count(*) FROM lane_incarnations WHERE lane_id = '{u_lane}' AND retired_at IS NULL \
                   AND state = 'IDLE_CLEAN'"
            ),
            |n| n == 1,
            "U's lane clean",
        )
        .await;
        // Taken once U's host has its session with the new leader again, and U's
        // generation (if it had one) was observed to end.
        common::wait_until("the resume taken", || {
            use mosaic::coordinator::Category;
            match w.op(&assign_request(&u_lane, "", Some(&id), false)) {
                Err(e)
                    if matches!(
                        e.category,
                        Category::HostUnreachable | Category::Unreconciled
                    ) =>
                {
                    None
                }
                r => Some(r),
            }
        })
        .unwrap();
    }
    ends_running_on_the_candidate(&w, &id, &t_res, &u_lane).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_before_the_retarget_allocation_commits() {
    // T's reservation is the first `reserve`; the retarget's consuming CAS is the second.
    crash_during_retarget(
        "rtf-alloc-pre",
        "before-commit:reserve=1*off->return",
        After::ByItself,
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_after_the_retarget_allocation_commits() {
    crash_during_retarget(
        "rtf-alloc-post",
        "after-commit:reserve=1*off->return",
        After::Resumed,
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_once_the_candidates_process_exists() {
    // T's host is frozen before it stages anything: the first `staged` is U's.
    crash_during_retarget("rtf-process", "after-commit:staged=return", After::Resumed).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_with_the_injection_verified_and_not_recorded() {
    crash_during_retarget(
        "rtf-inject",
        "before-commit:injected=return",
        After::Resumed,
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_with_the_challenge_issued_and_not_sent() {
    crash_during_retarget(
        "rtf-challenge",
        "before-push:challenge=return",
        After::Resumed,
    )
    .await
}

/// The candidate's harness dies the moment its contract is delivered (`quit-at-contract`):
/// its injection was verified, so its chain has its challenge, and nothing else — no ACK,
/// no READY, no activation, no execution owner. (An injection that fails before it is
/// verified — another contract, another process — issues no challenge at all: the
/// `injected` CAS refuses it, `tests/retarget_matrix.rs`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_that_dies_at_its_injection_is_never_ready() {
    let (w, id, t_res, _u_lane) = start_retarget("rtf-quit", "quit-at-contract", None);
    w.wait_count(
        &format!(
            "SELECT count(*) FROM reservations r WHERE r.assignment_id = '{id}' AND r.reservation_id <> '{t_res}' \
               AND r.released_at IS NOT NULL"
        ),
        |n| n >= 1,
        "the candidate's chain ended",
    )
    .await;
    let activated = challenge_order_holds(&w, &id).await;
    assert!(activated.is_empty(), "{activated:?}");
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM ack_receipts k JOIN reservations r USING (reservation_id) \
             WHERE r.assignment_id = '{id}'"
        ))
        .await,
        0,
        "no ACK"
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'consume-ack' AND assignment_id = '{id}'"
        ))
        .await,
        0,
        "never READY"
    );
    let owner: Option<String> = w
        .sql()
        .await
        .query_one(
            "SELECT execution_owner FROM assignments WHERE assignment_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, None, "nobody executes the work");
}

/// Chained recovery T → U → V through the daemons: T's host is frozen and killed; U's host
/// (the policy's first idle lane after T's) dies the moment U's stage reaches it (the
/// `host:stage` failpoint), before it starts anything; U's reservation expires in turn and
/// the work moves on to V's host. Each move is its own consumed candidate bound to the
/// chain that failed; neither T nor U ever activated; the responsibility owner is T, then
/// U, then V, one at a time; V runs it.
#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_that_fails_before_activation_is_retargeted_again() {
    let (mut w, lanes) = three_hosts("rtf-chain", "host:stage=return");
    let pid = w.sup[0].pid().expect("supervisor 0 runs") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let a = w
        .op(&assign_request(&lanes[0], "hang", None, false))
        .unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let t_res = a["reservation_id"].as_str().unwrap().to_string();
    w.crash_supervisor(0);

    w.wait_count(
        &format!(
            "SELECT count(*) FROM assignments a JOIN lane_incarnations li USING (lane_incarnation_id) \
             WHERE a.assignment_id = '{id}' AND li.lane_id = '{}' AND li.state = 'RUNNING' \
               AND a.execution_owner = '{}'",
            lanes[2], lanes[2]
        ),
        |n| n == 1,
        "the work RUNNING on V's lane",
    )
    .await;
    assert!(
        w.sup[1].exited().is_some(),
        "U's host died at its stage (the failpoint)"
    );
    let activated = challenge_order_holds(&w, &id).await;
    let db = w.sql().await;
    let chain = db
        .query(
            "SELECT r.reservation_id, li.lane_id FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) \
             WHERE r.assignment_id = $1 ORDER BY r.created_at",
            &[&id],
        )
        .await
        .unwrap();
    let on: Vec<String> = chain.iter().map(|r| r.get(1)).collect();
    assert_eq!(on, lanes, "T's chain, then U's, then V's");
    let res: Vec<String> = chain.iter().map(|r| r.get(0)).collect();
    assert_eq!(res[0], t_res);
    assert_eq!(activated, vec![res[2].clone()], "only V's chain activated");
    let cands = db
        .query(
            "SELECT failed_reservation_id, retarget_reservation_id, candidate_lane_id \
             FROM recovery_candidates WHERE assignment_id = $1 AND state = 'CONSUMED' ORDER BY consumed_at",
            &[&id],
        )
        .await
        .unwrap();
    let moves: Vec<(String, Option<String>, String)> = cands
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        moves,
        vec![
            (res[0].clone(), Some(res[1].clone()), lanes[1].clone()),
            (res[1].clone(), Some(res[2].clone()), lanes[2].clone()),
        ],
        "each move consumed one candidate bound to the chain that failed"
    );
    let owners: Vec<String> = db
        .query(
            "SELECT body->>'responsibility_owner' FROM transition_receipts \
             WHERE transition = 'reserve' AND body->'chain'->>'assignment_id' = $1 ORDER BY decided_at",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(owners, lanes, "one responsibility owner at a time: T, U, V");
}

/// Pre-transfer retarget through the daemons (§6.3.3): S runs on host 0; its handoff to
/// host 1's lane fails before any ACK (host 1 dies with T's stage in hand), so the offer
/// ends and the work is S's alone again. The operator retargets: the candidate on host 2
/// binds S's attempt, and the CAS that consumes its ACK is the offer to U's lane —
/// `(S,S,U)` — which U's harness acknowledges like any handoff; U then activates through
/// its own challenge, and only then is the work `(U,U,NULL)`. T never activated.
#[tokio::test(flavor = "multi_thread")]
async fn a_handoff_whose_target_dies_is_retargeted_pre_transfer_through_the_daemons() {
    use mosaic::coordinator::service::OperatorRequest;
    let (mut w, lanes) = three_hosts("rtf-pre", "host:stage=return");
    let a = w
        .op(&assign_request(&lanes[0], "hang", None, true))
        .unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    w.op(&OperatorRequest::Handoff {
        assignment_id: id.clone(),
        lane_id: lanes[1].clone(),
        task: Some("accept-handoff hang".into()),
        within_ms: Some(3000),
        request_id: None,
    })
    .unwrap();
    // T's host died with T's stage; the offer ends and the work is S's alone.
    w.wait_count(
        &format!(
            "SELECT count(*) FROM assignments WHERE assignment_id = '{id}' AND pending_target IS NULL \
               AND lifecycle = 'ACTIVE' AND (SELECT count(*) FROM handoffs h WHERE h.assignment_id = '{id}' \
                                             AND h.state <> 'OFFERED' AND h.state <> 'CHALLENGED') = 1"
        ),
        |n| n == 1,
        "the failed offer ended, the work S's again",
    )
    .await;
    assert!(w.sup[1].exited().is_some(), "T's host died at its stage");
    let s = Some(lanes[0].clone());
    assert_eq!(
        owners(&w, &id).await,
        (s.clone(), s.clone(), None, "ACTIVE".into())
    );

    let r = common::wait_until("the operator's retarget offered", || {
        match w.op(&OperatorRequest::Retarget {
            assignment_id: id.clone(),
            request_id: Some("pre-transfer".into()),
        }) {
            Ok(v) => Some(v),
            // T's end is ingested a moment after the offer ends.
            Err(e) if e.category == mosaic::coordinator::Category::WrongState => None,
            Err(e) => panic!("retarget: {e}"),
        }
    });
    assert!(r.to_string().contains("pre-transfer"), "{r}");
    w.wait_count(
        &running_on(&id, &lanes[2]),
        |n| n == 1,
        "the work RUNNING on U",
    )
    .await;
    let u = Some(lanes[2].clone());
    assert_eq!(
        owners(&w, &id).await,
        (u.clone(), u.clone(), None, "ACTIVE".into())
    );
    let db = w.sql().await;
    type Offer = (Option<String>, Option<String>, Option<String>, bool);
    let offers: Vec<Offer> = db
        .query(
            "SELECT body->>'responsibility_owner', body->>'execution_owner', body->>'pending_target', \
                    body->'retarget' IS NOT NULL AND jsonb_typeof(body->'retarget') = 'object' \
             FROM transition_receipts WHERE transition = 'handoff-offer' AND assignment_id = $1 ORDER BY decided_at",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        offers,
        vec![
            (s.clone(), s.clone(), Some(lanes[1].clone()), false),
            (s.clone(), s.clone(), u.clone(), true),
        ],
        "the offer to T, then the retarget's offer to U: (S,S,U), consuming the candidate"
    );
    let cands: Vec<(String, String)> = db
        .query(
            "SELECT expected_retarget_operation, candidate_lane_id FROM recovery_candidates \
             WHERE assignment_id = $1 AND state = 'CONSUMED'",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(cands, vec![("pre-transfer".to_string(), lanes[2].clone())]);
    let activated = challenge_order_holds(&w, &id).await;
    let on = lanes_of(&w, &activated).await;
    assert_eq!(on.len(), 2, "S's and U's chains activated: {activated:?}");
    assert!(!on.contains(&lanes[1]), "T never activated");
}

/// The work's owners `(responsibility, execution, pending target)` and its lifecycle.
async fn owners(w: &World, id: &str) -> (Option<String>, Option<String>, Option<String>, String) {
    let r = w
        .sql()
        .await
        .query_one(
            "SELECT responsibility_owner, execution_owner, pending_target, lifecycle \
             FROM assignments WHERE assignment_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// Post-transfer retarget through the daemons (§6.3.4): S runs on host 0 and hands off to
/// T on host 1; T acknowledges, the acceptance commits (responsibility is T's:
/// `(T,NULL,T)`), and host 1 dies the moment T's activation challenge arrives (the
/// `host:challenged-after-handoff` failpoint). T's reservation expires; the watchdog
/// retargets by itself, once S's generation is proven ended, to the policy's first idle
/// lane — S's own, free again — as a fresh chain: `(U,NULL,U)`, then U's own activation,
/// `(U,U,NULL)`. T never activated.
#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_handoff_whose_target_dies_is_retargeted_post_transfer_through_the_daemons() {
    use mosaic::coordinator::service::OperatorRequest;
    let (mut w, lanes) = three_hosts("rtf-post", "host:challenged-after-handoff=return");
    let a = w
        .op(&assign_request(&lanes[0], "hang", None, true))
        .unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    w.op(&OperatorRequest::Handoff {
        assignment_id: id.clone(),
        lane_id: lanes[1].clone(),
        task: Some("accept-handoff hang".into()),
        within_ms: None,
        request_id: None,
    })
    .unwrap();
    // The policy's first idle lane by lane id, besides T's: S's own, free since S was
    // fenced at the acceptance.
    let u_lane = lanes[0].clone();
    w.wait_count(
        &format!(
            "SELECT count(*) FROM recovery_candidates c JOIN transition_receipts t ON t.transition = 'activate' \
               AND t.body->'chain'->>'reservation_id' = c.retarget_reservation_id \
             WHERE c.assignment_id = '{id}' AND c.state = 'CONSUMED'"
        ),
        |n| n == 1,
        "U's chain activated",
    )
    .await;
    assert_eq!(w.count(&running_on(&id, &u_lane)).await, 1, "RUNNING on U");
    assert!(
        w.sup[1].exited().is_some(),
        "T's host died at its activation challenge"
    );
    let u = Some(u_lane.clone());
    assert_eq!(
        owners(&w, &id).await,
        (u.clone(), u.clone(), None, "ACTIVE".into())
    );
    let db = w.sql().await;
    let accepted = w
        .count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'handoff-accept' AND assignment_id = '{id}'"
        ))
        .await;
    assert_eq!(accepted, 1, "T's acceptance committed");
    let cands: Vec<(String, String)> = db
        .query(
            "SELECT expected_retarget_operation, candidate_lane_id FROM recovery_candidates \
             WHERE assignment_id = $1 AND state = 'CONSUMED'",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(cands, vec![("post-transfer".to_string(), u_lane.clone())]);
    // U's reservation: (U,NULL,U), decided after S's generation was proven ended.
    let row = db
        .query_one(
            "SELECT t.body->>'responsibility_owner', t.body->>'execution_owner', t.body->>'pending_target', \
                    t.decided_at > (SELECT max(x.ingested_at) FROM termination_receipts x WHERE x.assignment_id = $1 AND x.lane_id = $2) \
             FROM transition_receipts t WHERE t.transition = 'reserve' AND t.body->'chain'->>'assignment_id' = $1 \
               AND t.body->'retarget' IS NOT NULL AND jsonb_typeof(t.body->'retarget') = 'object'",
            &[&id, &lanes[0]],
        )
        .await
        .unwrap();
    let got: (Option<String>, Option<String>, Option<String>, Option<bool>) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(got, (u.clone(), None, u.clone(), Some(true)));
    let activated = challenge_order_holds(&w, &id).await;
    let on = lanes_of(&w, &activated).await;
    assert_eq!(on.len(), 2, "S's and U's chains activated: {activated:?}");
    assert!(!on.contains(&lanes[1]), "T never activated");
}

/// Three hosts with one lane each, two-second reservations, one coordinator; host 1's
/// supervisor started with `host1_failpoints`. Returns the world and the three lanes.
fn three_hosts(tag: &'static str, host1_failpoints: &str) -> (World, Vec<String>) {
    world::split::require_failpoints();
    let mut w = World::new(Spec {
        hosts: 3,
        supervisors: 3,
        lanes: 1,
        reservation_ttl_ms: Some(2000),
        tag,
        ..Spec::default()
    });
    w.start_coordinator(0, None);
    w.wait_leading(0);
    w.start_supervisor(0);
    w.sup[1].start(Some(host1_failpoints));
    w.start_supervisor(2);
    w.wait_lanes(3);
    let lanes = (0..3).map(|h| w.lane_of(h, "lane-1")).collect();
    (w, lanes)
}

/// The lanes of these reservations.
async fn lanes_of(w: &World, reservations: &[String]) -> Vec<String> {
    w.sql()
        .await
        .query(
            "SELECT li.lane_id FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id) \
             WHERE r.reservation_id = ANY($1)",
            &[&reservations],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}
