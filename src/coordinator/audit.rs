//! The audit log of refusals: bounded, batched, and never in the way of authority work.
//!
//! `record` never waits: rows go through a bounded queue to one writer task that inserts
//! them in batches on one pooled connection at a time. When the queue is full the row is
//! not dropped silently — it is counted per (operation, category), and the writer records
//! one "coalesced" row per pair. A flood of bad frames therefore costs a counter increment
//! each, and at most one small insert per batch window.
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

#[derive(Debug)]
struct Row {
    op: String,
    category: &'static str,
    epoch: Option<i64>,
    assignment: Option<String>,
    lane_incarnation: Option<String>,
    detail: String,
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
        tokio::spawn(writer(pool, rx, coalesced.clone()));
        Self { tx, coalesced }
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
            category: category.as_str(),
            epoch,
            assignment: assignment.map(String::from),
            lane_incarnation: lane_incarnation.map(String::from),
            detail: detail.chars().take(500).collect(),
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
) {
    let mut rows: Vec<Row> = Vec::new();
    let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        // Take what is queued, up to a batch, waiting at most one window for more.
        let first = match rx.recv().await {
            Some(m) => m,
            None => return,
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
                category,
                epoch: None,
                assignment: None,
                lane_incarnation: None,
                detail: format!(
                    "coalesced: {n} more refusals of this kind while the audit queue was full"
                ),
            });
        }
        if let Err(e) = insert(&pool, &rows).await {
            tracing::error!(rows = rows.len(), error = %e, "cannot write audit records");
        }
        rows.clear();
        for w in waiters.drain(..) {
            let _ = w.send(());
        }
    }
}

async fn insert(pool: &Pool, rows: &[Row]) -> Result<(), super::error::AuthorityError> {
    if rows.is_empty() {
        return Ok(());
    }
    let c = pool.get().await?;
    let op: Vec<&str> = rows.iter().map(|r| r.op.as_str()).collect();
    let cat: Vec<&str> = rows.iter().map(|r| r.category).collect();
    let epoch: Vec<Option<i64>> = rows.iter().map(|r| r.epoch).collect();
    let asg: Vec<Option<&str>> = rows.iter().map(|r| r.assignment.as_deref()).collect();
    let inc: Vec<Option<&str>> = rows.iter().map(|r| r.lane_incarnation.as_deref()).collect();
    let detail: Vec<&str> = rows.iter().map(|r| r.detail.as_str()).collect();
    let stmt = c
        .prepare_cached(
            "INSERT INTO audit (operation, category, coordinator_epoch, assignment_id, lane_incarnation_id, detail) \
             SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[])",
        )
        .await?;
    c.execute(&stmt, &[&op, &cat, &epoch, &asg, &inc, &detail])
        .await?;
    Ok(())
}
