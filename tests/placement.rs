//! Placement (spec §5.4): `mosaic assign` without `--lane` — a lane chosen by the versioned
//! policy over the published roster and the lanes' states, recorded with its reservation so
//! an audit recomputes it; on real daemons, tmux and PostgreSQL.

mod common;
mod pg;
mod world;

use mosaic::coordinator::placement::{self, PlacementAsk, Roster};
use mosaic::coordinator::service::OperatorRequest;
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
        *place = Some(PlacementAsk {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            role: role.map(String::from),
        });
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
