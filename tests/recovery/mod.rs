//! Helpers of the retarget tests: a failed start, a candidate offered for it, the ACK the
//! candidate host would send, and the check that a refused retarget moved nothing.

#![allow(dead_code)]

use crate::{pg, store};
use mosaic::coordinator::recovery::{Offer, RecoveryConsume, Selection};
use mosaic::protocol::messages::RecoveryAck;

pub async fn json_of(url: &str, q: &str) -> serde_json::Value {
    store::sql(url)
        .await
        .query_one(q, &[])
        .await
        .unwrap()
        .get(0)
}

/// The failed target T: a chain on the fixture's lane driven to AWAITING_ACK (a staged
/// generation, an issued challenge) and ended by its host losing it — recovery, on the
/// end-chain receipt — with two more lanes on other hosts to retarget to.
pub async fn failed_start(f: &store::Fx) -> (store::Ready, store::LaneView, store::LaneView) {
    let t = store::to_awaiting_ack(
        &f.store,
        &f.leader,
        &f.lane.lane_incarnation_id,
        None,
        60_000,
    )
    .await;
    f.store
        .end_chain(&f.leader, t.chain(), store::EndCause::Abandoned)
        .await
        .unwrap();
    let u = f
        .store
        .adopt_lane_incarnation(&f.leader, "h2", "h2:w1", &store::uid("li"))
        .await
        .unwrap();
    let v = f
        .store
        .adopt_lane_incarnation(&f.leader, "h3", "h3:w1", &store::uid("li"))
        .await
        .unwrap();
    (t, u, v)
}

pub fn selection(lane: &store::LaneView, failed: &str) -> Selection {
    Selection {
        lane_id: lane.lane_id.clone(),
        lane_incarnation_id: lane.lane_incarnation_id.clone(),
        host_id: lane.host_id.clone(),
        method: "first-idle".into(),
        inputs_digest: store::d('e'),
        excluded_lane: failed.into(),
    }
}

pub fn contracts() -> String {
    mosaic::protocol::contracts_digest(
        "spawn=3 print=hello",
        &store::scope_digest(),
        &store::holds_digest(),
    )
}

pub async fn offer(f: &store::Fx, asg: &str, lane: &store::LaneView) -> Offer {
    offer_for(f, &f.leader, asg, lane, 30_000).await.unwrap()
}

pub async fn offer_for(
    f: &store::Fx,
    l: &store::Leader,
    asg: &str,
    lane: &store::LaneView,
    ttl_ms: i64,
) -> Result<Offer, store::AuthorityError> {
    f.store
        .offer_recovery(
            l,
            asg,
            &selection(lane, "h1:w1"),
            &contracts(),
            ttl_ms,
            &store::uid("rq"),
        )
        .await
}

/// The ACK the candidate host would send, as the service hands it to the CAS.
pub fn ack_of(o: &Offer) -> RecoveryConsume {
    RecoveryConsume {
        ack: RecoveryAck {
            idempotency_key: format!(
                "recovery-ack/{}",
                o.challenge.facts.recovery_handoff_challenge_id
            ),
            facts: o.challenge.facts.clone(),
            acknowledged_recovery_message_id: "sess-test.7".into(),
            acknowledged_recovery_challenge_digest: store::d('a'),
        },
        signer_principal: o.challenge.facts.candidate_principal.clone(),
    }
}

pub fn retarget_req(o: &Offer, c: RecoveryConsume, lane: &str) -> store::ReserveRequest {
    let mut r = store::request(lane, Some(&o.challenge.facts.assignment_id), 60_000);
    r.request_id = store::uid("retarget");
    r.target = o.candidate_lane_id.clone();
    r.recovery = Some(c);
    r
}

/// Nothing moved: the candidate still ISSUED, no reservation beyond T's, the work in
/// recovery with T its named owner.
pub async fn unchanged(f: &store::Fx, o: &Offer, what: &str) {
    unchanged_at(f, o, 1, what).await;
    let a = store::assignment(&f.store, &o.challenge.facts.assignment_id).await;
    assert_eq!(a.responsibility_owner.as_str(), store::TARGET, "{what}");
}

/// Nothing moved: the candidate still ISSUED, the work's `reservations` as many as before,
/// the work in recovery.
pub async fn unchanged_at(f: &store::Fx, o: &Offer, reservations: i64, what: &str) {
    let url = pg::server().url(&f.db.name);
    let asg = &o.challenge.facts.assignment_id;
    let id = &o.challenge.facts.recovery_candidate_id;
    assert_eq!(
        store::count(&url, &format!("SELECT count(*) FROM recovery_candidates WHERE recovery_candidate_id = '{id}' AND state = 'ISSUED'")).await,
        1,
        "{what}: the candidate is still ISSUED"
    );
    assert_eq!(
        store::count(
            &url,
            &format!("SELECT count(*) FROM reservations WHERE assignment_id = '{asg}'")
        )
        .await,
        reservations,
        "{what}: no reservation was made"
    );
    let a = store::assignment(&f.store, asg).await;
    assert_eq!(a.lifecycle.as_str(), "RECOVERY", "{what}");
}

/// A candidate on `lane` whose selection excludes `failed` (T's own lane).
pub async fn offer_excluding(
    f: &store::Fx,
    l: &store::Leader,
    asg: &str,
    lane: &store::LaneView,
    failed: &str,
) -> Offer {
    f.store
        .offer_recovery(
            l,
            asg,
            &selection(lane, failed),
            &contracts(),
            30_000,
            &store::uid("rq"),
        )
        .await
        .unwrap()
}
