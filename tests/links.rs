//! The host's link to the coordinator: receipts asked for again, written while the link is
//! down, a stop with the host unreachable, lanes registered on the live session.

mod common;
mod pg;
mod world;

use world::split::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_receipt_the_coordinator_never_got_is_asked_for_again() {
    let mut w = Split::new(1);
    w.wait_host_connected();
    let a = w.assign(1, "hang").unwrap();
    let hp = w.host_status()["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    // The coordinator is down when the harness dies; the receipt is then marked
    // acknowledged on the host without the coordinator ever seeing it (what a lost ack,
    // or a local ack behind its back, would leave).
    w.crash_coordinator(0);
    common::kill(hp as i32, nix::sys::signal::Signal::SIGKILL);
    let outbox = w.state_dir(0).join("outbox");
    let file = common::wait_until("the receipt durable", || {
        std::fs::read_dir(&outbox)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "json"))
    });
    std::fs::rename(
        &file,
        w.state_dir(0).join("acked").join(file.file_name().unwrap()),
    )
    .unwrap();
    // The database still says RUNNING; the host's report no longer lists the generation.
    w.start_coordinator(0, None);
    w.wait_leading(0);
    assert_eq!(
        w.wait_settled(1, "the lost receipt recovered"),
        "IDLE_CLEAN"
    );
    let (id, life, exec, ..) = w.assignment_row(&w.lane(1)).await.unwrap();
    assert_eq!(id, a["assignment_id"].as_str().unwrap());
    assert_eq!((life.as_str(), exec), ("RECOVERY", None));
    assert_eq!(
        w.count("SELECT count(*) FROM termination_receipts").await,
        1,
        "the receipt was not ingested exactly once"
    );
    // And a supervisor under a coordinator refuses to acknowledge receipts or start
    // generations on its own.
    let sock = w.runtime_dir(0).join("control.sock");
    for req in [
        mosaic::supervisor::control::Request::Ack { key: "tr-x".into() },
        mosaic::supervisor::control::Request::Start {
            lane: "lane-1".into(),
            runtime: "fake@1.0.0".into(),
            directives: vec!["hang".into()],
        },
    ] {
        match mosaic::supervisor::control::call(&sock, &req) {
            Err(mosaic::supervisor::control::ClientError::Refused { kind, .. }) => {
                assert_eq!(kind, "coordinated")
            }
            other => panic!("{req:?} was not refused: {other:?}"),
        }
    }
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_with_the_host_unreachable_is_pending_until_it_reconnects() {
    let mut w = Split::new(1);
    w.wait_host_connected();
    let a = w.assign(1, "hang spawn=2").unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
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
    // Leases revoked at once; no outcome before the host's receipt.
    let out = w.stop(&id).unwrap();
    assert!(
        out["pending"]
            .as_str()
            .unwrap_or("")
            .contains("host unreachable"),
        "{out}"
    );
    assert_eq!(out["state"], "ACTIVE");
    assert_eq!(
        w.count("SELECT count(*) FROM leases WHERE released_at IS NULL")
            .await,
        0
    );
    assert_eq!(w.assignment_row(&w.lane(1)).await.unwrap().1, "ACTIVE");
    // Repeating it is idempotent.
    let again = w.stop(&id).unwrap();
    assert_eq!(again["state"], "ACTIVE");
    assert_eq!(
        w.count("SELECT count(*) FROM transition_receipts WHERE transition = 'request-end'")
            .await,
        1
    );
    // The host comes back: the generation is stopped, the receipt proves it, the outcome
    // is final.
    w.start_supervisor();
    assert_eq!(w.wait_settled(1, "stopped on reconnect"), "IDLE_CLEAN");
    assert_eq!(w.assignment_row(&w.lane(1)).await.unwrap().1, "CANCELLED");
    assert_eq!(w.stop(&id).unwrap()["state"], "CANCELLED");
    w.invariants().await;
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn receipts_written_while_the_link_is_down_arrive_once_after_it_is_restored() {
    let mut w = Split::new(1);
    let lane = w.lane(1);
    let a = w.assign(1, "spawn=3").unwrap();
    assert_eq!(a["state"], "RUNNING");
    w.crash_coordinator(0);
    // While the coordinator (and with it the link) is gone, the harness dies.
    let hp = w.host_status()["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(hp as i32, nix::sys::signal::Signal::SIGKILL);
    common::wait_until("receipt in the outbox", || {
        (w.host_status()["unacknowledged_receipts"] == 1).then_some(())
    });
    w.start_coordinator(0, None);
    w.wait_host_connected();
    common::wait_until("receipt delivered and acknowledged", || {
        (w.host_status()["unacknowledged_receipts"] == 0).then_some(())
    });
    assert_eq!(
        w.count("SELECT count(*) FROM termination_receipts").await,
        1,
        "exactly once"
    );
    let r = w
        .op(&OperatorRequest::Receipts {
            lane_id: Some(lane.clone()),
        })
        .unwrap();
    assert_eq!(r[0]["reconciliation"], "recovery");
    assert_eq!(w.lane_row(&lane).await.0, "IDLE_CLEAN");
    w.invariants().await;
    w.usable(1).await;
}

/// A pending receipt that does not parse is set aside for an operator, and nothing else
/// stops. It failed every read of the outbox: the link dropped each session within 100 ms
/// of opening it, and a restarted supervisor gave up rebuilding its chains, so its
/// re-adopted generations ran on with no authority to report or be stopped through.
#[tokio::test(flavor = "multi_thread")]
async fn a_pending_receipt_that_does_not_parse_is_set_aside_and_nothing_else_stops() {
    let mut w = Split::new(1);
    w.wait_host_connected();
    let a = w.assign(1, "hang").unwrap();
    assert_eq!(a["state"], "RUNNING");
    // The supervisor comes back to a torn receipt in its outbox.
    w.crash_supervisor();
    let name = format!("tr-{}.json", "0".repeat(40));
    std::fs::write(
        w.state_dir(0).join("outbox").join(&name),
        b"{\"receipt_id\": ",
    )
    .unwrap();
    w.start_supervisor();
    let aside = w.state_dir(0).join("outbox-unreadable").join(&name);
    common::wait_until("the torn receipt set aside", || {
        aside.exists().then_some(())
    });
    assert!(!w.state_dir(0).join("outbox").join(&name).exists());
    w.wait_host_connected();
    // The re-adopted generation's chain was rebuilt: the stop reaches it, and its receipt
    // arrives exactly once.
    let out = w.stop_final(a["assignment_id"].as_str().unwrap());
    assert_eq!(out["state"], "CANCELLED", "{out}");
    assert_eq!(
        w.count("SELECT count(*) FROM termination_receipts").await,
        1,
        "exactly once"
    );
    w.invariants().await;
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lanes_created_or_recreated_on_a_connected_host_are_registered_on_the_same_session() {
    use mosaic::supervisor::control::{call, Request};
    let w = Split::new(1);
    let ctl = w.runtime_dir(0).join("control.sock");
    let coordinator_incarnation = |lane: &str| -> Option<String> {
        w.op(&OperatorRequest::Lanes)
            .ok()?
            .as_array()?
            .iter()
            .find(|l| l["lane_id"] == lane)?["lane_incarnation_id"]
            .as_str()
            .map(String::from)
    };
    // A lane made after the session came up becomes assignable without a reconnect.
    let made = call(
        &ctl,
        &Request::LaneCreate {
            lane: "lane-2".into(),
        },
    )
    .unwrap();
    let lane = w.lane(2);
    let inc = made["lane_incarnation_id"].as_str().unwrap().to_string();
    common::wait_until("new lane registered", || {
        (coordinator_incarnation(&lane)? == inc).then_some(())
    });
    let a = w.assign(2, "hang").unwrap();
    assert_eq!(a["state"], "RUNNING");
    // Destroyed and recreated by the host while RUNNING: the new incarnation replaces the
    // old one, whose work goes to recovery (the host verified the old lane empty).
    call(
        &ctl,
        &Request::LaneDestroy {
            lane: "lane-2".into(),
        },
    )
    .unwrap();
    let again = call(
        &ctl,
        &Request::LaneCreate {
            lane: "lane-2".into(),
        },
    )
    .unwrap();
    let inc2 = again["lane_incarnation_id"].as_str().unwrap().to_string();
    assert_ne!(inc2, inc);
    common::wait_until("recreated lane registered", || {
        (coordinator_incarnation(&lane)? == inc2).then_some(())
    });
    assert_eq!(w.lane_row(&lane).await.0, "IDLE_CLEAN");
    assert_eq!(w.count(&format!("SELECT count(*) FROM lane_incarnations WHERE lane_incarnation_id = '{inc}' AND retired_at IS NOT NULL")).await, 1);
    assert_eq!(w.assignment_row(&lane).await.unwrap().1, "RECOVERY");
    // All of it on the one session the supervisor opened.
    let log = std::fs::read_to_string(w.supervisor_log(0)).unwrap();
    assert_eq!(log.matches("coordinator link up").count(), 1, "{log}");
    w.usable(2).await;
}

/// libfaketime, which shifts one process's wall clock (its `clock_gettime`) and nothing
/// else: the supervisor's clock is stepped while the coordinator and the database keep
/// the real one.
fn faketime_lib() -> String {
    let found = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    found
        .unwrap_or_else(|| {
            panic!("the clock-skew tests need libfaketime (apt-get install faketime; scripts/test installs it)")
        })
        .to_string()
}

fn skew_supervisor(w: &mut world::World, offset: &str) {
    let d = &mut w.sup[0];
    d.set_env("LD_PRELOAD", Some(faketime_lib()));
    d.set_env("FAKETIME", Some(offset.to_string()));
    // Timers and timeouts keep the real monotonic clock; only the wall clock moves.
    d.set_env("FAKETIME_DONT_FAKE_MONOTONIC", Some("1".into()));
    d.set_env("FAKETIME_NO_CACHE", Some("1".into()));
}

fn host_clock(w: &world::World) -> Option<serde_json::Value> {
    let st = mosaic::supervisor::control::call(
        &w.runtime_dir(0).join("control.sock"),
        &mosaic::supervisor::control::Request::Status,
    )
    .ok()?;
    let c = st["coordinator_clock"].clone();
    (!c.is_null()).then_some(c)
}

/// A supervisor whose clock is an hour behind: TLS still completes (certificates are
/// backdated a day), and then the host refuses to open a session, naming the offset —
/// in its log, its status and its metrics — and the coordinator audits the refusal with
/// the host's reason. With the host's own check relaxed, the coordinator's check of the
/// hello refuses it the same way. A two-minute skew, inside the tolerance, connects; an
/// hour ahead is refused like an hour behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_clock_an_hour_off_is_refused_with_the_offset_named_and_an_ordinary_skew_connects() {
    use world::{Spec, World};
    let mut w = World::new(Spec {
        lanes: 1,
        tag: "skew",
        ..Spec::default()
    });
    w.start_coordinator(0, None);
    w.wait_leading(0);
    let connected = |w: &World| {
        w.status()["hosts_connected"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    };

    // 1. An hour behind: the host refuses, and says by how much.
    skew_supervisor(&mut w, "-3600");
    w.start_supervisor(0);
    let c = common::wait_until("the host measures its clock", || host_clock(&w));
    assert_eq!(c["refused"], true, "{c}");
    let off = c["host_ahead_ms"].as_i64().unwrap();
    assert!(
        (-3_660_000..=-3_540_000).contains(&off),
        "measured {off} ms"
    );
    common::wait_until("the refusal in the host's log", || {
        w.sup[0]
            .log_text()
            .contains("s behind the coordinator's database time")
            .then_some(())
    });
    assert!(w.sup[0]
        .log_text()
        .contains("s behind the coordinator's database time"));
    common::wait_until("the coordinator audits the host's reason", || {
        (w.audited("clock-skew: host -3") > 0).then_some(())
    });
    assert!(
        !connected(&w),
        "a session was opened with the clock an hour off"
    );

    // 2. The host's own check relaxed: the coordinator's check of the hello refuses it.
    w.crash_supervisor(0);
    let cfg = w.supervisor_config(0);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("max_clock_skew_ms = 86400000\n");
    std::fs::write(&cfg, text).unwrap();
    w.start_supervisor(0);
    common::wait_until("the coordinator refuses the hello for its clock", || {
        (w.audited("clock skew: the host's clock is 3") > 0).then_some(())
    });
    assert!(
        !connected(&w),
        "the coordinator opened a session with the clock an hour off"
    );

    // 3. Two minutes behind, within both tolerances: connected, the offset shown.
    w.crash_supervisor(0);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("max_clock_skew_ms = 86400000\n", "");
    std::fs::write(&cfg, text).unwrap();
    skew_supervisor(&mut w, "-120");
    w.start_supervisor(0);
    common::wait_until("connected with a small skew", || {
        connected(&w).then_some(())
    });
    let c = common::wait_until("the host measures its clock", || {
        host_clock(&w).filter(|c| c["refused"] == false)
    });
    let off = c["host_ahead_ms"].as_i64().unwrap();
    assert!((-180_000..=-60_000).contains(&off), "measured {off} ms");

    // 4. An hour ahead: refused the same way, the other side named.
    w.crash_supervisor(0);
    skew_supervisor(&mut w, "+3600");
    w.start_supervisor(0);
    let c = common::wait_until("the host measures its clock ahead", || {
        host_clock(&w).filter(|c| c["host_ahead_ms"].as_i64().is_some_and(|o| o > 0))
    });
    assert_eq!(c["refused"], true, "{c}");
    let off = c["host_ahead_ms"].as_i64().unwrap();
    assert!((3_540_000..=3_660_000).contains(&off), "measured {off} ms");
    common::wait_until("the refusal in the host's log", || {
        w.sup[0]
            .log_text()
            .contains("s ahead of the coordinator's database time")
            .then_some(())
    });
    common::wait_until("the coordinator audits the host's reason", || {
        (w.audited("clock-skew: host +3") > 0).then_some(())
    });
    assert!(
        !connected(&w),
        "a session was opened with the clock an hour ahead"
    );
}

/// The database refuses the coordinator (its database closed to connections, every
/// connection cut): the refusals the coordinator records meanwhile (here, connections that
/// are not TLS) are spooled on its disk, not dropped, and written once the database
/// answers again — each once, with the time it was recorded.
#[tokio::test(flavor = "multi_thread")]
async fn audit_records_of_a_database_outage_are_spooled_and_written_later_with_their_times() {
    use world::{Spec, World};
    let w = World::started(Spec {
        lanes: 1,
        tag: "spool",
        ..Spec::default()
    });
    let spool = w.coordinator_state_dir(0).join("audit-spool.jsonl");
    let lines = |p: &std::path::Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let outage_began = std::time::SystemTime::now();
    w.close_database(true);
    // A connection that is not TLS at all: refused, and audited, database or not.
    let garbage = || {
        use std::io::{Read, Write};
        if let Ok(mut t) = std::net::TcpStream::connect(&w.listen[0]) {
            let _ = t.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let _ = t.write_all(b"GET / HTTP/1.0\r\n\r\n");
            let _ = t.read_to_end(&mut Vec::new());
        }
    };
    let spooled = common::wait_until("refusals spooled during the outage", || {
        garbage();
        let v = lines(&spool);
        (!v.is_empty()).then_some(v)
    });
    let healed_at = std::time::SystemTime::now();
    w.close_database(false);
    common::wait_until("the spool written out", || {
        lines(&spool).is_empty().then_some(())
    });
    let c = w.sql().await;
    for row in &spooled {
        let id = row["spool_id"].as_str().unwrap();
        let got = c
            .query(
                "SELECT extract(epoch FROM at)::float8 AS at, detail FROM audit WHERE spool_id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(
            got.len(),
            1,
            "spooled record {id} written {} times",
            got.len()
        );
        let at: f64 = got[0].get("at");
        let secs = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
        };
        assert!(
            // Recorded before the database came back; written late, it keeps that time.
            at >= secs(outage_began) - 1.0 && at < secs(healed_at),
            "record {id} carries {at}, not a time within the outage ({} – {})",
            secs(outage_began),
            secs(healed_at)
        );
        let detail: String = got[0].get("detail");
        assert_eq!(detail, row["detail"].as_str().unwrap());
    }
}

/// Operator requests cut off mid-way answer with their key and `state: unknown`, and the key
/// resolves them: `request show` tells what became of the request, and repeating it with the
/// key finishes it — the same assignment, never a conflict, never done twice. Three cuts: the
/// coordinator SIGKILLed with an assign in hand (the client itself sees no answer), and the
/// database closed to connections right after an assign's reservation and right after a
/// stop's request-end committed (the coordinator answers). A repeat of an answered request
/// gets the recorded answer back, with what its assignment is now.
#[tokio::test(flavor = "multi_thread")]
async fn requests_cut_off_mid_way_answer_unknown_with_their_key_and_the_key_resolves_them() {
    use mosaic::coordinator::service::RequestState;
    use mosaic::coordinator::Category;
    use world::{assign_request, Spec, World};
    require_failpoints();
    let mut w = World::new(Spec {
        lanes: 1,
        // Longer than any cut below: the leadership (and with it the chain) outlives it.
        lease_ms: 10_000,
        tag: "requests",
        ..Spec::default()
    });
    let hold = |name: &str| w.dir.join(format!("go-{name}"));
    let (go_crash, go_assign, go_stop) = (hold("crash"), hold("assign"), hold("stop"));
    w.start_coordinator(
        0,
        Some(&format!(
            "hold-after-commit:reserve=return({})",
            go_crash.display()
        )),
    );
    w.wait_leading(0);
    w.start_supervisor(0);
    w.wait_lanes(1);
    let lane = w.lane_of(0, "lane-1");
    let keyed = |mut r: OperatorRequest, key: &str| {
        r.set_request_id(key.into());
        r
    };
    let sock = w.socket(0);
    let in_background = |r: OperatorRequest| {
        let sock = sock.clone();
        std::thread::spawn(move || operator_call(&sock, &r))
    };
    async fn committed(w: &World, key: String) {
        w.wait_count(
            &format!("SELECT count(*) FROM idempotency WHERE idempotency_key = '{key}'"),
            |n| n == 1,
            &key,
        )
        .await
    }
    fn show(w: &World, key: &str) -> Value {
        w.op(&OperatorRequest::Request {
            request_id: key.into(),
        })
        .unwrap()
    }
    let unknown = |e: OpError, key: &str| {
        assert_eq!(e.state, Some(RequestState::Unknown), "{e}");
        assert_eq!(e.request_id.as_deref(), Some(key), "{e}");
        assert!(e.to_string().contains("request show"), "{e}");
    };

    // 1. The coordinator dies holding an assign whose reservation committed.
    let k0 = "ops-crash-1";
    let first = in_background(keyed(assign_request(&lane, "hang", None, true), k0));
    committed(&w, format!("reserve/{k0}")).await;
    w.crash_coordinator(0);
    let e = first.join().unwrap().unwrap_err();
    assert_eq!(e.category, Category::Unavailable, "{e}");
    unknown(e, k0);
    w.start_coordinator(
        0,
        Some(&format!(
            "hold-after-commit:reserve=return({});hold-after-commit:request-end=return({})",
            go_assign.display(),
            go_stop.display()
        )),
    );
    w.wait_leading(0);
    let host = format!("host:{}", w.hosts[0]);
    common::wait_until("the host back", || {
        w.op(&OperatorRequest::Status).ok()?["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == host.as_str())
            .then_some(())
    });
    let s = show(&w, k0);
    assert_eq!(s["state"], "unknown", "{s}");
    assert_eq!(s["reserved"], true, "{s}");
    let a0 = s["now"]["assignment_id"].as_str().unwrap().to_string();
    // Repeated with its key: a definite answer about that same assignment (RUNNING, or the
    // chain the restart ended), never unknown and never a conflict.
    let again = w.op(&keyed(assign_request(&lane, "hang", None, true), k0));
    match &again {
        Ok(v) => assert_eq!(v["assignment_id"], a0.as_str(), "{v}"),
        Err(e) => {
            assert_eq!(e.category, Category::ChainEnded, "{e}");
            assert_eq!(e.state, None, "{e}");
        }
    }
    // (Its stop passes the hold on request-end that part 3 uses.)
    std::fs::write(&go_stop, "").unwrap();
    let st = w.op(&OperatorRequest::Stop {
        assignment_id: a0.clone(),
        outcome: None,
        evidence_digest: None,
        wait: true,
        request_id: None,
    });
    let st = st.unwrap();
    assert!(st["request_id"].is_string(), "{st}");
    common::wait_until("the first assignment final", || {
        (w.op(&OperatorRequest::Status).ok()?["lanes"][0]["state"] == "IDLE_CLEAN").then_some(())
    });
    std::fs::remove_file(&go_stop).unwrap();

    // 2. The database goes away right after an assign's reservation committed.
    let k1 = "ops-assign-1";
    let first = in_background(keyed(assign_request(&lane, "hang", None, true), k1));
    committed(&w, format!("reserve/{k1}")).await;
    w.close_database(true);
    std::fs::write(&go_assign, "").unwrap();
    unknown(first.join().unwrap().unwrap_err(), k1);
    w.close_database(false);
    let s = show(&w, k1);
    assert_eq!(
        (&s["state"], &s["reserved"]),
        (&"unknown".into(), &true.into()),
        "{s}"
    );
    let a1 = s["now"]["assignment_id"].as_str().unwrap().to_string();
    let done = w
        .op(&keyed(assign_request(&lane, "hang", None, true), k1))
        .unwrap();
    assert_eq!(
        (&done["assignment_id"], &done["state"]),
        (&a1.as_str().into(), &"RUNNING".into()),
        "{done}"
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM assignments WHERE assignment_id <> '{a0}'"
        ))
        .await,
        1,
        "the repeat made a second assignment"
    );

    // 3. The database goes away right after a stop's request-end committed.
    let k2 = "ops-stop-1";
    let stop = || OperatorRequest::Stop {
        assignment_id: a1.clone(),
        outcome: None,
        evidence_digest: None,
        wait: true,
        request_id: Some(k2.into()),
    };
    let first = in_background(stop());
    committed(&w, format!("request-end/{a1}")).await;
    w.close_database(true);
    std::fs::write(&go_stop, "").unwrap();
    unknown(first.join().unwrap().unwrap_err(), k2);
    w.close_database(false);
    assert_eq!(show(&w, k2)["state"], "unknown");
    let stopped = w.op(&stop()).unwrap();
    assert_eq!(stopped["state"], "CANCELLED", "{stopped}");
    let s = show(&w, k2);
    assert_eq!(
        (&s["state"], &s["now"]["state"]),
        (&"answered".into(), &"CANCELLED".into()),
        "{s}"
    );

    // The assign is answered now: its repeat gets that answer back (not carried out again,
    // which would report the chain its stop ended), with what the assignment is now.
    let replay = w
        .op(&keyed(assign_request(&lane, "hang", None, true), k1))
        .unwrap();
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["state"], "RUNNING", "{replay}");
    assert_eq!(replay["now"]["state"], "CANCELLED", "{replay}");
    // The key of one request names no other: refused, nothing reserved.
    let other = w
        .op(&keyed(assign_request(&lane, "other task", None, true), k1))
        .unwrap_err();
    assert_eq!(other.category, Category::IdempotencyConflict, "{other}");
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM assignments WHERE assignment_id NOT IN ('{a0}', '{a1}')"
        ))
        .await,
        0
    );
    let bad = w
        .op(&keyed(
            assign_request(&lane, "hang", None, true),
            "no/slashes",
        ))
        .unwrap_err();
    assert_eq!(bad.category, Category::BadInput, "{bad}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lane_destroyed_on_its_host_is_gone_at_once_and_an_assign_to_it_reserves_nothing() {
    use mosaic::supervisor::control::{call, Request};
    let w = Split::new(2);
    let ctl = w.runtime_dir(0).join("control.sock");
    let lane = w.lane(2);
    let inc = w.incarnation_of(0, "lane-2");
    call(
        &ctl,
        &Request::LaneDestroy {
            lane: "lane-2".into(),
        },
    )
    .unwrap();
    // Retired by the host's own report, on the live session (no reconnect, no guess).
    common::wait_until("the destroyed lane retired", || {
        let lanes = w.op(&OperatorRequest::Lanes).ok()?;
        (!lanes
            .as_array()?
            .iter()
            .any(|l| l["lane_id"] == lane.as_str()))
        .then_some(())
    });
    assert_eq!(
        w.count(&format!("SELECT count(*) FROM lane_incarnations WHERE lane_incarnation_id = '{inc}' AND retired_at IS NOT NULL")).await,
        1
    );
    let e = w.assign(2, "hang").unwrap_err();
    assert_eq!(e.category, mosaic::coordinator::Category::NotFound, "{e}");
    assert_eq!(w.count("SELECT count(*) FROM reservations").await, 0);
    assert_eq!(w.count("SELECT count(*) FROM assignments").await, 0);
    // The other lane is untouched and takes work.
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resume_keeps_the_assignments_task_unless_another_is_given_on_purpose() {
    let w = Split::new(1);
    w.wait_host_connected();
    let a = w.assign(1, "hang").unwrap();
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let hp = w.host_status()["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(hp as i32, nix::sys::signal::Signal::SIGKILL);
    // Settled could still mean RUNNING before the death is seen: wait for the recovery.
    let in_recovery = format!(
        "SELECT count(*) FROM assignments WHERE assignment_id = '{id}' AND lifecycle = 'RECOVERY'"
    );
    w.wait_count(&in_recovery, |n| n == 1, "the work in recovery")
        .await;
    assert_eq!(w.wait_settled(1, "the harness died"), "IDLE_CLEAN");
    let attempts = || async {
        w.count(&format!(
            "SELECT count(*) FROM attempts WHERE assignment_id = '{id}'"
        ))
        .await
    };
    let before = attempts().await;
    // Another task text without --replace-task: refused, nothing reserved.
    let e = w
        .op(&assign_req(&w.lane(1), "hang spawn=1", Some(&id)))
        .unwrap_err();
    assert_eq!(e.category, mosaic::coordinator::Category::Mismatch, "{e}");
    assert!(e.message.contains("--replace-task"), "{e}");
    assert_eq!(attempts().await, before);
    // No task: the assignment's own is resumed.
    let r = w.op(&assign_req(&w.lane(1), "", Some(&id))).unwrap();
    assert_eq!(r["state"], "RUNNING", "{r}");
    let task: String = w
        .sql()
        .await
        .query_one(
            "SELECT task_text FROM attempts WHERE assignment_id = $1 ORDER BY created_at DESC LIMIT 1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(task, "hang");
    assert_eq!(attempts().await, before + 1);
    // Another task on purpose: the new attempt records it.
    let hp = w.host_status()["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(hp as i32, nix::sys::signal::Signal::SIGKILL);
    w.wait_count(&in_recovery, |n| n == 1, "the work in recovery again")
        .await;
    assert_eq!(w.wait_settled(1, "the harness died again"), "IDLE_CLEAN");
    let mut replace = assign_req(&w.lane(1), "hang spawn=1", Some(&id));
    if let OperatorRequest::Assign { replace_task, .. } = &mut replace {
        *replace_task = true;
    }
    assert_eq!(w.op(&replace).unwrap()["state"], "RUNNING");
    let task: String = w
        .sql()
        .await
        .query_one(
            "SELECT task_text FROM attempts WHERE assignment_id = $1 ORDER BY created_at DESC LIMIT 1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(task, "hang spawn=1");
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decommission_leaves_only_once_the_coordinator_was_told_and_for_good() {
    use mosaic::supervisor::control::{call, ClientError, Request};
    let mut w = Split::new(2);
    w.wait_host_connected();
    let ctl = w.runtime_dir(0).join("control.sock");
    // The coordinator away: the lanes are destroyed, but the host does not leave.
    w.crash_coordinator(0);
    match call(&ctl, &Request::Decommission { force: false }) {
        Err(ClientError::Refused { message, .. }) => {
            assert!(message.contains("not reached"), "{message}")
        }
        other => panic!("a decommission nobody was told of was not refused: {other:?}"),
    }
    assert!(call(&ctl, &Request::Status).is_ok(), "the supervisor left");
    // Once told (the lanes are retired there), it leaves, and for good.
    w.start_coordinator(0, None);
    w.wait_leading(0);
    w.wait_host_connected();
    let v = call(&ctl, &Request::Decommission { force: false }).unwrap();
    assert_eq!(v["coordinator_told"], true, "{v}");
    common::wait_until("the host's lanes retired", || {
        let lanes = w.op(&OperatorRequest::Lanes).ok()?;
        lanes.as_array()?.is_empty().then_some(())
    });
    assert_eq!(
        w.count("SELECT count(*) FROM lane_incarnations WHERE retired_at IS NULL")
            .await,
        0
    );
    common::wait_until("the supervisor exits", || w.sup[0].exited());
    assert!(
        !w.cgroup_roots[0].exists(),
        "the cgroup root was left behind"
    );
    assert!(!ctl.exists(), "the control socket was left behind");
    world::World::start_supervisor(&mut w, 0);
    let st = common::wait_until("the decommissioned supervisor refuses to start", || {
        w.sup[0].exited()
    });
    assert!(!st.success());
    assert!(
        w.sup[0].log_text().contains("was decommissioned"),
        "{}",
        w.sup[0].log_text()
    );
    let e = w.assign(1, "hang").unwrap_err();
    assert_eq!(e.category, mosaic::coordinator::Category::NotFound, "{e}");
}
