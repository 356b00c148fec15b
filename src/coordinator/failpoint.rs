//! Crash points for the crash tests. Built with the `failpoints` feature (scripts/test does),
//! `FAILPOINTS="after-commit:staged=return"` makes the coordinator SIGKILL itself right after
//! that transition committed — and `before-decide:<op>` / `before-commit:<op>` /
//! `before-push:<message type>` at those moments; `hold-after-commit:<op>=return(FILE)` and
//! `hold-before-commit:<op>=return(FILE)` hold that request until FILE exists. Without the feature these compile to
//! nothing.

#[cfg(feature = "failpoints")]
fn point(when: &str, what: &str) {
    let name = format!("{when}:{what}");
    fail::fail_point!(&name, |_| {
        tracing::error!(failpoint = %name, "failpoint: killing this process");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    });
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
fn point(_when: &str, _what: &str) {}

pub(crate) fn before_decide(op: &str) {
    point("before-decide", op)
}
pub(crate) fn before_commit(op: &str) {
    point("before-commit", op)
}
pub(crate) fn after_commit(op: &str) {
    point("after-commit", op)
}
/// A host-side crash point (`host:<what>`): the supervisor SIGKILLs itself there.
pub(crate) fn host(what: &str) {
    point("host", what)
}
/// Holds the caller until the file named by the failpoint's argument exists (see the
/// module docs); polled every 20 ms, and logged once when it begins.
pub(crate) async fn hold_after_commit(op: &str) {
    hold("hold-after-commit", op).await
}

/// As `hold_after_commit`, with the transaction still open and its commit ahead: a test
/// pauses the process there for as long as it needs, never racing a timer.
pub(crate) async fn hold_before_commit(op: &str) {
    hold("hold-before-commit", op).await
}

async fn hold(when: &str, op: &str) {
    #[cfg(feature = "failpoints")]
    {
        let name = format!("{when}:{op}");
        let path: Option<String> = (|| {
            fail::fail_point!(&name, |arg| arg);
            None
        })();
        if let Some(p) = path {
            tracing::warn!(failpoint = %name, until = %p, "failpoint: holding this request");
            while !std::path::Path::new(&p).exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = (when, op);
}

pub(crate) fn before_push(message_type: &str) {
    point("before-push", message_type)
}

/// Reads `FAILPOINTS` (a no-op without the feature). Call once at process start.
pub fn setup() {
    #[cfg(feature = "failpoints")]
    std::mem::forget(fail::FailScenario::setup());
}

/// Whether this build honours `FAILPOINTS` (the crash tests refuse to run without it).
pub fn enabled() -> bool {
    cfg!(feature = "failpoints")
}
