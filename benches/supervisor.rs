//! Supervisor benchmarks, each beside the anchor it is measured against, in one run:
//!
//! (a) fresh generation start → verified identity, vs a bare `tmux respawn-pane` of the
//!     same harness command (until the pane's process has exec'd it), and vs the same
//!     respawn through an attached control-mode client (how the supervisor drives tmux);
//! (b) stop of a generation with 1000 descendants (a quarter of them setsid'd) → verified
//!     empty, vs `tmux kill-session`, with the survivors each leaves;
//! (c) SIGKILL of the harness → fsync'd receipt, p50 and p99.
//!
//! Run as root: `cargo bench --bench supervisor`. Prints; asserts nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use mosaic::supervisor::control::Request;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn fake() -> String {
    Path::new(MOSAIC)
        .with_file_name("mosaic-fake-harness")
        .display()
        .to_string()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown cpu".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpu}, {} cores, Linux {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim()
    )
}

fn tmux(sock: &Path, args: &[&str]) -> String {
    let out = Command::new("tmux")
        .arg("-S")
        .arg(sock)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A tmux server for an anchor, session `name` idling, dead panes kept (as a lane's).
fn anchor_session(dir: &Path, name: &str) -> std::path::PathBuf {
    let sock = dir.join(format!("anchor-{name}.sock"));
    tmux(
        &sock,
        &[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            name,
            "sleep",
            "600",
        ],
    );
    tmux(&sock, &["set", "-g", "remain-on-exit", "on"]);
    sock
}

/// Waits until the pane's process `pid` has exec'd the fake harness.
fn wait_exec(pid: i32) {
    wait_until("exec", || {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .filter(|p| p.ends_with("mosaic-fake-harness"))
    });
}

/// (a) anchor: respawn-pane, then wait until the pane process is the harness.
fn bare_respawn(n: usize, dir: &Path) -> Vec<Duration> {
    let sock = anchor_session(dir, "a");
    let fake = fake();
    let mut v = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        tmux(&sock, &["respawn-pane", "-k", "-t", "=a:", &fake, "hang"]);
        let pid: i32 = tmux(&sock, &["display", "-p", "-t", "=a:", "#{pane_pid}"])
            .parse()
            .unwrap();
        wait_exec(pid);
        v.push(t.elapsed());
    }
    tmux(&sock, &["kill-server"]);
    v
}

/// (a) second anchor: the same respawn through a tmux control-mode client that is already
/// attached (the way the supervisor drives its lanes' servers), so no tmux client starts
/// per respawn.
fn control_respawn(n: usize, dir: &Path) -> Vec<Duration> {
    use std::io::{BufRead, BufReader, Write};
    let sock = anchor_session(dir, "c");
    let mut client = Command::new("tmux")
        .arg("-S")
        .arg(&sock)
        .args([
            "-C",
            "attach-session",
            "-f",
            "no-output,ignore-size",
            "-t",
            "=c",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = client.stdin.take().unwrap();
    let mut output = BufReader::new(client.stdout.take().unwrap());
    let mut reply = || {
        let mut body = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                output.read_line(&mut line).unwrap() > 0,
                "control client ended"
            );
            if line.starts_with("%begin") {
                body.clear();
            } else if line.starts_with("%end") {
                return body;
            } else if line.starts_with("%error") {
                panic!("tmux: {body:?}");
            } else {
                body.push(line.trim().to_string());
            }
        }
    };
    reply();
    let fake = fake();
    let mut v = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        writeln!(input, "respawn-pane -k -t =c: '{fake}' hang").unwrap();
        reply();
        writeln!(input, "display -p -t =c: '#{{pane_pid}}'").unwrap();
        let pid: i32 = reply()[0].parse().unwrap();
        wait_exec(pid);
        v.push(t.elapsed());
    }
    drop(input);
    let _ = client.wait();
    tmux(&sock, &["kill-server"]);
    v
}

