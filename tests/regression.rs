//! Regression tests, each named for the bug it pins. Real supervisor processes, tmux and
//! cgroups (see `common::Host`); the failures are injected with failpoints
//! (`FAILPOINTS=<name>=1*return`: fail once), so these need a `failpoints` build, which
//! `scripts/test` makes.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use mosaic::supervisor::control::Request;
use serde_json::Value;

fn require_failpoints() {
    assert!(
        mosaic::coordinator::failpoint::enabled(),
        "these tests inject failures and need a failpoints build: cargo test --features failpoints (scripts/test does)"
    );
}

/// Every cgroup directory under `root`, deepest included.
fn cgroups_under(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                    todo.push(e.path());
                }
            }
        }
    }
    out
}

/// The bug: `launch` had `?` exits after the generation's cgroup existed that skipped the
/// abort path — the cgroup id read and the final record save among them, which left a
/// verified, running process tree with no watcher and no receipt. Each step of the launch
/// is failed once here; each must end with exactly one launch-failed receipt, nothing left
/// in the lane's cgroups, nothing of the generation left running, and a lane that takes
/// the next start.
fn launch_failure_leaves_a_receipt_and_an_empty_lane(step: mosaic::supervisor::LaunchStep) {
    require_failpoints();
    let name = step.failpoint();
    let h = Host::with(Options {
        env: vec![("FAILPOINTS", format!("{name}=1*return"))],
        ..Options::default()
    });
    h.create_lane("w1");
    let (kind, message) = h.refused(&Request::Start {
        lane: "w1".into(),
        runtime: "fake@1.0.0".into(),
        directives: vec!["spawn=3".into()],
    });
    assert_eq!(kind, "injected", "{name}: {message}");

    // Exactly one receipt, for generation 1, true to what happened.
    let receipts = h.receipts(Some("w1"), true);
    let mine: Vec<&Value> = receipts.iter().filter(|r| r["generation"] == 1).collect();
    assert_eq!(mine.len(), 1, "{name}: receipts {receipts:?}");
    let r = mine[0];
    assert_eq!(r["termination_reason"], "launch-failed", "{name}: {r}");
    assert_eq!(r["cleanup"]["verified_empty"], true, "{name}: {r}");
    assert_eq!(r["cleanup"]["cgroup_removed"], true, "{name}: {r}");
    assert!(
        r["detail"].as_str().unwrap_or("").contains(&name),
        "{name}: the receipt does not say what failed: {r}"
    );
    // An identity appears in the receipt only once it was verified and the record made.
    let identity = &r["process_identity"];
    if step == mosaic::supervisor::LaunchStep::IdentityRecord {
        let pid = identity["root_pid"].as_i64().unwrap() as i32;
        let st = identity["root_start_time"].as_u64().unwrap();
        assert!(is_dead(pid, st), "{name}: the verified shim {pid} survived");
        let hp = identity["harness_pid"].as_i64().unwrap() as i32;
        let hst = identity["harness_start_time"].as_u64().unwrap();
        assert!(is_dead(hp, hst), "{name}: the harness {hp} survived");
    } else {
        assert_eq!(identity, &Value::Null, "{name}: {r}");
    }
    let lane_cg = h.cgroup_root.join("lanes/w1");
    let left = cgroups_under(&lane_cg);
    assert!(
        left.iter().all(|p| !p.to_string_lossy().contains("gen-1")),
        "{name}: generation 1's cgroup is still there: {left:?}"
    );
    let st = h.lane_status("w1");
    assert_eq!(st["status"], "active", "{name}: {st}");
    assert_eq!(st["current_generation"], Value::Null, "{name}: {st}");

    // The lane takes the next start (the failpoint fired once).
    let g = h.start("w1", "hang");
    assert_eq!(g["generation"], 2, "{name}: {g}");
    let cg = cgroup_abs(&h, g["process_identity"]["cgroup_path"].as_str().unwrap());
    assert!(
        !members(&cg).is_empty(),
        "{name}: generation 2 is not running"
    );
    h.call(&Request::Stop { lane: "w1".into() });
    let r2 = h.wait_receipt("w1", 2);
    assert_eq!(r2["cleanup"]["verified_empty"], true, "{name}: {r2}");
    assert!(
        !cg.exists(),
        "{name}: generation 2's cgroup outlived its stop"
    );
}

macro_rules! launch_failure_tests {
    ($($test:ident => $step:ident),* $(,)?) => {$(
        #[test]
        fn $test() {
            launch_failure_leaves_a_receipt_and_an_empty_lane(mosaic::supervisor::LaunchStep::$step);
        }
    )*};
}

