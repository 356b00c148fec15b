//! The PostgreSQL store: connection pool, migrations, the timeline, and the audit writer.
//!
//! **Owns:** schema versioning (refuses a schema newer than it knows), the standby check,
//! the per-connection safety settings, and the audit writer (`audit.rs`).
//!
//! **Never:** decides anything with a host clock; every time in a decision comes from
//! `clock_timestamp()` on the primary inside the deciding statement or at COMMIT.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use super::audit::Auditor;
use super::error::AuthorityError;
use super::rows::RowExt;
use super::secret::CoordinatorSecret;

/// Migrations, in order; index + 1 is the schema version.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/0001_authority.sql"),
    include_str!("../../migrations/0002_chains_as_rows.sql"),
    include_str!("../../migrations/0003_host_sessions.sql"),
    include_str!("../../migrations/0004_quarantine_counts.sql"),
    include_str!("../../migrations/0005_lane_activity_index.sql"),
    include_str!("../../migrations/0006_work_record.sql"),
    include_str!("../../migrations/0007_handoff.sql"),
    include_str!("../../migrations/0008_continuations.sql"),
    include_str!("../../migrations/0009_continuity_closure.sql"),
    include_str!("../../migrations/0010_trigger_decisions_audited.sql"),
    include_str!("../../migrations/0011_reservation_epoch_moves.sql"),
    include_str!("../../migrations/0012_audit_spool.sql"),
    include_str!("../../migrations/0013_operator_requests.sql"),
    include_str!("../../migrations/0014_effect_claims.sql"),
    include_str!("../../migrations/0015_repositories.sql"),
    include_str!("../../migrations/0016_trust_revocations.sql"),
    include_str!("../../migrations/0017_checkpoint_store.sql"),
    include_str!("../../migrations/0018_handoff_checkpoints.sql"),
    include_str!("../../migrations/0019_repository_setup.sql"),
    include_str!("../../migrations/0020_checkpoint_grants.sql"),
    include_str!("../../migrations/0021_checkpoint_retention.sql"),
    include_str!("../../migrations/0022_requested_checkpoints.sql"),
    include_str!("../../migrations/0023_workspace_releases.sql"),
    include_str!("../../migrations/0024_checkpoint_reads.sql"),
    include_str!("../../migrations/0025_restore_binding.sql"),
    include_str!("../../migrations/0026_harness_artifacts.sql"),
    include_str!("../../migrations/0027_workspace_effects.sql"),
    include_str!("../../migrations/0028_placement.sql"),
    include_str!("../../migrations/0029_lane_leases.sql"),
    include_str!("../../migrations/0030_lane_lease_close.sql"),
    include_str!("../../migrations/0031_recovery_candidates.sql"),
    include_str!("../../migrations/0032_placement_elastic.sql"),
    include_str!("../../migrations/0033_unreconciled_receipts.sql"),
    include_str!("../../migrations/0034_notifications.sql"),
    include_str!("../../migrations/0035_blocked_until.sql"),
    include_str!("../../migrations/0036_budget_exhausted_notice.sql"),
    include_str!("../../migrations/0037_chain_reads_by_key.sql"),
    include_str!("../../migrations/0038_receipts_by_assignment.sql"),
    include_str!("../../migrations/0039_checkpoint_debt.sql"),
];
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_both_url_forms() {
        let (rest, mode, root) =
            take_tls_params("postgres://u@db.example:5432/m?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x");
        assert_eq!(rest, "postgres://u@db.example:5432/m?application_name=x");
        assert_eq!(
            (mode.as_deref(), root.as_deref()),
            (Some("verify-full"), Some("/ca.pem"))
        );
        let (rest, mode, root) = take_tls_params("host=db.example user=u sslmode=disable dbname=m");
        assert_eq!(rest, "host=db.example user=u dbname=m");
        assert_eq!((mode.as_deref(), root), (Some("disable"), None));
    }

    #[test]
    fn a_remote_database_needs_verified_tls_or_an_explicit_exception() {
        let refused = |url: &str| config(url, false).err().map(|e| e.to_string());
        assert!(refused("host=db.example user=u dbname=m").is_some());
        assert!(refused("postgres://u@db.example/m?sslmode=prefer").is_some());
        assert!(refused("postgres://u@db.example/m?sslmode=require").is_some());
        assert!(refused("postgres://u@db.example/m?sslmode=verify-ca&sslrootcert=/x").is_some());
        assert!(
            refused("postgres://u@db.example/m?sslmode=verify-full").is_some(),
            "no CA file"
        );
        assert!(refused("postgres://u@db.example/m?sslmode=bogus").is_some());
        // Local sockets and loopback need no TLS; the operator may accept a plain remote.
        assert!(config("host=/run/postgresql user=u dbname=m", false).is_ok());
        assert!(config("postgres://u@127.0.0.1/m", false).is_ok());
        assert!(config("host=db.example user=u dbname=m", true).is_ok());
    }
}

