//! §17 Initial-assignment retarget matrix and Recovery deadline boundary, on the store and
//! real PostgreSQL.
//!
//! The matrix: a target T fails (its host loses the chain: an objective end-chain receipt)
//! at every initial boundary from RESERVED to its activation attempt, one row each. In
//! every row the candidate's snapshot binds a null source attempt and handoff receipt and
//! the boundary's own facts; then both orders of the race. T first: every late T step is
//! refused by its own fence and moves nothing the snapshot binds, and where T has a
//! generation its host's termination receipt (a real T mutation) makes the ACK of the
//! older snapshot worthless. Retarget first: the one CAS consumes the ACK, every late T
//! artifact is refused, exactly one chain exists for U, and nobody executes the work until
//! U's own ordinary activation.

mod pg;
mod recovery;
mod store;

use mosaic::coordinator::{Category, Chain, Leader, Reserved, Store};
use recovery::*;
use serde_json::{json, Value};

/// How far T got before it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Boundary {
    Reserved,
    Checkpointed,
    Fenced,
    /// Its generation allocated, nothing staged yet.
    Staging,
    /// Its generation staged with its identity; the contract not yet injected.
    Injecting,
    /// The contract injected, its ordinary challenge issued.
    AwaitingAck,
    /// Its ACK consumed; the activation prepared and never committed.
    Ready,
}

const ROWS: [Boundary; 7] = [
    Boundary::Reserved,
    Boundary::Checkpointed,
    Boundary::Fenced,
    Boundary::Staging,
    Boundary::Injecting,
    Boundary::AwaitingAck,
    Boundary::Ready,
];

/// A chain's facts as far as it was driven.
struct Driven {
    res: Reserved,
    generation: Option<i64>,
    identity: Value,
    contracts: Option<String>,
    challenge: Option<String>,
}

impl Driven {
    fn chain(&self) -> &Chain {
        &self.res.chain
    }

    fn ready(&self) -> Option<store::Ready> {
        Some(store::Ready {
            res: self.res.clone(),
            generation: self.generation?,
            identity: self.identity.clone(),
            contracts: self.contracts.clone()?,
            challenge: self.challenge.clone()?,
            scope_digest: store::scope_digest(),
            holds_digest: store::holds_digest(),
        })
    }
}

/// Drives a reserved chain through every step up to `upto`.
async fn drive(s: &Store, l: &Leader, res: Reserved, upto: Boundary) -> Driven {
    let c = res.chain.clone();
    let mut d = Driven {
        res,
        generation: None,
        identity: json!(null),
        contracts: None,
        challenge: None,
    };
    if upto >= Boundary::Checkpointed {
        s.checkpoint(l, &c).await.unwrap();
    }
    if upto >= Boundary::Fenced {
        s.fence(l, &c).await.unwrap();
    }
    if upto >= Boundary::Staging {
        let (g, _) = s.stage(l, &c).await.unwrap();
        d.generation = Some(g);
        d.identity = store::identity(4000 + g);
    }
    if upto >= Boundary::Injecting {
        let staged = s
            .record_staged(l, &c, d.generation.unwrap(), &d.identity, None)
            .await
            .unwrap();
        d.contracts = Some(staged.str("contracts_digest").unwrap());
    }
    if upto >= Boundary::AwaitingAck {
        let (challenge, _, _) = s
            .record_injected(l, &c, d.contracts.as_ref().unwrap(), &d.identity, 60_000)
            .await
            .unwrap();
        d.challenge = Some(challenge);
    }
    if upto >= Boundary::Ready {
        s.consume_ack(l, &store::ack(l, &d.ready().unwrap()))
            .await
            .unwrap();
    }
    d
}

