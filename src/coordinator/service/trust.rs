//! The trust registry a running coordinator verifies with: its file, reloaded when it
//! changes (or on SIGHUP) and validated before use, with the database's revocations on top.
//!
//! **Never:** swaps in a registry that did not parse or lacks this coordinator's own keys
//! (the old one stays, and the log, the audit and the metric say why); forgets a
//! revocation it has seen (the set only grows, even while the database is away); lets two
//! refreshes interleave (one lock from reading the revocations to the replace, so an older
//! load can never overwrite a newer revocation).

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

/// Every revocation seen (grows only).
#[derive(Debug, Clone, Default)]
pub(super) struct Revoked {
    /// Subjects (`host:h`, `host:h/session`, `operator:o`).
    pub subjects: BTreeSet<String>,
    /// Public keys (hex) revoked, under whatever id they appear.
    pub keys: BTreeSet<String>,
}

/// What the reload watches.
pub(super) struct TrustSource {
    pub path: PathBuf,
    pub principal: String,
    pub own: Vec<OwnKey>,
    revoked: Mutex<Revoked>,
    /// The file as last loaded (or last refused): mtime, size, inode.
    stamp: Mutex<Option<Stamp>>,
    /// Held by a refresh from its first read to its replace.
    refresh: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding it cannot leave a half-written set (inserts are atomic): go
    // on with it rather than forget revocations.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

type Stamp = (SystemTime, u64, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// The registry in `text` as this coordinator would use it: parsed, its own keys present
/// and its own, every revoked public key (`revoked_keys`, hex) marked revoked.
pub fn effective(
    text: &str,
    principal: &str,
    own: &[(String, Purpose, VerifyingKey)],
    revoked_keys: &BTreeSet<String>,
) -> Result<TrustRegistry, String> {
    let mut reg = TrustRegistry::from_toml(text).map_err(|e| e.to_string())?;
    let now = SystemTime::now();
    for (key_id, purpose, public) in own {
        reg.check_own(key_id, principal, *purpose, public, now)
            .map_err(|e| e.to_string())?;
    }
    reg.revoke_keys(revoked_keys);
    Ok(reg)
}

impl TrustSource {
    pub(super) fn new(path: PathBuf, principal: String, own: Vec<OwnKey>) -> Self {
        Self {
            path,
            principal,
            own,
            revoked: Mutex::new(Revoked::default()),
            stamp: Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    fn own(&self) -> Vec<(String, Purpose, VerifyingKey)> {
        self.own
            .iter()
            .map(|k| (k.key_id.clone(), k.purpose, k.public))
            .collect()
    }

    pub(super) fn revoked(&self) -> Revoked {
        lock(&self.revoked).clone()
    }

    /// Whether `principal` itself was revoked (an operator's certificate principal).
    pub(super) fn is_revoked(&self, principal: &str) -> bool {
        lock(&self.revoked).subjects.contains(principal)
    }

    /// Adds revocations; the subjects not seen before.
    pub(super) fn learn(
        &self,
        rows: impl IntoIterator<Item = crate::coordinator::trust::Revocation>,
    ) -> Vec<String> {
        let mut r = lock(&self.revoked);
        let mut fresh = vec![];
        for row in rows {
            r.keys.extend(row.public_keys);
            if r.subjects.insert(row.subject.clone()) {
                fresh.push(row.subject);
            }
        }
        fresh
    }

    /// Loads the file as this coordinator would use it (start: an error refuses to start).
    pub(super) fn load(&self) -> Result<TrustRegistry, ServiceError> {
        let before = stamp(&self.path);
        let text =
            std::fs::read_to_string(&self.path).map_err(|source| ServiceError::ReadFile {
                path: self.path.clone(),
                source,
            })?;
        let reg = effective(&text, &self.principal, &self.own(), &self.revoked().keys).map_err(
            |detail| ServiceError::BadFile {
                path: self.path.clone(),
                detail,
            },
        )?;
        *lock(&self.stamp) = before;
        Ok(reg)
    }
}

impl Service {
    /// Reads the database's revocations and the registry file (if it changed, or `force`)
    /// and replaces the live registry when anything did. A file that does not load keeps
    /// the registry in use, loudly. Sessions of newly revoked hosts are closed. One
    /// refresh at a time, from the first read to the replace.
    pub(crate) async fn refresh_trust(&self, force: bool) {
        let src = &self.trust;
        let _one = src.refresh.lock().await;
        let mut fresh = vec![];
        match self.store.revocations().await {
            Ok(rows) => fresh = src.learn(rows),
            Err(e) => {
                tracing::debug!(error = %e, "revocations not read (database away); keeping those seen")
            }
        }
        let now = stamp(&src.path);
        let changed = *lock(&src.stamp) != now;
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
                *lock(&src.stamp) = now;
                self.metrics.trust_reload_failures.inc();
                tracing::error!(error = %e, "trust registry NOT reloaded: it does not load; the registry in use stays");
                self.store.auditor().record(
                    "trust-reload",
                    Category::BadInput,
                    None,
                    None,
                    None,
                    &format!("trust registry reload refused: {e}"),
                );
                // A revocation still applies to the registry in use.
                if !fresh.is_empty() {
                    let mut reg = (*self.registry.current()).clone();
                    reg.revoke_keys(&src.revoked().keys);
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

    /// `mosaic trust revoke`: recorded (fenced) with the public keys it names in the
    /// registry in use, applied at once, the session closed.
    pub(crate) async fn revoke(&self, subject: &str) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let keys = self
            .registry
            .current()
            .keys_of(subject)
            .into_iter()
            .collect();
        let r = match self.store.revoke(&l, subject, &self.principal, keys).await {
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
            .filter(|e| {
                e.revoked
                    && r.public_keys
                        .contains(&hex::encode(e.public_key.to_bytes()))
            })
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
            "revoked": self.trust.revoked().subjects,
        })
    }
}

/// Checks the file and the revocations every second.
pub(super) async fn watch(svc: Arc<Service>, mut stop: crate::util::shutdown::ShutdownSignal) {
    loop {
        tokio::select! {
            _ = stop.triggered() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        };
        svc.refresh_trust(false).await;
    }
}

/// The coordinator daemon reloads its registry on SIGHUP (`mosaic up`, which runs the
/// service in-process, keeps SIGHUP's usual meaning).
pub(super) async fn reload_on_hangup(svc: Arc<Service>) {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut h) => {
            while h.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the trust registry");
                svc.refresh_trust(true).await;
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP reload (the registry is still reloaded when its file changes)")
        }
    }
}
