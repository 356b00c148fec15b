//! The host supervisor against real tmux, real cgroups and real processes.
//!
//! Every test runs its own supervisor process with its own cgroup root and tmux servers
//! (see `common::Host`), so they run in parallel and clean up after themselves.

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use common::*;
use mosaic::supervisor::control::Request;
use nix::sys::signal::Signal;
use serde_json::Value;

fn identity(g: &Value) -> &Value {
    &g["process_identity"]
}

fn pid_of(v: &Value) -> i32 {
    v.as_i64().unwrap() as i32
}

/// Starts `spawn=n` on `lane` and waits until the shim, the harness and all `n`
/// descendants are in the generation's cgroup. Returns the generation, its cgroup
/// directory and the members (pid, start time) seen.
fn start_with_tree(h: &Host, lane: &str, n: usize) -> (Value, std::path::PathBuf, Vec<(i32, u64)>) {
    start_tree(h, lane, "", n)
}

fn start_tree(
    h: &Host,
    lane: &str,
    more: &str,
    n: usize,
) -> (Value, std::path::PathBuf, Vec<(i32, u64)>) {
    let g = h.start(lane, &format!("{more} spawn={n}"));
    let cg = cgroup_abs(h, identity(&g)["cgroup_path"].as_str().unwrap());
    let before = wait_until("all descendants", || {
        let m = members(&cg);
        (m.len() >= n + 2).then_some(m)
    });
    (g, cg, before)
}

#[test]
fn fresh_generation_gets_new_cgroup_pid_and_nonce() {
    let h = Host::new();
    h.create_lane("w1");
    let g1 = h.start("w1", "hang");
    let g2 = h.start("w1", "hang");
    let (a, b) = (identity(&g1), identity(&g2));
    assert_eq!(g1["generation"], 1);
    assert_eq!(g2["generation"], 2);
    for field in [
        "cgroup_path",
        "cgroup_id",
        "root_pid",
        "launch_nonce_digest",
        "harness_pid",
    ] {
        assert_ne!(
            a[field], b[field],
            "{field} was reused by the next generation"
        );
    }
    // The first generation was replaced: stopped, verified empty, removed, and receipted.
    assert!(!cgroup_abs(&h, a["cgroup_path"].as_str().unwrap()).exists());
    let r = h.wait_receipt("w1", 1);
    assert_eq!(r["termination_reason"], "replace");
    assert_eq!(r["cleanup"]["verified_empty"], true);
    assert!(is_dead(
        pid_of(&a["root_pid"]),
        a["root_start_time"].as_u64().unwrap()
    ));
}

#[test]
fn identity_fields_are_correct() {
    let h = Host::new();
    h.create_lane("w1");
    let g = h.start("w1", "hang");
    let id = identity(&g);
    let root = pid_of(&id["root_pid"]);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(id["boot_id"], boot.trim());
    assert_eq!(id["root_start_time"].as_u64(), start_time(root));
    assert_eq!(id["lane_id"], h.lane_id("w1"));
    assert_eq!(id["generation"], 1);
    assert_eq!(id["lane_incarnation_id"], g["lane_incarnation_id"]);
    // Executable identity is the shim's (the mosaic-shim binary), by path and by inode.
    use std::os::unix::fs::MetadataExt;
    let exe = std::fs::metadata(SHIM).unwrap();
    assert_eq!(id["exe_ino"].as_u64(), Some(exe.ino()));
    assert_eq!(id["exe_dev"].as_u64(), Some(exe.dev()));
    assert_eq!(
        std::fs::canonicalize(id["exe_path"].as_str().unwrap()).unwrap(),
        std::fs::canonicalize(SHIM).unwrap()
    );
    // The cgroup is the one /proc reports for the root, under the lane's incarnation.
    let rel = id["cgroup_path"].as_str().unwrap();
    assert_eq!(mosaic::cgroup::cgroup_of(Some(root)).unwrap(), rel);
    let inc = g["lane_incarnation_id"].as_str().unwrap();
    assert!(rel.ends_with(&format!("/lanes/w1/{inc}/gen-1")), "{rel}");
    let abs = cgroup_abs(&h, rel);
    assert_eq!(
        id["cgroup_id"].as_u64(),
        Some(std::fs::metadata(&abs).unwrap().ino())
    );
    // The harness is the root's child, in the same cgroup; the nonce never appears.
    let harness = pid_of(&id["harness_pid"]);
    let stat = procfs::process::Process::new(harness)
        .unwrap()
        .stat()
        .unwrap();
    assert_eq!(stat.ppid, root);
    assert_eq!(mosaic::cgroup::cgroup_of(Some(harness)).unwrap(), rel);
    assert_eq!(id["launch_nonce_digest"].as_str().unwrap().len(), 64);
    assert!(
        g.to_string().find("nonce\"").is_none(),
        "a raw nonce field leaked: {g}"
    );
}