/// Server-side bounds on every coordinator connection: a statement or an idle transaction
/// that hangs (a stuck lock, a client gone mid-transaction) is ended by the server, so it
/// cannot hold rows — or the leadership — hostage.
const SESSION_OPTIONS: &str =
    "-c statement_timeout=10000 -c idle_in_transaction_session_timeout=15000 -c lock_timeout=10000 -c plan_cache_mode=force_generic_plan";

#[derive(Clone)]
pub struct Store {
    pub(crate) pool: Pool,
    pub(crate) secret: CoordinatorSecret,
    pub(crate) audit: Auditor,
    config: tokio_postgres::Config,
    transport: Transport,
    pub(crate) stats: std::sync::Arc<super::metrics::TransitionMetrics>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

/// How the coordinator reaches its database: plain (a local socket or loopback, or a
/// remote server the operator explicitly allowed without TLS) or TLS that verifies the
/// server's certificate chain *and* name against a CA file (`sslmode=verify-full`).
#[derive(Clone)]
enum Transport {
    Plain,
    Tls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// Splits `sslmode` and `sslrootcert` out of a URL (`postgres://…?sslmode=…`) or a
/// key=value string; returns the rest for tokio-postgres to parse.
fn take_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    let mut take = |k: &str, v: &str| match k {
        "sslmode" => {
            mode = Some(v.to_string());
            true
        }
        "sslrootcert" => {
            root = Some(v.to_string());
            true
        }
        _ => false,
    };
    if url.contains("://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_string(), None, None);
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                !take(k, v)
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        (rest, mode, root)
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                !take(k, v)
            })
            .collect();
        (kept.join(" "), mode, root)
    }
}

/// Whether every host of `cfg` is this machine (a Unix socket or a loopback address).
fn is_local(cfg: &tokio_postgres::Config) -> bool {
    use tokio_postgres::config::Host;
    !cfg.get_hosts().is_empty()
        && cfg.get_hosts().iter().all(|h| match h {
            Host::Unix(_) => true,
            Host::Tcp(name) => matches!(name.as_str(), "localhost" | "127.0.0.1" | "::1"),
        })
        && cfg.get_hostaddrs().iter().all(|a| a.is_loopback())
}