/// (b) anchor: a tmux session running the harness with 1000 descendants, killed with
/// kill-session. The server sits in its own cgroup so survivors can be counted and then
/// removed.
fn bare_kill_session(runs: usize, dir: &Path, root: &Path) -> (Vec<Duration>, Vec<usize>) {
    let cg = root.join("anchor-b");
    std::fs::create_dir_all(&cg).unwrap();
    let sock = dir.join("anchor-b.sock");
    let (mut times, mut survivors) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&sock).args([
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "b",
            &fake(),
            "spawn=1000",
        ]);
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(cg.join("cgroup.procs"))
            .unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&procs);
        use std::os::unix::process::CommandExt;
        // SAFETY: only write(2) on an fd opened before the fork.
        unsafe {
            c.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) == 1 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        c.status().unwrap();
        wait_until("1000 descendants", || {
            (members(&cg).len() >= 1002).then_some(())
        });
        let t = Instant::now();
        tmux(&sock, &["kill-session", "-t", "=b"]);
        times.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(300));
        survivors.push(members(&cg).len());
        std::fs::write(cg.join("cgroup.kill"), "1").unwrap();
        wait_until("anchor cleanup", || members(&cg).is_empty().then_some(()));
    }
    let _ = std::fs::remove_dir(&cg);
    (times, survivors)
}

/// Where the start time goes: the supervisor logs each launch phase with the time since
/// the launch began (at debug level, which the test host enables). Prints the median time
/// spent in each phase, in launch order.
fn print_phases(log: &str) {
    let mut order: Vec<String> = Vec::new();
    let mut spent: std::collections::HashMap<String, Vec<Duration>> = Default::default();
    let mut last = 0u64;
    for line in log.lines().filter(|l| l.contains("launch phase")) {
        let field = |name: &str| {
            let at = line.find(&format!("{name}="))? + name.len() + 1;
            let rest = &line[at..];
            let (rest, end) = match rest.strip_prefix('"') {
                Some(quoted) => (quoted, '"'),
                None => (rest, ' '),
            };
            Some(rest[..rest.find(end).unwrap_or(rest.len())].to_string())
        };
        let (Some(phase), Some(us)) = (field("phase"), field("elapsed_us")) else {
            continue;
        };
        let Ok(us) = us.parse::<u64>() else { continue };
        if us < last || phase.starts_with("planned") {
            last = 0;
        }
        if !order.contains(&phase) {
            order.push(phase.clone());
        }
        spent
            .entry(phase)
            .or_default()
            .push(Duration::from_micros(us - last));
        last = us;
    }
    println!("    where mosaic's start goes (median per phase, from the supervisor's debug log):");
    for phase in order {
        let v = spent
            .get_mut(&phase)
            .map(|v| pct(v, 0.5))
            .unwrap_or_default();
        println!("      {:7.2} ms  {phase}", ms(v));
    }
}

