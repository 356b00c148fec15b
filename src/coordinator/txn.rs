//! The one transition primitive. Every authority change in Mosaic is a call to
//! [`Store::transition`], which owns the whole frame of the transaction:
//!
//! 1. **open**: one statement replays the idempotency key (same key + same request → the
//!    original receipt, whoever asks; same key + other request → refused) and checks the
//!    caller is the current, unexpired leader (`mosaic_leader_ok`, database time) — or, for
//!    a leadership acquisition ([`Opening::Acquire`]), that the epoch it replaces is still
//!    the current one and its lease is released or expired;
//! 2. **decide**: the transition's body gets a [`Frame`], which can only *read* and run the
//!    deciding compare-and-swap. [`Frame::cas`] returns [`Decided`] only when the statement
//!    matched exactly one row in its expected state; every further write of the transaction
//!    is a method of `Decided`, so a write that did not go through its CAS does not compile;
//! 3. **receipt**: [`Decided::decide`] turns the CAS into a [`Decision`] with the receipt
//!    body; the frame writes the receipt and its idempotency row in one statement;
//! 4. **commit**: a deferred constraint trigger re-checks the leadership *during* COMMIT
//!    (migration 0002), and another refuses any authority row written without a receipt in
//!    the same transaction — the database enforces the frame, not only this code.
//!
//! A refused transition changes nothing and is audited with its category. A connection that
//! fails before the outcome is known (an ambiguous commit included) is retried with the same
//! idempotency key, which returns the original receipt if the first attempt committed.

use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use const_format::concatcp;
use deadpool_postgres::{ClientWrapper, Object};
use futures_util::future::{join, BoxFuture};
use serde::{Deserialize, Serialize};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::rows::RowExt;
use super::store::Store;

/// The durable receipt of one authority transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub receipt_id: String,
    pub transition: String,
    pub sot_incarnation: String,
    pub coordinator_epoch: i64,
    pub assignment_id: Option<String>,
    pub lane_incarnation_id: Option<String>,
    pub decided_at: String,
    pub body: serde_json::Value,
    /// True when this is the original receipt returned for a retried request (nothing was
    /// decided again).
    #[serde(skip)]
    pub replayed: bool,
}

impl Receipt {
    /// A string field of the body (receipt bodies are written by this crate; a missing field
    /// is a bug, reported as a typed error rather than a panic).
    pub fn str(&self, field: &str) -> Result<String, AuthorityError> {
        self.body[field]
            .as_str()
            .map(String::from)
            .ok_or_else(|| AuthorityError::Invariant {
                op: "receipt",
                detail: format!("receipt {} has no {field}", self.transition),
            })
    }
    pub fn int(&self, field: &str) -> Result<i64, AuthorityError> {
        self.body[field]
            .as_i64()
            .ok_or_else(|| AuthorityError::Invariant {
                op: "receipt",
                detail: format!("receipt {} has no {field}", self.transition),
            })
    }
}

/// Digest of a request for idempotency comparison: the operation and every input that
/// decides the transition, each length-prefixed.
pub(crate) fn request_digest(op: &str, parts: &[&str]) -> String {
    let bytes: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
    crate::util::sha256_hex(&format!("mosaic/request/{op}"), &bytes)
}

/// What a transition's frame checks before its body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// The step's leader is the current, unexpired leadership.
    Leader,
    /// A leadership acquisition: the step's leader is the leadership it would become; the
    /// epoch it replaces is still current and free (released, or its lease expired by
    /// database time). The body's compare-and-swap on the leadership row decides it.
    Acquire { replaces: i64 },
}

/// What a transition is, for its frame.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub op: &'static str,
    pub leader: Leader,
    pub opening: Opening,
    /// Derived from what the transition acts on (reservation, assignment, receipt key,
    /// attempt) so that a retry of the same step can only ever land on the same receipt.
    pub key: String,
    pub request: String,
    pub assignment: Option<String>,
    pub lane_incarnation: Option<String>,
}

impl Step {
    pub fn new(op: &'static str, leader: &Leader, key: String, request: String) -> Self {
        Self {
            op,
            leader: leader.clone(),
            opening: Opening::Leader,
            key,
            request,
            assignment: None,
            lane_incarnation: None,
        }
    }

