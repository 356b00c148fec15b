//! The trust registry a running coordinator verifies with: its file, reloaded when it
//! changes (or on SIGHUP) and validated before use, with the database's revocations on top.
//!
//! **Never:** swaps in a registry that did not parse or lacks this coordinator's own keys
//! (the old one stays, and the log, the audit and the metric say why); forgets a
//! revocation it has seen (the set only grows, even while the database is away).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ed25519_dalek::VerifyingKey;

use super::{OpError, Service, ServiceError};
use crate::coordinator::error::Category;
use crate::protocol::schema::Purpose;
use crate::protocol::transport::CloseReason;
use crate::protocol::TrustRegistry;

/// One of this coordinator's own keys, which every registry it loads must name.
#[derive(Debug, Clone)]
pub(super) struct OwnKey {
    pub key_id: String,
    pub purpose: Purpose,
    pub public: VerifyingKey,
}

/// What the reload watches.
pub(super) struct TrustSource {
    pub path: PathBuf,
    pub principal: String,
    pub own: Vec<OwnKey>,
    /// Every subject seen revoked (grows only).
    revoked: Mutex<BTreeSet<String>>,
    /// The file as last loaded (or last refused): mtime, size, inode.
    stamp: Mutex<Option<Stamp>>,
}

type Stamp = (SystemTime, u64, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// The registry in `text` as this coordinator would use it: parsed, its own keys present
/// and its own, every revoked subject applied.
pub fn effective(
    text: &str,
    principal: &str,
    own: &[(String, Purpose, VerifyingKey)],
    revoked: &BTreeSet<String>,
) -> Result<TrustRegistry, String> {
    let mut reg = TrustRegistry::from_toml(text).map_err(|e| e.to_string())?;
    let now = SystemTime::now();
    for (key_id, purpose, public) in own {
        reg.check_own(key_id, principal, *purpose, public, now)
            .map_err(|e| e.to_string())?;
    }
    for s in revoked {
        reg.revoke_subject(s);
    }
    Ok(reg)
}

impl TrustSource {
    pub(super) fn new(path: PathBuf, principal: String, own: Vec<OwnKey>) -> Self {
        Self {
            path,
            principal,
            own,
            revoked: Mutex::new(BTreeSet::new()),
            stamp: Mutex::new(None),
        }
    }

    fn own(&self) -> Vec<(String, Purpose, VerifyingKey)> {
        self.own
            .iter()
            .map(|k| (k.key_id.clone(), k.purpose, k.public))
            .collect()
    }

    pub(super) fn revoked(&self) -> BTreeSet<String> {
        self.revoked.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Whether `principal` (or every key of it) was revoked.
    pub(super) fn is_revoked(&self, principal: &str) -> bool {
        self.revoked
            .lock()
            .map(|r| r.contains(principal))
            .unwrap_or(true)
    }

    pub(super) fn learn_all(&self, subjects: impl IntoIterator<Item = String>) {
        self.learn(subjects);
    }

    /// Adds revoked subjects; the ones not seen before.
    fn learn(&self, subjects: impl IntoIterator<Item = String>) -> Vec<String> {
        let Ok(mut r) = self.revoked.lock() else {
            return vec![];
        };
        subjects
            .into_iter()
            .filter(|s| r.insert(s.clone()))
            .collect()
    }

    /// Loads the file as this coordinator would use it (start: an error refuses to start).
    pub(super) fn load(&self) -> Result<TrustRegistry, ServiceError> {
        let before = stamp(&self.path);
        let text =
            std::fs::read_to_string(&self.path).map_err(|source| ServiceError::ReadFile {
                path: self.path.clone(),
                source,
            })?;
        let reg =
            effective(&text, &self.principal, &self.own(), &self.revoked()).map_err(|detail| {
                ServiceError::BadFile {
                    path: self.path.clone(),
                    detail,
                }
            })?;
        if let Ok(mut s) = self.stamp.lock() {
            *s = before;
        }
        Ok(reg)
    }
}

impl Service {
    /// Reads the database's revocations and the registry file (if it changed, or `force`)
    /// and replaces the live registry when anything did. A file that does not load keeps
    /// the registry in use, loudly. Sessions of newly revoked hosts are closed.
    pub(crate) async fn refresh_trust(&self, force: bool) {
        let src = &self.trust;
        let mut fresh = vec![];
        match self.store.revocations().await {
            Ok(rows) => fresh = src.learn(rows.into_iter().map(|r| r.subject)),
            Err(e) => {
                tracing::debug!(error = %e, "revocations not read (database away); keeping those seen")
            }
        }
        let now = stamp(&src.path);
        let changed = src.stamp.lock().map(|s| *s != now).unwrap_or(true);
        if !(force || changed || !fresh.is_empty()) {
            return;
        }
        match src.load() {
            Ok(reg) => {
                let keys = reg.entries().count();
                self.registry.replace(reg);
                if force || changed {
                    tracing::info!(path = %src.path.display(), keys, "trust registry loaded");
                }
                self.metrics.trust_reloads.inc();
            }
            Err(e) => {
                // Not retried until the file changes again.
                if let Ok(mut s) = src.stamp.lock() {
                    *s = now;
                }
                self.metrics.trust_reload_failures.inc();
                tracing::error!(error = %e, "trust registry NOT reloaded: it does not load; the registry in use stays");
                self.store.auditor().record(
                    "trust-reload",
                    Category::BadInput,
                    None,
                    None,
                    None,
                    &format!("refused: {e}"),
                );
                // A revocation still applies to the registry in use.
                if !fresh.is_empty() {
                    let mut reg = (*self.registry.current()).clone();
                    for s in &fresh {
                        reg.revoke_subject(s);
                    }
                    self.registry.replace(reg);
                }
            }
        }
        for s in fresh {
            self.close_revoked(&s);
        }
    }

    /// Closes the live session a revoked subject (a host, or one of its keys) holds.
    fn close_revoked(&self, subject: &str) {
        let principal = subject.split('/').next().unwrap_or(subject);
        if let Some(host) = principal.strip_prefix("host:") {
            if self
                .hosts
                .close_host(host, CloseReason::Revoked(subject.to_string()))
            {
                tracing::warn!(subject, "revoked: its host session is closed");
            }
        }
    }

    /// `mosaic trust revoke`: recorded (fenced), applied at once, the session closed.
    pub(crate) async fn revoke(&self, subject: &str) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let r = self.store.revoke(&l, subject, &self.principal).await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.note(&l, &e).await;
                return Err(e.into());
            }
        };
        self.refresh_trust(false).await;
        let keys: Vec<String> = self
            .registry
            .current()
            .entries()
            .filter(|e| e.revoked && (e.key_id == subject || e.principal == subject))
            .map(|e| e.key_id.clone())
            .collect();
        Ok(serde_json::json!({ "revoked": r, "keys": keys }))
    }

    /// The registry in use: every key, whether it is revoked, and the revocations.
    pub(crate) fn trust_listing(&self) -> serde_json::Value {
        let reg = self.registry.current();
        let mut keys: Vec<serde_json::Value> = reg
            .entries()
            .map(|e| {
                serde_json::json!({
                    "key_id": e.key_id,
                    "principal": e.principal,
                    "purpose": e.purpose,
                    "audiences": e.audiences,
                    "revoked": e.revoked,
                    "public_key": hex::encode(e.public_key.to_bytes()),
                })
            })
            .collect();
        keys.sort_by(|a, b| a["key_id"].as_str().cmp(&b["key_id"].as_str()));
        serde_json::json!({
            "path": self.trust.path,
            "keys": keys,
            "revoked": self.trust.revoked(),
        })
    }
}

/// Reloads on SIGHUP, and checks the file and the revocations every second.
pub(super) async fn watch(svc: Arc<Service>, mut stop: crate::util::shutdown::ShutdownSignal) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP reload (the registry is still reloaded when its file changes)");
            None
        }
    };
    loop {
        let force = tokio::select! {
            _ = stop.triggered() => return,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
        };
        svc.refresh_trust(force).await;
    }
}
