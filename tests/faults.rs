//! The fault matrix: a dependency of the supervisor fails at a step of a generation's life,
//! and afterwards the same invariants are checked for every row.
//!
//! Each row is one line (`row!(name, fault, step)`) and its own test, so rows run in
//! parallel and a new fault or step is one more line. The invariants, after the fault is
//! healed and the lane's way out (if it was quarantined) taken:
//!
//! - every generation begun here has exactly one receipt, and its facts are the observed
//!   ones (the reason the step produced, the identity it started with, a verified cleanup);
//! - every generation record agrees with the receipts (terminated exactly when receipted);
//! - no temporary file of a failed write is left in the state directory, and the audit log
//!   is whole JSON lines;
//! - the lane is usable again: it takes a fresh generation, directly or after the
//!   documented way out of its quarantine (destroy, then create).
//!
//! Real parts only: the state directory is its own tmpfs, filled or remounted read-only;
//! the lane's tmux server is really killed or stopped (wedged: it accepts connections and
//! answers nothing); the harness is really SIGKILLed or SIGSTOPped;
//! the supervisor is really SIGKILLed and started again.

mod common;
mod pg;
mod world;

use std::path::{Path, PathBuf};

use common::*;
use mosaic::supervisor::control::Request;
use nix::sys::signal::Signal;
use serde_json::Value;

/// What fails.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// The state filesystem has no space left.
    StateFull,
    /// The state filesystem is remounted read-only.
    StateReadOnly,
    /// The lane's tmux server is killed from outside.
    TmuxKilled,
    /// The lane's tmux server is wedged: stopped (SIGSTOP), it accepts connections and
    /// answers nothing (continued when the fault heals).
    TmuxWedged,
    /// The harness hangs: it ignores SIGTERM and is stopped (SIGSTOP), so it answers no
    /// signal but SIGKILL.
    HarnessHung,
    /// The supervisor is SIGKILLed (and started again when the fault heals).
    SupervisorKilled,
}

/// When it fails.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    /// The lane is idle (no generation).
    Idle,
    /// An operator starts a generation.
    Start,
    /// A generation runs (its harness keeps running, or is SIGKILLed: see `Kill`).
    Running,
    /// The harness is SIGKILLed while the fault holds.
    HarnessKilled,
    /// The harness is SIGKILLed while the fault holds, then the supervisor crashes before
    /// the fault heals (the held receipt is lost with it; the restart observes the end).
    HarnessKilledThenCrash,
    /// An operator stops the generation.
    Stop,
    /// The supervisor refuses a request (a malformed control request) and audits it.
    Audit,
}

macro_rules! row {
    ($name:ident, $fault:expr, $step:expr) => {
        #[test]
        fn $name() {
            run($fault, $step)
        }
    };
}

row!(state_full_at_start, Fault::StateFull, Step::Start);
row!(
    state_full_at_harness_kill,
    Fault::StateFull,
    Step::HarnessKilled
);
row!(
    state_full_at_harness_kill_then_supervisor_crash,
    Fault::StateFull,
    Step::HarnessKilledThenCrash
);
row!(state_full_at_stop, Fault::StateFull, Step::Stop);
row!(state_full_at_audit, Fault::StateFull, Step::Audit);
row!(state_read_only_at_audit, Fault::StateReadOnly, Step::Audit);
row!(state_read_only_at_start, Fault::StateReadOnly, Step::Start);
row!(
    state_read_only_at_harness_kill,
    Fault::StateReadOnly,
    Step::HarnessKilled
);
row!(state_read_only_at_stop, Fault::StateReadOnly, Step::Stop);
row!(tmux_killed_while_idle, Fault::TmuxKilled, Step::Idle);
row!(tmux_killed_while_running, Fault::TmuxKilled, Step::Running);
row!(harness_hung_at_stop, Fault::HarnessHung, Step::Stop);
row!(tmux_wedged_at_stop, Fault::TmuxWedged, Step::Stop);
row!(tmux_wedged_at_start, Fault::TmuxWedged, Step::Start);
row!(tmux_wedged_while_running, Fault::TmuxWedged, Step::Running);
row!(
    supervisor_killed_while_running,
    Fault::SupervisorKilled,
    Step::Running
);
row!(
    supervisor_killed_then_harness_killed,
    Fault::SupervisorKilled,
    Step::HarnessKilled
);
row!(
    supervisor_killed_while_idle,
    Fault::SupervisorKilled,
    Step::Idle
);

const LANE: &str = "w1";