    /// A leadership acquisition that would make `leader` (a new epoch) the leadership, in
    /// place of epoch `replaces`.
    pub fn acquisition(
        op: &'static str,
        leader: &Leader,
        replaces: i64,
        key: String,
        request: String,
    ) -> Self {
        Self {
            opening: Opening::Acquire { replaces },
            ..Self::new(op, leader, key, request)
        }
    }
    pub fn about(mut self, assignment: Option<&str>, lane_incarnation: Option<&str>) -> Self {
        self.assignment = assignment.map(String::from);
        self.lane_incarnation = lane_incarnation.map(String::from);
        self
    }
}

/// A transaction before its compare-and-swap: reads only. Nothing here can write — the
/// only way to a write is [`Frame::cas`] deciding exactly one row:
///
/// ```compile_fail,E0599
/// // A body that tries to write before its compare-and-swap does not compile.
/// async fn body(f: mosaic::coordinator::txn::Frame<'_>) {
///     let _ = f.exec("DELETE FROM audit_log", &[]).await;
/// }
/// ```
///
/// ```compile_fail,E0599
/// // Nor can it decide (write its receipt) without one.
/// fn body(f: mosaic::coordinator::txn::Frame<'_>) {
///     let _ = f.decide(serde_json::json!({}));
/// }
/// ```
///
/// ```compile_fail,E0599
/// // A compare-and-swap that matched nothing can explain itself, never write.
/// async fn refused(u: mosaic::coordinator::txn::Undecided<'_>) {
///     let _ = u.exec("UPDATE leases SET released_at = now()", &[]).await;
/// }
/// ```
///
/// The same shapes with the methods a frame does have compile (so the failures above are
/// about the missing write, not about reaching the types):
///
/// ```no_run
/// async fn body(f: mosaic::coordinator::txn::Frame<'_>) {
///     let _ = f.read("SELECT 1", &[]).await;
///     if let Ok(Ok(d)) = f.cas("UPDATE lane_incarnations SET state = state WHERE false RETURNING 1", &[]).await {
///         let _ = d.exec("SELECT 1", &[]).await;
///         let _ = d.decide(serde_json::json!({}));
///     }
/// }
/// async fn refused(u: mosaic::coordinator::txn::Undecided<'_>) {
///     let _ = u.read_opt("SELECT 1", &[]).await;
/// }
/// ```
pub struct Frame<'t> {
    tx: &'t ClientWrapper,
    op: &'static str,
    leader: Leader,
}

/// The compare-and-swap decided exactly one row; the transaction may now write.
pub struct Decided<'t> {
    tx: &'t ClientWrapper,
    op: &'static str,
    epoch: i64,
    row: Row,
}

/// The compare-and-swap matched nothing: the body may read to explain why, then rejects.
pub struct Undecided<'t> {
    tx: &'t ClientWrapper,
    op: &'static str,
    leader: Leader,
}

/// A decided transition with the body of its receipt: all the frame needs to finish.
pub struct Decision<'t> {
    tx: &'t ClientWrapper,
    body: serde_json::Value,
}

/// The pooled connection of one attempt, with its transaction. Dropped while the
/// transaction is still open (a body's error path that could not roll back, a cancelled
/// future), the connection is taken out of the pool and closed — the server rolls the
/// transaction back — so a half-done transaction is never handed to anyone else.
struct Conn {
    obj: Option<Object>,
    open: AtomicBool,
}

impl Conn {
    fn client(&self) -> Result<&ClientWrapper, AuthorityError> {
        self.obj
            .as_deref()
            .ok_or_else(|| AuthorityError::Invariant {
                op: "transition",
                detail: "connection already released".into(),
            })
    }

