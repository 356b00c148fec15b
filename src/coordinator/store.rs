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
use super::secret::CoordinatorSecret;

/// Migrations, in order; index + 1 is the schema version.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/0001_authority.sql"),
    include_str!("../../migrations/0002_chains_as_rows.sql"),
    include_str!("../../migrations/0003_host_sessions.sql"),
];
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

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
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

/// Parses a database URL or key=value string and adds the session bounds.
fn config(url: &str) -> Result<tokio_postgres::Config, AuthorityError> {
    let mut cfg: tokio_postgres::Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| AuthorityError::Db(format!("bad database url: {e}")))?;
    let opts = match cfg.get_options() {
        Some(o) if !o.is_empty() => format!("{o} {SESSION_OPTIONS}"),
        _ => SESSION_OPTIONS.to_string(),
    };
    cfg.options(&opts);
    cfg.application_name("mosaic-coordinator");
    Ok(cfg)
}

impl Store {
    /// Connects (libpq-style string or URL). Verifies the server is a primary. Must be
    /// called inside a tokio runtime (it starts the audit writer).
    pub async fn connect(url: &str, secret: CoordinatorSecret) -> Result<Self, AuthorityError> {
        let cfg = config(url)?;
        let mgr = Manager::from_config(
            cfg.clone(),
            NoTls,
            ManagerConfig {
                // Verified: a connection whose backend died mid-transaction (crash, failover,
                // pg_terminate_backend) is never handed out again.
                recycling_method: RecyclingMethod::Verified,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(32)
            .build()
            .map_err(|e| AuthorityError::Internal(e.to_string()))?;
        let s = Self {
            audit: Auditor::start(pool.clone()),
            pool,
            secret,
            config: cfg,
        };
        s.require_primary().await?;
        Ok(s)
    }

    /// A connection of its own, outside the pool: for the leadership renewal, which no
    /// amount of other load may starve.
    pub(crate) async fn dedicated(&self) -> Result<tokio_postgres::Client, AuthorityError> {
        let (client, conn) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "dedicated database connection ended");
            }
        });
        Ok(client)
    }

    /// Authority refuses to run on a standby.
    pub async fn require_primary(&self) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        let standby: bool = c.query_one("SELECT pg_is_in_recovery()", &[]).await?.get(0);
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
        let exists: bool = tx
            .query_one(
                "SELECT to_regclass('public.mosaic_schema') IS NOT NULL",
                &[],
            )
            .await?
            .get(0);
        let current: i32 = if exists {
            tx.query_one("SELECT version FROM mosaic_schema", &[])
                .await?
                .get(0)
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
        Ok(c.query_one("SELECT sot_incarnation FROM sot", &[])
            .await?
            .get(0))
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
        Ok(c.query(
            "SELECT id, mosaic_ts(at), operation, category, coordinator_epoch, assignment_id, lane_incarnation_id, detail \
             FROM audit WHERE id > $1 ORDER BY id LIMIT 10000",
            &[&since],
        )
        .await?
        .iter()
        .map(|r| AuditRow {
            id: r.get(0),
            at: r.get(1),
            operation: r.get(2),
            category: r.get(3),
            coordinator_epoch: r.get(4),
            assignment_id: r.get(5),
            lane_incarnation_id: r.get(6),
            detail: r.get(7),
        })
        .collect())
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
