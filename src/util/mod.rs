//! Small shared helpers with no policy of their own.

pub mod ct;
pub mod durable;
pub mod git;
pub mod http1;
pub mod shutdown;

/// Host wall-clock time as RFC 3339 with microseconds. Advisory only: host times are
/// observations, never authority (the coordinator decides with database time).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}

/// Lower-case hex SHA-256 of `parts`, each length-prefixed so that no two different part
/// lists can produce the same input.
pub fn sha256_hex(domain: &str, parts: &[&[u8]]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((domain.len() as u64).to_be_bytes());
    h.update(domain.as_bytes());
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

/// Resolves once `rx` reads `true` (a shutdown flag); never, if its sender is gone. Keeps
/// the borrow guard of `wait_for` out of the caller's future, so the future stays `Send`.
pub async fn shutdown_signalled(rx: &mut tokio::sync::watch::Receiver<bool>) {
    if rx.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `n` bytes from the operating system's random source, hex-encoded (single-use ids such as
/// handoff challenges: 32 bytes give 256 bits).
pub fn random_hex(n: usize) -> Result<String, String> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness from the operating system: {e}"))?;
    Ok(hex::encode(b))
}

/// Runs `cmd` to completion or kills it at `timeout`. Its output must be small (a version
/// line, a screen): it is read only once the process has ended, without waiting for a
/// descendant that may still hold the pipe.
pub fn run_bounded(
    cmd: &mut std::process::Command,
    timeout: std::time::Duration,
) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    let mut child = cmd.spawn()?;
    let start = std::time::Instant::now();
    // Woken by the child's exit through its pidfd (no polling delay on the fast path).
    let pidfd = rustix::process::Pid::from_raw(child.id() as i32)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        let left = timeout.saturating_sub(start.elapsed());
        if let Some(fd) = &pidfd {
            let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
            let ts = rustix::event::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: left.subsec_nanos() as i64,
            };
            let _ = rustix::event::poll(&mut fds, Some(&ts));
            if let Some(st) = child.try_wait()? {
                break st;
            }
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "no answer within {} s (killed)",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    // What it wrote before it ended, without waiting for a descendant that may still hold
    // the pipe open.
    fn drain(pipe: Option<impl Read + std::os::fd::AsFd>) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(mut o) = pipe {
            let _ = rustix::fs::fcntl_setfl(o.as_fd(), rustix::fs::OFlags::NONBLOCK);
            let mut buf = [0u8; 4096];
            while out.len() < 1 << 16 {
                match o.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
            }
        }
        out
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

/// Raises the open-file soft limit towards the hard one (at most 65536, which every child
/// inherits): a daemon's descriptors are its connections (the supervisor's gateways, the
/// coordinator's host sessions and pending handshakes), and the usual soft default of 1024
/// is below what a flood or a busy host can hold.
pub fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let want = hard.min(65_536);
        if soft < want {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, want, hard) {
                tracing::warn!(error = %e, soft, hard, "cannot raise the open-file limit");
            }
        }
    }
}

/// After an accept the kernel refused (out of descriptors, a connection it aborted): logs
/// it and pauses, so the caller's loop goes on serving rather than ending its listener —
/// an ended listener left its daemon running and unreachable — and an exhausted descriptor
/// table neither spins the loop nor floods the log.
pub async fn accept_refused(listener: &str, e: &std::io::Error) {
    // A connection that failed on its own before it was accepted (aborted by its peer, a
    // protocol error, a firewall rule) says nothing about the listener: the next one.
    if matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED | libc::EPROTO | libc::EPERM | libc::EINTR)
    ) {
        tracing::debug!(listener, error = %e, "a connection failed before it was accepted");
        return;
    }
    tracing::warn!(listener, error = %e, "cannot accept a connection; trying again in a second");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
}