/// What the row's step should have ended the first generation with, if it started one.
fn expected_reason(fault: Fault, step: Step) -> Option<&'static [&'static str]> {
    match (fault, step) {
        (_, Step::Idle | Step::Start | Step::Audit) => None,
        (_, Step::HarnessKilled) => Some(&["sigkill"]),
        // The restart finds the shim's exit record (in the runtime directory, which did not
        // fill) or, without it, says it does not know: never a guess.
        (_, Step::HarnessKilledThenCrash) => Some(&["sigkill", "unknown"]),
        // A hung harness ignores the graceful signal: killed when the grace period ends.
        (Fault::HarnessHung, Step::Stop) => Some(&["timeout"]),
        (_, Step::Stop) => Some(&["quit"]),
        (Fault::TmuxKilled, Step::Running) => Some(&["quit", "timeout"]),
        // Re-adopted by the restarted supervisor, then stopped by the operator.
        (Fault::SupervisorKilled, Step::Running) => Some(&["quit"]),
        (_, Step::Running) => None,
    }
}

struct Injected {
    state: PathBuf,
    fill: PathBuf,
    /// The wedged tmux server, continued when the fault heals.
    wedged: std::cell::Cell<Option<i32>>,
}

impl Injected {
    fn new(h: &Host) -> Self {
        Self {
            state: h.state_dir(),
            fill: h.dir.join("state/fill"),
            wedged: std::cell::Cell::new(None),
        }
    }

    fn inject(&self, h: &mut Host, fault: Fault, started: Option<&Value>) {
        match fault {
            Fault::HarnessHung => kill(
                harness_pid(started.expect("a hung harness needs a generation")),
                Signal::SIGSTOP,
            ),
            Fault::SupervisorKilled => h.crash_supervisor(),
            Fault::StateFull => fill(&self.fill),
            Fault::StateReadOnly => remount(&self.state, true),
            Fault::TmuxWedged => {
                let pid = tmux_pid(h);
                kill(pid, Signal::SIGSTOP);
                self.wedged.set(Some(pid));
            }
            Fault::TmuxKilled => {
                let st = std::process::Command::new("tmux")
                    .arg("-S")
                    .arg(h.lane_tmux_socket(LANE))
                    .arg("kill-server")
                    .status()
                    .unwrap();
                assert!(st.success(), "tmux kill-server failed");
            }
        }
    }

    fn heal(&self, h: &mut Host, fault: Fault) {
        match fault {
            Fault::StateFull => std::fs::remove_file(&self.fill).unwrap(),
            Fault::StateReadOnly => remount(&self.state, false),
            Fault::SupervisorKilled => h.start_supervisor(),
            Fault::TmuxWedged => {
                if let Some(pid) = self.wedged.take() {
                    kill(pid, Signal::SIGCONT)
                }
            }
            // The stop killed it; nothing was broken but the harness.
            Fault::TmuxKilled | Fault::HarnessHung => {}
        }
    }
}

/// The pid of the lane's tmux server, asked of it (while it still answers).
fn tmux_pid(h: &Host) -> i32 {
    let out = std::process::Command::new("tmux")
        .arg("-S")
        .arg(h.lane_tmux_socket(LANE))
        .args(["display-message", "-p", "#{pid}"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("tmux named no pid: {text:?}"))
}

impl Drop for Injected {
    /// A row that fails while the server is stopped still lets the teardown reach it.
    fn drop(&mut self) {
        if let Some(pid) = self.wedged.take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGCONT);
        }
    }
}

/// Fills the filesystem holding `path` until a write fails with ENOSPC.
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 * 1024];
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // Whatever one page is left to a partial write goes too.
    while f.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
    let probe = path.with_file_name("probe");
    assert!(
        std::fs::write(&probe, vec![0u8; 4096]).is_err(),
        "the state filesystem still takes writes after filling"
    );
    let _ = std::fs::remove_file(&probe);
}

fn remount(mountpoint: &Path, read_only: bool) {
    use nix::mount::MsFlags;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    nix::mount::mount(None::<&str>, mountpoint, None::<&str>, flags, None::<&str>).unwrap_or_else(
        |e| {
            panic!(
                "remount {} (read-only {read_only}): {e}",
                mountpoint.display()
            )
        },
    );
}

fn harness_pid(g: &Value) -> i32 {
    g["process_identity"]["harness_pid"].as_i64().unwrap() as i32
}

