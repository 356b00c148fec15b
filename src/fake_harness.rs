//! The fake harness: a stand-in for Claude Code, Codex, Pi and OpenCode in every test and in
//! the `mosaic up` demo. Its behaviour is a list of whitespace-separated directives.
//!
//! | directive | effect |
//! |---|---|
//! | `spawn=N` | N long-lived descendants, cycling plain child, `setsid`, double-forked, own process group |
//! | `ignore-term` | SIGTERM is ignored (by the harness and every descendant) |
//! | `print=TEXT` | prints TEXT, and appends it to its transcript (`$HOME/transcript`, its artifact) |
//! | `exit=CODE` | exits with CODE once the above are done |
//! | `exit-after=SECONDS` | exits 0 after SECONDS |
//! | `crash-after=SECONDS` | calls `abort()` after SECONDS |
//! | `hang` | runs until killed (the default) |
//! | `no-ack` | in contract mode: fetches the contract and never acknowledges it (a harness stuck before its ACK) |
//! | `fake-progress` | with `progress-every`: instead of evidence, each time prints a narrative status line and claims progress with an empty evidence file and with a narrative as evidence of an unknown kind, each outcome appended to `$HOME/fake-progress` (a harness that looks busy) |
//! | `quit-at-contract` | in contract mode: exits (code 3) the moment its contract is delivered, before its ACK (a harness that dies during injection) |
//! | `progress-every=SECONDS` | in contract mode, while hanging: reports progress with fresh evidence (a new test report) every SECONDS |
//! | `progress-same` | with `progress-every`: reports the same evidence every time (a heartbeat dressed as progress) |
//! | `accept-handoff` | in contract mode: acknowledges the handoff challenge (`mosaic lane handoff-ack`) before the activation challenge |
//! | `take-continuations` | in contract mode, instead of hanging: waits settled for each continuation (`mosaic lane next`), works on it, reports its result, and settles again |
//! | `busy=SECONDS` | with `take-continuations`: works SECONDS on each continuation (unsettled meanwhile: work still queued) |
//! | `blocked=CODE` | in contract mode: once active, reports itself blocked with CODE, an evidence file and an unblock action |
//! | `attack=KIND:ARG` | a hostile tool's attempt, made for real, its outcome appended to `$HOME/attacks` (`write:PATH`, `read:PATH`, `join:CGROUP-DIR`, `signal:PID`, `ptrace:PID`, `environ:PID`, `mem:PID`, `mount`, `unshare`, `fd:N`, `raw-socket`, `connect:SOCKET`, `zombie-connect:SOCKET`, `chmod:PATH`, `open:PATH`, `prlimit:PID`, `renice:PID`, `tcp:HOST:PORT`, `provider:KEY-VAR`, `egress:HOST:PORT`, `wait:PATH`, `flood:N`; see `attack`); in contract mode, once active |
//! | `checkpoint` | in contract mode, once active and after its attacks: asks for a checkpoint of its workspace (`mosaic lane checkpoint`; once per `checkpoint` given), each answer appended to `$HOME/checkpoints` as one JSON line |
//! | `staging-attack=KIND:ARG` | in contract mode: the same, made after the contract is fetched and before the ACK (a staging generation's attempt), its outcome in `$HOME/staging-attacks` |
//!
//! An unknown or malformed directive is an error before anything happens.

use std::time::Duration;

pub mod attack;

pub const RUNTIME: &str = "fake";
pub const VERSION: &str = "1.0.0";

