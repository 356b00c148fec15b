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

impl Server {
    /// The Unix socket of the harness cluster (`None` for an external server).
    pub fn socket_path(&self) -> Option<PathBuf> {
        let c = self.cluster.as_ref()?;
        Some(c.socket_dir().join(format!(".s.PGSQL.{}", c.port())))
    }
}

/// A TCP proxy in front of the harness cluster that can make one commit ambiguous: once
/// armed, it forwards the next `COMMIT` to the server, swallows the server's answer and
/// drops the connection — the client cannot know whether its transaction committed.
pub struct CommitDropper {
    pub port: u16,
    pub armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CommitDropper {
    pub async fn start() -> Self {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let unix = server()
            .socket_path()
            .expect("the commit-dropping proxy needs the harness-managed cluster");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (a, d) = (armed.clone(), dropped.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(pg) = tokio::net::UnixStream::connect(&unix).await else {
                    continue;
                };
                let (a, d) = (a.clone(), d.clone());
                tokio::spawn(async move {
                    let (mut cr, mut cw) = tcp.into_split();
                    let (mut sr, mut sw) = pg.into_split();
                    let blackhole = Arc::new(AtomicBool::new(false));
                    let b2 = blackhole.clone();
                    let up = tokio::spawn(async move {
                        let mut buf = vec![0u8; 65536];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let commit = b"Q\0\0\0\x0bCOMMIT\0";
                            let is_commit = buf[..n].windows(commit.len()).any(|w| w == commit);
                            if is_commit && a.swap(false, Ordering::SeqCst) {
                                b2.store(true, Ordering::SeqCst);
                                d.fetch_add(1, Ordering::SeqCst);
                                let _ = sw.write_all(&buf[..n]).await;
                                // Let the server commit before the connection dies.
                                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                                return; // drops both halves: the client sees a dead connection
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                    let down = tokio::spawn(async move {
                        let mut buf = vec![0u8; 65536];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if blackhole.load(Ordering::SeqCst) {
                                return;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                    let _ = up.await;
                    down.abort();
                });
            }
        });
        Self {
            port,
            armed,
            dropped,
        }
    }

    /// A connection string for `db` through this proxy.
    pub fn url(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }
}