fn run(fault: Fault, step: Step) {
    let storage = matches!(fault, Fault::StateFull | Fault::StateReadOnly);
    let mut h = Host::with(Options {
        state_fs: storage.then_some("4m"),
        ..Options::default()
    });
    h.create_lane(LANE);
    let inj = Injected::new(&h);
    let mut started: Vec<Value> = Vec::new();
    let mut audited_before_heal = None;
    match step {
        Step::Idle => inj.inject(&mut h, fault, None),
        Step::Audit => {
            inj.inject(&mut h, fault, None);
            use std::io::{BufRead, Write};
            let mut s = std::os::unix::net::UnixStream::connect(h.socket()).unwrap();
            s.write_all(b"not json\n").unwrap();
            let mut line = String::new();
            std::io::BufReader::new(s).read_line(&mut line).unwrap();
            assert!(line.contains("bad-request"), "{line}");
            // Refused and answered; its audit line is held, not lost and not torn.
            assert!(!h.audit().contains("bad-control-request"));
            audited_before_heal = Some(std::time::SystemTime::now());
        }
        Step::Start => {
            inj.inject(&mut h, fault, None);
            let (kind, msg) = h.refused(&Request::Start {
                lane: LANE.into(),
                runtime: "fake@1.0.0".into(),
                directives: vec!["hang".into()],
            });
            // A wedged server is not taken for a gone one: after its bounded wait the
            // start fails and says why, and the lane stays as it is.
            let expected = if fault == Fault::TmuxWedged {
                "tmux"
            } else {
                "storage"
            };
            assert_eq!(kind, expected, "{msg}");
            // Refused before anything ran: no generation cgroup, no receipt.
            assert!(h.lane_status(LANE)["current_generation"].is_null());
            assert!(h.receipts(None, true).is_empty());
        }
        Step::Running | Step::HarnessKilled | Step::HarnessKilledThenCrash | Step::Stop => {
            // A stopped process still dies of a fatal signal it does not handle: a hung
            // harness is one that also ignores the graceful one.
            let directives = if fault == Fault::HarnessHung {
                "ignore-term spawn=2"
            } else {
                "spawn=2"
            };
            started.push(h.start(LANE, directives));
            inj.inject(&mut h, fault, started.first());
            match step {
                Step::HarnessKilled | Step::HarnessKilledThenCrash => {
                    kill(harness_pid(&started[0]), Signal::SIGKILL)
                }
                // Stopped, but its receipt cannot be written: nobody is told of one.
                Step::Stop if storage => {
                    let (kind, msg) = h.refused(&Request::Stop { lane: LANE.into() });
                    assert_eq!(kind, "receipt-not-durable", "{msg}");
                }
                Step::Stop => {
                    let r = h.call(&Request::Stop { lane: LANE.into() });
                    assert_eq!(r["cleanup"]["verified_empty"], true, "{r}");
                }
                _ => {}
            }
        }
    }
    if storage && started.len() == 1 {
        held_while_the_fault_lasts(&h);
    }
    if fault == Fault::TmuxKilled {
        // Noticed without anyone starting anything: the running generation is stopped and
        // receipted, and the lane quarantined.
        let st = wait_until("the lost tmux server is noticed", || {
            let l = h.lane_status(LANE);
            (l["status"] == "quarantined").then_some(l)
        });
        assert!(
            st["quarantine_reason"]
                .as_str()
                .unwrap()
                .contains("tmux server"),
            "{st}"
        );
    }
    if step == Step::HarnessKilledThenCrash {
        h.crash_supervisor();
        inj.heal(&mut h, fault);
        h.start_supervisor();
    } else {
        inj.heal(&mut h, fault);
    }
    if let Some(before) = audited_before_heal {
        // Written once the filesystem takes it: one whole line, with the time it was
        // recorded (before the fault healed), not the time it was written.
        let line = wait_until("the held audit line written", || {
            h.audit()
                .lines()
                .find(|l| l.contains("bad-control-request"))
                .map(String::from)
        });
        let v: Value = serde_json::from_str(&line).unwrap();
        let at = humantime::parse_rfc3339(v["at"].as_str().unwrap()).unwrap();
        assert!(
            at <= before,
            "the held line carries the time it was written, not recorded: {line}"
        );
        assert_eq!(h.audit().matches("bad-control-request").count(), 1);
    }
    if fault == Fault::SupervisorKilled && step == Step::Running {
        // Re-adopted, identity proven again: it still answers a stop.
        let g = h.lane_status(LANE);
        assert_eq!(
            g["generation"]["process_identity"], started[0]["process_identity"],
            "the restarted supervisor does not hold the generation that ran: {g}"
        );
        h.call(&Request::Stop { lane: LANE.into() });
    }
    check_invariants(&h, fault, step, &started);
}