/// Starts `spawn=N`, waits for every descendant, stops, and checks zero survivors. The
/// tree ignores its graceful signal, so it is the kill's to end (a harness that exits
/// takes its PID namespace with it, and the kernel ends the rest before the kill runs).
fn stop_kills_tree(h: &Host, n: usize) {
    h.create_lane("big");
    // shim + harness + n descendants (double forks leave one grandchild each).
    let (_, cg, before) = start_tree(h, "big", "ignore-term", n);
    let distinct = |field: fn(&procfs::process::Stat) -> i32| -> BTreeSet<i32> {
        before
            .iter()
            .filter_map(|(p, _)| procfs::process::Process::new(*p).ok()?.stat().ok())
            .map(|s| field(&s))
            .collect()
    };
    let sids = distinct(|s| s.session);
    let pgids = distinct(|s| s.pgrp);
    assert!(
        sids.len() > n / 4,
        "expected many setsid'd descendants, saw {} sessions",
        sids.len()
    );
    assert!(
        pgids.len() > n / 4,
        "expected many process groups, saw {}",
        pgids.len()
    );
    let r = h.call(&Request::Stop { lane: "big".into() });
    assert_eq!(r["cleanup"]["verified_empty"], true, "{r}");
    assert_eq!(r["cleanup"]["cgroup_removed"], true, "{r}");
    assert!(
        r["cleanup"]["members_killed"].as_u64().unwrap() >= (n + 1) as u64,
        "{r}"
    );
    assert!(!cg.exists(), "generation cgroup still present");
    let survivors: Vec<_> = before.iter().filter(|(p, st)| !is_dead(*p, *st)).collect();
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
}

#[test]
fn stop_kills_200_descendants_with_zero_survivors() {
    let h = Host::new();
    stop_kills_tree(&h, 200);
    assert_eq!(h.lane_status("big")["current_generation"], Value::Null);
}

#[test]
fn stop_with_freezer_fallback_kills_the_tree_too() {
    let h = Host::with(Options {
        force_freezer: true,
        ..Options::default()
    });
    assert_eq!(h.status()["kill_method"], "freeze-and-kill");
    stop_kills_tree(&h, 200);
    let r = h.wait_receipt("big", 1);
    assert_eq!(r["cleanup"]["method"], "freeze-and-kill");
}

#[test]
fn sigkill_of_the_harness_gives_one_sigkill_receipt_and_kills_descendants() {
    let h = Host::new();
    h.create_lane("w1");
    let (g, cg, before) = start_with_tree(&h, "w1", 24);
    kill(pid_of(&identity(&g)["harness_pid"]), Signal::SIGKILL);
    let r = h.wait_receipt("w1", 1);
    assert_eq!(r["termination_reason"], "sigkill");
    assert_eq!(r["observation_source"], "shim");
    assert_eq!(r["signal"], 9);
    assert_eq!(r["unfinished_status"], true);
    assert_eq!(r["cleanup"]["verified_empty"], true);
    assert!(
        before.iter().all(|(p, st)| is_dead(*p, *st)),
        "a descendant survived"
    );
    assert!(!cg.exists());
    // Exactly one receipt for the generation, and the lane is free for a fresh one.
    assert_eq!(h.receipts(Some("w1"), true).len(), 1);
    wait_until("lane settles", || {
        (h.lane_status("w1")["current_generation"] == Value::Null).then_some(())
    });
    assert_eq!(h.start("w1", "hang")["generation"], 2);
}