launch_failure_tests! {
    launch_failing_at_its_record_write_leaves_a_receipt => Record,
    launch_failing_at_cgroup_creation_leaves_a_receipt => Cgroup,
    launch_failing_at_the_cgroup_id_read_kills_and_receipts => CgroupId,
    launch_failing_at_socket_bind_removes_its_cgroup => Socket,
    launch_failing_at_the_nonce_write_removes_its_cgroup => Nonce,
    launch_failing_in_the_private_area_removes_its_cgroup => Area,
    launch_failing_at_respawn_removes_its_cgroup => Respawn,
    launch_failing_at_attach_kills_the_respawned_shim => Attach,
    launch_failing_before_the_harness_start_kills_the_shim => HarnessStart,
    launch_failing_at_the_identity_write_kills_the_verified_tree => IdentityRecord,
}

/// Every step the local start path runs has a test above (the lane-socket and area-record
/// steps run only for coordinated or real-harness starts).
#[test]
fn every_local_launch_step_has_a_regression_test() {
    use mosaic::supervisor::LaunchStep as S;
    let local: Vec<S> = S::ALL
        .into_iter()
        .filter(|s| !matches!(s, S::LaneSocket | S::AreaRecord))
        .collect();
    let text = include_str!("regression.rs");
    for s in local {
        assert!(
            text.contains(&format!("=> {s:?},")),
            "launch step {s:?} has no regression test"
        );
    }
}

/// The clean-clone run of `refused_stages_expired_reservations_and_host_quarantines_end_visibly`
/// (tests/chain.rs) found this: a lane whose tmux server was killed a moment before a stage
/// was not quarantined, because `has-session` against a server caught while it exits says
/// "server exited unexpectedly", which was read as "no answer" and never asked again — so
/// the stage was refused and the dead lane stayed IDLE_CLEAN. Asked while its server dies,
/// the session must come out as tmux sees it (there, or gone), never as no answer.
#[test]
fn a_tmux_server_caught_while_it_exits_is_seen_gone() {
    use mosaic::supervisor::tmux::{SessionState, Tmux};
    let tmux = mosaic::sysdeps::which("tmux").expect("tmux on PATH");
    // Removed on drop, also when an assertion fails (every server is dead by then).
    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Dir(std::env::temp_dir().join(format!("mosaic-tmux-race-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    for i in 0..30 {
        let sock = dir.0.join(format!("t{i}.sock"));
        let ok = std::process::Command::new(&tmux)
            .args(["-f", "/dev/null", "-S"])
            .arg(&sock)
            .args(["new-session", "-d", "-s", "lane", "sleep 100"])
            .status()
            .unwrap();
        assert!(ok.success());
        let mut kill = std::process::Command::new(&tmux)
            .arg("-S")
            .arg(&sock)
            .arg("kill-server")
            .spawn()
            .unwrap();
        // Asked while it dies: still there, or gone — never "no answer".
        let t = Tmux::new(&tmux, sock.clone());
        let state = t.session_state("lane");
        let _ = kill.wait();
        assert!(
            matches!(state, SessionState::Present | SessionState::Absent),
            "run {i}: {state:?}"
        );
        // And once it is dead, gone.
        assert_eq!(t.session_state("lane"), SessionState::Absent, "run {i}");
    }
}

/// `mosaic pki init` into a fresh directory, its answer written to `stdout`: (exit
/// status, stderr, whether it made its CA).
fn pki_init_into(tag: &str, stdout: impl Into<std::process::Stdio>) -> (bool, String, bool) {
    let dir = std::env::temp_dir().join(format!("mosaic-{tag}-{}", std::process::id()));
    let out = std::process::Command::new(MOSAIC)
        .args(["pki", "init", "--dir"])
        .arg(&dir)
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let made = dir.join("ca.pem").exists();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.success(), stderr, made)
}

/// `mosaic … | head -1`: a reader that closed its end before the answer was printed made
/// the CLI panic (`println!` on EPIPE, exit 101) after its request had been decided. The
/// answer is dropped quietly and the command's own exit code stands.
#[test]
fn a_closed_stdout_pipe_does_not_make_the_cli_panic() {
    // A pipe whose read end is closed before the command writes: every write is EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let (ok, stderr, made) = pki_init_into("epipe", writer);
    assert!(ok, "stderr: {stderr}");
    // It did its work: the CA is there.
    assert!(made, "no ca.pem");
}

/// The other side of the closed pipe: an answer that cannot be written for any other
/// reason (here a full disk, `/dev/full`) fails the command, so a truncated answer never
/// exits 0.
#[test]
fn an_answer_that_cannot_be_written_fails_the_command() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let (ok, stderr, _) = pki_init_into("enospc", full);
    assert!(!ok, "stderr: {stderr}");
    assert!(stderr.contains("writing the answer to stdout"), "{stderr}");
}
