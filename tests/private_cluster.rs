//! The private PostgreSQL cluster `mosaic up` runs (and the suite uses) is private: no
//! TCP listener, a socket directory only its owner (and root) can enter, and peer
//! authentication that admits only the mapped accounts. Another local account is refused
//! by each layer on its own. One cluster for this binary, started exactly as `mosaic up`
//! starts its own.

mod common;

use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use mosaic::pgcluster::{Cluster, Durability};

struct Owned {
    cluster: Cluster,
    dir: std::path::PathBuf,
}

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.cluster.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `psql -c sql` as `uid` against the cluster's socket; (success, stderr).
fn psql_as(c: &Cluster, uid: u32, user: &str, sql: &str) -> (bool, String) {
    let out = Command::new(c.bin("psql"))
        .args(["-X", "-q", "-At", "-h"])
        .arg(c.socket_dir())
        .args([
            "-p",
            &c.port().to_string(),
            "-U",
            user,
            "-d",
            "postgres",
            "-c",
            sql,
        ])
        .uid(uid)
        .gid(uid)
        .current_dir("/")
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn another_local_account_cannot_open_the_private_cluster() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (it runs psql as an unprivileged account): sudo -E scripts/test"
    );
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .expect("the test needs the `nobody` account")
        .uid
        .as_raw();
    let dir = std::env::temp_dir().join(format!("mosaic-pgpriv-{}", uuid::Uuid::new_v4().simple()));
    let cluster = Cluster::at(&dir).unwrap();
    let c = Owned { cluster, dir };
    c.cluster.init().unwrap();
    c.cluster.start(Durability::Throwaway).unwrap();

    // Root gets in (the coordinator runs as root under `mosaic up`), as the superuser.
    let (ok, out) = psql_as(&c.cluster, 0, "postgres", "SHOW listen_addresses");
    assert!(ok, "root was refused: {out}");
    assert_eq!(
        out.trim(),
        "",
        "the private cluster listens on TCP: {out:?}"
    );
    let mode = std::fs::metadata(c.cluster.socket_dir())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700, "socket directory mode {mode:o}");

    // Another account: the socket directory keeps it out …
    let (ok, out) = psql_as(&c.cluster, nobody, "postgres", "SELECT 1");
    assert!(!ok, "nobody opened the cluster: {out}");
    assert!(out.contains("Permission denied"), "{out}");

    // … and with the directory opened by mistake, the server still refuses it, under the
    // superuser's name or its own.
    std::fs::set_permissions(
        c.cluster.socket_dir(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let sock = c
        .cluster
        .socket_dir()
        .join(format!(".s.PGSQL.{}", c.cluster.port()));
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    for user in ["postgres", "nobody"] {
        let (ok, out) = psql_as(&c.cluster, nobody, user, "SELECT 1");
        assert!(!ok, "nobody opened the cluster as {user}: {out}");
        assert!(
            out.contains("authentication failed") || out.contains("no pg_hba.conf entry"),
            "{out}"
        );
    }
    let hba = std::fs::read_to_string(c.cluster.data_dir().join("pg_hba.conf")).unwrap();
    assert!(!hba.contains("trust"), "{hba}");

    // A cluster made by an older version with `trust` rules is closed at its next start.
    std::fs::write(
        c.cluster.data_dir().join("pg_hba.conf"),
        "local all all trust\n",
    )
    .unwrap();
    c.cluster.stop().unwrap();
    c.cluster.start(Durability::Throwaway).unwrap();
    std::fs::set_permissions(
        c.cluster.socket_dir(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, out) = psql_as(&c.cluster, nobody, "postgres", "SELECT 1");
    assert!(!ok, "the old trust rule survived a restart: {out}");
}

/// `mosaic up` keeps its private cluster running: its postmaster SIGKILLed, it is started
/// again (logged, counted), and the system takes work again without anyone running
/// `pg_ctl`.
#[test]
fn mosaic_up_restarts_its_private_cluster_when_the_postmaster_dies() {
    common::require_host();
    let dir = std::env::temp_dir().join(format!("mosaic-pgup-{}", uuid::Uuid::new_v4().simple()));
    let log = dir.with_extension("log");
    let child = Command::new(common::MOSAIC)
        .args(["up", "--lanes", "1", "--state-dir"])
        .arg(&dir)
        .env("MOSAIC_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Running {
        child: std::process::Child,
        dir: std::path::PathBuf,
        log: std::path::PathBuf,
    }
    impl Drop for Running {
        fn drop(&mut self) {
            common::terminate(&mut self.child, std::time::Duration::from_secs(30));
            let _ = std::fs::remove_dir_all(&self.dir);
            if !std::thread::panicking() {
                let _ = std::fs::remove_file(&self.log);
            }
        }
    }
    let mut up = Running { child, dir, log };
    let mut out = std::io::BufReader::new(up.child.stdout.take().unwrap());
    common::read_until(&mut out, "Ctrl-C stops everything");
    std::thread::spawn(move || for _ in out.lines() {});
    let pidfile = up.dir.join("pg/data/postmaster.pid");
    let postmaster = || -> Option<i32> {
        std::fs::read_to_string(&pidfile)
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
            .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    };
    let first = postmaster().expect("the private cluster runs");
    common::kill(first, nix::sys::signal::Signal::SIGKILL);
    let second = common::wait_until("the postmaster started again", || {
        postmaster().filter(|p| *p != first)
    });
    assert_ne!(first, second);
    // Work is taken again: an assignment reaches RUNNING.
    let host = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let lane = format!("{host}:lane-1");
    let assigned = common::wait_until("an assignment after the restart", || {
        let out = Command::new(common::MOSAIC)
            .args([
                "assign",
                "--lane",
                &lane,
                "--runtime",
                "fake@1.0.0",
                "--task",
                "hang",
            ])
            .args(["--wait", "running", "--json", "--state-dir"])
            .arg(&up.dir)
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap())
    });
    assert_eq!(assigned["state"], "RUNNING", "{assigned}");
    // Counted where an operator looks.
    let addr = std::fs::read_to_string(up.dir.join("run/metrics-coordinator.addr")).unwrap();
    let metrics = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr.trim()).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut t = String::new();
        s.read_to_string(&mut t).unwrap();
        t
    };
    let restarts: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mosaic_database_restarts_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no restart counter in:\n{metrics}"));
    assert!(restarts >= 1.0, "{restarts}");
    let text = std::fs::read_to_string(&up.log).unwrap();
    assert!(
        text.contains("postmaster is gone; restarting it")
            && text.contains("the private PostgreSQL is running again"),
        "the restart is logged"
    );
}
