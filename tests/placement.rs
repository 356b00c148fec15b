//! Placement (spec §5.4): `mosaic assign` without `--lane` — a lane chosen by the versioned
//! policy over the published roster and the lanes' states, recorded with its reservation so
//! an audit recomputes it; on real daemons, tmux and PostgreSQL. And elastic lanes (spec
//! §13): leased, made by their host, destroyed when the lease ends only by the exact CAS.

mod common;
mod pg;
mod store;
mod world;

use mosaic::coordinator::leases::{LeaseAsk, LeaseView};
use mosaic::coordinator::placement::{self, PlacementAsk, Roster};
use mosaic::coordinator::service::OperatorRequest;
use mosaic::coordinator::states::LeaseState;
use mosaic::coordinator::Category;
use serde_json::Value;
use world::{assign_request, Spec, World};

fn placed(
    labels: &[(&str, &str)],
    role: Option<&str>,
    request_id: Option<&str>,
) -> OperatorRequest {
    let mut r = assign_request("", "hang", None, true);
    if let OperatorRequest::Assign {
        place,
        request_id: rid,
        ..
    } = &mut r
    {
        *place = Some(Box::new(PlacementAsk {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            role: role.map(String::from),
            elastic: None,
        }));
        *rid = request_id.map(String::from);
    }
    r
}

fn roster(w: &World, capacity_1: u32) -> Roster {
    let (h0, h1) = (&w.hosts[0], &w.hosts[1]);
    toml::from_str(&format!(
        "[[hosts]]\nhost_id = \"{h0}\"\ncapacity = 2\n\
         [[hosts.lanes]]\nlane = \"lane-1\"\nruntimes = [\"fake\"]\nlabels = {{ zone = \"a\" }}\n\
         [[hosts.lanes]]\nlane = \"lane-2\"\nruntimes = [\"fake\"]\nlabels = {{ zone = \"b\" }}\n\
         [[hosts]]\nhost_id = \"{h1}\"\ncapacity = {capacity_1}\n\
         [[hosts.lanes]]\nlane = \"lane-1\"\nruntimes = [\"fake@1.0.0\"]\nlabels = {{ zone = \"a\" }}\nroles = [\"lead\"]\n\
         [[hosts.lanes]]\nlane = \"lane-2\"\nruntimes = [\"claude-code\"]\nlabels = {{ zone = \"a\" }}\n"
    ))
    .unwrap()
}

/// The lane a placed assign chose; the recorded placement recomputes to it.
async fn audit(w: &World, a: &Value) -> String {
    let res = a["reservation_id"].as_str().unwrap();
    let rec = w
        .op(&OperatorRequest::Roster {
            reservation_id: Some(res.into()),
        })
        .unwrap();
    let inputs: placement::Inputs =
        serde_json::from_value(rec["decision"]["inputs"].clone()).unwrap();
    let again = placement::select(&inputs).expect("the recorded inputs select a lane");
    assert_eq!(
        again.lane_id,
        a["lane_id"].as_str().unwrap(),
        "the audit recomputes the choice"
    );
    assert_eq!(
        rec["decision"]["inputs_digest"],
        inputs.digest().unwrap().as_str()
    );
    assert_eq!(
        rec["decision"]["policy_digest"],
        placement::policy_digest().as_str()
    );
    assert_eq!(
        a["placement"]["inputs_digest"],
        rec["decision"]["inputs_digest"]
    );
    assert_eq!(
        rec["recomputed"]["agrees"], true,
        "the coordinator's own audit agrees"
    );
    a["lane_id"].as_str().unwrap().to_string()
}