#[derive(Debug, Clone, PartialEq)]
pub enum Directive {
    Spawn(u32),
    IgnoreTerm,
    Print(String),
    Exit(i32),
    ExitAfter(f64),
    CrashAfter(f64),
    Hang,
    NoAck,
    QuitAtContract,
    ProgressEvery(f64),
    ProgressSame,
    FakeProgress,
    Blocked(String),
    AcceptHandoff,
    TakeContinuations,
    Busy(f64),
    Attack(attack::Attack),
    StagingAttack(attack::Attack),
    Checkpoint,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DirectiveError {
    #[error("unknown directive {0:?} (known: spawn=N ignore-term print=TEXT exit=CODE exit-after=S crash-after=S hang no-ack quit-at-contract progress-every=S progress-same fake-progress blocked=CODE accept-handoff take-continuations busy=S attack=KIND:ARG staging-attack=KIND:ARG checkpoint)")]
    Unknown(String),
    #[error("directive {0:?} has a malformed value")]
    BadValue(String),
    #[error("directives {0:?} and {1:?} both decide how the harness ends; give one")]
    Conflict(String, String),
}

/// The most descendants one directive may ask for: enough for the 1000-descendant bench,
/// small enough that a typo cannot fork-bomb a host.
pub const MAX_SPAWN: u32 = 5000;

fn seconds(tok: &str, v: &str) -> Result<f64, DirectiveError> {
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => Ok(s),
        _ => Err(DirectiveError::BadValue(tok.to_string())),
    }
}

/// Parses every whitespace-separated directive in `words` (each word may hold several).
pub fn parse_all<S: AsRef<str>>(words: &[S]) -> Result<Vec<Directive>, DirectiveError> {
    let mut out = Vec::new();
    let mut ending: Option<String> = None;
    for tok in words.iter().flat_map(|w| w.as_ref().split_whitespace()) {
        let d = match tok.split_once('=') {
            None if tok == "ignore-term" => Directive::IgnoreTerm,
            None if tok == "hang" => Directive::Hang,
            None if tok == "no-ack" => Directive::NoAck,
            None if tok == "quit-at-contract" => Directive::QuitAtContract,
            None if tok == "progress-same" => Directive::ProgressSame,
            None if tok == "fake-progress" => Directive::FakeProgress,
            None if tok == "accept-handoff" => Directive::AcceptHandoff,
            None if tok == "take-continuations" => Directive::TakeContinuations,
            None if tok == "checkpoint" => Directive::Checkpoint,
            Some(("busy", v)) => Directive::Busy(seconds(tok, v)?),
            Some(("progress-every", v)) => match seconds(tok, v)? {
                s if s >= 0.05 => Directive::ProgressEvery(s),
                _ => return Err(DirectiveError::BadValue(tok.to_string())),
            },
            Some(("blocked", v)) if crate::protocol::work::code_ok(v) => {
                Directive::Blocked(v.to_string())
            }
            Some(("spawn", v)) => match v.parse::<u32>() {
                Ok(n) if n <= MAX_SPAWN => Directive::Spawn(n),
                _ => return Err(DirectiveError::BadValue(tok.to_string())),
            },
            Some(("print", v)) => Directive::Print(v.to_string()),
            Some(("attack", v)) => Directive::Attack(
                attack::Attack::parse(v)
                    .ok_or_else(|| DirectiveError::BadValue(tok.to_string()))?,
            ),
            Some(("staging-attack", v)) => Directive::StagingAttack(
                attack::Attack::parse(v)
                    .ok_or_else(|| DirectiveError::BadValue(tok.to_string()))?,
            ),
            Some(("exit", v)) => Directive::Exit(
                v.parse::<i32>()
                    .ok()
                    .filter(|c| (0..=255).contains(c))
                    .ok_or_else(|| DirectiveError::BadValue(tok.to_string()))?,
            ),
            Some(("exit-after", v)) => Directive::ExitAfter(seconds(tok, v)?),
            Some(("crash-after", v)) => Directive::CrashAfter(seconds(tok, v)?),
            _ => return Err(DirectiveError::Unknown(tok.to_string())),
        };
        if matches!(
            d,
            Directive::Exit(_)
                | Directive::ExitAfter(_)
                | Directive::CrashAfter(_)
                | Directive::Hang
        ) {
            if let Some(prev) = &ending {
                return Err(DirectiveError::Conflict(prev.clone(), tok.to_string()));
            }
            ending = Some(tok.to_string());
        }
        out.push(d);
    }
    Ok(out)
}

