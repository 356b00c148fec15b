//! Operator notifications (migration 0034): the events the database itself records with
//! the change that caused them, claimed and delivered by the coordinator's notifier
//! (`service::notifier`) outside every transition.
//!
//! **Never:** changes authority; delivers a row another notifier holds (a claim is a lease
//! in the row, taken with `SKIP LOCKED`); marks a sink delivered that did not take it.

use super::error::AuthorityError;
use super::rows::RowExt;
use super::store::Store;

/// One event to deliver.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub event_key: String,
    pub kind: String,
    /// The event as sinks get it (identifiers, codes, digests; its kind and key too).
    pub body: serde_json::Value,
    /// Delivery attempts so far, this one included.
    pub attempts: i32,
    /// The sinks that already took it.
    pub delivered_to: Vec<String>,
}

/// How long a claim holds a row: longer than one event's delivery to every sink can take
/// (each sink is bounded by `service::notifier`'s 30 s), so no other notifier takes it
/// while it is being delivered; one that dies mid-delivery leaves it to another (or to
/// itself, restarted) after this.
const CLAIM_MS: i64 = 120_000;

impl Store {
    /// Claims up to `limit` events that are due (oldest first), each for `CLAIM_MS`
    /// (the notifier claims one at a time: a claim must outlast its own delivery).
    pub async fn claim_notifications(
        &self,
        limit: i64,
    ) -> Result<Vec<Notification>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(
                "WITH claimed AS (UPDATE notifications n SET attempts = n.attempts + 1, \
                        next_attempt_at = clock_timestamp() + $2 * interval '1 millisecond' \
                  WHERE n.event_key IN (SELECT event_key FROM notifications \
                         WHERE done_at IS NULL AND next_attempt_at <= clock_timestamp() \
                         ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 RETURNING n.event_key, n.kind, n.body, n.attempts, n.delivered_to, n.created_at) \
                 SELECT * FROM claimed ORDER BY created_at",
            )
            .await?;
        c.query(&stmt, &[&limit, &(CLAIM_MS as f64)])
            .await?
            .iter()
            .map(|r| {
                Ok(Notification {
                    event_key: r.col("event_key")?,
                    kind: r.col("kind")?,
                    body: r.col("body")?,
                    attempts: r.col("attempts")?,
                    delivered_to: r.col("delivered_to")?,
                })
            })
            .collect()
    }

    /// Records that `sink` took the event; it is done once every sink of `sinks` has. Only
    /// under the claim that delivered it (`attempts`): a claim that lapsed and was taken
    /// again is the new holder's to record.
    pub async fn notification_delivered(
        &self,
        event_key: &str,
        attempts: i32,
        sink: &str,
        sinks: &[&str],
    ) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(
                "UPDATE notifications SET \
                        delivered_to = CASE WHEN $2 = ANY(delivered_to) THEN delivered_to \
                                            ELSE array_append(delivered_to, $2) END, \
                        done_at = CASE WHEN $3::text[] <@ array_append(delivered_to, $2) \
                                       THEN clock_timestamp() END, \
                        last_error = NULL \
                  WHERE event_key = $1 AND done_at IS NULL AND attempts = $4",
            )
            .await?;
        c.execute(&stmt, &[&event_key, &sink, &sinks, &attempts])
            .await?;
        Ok(())
    }

    /// Records a failed delivery: tried again after `backoff_ms`, `error` kept for operators.
    pub async fn notification_failed(
        &self,
        event_key: &str,
        attempts: i32,
        error: &str,
        backoff_ms: i64,
    ) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(
                "UPDATE notifications SET last_error = $2, \
                        next_attempt_at = clock_timestamp() + $3 * interval '1 millisecond' \
                  WHERE event_key = $1 AND done_at IS NULL AND attempts = $4",
            )
            .await?;
        c.execute(
            &stmt,
            &[&event_key, &error, &(backoff_ms as f64), &attempts],
        )
        .await?;
        Ok(())
    }

    /// Every notification, newest first, up to `limit` (`mosaic notifications`).
    pub async fn notifications(
        &self,
        limit: i64,
    ) -> Result<Vec<serde_json::Value>, AuthorityError> {
        let c = self.pool.get().await?;
        let stmt = c
            .prepare_cached(
                "SELECT jsonb_build_object('event_key', event_key, 'kind', kind, 'body', body, \
                        'attempts', attempts, \
                        'delivered_to', to_jsonb(ARRAY(SELECT unnest(delivered_to) ORDER BY 1)), \
                        'done', done_at IS NOT NULL, 'last_error', last_error) AS v \
                   FROM notifications ORDER BY created_at DESC LIMIT $1",
            )
            .await?;
        c.query(&stmt, &[&limit])
            .await?
            .iter()
            .map(|r| r.col("v"))
            .collect()
    }
}