/// While the state filesystem refuses writes: the generation's end is held, not guessed.
fn held_while_the_fault_lasts(h: &Host) {
    let st = wait_until("the end is held and the lane quarantined", || {
        let st = h.status();
        let held = st["receipts_not_durable"]
            .as_array()
            .is_some_and(|v| v.len() == 1);
        (held && st["lanes"][0]["status"] == "quarantined").then_some(st)
    });
    assert_eq!(st["receipts_not_durable"][0]["generation"], 1, "{st}");
    assert_eq!(
        st["receipts_not_durable"][0]["receipt_durable"], false,
        "{st}"
    );
    let lane = h.lane_status(LANE);
    assert_eq!(lane["status"], "quarantined", "{lane}");
    // Nobody is told of a receipt that is not durable, and the quarantine holds.
    assert!(h.receipts(None, true).is_empty());
    let (kind, msg) = h.refused(&Request::LaneDestroy { lane: LANE.into() });
    assert_eq!(kind, "receipt-not-durable", "{msg}");
    let (kind, msg) = h.refused(&Request::Start {
        lane: LANE.into(),
        runtime: "fake@1.0.0".into(),
        directives: vec!["hang".into()],
    });
    assert_eq!(kind, "quarantined", "{msg}");
    assert_no_temp_files(&h.state_dir());
}

fn check_invariants(h: &Host, fault: Fault, step: Step, started: &[Value]) {
    // One receipt per generation begun, with the observed facts.
    if let Some(reasons) = expected_reason(fault, step) {
        let r = h.wait_receipt(LANE, 1);
        let reason = r["termination_reason"].as_str().unwrap();
        assert!(
            reasons.contains(&reason),
            "reason {reason}, expected one of {reasons:?}: {r}"
        );
        assert_eq!(
            r["process_identity"], started[0]["process_identity"],
            "the receipt names another process than the one that started"
        );
        assert_eq!(r["cleanup"]["verified_empty"], true, "{r}");
        assert_ne!(r["termination_reason"], "never-started");
        if step == Step::Stop || (fault, step) == (Fault::SupervisorKilled, Step::Running) {
            assert_eq!(r["stop"]["cause"], "operator", "{r}");
        }
        if fault == Fault::HarnessHung {
            assert_eq!(r["stop"]["forced"], true, "{r}");
        }
        if fault == Fault::TmuxKilled {
            assert_eq!(r["stop"]["cause"], "lane-server-lost", "{r}");
        }
    }
    let receipts = h.receipts(None, true);
    let mut keys: Vec<&str> = receipts
        .iter()
        .map(|r| r["idempotency_key"].as_str().unwrap())
        .collect();
    keys.sort();
    let n = keys.len();
    keys.dedup();
    assert_eq!(
        n,
        keys.len(),
        "two receipts for one generation: {receipts:?}"
    );
    assert_eq!(
        n,
        usize::from(expected_reason(fault, step).is_some()),
        "receipts: {receipts:?}"
    );
    assert!(
        h.status()["receipts_not_durable"].is_null(),
        "{}",
        h.status()
    );
    // Records agree with receipts.
    for rec in gen_records(&h.state_dir()) {
        let receipted = receipts.iter().any(|r| {
            r["lane_incarnation_id"] == rec["lane_incarnation_id"]
                && r["generation"] == rec["generation"]
        });
        let terminated = rec["status"] == "terminated";
        assert_eq!(
            terminated, receipted,
            "record {rec} against receipts {receipts:?}"
        );
    }
    assert_no_temp_files(&h.state_dir());
    for line in h.audit().lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("audit line {line:?}: {e}"));
    }
    // The lane is usable again, directly or through its way out.
    if h.lane_status(LANE)["status"] == "quarantined" {
        h.call(&Request::LaneDestroy { lane: LANE.into() });
        h.create_lane(LANE);
    }
    let g = h.start(LANE, "hang");
    assert!(g["process_identity"]["harness_pid"].is_i64(), "{g}");
}

fn gen_records(state: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(state.join("generations")) else {
        return out;
    };
    for inc in rd.flatten() {
        for f in std::fs::read_dir(inc.path()).unwrap().flatten() {
            let p = f.path();
            if p.extension().is_some_and(|x| x == "json") {
                out.push(serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap());
            }
        }
    }
    out
}

fn assert_no_temp_files(dir: &Path) {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                let p = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&p, out);
                } else if p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().contains(".tmp-"))
                {
                    out.push(p);
                }
            }
        }
    }
    let mut left = Vec::new();
    walk(dir, &mut left);
    assert!(
        left.is_empty(),
        "temporary files of failed writes left behind: {left:?}"
    );
}

/// The coordinated half of the matrix: the coordinator's database fails right after a step
/// of the chain or of a stop committed — the request that made the step is held there (the
/// `hold-after-commit:<op>` failpoint) until the fault is in place — on the crash tests'
/// world (one host, two coordinators, one-second leases). Each row is `crow!(name, fault,
/// step)`. After every row, besides the invariants of the crash tests and a lane usable
/// again: the operator's request has a definite answer, or an `unknown` one whose key,
/// repeated, gives one — the same assignment, never a second.
///
/// Sampled, to keep the suite within its limit: a database cut at every step; a reset, a
/// hang, the coordinator SIGSTOPped past its lease and the supervisor SIGKILLed at the steps
/// where an operator's request, a host's message and the stop's receipt each commit.
mod coordinated {
    use super::world::split::*;
    use super::{common, pg};
    use mosaic::coordinator::Category;