    /// Ends the transaction without committing (best effort: a failure leaves it open, and
    /// the drop discards the connection).
    async fn rollback(&self) {
        if let Ok(c) = self.client() {
            if c.batch_execute("ROLLBACK").await.is_ok() {
                self.open.store(false, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.open.load(Ordering::SeqCst) {
            if let Some(o) = self.obj.take() {
                drop(Object::take(o));
            }
        }
    }
}

/// The body of a transition: given the frame, decide (or refuse).
pub(crate) type Body =
    dyn for<'t> Fn(Frame<'t>) -> BoxFuture<'t, Result<Decision<'t>, AuthorityError>> + Send + Sync;

fn is_read(sql: &str) -> bool {
    let s = sql.trim_start();
    s.len() >= 6 && s[..6].eq_ignore_ascii_case("select")
}

impl<'t> Frame<'t> {
    pub fn leader(&self) -> &Leader {
        &self.leader
    }

    /// A read before the decision (a `SELECT`, possibly `FOR UPDATE` to pin the values the
    /// compare-and-swap will expect). Anything that is not a `SELECT` is refused.
    pub async fn read(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, AuthorityError> {
        read(self.tx, self.op, sql, params).await
    }

    pub async fn read_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, AuthorityError> {
        Ok(self.read(sql, params).await?.into_iter().next())
    }

    /// The deciding compare-and-swap: a statement whose expected-state predicate must match
    /// (and return) exactly one row. Zero rows is a refusal to explain; more than one is a
    /// bug in the predicate and aborts the transaction.
    pub async fn cas(
        self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Result<Decided<'t>, Undecided<'t>>, AuthorityError> {
        let stmt = self.tx.prepare_cached(sql).await?;
        let mut rows = self.tx.query(&stmt, params).await?;
        match rows.len() {
            1 => Ok(Ok(Decided {
                row: rows.remove(0),
                tx: self.tx,
                op: self.op,
                epoch: self.leader.epoch(),
            })),
            0 => Ok(Err(Undecided {
                tx: self.tx,
                op: self.op,
                leader: self.leader,
            })),
            n => Err(AuthorityError::Invariant {
                op: self.op,
                detail: format!(
                    "the compare-and-swap matched {n} rows; it must decide exactly one"
                ),
            }),
        }
    }
}

async fn read(
    tx: &ClientWrapper,
    op: &'static str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, AuthorityError> {
    if !is_read(sql) {
        return Err(AuthorityError::Invariant {
            op,
            detail: "a write before the compare-and-swap".into(),
        });
    }
    let stmt = tx.prepare_cached(sql).await?;
    Ok(tx.query(&stmt, params).await?)
}

impl<'t> Decided<'t> {
    /// The epoch this transition commits under.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// The row the compare-and-swap returned.
    pub fn row(&self) -> &Row {
        &self.row
    }

    /// A follow-up write of the decided transition; returns the rows it affected.
    pub async fn exec(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, AuthorityError> {
        let stmt = self.tx.prepare_cached(sql).await?;
        Ok(self.tx.execute(&stmt, params).await?)
    }

    /// A follow-up write that must affect exactly one row; anything else aborts the
    /// transition (the compare-and-swap promised that row exists in this state).
    pub async fn exec_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), AuthorityError> {
        match self.exec(sql, params).await? {
            1 => Ok(()),
            n => Err(AuthorityError::Invariant {
                op: self.op,
                detail: format!("a follow-up write affected {n} rows, expected exactly one"),
            }),
        }
    }

    /// A follow-up statement that returns rows (an `INSERT … RETURNING`).
    pub async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, AuthorityError> {
        let stmt = self.tx.prepare_cached(sql).await?;
        Ok(self.tx.query(&stmt, params).await?)
    }

    pub async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, AuthorityError> {
        let stmt = self.tx.prepare_cached(sql).await?;
        Ok(self.tx.query_one(&stmt, params).await?)
    }

    /// Finishes the body: the receipt will carry `body`.
    pub fn decide(self, body: serde_json::Value) -> Result<Decision<'t>, AuthorityError> {
        Ok(Decision { tx: self.tx, body })
    }
}

impl Undecided<'_> {
    /// A read to explain the refusal.
    pub async fn read_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, AuthorityError> {
        Ok(read(self.tx, self.op, sql, params)
            .await?
            .into_iter()
            .next())
    }

    /// Explains the refusal from the CAS's own predicate table (`cas`): runs `diagnosis`
    /// with the CAS's parameters and refuses with the first predicate that does not hold;
    /// no row at all is `not_found`.
    pub(crate) async fn diagnose(
        self,
        diagnosis: &str,
        params: &[&(dyn ToSql + Sync)],
        preds: &[super::cas::Pred],
        not_found: &'static str,
    ) -> Result<AuthorityError, AuthorityError> {
        let Some(row) = self.read_opt(diagnosis, params).await? else {
            return self.reject(Category::NotFound, not_found).await;
        };
        match super::cas::first_failed(&row, preds)? {
            Some(p) => self.reject(p.category, p.detail).await,
            // Every predicate holds now: the row changed between the CAS and this read.
            None => {
                self.reject(Category::Conflict, "the state changed concurrently; retry")
                    .await
            }
        }
    }

    /// Whether the caller still leads (the most common reason a CAS matched nothing).
    pub async fn leader_ok(&self) -> Result<bool, AuthorityError> {
        let stmt = self.tx.prepare_cached(LEADER_OK_SQL).await?;
        self.tx
            .query_one(&stmt, &self.leader.params())
            .await?
            .col("leader_ok")
    }

    /// Refuses with `category`, after checking leadership first: a stale leader is always
    /// reported as such, whatever the body thought the reason was.
    pub async fn reject(
        self,
        category: Category,
        detail: impl Into<String>,
    ) -> Result<AuthorityError, AuthorityError> {
        if !self.leader_ok().await? {
            return Ok(reject(
                self.op,
                Category::StaleLeader,
                format!(
                    "epoch {} is not the current unexpired leadership",
                    self.leader.epoch()
                ),
            ));
        }
        Ok(reject(self.op, category, detail))
    }
}

const LEADER_OK_SQL: &str = "SELECT mosaic_leader_ok($1, $2, $3, $4, $5) AS leader_ok";

/// Opens the frame: replay first (a committed transition answers with its receipt even to a
/// coordinator that has since lost leadership), then the leadership check (the predicate
/// of `mosaic_leader_ok`, inlined: it runs on every transition).
const OPEN_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM leadership l JOIN sot s ON s.sot_incarnation = l.sot_incarnation \
            WHERE l.epoch = $1 AND l.holder = $2 AND l.launch_id = $3 AND l.credential_digest = $4 \
              AND l.sot_incarnation = $5 AND NOT l.released AND l.lease_expires_at > clock_timestamp()) AS leader_ok, \
        i.operation, i.request_digest, \
        r.receipt_id, r.transition, r.sot_incarnation, r.coordinator_epoch, r.assignment_id, \
        r.lane_incarnation_id, mosaic_ts(r.decided_at) AS decided_at, r.body \
     FROM (SELECT 1) one \
     LEFT JOIN idempotency i ON i.idempotency_key = $6 \
     LEFT JOIN transition_receipts r ON r.receipt_id = i.receipt_id";

/// Opens an acquisition's frame: replay first, then whether the epoch it replaces is still
/// the current leadership and free ($1: that epoch, $2: the key).
const OPEN_ACQUIRE_SQL: &str = concatcp!(
    "SELECT EXISTS (SELECT 1 FROM leadership WHERE epoch = $1 AND ",
    super::leader::LEASE_FREE,
    ") AS leader_ok, \
        i.operation, i.request_digest, \
        r.receipt_id, r.transition, r.sot_incarnation, r.coordinator_epoch, r.assignment_id, \
        r.lane_incarnation_id, mosaic_ts(r.decided_at) AS decided_at, r.body \
     FROM (SELECT 1) one \
     LEFT JOIN idempotency i ON i.idempotency_key = $2 \
     LEFT JOIN transition_receipts r ON r.receipt_id = i.receipt_id"
);

/// Receipt and idempotency row in one statement.
const RECEIPT_SQL: &str = "WITH r AS ( \
       INSERT INTO transition_receipts (receipt_id, transition, sot_incarnation, coordinator_epoch, assignment_id, lane_incarnation_id, body) \
       VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING receipt_id, mosaic_ts(decided_at) AS decided_at), \
     i AS (INSERT INTO idempotency (idempotency_key, operation, request_digest, receipt_id) SELECT $8, $2, $9, receipt_id FROM r) \
     SELECT decided_at FROM r";

/// How one attempt at a transition ended.
enum Attempt {
    Done(Receipt),
    /// Refused: nothing changed.
    Rejected(AuthorityError),
    /// The connection failed before the outcome was known; retrying with the same key is
    /// safe (the replay returns the receipt if the first attempt committed).
    Ambiguous(AuthorityError),
    /// Any other failure (a bug, a constraint the body did not expect).
    Failed(AuthorityError),
}

fn classify(e: AuthorityError) -> Attempt {
    match e {
        AuthorityError::Rejected { .. } => Attempt::Rejected(e),
        AuthorityError::Connection(_) | AuthorityError::Retryable(_) => Attempt::Ambiguous(e),
        _ => Attempt::Failed(e),
    }
}

/// Retries of a transition whose outcome was unknown (connection lost, deadlock).
const RETRIES: [Duration; 3] = [
    Duration::from_millis(20),
    Duration::from_millis(200),
    Duration::from_millis(1000),
];

impl Receipt {
    /// A committed receipt read back (a replay): the row selects `receipt_id`,
    /// `transition`, `sot_incarnation`, `coordinator_epoch`, `assignment_id`,
    /// `lane_incarnation_id`, `decided_at` (as `mosaic_ts` text) and `body`.
    pub(crate) fn from_row(r: &Row) -> Result<Receipt, AuthorityError> {
        Ok(Receipt {
            receipt_id: r.col("receipt_id")?,
            transition: r.col("transition")?,
            sot_incarnation: r.col("sot_incarnation")?,
            coordinator_epoch: r.col("coordinator_epoch")?,
            assignment_id: r.col("assignment_id")?,
            lane_incarnation_id: r.col("lane_incarnation_id")?,
            decided_at: r.col("decided_at")?,
            body: r.col("body")?,
            replayed: true,
        })
    }
}

impl Store {
    /// Runs one authority transition (see the module docs for the frame).
    pub(crate) async fn transition(
        &self,
        step: &Step,
        body: &Body,
    ) -> Result<Receipt, AuthorityError> {
        let started = std::time::Instant::now();
        let out = self.run_transition(step, body).await;
        self.stats.record(
            step.op,
            started.elapsed(),
            &out.as_ref().map(|r| r.replayed),
        );
        out
    }

