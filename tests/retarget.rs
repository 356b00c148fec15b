//! Preactivation retarget (spec §6.3, §7.3–§7.5): work whose start failed before activation
//! moves to another lane only through a recovery candidate — a candidate row that grants
//! nothing, a challenge signed by the coordinator's recovery key, the candidate host's ACK
//! signed by its own recovery key, and the one reservation CAS that consumes it against the
//! exact failed-target snapshot. On real daemons, tmux, cgroups and PostgreSQL; and the CAS
//! matrix on the store, one row per bound fact.

mod common;
mod pg;
mod store;
mod world;

use mosaic::coordinator::service::OperatorRequest;
use mosaic::coordinator::Category;
use serde_json::Value;
use world::{assign_request, Spec, World};

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
