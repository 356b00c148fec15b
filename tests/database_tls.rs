//! A database on another machine is reached over TLS that verifies the server, or not at
//! all: `sslmode=verify-full` with `sslrootcert` connects to a TLS-enabled server and
//! refuses a certificate from another CA or for another name; a URL without TLS (or with
//! TLS that checks nothing) is refused before any connection. The "remote" server is a
//! throwaway cluster on loopback reached through a non-loopback host name (`hostaddr`
//! carries the address), the only server of this binary.

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;

use mosaic::coordinator::secret::CoordinatorSecret;
use mosaic::coordinator::store::Store;
use mosaic::pgcluster::Cluster;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

const NAME: &str = "mosaic-db.test";
const PASSWORD: &str = "tls-test-password";

struct Server {
    cluster: Cluster,
    dir: std::path::PathBuf,
    port: u16,
    ca: std::path::PathBuf,
    other_ca: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.cluster.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ca(dir: &std::path::Path, file: &str) -> (Issuer<'static, KeyPair>, std::path::PathBuf) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let kp = KeyPair::generate().unwrap();
    let cert = p.self_signed(&kp).unwrap();
    let path = dir.join(file);
    std::fs::write(&path, cert.pem()).unwrap();
    (Issuer::new(p, kp), path)
}

fn as_postgres(c: &mut Command) -> &mut Command {
    let u = nix::unistd::User::from_name("postgres").unwrap().unwrap();
    c.uid(u.uid.as_raw()).gid(u.gid.as_raw()).current_dir("/")
}

fn start() -> Server {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (the cluster runs as postgres): sudo -E scripts/test"
    );
    let dir = std::env::temp_dir().join(format!("mosaic-pgtls-{}", uuid::Uuid::new_v4().simple()));
    let cluster = Cluster::at(&dir).unwrap();
    cluster.init().unwrap();
    let data = cluster.data_dir();
    let (issuer, ca_path) = ca(&dir, "ca.pem");
    let (_, other_ca) = ca(&dir, "other-ca.pem");
    let kp = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![NAME.to_string()])
        .unwrap()
        .signed_by(&kp, &issuer)
        .unwrap();
    std::fs::write(data.join("server.crt"), cert.pem()).unwrap();
    std::fs::write(data.join("server.key"), kp.serialize_pem()).unwrap();
    // Only TLS from loopback with a password; the private socket for the test's own setup.
    std::fs::write(
        data.join("pg_hba.conf"),
        "local all all peer map=mosaic\nhostssl all postgres 127.0.0.1/32 scram-sha-256\n",
    )
    .unwrap();
    std::fs::write(
        data.join("pg_ident.conf"),
        "mosaic root postgres\nmosaic postgres postgres\n",
    )
    .unwrap();
    let pg = nix::unistd::User::from_name("postgres").unwrap().unwrap();
    for f in ["server.crt", "server.key", "pg_hba.conf", "pg_ident.conf"] {
        nix::unistd::chown(&data.join(f), Some(pg.uid), Some(pg.gid)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        data.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    cluster.init_dir().unwrap();
    let port = common::free_port();
    let out = as_postgres(&mut Command::new(cluster.bin("pg_ctl")))
        .arg("-D")
        .arg(&data)
        .arg("-o")
        .arg(format!(
            "-k {} -p {port} -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c fsync=off",
            cluster.socket_dir().display()
        ))
        .arg("-l")
        .arg(dir.join("server.log"))
        .args(["-w", "-t", "60", "start"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster = cluster.with_port(port);
    let s = Server {
        cluster,
        dir,
        port,
        ca: ca_path,
        other_ca,
    };
    s.cluster
        .psql(
            "postgres",
            &format!("ALTER USER postgres PASSWORD '{PASSWORD}'"),
        )
        .unwrap();
    s
}

impl Server {
    fn url(&self, host: &str, tls: &str) -> String {
        format!(
            "host={host} hostaddr=127.0.0.1 port={} user=postgres password={PASSWORD} dbname=postgres {tls}",
            self.port
        )
    }

    /// Whether the coordinator's current connections to this server are all TLS.
    fn coordinator_on_tls(&self) -> (i64, i64) {
        let out = Command::new(self.cluster.bin("psql"))
            .args(["-X", "-At", "-d", &self.cluster.url("postgres"), "-c"])
            .arg(
                "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
                 JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'mosaic-coordinator'",
            )
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let (n, tls) = text.trim().split_once('|').unwrap();
        (n.parse().unwrap(), tls.parse().unwrap())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_full_connects_over_tls_and_refuses_another_ca_or_name() {
    let s = start();
    let secret = || CoordinatorSecret::generate().unwrap();
    let good = format!("sslmode=verify-full sslrootcert={}", s.ca.display());
    let store = Store::connect_with(&s.url(NAME, &good), false, secret())
        .await
        .unwrap_or_else(|e| panic!("verify-full against the right CA was refused: {e}"));
    let (n, tls) = s.coordinator_on_tls();
    assert!(n > 0 && n == tls, "{tls} of {n} connections use TLS");
    drop(store);

    // Another CA: refused during the handshake.
    let wrong = format!("sslmode=verify-full sslrootcert={}", s.other_ca.display());
    let e = Store::connect_with(&s.url(NAME, &wrong), false, secret())
        .await
        .expect_err("a certificate from another CA was accepted");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");

    // The right CA, but the server's certificate is for another name.
    let e = Store::connect_with(&s.url("other-name.test", &good), false, secret())
        .await
        .expect_err("a certificate for another name was accepted");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");

    // No TLS asked for, or TLS that verifies nothing: refused before connecting.
    for tls in ["", "sslmode=prefer", "sslmode=require", "sslmode=disable"] {
        let e = Store::connect_with(&s.url(NAME, tls), false, secret())
            .await
            .err()
            .unwrap_or_else(|| panic!("{tls:?} to a remote server was accepted"));
        assert!(e.to_string().contains("sslmode"), "{tls:?}: {e}");
        // A configuration the operator must change, not an unavailable database.
        assert!(
            matches!(e, mosaic::coordinator::AuthorityError::BadDatabaseUrl(_)),
            "{tls:?}: {e:?}"
        );
        assert_eq!(
            e.operator_category(),
            mosaic::coordinator::Category::BadInput
        );
    }
    // The operator may accept a plain remote connection explicitly — this server refuses
    // it anyway (its rules say hostssl only), which is the server's right.
    let e = Store::connect_with(&s.url(NAME, "sslmode=disable"), true, secret())
        .await
        .expect_err("a plain connection got through a hostssl-only server");
    assert!(e.to_string().contains("no pg_hba.conf entry"), "{e}");
}