    async fn run_transition(&self, step: &Step, body: &Body) -> Result<Receipt, AuthorityError> {
        if step.key.is_empty() {
            return Err(reject(
                step.op,
                Category::BadInput,
                "an idempotency key is required",
            ));
        }
        let mut retries = RETRIES.iter();
        let started = std::time::Instant::now();
        loop {
            let outcome = match self.attempt(step, body).await {
                Ok(r) => Attempt::Done(r),
                Err(e) => classify(e),
            };
            match outcome {
                Attempt::Done(r) => {
                    tracing::debug!(
                        op = step.op,
                        assignment_id = step.assignment.as_deref().unwrap_or(""),
                        lane_incarnation_id = step.lane_incarnation.as_deref().unwrap_or(""),
                        replayed = r.replayed,
                        micros = started.elapsed().as_micros() as u64,
                        "transition decided"
                    );
                    crate::coordinator::requests::note_commit();
                    if !r.replayed {
                        crate::coordinator::failpoint::after_commit(step.op);
                        crate::coordinator::failpoint::hold_after_commit(step.op).await;
                    }
                    return Ok(r);
                }
                Attempt::Rejected(e) => return self.settle(step, e).await,
                Attempt::Ambiguous(e) => match retries.next() {
                    Some(wait) => {
                        tracing::warn!(op = step.op, error = %e, "transition outcome unknown; retrying with the same key");
                        tokio::time::sleep(*wait).await;
                    }
                    None => return Err(e),
                },
                Attempt::Failed(e) => return Err(e),
            }
        }
    }

