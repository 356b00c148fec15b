//! systemd readiness and watchdog, with a real `NOTIFY_SOCKET` listener standing in for
//! the service manager; and the checks every daemon (and `mosaic up`) runs before it
//! starts anything.

mod common;
mod pg;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mosaic::supervisor::control::{self, Request};

struct World {
    dir: PathBuf,
    cgroup_root: PathBuf,
    daemon: Option<common::Daemon>,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join("stall"));
        if let Some(mut d) = self.daemon.take() {
            d.crash();
        }
        common::teardown(
            &self.dir,
            &self.dir.join("rt/lanes"),
            &self.cgroup_root,
            &["daemon.log"],
        );
    }
}

fn world() -> World {
    common::require_host();
    let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let dir = std::env::temp_dir().join(format!("mosaic-sd-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let cgroup_root = mosaic::cgroup::discover_mount()
        .unwrap()
        .path
        .join(format!("mosaic-test-{id}"));
    World {
        dir,
        cgroup_root,
        daemon: None,
    }
}

/// A service manager's notification socket: every datagram received, with its arrival.
fn listen(dir: &Path) -> UnixDatagram {
    let s = UnixDatagram::bind(dir.join("notify.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    s
}

fn recv(s: &UnixDatagram, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = s.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    out
}

/// Starts `mosaic <what>` under the stand-in service manager: its notify socket, and a
/// watchdog of `watchdog_usec` (none when `None`).
fn spawn(w: &mut World, what: &'static str, config: &Path, watchdog_usec: Option<u64>) {
    let mut d = common::Daemon::new(what, config.to_path_buf(), w.dir.join("daemon.log"));
    d.set_env(
        "NOTIFY_SOCKET",
        Some(w.dir.join("notify.sock").display().to_string()),
    );
    d.set_env("WATCHDOG_PID", None);
    d.set_env("WATCHDOG_USEC", watchdog_usec.map(|u| u.to_string()));
    d.start(None);
    w.daemon = Some(d);
}

#[test]
fn the_supervisor_is_ready_only_when_serving_and_its_watchdog_stops_when_a_lane_hangs() {
    let mut w = world();
    // tmux, except that `kill-server` hangs while the stall file exists (a wedged lane
    // operation, holding the lane's lock).
    let wrapper = w.dir.join("tmux");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \"$*\" in *kill-server*) while [ -e {} ]; do sleep 0.1; done;; esac\nexec tmux \"$@\"\n",
            w.dir.join("stall").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = w.dir.join("supervisor.toml");
    std::fs::write(
        &config,
        format!(
            "host_id = \"sd\"\nstate_dir = {:?}\nruntime_dir = {:?}\ncgroup_root = {:?}\nbin_dir = {:?}\ntmux = {wrapper:?}\nlanes = [\"lane-1\"]\n",
            w.dir.join("state"),
            w.dir.join("rt"),
            w.cgroup_root,
            Path::new(common::MOSAIC).parent().unwrap()
        ),
    )
    .unwrap();
    let sock = listen(&w.dir);
    spawn(&mut w, "supervisor", &config, Some(600_000));
    // READY=1 arrives, and at that moment the control socket already answers.
    let control_sock = w.dir.join("rt/control.sock");
    let deadline = Instant::now() + common::PATIENCE;
    let ready = loop {
        assert!(Instant::now() < deadline, "no READY=1");
        let got = recv(&sock, Duration::from_millis(100));
        if let Some(m) = got.iter().find(|m| m.contains("READY=1")) {
            break m.clone();
        }
        assert!(
            !got.iter().any(|m| m.contains("WATCHDOG=1")),
            "a watchdog ping before READY"
        );
    };
    assert!(ready.contains("STATUS=1 lanes"), "{ready}");
    control::call(&control_sock, &Request::Status).expect("READY=1 before serving");
    // While all is well: a ping every 300 ms.
    let pings = recv(&sock, Duration::from_secs(2))
        .iter()
        .filter(|m| m.contains("WATCHDOG=1"))
        .count();
    assert!(pings >= 3, "{pings} pings in 2 s");
    // A lane operation hangs holding its lane: the pings stop.
    std::fs::write(w.dir.join("stall"), "").unwrap();
    let c2 = control_sock.clone();
    let hung = std::thread::spawn(move || {
        control::call(
            &c2,
            &Request::LaneDestroy {
                lane: "lane-1".into(),
            },
        )
    });
    let _ = recv(&sock, Duration::from_millis(700));
    let pings = recv(&sock, Duration::from_secs(2))
        .iter()
        .filter(|m| m.contains("WATCHDOG=1"))
        .count();
    assert_eq!(pings, 0, "the watchdog was pinged while a lane hung");
    // Unstuck, it pings again.
    std::fs::remove_file(w.dir.join("stall")).unwrap();
    let _ = hung.join();
    let pings = recv(&sock, Duration::from_secs(2))
        .iter()
        .filter(|m| m.contains("WATCHDOG=1"))
        .count();
    assert!(pings >= 2, "{pings} pings after the lane came back");
    // SIGTERM: STOPPING=1.
    w.daemon
        .as_mut()
        .unwrap()
        .signal_and_wait(nix::sys::signal::Signal::SIGTERM);
    assert!(
        recv(&sock, Duration::from_millis(300))
            .iter()
            .any(|m| m.contains("STOPPING=1")),
        "no STOPPING=1"
    );
}

#[test]
fn the_coordinator_is_ready_only_when_serving_and_refuses_to_start_with_exposed_keys() {
    let mut w = world();
    let db = pg::TestDb::new();
    let listen_addr = format!("127.0.0.1:{}", common::free_port());
    let prov = mosaic::up::provision(&w.dir, &["sd".to_string()], &db.url, &listen_addr).unwrap();
    let c = &prov.coordinator;
    let config = w.dir.join("coordinator.toml");
    std::fs::write(
        &config,
        format!(
            "name = {:?}\ntrust_domain = {:?}\nlisten = {listen_addr:?}\ndatabase_url = {:?}\nsecret_file = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\n\
             trust_registry = {:?}\nsession_key = {:?}\nordinary_key = {:?}\noperator_socket = {:?}\n",
            c.name, c.trust_domain, c.database_url, c.secret_file, c.ca, c.cert, c.key, c.trust_registry, c.session_key, c.ordinary_key,
            w.dir.join("run/coordinator.sock"),
        ),
    )
    .unwrap();
    // A secret readable by others: refused before anything starts.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&c.secret_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(common::MOSAIC)
        .args(["coordinator", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("readable by others"), "{err}");
    assert!(!w.dir.join("run/coordinator.sock").exists());
    std::fs::set_permissions(&c.secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();

    let sock = listen(&w.dir);
    spawn(&mut w, "coordinator", &config, Some(2_000_000));
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "no READY=1");
        if recv(&sock, Duration::from_millis(100))
            .iter()
            .any(|m| m.contains("READY=1"))
        {
            break;
        }
    }
    mosaic::coordinator::service::operator_call(
        &w.dir.join("run/coordinator.sock"),
        &mosaic::coordinator::service::OperatorRequest::Status,
    )
    .expect("READY=1 before the operator socket served");
    let pings = recv(&sock, Duration::from_millis(2500))
        .iter()
        .filter(|m| m.contains("WATCHDOG=1"))
        .count();
    assert!(
        pings >= 1,
        "no watchdog ping from a turning leadership loop"
    );
}

#[test]
fn mosaic_up_checks_the_host_before_it_starts_anything() {
    let w = world();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let state = w.dir.join("up-state");
    std::fs::create_dir_all(&state).unwrap();
    nix::unistd::chown(&state, Some(nobody.uid), Some(nobody.gid)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // The build may live where `nobody` cannot reach it (a CI checkout under a 0700
    // directory): run a copy from the test's own world-readable directory.
    std::fs::set_permissions(&w.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = w.dir.join("mosaic");
    std::fs::copy(common::MOSAIC, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&bin)
        .args(["up", "--state-dir"])
        .arg(&state)
        .uid(nobody.uid.as_raw())
        .gid(nobody.gid.as_raw())
        .current_dir("/")
        .env("HOME", &state)
        .output()
        .unwrap();
    assert!(!out.status.success(), "an unprivileged up came up");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("cannot run the supervisor"), "{text}");
    assert!(
        !state.join("pg").exists(),
        "a cluster was initialised before the checks"
    );
}