fn main() {
    require_host();
    // Lane `u` is opted out of confinement: the same start, unconfined, side by side.
    let h = Host::with(Options {
        unconfined_lanes: vec!["u"],
        ..Options::default()
    });
    let dir = h.dir.clone();
    println!("Mosaic supervisor benchmarks — {}", machine());
    println!();

    // (a)
    let n = 30;
    // `n` starts (each stopped again) on a new lane: their start times.
    let starts = |lane: &str| {
        h.create_lane(lane);
        (0..n)
            .map(|_| {
                let t = Instant::now();
                h.start(lane, "hang");
                let took = t.elapsed();
                h.call(&Request::Stop { lane: lane.into() });
                took
            })
            .collect::<Vec<_>>()
    };
    let mut mosaic_start = starts("a");
    let mut unconfined_start = starts("u");
    let mut anchor = bare_respawn(n, &dir);
    let mut control = control_respawn(n, &dir);
    let (m50, a50, c50) = (
        pct(&mut mosaic_start, 0.5),
        pct(&mut anchor, 0.5),
        pct(&mut control, 0.5),
    );
    let dynmods = mosaic::cgroup::discover_mount()
        .map(|m| m.favordynmods)
        .unwrap_or(false);
    println!(
        "(a) fresh generation start → verified identity (n={n}; cgroup2 favordynmods {})",
        if dynmods { "on" } else { "off" }
    );
    println!(
        "    mosaic start        p50 {:7.2} ms  p99 {:7.2} ms   (new cgroup, shim, SO_PEERCRED + cgroup + start-time + nonce check, confinement built and verified, pidfds, fsync'd records)",
        ms(m50),
        ms(pct(&mut mosaic_start, 0.99))
    );
    let u50 = pct(&mut unconfined_start, 0.5);
    println!(
        "    mosaic start, unconfined lane   p50 {:7.2} ms  p99 {:7.2} ms   (confined / unconfined p50: {:.2}x)",
        ms(u50),
        ms(pct(&mut unconfined_start, 0.99)),
        m50.as_secs_f64() / u50.as_secs_f64()
    );
    println!(
        "    tmux respawn-pane   p50 {:7.2} ms  p99 {:7.2} ms",
        ms(a50),
        ms(pct(&mut anchor, 0.99))
    );
    println!(
        "    ratio (p50)         {:.2}x",
        m50.as_secs_f64() / a50.as_secs_f64()
    );
    println!(
        "    respawn-pane through an attached control client   p50 {:7.2} ms  p99 {:7.2} ms  (mosaic's own way to tmux; ratio {:.2}x)",
        ms(c50),
        ms(pct(&mut control, 0.99)),
        m50.as_secs_f64() / c50.as_secs_f64()
    );
    print_phases(&h.log());
    println!();

    // (b)
    let runs = 5;
    h.create_lane("b");
    let mut stop_t = Vec::new();
    let mut survivors = Vec::new();
    for _ in 0..runs {
        let g = h.start("b", "spawn=1000");
        let cg = cgroup_abs(&h, g["process_identity"]["cgroup_path"].as_str().unwrap());
        let before = wait_until("1000 descendants", || {
            let m = members(&cg);
            (m.len() >= 1002).then_some(m)
        });
        let t = Instant::now();
        let r = h.call(&Request::Stop { lane: "b".into() });
        stop_t.push(t.elapsed());
        assert_eq!(r["cleanup"]["verified_empty"], true);
        survivors.push(before.iter().filter(|(p, st)| !is_dead(*p, *st)).count());
    }
    let (mut ks, ks_surv) = bare_kill_session(runs, &dir, &h.cgroup_root);
    let (s50, k50) = (pct(&mut stop_t, 0.5), pct(&mut ks, 0.5));
    println!("(b) stop with 1000 descendants (¼ setsid, ¼ double-forked, ¼ own process group), {runs} runs");
    println!(
        "    mosaic stop         median {:7.2} ms  survivors per run {:?}   (SIGTERM, 1.5 s grace not needed, cgroup.kill, verified empty, rmdir, fsync'd receipt)",
        ms(s50),
        survivors
    );
    println!(
        "    tmux kill-session   median {:7.2} ms  survivors per run {:?}",
        ms(k50),
        ks_surv
    );
    println!(
        "    ratio (median)      {:.2}x",
        s50.as_secs_f64() / k50.as_secs_f64()
    );
    println!();

    // (c)
    let n = 50;
    h.create_lane("c");
    let outbox = h.state_dir().join("outbox");
    let mut lat = Vec::new();
    for _ in 0..n {
        let g = h.start("c", "hang");
        let id = &g["process_identity"];
        let key = mosaic::supervisor::receipt::idempotency_key(
            id["lane_id"].as_str().unwrap(),
            id["lane_incarnation_id"].as_str().unwrap(),
            id["generation"].as_u64().unwrap(),
        );
        let file = outbox.join(format!("{key}.json"));
        let hp = id["harness_pid"].as_i64().unwrap() as i32;
        let t = Instant::now();
        kill(hp, nix::sys::signal::Signal::SIGKILL);
        while !file.exists() {
            std::thread::sleep(Duration::from_micros(100));
            assert!(t.elapsed() < PATIENCE, "no receipt");
        }
        lat.push(t.elapsed());
        wait_until("lane settles", || {
            (h.lane_status("c")["current_generation"].is_null()).then_some(())
        });
    }
    println!("(c) SIGKILL of the harness → fsync'd receipt (n={n}; includes killing the rest of the cgroup)");
    println!(
        "    p50 {:7.2} ms  p99 {:7.2} ms",
        ms(pct(&mut lat, 0.5)),
        ms(pct(&mut lat, 0.99))
    );
}
