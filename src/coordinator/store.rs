//! The PostgreSQL store: connection pool, migrations, the timeline, and the audit log.
//!
//! **Owns:** schema versioning (refuses a schema newer than it knows), the standby check,
//! and out-of-band audit writes for rejections.
//!
//! **Never:** decides anything with a host clock; every time in a decision comes from
//! `clock_timestamp()` on the primary inside the deciding statement.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use super::error::{AuthorityError, Category};
use super::secret::CoordinatorSecret;

/// Migrations, in order; index + 1 is the schema version.
const MIGRATIONS: &[&str] = &[include_str!("../../migrations/0001_authority.sql")];
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

#[derive(Clone)]
pub struct Store {
    pub(crate) pool: Pool,
    pub(crate) secret: CoordinatorSecret,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

impl Store {
    /// Connects (libpq-style string or URL). Verifies the server is a primary.
    pub async fn connect(url: &str, secret: CoordinatorSecret) -> Result<Self, AuthorityError> {
        let cfg: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
            AuthorityError::Db(format!("bad database url: {e}"))
        })?;
        let mgr = Manager::from_config(
            cfg,
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
            .map_err(|e| AuthorityError::Db(e.to_string()))?;
        let s = Self { pool, secret };
        s.require_primary().await?;
        Ok(s)
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

    /// Records a rejection. Outside the rejected transaction, so the refusal itself is
    /// never rolled back; carries only ids and a category.
    pub async fn audit(
        &self,
        op: &str,
        category: Category,
        epoch: Option<i64>,
        assignment: Option<&str>,
        lane_incarnation: Option<&str>,
        detail: &str,
    ) {
        let res = async {
            let c = self.pool.get().await?;
            c.execute(
                "INSERT INTO audit (operation, category, coordinator_epoch, assignment_id, lane_incarnation_id, detail) VALUES ($1, $2, $3, $4, $5, $6)",
                &[&op, &category.as_str(), &epoch, &assignment, &lane_incarnation, &detail],
            )
            .await?;
            Ok::<(), AuthorityError>(())
        }
        .await;
        if let Err(e) = res {
            tracing::error!(op, category = category.as_str(), error = %e, "cannot write audit record");
        }
    }

    /// Audit rows, newest last (operators and tests).
    pub async fn audit_log(&self) -> Result<Vec<(String, String, String)>, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.query(
            "SELECT operation, category, detail FROM audit ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
    }
}