/// Placement end to end: refused without a roster; a roster version frozen; each placed
/// assign goes to the lane the policy picks (labels, role, the exact runtime the host
/// advertises, spread by busy lanes, capacity) and its record recomputes to it; a repeated
/// request key gets its first lane; no eligible lane is a typed refusal that reserves
/// nothing; a disconnected host is passed over; `--lane` and placement exclude each other.
#[tokio::test(flavor = "multi_thread")]
async fn an_assignment_without_a_lane_goes_where_the_policy_says_and_the_record_proves_it() {
    let mut w = World::started(Spec {
        hosts: 2,
        supervisors: 2,
        lanes: 2,
        tag: "place",
        ..Spec::default()
    });
    let e = w.op(&placed(&[], None, None)).unwrap_err();
    assert_eq!(e.category, Category::NotFound, "{e:?}");
    assert!(e.message.contains("no roster"), "{e:?}");
    let bad = Roster {
        hosts: vec![placement::RosterHost {
            host_id: "h x".into(),
            capacity: 1,
            lanes: vec![],
        }],
    };
    let e = w
        .op(&OperatorRequest::RosterPublish {
            roster: bad,
            request_id: None,
        })
        .unwrap_err();
    assert_eq!(e.category, Category::BadInput, "{e:?}");
    assert_eq!(w.count("SELECT count(*) FROM roster_versions").await, 0);
    let v1 = w
        .op(&OperatorRequest::RosterPublish {
            roster: roster(&w, 1),
            request_id: None,
        })
        .unwrap();
    assert_eq!(
        (v1["version"].as_i64(), v1["published"].as_bool()),
        (Some(1), Some(true)),
        "{v1}"
    );
    let same = w
        .op(&OperatorRequest::RosterPublish {
            roster: roster(&w, 1),
            request_id: None,
        })
        .unwrap();
    assert_eq!(
        (same["version"].as_i64(), same["published"].as_bool()),
        (Some(1), Some(false)),
        "{same}"
    );
    let sql = w.sql().await;
    assert!(
        sql.execute("UPDATE roster_versions SET body = '{}'", &[])
            .await
            .is_err(),
        "a roster version changed"
    );

    let zone_b = w
        .op(&placed(&[("zone", "b")], None, Some("place-b")))
        .unwrap();
    assert_eq!(audit(&w, &zone_b).await, w.lane_of(0, "lane-2"));
    // Host 0 is busier now: zone a goes to host 1's lane-1 (its lane-2 declares another
    // runtime), then — host 1 at its capacity of one — to host 0's lane-1.
    let a1 = w.op(&placed(&[("zone", "a")], None, None)).unwrap();
    assert_eq!(audit(&w, &a1).await, w.lane_of(1, "lane-1"));
    let a2 = w.op(&placed(&[("zone", "a")], None, None)).unwrap();
    assert_eq!(audit(&w, &a2).await, w.lane_of(0, "lane-1"));
    // The same key again: its first placement, its first assignment, nothing new reserved.
    let reservations = w.count("SELECT count(*) FROM reservations").await;
    let again = w
        .op(&placed(&[("zone", "b")], None, Some("place-b")))
        .unwrap();
    assert_eq!(again["assignment_id"], zone_b["assignment_id"], "{again}");
    // Nothing eligible: refused by name, per lane, and nothing reserved.
    let e = w
        .op(&placed(&[("zone", "a")], Some("lead"), None))
        .unwrap_err();
    assert_eq!(e.category, Category::NoEligibleLane, "{e:?}");
    assert!(
        e.message.contains("RUNNING and not reservable") && e.message.contains("role lead"),
        "{e:?}"
    );
    assert_eq!(
        w.count("SELECT count(*) FROM reservations").await,
        reservations
    );
    assert_eq!(w.count("SELECT count(*) FROM placements").await, 3);
    // A placement record never changes.
    assert!(sql
        .execute("UPDATE placements SET lane_id = 'x'", &[])
        .await
        .is_err());
    // Both a lane and placement: refused before anything is read.
    let mut both = placed(&[], None, None);
    if let OperatorRequest::Assign { lane_id, .. } = &mut both {
        *lane_id = w.lane_of(0, "lane-1");
    }
    assert_eq!(w.op(&both).unwrap_err().category, Category::BadInput);
    // Host 1 freed but disconnected: passed over, and said so.
    for a in [&a1, &a2, &zone_b] {
        let id = a["assignment_id"].as_str().unwrap();
        w.op(&OperatorRequest::Stop {
            assignment_id: id.into(),
            outcome: None,
            evidence_digest: None,
            wait: true,
            request_id: None,
        })
        .unwrap();
    }
    w.crash_supervisor(1);
    common::wait_until("host 1 disconnected", || {
        let st = w.op(&OperatorRequest::Status).ok()?;
        (!st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h.as_str() == Some(&format!("host:{}", w.hosts[1]))))
        .then_some(())
    });
    common::wait_until("host 0's lanes idle", || {
        let l = w.op(&OperatorRequest::Lanes).ok()?;
        l.as_array()?
            .iter()
            .filter(|x| x["host_id"] == w.hosts[0].as_str())
            .all(|x| x["state"] == "IDLE_CLEAN")
            .then_some(())
    });
    let a3 = w.op(&placed(&[("zone", "a")], None, None)).unwrap();
    assert_eq!(audit(&w, &a3).await, w.lane_of(0, "lane-1"));
    let rec = w
        .op(&OperatorRequest::Roster {
            reservation_id: Some(a3["reservation_id"].as_str().unwrap().into()),
        })
        .unwrap();
    let h1 = rec["decision"]["inputs"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["lane_id"] == w.lane_of(1, "lane-1").as_str())
        .unwrap()
        .clone();
    assert_eq!(h1["host_connected"], false, "{h1}");
    w.op(&OperatorRequest::Stop {
        assignment_id: a3["assignment_id"].as_str().unwrap().into(),
        outcome: None,
        evidence_digest: None,
        wait: true,
        request_id: None,
    })
    .unwrap();
}

// ---- Elastic lanes at the store (spec §13) ----

fn lease_ask(ttl_ms: u64) -> LeaseAsk {
    LeaseAsk {
        host_id: store::HOST.into(),
        runtime: "fake@1.0.0".into(),
        labels: [("burst".to_string(), "yes".to_string())].into(),
        role: None,
        ttl_ms,
        max_lifetime_ms: 600_000,
    }
}

fn roster_of_h1(capacity: u32) -> Roster {
    toml::from_str(&format!(
        "[[hosts]]\nhost_id = \"{}\"\ncapacity = {capacity}\n",
        store::HOST
    ))
    .unwrap()
}