    /// What fails, right after the step committed.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Fault {
        /// The database: closed to connections and every connection cut, for longer than
        /// a lease.
        Cut,
        /// The database: every connection cut once; new ones are let in at once.
        Reset,
        /// The database: every backend serving the coordinator SIGSTOPped for longer than a
        /// lease (its statements hang mid-way), then continued.
        Hung,
        /// The coordinator itself SIGSTOPped past its lease, then continued.
        CoordinatorStopped,
        /// The supervisor SIGKILLed, and started again after the outage.
        SupervisorKilled,
        /// The host session's connection torn down at both ends (`ss -K`, as a network
        /// fault would: no close frame); the host reconnects by itself.
        SessionCut,
        /// The supervisor SIGSTOPped past the lease (its harnesses run on, it answers
        /// nothing), then continued.
        SupervisorStopped,
        /// The supervisor SIGSTOPped until the coordinator has dropped its silent session
        /// (past the session liveness limit, three heartbeats), then past a lease more,
        /// then continued: it finds its session gone and connects again.
        SupervisorStoppedPastLiveness,
    }

    macro_rules! crow {
        ($name:ident, $fault:expr, $step:expr) => {
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                run($fault, $step).await
            }
        };
    }

    crow!(db_cut_after_reserve, Fault::Cut, "reserve");
    crow!(db_cut_after_checkpoint, Fault::Cut, "checkpoint");
    crow!(db_cut_after_fence, Fault::Cut, "fence");
    crow!(db_cut_after_stage, Fault::Cut, "stage");
    crow!(db_cut_after_staged, Fault::Cut, "staged");
    crow!(db_cut_after_injected, Fault::Cut, "injected");
    crow!(db_cut_after_consume_ack, Fault::Cut, "consume-ack");
    crow!(db_cut_after_activate, Fault::Cut, "activate");
    crow!(db_cut_after_request_end, Fault::Cut, "request-end");
    crow!(
        db_cut_after_ingest_termination,
        Fault::Cut,
        "ingest-termination"
    );
    crow!(db_cut_after_finish, Fault::Cut, "finish");
    crow!(db_reset_after_reserve, Fault::Reset, "reserve");
    crow!(db_reset_after_staged, Fault::Reset, "staged");
    crow!(db_reset_after_activate, Fault::Reset, "activate");
    crow!(db_reset_after_request_end, Fault::Reset, "request-end");
    crow!(db_hung_after_reserve, Fault::Hung, "reserve");
    crow!(db_hung_after_consume_ack, Fault::Hung, "consume-ack");
    crow!(db_hung_after_request_end, Fault::Hung, "request-end");
    crow!(
        db_hung_after_ingest_termination,
        Fault::Hung,
        "ingest-termination"
    );
    crow!(
        coordinator_stopped_after_reserve,
        Fault::CoordinatorStopped,
        "reserve"
    );
    crow!(
        coordinator_stopped_after_staged,
        Fault::CoordinatorStopped,
        "staged"
    );
    crow!(
        coordinator_stopped_after_activate,
        Fault::CoordinatorStopped,
        "activate"
    );
    crow!(
        coordinator_stopped_after_request_end,
        Fault::CoordinatorStopped,
        "request-end"
    );
    crow!(
        supervisor_killed_after_stage,
        Fault::SupervisorKilled,
        "stage"
    );
    crow!(
        supervisor_killed_after_injected,
        Fault::SupervisorKilled,
        "injected"
    );
    crow!(session_cut_after_stage, Fault::SessionCut, "stage");
    crow!(session_cut_after_staged, Fault::SessionCut, "staged");
    crow!(session_cut_after_injected, Fault::SessionCut, "injected");
    crow!(
        session_cut_after_consume_ack,
        Fault::SessionCut,
        "consume-ack"
    );
    crow!(session_cut_after_activate, Fault::SessionCut, "activate");
    crow!(
        session_cut_after_request_end,
        Fault::SessionCut,
        "request-end"
    );
    crow!(
        session_cut_after_ingest_termination,
        Fault::SessionCut,
        "ingest-termination"
    );
    crow!(
        supervisor_stopped_after_staged,
        Fault::SupervisorStopped,
        "staged"
    );
    crow!(
        supervisor_stopped_after_activate,
        Fault::SupervisorStopped,
        "activate"
    );
    crow!(
        supervisor_stopped_after_request_end,
        Fault::SupervisorStopped,
        "request-end"
    );
    crow!(
        supervisor_stopped_past_liveness_after_staged,
        Fault::SupervisorStoppedPastLiveness,
        "staged"
    );
    crow!(
        supervisor_stopped_past_liveness_after_activate,
        Fault::SupervisorStoppedPastLiveness,
        "activate"
    );
    crow!(
        supervisor_stopped_past_liveness_after_request_end,
        Fault::SupervisorStoppedPastLiveness,
        "request-end"
    );
    crow!(
        supervisor_killed_after_activate,
        Fault::SupervisorKilled,
        "activate"
    );
    crow!(
        supervisor_killed_after_request_end,
        Fault::SupervisorKilled,
        "request-end"
    );

    /// The harness exits while its contract is injected (the moment it is delivered,
    /// before its ACK): the chain ends with its generation — one receipt, true to what
    /// happened (its exit, code 3) — the work goes to recovery, and the lane takes new work.
    #[tokio::test(flavor = "multi_thread")]
    async fn harness_exit_during_injection() {
        let w = Split::new(1);
        w.wait_host_connected();
        let e = w.assign(1, "quit-at-contract").unwrap_err();
        assert_eq!(e.category, Category::ChainEnded, "{e}");
        let lane = w.lane(1);
        let (c, conn) = tokio_postgres::connect(&w.db.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let rows = c
            .query(
                "SELECT t.body->>'exit_code', t.body->>'termination_reason', t.verified_empty FROM termination_receipts t \
                 JOIN lane_incarnations li USING (lane_incarnation_id) WHERE li.lane_id = $1",
                &[&lane],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "one receipt for the one generation");
        let (code, reason, verified): (Option<String>, Option<String>, Option<bool>) =
            (rows[0].get(0), rows[0].get(1), rows[0].get(2));
        assert_eq!(code.as_deref(), Some("3"), "its exit, as observed");
        assert_eq!(reason.as_deref(), Some("crash"), "a non-zero exit");
        assert_eq!(verified, Some(true));
        let life: String = c
            .query_one(
                "SELECT a.lifecycle FROM assignments a ORDER BY a.created_at DESC LIMIT 1",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(life, "RECOVERY");
        w.invariants().await;
        w.usable(1).await;
    }

    /// A network that duplicates every frame of the host session, both ways, for a whole
    /// assignment (the `dup-frames` failpoint sends each frame twice, byte for byte): each
    /// duplicate is refused as a replay and audited, nothing is decided twice, and the work
    /// runs and stops as it would without it.
    #[tokio::test(flavor = "multi_thread")]
    async fn every_session_frame_duplicated() {
        let w = frames_faulted("dup-frames", "dup-frames=return");
        common::wait_until("the duplicates refused as replays, audited", || {
            (w.audited("replayed") > 0).then_some(())
        });
        w.invariants().await;
        w.usable(1).await;
    }

    /// A slow network: every frame of the host session, both ways, sent 200 ms late for a
    /// whole assignment (`delay-frames`): the chain and the stop still decide once each,
    /// every invariant holds, and the lane takes new work.
    #[tokio::test(flavor = "multi_thread")]
    async fn every_session_frame_delayed() {
        let w = frames_faulted("delay-frames", "delay-frames=return(200)");
        w.invariants().await;
        w.usable(1).await;
    }

    /// Both daemons restarted with the frame failpoint `spec` (named `name`), then one
    /// assignment run to RUNNING and stopped; each daemon's log must say the fault fired.
    fn frames_faulted(name: &str, spec: &str) -> Split {
        let mut w = Split::new(1);
        w.crash_supervisor();
        w.crash_coordinator(0);
        w.start_coordinator(0, Some(spec));
        w.wait_leading(0);
        w.sup[0].set_env("FAILPOINTS", Some(spec.into()));
        w.start_supervisor();
        w.wait_host_connected();
        let a = w
            .assign(1, "hang")
            .unwrap_or_else(|e| panic!("assign: {e}"));
        assert_eq!(a["state"], "RUNNING", "{a}");
        let out = w.stop_final(a["assignment_id"].as_str().unwrap());
        assert_eq!(out["state"], "CANCELLED", "{out}");
        for log in [w.coordinator_log(0), w.supervisor_log(0)] {
            let text = std::fs::read_to_string(&log).unwrap();
            assert!(
                text.contains(&format!("failpoint=\"{name}\"")),
                "{name} never fired: {}",
                log.display()
            );
        }
        w
    }

    /// §17 Fake progress heartbeat: a harness that looks busy — a narrative status line on
    /// its terminal every 0.2 s, progress claimed with an empty evidence file and with a
    /// narrative as evidence of a kind no policy knows — earns nothing: every claim is
    /// refused, no progress is recorded, and the watchdog replaces it at its deadline (its
    /// one attempt used: the work blocked for review).
    #[tokio::test(flavor = "multi_thread")]
    async fn fake_progress_never_counts() {
        let w = Split::new(1);
        w.wait_host_connected();
        let policy: mosaic::coordinator::continuity::InactivityPolicy =
            serde_json::from_value(serde_json::json!({
                "policy_id": "fake-progress@1", "warn_after_ms": 500, "escalate_after_ms": 1000,
                "replace_after_ms": 3000, "replacements_before_reassign": 0, "max_attempts": 1,
                "exhaustion": "blocked", "evidence_kinds": ["test-result", "commit"]
            }))
            .unwrap();
        w.op(&OperatorRequest::PolicyPublish {
            policy,
            request_id: None,
        })
        .unwrap_or_else(|e| panic!("policy publish: {e}"));
        let mut req = assign_req(&w.lane(1), "progress-every=0.2 fake-progress", None);
        if let OperatorRequest::Assign {
            inactivity_policy, ..
        } = &mut req
        {
            *inactivity_policy = Some("fake-progress@1".into());
        }
        let a = w.op(&req).unwrap_or_else(|e| panic!("assign: {e}"));
        let id = a["assignment_id"].as_str().unwrap().to_string();
        let inc = w.incarnation_of(0, "lane-1");
        let claims = w
            .area(0, &inc, a["generation"].as_u64().unwrap())
            .join("home/fake-progress");
        // Its generation is replaced (and its area removed) 3 s after activation.
        let claims = common::Kept::open("the harness's first claim", &claims);
        let seen = common::wait_until("the harness's claims, each answered", || {
            let text = claims.text();
            (text.matches("empty refused").count() >= 2).then_some(text)
        });
        assert!(
            !seen.contains("not-submitted"),
            "a claim was never made: {seen}"
        );
        assert!(
            !seen.contains("accepted"),
            "a claim without evidence was taken: {seen}"
        );
        assert!(seen.contains("narrative refused"), "{seen}");
        common::wait_until("the work blocked by its policy", || {
            let row = w.op(&OperatorRequest::Status).ok()?;
            let a = row["assignments"]
                .as_array()?
                .iter()
                .find(|x| x["assignment_id"] == id.as_str())?
                .clone();
            (a["work_status"] == "blocked").then_some(())
        });
        let recorded = w
            .count(&format!(
                "SELECT count(*) FROM progress_receipts WHERE assignment_id = '{id}'"
            ))
            .await;
        assert_eq!(recorded, 0, "fake progress was recorded");
        let progressed = w
            .count(&format!(
                "SELECT count(*) FROM assignments WHERE assignment_id = '{id}' AND last_progress_at IS NOT NULL"
            ))
            .await;
        assert_eq!(progressed, 0, "fake progress advanced last_progress_at");
        w.invariants().await;
        w.usable(1).await;
    }

    /// Tears down every TCP connection to or from the coordinator's host listener
    /// `addr` at both ends (`ss -K`; the kernel needs `CONFIG_INET_DIAG_DESTROY`): what a
    /// network fault does to the host session, no close frame sent.
    fn cut_sessions(addr: &str) {
        let port = addr.rsplit(':').next().unwrap();
        let filter = format!("( sport = :{port} or dport = :{port} )");
        let out = Command::new("ss")
            .args(["-K", "-t", "-n"])
            .args(filter.split(' '))
            .output()
            .expect("ss runs (iproute2)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.lines().count() > 1,
            "ss -K closed nothing (a kernel without CONFIG_INET_DIAG_DESTROY cannot run this row): {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// How long a cut or a hang lasts: past the lease, so leadership is lost meanwhile.
    const OUTAGE: Duration = Duration::from_millis(2 * LEASE_MS as u64);

    /// The pids of the backends serving database `db` now.
    async fn backends(db: &str) -> Vec<i32> {
        let (c, conn) =
            tokio_postgres::connect(&pg::server().url("postgres"), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(conn);
        c.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'",
            &[&db],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    }

    async fn run(fault: Fault, step: &'static str) {
        let mut w = Split::new(1);
        let go = w.dir.join("go");
        w.crash_coordinator(0);
        w.start_coordinator(
            0,
            Some(&format!(
                "hold-after-commit:{step}=return({})",
                go.display()
            )),
        );
        w.wait_leading(0);
        w.wait_host_connected();
        let lane = w.lane(1);
        let key = format!("row-{step}");
        let stopping = STOP.contains(&step);
        // A stop's row stops the assignment it first takes to RUNNING.
        let stopped_assignment = stopping.then(|| {
            w.assign(1, "hang").unwrap()["assignment_id"]
                .as_str()
                .unwrap()
                .to_string()
        });
        let mut req = match &stopped_assignment {
            Some(id) => OperatorRequest::Stop {
                assignment_id: id.clone(),
                outcome: None,
                evidence_digest: None,
                wait: true,
                request_id: None,
            },
            None => assign_req(&lane, "hang", None),
        };
        req.set_request_id(key.clone());
        let (sock, r) = (w.socket(0), req.clone());
        let first = std::thread::spawn(move || operator_call(&sock, &r));
        let log = w.coordinator_log(0);
        let held = format!("failpoint=hold-after-commit:{step} ");
        common::wait_until(&format!("the request held after {step}"), || {
            std::fs::read_to_string(&log)
                .ok()?
                .contains(&held)
                .then_some(())
        });
        let db = w.db.name.clone();
        let stopped = match fault {
            Fault::Cut => {
                w.close_database(true);
                vec![]
            }
            Fault::Reset => {
                w.close_database(false);
                vec![]
            }
            Fault::Hung => {
                let pids = backends(&db).await;
                assert!(!pids.is_empty(), "no backend of the coordinator to hang");
                for p in &pids {
                    common::kill(*p, nix::sys::signal::Signal::SIGSTOP);
                }
                pids
            }
            Fault::CoordinatorStopped => {
                let pid = w.coord_pid(0);
                common::kill(pid, nix::sys::signal::Signal::SIGSTOP);
                vec![pid]
            }
            Fault::SupervisorKilled => {
                w.crash_supervisor();
                vec![]
            }
            Fault::SessionCut => {
                cut_sessions(&w.listen[0]);
                vec![]
            }
            Fault::SupervisorStopped | Fault::SupervisorStoppedPastLiveness => {
                let pid = w.sup[0].pid().expect("the supervisor runs") as i32;
                common::kill(pid, nix::sys::signal::Signal::SIGSTOP);
                vec![pid]
            }
        };
        std::fs::write(&go, "").unwrap();
        if fault == Fault::SupervisorStoppedPastLiveness {
            // The fault is what it says: the coordinator gave the silent host up.
            let me = format!("host:{}", w.hosts[0]);
            common::wait_until("the silent host's session dropped", || {
                let st = operator_call(&w.socket(0), &OperatorRequest::Status).ok()?;
                (!st["hosts_connected"]
                    .as_array()?
                    .iter()
                    .any(|h| h == me.as_str()))
                .then_some(())
            });
        }
        if !matches!(fault, Fault::Reset | Fault::SessionCut) {
            // The fault's duration, not a wait for anything.
            tokio::time::sleep(OUTAGE).await;
        }
        match fault {
            Fault::Cut => w.close_database(false),
            Fault::Reset | Fault::SessionCut => {}
            Fault::Hung
            | Fault::CoordinatorStopped
            | Fault::SupervisorStopped
            | Fault::SupervisorStoppedPastLiveness => {
                for p in &stopped {
                    common::kill(*p, nix::sys::signal::Signal::SIGCONT);
                }
            }
            Fault::SupervisorKilled => w.start_supervisor(),
        }
        // The request's answer is definite, or names its key; repeated with the key, it is
        // definite once the coordinator leads again.
        let answer = match first.join().unwrap() {
            Err(e) if e.state.is_some() => {
                assert_eq!(e.request_id.as_deref(), Some(key.as_str()), "{e}");
                w.wait_host_connected();
                common::wait_until("a definite answer to the repeat", || match w.op(&req) {
                    Err(e) if e.state.is_some() || e.category == Category::NotLeader => None,
                    other => Some(other),
                })
            }
            other => other,
        };
        match (&answer, stopping) {
            (Ok(v), false) => assert_eq!(v["state"], "RUNNING", "{v}"),
            (Ok(v), true) => assert!(v["state"] == "CANCELLED" || v["pending"].is_string(), "{v}"),
            (Err(e), false) => assert_eq!(e.category, Category::ChainEnded, "{e}"),
            (Err(e), true) => panic!("the stop was refused: {e}"),
        }
        // Leading again, with the host back (a refusal while it is not is definite, and
        // says nothing about the row).
        w.wait_host_connected();
        let shown = w
            .op(&OperatorRequest::Request {
                request_id: key.clone(),
            })
            .unwrap();
        assert!(
            shown["state"] == "answered" || shown["state"] == "failed",
            "{shown}"
        );
        // One assignment for the one request (a stop's row: the one it stopped).
        assert_eq!(
            w.count("SELECT count(*) FROM assignments").await,
            1,
            "a repeat made a second assignment"
        );
        if let Some(id) = &stopped_assignment {
            let out = w.stop_final(id);
            assert_eq!(out["state"], "CANCELLED", "{out}");
        }
        w.invariants().await;
        w.usable(1).await;
    }
}
