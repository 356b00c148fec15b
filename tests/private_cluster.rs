//! The private PostgreSQL cluster `mosaic up` runs (and the suite uses) is private: no
//! TCP listener, a socket directory only its owner (and root) can enter, and peer
//! authentication that admits only the mapped accounts. Another local account is refused
//! by each layer on its own. One cluster for this binary, started exactly as `mosaic up`
//! starts its own.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

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
