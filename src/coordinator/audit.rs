//! The audit log of refusals: bounded, batched, and never in the way of authority work.
//!
//! `record` never waits: rows go through a bounded queue to one writer task that inserts
//! them in batches on one pooled connection at a time. When the queue is full the row is
//! not dropped silently — it is counted per (operation, category), and the writer records
//! one "coalesced" row per pair. A flood of bad frames therefore costs a counter increment
//! each, and at most one small insert per batch window.
//!
//! When the database cannot take a batch (it is down, restarting, unreachable), the rows
//! are not dropped: with a spool set (`spool_to`, the coordinator's `state_dir`) they are
//! appended to a file and fsync'd, each with the time it was recorded (this process's
//! clock) and a spool id, and written again — with that time — once the database answers;
//! the spool id (unique in `audit`) makes a replay cut short by a crash write none twice.
//! The spool is bounded (`SPOOL_MAX` rows): the oldest are kept, later ones counted and
//! recorded as one row saying how many were lost.
//!
//! **Never:** blocks the caller, holds more than one database connection, or records
//! anything but identifiers, categories and fixed prose (no payloads, no secrets).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};

use super::error::Category;

const QUEUE: usize = 1024;
const BATCH: usize = 256;
const WINDOW: Duration = Duration::from_millis(50);
/// Rows the spool holds at most while the database is unreachable.
pub const SPOOL_MAX: usize = 10_000;
/// How often a non-empty spool is tried against the database.
const SPOOL_RETRY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Row {
    op: String,
    category: String,
    epoch: Option<i64>,
    assignment: Option<String>,
    lane_incarnation: Option<String>,
    detail: String,
    /// When it was recorded, by this process's clock (RFC 3339); used as its time only
    /// when it is written late, from the spool.
    recorded_at: String,
    /// Set once it is spooled.
    #[serde(default)]
    spool_id: Option<String>,
}

/// Where rows wait while the database is unreachable.
#[derive(Debug, Default)]
struct Spool {
    path: Option<std::path::PathBuf>,
    /// Rows in the file (read at `spool_to`, then counted).
    rows: usize,
    /// Rows that did not fit, since the spool was last written out.
    overflow: u64,
}

enum Msg {
    Row(Row),
    Flush(oneshot::Sender<()>),
}

/// Handle to the audit writer. Cheap to clone.
#[derive(Clone)]
pub struct Auditor {
    tx: mpsc::Sender<Msg>,
    coalesced: Arc<Mutex<BTreeMap<(String, &'static str), u64>>>,
    spool: Arc<Mutex<Spool>>,
}

impl std::fmt::Debug for Auditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auditor")
    }
}