/// The client TLS configuration that trusts only the CA certificates in `path`.
fn verify_full(path: &str) -> Result<rustls::ClientConfig, AuthorityError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let bad = |e: &dyn std::fmt::Display| AuthorityError::RootCert {
        path: path.to_string(),
        detail: e.to_string(),
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(path).map_err(|e| bad(&e))? {
        roots.add(c.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
    }
    if roots.is_empty() {
        return Err(bad(&"no certificate in the file"));
    }
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| bad(&e))
    .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

/// Parses a database URL or key=value string, decides its transport, and adds the session
/// bounds. TLS is `sslmode=verify-full` with `sslrootcert=FILE`; a server that is not on
/// this machine is refused without it, unless `allow_insecure` (the operator's explicit
/// choice). `require`/`verify-ca` — TLS that would accept an impostor's certificate — are
/// refused outright.
fn config(
    url: &str,
    allow_insecure: bool,
) -> Result<(tokio_postgres::Config, Transport), AuthorityError> {
    let (rest, mode, root) = take_tls_params(url);
    let mut cfg: tokio_postgres::Config = rest
        .parse()
        .map_err(|e: tokio_postgres::Error| AuthorityError::BadDatabaseUrl(e.to_string()))?;
    let transport = match mode.as_deref() {
        Some("verify-full") => {
            let root = root.ok_or_else(|| {
                AuthorityError::BadDatabaseUrl(
                    "sslmode=verify-full needs sslrootcert=FILE (the CA that signed the server's certificate)".into(),
                )
            })?;
            cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
            Transport::Tls(tokio_postgres_rustls::MakeRustlsConnect::new(verify_full(
                &root,
            )?))
        }
        Some(m @ ("require" | "verify-ca")) => {
            return Err(AuthorityError::BadDatabaseUrl(format!(
                "sslmode={m} accepts a server certificate without checking whose it is; use sslmode=verify-full with sslrootcert=FILE"
            )))
        }
        None | Some("disable" | "allow" | "prefer") => {
            if !is_local(&cfg) && !allow_insecure {
                return Err(AuthorityError::BadDatabaseUrl(
                    "the database is not on this machine and the URL does not ask for TLS: add sslmode=verify-full&sslrootcert=FILE, or set allow_insecure_database = true to accept a plain connection".into(),
                ));
            }
            cfg.ssl_mode(tokio_postgres::config::SslMode::Disable);
            Transport::Plain
        }
        Some(other) => {
            return Err(AuthorityError::BadDatabaseUrl(format!(
                "unknown sslmode {other:?}"
            )));
        }
    };
    let opts = match cfg.get_options() {
        Some(o) if !o.is_empty() => format!("{o} {SESSION_OPTIONS}"),
        _ => SESSION_OPTIONS.to_string(),
    };
    cfg.options(&opts);
    cfg.application_name("mosaic-coordinator");
    Ok((cfg, transport))
}

impl Store {
    /// Connects (libpq-style string or URL). Verifies the server is a primary. Must be
    /// called inside a tokio runtime (it starts the audit writer).
    pub async fn connect(url: &str, secret: CoordinatorSecret) -> Result<Self, AuthorityError> {
        Self::connect_with(url, false, secret).await
    }

    /// Like [`Store::connect`]; `allow_insecure` accepts a plain connection to a database
    /// on another machine (see `config`).
    pub async fn connect_with(
        url: &str,
        allow_insecure: bool,
        secret: CoordinatorSecret,
    ) -> Result<Self, AuthorityError> {
        let (cfg, transport) = config(url, allow_insecure)?;
        let mc = ManagerConfig {
            // Verified: a connection whose backend died mid-transaction (crash, failover,
            // pg_terminate_backend) is never handed out again.
            recycling_method: RecyclingMethod::Verified,
        };
        let mgr = match &transport {
            Transport::Plain => Manager::from_config(cfg.clone(), NoTls, mc),
            Transport::Tls(t) => Manager::from_config(cfg.clone(), t.clone(), mc),
        };
        let pool =
            Pool::builder(mgr)
                .max_size(32)
                .build()
                .map_err(|e| AuthorityError::Invariant {
                    op: "connection pool",
                    detail: e.to_string(),
                })?;
        let s = Self {
            audit: Auditor::start(pool.clone()),
            pool,
            secret,
            config: cfg,
            transport,
            stats: std::sync::Arc::new(super::metrics::TransitionMetrics::new()),
        };
        s.require_primary().await?;
        Ok(s)
    }

    /// A connection of its own, outside the pool: for the leadership renewal, which no
    /// amount of other load may starve.
    pub(crate) async fn dedicated(&self) -> Result<tokio_postgres::Client, AuthorityError> {
        fn drive<F>(conn: F)
        where
            F: std::future::Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
        {
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "dedicated database connection ended");
                }
            });
        }
        match &self.transport {
            Transport::Plain => {
                let (client, conn) = self.config.connect(NoTls).await?;
                drive(conn);
                Ok(client)
            }
            Transport::Tls(t) => {
                let (client, conn) = self.config.connect(t.clone()).await?;
                drive(conn);
                Ok(client)
            }
        }
    }

    /// Authority refuses to run on a standby.
    pub async fn require_primary(&self) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        let standby: bool = c
            .query_one("SELECT pg_is_in_recovery() AS standby", &[])
            .await?
            .col("standby")?;
        if standby {
            return Err(AuthorityError::Standby);
        }
        Ok(())
    }

    /// Applies pending migrations in one transaction; refuses a newer schema.
    pub async fn migrate(&self) -> Result<i32, AuthorityError> {
        self.require_primary().await?;
        let mut c = self.pool.get().await?;
        let tx = c.transaction().await?;
        // Serialize concurrent migrators.
        tx.execute("SELECT pg_advisory_xact_lock(727332001)", &[])
            .await?;
        // A migration may build an index over a table as long as the fleet's history: the
        // pool's 10 s statement timeout would roll every attempt back and keep the
        // coordinator from starting on a large database. The lock timeout stays: a
        // migration that cannot get its locks fails loudly and is retried at the next start.
        tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
        let exists: bool = tx
            .query_one(
                "SELECT to_regclass('public.mosaic_schema') IS NOT NULL AS present",
                &[],
            )
            .await?
            .col("present")?;
        let current: i32 = if exists {
            tx.query_one("SELECT version FROM mosaic_schema", &[])
                .await?
                .col("version")?
        } else {
            0
        };
        if current > SCHEMA_VERSION {
            return Err(AuthorityError::SchemaTooNew {
                found: current,
                known: SCHEMA_VERSION,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
            tx.batch_execute(sql).await?;
            let v = i as i32 + 1;
            tx.execute(
                "INSERT INTO mosaic_schema (version) VALUES ($1) ON CONFLICT (singleton) DO UPDATE SET version = $1",
                &[&v],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(SCHEMA_VERSION)
    }

    /// The current authority timeline, created (genesis) if the database has none. A full
    /// externally anchored genesis (spec §19.1, `mosaic bootstrap`) is not built yet.
    pub async fn ensure_sot(&self) -> Result<String, AuthorityError> {
        let c = self.pool.get().await?;
        let fresh = format!("sot-{}", uuid::Uuid::new_v4().simple());
        c.execute(
            "INSERT INTO sot (sot_incarnation) VALUES ($1) ON CONFLICT (singleton) DO NOTHING",
            &[&fresh],
        )
        .await?;
        c.query_one("SELECT sot_incarnation FROM sot", &[])
            .await?
            .col("sot_incarnation")
    }

    /// The audit writer (refusals are recorded through it, never inline).
    pub fn auditor(&self) -> &Auditor {
        &self.audit
    }

    /// Audit rows with id greater than `since` (all when 0), oldest first, after flushing
    /// what is queued.
    pub async fn audit_log(&self, since: i64) -> Result<Vec<AuditRow>, AuthorityError> {
        self.audit.flush().await;
        let c = self.pool.get().await?;
        c.query(
            "SELECT id, mosaic_ts(at) AS at, operation, category, coordinator_epoch, assignment_id, lane_incarnation_id, detail \
             FROM audit WHERE id > $1 ORDER BY id LIMIT 10000",
            &[&since],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(AuditRow {
                id: r.col("id")?,
                at: r.col("at")?,
                operation: r.col("operation")?,
                category: r.col("category")?,
                coordinator_epoch: r.col("coordinator_epoch")?,
                assignment_id: r.col("assignment_id")?,
                lane_incarnation_id: r.col("lane_incarnation_id")?,
                detail: r.col("detail")?,
            })
        })
        .collect()
    }
}

/// One audit row, as operators see it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AuditRow {
    pub id: i64,
    pub at: String,
    pub operation: String,
    pub category: String,
    pub coordinator_epoch: Option<i64>,
    pub assignment_id: Option<String>,
    pub lane_incarnation_id: Option<String>,
    pub detail: String,
}

/// `mosaic db init`: the coordinator's role (LOGIN; with `password` for a coordinator on
/// another machine) and its database, owned by it — each made only if missing, so running
/// it again changes nothing but a given password. Connects with an administrator's URL,
/// over the local socket or the network without TLS: run it on the database's machine.
pub async fn init_database(
    admin_url: &str,
    role: &str,
    database: &str,
    password: Option<&str>,
) -> Result<serde_json::Value, AuthorityError> {
    let ident_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.as_bytes()[0].is_ascii_lowercase()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    for (what, v) in [("role", role), ("database", database)] {
        if !ident_ok(v) {
            return Err(super::error::reject(
                "db-init",
                super::error::Category::BadInput,
                format!("{what} {v:?}: use 1-63 of a-z, 0-9, _ (starting with a letter)"),
            ));
        }
    }
    let (c, conn) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(conn);
    // The server is given a SCRAM verifier, never the password: nothing it logs or shows
    // (statement logs, pg_stat_statements) holds the password itself. The verifier is
    // base64 and `$`-separated: nothing in it needs quoting.
    let verifier = |p: &str| postgres_protocol::password::scram_sha_256(p.as_bytes());
    let role_exists = c
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
        .await?
        .is_some();
    if !role_exists {
        c.batch_execute(&format!("CREATE ROLE \"{role}\" LOGIN"))
            .await?;
    }
    if let Some(p) = password {
        c.batch_execute(&format!(
            "ALTER ROLE \"{role}\" LOGIN PASSWORD '{}'",
            verifier(p)
        ))
        .await?;
    }
    let db_exists = c
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&database])
        .await?
        .is_some();
    if !db_exists {
        c.batch_execute(&format!("CREATE DATABASE \"{database}\" OWNER \"{role}\""))
            .await?;
    }
    drop(c);
    let _ = conn.await;
    Ok(serde_json::json!({
        "role": role,
        "database": database,
        "created_role": !role_exists,
        "created_database": !db_exists,
        "password_set": password.is_some(),
        "database_url": format!("dbname={database} user={role}"),
        "next": "add host=… (and, from another machine, password, sslmode=verify-full, sslrootcert=…) to database_url; the coordinator migrates the schema when it starts",
    }))
}

impl Store {
    /// `mosaic doctor --coordinator-config`: the server is a writable primary, and the
    /// schema version it holds (0: none yet; the coordinator migrates it when it starts).
    pub async fn schema_found(&self) -> Result<i32, AuthorityError> {
        self.require_primary().await?;
        let c = self.pool.get().await?;
        let exists: bool = c
            .query_one(
                "SELECT to_regclass('public.mosaic_schema') IS NOT NULL AS present",
                &[],
            )
            .await?
            .col("present")?;
        if !exists {
            return Ok(0);
        }
        c.query_one("SELECT version FROM mosaic_schema", &[])
            .await?
            .col("version")
    }
}