/// Appends a line to the harness's transcript (`$HOME/transcript`): what its adapter
/// exports as its artifact, like a real harness's session file.
fn keep_transcript(line: &str) {
    use std::io::Write;
    if let Some(home) = std::env::var_os("HOME") {
        let path = std::path::Path::new(&home).join("transcript");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Runs the fake harness. Returns the process exit code (for `exit=`), or never returns.
pub fn run(args: Vec<String>) -> i32 {
    if args.first().map(String::as_str) == Some("--probe-version") {
        println!("{RUNTIME} {VERSION}");
        return 0;
    }
    // Contract mode: no directives on the command line, a lane socket in the environment.
    // The directives are the task text of the injected contract, and nothing runs before
    // the generation is active.
    let args = if args.is_empty() {
        match std::env::var_os("MOSAIC_LANE_SOCKET") {
            Some(_) => match from_contract() {
                Ok(words) => words,
                Err(e) => {
                    eprintln!("mosaic-fake-harness: {e}");
                    return 4;
                }
            },
            None => args,
        }
    } else {
        args
    };
    let directives = match parse_all(&args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("mosaic-fake-harness: {e}");
            return 2;
        }
    };
    if directives.contains(&Directive::IgnoreTerm) {
        // SAFETY: installing SIG_IGN has no handler code to run.
        let _ = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGTERM,
                nix::sys::signal::SigHandler::SigIgn,
            )
        };
    }
    let attacks: Vec<&attack::Attack> = directives
        .iter()
        .filter_map(|d| match d {
            Directive::Attack(a) => Some(a),
            _ => None,
        })
        .collect();
    if !attacks.is_empty() {
        attack::run_all(&attacks);
    }
    // One request per `checkpoint`, in order (each answered before the next is asked).
    for _ in directives.iter().filter(|d| **d == Directive::Checkpoint) {
        ask_checkpoint();
    }
    for d in &directives {
        match d {
            Directive::Print(t) => {
                println!("{t}");
                keep_transcript(t);
            }
            Directive::Spawn(n) => {
                for i in 0..*n {
                    if let Err(e) = spawn_descendant(i % 4) {
                        eprintln!("mosaic-fake-harness: spawn failed: {e}");
                        return 3;
                    }
                }
                println!("fake: spawned {n} descendants");
            }
            _ => {}
        }
    }
    let ending = directives.iter().find(|d| {
        matches!(
            d,
            Directive::Exit(_) | Directive::ExitAfter(_) | Directive::CrashAfter(_)
        )
    });
    match ending {
        Some(Directive::Exit(c)) => *c,
        Some(Directive::ExitAfter(s)) => {
            sleep_reaping(Duration::from_secs_f64(*s));
            0
        }
        Some(Directive::CrashAfter(s)) => {
            sleep_reaping(Duration::from_secs_f64(*s));
            std::process::abort()
        }
        _ => {
            let every = directives.iter().find_map(|d| match d {
                Directive::ProgressEvery(s) => Some(*s),
                _ => None,
            });
            if let Some(code) = directives.iter().find_map(|d| match d {
                Directive::Blocked(c) => Some(c.clone()),
                _ => None,
            }) {
                report_blocked(&code);
            }
            if directives.contains(&Directive::TakeContinuations) {
                let busy = directives.iter().find_map(|d| match d {
                    Directive::Busy(s) => Some(*s),
                    _ => None,
                });
                take_continuations(busy.unwrap_or(0.0));
            }
            let same = directives.contains(&Directive::ProgressSame);
            let fake = directives.contains(&Directive::FakeProgress);
            let mut n = 0u64;
            loop {
                match every {
                    Some(s) => {
                        sleep_reaping(Duration::from_secs_f64(s));
                        n += 1;
                        if fake {
                            claim_progress(n);
                        } else {
                            report_progress(if same { 0 } else { n });
                        }
                    }
                    None => sleep_reaping(Duration::from_secs(3600)),
                }
            }
        }
    }
}