impl Auditor {
    /// Starts the writer task on the current runtime.
    pub fn start(pool: Pool) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let coalesced = Arc::new(Mutex::new(BTreeMap::new()));
        let spool = Arc::new(Mutex::new(Spool::default()));
        tokio::spawn(writer(pool, rx, coalesced.clone(), spool.clone()));
        Self {
            tx,
            coalesced,
            spool,
        }
    }

    /// Spools rows the database cannot take to `path` (created 0600 if missing); rows a
    /// previous process left there are written once the database answers.
    pub fn spool_to(&self, path: std::path::PathBuf) -> Result<(), std::io::Error> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let rows = match std::fs::read_to_string(&path) {
            Ok(t) => t.lines().filter(|l| !l.trim().is_empty()).count(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        if rows > 0 {
            tracing::warn!(path = %path.display(), rows, "audit records spooled by an earlier process: written once the database answers");
        }
        if let Ok(mut s) = self.spool.lock() {
            s.path = Some(path);
            s.rows = rows;
        }
        Ok(())
    }

    /// Rows spooled and not yet written; rows lost to a full spool.
    pub fn spooled(&self) -> (usize, u64) {
        self.spool
            .lock()
            .map(|s| (s.rows, s.overflow))
            .unwrap_or((0, 0))
    }

    /// Records a refusal (identifiers and a category only). Never waits.
    pub fn record(
        &self,
        op: &str,
        category: Category,
        epoch: Option<i64>,
        assignment: Option<&str>,
        lane_incarnation: Option<&str>,
        detail: &str,
    ) {
        let row = Row {
            op: op.to_string(),
            category: category.as_str().to_string(),
            epoch,
            assignment: assignment.map(String::from),
            lane_incarnation: lane_incarnation.map(String::from),
            detail: detail.chars().take(500).collect(),
            recorded_at: crate::util::now_rfc3339(),
            spool_id: None,
        };
        if self.tx.try_send(Msg::Row(row)).is_err() {
            if let Ok(mut m) = self.coalesced.lock() {
                *m.entry((op.to_string(), category.as_str())).or_insert(0) += 1;
            }
        }
    }

    /// Waits until everything recorded so far is written (tests and `mosaic audit`).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

async fn writer(
    pool: Pool,
    mut rx: mpsc::Receiver<Msg>,
    coalesced: Arc<Mutex<BTreeMap<(String, &'static str), u64>>>,
    spool: Arc<Mutex<Spool>>,
) {
    let mut rows: Vec<Row> = Vec::new();
    let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        // Take what is queued, up to a batch, waiting at most one window for more; with
        // rows spooled, wake up to try them against the database anyway.
        let pending = spool
            .lock()
            .map(|s| s.rows > 0 || s.overflow > 0)
            .unwrap_or(false);
        let first = if pending {
            match tokio::time::timeout(SPOOL_RETRY, rx.recv()).await {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(_) => {
                    replay(&pool, &spool).await;
                    continue;
                }
            }
        } else {
            match rx.recv().await {
                Some(m) => m,
                None => return,
            }
        };
        let deadline = tokio::time::Instant::now() + WINDOW;
        let mut next = Some(first);
        while let Some(m) = next.take() {
            match m {
                Msg::Row(r) => rows.push(r),
                Msg::Flush(w) => waiters.push(w),
            }
            if rows.len() >= BATCH || !waiters.is_empty() {
                break;
            }
            next = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .ok()
                .flatten();
        }
        let counts = match coalesced.lock() {
            Ok(mut m) => std::mem::take(&mut *m),
            Err(_) => BTreeMap::new(),
        };
        for ((op, category), n) in counts {
            rows.push(Row {
                op,
                category: category.to_string(),
                epoch: None,
                assignment: None,
                lane_incarnation: None,
                detail: format!(
                    "coalesced: {n} more refusals of this kind while the audit queue was full"
                ),
                recorded_at: crate::util::now_rfc3339(),
                spool_id: None,
            });
        }
        // Spooled rows go first, so the log keeps its order.
        if spool.lock().map(|s| s.rows > 0).unwrap_or(false) {
            replay(&pool, &spool).await;
        }
        let spooling = spool.lock().map(|s| s.rows > 0).unwrap_or(false);
        let res = if spooling {
            Err("earlier records are still spooled".to_string())
        } else {
            insert(&pool, &rows).await.map_err(|e| e.to_string())
        };
        if let Err(e) = res {
            spool_rows(&spool, std::mem::take(&mut rows), &e);
        }
        rows.clear();
        for w in waiters.drain(..) {
            let _ = w.send(());
        }
    }
}

/// Appends `rows` to the spool (fsync'd) up to `SPOOL_MAX`; without a spool, or when the
/// write fails, they are lost and said to be.
fn spool_rows(spool: &Arc<Mutex<Spool>>, rows: Vec<Row>, why: &str) {
    if rows.is_empty() {
        return;
    }
    let Ok(mut s) = spool.lock() else { return };
    let Some(path) = s.path.clone() else {
        tracing::error!(
            rows = rows.len(),
            error = why,
            "cannot write audit records (no spool configured)"
        );
        return;
    };
    let room = SPOOL_MAX.saturating_sub(s.rows);
    let (kept, lost) = if rows.len() > room {
        let mut rows = rows;
        let lost = rows.split_off(room);
        (rows, lost.len() as u64)
    } else {
        (rows, 0)
    };
    let n = kept.len();
    let mut text = String::new();
    for mut r in kept {
        r.spool_id
            .get_or_insert_with(|| format!("sp-{}", uuid::Uuid::new_v4().simple()));
        if let Ok(line) = serde_json::to_string(&r) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    let written = (|| -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)?;
        let before = f.metadata()?.len();
        let r = f.write_all(text.as_bytes()).and_then(|()| f.sync_data());
        if r.is_err() {
            let _ = f.set_len(before);
        }
        r
    })();
    match written {
        Ok(()) => {
            if s.rows == 0 {
                tracing::error!(error = why, path = %path.display(), "the database cannot take audit records: spooling them until it can");
            }
            s.rows += n;
            s.overflow += lost;
        }
        Err(e) => {
            s.overflow += (n as u64) + lost;
            tracing::error!(rows = n, error = %e, path = %path.display(), "cannot spool audit records");
        }
    }
}