    /// One attempt: `BEGIN` and the opening check travel together, then the body, then
    /// the receipt and `COMMIT` together — three round trips besides the body's own.
    async fn attempt(&self, step: &Step, body: &Body) -> Result<Receipt, AuthorityError> {
        let conn = Conn {
            obj: Some(self.pool.get().await?),
            open: AtomicBool::new(false),
        };
        let c = conn.client()?;
        let l = &step.leader;
        let (open, mut params): (_, Vec<&(dyn ToSql + Sync)>) = match &step.opening {
            Opening::Leader => (c.prepare_cached(OPEN_SQL).await?, l.params().to_vec()),
            Opening::Acquire { replaces } => {
                (c.prepare_cached(OPEN_ACQUIRE_SQL).await?, vec![replaces])
            }
        };
        let receipt_stmt = c.prepare_cached(RECEIPT_SQL).await?;
        params.push(&step.key);
        conn.open.store(true, Ordering::SeqCst);
        let (begun, row) = join(c.batch_execute("BEGIN"), c.query_one(&open, &params)).await;
        begun?;
        let row = row?;
        if let Some(op) = row.col::<Option<String>>("operation")? {
            conn.rollback().await;
            let digest: String = row.col("request_digest")?;
            if op != step.op || digest != step.request {
                return Err(reject(
                    step.op,
                    Category::IdempotencyConflict,
                    "idempotency key already used for a different request",
                ));
            }
            return Receipt::from_row(&row);
        }
        if !row.col::<bool>("leader_ok")? {
            conn.rollback().await;
            return Err(match step.opening {
                Opening::Leader => reject(
                    step.op,
                    Category::StaleLeader,
                    format!(
                        "epoch {} is not the current unexpired leadership",
                        l.epoch()
                    ),
                ),
                Opening::Acquire { replaces } => reject(
                    step.op,
                    Category::LeadershipHeld,
                    format!("epoch {replaces} is no longer free to replace: its lease is held, or another acquisition replaced it"),
                ),
            });
        }
        crate::coordinator::failpoint::before_decide(step.op);
        let frame = Frame {
            tx: c,
            op: step.op,
            leader: l.clone(),
        };
        let Decision { tx, body } = match body(frame).await {
            Ok(d) => d,
            Err(e) => {
                conn.rollback().await;
                return Err(e);
            }
        };
        let id = format!("tr-{}", uuid::Uuid::new_v4().simple());
        crate::coordinator::failpoint::before_commit(step.op);
        crate::coordinator::failpoint::hold_before_commit(step.op).await;
        let (inserted, committed) = join(
            tx.query_one(
                &receipt_stmt,
                &[
                    &id,
                    &step.op,
                    &l.sot(),
                    &l.epoch(),
                    &step.assignment,
                    &step.lane_incarnation,
                    &body,
                    &step.key,
                    &step.request,
                ],
            ),
            tx.batch_execute("COMMIT"),
        )
        .await;
        // The server answered the COMMIT (a failed insert turned it into a ROLLBACK, a
        // deferred check refused it): the transaction is over. No answer — a dead
        // connection — leaves it to the drop, which discards the connection.
        if committed
            .as_ref()
            .map_or_else(|e| e.as_db_error().is_some(), |_| true)
        {
            conn.open.store(false, Ordering::SeqCst);
        }
        let decided: String = inserted?.col("decided_at")?;
        committed?;
        Ok(Receipt {
            receipt_id: id,
            transition: step.op.to_string(),
            sot_incarnation: l.sot().to_string(),
            coordinator_epoch: l.epoch(),
            assignment_id: step.assignment.clone(),
            lane_incarnation_id: step.lane_incarnation.clone(),
            decided_at: decided,
            body,
            replayed: false,
        })
    }