#[test]
fn sigkill_of_the_shim_gives_one_sigkill_receipt_and_kills_descendants() {
    let h = Host::new();
    h.create_lane("w1");
    let (g, cg, before) = start_with_tree(&h, "w1", 24);
    kill(pid_of(&identity(&g)["root_pid"]), Signal::SIGKILL);
    let r = h.wait_receipt("w1", 1);
    assert_eq!(r["termination_reason"], "sigkill", "{r}");
    assert_eq!(r["observation_source"], "supervisor");
    assert_eq!(r["cleanup"]["verified_empty"], true);
    // The harness outlived its shim for a moment; it and every descendant are gone now.
    assert!(
        before.iter().all(|(p, st)| is_dead(*p, *st)),
        "a descendant survived"
    );
    assert!(!cg.exists(), "generation cgroup still present");
    assert_eq!(h.receipts(Some("w1"), true).len(), 1);
}

#[test]
fn crashes_produce_crash_receipts() {
    let h = Host::new();
    h.create_lane("a");
    h.create_lane("b");
    h.start("a", "spawn=4 exit=3");
    h.start("b", "crash-after=0.2");
    let ra = h.wait_receipt("a", 1);
    assert_eq!(ra["termination_reason"], "crash");
    assert_eq!(ra["exit_code"], 3);
    assert_eq!(ra["observation_source"], "shim");
    let rb = h.wait_receipt("b", 1);
    assert_eq!(rb["termination_reason"], "crash");
    assert_eq!(rb["signal"], Signal::SIGABRT as i32);
    // A clean exit is a quit, and the only case not marked unfinished.
    h.create_lane("c");
    h.start("c", "exit=0");
    let rc = h.wait_receipt("c", 1);
    assert_eq!(rc["termination_reason"], "quit");
    assert_eq!(rc["unfinished_status"], false);
    assert_eq!(ra["unfinished_status"], true);
}

#[test]
fn sigterm_ignorer_is_killed_after_its_grace_period() {
    let h = Host::new();
    h.create_lane("stubborn");
    h.create_lane("polite");
    h.start("stubborn", "ignore-term spawn=6");
    h.start("polite", "spawn=6");
    let t = Instant::now();
    let r = h.call(&Request::Stop {
        lane: "stubborn".into(),
    });
    let waited = t.elapsed();
    assert_eq!(r["termination_reason"], "timeout", "{r}");
    assert_eq!(r["stop"]["forced"], true);
    assert_eq!(r["cleanup"]["verified_empty"], true);
    // Semantics, not speed: it was not killed before its grace period ran out.
    let grace = r["stop"]["grace_period_ms"].as_u64().unwrap();
    assert!(
        waited.as_millis() as u64 >= grace,
        "force-killed after {waited:?}, grace {grace} ms"
    );
    let p = h.call(&Request::Stop {
        lane: "polite".into(),
    });
    assert_eq!(p["termination_reason"], "quit", "{p}");
    assert_eq!(p["stop"]["forced"], false);
    assert_eq!(p["signal"], Signal::SIGTERM as i32);
}

#[test]
fn unknown_runtime_version_or_directive_fails_closed_and_changes_nothing() {
    let h = Host::new();
    h.create_lane("w1");
    let start = |runtime: &str, d: &str| Request::Start {
        lane: "w1".into(),
        runtime: runtime.into(),
        directives: d.split_whitespace().map(String::from).collect(),
    };
    let cases = [
        (start("claude@1.0.0", "hang"), "unknown-runtime"),
        (start("fake@1.0.1", "hang"), "unknown-version"),
        (start("fake@2.0.0", "hang"), "unknown-version"),
        (start("fake", "hang"), "registry"),
        (start("fake@1.0.0", "explode"), "registry"),
        (start("fake@1.0.0", "spawn=many"), "registry"),
    ];
    let lanes_dir = h.cgroup_root.join("lanes/w1");
    for (req, kind) in cases {
        let (k, msg) = h.refused(&req);
        assert_eq!(k, kind, "{req:?}: {msg}");
        assert!(!msg.is_empty());
    }
    // Nothing moved: no generation cgroup, no receipt, and numbering starts at 1.
    let gens = walk_gens(&lanes_dir);
    assert!(gens.is_empty(), "a refused start left cgroups: {gens:?}");
    assert!(h.receipts(None, true).is_empty());
    assert_eq!(h.start("w1", "hang")["generation"], 1);
}

fn walk_gens(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                if e.file_name().to_string_lossy().starts_with("gen-") {
                    out.push(e.path());
                }
                out.extend(walk_gens(&e.path()));
            }
        }
    }
    out
}

