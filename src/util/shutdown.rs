//! Shutdown as a value. A [`Shutdown`] is triggered once; every [`ShutdownSignal`] taken
//! from it resolves from then on. An owner that starts background work keeps the work's
//! handles and awaits them after triggering — stopping is asked for and waited on, never
//! done by aborting a task mid-step.

use tokio::sync::watch;

/// The trigger.
#[derive(Debug)]
pub struct Shutdown {
    tx: watch::Sender<bool>,
}

/// What background work listens to.
#[derive(Debug, Clone)]
pub struct ShutdownSignal {
    rx: watch::Receiver<bool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self {
            tx: watch::channel(false).0,
        }
    }

    /// A listener; it resolves at once if the shutdown was already triggered.
    pub fn signal(&self) -> ShutdownSignal {
        ShutdownSignal {
            rx: self.tx.subscribe(),
        }
    }

    /// Asks every listener to stop (idempotent).
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }
}

impl ShutdownSignal {
    /// Resolves once the shutdown is triggered (never, if its trigger is gone untriggered).
    pub async fn triggered(&mut self) {
        super::shutdown_signalled(&mut self.rx).await
    }

    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_signal_resolves_once_triggered_and_after() {
        let s = Shutdown::new();
        let mut early = s.signal();
        assert!(!early.is_triggered());
        let waiter = tokio::spawn(async move { early.triggered().await });
        s.trigger();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        let mut late = s.signal();
        assert!(late.is_triggered());
        late.triggered().await;
    }
}
