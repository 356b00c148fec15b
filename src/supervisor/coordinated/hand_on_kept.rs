//! What a host observed of its workspace effects, kept on its disk until the coordinator
//! recorded it (`<state_dir>/push/settle/`): a push's intent before it is sent
//! (`<effect>.intent.json`: the exact update), then its settlement (`<effect>.json`: what
//! the remote showed). Every transfer round sends the settlements again, and settles an
//! intent a dead process left behind by what the remote shows now — at the new id:
//! completed; anywhere else: unknown (a git the dead process started may still be
//! pushing), never a guess that it did not happen.
//!
//! **Never:** deletes a settlement the coordinator has not recorded or refused, or lets one
//! it cannot read or send hold up the others.

use std::path::{Path, PathBuf};

use super::*;
use crate::protocol::messages::{EffectStep, HandOnOutcome, HandOnVerdict, WorkspaceEffect};
use crate::protocol::schema::MessageType;
use crate::supervisor::push;

/// What the host observed of one effect.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Settlement {
    pub effect_id: String,
    pub assignment_id: String,
    pub outcome: String,
    pub result_digest: String,
    pub detail: Option<String>,
}

/// A push about to be sent: the exact update, kept until its settlement is.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Intent {
    pub effect_id: String,
    pub assignment_id: String,
    pub repository: String,
    pub reference: String,
    pub old: String,
    pub new: String,
}

/// How a send went.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// Recorded, or refused for good: the file is gone.
    Done,
    /// The link is down: nothing more this round.
    LinkDown,
    /// Not now (no leader, a database fault): the next round.
    Later,
}

pub(super) fn settle_dir(inner: &crate::supervisor::Inner) -> PathBuf {
    inner.cfg.state_dir.join("push").join("settle")
}

/// The digest of what was observed.
pub(super) fn result_digest(effect_id: &str, outcome: HandOnOutcome, parts: &[&str]) -> String {
    let mut all: Vec<&[u8]> = vec![effect_id.as_bytes(), outcome.as_str().as_bytes()];
    all.extend(parts.iter().map(|p| p.as_bytes()));
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/workspace-effect-result/v1", &all)
    )
}

/// A detail as it may be reported: the remote's URL cut out, no control character, at
/// most 400 characters.
pub(super) fn clean(detail: &str, url: Option<&str>) -> String {
    let d = match url {
        Some(u) if !u.is_empty() => detail.replace(u, "<remote>"),
        _ => detail.to_string(),
    };
    let d: String = d
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(400)
        .collect();
    if d.trim().is_empty() {
        "(no detail)".into()
    } else {
        d
    }
}

/// Writes `value` to `dir/name` atomically.
pub(super) fn keep<T: serde::Serialize>(dir: &Path, name: &str, value: &T) -> Result<(), String> {
    crate::util::durable::ensure_dir(dir, 0o700).map_err(|e| e.to_string())?;
    let bytes = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    crate::util::durable::write_atomic(&dir.join(name), &bytes).map_err(|e| e.to_string())
}

/// A file of this directory nobody can read or send, set aside once (`.bad`), said once.
fn set_aside(path: &Path, why: &str) {
    tracing::error!(path = %path.display(), why,
        "a workspace effect's kept observation cannot be used: set aside for the operator (.bad)");
    let _ = std::fs::rename(path, path.with_extension("bad"));
}

impl CoordinatedHost {
    fn running_hand_on(&self, effect_id: &str) -> bool {
        self.transfers
            .hand_ons
            .lock()
            .map(|h| h.contains(effect_id))
            .unwrap_or(true)
    }

