//! systemd integration for both daemons (`Type=notify`): `READY=1` once serving,
//! `WATCHDOG=1` only while the loop that matters answers, `STATUS=` lines, `STOPPING=1`.
//! All of it is a no-op outside systemd (no `NOTIFY_SOCKET`).
//!
//! **Never:** pings the watchdog from a timer alone — each ping is earned by a check that
//! would hang if the daemon did.

use std::time::Duration;

use sd_notify::NotifyState;

/// Tells the service manager the daemon serves, with a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// A watchdog ping with the current status.
pub fn alive(status: &str) {
    send(&[NotifyState::Watchdog, NotifyState::Status(status)]);
}

/// The watchdog interval systemd asked for (`WatchdogSec=`), if any.
pub fn watchdog() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// Environment variables of the service manager that a daemon's children must not inherit
/// (a harness could otherwise speak for the daemon).
pub const MANAGER_ENV: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];
