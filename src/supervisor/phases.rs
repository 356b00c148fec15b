//! The start path's profile.

use std::time::Duration;

/// The start path's profile: each phase is logged at debug level with the time since the
/// start request arrived (`benches/supervisor.rs` prints the median of each).
pub(crate) struct Phases(std::time::Instant);

impl Phases {
    pub(crate) fn new() -> Self {
        Self(std::time::Instant::now())
    }

    /// Time since the start request arrived.
    pub(crate) fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    pub(crate) fn mark(&self, what: &'static str) {
        tracing::debug!(
            phase = what,
            elapsed_us = self.elapsed().as_micros() as u64,
            "launch phase"
        )
    }
}