    /// A refusal is audited — unless a concurrent request with the same key won, in which
    /// case its receipt is the answer.
    async fn settle(&self, step: &Step, e: AuthorityError) -> Result<Receipt, AuthorityError> {
        let AuthorityError::Rejected {
            category, detail, ..
        } = &e
        else {
            return Err(e);
        };
        if *category != Category::IdempotencyConflict {
            if let Ok(Some(r)) = self.replayed(&step.key, step.op, &step.request).await {
                return Ok(r);
            }
        }
        // An acquisition never held the epoch it asked for: its refusal is recorded under
        // the epoch it tried to replace.
        let epoch = match step.opening {
            Opening::Leader => step.leader.epoch(),
            Opening::Acquire { replaces } => replaces,
        };
        self.audit.record(
            step.op,
            *category,
            Some(epoch),
            step.assignment.as_deref(),
            step.lane_incarnation.as_deref(),
            detail,
        );
        Err(e)
    }

    /// The receipt a key already committed, if any (same operation and request only).
    pub(crate) async fn replayed(
        &self,
        key: &str,
        op: &str,
        request: &str,
    ) -> Result<Option<Receipt>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(
                "SELECT i.operation, i.request_digest, r.receipt_id, r.transition, r.sot_incarnation, r.coordinator_epoch, \
                        r.assignment_id, r.lane_incarnation_id, mosaic_ts(r.decided_at) AS decided_at, r.body \
                 FROM idempotency i JOIN transition_receipts r USING (receipt_id) WHERE i.idempotency_key = $1",
            )
            .await?;
        let Some(r) = c.query_opt(&stmt, &[&key]).await? else {
            return Ok(None);
        };
        let (rop, rdig): (String, String) = (r.col("operation")?, r.col("request_digest")?);
        if rop == op && rdig == request {
            Receipt::from_row(&r).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Gives a closure the higher-ranked signature of a transition body (closures do not infer
/// it by themselves).
pub(crate) fn body_fn<F>(f: F) -> F
where
    F: for<'t> Fn(Frame<'t>) -> BoxFuture<'t, Result<Decision<'t>, AuthorityError>> + Send + Sync,
{
    f
}

/// Builds a transition body. The listed captures are cloned into every run (a body may run
/// more than once: an attempt whose outcome was unknown is retried with the same key), and
/// anything not listed cannot be moved in, which the compiler reports.
macro_rules! body {
    ([$($c:ident),* $(,)?] |$f:ident| $e:expr) => {
        &$crate::coordinator::txn::body_fn(move |$f: $crate::coordinator::txn::Frame<'_>| {
            $(let $c = $c.clone();)*
            Box::pin(async move { $e })
        })
    };
}
pub(crate) use body;