#[test]
fn bad_lane_names_and_unknown_lanes_are_refused() {
    let h = Host::new();
    for bad in [
        "",
        "Upper",
        "a/b",
        "..",
        "a:b",
        "x y",
        "-lead",
        "semi;colon",
    ] {
        let (k, _) = h.refused(&Request::LaneCreate { lane: bad.into() });
        assert_eq!(k, "bad-name", "{bad:?}");
    }
    let (k, _) = h.refused(&Request::Start {
        lane: "nope".into(),
        runtime: "fake@1.0.0".into(),
        directives: vec![],
    });
    assert_eq!(k, "no-such-lane");
    let (k, _) = h.refused(&Request::Stop {
        lane: "nope".into(),
    });
    assert_eq!(k, "no-such-lane");
    h.create_lane("w1");
    let (k, _) = h.refused(&Request::LaneCreate { lane: "w1".into() });
    assert_eq!(k, "lane-exists");
    let (k, _) = h.refused(&Request::Stop { lane: "w1".into() });
    assert_eq!(k, "no-live-generation");
    // Malformed control requests are refused and audited, and the supervisor lives on.
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(h.socket()).unwrap();
    s.write_all(
        b"{\"op\":\"start\",\"lane\":\"w1\",\"runtime\":\"fake@1.0.0\",\"sneaky\":1}\nnot json\n",
    )
    .unwrap();
    let mut r = std::io::BufReader::new(s);
    for _ in 0..2 {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.contains("bad-request"), "{line}");
    }
    assert!(h.audit().contains("bad-control-request"));
    assert_eq!(h.status()["lanes"].as_array().unwrap().len(), 1);
}

#[test]
fn lane_recreate_gets_a_new_incarnation() {
    let h = Host::new();
    let l1 = h.create_lane("w1");
    h.start("w1", "spawn=3");
    h.call(&Request::LaneDestroy { lane: "w1".into() });
    let r = h.wait_receipt("w1", 1);
    assert_eq!(r["stop"]["cause"], "lane-destroy");
    assert!(
        !h.cgroup_root.join("lanes/w1").exists(),
        "lane cgroups left behind"
    );
    assert!(
        !h.lane_tmux_socket("w1").exists()
            || std::os::unix::net::UnixStream::connect(h.lane_tmux_socket("w1")).is_err()
    );
    let l2 = h.create_lane("w1");
    assert_ne!(l1["lane_incarnation_id"], l2["lane_incarnation_id"]);
    let g = h.start("w1", "hang");
    assert_eq!(
        g["generation"], 1,
        "generations are scoped to the new incarnation"
    );
    assert_eq!(g["lane_incarnation_id"], l2["lane_incarnation_id"]);
    // The old generation's receipt stays bound to the old incarnation.
    assert_eq!(r["lane_incarnation_id"], l1["lane_incarnation_id"]);
}

#[test]
fn supervisor_crash_and_restart_readopts_live_and_receipts_the_dead() {
    let mut h = Host::new();
    for l in ["live", "gone", "quit", "crashed"] {
        h.create_lane(l);
    }
    let live = h.start("live", "spawn=5");
    let gone = h.start("gone", "spawn=5");
    h.start("quit", "exit-after=1.5");
    let crashed = h.start("crashed", "exit-after=1.5");
    let cg_live = cgroup_abs(&h, identity(&live)["cgroup_path"].as_str().unwrap());
    let live_before = wait_until("descendants", || {
        let m = members(&cg_live);
        (m.len() >= 7).then_some(m)
    });
    h.crash_supervisor();
    // While no supervisor watches: one generation dies whole, leaving no record...
    let cg_gone = cgroup_abs(&h, identity(&gone)["cgroup_path"].as_str().unwrap());
    std::fs::write(cg_gone.join("cgroup.kill"), "1").unwrap();
    // ...two harnesses exit by themselves (their shims record it), and one of those shims
    // is then SIGKILLed, so only its exit record is left to prove how the harness ended.
    let crashed_record = h
        .state_dir()
        .join("generations")
        .join(crashed["lane_incarnation_id"].as_str().unwrap())
        .join("gen-1.exit.json");
    wait_until("exit record", || crashed_record.exists().then_some(()));
    kill(pid_of(&identity(&crashed)["root_pid"]), Signal::SIGKILL);
    std::thread::sleep(std::time::Duration::from_millis(200));
    h.start_supervisor();

    // Re-adopted: same process tree, same identity, still alive, still watched.
    let ls = h.lane_status("live");
    assert_eq!(ls["current_generation"], 1);
    assert_eq!(ls["generation"]["process_identity"], *identity(&live));
    assert!(
        live_before.iter().all(|(p, st)| !is_dead(*p, *st)),
        "re-adoption disturbed the tree"
    );
    // Died whole while away, no record: supervisor observation, reason unknown.
    let rg = h.wait_receipt("gone", 1);
    assert_eq!(rg["observation_source"], "supervisor");
    assert_eq!(rg["termination_reason"], "unknown");
    // Harness exited 0 while away, shim alive: the shim reports it on reattach.
    let rq = h.wait_receipt("quit", 1);
    assert_eq!(rq["observation_source"], "shim");
    assert_eq!(rq["termination_reason"], "quit");
    // Harness exited, then its shim was killed: the exit record proves the reason.
    let rc = h.wait_receipt("crashed", 1);
    assert_eq!(rc["observation_source"], "supervisor");
    assert_eq!(rc["termination_reason"], "quit");
    assert_eq!(rc["exit_code"], 0);
    for r in [&rg, &rq, &rc] {
        assert_eq!(r["cleanup"]["verified_empty"], true, "{r}");
    }
    // The adopted generation is fully controllable: stop it and nothing survives.
    let stop = h.call(&Request::Stop {
        lane: "live".into(),
    });
    assert_eq!(stop["termination_reason"], "quit");
    assert!(live_before.iter().all(|(p, st)| is_dead(*p, *st)));
    assert_eq!(
        h.receipts(None, true).len(),
        4,
        "one receipt per generation, no more"
    );
}

