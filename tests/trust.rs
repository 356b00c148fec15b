//! Deployment and live trust: a fleet made by `mosaic init` / `mosaic enroll` alone; a host
//! enrolled while the coordinator runs connects without a restart; a registry that does not
//! load is refused and the old one kept; a revocation closes the live session, refuses
//! what follows and survives a restart; a daemon whose own key its registry lacks refuses
//! to start, naming the key; operators find the coordinator (socket from the environment or
//! the config, a standby's `not-leader` followed) and a refused certificate hears why.

mod common;
mod pg;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::Daemon;
use mosaic::coordinator::service::{
    operator_request, operator_request_any, OperatorRequest, OperatorTarget,
};
use mosaic::coordinator::Category;
use mosaic::enroll;

/// A coordinator directory made by `init coordinator`, and hosts enrolled from it.
struct Fleet {
    dir: PathBuf,
    /// Kept for the test's life (dropped with it).
    _db: pg::TestDb,
    id: String,
    coord: Vec<Daemon>,
    sup: Vec<(String, Daemon)>,
    operator_addr: Vec<String>,
    listen: Vec<String>,
}

impl Fleet {
    /// `init coordinator` (and `standbys` standbys); nothing started.
    fn new(standbys: usize) -> Self {
        common::require_host();
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
        let dir = std::env::temp_dir().join(format!("mosaic-trust-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let db = pg::TestDb::new();
        let listen: Vec<String> = (0..=standbys)
            .map(|_| format!("127.0.0.1:{}", common::free_port()))
            .collect();
        let operator_addr: Vec<String> = (0..=standbys)
            .map(|_| format!("127.0.0.1:{}", common::free_port()))
            .collect();
        let c = dir.join("coord");
        enroll::init_coordinator(&enroll::InitCoordinator {
            dir: c.clone(),
            name: "main".into(),
            trust_domain: "trust.test".into(),
            names: Default::default(),
            listen: listen[0].clone(),
            database_url: db.url.clone(),
            operator_socket: c.join("run/operator.sock"),
            operator_listen: Some(operator_addr[0].clone()),
            advertise_operator: None,
            state_dir: c.join("state"),
            days: 30,
            force: false,
        })
        .unwrap();
        let mut coord = vec![Daemon::new(
            "coordinator",
            c.join("coordinator.toml"),
            dir.join("coordinator-0.log"),
        )];
        for i in 1..=standbys {
            let s = dir.join(format!("standby-{i}"));
            enroll::init_standby(&enroll::InitStandby {
                dir: s.clone(),
                leader_dir: c.clone(),
                names: Default::default(),
                listen: listen[i].clone(),
                operator_socket: s.join("run/operator.sock"),
                operator_listen: Some(operator_addr[i].clone()),
                advertise_operator: None,
                state_dir: s.join("state"),
                days: 30,
                force: false,
            })
            .unwrap();
            coord.push(Daemon::new(
                "coordinator",
                s.join("coordinator.toml"),
                dir.join(format!("coordinator-{i}.log")),
            ));
        }
        Self {
            dir,
            _db: db,
            id,
            coord,
            sup: vec![],
            operator_addr,
            listen,
        }
    }

    fn coord_dir(&self) -> PathBuf {
        self.dir.join("coord")
    }

    fn host_id(&self, n: usize) -> String {
        format!("h{n}-{}", self.id)
    }

    fn cgroup_root(&self, n: usize) -> PathBuf {
        mosaic::cgroup::discover_mount()
            .unwrap()
            .path
            .join(format!("mosaic-trust-{}-{n}", self.id))
    }

    /// `enroll host` (its bundle written where the supervisor reads it).
    fn enroll(&mut self, n: usize) -> serde_json::Value {
        let h = self.host_id(n);
        let out = self.dir.join(&h);
        let v = enroll::enroll_host(&enroll::EnrollHost {
            dir: self.coord_dir(),
            host_id: h.clone(),
            addresses: self.listen.clone(),
            server_name: None,
            out: Some(out.clone()),
            install_dir: out.clone(),
            lanes: vec!["lane-1".into()],
            state_dir: out.join("state"),
            runtime_dir: out.join("run"),
            cgroup_root: Some(self.cgroup_root(n)),
            days: 30,
            force: false,
        })
        .unwrap();
        let log = self.dir.join(format!("supervisor-{n}.log"));
        self.sup.push((
            h,
            Daemon::new("supervisor", out.join("supervisor.toml"), log),
        ));
        v
    }

    fn socket(&self) -> PathBuf {
        self.coord_dir().join("run/operator.sock")
    }

    fn op(
        &self,
        r: &OperatorRequest,
    ) -> Result<serde_json::Value, mosaic::coordinator::service::OpError> {
        mosaic::coordinator::service::operator_call(&self.socket(), r)
    }

    fn wait_leading(&self) {
        common::wait_until("coordinator 0 leads", || {
            let st = self.op(&OperatorRequest::Status).ok()?;
            (st["leadership"]["state"] == "leading").then_some(())
        });
    }

    fn wait_connected(&self, host: &str) {
        common::wait_until(&format!("{host} connected"), || {
            let st = self.op(&OperatorRequest::Status).ok()?;
            st["hosts_connected"]
                .as_array()?
                .iter()
                .any(|h| *h == format!("host:{host}"))
                .then_some(())
        });
    }

    fn operator_target(&self, i: usize, name: &str) -> OperatorTarget {
        let b = self.coord_dir().join("operators").join(name);
        OperatorTarget::Remote {
            addr: self.operator_addr[i].clone(),
            server_name: "127.0.0.1".into(),
            tls: mosaic::protocol::transport::TlsIdentity {
                ca: b.join("ca.pem"),
                cert: b.join(format!("operator-{name}.pem")),
                key: b.join(format!("operator-{name}-key.pem")),
            },
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, d) in &mut self.sup {
            d.crash();
        }
        for d in &mut self.coord {
            d.crash();
        }
        let lanes: Vec<PathBuf> = self
            .sup
            .iter()
            .map(|(h, _)| self.dir.join(h).join("run/lanes"))
            .collect();
        let lanes: Vec<&Path> = lanes.iter().map(PathBuf::as_path).collect();
        let roots: Vec<PathBuf> = (0..self.sup.len()).map(|n| self.cgroup_root(n)).collect();
        let roots: Vec<&Path> = roots.iter().map(PathBuf::as_path).collect();
        let mut logs: Vec<String> = (0..self.coord.len())
            .map(|i| format!("coordinator-{i}.log"))
            .collect();
        logs.extend((0..self.sup.len()).map(|n| format!("supervisor-{n}.log")));
        let logs: Vec<&str> = logs.iter().map(String::as_str).collect();
        common::teardown_all(&self.dir, &lanes, &roots, &logs);
    }
}

/// Rows of the audit whose detail mentions `needle`.
fn audit_count(f: &Fleet, needle: &str) -> usize {
    f.op(&OperatorRequest::Audit { since: 0 })
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|r| r["detail"].as_str().unwrap_or("").contains(needle))
        .count()
}

fn without_keys(text: &str, drop: impl Fn(&toml::Value) -> bool) -> String {
    let doc: toml::Table = toml::from_str(text).unwrap();
    let keys: Vec<toml::Value> = doc["key"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| !drop(k))
        .cloned()
        .collect();
    let mut t = toml::Table::new();
    t.insert("key".into(), toml::Value::Array(keys));
    toml::to_string(&t).unwrap()
}

fn trust_has(f: &Fleet, key_id: &str) -> bool {
    f.op(&OperatorRequest::Trust).unwrap()["keys"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["key_id"] == key_id)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_enrolled_while_the_coordinator_runs_connects_and_a_revoked_one_stays_out() {
    let mut f = Fleet::new(0);
    f.enroll(0);
    f.coord[0].start(None);
    f.wait_leading();
    f.sup[0].1.start(None);
    let (h0, h1) = (f.host_id(0), f.host_id(1));
    f.wait_connected(&h0);
    // Enrolled now, with the coordinator running: it reloads the registry and takes the
    // new host's session (no restart; its process is the same throughout).
    let pid = f.coord[0].pid();
    f.enroll(1);
    f.sup[1].1.start(None);
    f.wait_connected(&h1);
    assert_eq!(f.coord[0].pid(), pid);

    // A registry that does not load, and one without the coordinator's own key, are each
    // refused whole; the one in use stays (h1's keys in it).
    let reg = f.coord_dir().join("trust.toml");
    let good = std::fs::read_to_string(&reg).unwrap();
    for (bad, why) in [
        (
            "[[key]]\nkey_id = 1\n".to_string(),
            "trust registry reload refused",
        ),
        (
            without_keys(&good, |k| {
                k["key_id"].as_str() == Some("coordinator:main/session")
            }),
            "coordinator:main/session",
        ),
    ] {
        let before = audit_count(&f, why);
        std::fs::write(&reg, &bad).unwrap();
        common::wait_until(&format!("the bad registry refused ({why})"), || {
            (audit_count(&f, why) > before).then_some(())
        });
        assert!(
            trust_has(&f, &format!("host:{h1}/session")),
            "the registry in use changed after a bad reload ({why})"
        );
        assert!(trust_has(&f, "coordinator:main/session"));
    }
    std::fs::write(&reg, &good).unwrap();

    // Revoking h1: its live session closes at once, and its hellos are refused, audited.
    let v = f
        .op(&OperatorRequest::TrustRevoke {
            subject: format!("host:{h1}"),
            request_id: None,
        })
        .unwrap();
    assert_eq!(v["keys"].as_array().unwrap().len(), 2, "{v}");
    common::wait_until("the revoked host disconnected", || {
        let st = f.op(&OperatorRequest::Status).ok()?;
        (!st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| *h == format!("host:{h1}")))
        .then_some(())
    });
    let refused = format!("host:{h1}: session-refused");
    common::wait_until("a refused hello of the revoked host audited", || {
        (audit_count(&f, &refused) > 0).then_some(())
    });
    // The other host is untouched.
    f.wait_connected(&h0);
    // A restart keeps the revocation (it is in the database): h1's next hellos are refused
    // again — counted after the restart, so a host merely backing off proves nothing.
    f.coord[0].crash();
    let before = audit_count(&f, &refused);
    f.coord[0].start(None);
    f.wait_leading();
    f.wait_connected(&h0);
    common::wait_until("the revoked host refused again after the restart", || {
        (audit_count(&f, &refused) > before).then_some(())
    });
    let st = f.op(&OperatorRequest::Status).unwrap();
    assert!(
        !st["hosts_connected"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| *h == format!("host:{h1}")),
        "a revoked host reconnected after a restart: {st}"
    );
    // Refused: the coordinator itself, a malformed subject, an operator key id, a host
    // the registry does not know (a typo would otherwise be recorded for ever).
    for (s, cat) in [
        ("coordinator:main", Category::BadInput),
        ("lane:x", Category::BadInput),
        ("operator:ann/session", Category::BadInput),
        ("host:nobody-here", Category::NotFound),
    ] {
        let e = f
            .op(&OperatorRequest::TrustRevoke {
                subject: s.into(),
                request_id: None,
            })
            .unwrap_err();
        assert_eq!(e.category, cat, "{s}: {e}");
    }
    // What is revoked is its keys: enrolled again under new keys, h1 is back.
    f.sup[1].1.crash();
    let h = f.host_id(1);
    let out = f.dir.join(&h);
    enroll::enroll_host(&enroll::EnrollHost {
        dir: f.coord_dir(),
        host_id: h.clone(),
        addresses: f.listen.clone(),
        server_name: None,
        out: Some(out.clone()),
        install_dir: out.clone(),
        lanes: vec!["lane-1".into()],
        state_dir: out.join("state"),
        runtime_dir: out.join("run"),
        cgroup_root: Some(f.cgroup_root(1)),
        days: 30,
        force: true,
    })
    .unwrap();
    f.sup[1].1.start(None);
    f.wait_connected(&h1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_whose_own_key_its_registry_lacks_refuses_to_start_naming_it() {
    let mut f = Fleet::new(0);
    f.enroll(0);
    let h0 = f.host_id(0);
    // The host's bundle carries a registry without its keys: the supervisor refuses.
    let bundle_reg = f.dir.join(&h0).join("trust.toml");
    let coord_only: String = {
        let text = std::fs::read_to_string(&bundle_reg).unwrap();
        let doc: toml::Table = toml::from_str(&text).unwrap();
        let keys: Vec<toml::Value> = doc["key"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["principal"].as_str() == Some("coordinator:main"))
            .cloned()
            .collect();
        let mut t = toml::Table::new();
        t.insert("key".into(), toml::Value::Array(keys));
        toml::to_string(&t).unwrap()
    };
    std::fs::write(&bundle_reg, &coord_only).unwrap();
    f.sup[0].1.start(None);
    let st = common::wait_until("the supervisor exits", || f.sup[0].1.exited());
    assert!(!st.success());
    let log = f.sup[0].1.log_text();
    assert!(log.contains(&format!("host:{h0}/session")), "{log}");

    // The coordinator's registry without its own keys: it refuses to start, naming one.
    let reg = f.coord_dir().join("trust.toml");
    let text = std::fs::read_to_string(&reg).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let keys: Vec<toml::Value> = doc["key"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["key_id"].as_str() != Some("coordinator:main/ordinary"))
        .cloned()
        .collect();
    let mut t = toml::Table::new();
    t.insert("key".into(), toml::Value::Array(keys));
    std::fs::write(&reg, toml::to_string(&t).unwrap()).unwrap();
    let doctor = mosaic::doctor::coordinator(&f.coord_dir().join("coordinator.toml")).await;
    let check = doctor
        .checks
        .iter()
        .find(|c| c.name == "trust-registry")
        .unwrap();
    assert!(
        !check.ok && check.detail.contains("coordinator:main/ordinary"),
        "{check:?}"
    );
    f.coord[0].start(None);
    let st = common::wait_until("the coordinator exits", || f.coord[0].exited());
    assert!(!st.success());
    let log = f.coord[0].log_text();
    assert!(log.contains("coordinator:main/ordinary"), "{log}");
}

#[test]
fn operators_find_the_leader_and_a_refused_certificate_says_why() {
    let mut f = Fleet::new(1);
    f.enroll(0);
    enroll::enroll_operator(&f.coord_dir(), "ann", None, 30, false).unwrap();
    enroll::enroll_operator(&f.coord_dir(), "bob", None, 30, false).unwrap();
    f.coord[0].start(None);
    f.wait_leading();
    f.coord[1].start(None);
    // The standby alone is named: its not-leader answer names the leader, and the request
    // lands there.
    let standby = f.operator_target(1, "ann");
    let status = common::wait_until("the standby names the leader", || {
        let e = operator_request(
            &standby,
            &OperatorRequest::TrustRevoke {
                subject: "operator:nobody".into(),
                request_id: None,
            },
        )
        .err()?;
        (e.category == Category::NotLeader && e.leader.is_some()).then_some(e)
    });
    assert_eq!(
        status.leader.as_deref(),
        Some(format!("tls://{}", f.operator_addr[0]).as_str())
    );
    // A request only the leader carries out, sent to the standby alone.
    let v = operator_request_any(
        std::slice::from_ref(&standby),
        &OperatorRequest::TrustRevoke {
            subject: "operator:carol".into(),
            request_id: None,
        },
    )
    .unwrap();
    assert_eq!(v["revoked"]["subject"], "operator:carol", "{v}");

    // The socket from the environment or from the coordinator's config.
    for args in [
        vec!["lanes".to_string()],
        vec![
            "lanes".into(),
            "--config".into(),
            f.coord_dir().join("coordinator.toml").display().to_string(),
        ],
    ] {
        let out = std::process::Command::new(common::MOSAIC)
            .args(&args)
            .env(
                "MOSAIC_COORDINATOR_SOCKET",
                if args.len() == 1 {
                    f.socket()
                } else {
                    PathBuf::from("/nonexistent")
                },
            )
            .env_remove("MOSAIC_STATE_DIR")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A connection bob opened before his revocation is refused at its next request.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bob = f.operator_target(0, "bob");
    let OperatorTarget::Remote { addr, tls, .. } = &bob else {
        unreachable!()
    };
    let mut conn = rt.block_on(async {
        let cfg = mosaic::protocol::transport::client_tls(tls).unwrap();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let s = tokio_rustls::TlsConnector::from(cfg)
            .connect(name, tcp)
            .await
            .unwrap();
        tokio::io::BufReader::new(s)
    });
    type Conn = tokio::io::BufReader<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    let ask = |conn: &mut Conn| -> serde_json::Value {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        rt.block_on(async {
            let mut line = serde_json::to_vec(&OperatorRequest::Lanes).unwrap();
            line.push(b'\n');
            conn.get_mut().write_all(&line).await.unwrap();
            let mut out = String::new();
            conn.read_line(&mut out).await.unwrap();
            serde_json::from_str(&out).unwrap()
        })
    };
    assert_eq!(ask(&mut conn)["ok"], true);
    // Revoked through the leader; the standby applies it too.
    f.op(&OperatorRequest::TrustRevoke {
        subject: "operator:bob".into(),
        request_id: None,
    })
    .unwrap();
    let refused = ask(&mut conn);
    assert_eq!(refused["ok"], false, "{refused}");
    assert_eq!(refused["error"]["category"], "not-owner", "{refused}");
    drop(conn);
    common::wait_until("the standby applies the revocation", || {
        let t = operator_request(&standby, &OperatorRequest::Trust).ok()?;
        t["revoked"]
            .as_array()?
            .iter()
            .any(|s| s == "operator:bob")
            .then_some(())
    });
    // A revoked operator and a host's certificate are refused, each with its reason.
    let e = operator_request(&f.operator_target(0, "bob"), &OperatorRequest::Status).unwrap_err();
    assert_eq!(e.category, Category::NotOwner, "{e}");
    assert!(e.message.contains("operator:bob was revoked"), "{e}");
    let h0 = f.host_id(0);
    let host = OperatorTarget::Remote {
        addr: f.operator_addr[0].clone(),
        server_name: "127.0.0.1".into(),
        tls: mosaic::protocol::transport::TlsIdentity {
            ca: f.dir.join(&h0).join("pki/ca.pem"),
            cert: f.dir.join(&h0).join(format!("pki/host-{h0}.pem")),
            key: f.dir.join(&h0).join(format!("pki/host-{h0}-key.pem")),
        },
    };
    let e = operator_request(&host, &OperatorRequest::Status).unwrap_err();
    assert_eq!(e.category, Category::NotOwner, "{e}");
    assert!(
        e.message
            .contains(&format!("names host:{h0}, not an operator")),
        "{e}"
    );
    // ann is still served.
    operator_request(&f.operator_target(0, "ann"), &OperatorRequest::Lanes).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn db_init_is_idempotent_and_refuses_bad_names() {
    let server = pg::server();
    let name = format!(
        "dbinit_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    let admin = server.url("postgres");
    let a = mosaic::coordinator::store::init_database(&admin, "mosaic", &name, None)
        .await
        .unwrap();
    assert_eq!(a["created_database"], true);
    let b = mosaic::coordinator::store::init_database(&admin, "mosaic", &name, None)
        .await
        .unwrap();
    assert_eq!(b["created_database"], false);
    assert_eq!(b["created_role"], false);
    let e = mosaic::coordinator::store::init_database(&admin, "mosaic", "bad\"name", None)
        .await
        .unwrap_err();
    assert_eq!(e.operator_category(), Category::BadInput, "{e}");
    // A password reaches the server as a SCRAM verifier only.
    let role = format!("r_{}", &name[7..]);
    let secret = "s3cret'quote";
    mosaic::coordinator::store::init_database(&admin, &role, &name, Some(secret))
        .await
        .unwrap();
    let (c, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let stored: String = c
        .query_one(
            "SELECT rolpassword FROM pg_authid WHERE rolname = $1",
            &[&role],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        stored.starts_with("SCRAM-SHA-256$") && !stored.contains(secret),
        "{stored}"
    );
    server.psql("postgres", &format!("DROP DATABASE \"{name}\""));
    server.psql("postgres", &format!("DROP ROLE \"{role}\""));
}

fn init_at(dir: &Path, force: bool) -> serde_json::Value {
    enroll::init_coordinator(&enroll::InitCoordinator {
        dir: dir.into(),
        name: "main".into(),
        trust_domain: "t.test".into(),
        names: mosaic::pki::ServerNames {
            dns: vec!["coord.example".into()],
            ips: vec![],
        },
        listen: "127.0.0.1:1".into(),
        database_url: "host=/run/postgresql dbname=m user=m password=secret".into(),
        operator_socket: dir.join("op.sock"),
        operator_listen: None,
        advertise_operator: None,
        state_dir: dir.join("state"),
        days: 30,
        force,
    })
    .unwrap()
}

#[test]
fn a_coordinator_directory_a_standby_and_a_rotation_keep_what_the_fleet_relies_on() {
    let tmp = std::env::temp_dir().join(format!("mosaic-enroll-{}", uuid::Uuid::new_v4().simple()));
    let d = tmp.join("coord");
    init_at(&d, false);
    // Its config may hold a database password: readable by its owner only.
    let mode = std::fs::metadata(d.join("coordinator.toml"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Again without --force: refused, nothing replaced.
    assert!(matches!(
        enroll::init_coordinator(&enroll::InitCoordinator {
            dir: d.clone(),
            name: "main".into(),
            trust_domain: "t.test".into(),
            names: mosaic::pki::ServerNames::default(),
            listen: "x:1".into(),
            database_url: String::new(),
            operator_socket: d.join("op.sock"),
            operator_listen: None,
            advertise_operator: None,
            state_dir: d.join("state"),
            days: 30,
            force: false,
        }),
        Err(enroll::EnrollError::Exists(_))
    ));
    let h = enroll::enroll_host(&enroll::EnrollHost {
        dir: d.clone(),
        host_id: "h1".into(),
        addresses: vec!["coord.example:7443".into()],
        server_name: None,
        out: None,
        install_dir: "/etc/mosaic".into(),
        lanes: vec!["lane-1".into()],
        state_dir: "/var/lib/mosaic".into(),
        runtime_dir: "/run/mosaic".into(),
        cgroup_root: None,
        days: 30,
        force: false,
    })
    .unwrap();
    let bundle = PathBuf::from(h["bundle"].as_str().unwrap());
    assert!(
        !bundle.join("pki/ca-key.pem").exists(),
        "the CA key left its directory"
    );
    let sup = std::fs::read_to_string(bundle.join("supervisor.toml")).unwrap();
    assert!(sup.contains("server_name = \"coord.example\""), "{sup}");
    // A standby's certificate names the leader's names too (hosts check one name).
    let s = tmp.join("standby");
    enroll::init_standby(&enroll::InitStandby {
        dir: s.clone(),
        leader_dir: d.clone(),
        names: mosaic::pki::ServerNames {
            dns: vec!["standby.example".into()],
            ips: vec![],
        },
        listen: "127.0.0.1:2".into(),
        operator_socket: s.join("op.sock"),
        operator_listen: None,
        advertise_operator: None,
        state_dir: s.join("state"),
        days: 30,
        force: false,
    })
    .unwrap();
    let (_, standby) = enroll::coordinator_of(&s).unwrap();
    let (dns, _) =
        mosaic::pki::server_names_of(&std::fs::read_to_string(&standby.cert).unwrap()).unwrap();
    for n in ["coord.example", "standby.example"] {
        assert!(dns.iter().any(|d| d == n), "{n} missing from {dns:?}");
    }
    // A rotation (--force) keeps the secret and whom the keys address.
    let secret = std::fs::read(d.join("keys/coordinator-secret")).unwrap();
    let before = std::fs::read_to_string(d.join("keys/coordinator-session")).unwrap();
    init_at(&d, true);
    assert_eq!(
        std::fs::read(d.join("keys/coordinator-secret")).unwrap(),
        secret
    );
    assert_ne!(
        std::fs::read_to_string(d.join("keys/coordinator-session")).unwrap(),
        before
    );
    let reg = mosaic::protocol::TrustRegistry::from_toml(
        &std::fs::read_to_string(d.join("trust.toml")).unwrap(),
    )
    .unwrap();
    for k in reg.entries().filter(|e| e.principal == "coordinator:main") {
        assert!(k.audiences.contains("host:h1"), "{} lost host:h1", k.key_id);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
