//! Small shared helpers with no policy of their own.

pub mod durable;

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