#[test]
fn forged_reattach_is_rejected_and_the_generation_quarantined() {
    let mut h = Host::with(Options {
        reattach_timeout_ms: 3000,
        ..Options::default()
    });
    h.create_lane("w1");
    let g = h.start("w1", "spawn=3");
    let id = identity(&g).clone();
    let root = pid_of(&id["root_pid"]);
    let cg = cgroup_abs(&h, id["cgroup_path"].as_str().unwrap());
    let before = members(&cg);
    h.crash_supervisor();
    // Freeze the generation so the real shim cannot reconnect (SIGSTOP would not do: tmux
    // resumes stopped panes); a forger tries to take its place.
    std::fs::write(cg.join("cgroup.freeze"), "1").unwrap();
    let rec_path = h
        .state_dir()
        .join("generations")
        .join(g["lane_incarnation_id"].as_str().unwrap())
        .join("gen-1.json");
    let rec: Value = serde_json::from_slice(&std::fs::read(rec_path).unwrap()).unwrap();
    let socket = std::path::PathBuf::from(rec["socket"].as_str().unwrap());
    let forger = std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        let harness = serde_json::json!({
            "harness_pid": id["harness_pid"], "harness_start_time": id["harness_start_time"], "exit": null
        });
        let attempts = [
            // Claims the real shim's pid and start time: the kernel's peer credentials differ.
            serde_json::json!({"type": "hello", "pid": root, "start_time": id["root_start_time"],
                "nonce": "00112233445566778899aabbccddeeff", "harness": harness}),
            // Claims its own pid: not a member of the generation's cgroup.
            serde_json::json!({"type": "hello", "pid": std::process::id(), "start_time": start_time(std::process::id() as i32),
                "nonce": "00112233445566778899aabbccddeeff", "harness": harness}),
        ];
        let mut replies = Vec::new();
        for a in attempts {
            let mut s = wait_until("reattach socket", || {
                std::os::unix::net::UnixStream::connect(&socket).ok()
            });
            s.write_all(format!("{a}\n").as_bytes()).unwrap();
            let mut line = String::new();
            std::io::BufReader::new(s).read_line(&mut line).unwrap();
            replies.push(line);
        }
        replies
    });
    h.start_supervisor();
    let replies = forger.join().unwrap();
    assert!(
        replies[0].contains("reject") && replies[0].contains("peer-mismatch"),
        "{replies:?}"
    );
    assert!(
        replies[1].contains("reject") && replies[1].contains("not-in-cgroup"),
        "{replies:?}"
    );
    let audit = h.audit();
    assert!(
        audit.contains("peer-mismatch") && audit.contains("not-in-cgroup"),
        "{audit}"
    );
    assert!(
        !audit.contains("00112233445566778899aabbccddeeff"),
        "nonce material in the audit log"
    );
    // Unverifiable: never adopted; killed, receipted as unknown, lane quarantined.
    let r = h.wait_receipt("w1", 1);
    assert_eq!(r["termination_reason"], "unknown");
    assert_eq!(r["cleanup"]["verified_empty"], true);
    assert!(
        before.iter().all(|(p, st)| is_dead(*p, *st)),
        "the unverified tree survived"
    );
    let ls = h.lane_status("w1");
    assert_eq!(ls["status"], "quarantined", "{ls}");
    let (k, _) = h.refused(&Request::Start {
        lane: "w1".into(),
        runtime: "fake@1.0.0".into(),
        directives: vec![],
    });
    assert_eq!(k, "quarantined");
}

