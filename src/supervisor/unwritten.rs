//! Termination receipts observed but not yet durable (a full or read-only state
//! filesystem), kept in memory and written again until they are.
//!
//! A generation's end is observed once: its exit status, its signal, the cleanup that
//! verified its cgroup empty. If the receipt holding those facts cannot be written, the
//! facts are not re-derived later — they would be guesses — so the receipt itself is kept
//! here, exactly as built, and retried with a doubling wait (100 ms up to 5 s) until the
//! write succeeds. Only then is the generation's record marked terminated, so the record
//! never claims an end whose receipt is not on disk (a supervisor that dies meanwhile finds
//! the generation still recorded as live and receipts what it can observe then: that it is
//! gone).
//!
//! **Never:** writes a receipt whose facts differ from the observed one (only `written_at`
//! is set to the time of the write that succeeded); lets a never-started receipt, or any
//! other, take a key held here; lets the lane be destroyed while one of its receipts is held
//! (its quarantine stays until the receipt is durable).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::receipt::TerminationReceipt;
use super::state::{GenRecord, GenStatus};
use super::{generation, Inner};

const FIRST_WAIT: Duration = Duration::from_millis(100);
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// One observed end waiting to be durable.
#[derive(Debug, Clone)]
struct Held {
    receipt: TerminationReceipt,
    /// The generation's record, saved as terminated once the receipt is durable.
    record: GenRecord,
    receipt_durable: bool,
    attempts: u32,
    last_error: String,
}

/// What an operator sees of a held receipt (`status`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeldView {
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub receipt_key: String,
    /// The receipt is on disk; only the generation record is still to be saved.
    pub receipt_durable: bool,
    pub attempts: u32,
    pub last_error: String,
}

/// The held receipts, by idempotency key.
#[derive(Debug, Default)]
pub struct Unwritten {
    held: std::sync::Mutex<BTreeMap<String, Held>>,
    /// Woken when a receipt is added, so the retrier starts its short waits again.
    added: tokio::sync::Notify,
}

impl Unwritten {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Held>> {
        // A panic while holding it leaves a map that is still whole: keep using it.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn contains(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// Whether a receipt of this lane incarnation is held.
    pub fn holds_incarnation(&self, incarnation: &str) -> Option<u64> {
        self.lock()
            .values()
            .find(|h| h.receipt.lane_incarnation_id == incarnation)
            .map(|h| h.receipt.generation)
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn views(&self) -> Vec<HeldView> {
        self.lock()
            .values()
            .map(|h| HeldView {
                lane_id: h.receipt.lane_id.clone(),
                lane_incarnation_id: h.receipt.lane_incarnation_id.clone(),
                generation: h.receipt.generation,
                receipt_key: h.receipt.idempotency_key.clone(),
                receipt_durable: h.receipt_durable,
                attempts: h.attempts,
                last_error: h.last_error.clone(),
            })
            .collect()
    }
}

/// Makes a generation's end durable: its receipt, then its record as terminated. What
/// cannot be written now is held and retried; the returned text is the quarantine that
/// calls for (the lane must not host another generation while its last end is unproven).
pub(crate) fn settle_end(
    inner: &Inner,
    receipt: &TerminationReceipt,
    record: &GenRecord,
) -> Option<String> {
    let mut record = record.clone();
    record.status = GenStatus::Terminated;
    let mut held = Held {
        receipt: receipt.clone(),
        record,
        receipt_durable: false,
        attempts: 1,
        last_error: String::new(),
    };
    match attempt(inner, &mut held) {
        Ok(()) => None,
        Err(e) => {
            let why = if held.receipt_durable {
                format!(
                    "the record of generation {} could not be saved as ended: {e}",
                    held.receipt.generation
                )
            } else {
                format!(
                    "termination receipt of generation {} could not be made durable: {e} (kept in memory and written again until it is)",
                    held.receipt.generation
                )
            };
            tracing::error!(
                lane_id = %held.receipt.lane_id,
                generation = held.receipt.generation,
                receipt_key = %held.receipt.idempotency_key,
                error = %e,
                "the end of a generation is not durable yet; holding it"
            );
            held.last_error = e;
            inner
                .unwritten
                .lock()
                .insert(held.receipt.idempotency_key.clone(), held);
            inner
                .metrics
                .receipts_not_durable
                .set(inner.unwritten.len() as i64);
            inner.unwritten.added.notify_one();
            Some(why)
        }
    }
}

/// One try at whatever of `h` is not durable yet.
fn attempt(inner: &Inner, h: &mut Held) -> Result<(), String> {
    if !h.receipt_durable {
        // The write that succeeds is the one whose time the receipt states.
        h.receipt.written_at = crate::util::now_rfc3339();
        generation::write_receipt(inner, &h.receipt).map_err(|e| e.to_string())?;
        h.receipt_durable = true;
    }
    inner.store.save_gen(&h.record).map_err(|e| e.to_string())?;
    // Its private area was kept while its end was not durable (a receipt built again
    // after a restart seals its artifact from it): it goes now.
    if h.receipt.cleanup.verified_empty {
        generation::remove_harness_dir(inner, &h.receipt.lane_incarnation_id, h.receipt.generation);
    }
    Ok(())
}

/// Writes the held ends again until each is durable. Runs for the supervisor's life.
pub(crate) async fn retry(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.subscribe();
    let mut wait = FIRST_WAIT;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = inner.unwritten.added.notified() => { wait = FIRST_WAIT; continue; }
            _ = inner.audit.pending.notified() => { wait = FIRST_WAIT; }
            _ = shutdown.changed() => {
                let inner = inner.clone();
                let _ = tokio::task::spawn_blocking(move || inner.audit.flush()).await;
                return;
            }
        }
        // Audit lines the filesystem refused are written again with the held ends.
        {
            let inner = inner.clone();
            let _ = tokio::task::spawn_blocking(move || inner.audit.flush()).await;
        }
        let keys: Vec<String> = inner.unwritten.lock().keys().cloned().collect();
        if keys.is_empty() {
            // Held audit lines are tried again every second, nothing held every 5 s.
            wait = if inner.audit.held() > 0 {
                Duration::from_secs(1)
            } else {
                LONGEST_WAIT
            };
            continue;
        }
        let mut failed = false;
        for key in keys {
            let Some(mut h) = inner.unwritten.lock().get(&key).cloned() else {
                continue;
            };
            h.attempts += 1;
            let tried = {
                let inner = inner.clone();
                tokio::task::spawn_blocking(move || {
                    let r = attempt(&inner, &mut h);
                    (r, h)
                })
                .await
            };
            // A write task that panicked leaves the held end as it was, in the map.
            let Ok((res, mut h)) = tried else {
                failed = true;
                continue;
            };
            match res {
                Ok(()) => {
                    inner.unwritten.lock().remove(&key);
                    tracing::warn!(
                        lane_id = %h.receipt.lane_id,
                        generation = h.receipt.generation,
                        receipt_key = %key,
                        attempts = h.attempts,
                        "the held end of a generation is durable now; its lane stays quarantined until recreated"
                    );
                }
                Err(e) => {
                    failed = true;
                    h.last_error = e;
                    inner.unwritten.lock().insert(key, h);
                }
            }
        }
        inner
            .metrics
            .receipts_not_durable
            .set(inner.unwritten.len() as i64);
        wait = if failed {
            (wait * 2).min(LONGEST_WAIT)
        } else {
            FIRST_WAIT
        };
    }
}
