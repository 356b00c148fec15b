//! The operator request journal (migration 0013): what each mutating operator request asked,
//! under its idempotency key, and the definite answer it got, if it got one.
//!
//! A request's key is opened before anything is carried out: a key already used for another
//! request is refused (nothing runs); a key whose request was answered gets that answer back
//! (nothing runs again); a key whose request has no recorded answer — its first try ended
//! ambiguously (the database went away, the coordinator died) or is still running — is
//! carried out again, and lands on what the first try committed because every transition an
//! operator request makes is keyed by the request or by what it acts on.
//!
//! **Never:** decides anything (the journal is not authority; transitions are), or records an
//! answer that was not given — an ambiguous end leaves the answer empty, and `request show`
//! says so.

use serde::Serialize;
use serde_json::Value;

use super::error::{reject, AuthorityError, Category};
use super::rows::RowExt;
use super::store::Store;

/// What a request id may look like: what the CLI makes (`cli-<hex>`) and what an operator
/// would type, never a `/` (transition keys embed request ids after a `/`).
pub fn valid_request_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

/// What the journal knows of a key when a request under it arrives.
#[derive(Debug, Clone, PartialEq)]
pub enum Opened {
    /// First seen now.
    New,
    /// Seen before, same request, no answer recorded: carry it out again.
    Unanswered,
    /// Seen before and answered: this is the answer (`{"ok": …}` as sent; a refusal is
    /// `{"ok": false, …}` and is carried out again, never given back).
    Answered(Value),
    /// The key belongs to another request.
    OtherRequest { operation: String },
}

/// One journal row, as `mosaic request show` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct JournalEntry {
    pub request_id: String,
    pub operation: String,
    pub subject: Value,
    pub received_at: String,
    pub answered_at: Option<String>,
    pub answer: Option<Value>,
}

const OP: &str = "operator-request";

tokio::task_local! {
    /// Set when a transition committed (or replayed an earlier try's commit) while an
    /// operator request ran in this task: a refusal after that is not "nothing changed".
    static COMMITTED: std::cell::Cell<bool>;
}

/// Runs `f` (one operator request) and says whether any transition committed under it.
pub async fn tracking_commits<F: std::future::Future>(f: F) -> (F::Output, bool) {
    COMMITTED
        .scope(std::cell::Cell::new(false), async move {
            let out = f.await;
            (out, COMMITTED.with(|c| c.get()))
        })
        .await
}

/// Called by every transition that decided (or was answered with its original receipt).
pub(crate) fn note_commit() {
    let _ = COMMITTED.try_with(|c| c.set(true));
}

impl Store {
    /// Opens `request_id` for a request of `operation` with `digest`.
    pub async fn open_request(
        &self,
        request_id: &str,
        operation: &str,
        digest: &str,
        subject: &Value,
    ) -> Result<Opened, AuthorityError> {
        if !valid_request_id(request_id) {
            return Err(reject(
                OP,
                Category::BadInput,
                "a request id is 1-128 letters, digits and . _ : -, beginning with a letter or digit",
            ));
        }
        let c = self.pool.get().await?;
        let inserted = c
            .execute(
                "INSERT INTO operator_requests (request_id, operation, request_digest, subject) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (request_id) DO NOTHING",
                &[&request_id, &operation, &digest, subject],
            )
            .await?;
        if inserted == 1 {
            return Ok(Opened::New);
        }
        let row = c
            .query_one(
                "SELECT operation, request_digest, answer FROM operator_requests WHERE request_id = $1",
                &[&request_id],
            )
            .await?;
        let (op, d): (String, String) = (row.col("operation")?, row.col("request_digest")?);
        if op != operation || d != digest {
            return Ok(Opened::OtherRequest { operation: op });
        }
        Ok(match row.col::<Option<Value>>("answer")? {
            Some(a) => Opened::Answered(a),
            None => Opened::Unanswered,
        })
    }

    /// Records the answer `request_id` got: one that says it took effect (the first such
    /// stays), or a refusal, remembered for `request show` only — a refused request changed
    /// nothing, so a repeat carries it out again and may replace the refusal.
    pub async fn record_answer(
        &self,
        request_id: &str,
        answer: &Value,
    ) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        c.execute(
            "UPDATE operator_requests SET answer = $2, answered_at = clock_timestamp() \
             WHERE request_id = $1 AND (answer IS NULL OR answer->>'ok' = 'false')",
            &[&request_id, answer],
        )
        .await?;
        Ok(())
    }

    pub async fn journal_entry(
        &self,
        request_id: &str,
    ) -> Result<Option<JournalEntry>, AuthorityError> {
        let c = self.pool.get().await?;
        let Some(r) = c
            .query_opt(
                "SELECT request_id, operation, subject, mosaic_ts(received_at) AS received_at, \
                        mosaic_ts(answered_at) AS answered_at, answer \
                 FROM operator_requests WHERE request_id = $1",
                &[&request_id],
            )
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(JournalEntry {
            request_id: r.col("request_id")?,
            operation: r.col("operation")?,
            subject: r.col("subject")?,
            received_at: r.col("received_at")?,
            answered_at: r.col("answered_at")?,
            answer: r.col("answer")?,
        }))
    }

    /// The assignment an `assign` under `request_id` reserved, if its reservation committed
    /// (the reservation's transition key is `reserve/<request id>`).
    pub async fn assignment_of_request(
        &self,
        request_id: &str,
    ) -> Result<Option<String>, AuthorityError> {
        let c = self.pool.get().await?;
        let key = format!("reserve/{request_id}");
        let r = c
            .query_opt(
                "SELECT COALESCE(t.assignment_id, t.body->'chain'->>'assignment_id') AS assignment_id \
                 FROM idempotency i JOIN transition_receipts t USING (receipt_id) WHERE i.idempotency_key = $1",
                &[&key],
            )
            .await?;
        Ok(match r {
            Some(r) => r.col("assignment_id")?,
            None => None,
        })
    }

    /// Forgets requests received more than `days` ago (answered or not); returns how many.
    pub async fn prune_requests(&self, days: i32) -> Result<u64, AuthorityError> {
        let c = self.pool.get().await?;
        Ok(c.execute(
            "DELETE FROM operator_requests WHERE received_at < clock_timestamp() - make_interval(days => $1)",
            &[&days],
        )
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::valid_request_id;

    #[test]
    fn request_ids_are_plain_names() {
        for ok in ["cli-0af3", "r1", "deploy.2026-12-01:a_b", &"x".repeat(128)] {
            assert!(valid_request_id(ok), "{ok}");
        }
        for bad in ["", "-a", "a/b", "a b", "ä", &"x".repeat(129), "reserve/x"] {
            assert!(!valid_request_id(bad), "{bad}");
        }
    }
}
