//! The durable receipt outbox.
//!
//! **Owns:** the `outbox/` (unacknowledged), `acked/` and `refused/` directories of the
//! state dir. A receipt the coordinator refused for good (another host's lane, a body that
//! contradicts its envelope) moves to `refused/` for an operator to read; it is never
//! deleted.
//!
//! **Invariants:** a receipt is fsync'd, and its directory entry fsync'd, before anyone is
//! told about it; there is at most one receipt per idempotency key (exclusive `link`);
//! nothing leaves `outbox/` until a consumer acknowledges that exact key.

use std::path::{Path, PathBuf};

use super::receipt::TerminationReceipt;
use crate::util::durable::{self, DurableError};

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error(transparent)]
    Durable(#[from] DurableError),
    #[error("receipt {path} is unreadable: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("no unacknowledged receipt with key {0:?}")]
    UnknownKey(String),
    #[error("malformed idempotency key {0:?}")]
    BadKey(String),
}

#[derive(Debug, Clone)]
pub struct Outbox {
    pending: PathBuf,
    acked: PathBuf,
    refused: PathBuf,
    /// Signalled after each new receipt is durable, so a sender need not poll.
    written: std::sync::Arc<tokio::sync::Notify>,
}

/// Whether `write` stored a new receipt or found the generation's receipt already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    New,
    AlreadyPresent,
}

fn key_ok(key: &str) -> bool {
    key.strip_prefix("tr-")
        .is_some_and(|h| h.len() == 40 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Outbox {
    pub fn open(state_dir: &Path) -> Result<Self, OutboxError> {
        let pending = state_dir.join("outbox");
        let acked = state_dir.join("acked");
        let refused = state_dir.join("refused");
        durable::ensure_dir(&pending, 0o700)?;
        durable::ensure_dir(&acked, 0o700)?;
        durable::ensure_dir(&refused, 0o700)?;
        Ok(Self {
            pending,
            acked,
            refused,
            written: std::sync::Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// Where a pending receipt that does not parse is set aside (for an operator; never
    /// read as a receipt again). `write` and `contains` look there too: its key stays
    /// taken, so no second receipt with other content is ever written under it.
    fn unreadable(&self) -> PathBuf {
        self.pending.with_file_name("outbox-unreadable")
    }

    fn name(key: &str) -> String {
        format!("{key}.json")
    }

    /// Durably stores `r` unless a receipt with its key exists (pending or acknowledged).
    pub fn write(&self, r: &TerminationReceipt) -> Result<Written, OutboxError> {
        if !key_ok(&r.idempotency_key) {
            return Err(OutboxError::BadKey(r.idempotency_key.clone()));
        }
        let name = Self::name(&r.idempotency_key);
        if self.acked.join(&name).exists()
            || self.refused.join(&name).exists()
            || self.unreadable().join(&name).exists()
        {
            return Ok(Written::AlreadyPresent);
        }
        let bytes = serde_json::to_vec_pretty(r).map_err(|e| OutboxError::Corrupt {
            path: self.pending.join(&name),
            detail: e.to_string(),
        })?;
        match durable::create_new(&self.pending.join(&name), &bytes) {
            Ok(()) => {
                self.written.notify_one();
                Ok(Written::New)
            }

            Err(DurableError::Exists { .. }) => Ok(Written::AlreadyPresent),
            Err(e) => Err(e.into()),
        }
    }

    /// Notified after every new durable receipt.
    pub fn written(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.written.clone()
    }

    /// Whether a receipt with this key exists anywhere (pending, acknowledged, refused):
    /// that generation has ended for good.
    pub fn contains(&self, key: &str) -> bool {
        let name = Self::name(key);
        self.pending.join(&name).exists()
            || self.acked.join(&name).exists()
            || self.refused.join(&name).exists()
            || self.unreadable().join(&name).exists()
    }

    /// The coordinator refused `key` for good: keep it aside, durably, for an operator.
    pub fn refuse(&self, key: &str) -> Result<(), OutboxError> {
        if !key_ok(key) {
            return Err(OutboxError::BadKey(key.to_string()));
        }
        let name = Self::name(key);
        let from = self.pending.join(&name);
        if !from.exists() {
            return Ok(());
        }
        durable::move_file(&from, &self.refused.join(&name))?;
        Ok(())
    }

    /// Puts an acknowledged receipt back among the pending ones (the coordinator turned out
    /// not to have it). True when it moved; a pending one stays, a refused one stays put.
    pub fn resend(&self, key: &str) -> Result<bool, OutboxError> {
        if !key_ok(key) {
            return Err(OutboxError::BadKey(key.to_string()));
        }
        let name = Self::name(key);
        let from = self.acked.join(&name);
        if !from.exists() || self.pending.join(&name).exists() {
            return Ok(false);
        }
        durable::move_file(&from, &self.pending.join(&name))?;
        self.written.notify_one();
        Ok(true)
    }

    /// Unacknowledged receipts, oldest first; with `include_acked`, acknowledged ones too.
    pub fn list(&self, include_acked: bool) -> Result<Vec<TerminationReceipt>, OutboxError> {
        let mut out = read_all(&self.pending, Some(&self.unreadable()))?;
        if include_acked {
            out.extend(read_all(&self.acked, None)?);
        }
        out.sort_by(|a, b| a.written_at.cmp(&b.written_at));
        Ok(out)
    }

    /// A consumer took responsibility for `key`: move it out of the pending set, durably.
    pub fn ack(&self, key: &str) -> Result<(), OutboxError> {
        if !key_ok(key) {
            return Err(OutboxError::BadKey(key.to_string()));
        }
        let name = Self::name(key);
        let from = self.pending.join(&name);
        if !from.exists() {
            if self.acked.join(&name).exists() {
                return Ok(()); // acknowledging twice is harmless
            }
            return Err(OutboxError::UnknownKey(key.to_string()));
        }
        durable::move_file(&from, &self.acked.join(&name))?;
        Ok(())
    }
}

/// The receipts in `dir`. One that does not parse is moved to `set_aside` (when given)
/// and left out: kept in the list, it failed every reader — the link dropped its session
/// every 100 ms, and a restarted supervisor could not rebuild its chains. A file that
/// cannot be read now (an I/O error) fails the whole read: a reader must not take a
/// partial outbox for the whole one.
fn read_all(dir: &Path, set_aside: Option<&Path>) -> Result<Vec<TerminationReceipt>, OutboxError> {
    let rd = std::fs::read_dir(dir).map_err(|source| DurableError::Io {
        op: "read dir",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue; // in-flight temp files
        }
        // Gone since the listing (acknowledged, or set aside by a concurrent reader).
        let bytes = match std::fs::read(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            r => r.map_err(|source| DurableError::Io {
                op: "read",
                path: p.clone(),
                source,
            })?,
        };
        match serde_json::from_slice(&bytes) {
            Ok(r) => out.push(r),
            Err(err) => {
                let Some(aside) = set_aside else {
                    tracing::error!(path = %p.display(), error = %err, "a receipt file does not parse; left out");
                    continue;
                };
                let to = aside.join(e.file_name());
                durable::ensure_dir(aside, 0o700)?;
                match durable::move_file(&p, &to) {
                    Err(DurableError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        continue
                    }
                    r => r?,
                }
                tracing::error!(path = %p.display(), moved_to = %to.display(), error = %err,
                    "a pending receipt does not parse: set aside for an operator, never sent");
            }
        }
    }
    Ok(out)
}