    /// Every kept settlement sent again; every intent a dead process left settled first.
    pub(super) async fn resend_hand_on_settlements(&self) {
        let dir = settle_dir(&self.sup.inner);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(id) = name.strip_suffix(".intent.json") {
                if !self.running_hand_on(id) && !dir.join(format!("{id}.json")).exists() {
                    self.settle_intent(&path).await;
                }
                continue;
            }
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if self.running_hand_on(id) {
                continue;
            }
            // A file that cannot be read now (out of descriptors, an I/O error) is read
            // again next round; only one that does not parse is set aside: set aside, its
            // effect stayed admitted until an operator resolved it by hand.
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read a kept settlement; trying again next round");
                    continue;
                }
            };
            let s = match serde_json::from_slice::<Settlement>(&bytes).map_err(|e| e.to_string()) {
                Ok(s) if HandOnOutcome::parse(&s.outcome).is_some() && s.effect_id == id => s,
                Ok(_) => {
                    set_aside(&path, "an outcome this build does not know");
                    continue;
                }
                Err(e) => {
                    set_aside(&path, &e);
                    continue;
                }
            };
            if self.send_settlement(&s).await == Sent::LinkDown {
                return;
            }
        }
    }

    /// An intent with no settlement: its process died between the admission and the
    /// report. Settled by what the remote shows now.
    async fn settle_intent(&self, path: &Path) {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read a kept intent; trying again next round");
                return;
            }
        };
        let intent = match serde_json::from_slice::<Intent>(&bytes) {
            Ok(i) => i,
            Err(e) => return set_aside(path, &e.to_string()),
        };
        let cfg = &self.sup.inner.cfg;
        let Some(repo) = cfg.repositories.get(&intent.repository) else {
            return set_aside(path, "its repository is no longer configured on this host");
        };
        let seen = async {
            let env = push::repo_env(&intent.repository, repo).map_err(|e| e.to_string())?;
            let mirror = push::ensure_mirror(&cfg.state_dir.join("push"), &intent.repository)
                .await
                .map_err(|e| e.to_string())?;
            push::remote_ref(&mirror, &repo.url, &intent.reference, &env)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        let (outcome, detail, now) = match seen {
            Ok(n) if n == intent.new => (HandOnOutcome::Completed, None, n),
            Ok(n) => (
                HandOnOutcome::Unknown,
                Some(format!(
                    "this host's supervisor died while pushing; the remote's ref is at {n} now (a push it began may still land)"
                )),
                n,
            ),
            // Not readable now: the next round asks again.
            Err(e) => {
                tracing::warn!(effect_id = %intent.effect_id, error = %e,
                    "a push whose supervisor died cannot be checked yet: the remote cannot be read");
                return;
            }
        };
        let s = Settlement {
            effect_id: intent.effect_id.clone(),
            assignment_id: intent.assignment_id.clone(),
            outcome: outcome.as_str().into(),
            result_digest: result_digest(
                &intent.effect_id,
                outcome,
                &[&intent.old, &intent.new, &now],
            ),
            detail,
        };
        tracing::warn!(effect_id = %intent.effect_id, outcome = outcome.as_str(),
            "a push whose supervisor died settled by what the remote shows now");
        if keep(
            &settle_dir(&self.sup.inner),
            &format!("{}.json", s.effect_id),
            &s,
        )
        .is_ok()
        {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Sends one settlement; its file (and its intent's) goes once the coordinator
    /// recorded or refused it.
    pub(super) async fn send_settlement(&self, s: &Settlement) -> Sent {
        let Some(outcome) = HandOnOutcome::parse(&s.outcome) else {
            return Sent::Later;
        };
        let m = WorkspaceEffect {
            effect_id: s.effect_id.clone(),
            assignment_id: s.assignment_id.clone(),
            step: EffectStep::Settle {
                outcome,
                result_digest: s.result_digest.clone(),
                detail: s.detail.clone(),
            },
        };
        let answer = self
            .ask(
                super::hand_on::answer_key(&s.effect_id, false),
                MessageType::WorkspaceEffect,
                m.fields(),
            )
            .await;
        let sent = match answer {
            Ok(ToHost::WorkspaceEffectAnswer(a)) => match a.verdict {
                HandOnVerdict::Recorded => Sent::Done,
                HandOnVerdict::Refused(c) => {
                    tracing::error!(effect_id = %s.effect_id, category = %c, outcome = %s.outcome,
                        result_digest = %s.result_digest,
                        "the coordinator refused this host's observation of a workspace effect for good");
                    Sent::Done
                }
                _ => Sent::Later,
            },
            Err(e) if e == super::transfer::NO_LINK => Sent::LinkDown,
            _ => Sent::Later,
        };
        if sent == Sent::Done {
            let dir = settle_dir(&self.sup.inner);
            let _ = std::fs::remove_file(dir.join(format!("{}.json", s.effect_id)));
            let _ = std::fs::remove_file(dir.join(format!("{}.intent.json", s.effect_id)));
        }
        sent
    }
}