#[test]
fn receipts_survive_a_supervisor_crash_until_acknowledged() {
    let mut h = Host::new();
    h.create_lane("w1");
    h.start("w1", "exit=7");
    let r = h.wait_receipt("w1", 1);
    let key = r["idempotency_key"].as_str().unwrap().to_string();
    // Crash after the write, before any consumer took it.
    h.crash_supervisor();
    h.start_supervisor();
    let pending = h.receipts(None, false);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["idempotency_key"], key.as_str());
    assert_eq!(
        pending[0]["receipt_id"], r["receipt_id"],
        "the same receipt, not a rewrite"
    );
    h.call(&Request::Ack { key: key.clone() });
    h.call(&Request::Ack { key: key.clone() }); // idempotent
    h.crash_supervisor();
    h.start_supervisor();
    assert!(h.receipts(None, false).is_empty());
    assert_eq!(
        h.receipts(None, true).len(),
        1,
        "acknowledged receipts are kept, not lost"
    );
    let (k, _) = h.refused(&Request::Ack {
        key: "tr-0000000000000000000000000000000000000000".into(),
    });
    assert_eq!(k, "storage");
}

/// The supervisor's attached tmux control clients (its children running `tmux -C`).
fn control_clients(h: &Host) -> Vec<i32> {
    let sup = h.supervisor_pid().unwrap() as i32;
    procfs::process::all_processes()
        .unwrap()
        .filter_map(|p| p.ok())
        .filter(|p| p.stat().is_ok_and(|s| s.ppid == sup))
        .filter(|p| {
            p.cmdline().is_ok_and(|c| {
                c.iter().any(|a| a == "-C") && c.iter().any(|a| a == "attach-session")
            })
        })
        .map(|p| p.pid)
        .collect()
}

#[test]
fn a_lost_tmux_control_client_is_replaced_and_starts_go_on() {
    let h = Host::new();
    h.create_lane("cc");
    assert_eq!(h.start("cc", "hang")["generation"], 1);
    let first = control_clients(&h);
    assert_eq!(first.len(), 1, "one control client per lane: {first:?}");
    // An operator detaching every client of the session detaches the supervisor's too.
    std::process::Command::new("tmux")
        .arg("-S")
        .arg(h.lane_tmux_socket("cc"))
        .args(["detach-client", "-s", "=cc"])
        .status()
        .unwrap();
    wait_until("the detached client exits", || {
        control_clients(&h).is_empty().then_some(())
    });
    assert_eq!(h.start("cc", "hang")["generation"], 2);
    let second = control_clients(&h);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);
    // A client killed outright is replaced the same way.
    kill(second[0], nix::sys::signal::Signal::SIGKILL);
    wait_until("the killed client is gone", || {
        control_clients(&h).is_empty().then_some(())
    });
    assert_eq!(h.start("cc", "hang")["generation"], 3);
    assert_eq!(h.lane_status("cc")["status"], "active");
    // Destroying the lane detaches its client.
    h.call(&Request::LaneDestroy { lane: "cc".into() });
    assert!(control_clients(&h).is_empty());
}

#[test]
fn concurrent_creates_of_one_lane_yield_one_lane() {
    let h = Host::new();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| s.spawn(|| h.try_call(&Request::LaneCreate { lane: "w1".into() })))
            .collect();
        hs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let ok: Vec<_> = results.iter().filter(|r| r.is_ok()).collect();
    assert_eq!(ok.len(), 1, "{results:?}");
    assert!(results
        .iter()
        .filter(|r| r.is_err())
        .all(|r| format!("{r:?}").contains("lane-exists")));
    assert_eq!(h.status()["lanes"].as_array().unwrap().len(), 1);
    assert_eq!(h.start("w1", "hang")["generation"], 1);
}
