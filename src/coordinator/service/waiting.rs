//! Operators waiting on the database: an `assign` waiting for its chain to reach RUNNING,
//! a `stop` waiting for its work's outcome and then for its lane to leave RETIRING. Every waiter of a kind is answered by one read
//! per change, not one read each.
//!
//! Each waiter used to re-read its own row whenever anything changed anywhere: with W
//! waiters and C changes that is W × C reads (a 64-lane storm measured about 3 400
//! database transactions per assignment, most of PostgreSQL's CPU). Now a waiter
//! registers its key here; [`run`] wakes on the same change signal (or every 200 ms),
//! reads the rows of every registered key in one query per kind, and hands each waiter
//! its own row; the waiter decides in memory. One read is in flight at a time, so a burst
//! of changes coalesces into the next read.
//!
//! **Never:** decides anything — it only carries rows the database returned; holds a row
//! back (a key's newest row replaces the one before); keeps a key without a waiter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::Service;
use crate::coordinator::{AssignmentView, AuthorityError, ChainProgress};

/// A key's waiters: how many, and the sender of its newest row.
type Entry<V> = (usize, watch::Sender<Option<Arc<V>>>);

/// The waiters of one kind, by key.
pub(crate) struct Waiters<V> {
    by_key: Mutex<HashMap<String, Entry<V>>>,
}

impl<V> Default for Waiters<V> {
    fn default() -> Self {
        Self {
            by_key: Mutex::new(HashMap::new()),
        }
    }
}

/// One waiter: its receiver of its key's rows. Dropping it unregisters it.
pub(crate) struct Waiter<V> {
    hub: Arc<Waiters<V>>,
    key: String,
    rx: watch::Receiver<Option<Arc<V>>>,
}

impl<V: Clone> Waiter<V> {
    /// The key's row as the hub next reads it. (Its sender lives while this waiter does,
    /// so the channel never closes under it; were it to, this waits for the caller's
    /// deadline rather than spinning.)
    pub(crate) async fn next(&mut self) -> V {
        loop {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            if let Some(v) = self.rx.borrow_and_update().as_deref() {
                return v.clone();
            }
        }
    }
}

impl<V> Waiters<V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry<V>>> {
        // A panic while holding this lock leaves a map that is still whole.
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a waiter for `key` (before its first read of the row, so no change after
    /// that read can be missed).
    pub(crate) fn join(self: &Arc<Self>, key: &str) -> Waiter<V> {
        let mut m = self.lock();
        let e = m
            .entry(key.to_string())
            .or_insert_with(|| (0, watch::channel(None).0));
        e.0 += 1;
        Waiter {
            hub: self.clone(),
            key: key.to_string(),
            rx: e.1.subscribe(),
        }
    }

    fn keys(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn publish(&self, key: &str, v: V) {
        if let Some((_, tx)) = self.lock().get(key) {
            tx.send_replace(Some(Arc::new(v)));
        }
    }
}

impl<V> Drop for Waiter<V> {
    fn drop(&mut self) {
        let mut m = self.hub.lock();
        if let Some(e) = m.get_mut(&self.key) {
            e.0 -= 1;
            if e.0 == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// Who waits for what.
#[derive(Default)]
pub(crate) struct Hub {
    /// By reservation id: where the chain stands (a waiter reads its whole row once this
    /// satisfies it; reading whole rows for every waiter on every change cost about 120
    /// chain rows per assignment in a 64-lane storm).
    pub chains: Arc<Waiters<ChainProgress>>,
    /// By assignment id.
    pub assignments: Arc<Waiters<AssignmentView>>,
    /// A stopped assignment's lane after the stop, by [`lane_key`]: its state, or `None`
    /// when another assignment holds it by then.
    pub lanes: Arc<Waiters<Option<String>>>,
}

/// The key of a (lane incarnation, assignment) pair in [`Hub::lanes`].
pub(crate) fn lane_key(inc: &str, assignment: &str) -> String {
    format!("{inc} {assignment}")
}

/// Reads the rows every waiter waits for, once per change (or every 200 ms), until the
/// service shuts down.
pub(crate) async fn run(svc: Arc<Service>, mut stop: crate::util::shutdown::ShutdownSignal) {
    let mut changed = svc.changed.subscribe();
    let (w, store) = (&svc.waiting, &svc.store);
    loop {
        tokio::select! {
            _ = changed.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.triggered() => return,
        }
        refresh(&w.chains, "chains", |keys| async move {
            store.chain_progress(&keys).await
        })
        .await;
        refresh(&w.assignments, "assignments", |keys| async move {
            let rows = store.assignments(&keys).await?;
            Ok(rows
                .into_iter()
                .map(|a| (a.assignment_id.clone(), a))
                .collect())
        })
        .await;
        refresh(&w.lanes, "lanes", |keys| async move {
            let pairs: Vec<(String, String)> = keys
                .iter()
                .filter_map(|k| k.split_once(' '))
                .map(|(i, a)| (i.to_string(), a.to_string()))
                .collect();
            let rows = store.lanes_after_stop(&pairs).await?;
            Ok(rows
                .into_iter()
                .map(|((inc, asg), state)| (lane_key(&inc, &asg), state))
                .collect())
        })
        .await;
    }
}

/// One read of every row `w`'s waiters wait for, each handed to its waiters.
async fn refresh<V, F, Fut>(w: &Waiters<V>, what: &str, read: F)
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<(String, V)>, AuthorityError>>,
{
    let keys = w.keys();
    if keys.is_empty() {
        return;
    }
    match read(keys).await {
        Ok(rows) => {
            for (key, v) in rows {
                w.publish(&key, v);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, what, "the waiting operators' rows could not be read; again at the next change")
        }
    }
}