/// `mosaic lane checkpoint`: its answer (or why there is none) appended to
/// `$HOME/checkpoints`, one JSON line.
fn ask_checkpoint() {
    let line = match std::env::var_os("MOSAIC_BIN") {
        None => serde_json::json!({ "ok": false, "error": "no MOSAIC_BIN" }).to_string(),
        Some(bin) => match std::process::Command::new(bin)
            .args(["lane", "checkpoint"])
            .output()
        {
            Ok(out) => String::from_utf8_lossy(&out.stdout)
                .trim()
                .replace('\n', " "),
            Err(e) => serde_json::json!({ "ok": false, "error": e.to_string() }).to_string(),
        },
    };
    println!("fake: lane checkpoint {line}");
    if let Some(home) = std::env::var_os("HOME") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(std::path::Path::new(&home).join("checkpoints"))
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Runs `mosaic lane ARGS…` (contract mode only) and says what came back.
fn lane(args: &[&str]) -> bool {
    lane_outcome(args).unwrap_or(false)
}

/// `mosaic lane ARGS…`: whether the supervisor took it; `None` when it could not be asked
/// (no `MOSAIC_BIN`, the command did not run).
fn lane_outcome(args: &[&str]) -> Option<bool> {
    let bin = std::env::var_os("MOSAIC_BIN")?;
    match std::process::Command::new(bin)
        .arg("lane")
        .args(args)
        .output()
    {
        Ok(out) => {
            // An answer is the supervisor's JSON (`ok` true or false); anything else is
            // not one (the command failed before it asked).
            let answer: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
            let ok = match answer.as_ref().and_then(|v| v["ok"].as_bool()) {
                Some(ok) => ok && out.status.success(),
                None => {
                    eprintln!(
                        "mosaic-fake-harness: mosaic lane {}: no answer",
                        args.first().copied().unwrap_or("")
                    );
                    return None;
                }
            };
            println!(
                "fake: lane {} {}",
                args.first().copied().unwrap_or(""),
                if ok { "submitted" } else { "refused" }
            );
            Some(ok)
        }
        Err(e) => {
            eprintln!("mosaic-fake-harness: mosaic lane: {e}");
            None
        }
    }
}

/// Settled: waits for each continuation, works on it (`busy` seconds: unsettled, work
/// queued), reports its result, settles again. Returns when the generation ends.
fn take_continuations(busy: f64) {
    let Some(bin) = std::env::var_os("MOSAIC_BIN") else {
        return;
    };
    loop {
        // A failed wait (its supervisor restarting, say) is retried: the harness stays
        // settled and asks again.
        let out = match std::process::Command::new(&bin)
            .args(["lane", "next"])
            .output()
        {
            Ok(o) => o,
            Err(_) => return,
        };
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let (Some(id), Some(action)) = (
            v["continuation"]["continuation_id"].as_str(),
            v["continuation"]["next_action"].as_str(),
        ) else {
            sleep_reaping(Duration::from_millis(200));
            continue;
        };
        println!("fake: continuation {id}: {action}");
        sleep_reaping(Duration::from_secs_f64(busy));
        let path = std::env::temp_dir().join(format!("mosaic-fake-result-{}", std::process::id()));
        if std::fs::write(&path, format!("result of {id}: done\n")).is_ok() {
            if let Some(p) = path.to_str() {
                lane(&["continuation-result", "--id", id, "--evidence", p]);
            }
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A test report as evidence: report `n` of this process (0: always the same report).
fn report_progress(n: u64) {
    let path = std::env::temp_dir().join(format!("mosaic-fake-evidence-{}", std::process::id()));
    let body = format!(
        "test report {n} of fake harness {}: 1 passed\n",
        std::process::id()
    );
    if std::fs::write(&path, body).is_ok() {
        if let Some(p) = path.to_str() {
            lane(&["progress", "--kind", "test-result", "--evidence", p]);
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// Looks busy without evidence: a narrative status line on the terminal, then progress
/// claimed with an empty evidence file and with a narrative as evidence of a kind no
/// policy knows; each outcome appended to `$HOME/fake-progress`.
fn claim_progress(n: u64) {
    println!("fake: status {n}: making great progress, nearly done (narrative only)");
    let dir = std::env::temp_dir();
    let empty = dir.join(format!("mosaic-fake-empty-{}", std::process::id()));
    let story = dir.join(format!("mosaic-fake-story-{}", std::process::id()));
    let mut out = String::new();
    if std::fs::write(&empty, "").is_ok()
        && std::fs::write(&story, format!("status {n}: nearly done\n")).is_ok()
    {
        if let (Some(e), Some(s)) = (empty.to_str(), story.to_str()) {
            let a = lane_outcome(&["progress", "--kind", "test-result", "--evidence", e]);
            let b = lane_outcome(&["progress", "--kind", "narrative", "--evidence", s]);
            let word = |ok: Option<bool>| match ok {
                Some(true) => "accepted",
                Some(false) => "refused",
                None => "not-submitted",
            };
            out = format!("empty {}\nnarrative {}\n", word(a), word(b));
        }
    }
    let _ = std::fs::remove_file(&empty);
    let _ = std::fs::remove_file(&story);
    if let Some(home) = std::env::var_os("HOME") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(std::path::Path::new(&home).join("fake-progress"))
        {
            let _ = f.write_all(out.as_bytes());
        }
    }
}

fn report_blocked(code: &str) {
    let path = std::env::temp_dir().join(format!("mosaic-fake-blocker-{}", std::process::id()));
    if std::fs::write(&path, format!("blocked: {code}\n")).is_ok() {
        if let Some(p) = path.to_str() {
            lane(&[
                "blocked",
                "--code",
                code,
                "--evidence",
                p,
                "--next-action",
                &format!("operator: resolve {code}, then mosaic unblock"),
            ]);
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// Fetches the contract through `mosaic lane contract`, validates its directives, then
/// acknowledges through `mosaic lane ack` and waits to be activated.
fn from_contract() -> Result<Vec<String>, String> {
    let bin = std::env::var_os("MOSAIC_BIN").ok_or("MOSAIC_BIN is not set")?;
    let run = |op: &str| -> Result<serde_json::Value, String> {
        let out = std::process::Command::new(&bin)
            .args(["lane", op])
            .output()
            .map_err(|e| format!("mosaic lane {op}: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| format!("mosaic lane {op}: {e}"))?;
        if !out.status.success() || v["ok"] != true {
            return Err(format!("mosaic lane {op} refused: {}", v["error"]));
        }
        Ok(v)
    };
    let c = run("contract")?;
    let task = c["contract"]["task_text"]
        .as_str()
        .ok_or("contract without task text")?
        .to_string();
    println!(
        "fake: contract {}",
        c["contract"]["contracts_digest"].as_str().unwrap_or("")
    );
    // Refuse a task we cannot run before acknowledging it.
    let directives = parse_all(&[task.as_str()]).map_err(|e| e.to_string())?;
    if directives.contains(&Directive::QuitAtContract) {
        println!("fake: quit-at-contract: exiting with the contract just delivered");
        std::process::exit(3);
    }
    if directives.contains(&Directive::NoAck) {
        println!("fake: no-ack: holding the contract without acknowledging it");
        loop {
            sleep_reaping(Duration::from_secs(3600));
        }
    }
    let staging: Vec<&attack::Attack> = directives
        .iter()
        .filter_map(|d| match d {
            Directive::StagingAttack(a) => Some(a),
            _ => None,
        })
        .collect();
    if !staging.is_empty() {
        attack::run_into(&staging, "staging-attacks");
    }
    if directives.contains(&Directive::AcceptHandoff) {
        let h = run("handoff-ack")?;
        println!("fake: handoff {}", h["state"].as_str().unwrap_or("?"));
    }
    // The supervisor may die (and restart) while the ACK waits for the activation: a lane
    // socket that answers nothing is asked again (a restarted supervisor serves an activated
    // generation's socket again and says it is active); a refusal is final.
    let mut a = run("ack");
    for _ in 0..100 {
        match &a {
            Err(e) if !e.contains("refused") => {
                sleep_reaping(Duration::from_millis(100));
                a = run("ack");
            }
            _ => break,
        }
    }
    let a = a?;
    println!("fake: generation is {}", a["state"].as_str().unwrap_or("?"));
    Ok(task.split_whitespace().map(String::from).collect())
}

/// Sleeps while reaping the intermediate children of double forks.
fn sleep_reaping(total: Duration) {
    let end = std::time::Instant::now() + total;
    loop {
        while let Ok(
            nix::sys::wait::WaitStatus::Exited(..) | nix::sys::wait::WaitStatus::Signaled(..),
        ) = nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG))
        {}
        let now = std::time::Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(200)));
    }
}

/// Forks one long-lived descendant of the given kind (0 plain, 1 setsid, 2 double fork,
/// 3 own process group). The fake harness is single-threaded, so fork is sound; the child
/// only makes async-signal-safe calls.
fn spawn_descendant(kind: u32) -> nix::Result<()> {
    use nix::unistd::{fork, setpgid, setsid, ForkResult, Pid};
    // SAFETY: single-threaded process; the child calls only setsid/setpgid/fork/pause/_exit.
    match unsafe { fork() }? {
        ForkResult::Parent { .. } => Ok(()),
        ForkResult::Child => {
            match kind {
                1 => {
                    let _ = setsid();
                }
                2 => {
                    // SAFETY: as above.
                    match unsafe { fork() } {
                        Ok(ForkResult::Child) => {
                            let _ = setsid();
                        }
                        // SAFETY: _exit is async-signal-safe.
                        _ => unsafe { libc::_exit(0) },
                    }
                }
                3 => {
                    let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
                }
                _ => {}
            }
            loop {
                // SAFETY: pause has no preconditions.
                unsafe { libc::pause() };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_directive() {
        let d = parse_all(&["spawn=3 ignore-term", "print=hi exit=4"]).unwrap();
        assert_eq!(
            d,
            vec![
                Directive::Spawn(3),
                Directive::IgnoreTerm,
                Directive::Print("hi".into()),
                Directive::Exit(4)
            ]
        );
        assert_eq!(
            parse_all(&["crash-after=0.5"]).unwrap(),
            vec![Directive::CrashAfter(0.5)]
        );
        assert_eq!(parse_all(&["hang"]).unwrap(), vec![Directive::Hang]);
    }

    #[test]
    fn refuses_unknown_malformed_and_conflicting() {
        assert_eq!(
            parse_all(&["explode"]),
            Err(DirectiveError::Unknown("explode".into()))
        );
        assert_eq!(
            parse_all(&["spawn=-1"]),
            Err(DirectiveError::BadValue("spawn=-1".into()))
        );
        assert_eq!(
            parse_all(&["spawn=999999"]),
            Err(DirectiveError::BadValue("spawn=999999".into()))
        );
        assert_eq!(
            parse_all(&["exit=300"]),
            Err(DirectiveError::BadValue("exit=300".into()))
        );
        assert_eq!(
            parse_all(&["exit-after=nan"]),
            Err(DirectiveError::BadValue("exit-after=nan".into()))
        );
        assert!(matches!(
            parse_all(&["exit=0 hang"]),
            Err(DirectiveError::Conflict(..))
        ));
    }
}
