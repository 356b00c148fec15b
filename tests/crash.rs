//! Crashes across the two daemons, as separate real processes: the coordinator killed inside
//! every step of the chain, the link dropped and restored, the supervisor restarted in the
//! middle of a chain. After each: never two active generations, never a RUNNING without its
//! activation receipt and leases, no receipt lost or duplicated.

mod common;
mod pg;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mosaic::coordinator::service::{operator_call, OperatorRequest};
use serde_json::Value;

const STEPS: [&str; 9] = [
    "reserve",
    "checkpoint",
    "fence",
    "stage",
    "staged",
    "contract",
    "injected",
    "consume-ack",
    "activate",
];

struct Split {
    dir: PathBuf,
    db: pg::TestDb,
    host: String,
    coord_cfg: PathBuf,
    sup_cfg: PathBuf,
    cgroup_root: PathBuf,
    coord: Option<Child>,
    sup: Option<Child>,
    operator_addr: String,
}

fn spawn(args: &[&str], cfg: &PathBuf, log: PathBuf) -> Child {
    Command::new(common::MOSAIC)
        .args(args)
        .arg("--config")
        .arg(cfg)
        .env("MOSAIC_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        )
        .spawn()
        .unwrap()
}

impl Split {
    fn new(lanes: usize) -> Self {
        common::require_host();
        let db = pg::TestDb::new();
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
        let dir = std::env::temp_dir().join(format!("mosaic-split-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let host = format!("s-{id}");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let prov =
            mosaic::up::provision(&dir, &host, &db.url, &format!("127.0.0.1:{port}")).unwrap();
        let op_port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let operator_addr = format!("127.0.0.1:{op_port}");
        let c = &prov.coordinator;
        let coord_cfg = dir.join("coordinator.toml");
        std::fs::write(
            &coord_cfg,
            format!(
                "name = {:?}\ntrust_domain = {:?}\nlisten = {:?}\ndatabase_url = {:?}\nsecret_file = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\n\
                 trust_registry = {:?}\nsession_key = {:?}\nordinary_key = {:?}\noperator_socket = {:?}\nlease_ms = 1000\nreservation_ttl_ms = 4000\noperator_listen = {:?}\n",
                c.name, c.trust_domain, c.listen, c.database_url, c.secret_file, c.ca, c.cert, c.key, c.trust_registry, c.session_key, c.ordinary_key, c.operator_socket, operator_addr
            ),
        )
        .unwrap();
        let l = &prov.link;
        let mount = mosaic::cgroup::discover_mount().unwrap();
        let cgroup_root = mount.path.join(format!("mosaic-test-{id}"));
        let lane_list: Vec<String> = (1..=lanes).map(|i| format!("\"lane-{i}\"")).collect();
        let sup_cfg = dir.join("supervisor.toml");
        std::fs::write(
            &sup_cfg,
            format!(
                "host_id = {host:?}\nstate_dir = {:?}\nruntime_dir = {:?}\ncgroup_root = {cgroup_root:?}\nbin_dir = {:?}\nlanes = [{}]\nreattach_timeout_ms = 3000\n\n\
                 [coordinator]\naddress = {:?}\nserver_name = {:?}\nprincipal = {:?}\ntrust_domain = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\ntrust_registry = {:?}\nsession_key = {:?}\nordinary_key = {:?}\n",
                dir.join("state"),
                dir.join("rt"),
                std::path::Path::new(common::MOSAIC).parent().unwrap(),
                lane_list.join(", "),
                l.address, l.server_name, l.principal, l.trust_domain, l.ca, l.cert, l.key, l.trust_registry, l.session_key, l.ordinary_key
            ),
        )
        .unwrap();
        let mut s = Self {
            dir,
            db,
            host,
            coord_cfg,
            sup_cfg,
            cgroup_root,
            coord: None,
            sup: None,
            operator_addr,
        };
        s.start_coordinator();
        s.start_supervisor();
        common::wait_until("lanes registered", || {
            (s.op(&OperatorRequest::Lanes).ok()?.as_array()?.len() == lanes).then_some(())
        });
        s
    }

    fn op(&self, r: &OperatorRequest) -> Result<Value, String> {
        operator_call(&self.dir.join("run/coordinator.sock"), r)
    }

    fn start_coordinator(&mut self) {
        self.coord = Some(spawn(
            &["coordinator"],
            &self.coord_cfg,
            self.dir.join("coordinator.log"),
        ));
        common::wait_until("coordinator leading", || {
            self.op(&OperatorRequest::Status).ok()
        });
    }

    fn wait_host_connected(&self) {
        let me = format!("host:{}", self.host);
        common::wait_until("host connected", || {
            let st = self.op(&OperatorRequest::Status).ok()?;
            st["hosts_connected"]
                .as_array()?
                .iter()
                .any(|h| h == me.as_str())
                .then_some(())
        });
    }

    fn crash_coordinator(&mut self) {
        if let Some(mut c) = self.coord.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn start_supervisor(&mut self) {
        self.sup = Some(spawn(
            &["supervisor"],
            &self.sup_cfg,
            self.dir.join("supervisor.log"),
        ));
        let sock = self.dir.join("rt/control.sock");
        common::wait_until("supervisor up", || {
            mosaic::supervisor::control::call(&sock, &mosaic::supervisor::control::Request::Status)
                .ok()
        });
    }

    fn crash_supervisor(&mut self) {
        if let Some(mut c) = self.sup.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn host_status(&self) -> Value {
        mosaic::supervisor::control::call(
            &self.dir.join("rt/control.sock"),
            &mosaic::supervisor::control::Request::Status,
        )
        .unwrap()
    }

    fn lane(&self, n: usize) -> String {
        format!("{}:lane-{n}", self.host)
    }

    async fn sql(&self) -> tokio_postgres::Client {
        let (c, conn) = tokio_postgres::connect(&self.db.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c
    }

    async fn count(&self, q: &str) -> i64 {
        self.sql().await.query_one(q, &[]).await.unwrap().get(0)
    }

    async fn lane_state(&self, lane: &str) -> String {
        self.sql()
            .await
            .query_one(
                "SELECT state FROM lane_incarnations WHERE lane_id = $1 AND retired_at IS NULL",
                &[&lane],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// The invariants that must hold after any crash.
    async fn invariants(&self) {
        assert_eq!(
            self.count("SELECT count(*) FROM (SELECT lane_incarnation_id FROM generations WHERE state <> 'ENDED' GROUP BY 1 HAVING count(*) > 1) x").await,
            0,
            "two active generations on one incarnation"
        );
        assert_eq!(
            self.count(
                "SELECT count(*) FROM lane_incarnations li WHERE li.state = 'RUNNING' AND NOT EXISTS ( \
                   SELECT 1 FROM transition_receipts t WHERE t.transition = 'activate' AND t.lane_incarnation_id = li.lane_incarnation_id)"
            )
            .await,
            0,
            "RUNNING without its activation receipt"
        );
        assert_eq!(
            self.count(
                "SELECT count(*) FROM leases s JOIN lane_incarnations li USING (lane_incarnation_id) \
                 WHERE s.released_at IS NULL AND li.state NOT IN ('RUNNING', 'DRAINING')"
            )
            .await,
            0,
            "an unreleased effect lease outside RUNNING"
        );
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        self.crash_supervisor();
        self.crash_coordinator();
        common::teardown(
            &self.dir,
            &self.dir.join("rt/lanes"),
            &self.cgroup_root,
            &["coordinator.log", "supervisor.log"],
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_coordinator_killed_inside_every_step_never_leaves_an_ambiguous_running() {
    let mut w = Split::new(STEPS.len());
    let c = w.sql().await;
    c.batch_execute("CREATE FUNCTION hang() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$;").await.unwrap();
    for (i, step) in STEPS.iter().enumerate() {
        let lane = w.lane(i + 1);
        w.wait_host_connected();
        c.batch_execute(&format!("CREATE TRIGGER hang_step AFTER INSERT ON transition_receipts FOR EACH ROW WHEN (NEW.transition = '{step}') EXECUTE FUNCTION hang()")).await.unwrap();
        let sock = w.dir.join("run/coordinator.sock");
        let l2 = lane.clone();
        std::thread::spawn(move || {
            operator_call(
                &sock,
                &OperatorRequest::Assign {
                    lane_id: l2,
                    runtime: "fake@1.0.0".into(),
                    task: "hang".into(),
                    wait: true,
                    resume: None,
                },
            )
        });
        common::wait_until(&format!("coordinator inside {step}"), || {
            let rt = tokio::runtime::Handle::current();
            let n: i64 = std::thread::scope(|s| {
                s.spawn(|| {
                    rt.block_on(w.count(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                    ))
                })
                .join()
                .unwrap()
            });
            (n > 0).then_some(())
        });
        // The crash: the process dies, and with it the connection inside the step.
        w.crash_coordinator();
        c.batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
        )
        .await
        .unwrap();
        c.batch_execute("DROP TRIGGER hang_step ON transition_receipts")
            .await
            .unwrap();
        w.invariants().await;
        w.start_coordinator();
        // The restarted coordinator takes over once the old lease lapses; a chain caught
        // before activation is quarantined (takeover) or expired (watchdog), never resumed
        // into RUNNING by stale authority.
        let state = common::wait_until(&format!("{lane} settles after a crash in {step}"), || {
            let rt = tokio::runtime::Handle::current();
            let s = std::thread::scope(|sc| {
                sc.spawn(|| rt.block_on(w.lane_state(&lane)))
                    .join()
                    .unwrap()
            });
            matches!(s.as_str(), "IDLE_CLEAN" | "QUARANTINED").then_some(s)
        });
        if *step == "reserve" {
            assert_eq!(
                state, "IDLE_CLEAN",
                "an uncommitted reservation leaves the lane as it was"
            );
        } else {
            assert_eq!(state, "QUARANTINED", "crash in {step}");
        }
        w.invariants().await;
    }
    assert_eq!(
        w.count("SELECT count(*) FROM transition_receipts WHERE transition = 'activate'")
            .await,
        0
    );
    assert!(
        w.count("SELECT max(epoch) FROM epochs").await > STEPS.len() as i64,
        "every restart took a new epoch"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn receipts_written_while_the_link_is_down_arrive_once_after_it_is_restored() {
    let mut w = Split::new(1);
    let lane = w.lane(1);
    let a = w
        .op(&OperatorRequest::Assign {
            lane_id: lane.clone(),
            runtime: "fake@1.0.0".into(),
            task: "spawn=3".into(),
            wait: true,
            resume: None,
        })
        .unwrap();
    assert_eq!(a["state"], "RUNNING");
    w.crash_coordinator();
    // While the coordinator (and with it the link) is gone, the harness dies.
    let hp = w.host_status()["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(hp as i32, nix::sys::signal::Signal::SIGKILL);
    common::wait_until("receipt in the outbox", || {
        (w.host_status()["unacknowledged_receipts"] == 1).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    w.start_coordinator();
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
    assert_eq!(w.lane_state(&lane).await, "IDLE_CLEAN");
    w.invariants().await;
    // And the lane works again under the new coordinator epoch.
    let b = w
        .op(&OperatorRequest::Assign {
            lane_id: lane,
            runtime: "fake@1.0.0".into(),
            task: "hang".into(),
            wait: true,
            resume: None,
        })
        .unwrap();
    assert_eq!(b["state"], "RUNNING");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_supervisor_restart_mid_chain_never_activates_and_keeps_its_generation() {
    let mut w = Split::new(1);
    let lane = w.lane(1);
    w.wait_host_connected();
    let c = w.sql().await;
    // Hold the chain right after staging (the coordinator stuck recording the contract)…
    c.batch_execute("CREATE FUNCTION hang() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$;").await.unwrap();
    c.batch_execute("CREATE TRIGGER hang_step AFTER INSERT ON transition_receipts FOR EACH ROW WHEN (NEW.transition = 'contract') EXECUTE FUNCTION hang()").await.unwrap();
    let sock = w.dir.join("run/coordinator.sock");
    let l2 = lane.clone();
    let waiter = std::thread::spawn(move || {
        operator_call(
            &sock,
            &OperatorRequest::Assign {
                lane_id: l2,
                runtime: "fake@1.0.0".into(),
                task: "hang".into(),
                wait: true,
                resume: None,
            },
        )
    });
    common::wait_until("generation staged on the host", || {
        w.host_status()["lanes"][0]["generation"]["process_identity"]["root_pid"].as_i64()
    });
    // …and restart the supervisor in the middle of it.
    let before = w.host_status()["lanes"][0]["generation"]["process_identity"].clone();
    w.crash_supervisor();
    c.batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep'; DROP TRIGGER hang_step ON transition_receipts;").await.unwrap();
    w.start_supervisor();
    let out = waiter.join().unwrap();
    assert!(out.is_err(), "the chain must not report RUNNING: {out:?}");
    // The broken chain never activates. Either the staged generation is still alive
    // (re-adopted, identity re-proven) and its expired chain holds the lane, or — as the
    // fake harness does when its lane socket vanished with the old supervisor — it ended,
    // and exactly one receipt, carrying the very same identity, reconciled it to recovery.
    let state = common::wait_until("lane settles", || {
        let rt = tokio::runtime::Handle::current();
        let s = std::thread::scope(|sc| {
            sc.spawn(|| rt.block_on(w.lane_state(&lane)))
                .join()
                .unwrap()
        });
        matches!(s.as_str(), "IDLE_CLEAN" | "QUARANTINED").then_some(s)
    });
    let receipts = w
        .op(&OperatorRequest::Receipts {
            lane_id: Some(lane.clone()),
        })
        .unwrap();
    let receipts = receipts.as_array().unwrap();
    match state.as_str() {
        "QUARANTINED" => assert_eq!(
            w.host_status()["lanes"][0]["generation"]["process_identity"],
            before,
            "re-adopted as the same generation"
        ),
        _ => {
            assert_eq!(receipts.len(), 1, "{receipts:?}");
            assert_eq!(
                receipts[0]["process_identity"], before,
                "the receipt is for the re-adopted generation"
            );
            assert_eq!(
                receipts[0]["observation_source"], "shim",
                "seen through the re-attached shim"
            );
            assert_eq!(receipts[0]["reconciliation"], "recovery");
        }
    }
    assert_eq!(
        w.count("SELECT count(*) FROM transition_receipts WHERE transition = 'activate'")
            .await,
        0
    );
    assert_eq!(w.count("SELECT count(*) FROM leases").await, 0);
    w.invariants().await;
}

#[test]
fn remote_operators_need_an_operator_certificate_from_the_ca() {
    let w = Split::new(1);
    let pki = w.dir.join("pki");
    let op = mosaic::pki::issue(&pki, mosaic::pki::Kind::Operator, "alice", 30, false).unwrap();
    let url = format!("tls://{}", w.operator_addr);
    let run = |cert: &std::path::Path, key: &std::path::Path, ca: &std::path::Path| {
        Command::new(common::MOSAIC)
            .args([
                "lanes",
                "--json",
                "--coordinator",
                &url,
                "--server-name",
                "localhost",
                "--ca",
            ])
            .arg(ca)
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key)
            .output()
            .unwrap()
    };
    let ca = mosaic::pki::ca_cert_path(&pki);
    let ok = run(&op.cert, &op.key, &ca);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let lanes: Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(lanes[0]["lane_id"], w.lane(1).as_str());
    // A host's certificate is from the right CA but names no operator: refused.
    let host_cert = pki.join(format!("host-{}.pem", w.host));
    let host_key = pki.join(format!("host-{}-key.pem", w.host));
    assert!(
        !run(&host_cert, &host_key, &ca).status.success(),
        "a host certificate got operator access"
    );
    // An operator certificate from another CA: refused at the handshake.
    let other = w.dir.join("other-pki");
    mosaic::pki::init(&other, false).unwrap();
    let stranger =
        mosaic::pki::issue(&other, mosaic::pki::Kind::Operator, "mallory", 30, false).unwrap();
    assert!(
        !run(&stranger.cert, &stranger.key, &ca).status.success(),
        "a foreign operator got access"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn assigning_to_a_disconnected_host_reserves_nothing() {
    let mut w = Split::new(1);
    w.wait_host_connected();
    w.crash_supervisor();
    let me = format!("host:{}", w.host);
    common::wait_until("host gone", || {
        let st = w.op(&OperatorRequest::Status).ok()?;
        (!st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == me.as_str()))
        .then_some(())
    });
    let err = w
        .op(&OperatorRequest::Assign {
            lane_id: w.lane(1),
            runtime: "fake@1.0.0".into(),
            task: "hang".into(),
            wait: true,
            resume: None,
        })
        .unwrap_err();
    assert!(err.contains("not connected"), "{err}");
    assert_eq!(w.count("SELECT count(*) FROM reservations").await, 0);
    assert_eq!(w.lane_state(&w.lane(1)).await, "IDLE_CLEAN");
}

#[tokio::test(flavor = "multi_thread")]
async fn lanes_created_or_recreated_on_a_connected_host_are_registered_on_the_same_session() {
    use mosaic::supervisor::control::{call, Request};
    let w = Split::new(1);
    let ctl = w.dir.join("rt/control.sock");
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
    let a = w
        .op(&OperatorRequest::Assign {
            lane_id: lane.clone(),
            runtime: "fake@1.0.0".into(),
            task: "hang".into(),
            wait: true,
            resume: None,
        })
        .unwrap();
    assert_eq!(a["state"], "RUNNING");
    // Stopped, destroyed and recreated: the new incarnation replaces the idle old one.
    w.op(&OperatorRequest::Stop {
        assignment_id: a["assignment_id"].as_str().unwrap().into(),
    })
    .unwrap();
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
    assert_eq!(w.lane_state(&lane).await, "IDLE_CLEAN");
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM lane_incarnations WHERE lane_incarnation_id = '{inc}' AND retired_at IS NOT NULL"
        ))
        .await,
        1,
        "the old incarnation is retired"
    );
    // All of it on the one session the supervisor opened.
    let log = std::fs::read_to_string(w.dir.join("supervisor.log")).unwrap();
    assert_eq!(log.matches("coordinator link up").count(), 1, "{log}");
}