/// Writes the spooled rows (with their recorded times) and, once the database has them,
/// empties the spool; rows lost to a full spool become one row saying how many.
async fn replay(pool: &Pool, spool: &Arc<Mutex<Spool>>) {
    let (path, overflow) = match spool.lock() {
        Ok(s) => (s.path.clone(), s.overflow),
        Err(_) => return,
    };
    let Some(path) = path else { return };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot read the audit spool");
            return;
        }
    };
    let mut rows: Vec<Row> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| match serde_json::from_str(l) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(error = %e, "an unreadable line in the audit spool is skipped");
                None
            }
        })
        .collect();
    if overflow > 0 {
        rows.push(Row {
            op: "audit".into(),
            category: "spool-overflow".into(),
            epoch: None,
            assignment: None,
            lane_incarnation: None,
            detail: format!(
                "{overflow} audit records were lost: the spool was full ({SPOOL_MAX} rows) while the database was unreachable"
            ),
            recorded_at: crate::util::now_rfc3339(),
            spool_id: Some(format!("sp-{}", uuid::Uuid::new_v4().simple())),
        });
    }
    if rows.is_empty() {
        if let Ok(mut s) = spool.lock() {
            s.rows = 0;
        }
        return;
    }
    if let Err(e) = insert(pool, &rows).await {
        tracing::debug!(error = %e, "the database still cannot take the spooled audit records");
        return;
    }
    // Written: the spool starts again empty (a crash before this replays rows the
    // database then ignores by their spool ids).
    if let Err(e) = crate::util::durable::write_atomic(&path, b"") {
        tracing::error!(path = %path.display(), error = %e, "cannot empty the audit spool");
        return;
    }
    if let Ok(mut s) = spool.lock() {
        tracing::warn!(
            rows = rows.len(),
            "spooled audit records written to the database"
        );
        s.rows = 0;
        s.overflow = s.overflow.saturating_sub(overflow);
    }
}

async fn insert(pool: &Pool, rows: &[Row]) -> Result<(), super::error::AuthorityError> {
    if rows.is_empty() {
        return Ok(());
    }
    let c = pool.get().await?;
    let op: Vec<&str> = rows.iter().map(|r| r.op.as_str()).collect();
    let cat: Vec<&str> = rows.iter().map(|r| r.category.as_str()).collect();
    let epoch: Vec<Option<i64>> = rows.iter().map(|r| r.epoch).collect();
    let asg: Vec<Option<&str>> = rows.iter().map(|r| r.assignment.as_deref()).collect();
    let inc: Vec<Option<&str>> = rows.iter().map(|r| r.lane_incarnation.as_deref()).collect();
    let detail: Vec<&str> = rows.iter().map(|r| r.detail.as_str()).collect();
    // A spooled row keeps the time it was recorded; a prompt one takes the database's.
    let at: Vec<Option<&str>> = rows
        .iter()
        .map(|r| r.spool_id.as_ref().map(|_| r.recorded_at.as_str()))
        .collect();
    let sid: Vec<Option<&str>> = rows.iter().map(|r| r.spool_id.as_deref()).collect();
    let stmt = c
        .prepare_cached(
            "INSERT INTO audit (operation, category, coordinator_epoch, assignment_id, lane_incarnation_id, detail, at, spool_id) \
             SELECT o, c, e, a, i, d, COALESCE(t::timestamptz, clock_timestamp()), s \
             FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[]) AS u(o, c, e, a, i, d, t, s) \
             ON CONFLICT (spool_id) WHERE spool_id IS NOT NULL DO NOTHING",
        )
        .await?;
    c.execute(&stmt, &[&op, &cat, &epoch, &asg, &inc, &detail, &at, &sid])
        .await?;
    Ok(())
}
