//! PostgreSQL for tests: one throwaway cluster per test binary (started from the local
//! server binaries, as the `postgres` user when root), one database per test, everything
//! removed at the end. `MOSAIC_TEST_DATABASE_URL` points the suite at an existing server
//! instead (databases are still created and dropped per test).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use mosaic::pgcluster::{Cluster, Durability};

pub struct Server {
    cluster: Option<Cluster>,
    dir: Option<PathBuf>,
    external: Option<String>,
}

static SERVER: OnceLock<Server> = OnceLock::new();

extern "C" fn stop_cluster() {
    if let Some(s) = SERVER.get() {
        if let Some(c) = &s.cluster {
            let _ = c.stop();
        }
        if let Some(d) = &s.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

pub fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        if let Ok(url) = std::env::var("MOSAIC_TEST_DATABASE_URL") {
            return Server {
                cluster: None,
                dir: None,
                external: Some(url),
            };
        }
        let dir = std::env::temp_dir().join(format!("mosaic-pg-{}", uuid::Uuid::new_v4().simple()));
        let c = Cluster::at(&dir).unwrap_or_else(|e| {
            panic!("these tests need PostgreSQL server binaries (scripts/test installs them): {e}")
        });
        c.init().unwrap_or_else(|e| panic!("initdb failed: {e}"));
        c.start(Durability::Throwaway)
            .unwrap_or_else(|e| panic!("starting PostgreSQL failed: {e}"));
        // SAFETY: registering a plain extern "C" function; it runs at process exit.
        unsafe { libc::atexit(stop_cluster) };
        Server {
            cluster: Some(c),
            dir: Some(dir),
            external: None,
        }
    })
}

impl Server {
    pub fn url(&self, db: &str) -> String {
        match (&self.cluster, &self.external) {
            (Some(c), _) => c.url(db),
            (None, Some(u)) if u.contains("://") => {
                let (base, query) = u
                    .split_once('?')
                    .map(|(a, b)| (a, Some(b)))
                    .unwrap_or((u.as_str(), None));
                let root = base.rsplit_once('/').map(|(a, _)| a).unwrap_or(base);
                match query {
                    Some(q) => format!("{root}/{db}?{q}"),
                    None => format!("{root}/{db}"),
                }
            }
            (None, Some(u)) => format!("{u} dbname={db}"),
            _ => unreachable!(),
        }
    }

    pub fn psql(&self, db: &str, sql: &str) {
        match &self.cluster {
            Some(c) => c.psql(db, sql).unwrap_or_else(|e| panic!("{sql}: {e}")),
            None => {
                let out = Command::new("psql")
                    .args([
                        "-X",
                        "-q",
                        "-v",
                        "ON_ERROR_STOP=1",
                        "-d",
                        &self.url(db),
                        "-c",
                        sql,
                    ])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{sql}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        match &self.cluster {
            Some(c) => c.bin(name),
            None => PathBuf::from(name),
        }
    }
}

/// A database of its own for one test, dropped on drop.
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    pub fn new() -> Self {
        let s = server();
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        s.psql("postgres", &format!("CREATE DATABASE {name}"));
        Self {
            url: s.url(&name),
            name,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            server().psql(
                "postgres",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            )
        });
    }
}

static STANDBY: OnceLock<Option<(Cluster, PathBuf)>> = OnceLock::new();

extern "C" fn stop_standby() {
    if let Some(Some((c, d))) = STANDBY.get() {
        let _ = c.stop();
        let _ = std::fs::remove_dir_all(d);
    }
}

impl Server {
    /// A streaming standby of the harness cluster (started once per test binary), or
    /// `None` when testing against an external server.
    pub fn standby_url(&self) -> Option<String> {
        let primary = self.cluster.as_ref()?;
        let s = STANDBY.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!(
                "mosaic-pg-standby-{}",
                uuid::Uuid::new_v4().simple()
            ));
            let mut c = Cluster::at(&dir).ok()?;
            c = c.with_port(5433);
            std::fs::create_dir_all(&dir).ok()?;
            c.init_dir().ok()?;
            c.base_backup_from(primary)
                .unwrap_or_else(|e| panic!("pg_basebackup: {e}"));
            c.start(Durability::Throwaway)
                .unwrap_or_else(|e| panic!("standby start: {e}"));
            // SAFETY: registering a plain extern "C" function; it runs at process exit.
            unsafe { libc::atexit(stop_standby) };
            Some((c, dir))
        });
        s.as_ref().map(|(c, _)| c.url("postgres"))
    }
}