/// Every step T could still try after it failed, the one after its boundary first: that
/// one was never taken, so it must be refused; the others are refused or answered as
/// replays of what T already did. Returns the categories of the refusals.
async fn late_t(
    s: &Store,
    l: &Leader,
    t: &Driven,
    at: Boundary,
    activation: Option<&mosaic::coordinator::Activation>,
) -> Vec<(&'static str, Option<Category>)> {
    let c = t.chain();
    let g = t.generation.unwrap_or(1);
    let identity = store::identity(4000 + g);
    let contracts = t.contracts.clone().unwrap_or_else(contracts);
    let cat = |e: store::AuthorityError| e.category().unwrap_or(Category::Internal);
    let mut out = vec![
        ("checkpoint", s.checkpoint(l, c).await.err().map(cat)),
        ("fence", s.fence(l, c).await.err().map(cat)),
        ("stage", s.stage(l, c).await.err().map(cat)),
        (
            "record-staged",
            s.record_staged(l, c, g, &identity, None)
                .await
                .err()
                .map(cat),
        ),
        (
            "record-injected",
            s.record_injected(l, c, &contracts, &identity, 60_000)
                .await
                .err()
                .map(cat),
        ),
        (
            "issue-challenge",
            s.issue_activation_challenge(l, c, 60_000)
                .await
                .err()
                .map(cat),
        ),
    ];
    if let Some(r) = t.ready() {
        out.push((
            "consume-ack",
            s.consume_ack(l, &store::ack(l, &r)).await.err().map(cat),
        ));
    }
    if let Some(x) = activation {
        out.push(("activate", s.activate(l, x).await.err().map(cat)));
    }
    let next = match at {
        Boundary::Reserved => "checkpoint",
        Boundary::Checkpointed => "fence",
        Boundary::Fenced => "stage",
        Boundary::Staging => "record-staged",
        Boundary::Injecting => "record-injected",
        Boundary::AwaitingAck => "consume-ack",
        Boundary::Ready => "activate",
    };
    let (_, refused) = out.iter().find(|(step, _)| *step == next).unwrap();
    // Refused for what it is — a step of a chain that is over — not as malformed.
    assert!(
        refused.is_some_and(|c| !matches!(c, Category::BadInput | Category::Internal)),
        "{at:?}: T's late {next} was not refused as a step of an ended chain: {refused:?}"
    );
    out
}

async fn snapshot_digest(url: &str, asg: &str) -> String {
    json_of(
        url,
        &format!("SELECT to_jsonb(mosaic_failed_target_snapshot_digest('{asg}'))"),
    )
    .await
    .as_str()
    .unwrap()
    .to_string()
}

/// The work's transition receipts (every step names its assignment): a late T step that
/// were admitted would add one.
async fn receipts_of(url: &str, t: &Chain) -> i64 {
    store::count(
        url,
        &format!(
            "SELECT count(*) FROM transition_receipts WHERE assignment_id = '{}'",
            t.assignment_id
        ),
    )
    .await
}