/// A lease whose host made its lane: (lease, the lane's incarnation).
async fn leased(f: &store::Fx, ttl_ms: u64) -> (LeaseView, String) {
    let v = f
        .store
        .lease_lane(&f.leader, &lease_ask(ttl_ms), &store::uid("rq"))
        .await
        .unwrap();
    assert_eq!(v.state, LeaseState::Requested);
    let lane = store::adopt(&f.store, &f.leader, &v.lane_id).await;
    let bound = f
        .store
        .bind_lease(&f.leader, &v.lane_id, &lane.lane_incarnation_id)
        .await
        .unwrap();
    assert!(bound.is_some(), "the host's lane binds the lease");
    (
        f.store.lease(&v.lease_id).await.unwrap().unwrap(),
        lane.lane_incarnation_id,
    )
}

async fn lease_row(url: &str, lease: &str) -> String {
    store::sql(url)
        .await
        .query_one(
            "SELECT row_to_json(l)::text FROM lane_leases l WHERE lease_id = $1",
            &[&lease],
        )
        .await
        .unwrap()
        .get(0)
}

/// A lease's token salt, as the database holds it (the test plays the TTL worker).
async fn salt_of(url: &str, lease: &str) -> String {
    store::sql(url)
        .await
        .query_one(
            "SELECT token_salt FROM lane_leases WHERE lease_id = $1",
            &[&lease],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits (database time) until the lease's deadline has passed.
async fn past_deadline(f: &store::Fx, lease: &str) {
    common::wait_until("the lease's deadline", || {
        let rt = tokio::runtime::Handle::current();
        let v = std::thread::scope(|s| {
            s.spawn(|| rt.block_on(f.store.lease(lease)))
                .join()
                .unwrap()
        });
        v.unwrap().unwrap().expired.then_some(())
    });
}

/// §17 TTL destroy collision: a destruction is decided on a snapshot of the lease and its
/// lane, and the CAS compares every field of it again. One row per bound field: the
/// snapshot with that one field stale or substituted is refused with its own diagnosis and
/// changes nothing; the exact snapshot destroys. Each row fails if its predicate is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_ttl_destruction_is_refused_unless_every_field_it_was_decided_on_still_holds() {
    let f = store::fx().await;
    let url = pg::server().url(&f.db.name);
    // Its host advertises the runtime (as its hello does).
    f.store
        .record_host(store::HOST, &["fake@1.0.0".to_string()])
        .await
        .unwrap();
    // Without a roster, or past the declared capacity: refused, nothing written.
    let e = f
        .store
        .lease_lane(&f.leader, &lease_ask(60_000), "no-roster")
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::NoEligibleLane), "{e}");
    f.store
        .publish_roster(&f.leader, &roster_of_h1(3))
        .await
        .unwrap();
    for (bad, why) in [
        (
            LeaseAsk {
                ttl_ms: 10,
                ..lease_ask(0)
            },
            "TTL",
        ),
        (
            LeaseAsk {
                ttl_ms: 700_000,
                ..lease_ask(0)
            },
            "longer than the maximum",
        ),
        (
            LeaseAsk {
                runtime: "fake".into(),
                ..lease_ask(60_000)
            },
            "family@version",
        ),
        (
            LeaseAsk {
                host_id: "h1;rm".into(),
                ..lease_ask(60_000)
            },
            "host id",
        ),
    ] {
        let e = f
            .store
            .lease_lane(&f.leader, &bad, &store::uid("rq"))
            .await
            .unwrap_err();
        assert_eq!(e.category(), Some(Category::BadInput), "{e}");
        assert!(e.to_string().contains(why), "{e}");
    }
    assert_eq!(
        store::count(&url, "SELECT count(*) FROM lane_leases").await,
        0
    );

    let (v, inc) = leased(&f, 1_000).await;
    // A lease whose lane took work before its deadline: a chain waits for its ACK there.
    let (busy, busy_inc) = leased(&f, 1_000).await;
    store::to_awaiting_ack(&f.store, &f.leader, &busy_inc, None, 600_000).await;
    assert_eq!(v.state, LeaseState::Active);
    assert!(!v.token_proof.is_empty() && !v.token_proof.contains(&v.lease_id));
    // The raw token is nowhere in the database: only its keyed proof and the salt.
    let row = lease_row(&url, &v.lease_id).await;
    let token = f
        .secret
        .ownership_token(&v.lease_id, &salt_of(&url, &v.lease_id).await);
    assert!(!row.contains(&token.expose_hex()));

    // Before the deadline: nothing is due, and a snapshot taken anyway is refused.
    assert!(f.store.due_leases().await.unwrap().is_empty());
    // Renewed before its deadline: a new lease epoch; then past the new deadline.
    let renewed = f
        .store
        .renew_lease(&f.leader, &v.lease_id, &store::uid("rq"))
        .await
        .unwrap();
    assert_eq!(renewed.lease_epoch, v.lease_epoch + 1);
    past_deadline(&f, &v.lease_id).await;
    // An expired lease is not brought back, and its lane takes no work.
    let e = f
        .store
        .renew_lease(&f.leader, &v.lease_id, &store::uid("rq"))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::Expired), "{e}");
    let mut req = store::request(&inc, None, 60_000);
    req.target = v.lane_id.clone();
    let e = f.store.reserve(&f.leader, &req).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert!(e.to_string().contains("lease"), "{e}");

    let due = f.store.due_leases().await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    let exact = due[0].clone();
    assert_eq!(exact.lease_epoch, renewed.lease_epoch);

    // Another lease's lane, to substitute.
    let (other, other_inc) = leased(&f, 600_000).await;
    let other_salt = salt_of(&url, &other.lease_id).await;
    type Edit = Box<dyn Fn(&mut mosaic::coordinator::leases::DestroySnapshot)>;
    let forged_salt = "ab".repeat(32);
    let forged_proof = f
        .secret
        .ownership_proof(&f.secret.ownership_token(&exact.lease_id, &forged_salt));
    let rows: Vec<(&str, Edit, Category, &str)> = vec![
        (
            "a stale lease epoch (renewed after the decision)",
            Box::new(|s| s.lease_epoch -= 1),
            Category::Conflict,
            "renewed",
        ),
        (
            "another lease's proof",
            Box::new({
                let p = other.token_proof.clone();
                move |s| s.token_proof = p.clone()
            }),
            Category::Mismatch,
            "ownership",
        ),
        (
            "another lease's salt and proof",
            Box::new({
                let (p, salt) = (other.token_proof.clone(), other_salt.clone());
                move |s| {
                    s.token_proof = p.clone();
                    s.token_salt = salt.clone();
                }
            }),
            Category::Mismatch,
            "ownership",
        ),
        (
            "a token minted with a salt of the caller's choosing",
            Box::new({
                let (p, salt) = (forged_proof.clone(), forged_salt.clone());
                move |s| {
                    s.token_proof = p.clone();
                    s.token_salt = salt.clone();
                }
            }),
            Category::Mismatch,
            "ownership proof",
        ),
        (
            "another lane",
            Box::new({
                let l = other.lane_id.clone();
                move |s| s.lane_id = l.clone()
            }),
            Category::Mismatch,
            "lane or its incarnation",
        ),
        (
            "another incarnation",
            Box::new({
                let i = other_inc.clone();
                move |s| s.lane_incarnation_id = i.clone()
            }),
            Category::Mismatch,
            "lane or its incarnation",
        ),
        (
            "a generation started after the decision",
            Box::new(|s| s.next_generation -= 1),
            Category::Conflict,
            "generation started",
        ),
        (
            "another owner epoch",
            Box::new(|s| s.owner_epoch += 1),
            Category::Conflict,
            "owner epoch",
        ),
    ];
    // The host's capacity (3) is taken by the three leases: a fourth is refused.
    let e = f
        .store
        .lease_lane(&f.leader, &lease_ask(60_000), &store::uid("rq"))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::NoEligibleLane), "{e}");
    assert!(e.to_string().contains("capacity"), "{e}");
    // The busy lane's lease is past its deadline too, and not due: its lane holds work,
    // and a destruction decided on it anyway is refused.
    past_deadline(&f, &busy.lease_id).await;
    assert!(f
        .store
        .due_leases()
        .await
        .unwrap()
        .iter()
        .all(|d| d.lease_id != busy.lease_id));
    let busy_salt = salt_of(&url, &busy.lease_id).await;
    let busy_gen: i64 = store::sql(&url)
        .await
        .query_one(
            "SELECT next_generation FROM lane_incarnations WHERE lane_incarnation_id = $1",
            &[&busy_inc],
        )
        .await
        .unwrap()
        .get(0);
    let on_busy = mosaic::coordinator::leases::DestroySnapshot {
        lease_id: busy.lease_id.clone(),
        lease_epoch: busy.lease_epoch,
        token_salt: busy_salt,
        token_proof: busy.token_proof.clone(),
        lane_id: busy.lane_id.clone(),
        lane_incarnation_id: busy_inc.clone(),
        next_generation: busy_gen,
        owner_epoch: busy.owner_epoch,
        destroy_key: busy.destroy_key.clone(),
    };
    let held = lease_row(&url, &busy.lease_id).await;
    let e = f
        .store
        .decide_destroy(&f.leader, &on_busy)
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert!(e.to_string().contains("holds work"), "{e}");
    assert_eq!(lease_row(&url, &busy.lease_id).await, held);

    let before = lease_row(&url, &exact.lease_id).await;
    for (what, edit, category, says) in &rows {
        let mut snap = exact.clone();
        edit(&mut snap);
        let e = f.store.decide_destroy(&f.leader, &snap).await.unwrap_err();
        assert_eq!(e.category(), Some(*category), "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        assert_eq!(
            lease_row(&url, &exact.lease_id).await,
            before,
            "{what}: a refused destruction changes nothing"
        );
    }
    // The other lease is not due: a destruction of it is refused as early.
    let mut not_due = exact.clone();
    not_due.lease_id = other.lease_id.clone();
    not_due.lane_id = other.lane_id.clone();
    not_due.lane_incarnation_id = other_inc.clone();
    not_due.token_salt = other_salt.clone();
    not_due.token_proof = other.token_proof.clone();
    not_due.lease_epoch = other.lease_epoch;
    let e = f
        .store
        .decide_destroy(&f.leader, &not_due)
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert!(e.to_string().contains("not expired"), "{e}");

    // The exact snapshot: DESTROYING, once (the same decision again is its receipt).
    let r = f.store.decide_destroy(&f.leader, &exact).await.unwrap();
    let again = f.store.decide_destroy(&f.leader, &exact).await.unwrap();
    assert_eq!(r.receipt_id, again.receipt_id);
    assert!(!r.body.to_string().contains(&token.expose_hex()));
    let v2 = f.store.lease(&exact.lease_id).await.unwrap().unwrap();
    assert_eq!(v2.state, LeaseState::Destroying);
    assert_eq!(
        f.store.leases_to_destroy(store::HOST).await.unwrap(),
        vec![(exact.lane_id.clone(), inc.clone())]
    );
    // DESTROYING blocks renewal and reassignment.
    let e = f
        .store
        .renew_lease(&f.leader, &exact.lease_id, &store::uid("rq"))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::Expired), "{e}");
    req.request_id = store::uid("rq");
    let e = f.store.reserve(&f.leader, &req).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    // The host's report that the lane is gone destroys the lease.
    f.store
        .retire_destroyed_lane(&f.leader, store::HOST, &exact.lane_id, &inc)
        .await
        .unwrap();
    let v3 = f.store.lease(&exact.lease_id).await.unwrap().unwrap();
    assert_eq!(v3.state, LeaseState::Destroyed);
    assert!(v3.destroyed_at.is_some());
    // A destroyed lease is history: the database refuses to change it.
    let e = store::sql(&url)
        .await
        .execute(
            "UPDATE lane_leases SET state = 'ACTIVE' WHERE lease_id = $1",
            &[&exact.lease_id],
        )
        .await
        .unwrap_err();
    let why = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(why.contains("final"), "{e:?}");
    // The other lease's lane was never touched.
    let o = f.store.lease(&other.lease_id).await.unwrap().unwrap();
    assert_eq!(o.state, LeaseState::Active);

    // A quarantined lease (a collision the TTL worker saw): its lane takes no work, and
    // `unlease` is the way out — refused while the lane holds work, then the lane destroyed.
    f.store
        .quarantine_lease(&f.leader, &other.lease_id, "test: a collision")
        .await
        .unwrap();
    let mut on_other = store::request(&other_inc, None, 60_000);
    on_other.target = other.lane_id.clone();
    let e = f.store.reserve(&f.leader, &on_other).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    // Nor is it a handoff's target.
    let source = store::running(&f.store, &f.leader, &f.lane.lane_incarnation_id).await;
    let e = f
        .store
        .offer_handoff(
            &f.leader,
            &mosaic::coordinator::handoff::OfferRequest {
                request_id: store::uid("ho"),
                assignment_id: source.chain().assignment_id.clone(),
                target_lane_incarnation_id: other_inc.clone(),
                task_text: None,
                ttl_ms: 60_000,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert!(e.to_string().contains("lease"), "{e}");
    let e = f
        .store
        .end_lease(&f.leader, &busy.lease_id, &store::uid("rq"))
        .await
        .unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert!(e.to_string().contains("holds work"), "{e}");
    let ended = f
        .store
        .end_lease(&f.leader, &other.lease_id, &store::uid("rq"))
        .await
        .unwrap();
    assert_eq!(ended.body["state"], "DESTROYING", "{:?}", ended.body);
    assert_eq!(
        f.store.leases_to_destroy(store::HOST).await.unwrap(),
        vec![(other.lane_id.clone(), other_inc.clone())]
    );

    // A lease whose host never made its lane is quarantined past its deadline (the host
    // may still make it), and `unlease` ends it for good.
    f.store
        .publish_roster(&f.leader, &roster_of_h1(5))
        .await
        .unwrap();
    let unmade = f
        .store
        .lease_lane(&f.leader, &lease_ask(1_000), &store::uid("rq"))
        .await
        .unwrap();
    assert_eq!(
        f.store.leases_to_create(store::HOST).await.unwrap(),
        vec![unmade.lane_id.clone()]
    );
    past_deadline(&f, &unmade.lease_id).await;
    assert_eq!(
        f.store.unmade_leases().await.unwrap(),
        vec![unmade.lease_id.clone()]
    );
    f.store
        .quarantine_lease(&f.leader, &unmade.lease_id, "never made")
        .await
        .unwrap();
    assert!(f
        .store
        .leases_to_create(store::HOST)
        .await
        .unwrap()
        .is_empty());
    // Made late, it is bound to the quarantined lease, which stays quarantined: its lane
    // takes no work.
    let late = store::adopt(&f.store, &f.leader, &unmade.lane_id).await;
    let bound = f
        .store
        .bind_lease(&f.leader, &unmade.lane_id, &late.lane_incarnation_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(bound.body["state"], "QUARANTINED", "{:?}", bound.body);
    let mut on_late = store::request(&late.lane_incarnation_id, None, 60_000);
    on_late.target = unmade.lane_id.clone();
    let e = f.store.reserve(&f.leader, &on_late).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    // `unlease` finds the late lane by its name and has it destroyed.
    let ended = f
        .store
        .end_lease(&f.leader, &unmade.lease_id, &store::uid("rq"))
        .await
        .unwrap();
    assert_eq!(
        (
            ended.body["state"].as_str(),
            ended.body["lane_incarnation_id"].as_str()
        ),
        (Some("DESTROYING"), Some(late.lane_incarnation_id.as_str())),
        "{:?}",
        ended.body
    );
    // One whose lane no host made at all is destroyed at once by `unlease`.
    let never = f
        .store
        .lease_lane(&f.leader, &lease_ask(60_000), &store::uid("rq"))
        .await
        .unwrap();
    let ended = f
        .store
        .end_lease(&f.leader, &never.lease_id, &store::uid("rq"))
        .await
        .unwrap();
    assert_eq!(ended.body["made"], false, "{:?}", ended.body);
    let gone = f.store.lease(&never.lease_id).await.unwrap().unwrap();
    assert_eq!(gone.state, LeaseState::Destroyed);
    assert!(f
        .store
        .leases_to_create(store::HOST)
        .await
        .unwrap()
        .is_empty());
    // Its lane made after all (an order in flight, or made again on the host) is no
    // lease's: adopted closed to work, and ordered destroyed.
    let orphan = store::adopt(&f.store, &f.leader, &never.lane_id).await;
    let inc = orphan.lane_incarnation_id.clone();
    assert!(f
        .store
        .bind_lease(&f.leader, &never.lane_id, &inc)
        .await
        .unwrap()
        .is_none());
    assert!(f
        .store
        .leases_to_destroy(store::HOST)
        .await
        .unwrap()
        .contains(&(never.lane_id.clone(), inc.clone())));
    let mut on_orphan = store::request(&inc, None, 60_000);
    on_orphan.target = never.lane_id.clone();
    let e = f.store.reserve(&f.leader, &on_orphan).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    // An ordinary lane is never closed by all this; and an elastic lane is never recreated.
    assert!(!f
        .store
        .leases_to_destroy(store::HOST)
        .await
        .unwrap()
        .iter()
        .any(|(l, _)| *l == f.lane.lane_id));
    let e = f.store.request_recreate(&f.leader, &inc).await.unwrap_err();
    assert_eq!(e.category(), Some(Category::WrongState), "{e}");
    assert!(e.to_string().contains("elastic"), "{e}");
}

/// The supervisor's view of its lane `name` (`None`: it has no such lane).
fn host_lane(w: &World, name: &str) -> Option<Value> {
    w.host_status(0)["lanes"]
        .as_array()?
        .iter()
        .find(|l| l["lane"] == name)
        .cloned()
}

/// §13 end to end, on real daemons, tmux and cgroups: a lease's lane is made by its host
/// under a fresh incarnation and takes work; once the lease is past its deadline with the
/// lane idle, the coordinator destroys it through the exact CAS and the host tears it down
/// (tmux server gone, cgroup removed) — while a lease renewed before each deadline keeps its
/// lane; an expired lease is never renewed, and a destroyed lane takes no work.
#[tokio::test(flavor = "multi_thread")]
async fn an_elastic_lane_is_destroyed_on_time_and_one_renewed_before_its_deadline_is_not() {
    let w = World::started(Spec {
        hosts: 1,
        supervisors: 1,
        lanes: 1,
        tag: "lease",
        ..Spec::default()
    });
    let host = w.hosts[0].clone();
    let ask = |ttl_ms: u64| OperatorRequest::LaneLease {
        ask: LeaseAsk {
            host_id: host.clone(),
            runtime: "fake@1.0.0".into(),
            labels: [("burst".to_string(), "yes".to_string())].into(),
            role: None,
            ttl_ms,
            max_lifetime_ms: 600_000,
        },
        request_id: None,
    };
    // No capacity declared for the host: refused, nothing asked of it.
    let e = w.op(&ask(3_000)).unwrap_err();
    assert_eq!(e.category, Category::NoEligibleLane, "{e:?}");
    w.op(&OperatorRequest::RosterPublish {
        roster: toml::from_str(&format!("[[hosts]]\nhost_id = \"{host}\"\ncapacity = 3\n"))
            .unwrap(),
        request_id: None,
    })
    .unwrap();
    let mut other_runtime = ask(3_000);
    if let OperatorRequest::LaneLease { ask, .. } = &mut other_runtime {
        ask.runtime = "fake@9.9.9".into();
    }
    let e = w.op(&other_runtime).unwrap_err();
    assert_eq!(e.category, Category::UnknownRuntime, "{e:?}");
    assert_eq!(w.count("SELECT count(*) FROM lane_leases").await, 0);

    // Leased: answered once its host made the lane.
    let short = w.op(&ask(3_000)).unwrap();
    // (Renewed every second: a deadline far enough ahead that a slow call never lapses it.)
    let kept = w.op(&ask(10_000)).unwrap();
    for l in [&short, &kept] {
        assert_eq!(l["state"], "ACTIVE", "{l}");
        assert!(l.get("token_salt").is_none(), "{l}");
    }
    let (short_lane, kept_lane) = (
        short["lane_id"].as_str().unwrap().to_string(),
        kept["lane_id"].as_str().unwrap().to_string(),
    );
    let name = short_lane.split_once(':').unwrap().1.to_string();
    let on_host = host_lane(&w, &name).expect("the host made the lane");
    assert_eq!(on_host["lane_incarnation_id"], short["lane_incarnation_id"]);
    let sock = std::path::PathBuf::from(on_host["tmux_socket"].as_str().unwrap());
    let tmux_alive = |sock: &std::path::Path| {
        std::process::Command::new("tmux")
            .arg("-S")
            .arg(sock)
            .arg("list-sessions")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(tmux_alive(&sock), "the elastic lane's tmux server runs");
    let cgroup = w.cgroup_roots[0].join("lanes").join(&name);
    assert!(cgroup.is_dir(), "the elastic lane's cgroup exists");
    // `lanes` shows it with its lease.
    let lanes = w.op(&OperatorRequest::Lanes).unwrap();
    let shown = lanes
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lane_id"] == short_lane.as_str())
        .unwrap()
        .clone();
    assert_eq!(shown["lease"]["lease_id"], short["lease_id"], "{shown}");

    // It takes work like any lane.
    let a = w.assign_to(&short_lane, "hang", true).unwrap();
    w.op(&OperatorRequest::Stop {
        assignment_id: a["assignment_id"].as_str().unwrap().into(),
        outcome: None,
        evidence_digest: None,
        wait: true,
        request_id: None,
    })
    .unwrap();

    // `kept` is renewed before each deadline; `short` is left to expire.
    let lease_of = |id: &Value| {
        w.op(&OperatorRequest::Leases)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lease_id"] == *id)
            .cloned()
            .unwrap()
    };
    let mut renewals = 0;
    loop {
        let r = w
            .op(&OperatorRequest::LaneRenew {
                lease_id: kept["lease_id"].as_str().unwrap().into(),
                request_id: None,
            })
            .unwrap();
        renewals += 1;
        assert_eq!(r["lease_epoch"], renewals + 1, "{r}");
        if lease_of(&short["lease_id"])["state"] == "DESTROYED" {
            break;
        }
        assert!(renewals < 60, "the short lease was never destroyed");
        std::thread::sleep(std::time::Duration::from_millis(1_000));
    }
    // Destroyed on its host: the server and the lane's cgroup are gone.
    let gone = host_lane(&w, &name);
    assert!(
        gone.as_ref().is_none_or(|l| l["status"] == "destroyed"),
        "{gone:?}"
    );
    assert!(
        !cgroup.exists(),
        "the destroyed lane's cgroup is still there"
    );
    assert!(
        !tmux_alive(&sock),
        "the destroyed lane's tmux server still runs"
    );
    // Its incarnation is retired, and it takes no work; an expired lease is not renewed.
    let e = w.assign_to(&short_lane, "hang", true).unwrap_err();
    assert!(
        matches!(e.category, Category::NotFound | Category::WrongState),
        "{e:?}"
    );
    let e = w
        .op(&OperatorRequest::LaneRenew {
            lease_id: short["lease_id"].as_str().unwrap().into(),
            request_id: None,
        })
        .unwrap_err();
    assert_eq!(e.category, Category::Expired, "{e:?}");
    // The renewed one is untouched: its lane is there and takes work.
    let k = lease_of(&kept["lease_id"]);
    assert_eq!(k["state"], "ACTIVE", "{k}");
    let kept_name = kept_lane.split_once(':').unwrap().1;
    assert_eq!(host_lane(&w, kept_name).unwrap()["status"], "active", "{k}");
    let destroyed = w
        .count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'lane-lease-destroy' \
             AND body->>'lease_id' = '{}'",
            kept["lease_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        destroyed, 0,
        "no destruction was decided for the renewed lease"
    );
}

/// `assign --elastic` (placement@2): with no eligible lane, a lane is leased on a host the
/// roster declares (its labels and role the assignment's) and the policy places the work
/// on it — recorded like any placement, the elastic candidate with its lease — until the
/// host's capacity is reached; without `--elastic`, the same request is refused.
#[tokio::test(flavor = "multi_thread")]
async fn an_elastic_placement_leases_a_lane_when_none_is_eligible() {
    let w = World::started(Spec {
        hosts: 1,
        supervisors: 1,
        lanes: 1,
        tag: "elastic",
        ..Spec::default()
    });
    let host = w.hosts[0].clone();
    w.op(&OperatorRequest::RosterPublish {
        roster: toml::from_str(&format!(
            "[[hosts]]\nhost_id = \"{host}\"\ncapacity = 2\n\
             [[hosts.lanes]]\nlane = \"lane-1\"\nruntimes = [\"fake\"]\nlabels = {{ zone = \"a\" }}\n"
        ))
        .unwrap(),
        request_id: None,
    })
    .unwrap();
    let elastic = |on: bool| {
        let mut r = placed(&[("zone", "a")], None, None);
        if let OperatorRequest::Assign { place: Some(p), .. } = &mut r {
            p.elastic = on.then_some(placement::ElasticAsk {
                ttl_ms: 60_000,
                max_lifetime_ms: 600_000,
            });
        }
        r
    };
    let first = w.op(&elastic(true)).unwrap();
    assert_eq!(first["lane_id"], w.lane_of(0, "lane-1").as_str(), "{first}");
    assert_eq!(w.count("SELECT count(*) FROM lane_leases").await, 0);
    let e = w.op(&elastic(false)).unwrap_err();
    assert_eq!(e.category, Category::NoEligibleLane, "{e:?}");

    let second = w.op(&elastic(true)).unwrap();
    let lane = second["lane_id"].as_str().unwrap().to_string();
    assert!(lane.starts_with(&format!("{host}:e-")), "{second}");
    assert_eq!(second["placement"]["policy"], placement::POLICY, "{second}");
    audit(&w, &second).await;
    let rec = w
        .op(&OperatorRequest::Roster {
            reservation_id: Some(second["reservation_id"].as_str().unwrap().into()),
        })
        .unwrap();
    let chosen = rec["decision"]["inputs"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["lane_id"] == lane.as_str())
        .unwrap()
        .clone();
    assert!(chosen["lease_id"].is_string(), "{chosen}");
    assert_eq!(chosen["labels"]["zone"], "a", "{chosen}");
    let leases = w.op(&OperatorRequest::Leases).unwrap();
    assert_eq!(leases.as_array().unwrap().len(), 1, "{leases}");
    assert_eq!(leases[0]["state"], "ACTIVE", "{leases}");
    // How the host was chosen is recorded with the placement, and recomputed by the
    // audit: the inputs under which no lane was eligible (lane-1 busy), the roster's one
    // host with its busy lane and its session, no refusal, and the lease.
    let choice = &rec["decision"]["elastic"];
    assert_eq!(choice["leased_host"], host.as_str(), "{rec}");
    assert_eq!(choice["lease_id"], leases[0]["lease_id"], "{rec}");
    assert_eq!(choice["lane_id"], lane.as_str(), "{rec}");
    assert_eq!(
        choice["hosts"],
        serde_json::json!([{ "host_id": host, "busy": 1, "connected": true }]),
        "{rec}"
    );
    assert_eq!(choice["refused"], serde_json::json!([]), "{rec}");
    let first_inputs: placement::Inputs =
        serde_json::from_value(choice["first_inputs"].clone()).unwrap();
    assert!(placement::select(&first_inputs).is_err(), "{rec}");
    assert_eq!(
        choice["first_inputs_digest"],
        first_inputs.digest().unwrap().as_str()
    );
    let plain = w
        .op(&OperatorRequest::Roster {
            reservation_id: Some(first["reservation_id"].as_str().unwrap().into()),
        })
        .unwrap();
    assert!(plain["decision"].get("elastic").is_none(), "{plain}");

    // The host's capacity (2) is used: lane-1 and the elastic lane are busy.
    let e = w.op(&elastic(true)).unwrap_err();
    assert_eq!(e.category, Category::NoEligibleLane, "{e:?}");
    assert!(e.message.contains("capacity"), "{e:?}");
    assert_eq!(w.count("SELECT count(*) FROM lane_leases").await, 1);

    for a in [&first, &second] {
        w.op(&OperatorRequest::Stop {
            assignment_id: a["assignment_id"].as_str().unwrap().into(),
            outcome: None,
            evidence_digest: None,
            wait: true,
            request_id: None,
        })
        .unwrap();
    }
    w.op(&OperatorRequest::LaneUnlease {
        lease_id: leases[0]["lease_id"].as_str().unwrap().into(),
        request_id: None,
    })
    .unwrap();
    common::wait_until("the elastic lane destroyed", || {
        let l = w.op(&OperatorRequest::Leases).ok()?;
        (l[0]["state"] == "DESTROYED").then_some(())
    });
}

/// A leased lane its host quarantined (its tmux server gone after a reboot, say) is not
/// destroyed by the TTL: its quarantine waits for reconciliation, as any lane's does, and
/// `unlease` is the operator's way out — which destroys it.
#[tokio::test(flavor = "multi_thread")]
async fn a_leased_lane_its_host_quarantined_waits_for_the_operator() {
    let f = store::fx().await;
    f.store
        .record_host(store::HOST, &["fake@1.0.0".to_string()])
        .await
        .unwrap();
    f.store
        .publish_roster(&f.leader, &roster_of_h1(2))
        .await
        .unwrap();
    let (v, inc) = leased(&f, 1_000).await;
    f.store
        .host_quarantine(&f.leader, &inc, "tmux server gone")
        .await
        .unwrap();
    past_deadline(&f, &v.lease_id).await;
    assert!(f.store.due_leases().await.unwrap().is_empty());
    assert!(f
        .store
        .leases_to_destroy(store::HOST)
        .await
        .unwrap()
        .is_empty());
    let r = f
        .store
        .end_lease(&f.leader, &v.lease_id, &store::uid("rq"))
        .await
        .unwrap();
    assert_eq!(r.body["state"], "DESTROYING", "{:?}", r.body);
    assert_eq!(
        f.store.leases_to_destroy(store::HOST).await.unwrap(),
        vec![(v.lane_id.clone(), inc.clone())]
    );
}
