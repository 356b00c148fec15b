//! The whole system as an operator runs it: secrets kept out of every output, two hosts,
//! metrics against the database, the TUI in a real terminal, remote operators.

mod common;
mod pg;
mod up;
mod world;

use up::*;
use world::split::*;

#[test]
fn remote_operators_need_an_operator_certificate_from_the_ca() {
    let w = Split::new(1);
    let pki = w.dir.join("pki");
    let op = mosaic::pki::issue(&pki, mosaic::pki::Kind::Operator, "alice", 30, false).unwrap();
    let url = format!("tls://{}", w.operator_addr.as_deref().unwrap());
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
    let host_cert = pki.join(format!("host-{}.pem", w.hosts[0]));
    let host_key = pki.join(format!("host-{}-key.pem", w.hosts[0]));
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

#[test]
fn up_demo_shows_running_sigkill_receipt_and_recovery_then_cleans_up_on_sigterm() {
    common::require_host();
    let db = pg::TestDb::new();
    let dir = std::env::temp_dir().join(format!("mosaic-e2e-{}", uuid::Uuid::new_v4().simple()));
    let mut child = Command::new(common::MOSAIC)
        .args(["up", "--demo", "--lanes", "1", "--state-dir"])
        .arg(&dir)
        .args(["--database-url", &db.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // On a failed assertion, still stop `up` so it tears down what it started.
    struct Stop(i32);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    let _stop = Stop(child.id() as i32);
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let text = read_until(&mut out, "[demo] done");
    assert!(text.contains("is RUNNING in generation 1"), "{text}");
    assert!(
        text.contains("reason \"sigkill\"") && text.contains("reconciliation: \"recovery\""),
        "{text}"
    );
    assert!(
        text.contains("is RECOVERY") && text.contains("RUNNING in a fresh generation 2"),
        "{text}"
    );
    // Still up, and the lane shows the demo's running generation, attachable.
    let sock = dir.join("run/lanes/lane-1/tmux.sock");
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_ok(),
        "lane tmux server not running"
    );
    let st = mosaic::supervisor::control::call(
        &dir.join("run/control.sock"),
        &mosaic::supervisor::control::Request::Status,
    )
    .unwrap();
    assert_eq!(st["lanes"][0]["current_generation"], 2, "{st}");
    common::kill(child.id() as i32, nix::sys::signal::Signal::SIGTERM);
    assert!(child.wait().unwrap().success());
    let cfg = mosaic::up::config_for(&dir, 1).unwrap();
    let root = cfg.cgroup_root.clone().unwrap();
    assert!(
        !root.exists(),
        "cgroups left behind under {}",
        root.display()
    );
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_err(),
        "tmux server left running"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn no_secret_reaches_a_log_receipt_audit_row_metric_or_table() {
    let up = Up::start(1);
    let lane = up.lane_id(1);
    // A full session: assign (ACK, activation), SIGKILL, resume, stop — with a task text
    // marker nobody may repeat.
    let marker = format!("REDACTME{}", uuid::Uuid::new_v4().simple());
    let task = format!("print={marker} hang spawn=1");
    let a = up.assign(&lane, &task);
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let harness = up.host(&["status"])["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(harness as i32, nix::sys::signal::Signal::SIGKILL);
    wait_for("recovery", || {
        (up.assignment(&id)["state"] == "RECOVERY" && up.lane_state(&lane) == "IDLE_CLEAN")
            .then_some(())
    });
    let b = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            "fake@1.0.0",
            "--task",
            &task,
            "--wait",
            "running",
            "--resume",
            &id,
        ])
        .unwrap();
    assert_eq!(b["state"], "RUNNING");
    up.cli(&["stop", "--assignment", &id]).unwrap();
    // Also a refused request carrying the marker (a bad directive after it).
    let _ = up.cli(&[
        "assign",
        "--lane",
        &lane,
        "--runtime",
        "fake@1.0.0",
        "--task",
        &format!("print={marker} explode"),
    ]);

    // The secrets. Fence tokens, re-derived the way the coordinator derives them.
    let secret_hex = std::fs::read_to_string(up.dir.join("keys/coordinator-secret")).unwrap();
    let secret = mosaic::coordinator::CoordinatorSecret::from_hex(&secret_hex).unwrap();
    let (c, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut secrets: Vec<(String, String)> = c
        .query("SELECT reservation_id, fence_salt FROM reservations", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                "a fence token".to_string(),
                secret.fence_token(r.get(0), r.get(1)).expose_hex(),
            )
        })
        .collect();
    assert_eq!(
        secrets.len(),
        2,
        "two reservations (the first and the resume)"
    );
    // Every key the coordinator and the host hold: signing seeds, the secret, TLS keys.
    secrets.push((
        "the coordinator secret".into(),
        secret_hex.trim().to_lowercase(),
    ));
    for e in std::fs::read_dir(up.dir.join("keys")).unwrap().flatten() {
        let k = std::fs::read_to_string(e.path()).unwrap();
        secrets.push((
            format!("key {}", e.file_name().to_string_lossy()),
            k.trim().to_lowercase(),
        ));
    }
    for e in std::fs::read_dir(up.dir.join("pki")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with("-key.pem") {
            let pem = std::fs::read_to_string(e.path()).unwrap();
            // The key material: the longest base64 line of the PEM body.
            let body = pem
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .max_by_key(|l| l.len())
                .unwrap()
                .to_string();
            secrets.push((format!("TLS key {name}"), body));
        }
    }

    // Everywhere they could leak: every database row (the task text only where it must be
    // kept to deliver it: contracts and attempts), every file of the supervisor's state,
    // the daemons' log, every operator answer, both metrics endpoints.
    let mut haystacks: Vec<(String, String)> = Vec::new();
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
    for t in &tables {
        let strip = if t == "contracts" || t == "attempts" {
            " - 'task_text'"
        } else {
            ""
        };
        for row in c
            .query(
                &format!("SELECT (to_jsonb(x){strip})::text FROM {t} x"),
                &[],
            )
            .await
            .unwrap()
        {
            haystacks.push((format!("table {t}"), row.get(0)));
        }
    }
    fn walk(p: &std::path::Path, out: &mut Vec<(String, String)>) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if let Ok(b) = std::fs::read(&p) {
                    out.push((
                        p.display().to_string(),
                        String::from_utf8_lossy(&b).into_owned(),
                    ));
                }
            }
        }
    }
    walk(&up.dir.join("supervisor"), &mut haystacks);
    haystacks.push((
        "mosaic up log".into(),
        std::fs::read_to_string(log_of(&up.dir)).unwrap(),
    ));
    for cmd in [
        vec!["status"],
        vec!["receipts"],
        vec!["audit"],
        vec!["lanes"],
    ] {
        haystacks.push((
            format!("mosaic {}", cmd[0]),
            up.cli(&cmd).unwrap().to_string(),
        ));
    }
    haystacks.push((
        "host receipts".into(),
        up.host(&["receipts", "--all"]).to_string(),
    ));
    haystacks.push(("host status".into(), up.host(&["status"]).to_string()));
    haystacks.push(("assign answers".into(), format!("{a} {b}")));
    for m in ["run/metrics-coordinator.addr", "run/metrics.addr"] {
        let text: String = scrape(&up.dir.join(m))
            .iter()
            .map(|(k, v)| format!("{k} {v}\n"))
            .collect();
        haystacks.push((format!("metrics {m}"), text));
    }
    assert!(haystacks.len() > 20, "too little was scanned");
    let mut found = Vec::new();
    for (where_, text) in &haystacks {
        let lower = text.to_lowercase();
        for (what, secret) in &secrets {
            if !secret.is_empty()
                && (text.contains(secret.as_str()) || lower.contains(&secret.to_lowercase()))
            {
                found.push(format!("{what} in {where_}"));
            }
        }
        if text.contains(&marker) {
            found.push(format!("the task text in {where_}"));
        }
    }
    // Launch nonces never left the nonce file the shim read and deleted: no 64-hex string
    // anywhere hashes to a recorded nonce digest.
    let digests: Vec<String> = c
        .query("SELECT process_identity->>'launch_nonce_digest' FROM generations WHERE process_identity IS NOT NULL", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(digests.len(), 2, "two generations with identities");
    for (where_, text) in &haystacks {
        for word in text.split(|ch: char| !ch.is_ascii_hexdigit()) {
            if word.len() == 64 {
                if let Ok(n) = mosaic::supervisor::identity::LaunchNonce::from_hex(word) {
                    if digests.contains(&n.digest().0) {
                        found.push(format!("a raw launch nonce in {where_}"));
                    }
                }
            }
        }
    }
    assert!(found.is_empty(), "secrets found: {found:#?}");
    // The marker is kept where it must be (to deliver the task after any crash) — which
    // also shows the scan would have found it.
    let kept: i64 = c
        .query_one(
            "SELECT count(*) FROM contracts WHERE task_text LIKE '%' || $1 || '%'",
            &[&marker],
        )
        .await
        .unwrap()
        .get(0);
    assert!(kept >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_under_mosaic_up_keep_to_their_own_lanes_and_survive_each_other() {
    let up = Up::fleet(1, 2);
    let me = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (h1, h2) = (format!("{me}-1"), format!("{me}-2"));
    let (l1, l2) = (format!("{h1}:lane-1"), format!("{h2}:lane-1"));
    let a1 = up.assign(&l1, "hang");
    let a2 = up.assign(&l2, "hang");
    let st = up.cli(&["status"]).unwrap();
    let epoch = |st: &Value, h: &str| {
        st["host_sessions"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["host_id"] == h))
            .and_then(|s| s["session_epoch"].as_i64())
    };
    assert_eq!(
        (epoch(&st, &h1), epoch(&st, &h2)),
        (Some(1), Some(1)),
        "{st}"
    );
    // Each host's own supervisor, its own cgroup subtree and tmux server.
    let sup_pid = |h: &str| -> i32 {
        let cfg = up.dir.join(format!("hosts/{h}/supervisor.toml"));
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .find_map(|e| {
                let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                String::from_utf8_lossy(&cmd)
                    .replace('\0', " ")
                    .contains(&format!("supervisor --config {}", cfg.display()))
                    .then_some(pid)
            })
            .unwrap_or_else(|| panic!("no supervisor process for {h}"))
    };
    let (p1, p2) = (sup_pid(&h1), sup_pid(&h2));
    assert_ne!(p1, p2);
    // Host 2's supervisor is SIGKILLed: host 1 never notices.
    common::kill(p2, nix::sys::signal::Signal::SIGKILL);
    assert_eq!(up.lane_state(&l1), "RUNNING");
    // `mosaic up` starts host 2 again; it re-adopts its generation on a new session.
    let st = wait_for("host 2 back on a new session", || {
        let st = up.cli(&["status"]).ok()?;
        (epoch(&st, &h2)? >= 2).then_some(st)
    });
    assert_eq!(epoch(&st, &h1), Some(1), "host 1's session moved: {st}");
    assert_eq!(up.lane_state(&l2), "RUNNING");
    for a in [&a1, &a2] {
        let out = up
            .cli(&["stop", "--assignment", a["assignment_id"].as_str().unwrap()])
            .unwrap();
        assert_eq!(out["state"], "CANCELLED", "{out}");
    }
    // And both take new work.
    for l in [&l1, &l2] {
        assert_eq!(up.assign(l, "hang")["state"], "RUNNING");
    }
}

/// A lane's tmux server killed from outside under a RUNNING assignment: the host notices on
/// its own (nobody assigning or attaching), stops and receipts the generation, quarantines
/// the lane; the assignment goes to RECOVERY (never COMPLETED), and after a recreate the
/// new incarnation's server is watched the same way (it used to come back IDLE_CLEAN).
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_lane_server_is_noticed_receipted_and_watched_again_after_recreate() {
    let up = Up::start(1);
    let lane = up.lane_id(1);
    let a = up.assign(&lane, "hang spawn=1");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let kill_server = || {
        let st = Command::new("tmux")
            .arg("-S")
            .arg(up.dir.join("run/lanes/lane-1/tmux.sock"))
            .arg("kill-server")
            .status()
            .unwrap();
        assert!(st.success());
    };
    kill_server();
    wait_for("recovery and quarantine", || {
        (up.assignment(&id)["state"] == "RECOVERY" && up.lane_state(&lane) == "QUARANTINED")
            .then_some(())
    });
    let receipts = up.host(&["receipts", "--all"]);
    let r = receipts.as_array().unwrap();
    assert_eq!(r.len(), 1, "{receipts}");
    // Its terminal went with the server: the harness either ended on that itself (a crash
    // receipt, as observed) or was stopped by the host's watch of the server.
    assert!(
        r[0]["stop"]["cause"] == "lane-server-lost" || r[0]["termination_reason"] == "crash",
        "{receipts}"
    );
    assert_eq!(r[0]["unfinished_status"], true, "{receipts}");
    assert_eq!(r[0]["cleanup"]["verified_empty"], true, "{receipts}");
    up.cli(&["lane", "recreate", "--lane", &lane]).unwrap();
    wait_for("lane recreated", || {
        (up.lane_state(&lane) == "IDLE_CLEAN").then_some(())
    });
    kill_server();
    wait_for("the recreated lane quarantined too", || {
        (up.lane_state(&lane) == "QUARANTINED").then_some(())
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_agree_with_the_database_after_a_scripted_run() {
    let up = Up::start(2);
    let (l1, l2) = (up.lane_id(1), up.lane_id(2));
    // A run that ends by SIGKILL, one stopped by the operator, and a lane quarantined by
    // its host (its tmux server killed), then recreated.
    let a = up.assign(&l1, "hang spawn=2");
    let harness = up.host(&["status"])["lanes"][0]["generation"]["process_identity"]["harness_pid"]
        .as_i64()
        .unwrap();
    common::kill(harness as i32, nix::sys::signal::Signal::SIGKILL);
    wait_for("lane 1 clean", || {
        (up.lane_state(&l1) == "IDLE_CLEAN").then_some(())
    });
    let b = up.assign(&l1, "hang");
    assert_eq!(
        up.cli(&["stop", "--assignment", b["assignment_id"].as_str().unwrap()])
            .unwrap()["state"],
        "CANCELLED"
    );
    let _ = Command::new("tmux")
        .arg("-S")
        .arg(up.dir.join("run/lanes/lane-2/tmux.sock"))
        .arg("kill-server")
        .status();
    // The host notices on its own (it watches its lanes' servers), nobody assigning.
    wait_for("lane 2 quarantined", || {
        (up.lane_state(&l2) == "QUARANTINED").then_some(())
    });
    up.cli(&["lane", "recreate", "--lane", &l2]).unwrap();
    wait_for("lane 2 recreated", || {
        (up.lane_state(&l2) == "IDLE_CLEAN").then_some(())
    });
    let _ = a;

    let coord = scrape(&up.dir.join("run/metrics-coordinator.addr"));
    let host = scrape(&up.dir.join("run/metrics.addr"));
    let (c, conn) = tokio_postgres::connect(&up.db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // Receipts by source and reason: the coordinator's series are the database's counts,
    // and the host wrote exactly those.
    let rows = c
        .query(
            "SELECT body->>'observation_source', body->>'termination_reason', count(*) FROM termination_receipts GROUP BY 1, 2",
            &[],
        )
        .await
        .unwrap();
    assert!(rows.len() >= 2, "the run produced too few kinds of receipt");
    for r in &rows {
        let (src, reason, n): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
        let labels = format!("{{source=\"{src}\",reason=\"{reason}\"}}");
        assert_eq!(
            metric(&coord, &format!("mosaic_termination_receipts{labels}")),
            n as f64,
            "{src}/{reason}"
        );
        assert_eq!(
            metric(&host, &format!("mosaic_termination_receipts_total{labels}")),
            n as f64,
            "host {src}/{reason}"
        );
    }
    let count = |sql: &str| {
        let c = &c;
        let sql = sql.to_string();
        async move { c.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) as f64 }
    };
    assert_eq!(
        metric(&coord, "mosaic_generations"),
        count("SELECT count(*) FROM generations").await
    );
    let entries = count("SELECT sum(quarantine_entries)::bigint FROM lane_incarnations").await;
    assert!(entries >= 1.0, "the run quarantined nothing");
    assert_eq!(metric(&coord, "mosaic_quarantine_entries"), entries);
    assert_eq!(
        metric(
            &host,
            &format!("mosaic_lane_quarantines_total{{lane=\"{l2}\"}}")
        ),
        1.0
    );
    assert_eq!(
        metric(
            &coord,
            "mosaic_authority_transitions{transition=\"activate\"}"
        ),
        count("SELECT count(*) FROM transition_receipts WHERE transition = 'activate'").await
    );
    assert_eq!(metric(&coord, "mosaic_leadership_leading"), 1.0);
    assert!(
        metric(
            &coord,
            "mosaic_transitions_total{op=\"activate\",result=\"decided\"}"
        ) >= 2.0
    );
    // No label or value carries a task, a token or a key: only the names used above.
    let text: String = coord.iter().chain(&host).map(|(k, _)| k.clone()).collect();
    assert!(
        !text.contains("spawn=") && !text.contains("hang"),
        "task text in metrics"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tui_lists_marks_previews_attaches_and_stops_in_a_real_terminal() {
    let up = Up::start(3);
    let l1 = up.lane_id(1);
    let a = up.assign(&l1, "print=hello-from-the-lane hang");
    let id = a["assignment_id"].as_str().unwrap();
    // Lane 3's work says it is blocked: the view shows why.
    let l3 = up.lane_id(3);
    up.assign(&l3, "blocked=needs-review");
    let tui = Pane::start(
        &up.dir,
        &format!("{} tui --state-dir {}", common::MOSAIC, up.dir.display()),
    );
    // The list: both lanes, lane 1 RUNNING under its assignment.
    let screen = tui.wait_for("the lane list", |s| {
        s.lines()
            .any(|l| l.contains(&l1) && l.contains("RUNNING") && l.contains(id))
            && s.contains(&up.lane_id(2))
    });
    assert!(screen.contains("fake@1.0.0"), "{screen}");
    // Lane 3's work waits on the operator: it is marked, counted in the header; lane 1 is not.
    let screen = tui.wait_for("the blocked work's mark", |s| {
        s.lines()
            .any(|l| l.contains(&l3) && l.contains("! blocked: needs-review"))
    });
    assert!(screen.contains("1 lane(s) need you"), "{screen}");
    let lane1 = screen.lines().find(|l| l.contains(&l1)).unwrap();
    assert!(!lane1.contains("! "), "lane 1 marked: {screen}");
    // The selected lane's pane, live, without attaching.
    tui.wait_for("lane 1's pane in the preview", |s| {
        s.contains(" Mosaic — coordinator")
            && s.contains(&format!("{l1} on "))
            && s.contains("hello-from-the-lane")
    });
    // `n` selects the next lane needing the operator: the preview follows it.
    tui.keys(&["n"]);
    tui.wait_for("lane 3 previewed", |s| {
        s.contains(&format!("{l3} on ")) && !s.contains("hello-from-the-lane")
    });
    tui.keys(&["k", "k"]);
    tui.wait_for("lane 1 previewed again", |s| {
        s.contains("hello-from-the-lane")
    });
    // Enter attaches to the selected lane (the first): its pane shows the harness, the
    // view is gone.
    tui.keys(&["Enter"]);
    tui.wait_for("the lane's own pane", |s| {
        s.contains("hello-from-the-lane") && !s.contains(" Mosaic — coordinator")
    });
    // Detach (the lane's tmux prefix, then d): back in the view.
    tui.keys(&["C-b", "d"]);
    tui.wait_for("the view again", |s| {
        s.contains(&format!("detached from {l1}"))
    });
    // `s` stops the selected lane's assignment; the view follows to IDLE_CLEAN.
    tui.keys(&["s"]);
    tui.wait_for("the lane stopped", |s| {
        s.lines()
            .any(|l| l.contains(&l1) && l.contains("IDLE_CLEAN"))
    });
    assert_eq!(up.assignment(id)["state"], "CANCELLED");
    // Assign from the prompt: `a`, then the runtime and task.
    tui.keys(&["a"]);
    tui.wait_for("the assign prompt", |s| s.contains("assign to"));
    tui.keys(&["print=second-in-the-lane hang", "Enter"]);
    tui.wait_for("the new assignment running", |s| {
        s.lines().any(|l| l.contains(&l1) && l.contains("RUNNING"))
    });
    // The preview follows the lane's new generation with no key pressed.
    tui.wait_for("the new generation's pane", |s| {
        s.contains("second-in-the-lane")
    });
    tui.keys(&["q"]);
}