fn owners(a: &mosaic::coordinator::AssignmentView) -> (String, Option<String>, Option<String>) {
    (
        a.responsibility_owner.clone(),
        a.execution_owner.clone(),
        a.pending_target.clone(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn every_initial_boundary_retargets_only_through_the_exact_snapshot_in_both_orders() {
    let f = store::fx().await;
    let (s, l) = (&f.store, &f.leader);
    let url = pg::server().url(&f.db.name);
    for (k, at) in ROWS.into_iter().enumerate() {
        let t_name = format!("{}:m{k}", store::HOST);
        let u_name = format!("h2:m{k}");
        let t_lane = s
            .adopt_lane_incarnation(l, store::HOST, &t_name, &store::uid("li"))
            .await
            .unwrap();
        let u = s
            .adopt_lane_incarnation(l, "h2", &u_name, &store::uid("li"))
            .await
            .unwrap();
        let res = s
            .reserve(
                l,
                &store::request(&t_lane.lane_incarnation_id, None, 60_000),
            )
            .await
            .unwrap();
        let t = drive(s, l, res, at).await;
        // The activation T would send, built while it could still be (READY only).
        let activation = match t.ready() {
            Some(r) if at == Boundary::Ready => Some(store::activation(s, &r).await),
            _ => None,
        };
        let asg = t.chain().assignment_id.clone();
        s.end_chain(l, t.chain(), store::EndCause::Abandoned)
            .await
            .unwrap();
        let a = store::assignment(s, &asg).await;
        assert_eq!(
            (a.lifecycle.as_str(), a.execution_owner.as_deref()),
            ("RECOVERY", None),
            "{at:?}"
        );

        // The candidate binds the boundary's facts, each as a value or an explicit null.
        let n = offer_excluding(&f, l, &asg, &u, &t_name).await;
        assert_eq!(
            n.challenge.facts.expected_retarget_operation, "initial",
            "{at:?}"
        );
        let snap = json_of(&url, &format!(
            "SELECT failed_target_snapshot FROM recovery_candidates WHERE recovery_candidate_id = '{}'",
            n.challenge.facts.recovery_candidate_id)).await;
        let has_gen = at >= Boundary::Staging;
        let expect = json!({
            "source_assignment_attempt_id": null,
            "handoff_receipt_digest": null,
            "execution_owner": null,
            "activation_idempotency_identity": null,
            "failed_target_attempt_id": t.chain().assignment_attempt_id,
            "failed_target_generation": t.generation,
            "reservation_id": t.chain().reservation_id,
            "challenge_id": t.challenge,
            "challenge_consumption_state": match at {
                Boundary::AwaitingAck => "invalidated",
                Boundary::Ready => "consumed",
                _ => "unissued",
            },
            "ready_state": (at == Boundary::Ready).then_some("READY"),
        });
        // Present with the value, or present as an explicit null (a missing key is not null).
        for (field, want) in expect.as_object().unwrap() {
            assert_eq!(
                snap.get(field),
                Some(want),
                "{at:?}: snapshot field {field}"
            );
        }
        assert_eq!(
            snap.get("ack_receipt_digest").map(Value::is_null),
            Some(at != Boundary::Ready),
            "{at:?}"
        );

        // T first: every late step is refused and moves nothing the snapshot binds.
        let (digest0, receipts0) = (
            snapshot_digest(&url, &asg).await,
            receipts_of(&url, t.chain()).await,
        );
        assert_eq!(
            digest0, n.challenge.facts.failed_target_snapshot_digest,
            "{at:?}"
        );
        let late = late_t(s, l, &t, at, activation.as_ref()).await;
        assert_eq!(
            snapshot_digest(&url, &asg).await,
            digest0,
            "{at:?}: a late T step moved the snapshot: {late:?}"
        );
        assert_eq!(
            receipts_of(&url, t.chain()).await,
            receipts0,
            "{at:?}: a late T step was decided: {late:?}"
        );
        // A T mutation that is admitted — its host's receipt of its generation's end —
        // invalidates the ACK of the older snapshot.
        let candidate = if has_gen {
            let r = store::Ready {
                res: t.res.clone(),
                generation: t.generation.unwrap(),
                identity: t.identity.clone(),
                contracts: String::new(),
                challenge: String::new(),
                scope_digest: String::new(),
                holds_digest: String::new(),
            };
            s.ingest_termination(l, store::HOST, &store::receipt_for(&r, "abandoned", true))
                .await
                .unwrap();
            assert_ne!(
                snapshot_digest(&url, &asg).await,
                digest0,
                "{at:?}: the receipt is a T mutation"
            );
            let e = s
                .reserve(l, &retarget_req(&n, ack_of(&n), &u.lane_incarnation_id))
                .await
                .unwrap_err();
            assert_eq!(e.category(), Some(Category::SnapshotChanged), "{at:?}: {e}");
            unchanged_at(&f, &n, 1, &format!("{at:?}, mutation first")).await;
            offer_excluding(&f, l, &asg, &u, &t_name).await
        } else {
            n
        };

        // Retarget first: one CAS consumes the ACK and allocates U's one chain.
        let won = s
            .reserve(
                l,
                &retarget_req(&candidate, ack_of(&candidate), &u.lane_incarnation_id),
            )
            .await
            .unwrap();
        assert_eq!(
            store::count(&url, &format!(
                "SELECT count(*) FROM recovery_candidates WHERE recovery_candidate_id = '{}' AND state = 'CONSUMED'",
                candidate.challenge.facts.recovery_candidate_id)).await,
            1,
            "{at:?}"
        );
        let a = store::assignment(s, &asg).await;
        assert_eq!(
            owners(&a),
            (u_name.clone(), None, Some(u_name.clone())),
            "{at:?}"
        );
        let receipts1 = receipts_of(&url, t.chain()).await;
        let late = late_t(s, l, &t, at, activation.as_ref()).await;
        // (An ACK T had consumed is answered as the replay it is; its activation, never
        // committed, is refused.)
        assert!(
            late.iter()
                .filter(|(step, _)| *step == "activate")
                .all(|(_, r)| r.is_some()),
            "{at:?}: {late:?}"
        );
        assert_eq!(
            receipts_of(&url, t.chain()).await,
            receipts1,
            "{at:?}: a late T step after the retarget: {late:?}"
        );
        assert_eq!(
            owners(&store::assignment(s, &asg).await),
            owners(&a),
            "{at:?}"
        );
        assert_eq!(
            store::count(&url, &format!(
                "SELECT count(*) FROM reservations WHERE assignment_id = '{asg}' AND lane_incarnation_id = '{}'",
                u.lane_incarnation_id)).await,
            1,
            "{at:?}: exactly one chain for U"
        );
        // No ordinary challenge for U before its own contract injection; execution stays
        // nobody's until U's ordinary activation.
        let ud = drive(s, l, won.clone(), Boundary::Injecting).await;
        let u_challenges = || async {
            store::count(
                &url,
                &format!(
                    "SELECT count(*) FROM challenges WHERE reservation_id = '{}'",
                    won.chain.reservation_id
                ),
            )
            .await
        };
        assert!(
            s.issue_activation_challenge(l, ud.chain(), 60_000)
                .await
                .is_err(),
            "{at:?}"
        );
        assert_eq!(u_challenges().await, 0, "{at:?}");
        // A failed injection — another contract delivered, or delivered to another
        // process — records nothing and issues no challenge.
        let mut other_process = ud.identity.clone();
        other_process["root_pid"] = serde_json::json!(1);
        let other_contract = format!("sha256:{}", "e".repeat(64));
        for (what, delivered, identity) in [
            ("another contract", other_contract.as_str(), &ud.identity),
            (
                "another process",
                ud.contracts.as_deref().unwrap(),
                &other_process,
            ),
        ] {
            assert!(
                s.record_injected(l, ud.chain(), delivered, identity, 60_000)
                    .await
                    .is_err(),
                "{at:?}: {what}"
            );
            assert_eq!(u_challenges().await, 0, "{at:?}: {what}: no challenge");
        }
        let (challenge, _, _) = s
            .record_injected(
                l,
                ud.chain(),
                ud.contracts.as_ref().unwrap(),
                &ud.identity,
                60_000,
            )
            .await
            .unwrap();
        let ur = store::Ready {
            challenge,
            ..ud.ready_parts()
        };
        s.consume_ack(l, &store::ack(l, &ur)).await.unwrap();
        assert_eq!(
            store::assignment(s, &asg).await.execution_owner,
            None,
            "{at:?}"
        );
        s.activate(l, &store::activation(s, &ur).await)
            .await
            .unwrap();
        assert_eq!(
            owners(&store::assignment(s, &asg).await),
            (u_name.clone(), Some(u_name.clone()), None),
            "{at:?}"
        );
    }
}

impl Driven {
    /// Its facts as a `Ready`, the challenge left to the caller.
    fn ready_parts(&self) -> store::Ready {
        store::Ready {
            res: self.res.clone(),
            generation: self.generation.unwrap(),
            identity: self.identity.clone(),
            contracts: self.contracts.clone().unwrap(),
            challenge: String::new(),
            scope_digest: store::scope_digest(),
            holds_digest: store::holds_digest(),
        }
    }
}

/// §17 Recovery deadline boundary: the candidate's ACK is consumed only while database
/// time is before its `recovery_deadline`. With the database clock frozen, the instant of
/// the deadline itself is expired — nothing moves — and one microsecond before it the
/// same ACK is consumed.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovery_ack_at_its_exact_deadline_is_expired_and_a_microsecond_before_is_not() {
    let (f, admin) = store::frozen_fx().await;
    let (t, u, _v) = failed_start(&f).await;
    let asg = t.chain().assignment_id.clone();
    let o = offer(&f, &asg, &u).await;
    let at = |shift: &str| {
        format!(
            "UPDATE frozen.now SET t = (SELECT recovery_deadline::timestamptz {shift} \
             FROM recovery_candidates WHERE recovery_candidate_id = '{}')",
            o.challenge.facts.recovery_candidate_id
        )
    };
    admin.batch_execute(&at("")).await.unwrap();
    assert!(
        f.store
            .open_recovery_candidate(&asg, f.leader.epoch())
            .await
            .unwrap()
            .is_none(),
        "a candidate at its deadline is not open"
    );
    let e = f
        .store
        .reserve(
            &f.leader,
            &retarget_req(&o, ack_of(&o), &u.lane_incarnation_id),
        )
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::Expired), "{e}");
    // Nothing moved (read on the frozen schema, where the store's search path put it).
    let issued = format!(
        "SELECT count(*) FROM recovery_candidates WHERE recovery_candidate_id = '{}' AND state = 'ISSUED'",
        o.challenge.facts.recovery_candidate_id
    );
    let chains = format!("SELECT count(*) FROM reservations WHERE assignment_id = '{asg}'");
    assert_eq!(store::admin_count(&admin, &issued).await, 1);
    assert_eq!(store::admin_count(&admin, &chains).await, 1);

    admin
        .batch_execute(&at("- interval '1 microsecond'"))
        .await
        .unwrap();
    assert!(f
        .store
        .open_recovery_candidate(&asg, f.leader.epoch())
        .await
        .unwrap()
        .is_some());
    let won = f
        .store
        .reserve(
            &f.leader,
            &retarget_req(&o, ack_of(&o), &u.lane_incarnation_id),
        )
        .await
        .unwrap();
    assert_eq!(
        won.receipt.body["retarget"]["recovery_candidate_id"],
        o.challenge.facts.recovery_candidate_id.as_str()
    );
    assert_eq!(store::admin_count(&admin, &issued).await, 0);
    assert_eq!(store::admin_count(&admin, &chains).await, 2);
}
