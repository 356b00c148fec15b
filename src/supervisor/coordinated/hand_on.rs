//! The host's side of handing done work on (`workspace_order`, migration 0027): its push
//! executor reads the work's final checkpoint from the coordinator's store (verified), works
//! out the exact ref update in its own mirror, claims it, pushes only once admitted (with a
//! lease on the old id), and reports what the remote shows.
//!
//! - A push puts the checkpoint's commit on the work's branch; it never rewinds a branch the
//!   checkpoint does not descend from.
//! - A merge fast-forwards the branch to the checkpoint when it can, else makes a merge
//!   commit of the two (`git merge-tree`); a conflict is declined, nothing claimed.
//! - What it observed is written to `<state_dir>/push/settle/<effect>.json` before it is
//!   sent, and sent again every transfer round until the coordinator recorded (or refused)
//!   it, across restarts too.
//!
//! **Never:** pushes without a fresh admission, after its window, with a force, or from a
//! repository a generation can write; names the remote's URL or a credential in anything it
//! reports; reports an outcome it did not observe (a remote it cannot read after a push is
//! `unknown`, for the operator to resolve).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;
use crate::protocol::messages::{
    hand_on_operation_digest, EffectStep, HandOn, HandOnOutcome, HandOnVerdict, WorkspaceEffect,
    WorkspaceOrder,
};
use crate::protocol::repo::base_ref;
use crate::protocol::schema::MessageType;
use crate::supervisor::push::{self, PushError, ZERO};

/// How long after its admission arrived a push may still start (the coordinator's window
/// is `DISPATCH_WITHIN`, 30 s, from its own commit: this side stays well inside it).
const DISPATCH_WINDOW: Duration = Duration::from_secs(20);

/// The key an answer about effect `effect_id` is waited for under.
pub(super) fn answer_key(effect_id: &str, claim: bool) -> String {
    format!("e:{effect_id}:{}", if claim { "claim" } else { "settle" })
}

/// What the host observed of one effect, kept until the coordinator recorded it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Settlement {
    effect_id: String,
    assignment_id: String,
    outcome: String,
    result_digest: String,
    detail: Option<String>,
}

fn settle_dir(inner: &crate::supervisor::Inner) -> PathBuf {
    inner.cfg.state_dir.join("push").join("settle")
}

/// The digest of what was observed.
fn result_digest(effect_id: &str, outcome: HandOnOutcome, parts: &[&str]) -> String {
    let mut all: Vec<&[u8]> = vec![effect_id.as_bytes(), outcome.as_str().as_bytes()];
    all.extend(parts.iter().map(|p| p.as_bytes()));
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/workspace-effect-result/v1", &all)
    )
}

/// A detail as it may be reported: the remote's URL cut out, at most 400 characters.
fn clean(detail: &str, url: Option<&str>) -> String {
    let d = match url {
        Some(u) if !u.is_empty() => detail.replace(u, "<remote>"),
        _ => detail.to_string(),
    };
    let d: String = d.chars().take(400).collect();
    if d.is_empty() {
        "(no detail)".into()
    } else {
        d
    }
}

/// The update an effect claims, worked out in the mirror.
enum Plan {
    Update { old: String, new: String },
    UpToDate { at: String },
    Declined(String),
}

impl CoordinatedHost {
    /// A `workspace_order`: made by one executor per effect (a repeat of the order while
    /// it runs is dropped; after it, the coordinator answers the claim or settlement
    /// itself).
    pub(super) fn on_workspace_order(self: &Arc<Self>, m: WorkspaceOrder) {
        let fresh = self
            .transfers
            .hand_ons
            .lock()
            .map(|mut s| s.insert(m.effect_id.clone()))
            .unwrap_or(false);
        if !fresh {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let id = m.effect_id.clone();
            this.hand_on(m).await;
            if let Ok(mut s) = this.transfers.hand_ons.lock() {
                s.remove(&id);
            }
        });
    }

    async fn hand_on(&self, m: WorkspaceOrder) {
        let url = self
            .sup
            .inner
            .cfg
            .repositories
            .get(m.repository.as_str())
            .map(|r| r.url.clone());
        tracing::info!(effect_id = %m.effect_id, assignment_id = %m.assignment_id, kind = m.kind.as_str(),
            reference = %m.reference, "workspace effect: reading its checkpoint");
        let settlement = match self.plan_and_push(&m).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                let detail = clean(&e, url.as_deref());
                Settlement {
                    effect_id: m.effect_id.clone(),
                    assignment_id: m.assignment_id.clone(),
                    outcome: HandOnOutcome::Declined.as_str().into(),
                    result_digest: result_digest(&m.effect_id, HandOnOutcome::Declined, &[&detail]),
                    detail: Some(detail),
                }
            }
        };
        let settlement = Settlement {
            detail: settlement.detail.map(|d| clean(&d, url.as_deref())),
            ..settlement
        };
        tracing::info!(effect_id = %m.effect_id, outcome = %settlement.outcome,
            detail = settlement.detail.as_deref().unwrap_or(""), "workspace effect settled here");
        let dir = settle_dir(&self.sup.inner);
        let kept = crate::util::durable::ensure_dir(&dir, 0o700)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                let bytes = serde_json::to_vec(&settlement).map_err(|e| e.to_string())?;
                crate::util::durable::write_atomic(
                    &dir.join(format!("{}.json", settlement.effect_id)),
                    &bytes,
                )
                .map_err(|e| e.to_string())
            });
        if let Err(e) = kept {
            // Still sent now; only a restart before it is recorded would lose it.
            tracing::error!(effect_id = %m.effect_id, error = %e,
                "what this workspace effect came to cannot be kept on disk; sending it now");
        }
        crate::supervisor::broker::hold("workspace-effect:settle").await;
        self.send_settlement(&settlement).await;
    }

    /// Every settlement not recorded yet, sent again.
    pub(super) async fn resend_hand_on_settlements(&self) {
        let Ok(entries) = std::fs::read_dir(settle_dir(&self.sup.inner)) else {
            return;
        };
        for e in entries.flatten() {
            let Ok(bytes) = std::fs::read(e.path()) else {
                continue;
            };
            match serde_json::from_slice::<Settlement>(&bytes) {
                Ok(s) => {
                    let running = self
                        .transfers
                        .hand_ons
                        .lock()
                        .map(|h| h.contains(&s.effect_id))
                        .unwrap_or(true);
                    if !running && !self.send_settlement(&s).await {
                        return; // the link is down: next round
                    }
                }
                Err(err) => {
                    tracing::error!(path = %e.path().display(), error = %err,
                        "an unreadable workspace effect settlement: left for the operator");
                }
            }
        }
    }

    /// Sends one settlement; its file goes once the coordinator recorded or refused it.
    /// False when the link is down or the coordinator could not answer now.
    async fn send_settlement(&self, s: &Settlement) -> bool {
        let Some(outcome) = HandOnOutcome::parse(&s.outcome) else {
            return true;
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
                answer_key(&s.effect_id, false),
                MessageType::WorkspaceEffect,
                m.fields(),
            )
            .await;
        let done = match answer {
            Ok(ToHost::WorkspaceEffectAnswer(a)) => match a.verdict {
                HandOnVerdict::Recorded => true,
                HandOnVerdict::Refused(c) => {
                    tracing::warn!(effect_id = %s.effect_id, category = %c,
                        "the coordinator refused this host's workspace effect settlement for good");
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if done {
            let _ = std::fs::remove_file(
                settle_dir(&self.sup.inner).join(format!("{}.json", s.effect_id)),
            );
        }
        done
    }

    /// Reads the checkpoint, works out the update, claims it, and pushes once admitted.
    /// `Ok(None)`: the claim was refused (nothing pushed, nothing to report); `Err`: a
    /// decline before any claim, with its reason.
    async fn plan_and_push(&self, m: &WorkspaceOrder) -> Result<Option<Settlement>, String> {
        let cfg = &self.sup.inner.cfg;
        let name = m.repository.as_str();
        let repo = cfg.repositories.get(name).ok_or_else(|| {
            format!(
                "no repository {name:?} is configured for pushes on this host (its supervisor config needs [repositories.{name}])"
            )
        })?;
        let env = push::repo_env(name, repo).map_err(|e| e.to_string())?;
        let mirror = push::ensure_mirror(&cfg.state_dir.join("push"), name)
            .await
            .map_err(|e| e.to_string())?;
        self.checkpoint_into(m, &mirror).await?;
        let plan = plan(m, &mirror, &repo.url, &env)
            .await
            .map_err(|e| e.to_string())?;
        let settle = |outcome: HandOnOutcome, parts: &[&str], detail: Option<String>| Settlement {
            effect_id: m.effect_id.clone(),
            assignment_id: m.assignment_id.clone(),
            outcome: outcome.as_str().into(),
            result_digest: result_digest(&m.effect_id, outcome, parts),
            detail,
        };
        let (old, new) = match plan {
            Plan::Declined(why) => return Err(why),
            Plan::UpToDate { at } => {
                return Ok(Some(settle(HandOnOutcome::UpToDate, &[&at], None)))
            }
            Plan::Update { old, new } => (old, new),
        };
        // The claim: exactly this update.
        let claim = WorkspaceEffect {
            effect_id: m.effect_id.clone(),
            assignment_id: m.assignment_id.clone(),
            step: EffectStep::Claim {
                old_id: old.clone(),
                new_id: new.clone(),
                operation_digest: hand_on_operation_digest(
                    &m.effect_id,
                    m.kind.as_str(),
                    name,
                    &m.reference,
                    &m.checkpoint.commit_id,
                    &old,
                    &new,
                ),
            },
        };
        let answer = self
            .ask(
                answer_key(&m.effect_id, true),
                MessageType::WorkspaceEffect,
                claim.fields(),
            )
            .await;
        let admitted_at = Instant::now();
        match answer {
            Ok(ToHost::WorkspaceEffectAnswer(a)) if a.verdict == HandOnVerdict::Admitted => {}
            Ok(ToHost::WorkspaceEffectAnswer(HandOnWire {
                verdict: HandOnVerdict::Refused(c),
                ..
            })) => {
                tracing::warn!(effect_id = %m.effect_id, category = %c, "workspace effect claim refused: nothing pushed");
                return Ok(None);
            }
            // Not answered: it may or may not have been admitted, and it is not pushed.
            _ => {
                return Ok(Some(settle(
                    HandOnOutcome::NotDispatched,
                    &[&old, &new],
                    Some("its claim went unanswered: nothing was pushed".into()),
                )))
            }
        }
        if admitted_at.elapsed() > DISPATCH_WINDOW {
            return Ok(Some(settle(
                HandOnOutcome::NotDispatched,
                &[&old, &new],
                Some("admitted too late to push".into()),
            )));
        }
        let lease = format!(
            "--force-with-lease={}:{}",
            m.reference,
            if old == ZERO { "" } else { &old }
        );
        let pushed = push::git(
            &mirror,
            &[
                "push",
                "--porcelain",
                "--quiet",
                &lease,
                &repo.url,
                &format!("{new}:{}", m.reference),
            ],
            &env,
        )
        .await;
        // What the remote has now says what happened, whatever git answered.
        let now = push::remote_ref(&mirror, &repo.url, &m.reference, &env).await;
        Ok(Some(match (&pushed, now) {
            (_, Ok(n)) if n == new => settle(HandOnOutcome::Completed, &[&old, &new, &n], None),
            (Err(e), Ok(n)) => settle(
                HandOnOutcome::Failed,
                &[&old, &new, &n],
                Some(format!("the remote refused it: {e}")),
            ),
            (Ok(_), Ok(n)) => settle(
                HandOnOutcome::Unknown,
                &[&old, &new, &n],
                Some(format!(
                    "git reported a push, yet the remote's ref is at {n}"
                )),
            ),
            (_, Err(e)) => settle(
                HandOnOutcome::Unknown,
                &[&old, &new],
                Some(format!("the remote cannot be read after the push: {e}")),
            ),
        }))
    }

    /// The checkpoint's commit in `mirror`: already there, or its objects fetched from the
    /// store (base, then bundle), each verified, and the commit's tree checked.
    async fn checkpoint_into(&self, m: &WorkspaceOrder, mirror: &Path) -> Result<(), String> {
        let p = &m.checkpoint;
        let has = |c: &str| {
            let c = format!("{c}^{{commit}}");
            async move {
                push::git(mirror, &["cat-file", "-e", &c], &[])
                    .await
                    .is_ok()
            }
        };
        if !has(&p.commit_id).await {
            let missing = |what: &str| {
                format!("the final checkpoint's {what} is not in the coordinator's store")
            };
            let _one = self.transfers.fetching.lock().await;
            if let Some(b) = &p.base_commit_id {
                if !has(b).await {
                    let obj = p.base_object.as_ref().ok_or_else(|| missing("base"))?;
                    let r = base_ref(b);
                    self.fetch_verified(m, obj, mirror, &format!("{r}:{r}"))
                        .await?;
                }
            }
            let obj = p.bundle_object.as_ref().ok_or_else(|| missing("bundle"))?;
            let incoming = format!("refs/mosaic/incoming/{}", m.effect_id);
            self.fetch_verified(
                m,
                obj,
                mirror,
                &format!("+refs/mosaic/checkpoints/*:{incoming}/*"),
            )
            .await?;
            // Only the objects stay: the refs a bundle carries are its maker's names.
            if let Ok(refs) = push::git(
                mirror,
                &["for-each-ref", "--format=%(refname)", &incoming],
                &[],
            )
            .await
            {
                for r in refs.lines() {
                    let _ = push::git(mirror, &["update-ref", "-d", r], &[]).await;
                }
            }
            // Kept reachable from a name of the effect's own while it is handed on.
            push::git(
                mirror,
                &[
                    "update-ref",
                    &format!("refs/mosaic/handed-on/{}", m.effect_id),
                    &p.commit_id,
                ],
                &[],
            )
            .await
            .map_err(|_| {
                "the store's bundle does not hold the final checkpoint's commit".to_string()
            })?;
        }
        let tree = push::git(
            mirror,
            &[
                "rev-parse",
                "--verify",
                &format!("{}^{{tree}}", p.commit_id),
            ],
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
        if tree.trim() != p.tree_id {
            return Err(format!(
                "checkpoint {}: its commit's tree is not the recorded one",
                p.checkpoint_digest
            ));
        }
        Ok(())
    }

    async fn fetch_verified(
        &self,
        m: &WorkspaceOrder,
        obj: &crate::protocol::repo::StoredObject,
        mirror: &Path,
        refspec: &str,
    ) -> Result<(), String> {
        let file = super::transfer::scratch(&self.sup.inner)?;
        let got = self
            .fetch_object(&m.assignment_id, &m.effect_id, obj, &file)
            .await;
        let out = match got {
            Ok(()) => {
                let (mi, f, r) = (mirror.to_path_buf(), file.clone(), refspec.to_string());
                tokio::task::spawn_blocking(move || {
                    crate::util::git::fetch_checked(&mi, &f.to_string_lossy(), &r).map(|_| ())
                })
                .await
                .map_err(|e| e.to_string())?
            }
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&file);
        out
    }
}

use crate::protocol::messages::WorkspaceEffectAnswer as HandOnWire;

/// The update `m` makes on the remote, worked out in `mirror` (the remote read with the
/// host's credentials; nothing written to it).
async fn plan(
    m: &WorkspaceOrder,
    mirror: &Path,
    url: &str,
    env: &[(String, String)],
) -> Result<Plan, PushError> {
    let commit = &m.checkpoint.commit_id;
    let old = push::remote_ref(mirror, url, &m.reference, env).await?;
    if !push::is_oid(&old) || old.len() != 40 {
        return Ok(Plan::Declined(format!(
            "the remote names {} with something that is not a SHA-1 object id",
            m.reference
        )));
    }
    if &old == commit {
        return Ok(Plan::UpToDate { at: old });
    }
    if old != ZERO {
        // The remote's commit, to compare histories.
        push::git(mirror, &["fetch", "--no-tags", "--quiet", url, &old], env).await?;
    }
    let is_ancestor = |a: String, b: String| async move {
        push::git_raw(mirror, &["merge-base", "--is-ancestor", &a, &b], &[])
            .await
            .map(|o| o.status.success())
    };
    match m.kind {
        HandOn::Push => {
            if old != ZERO && !is_ancestor(old.clone(), commit.clone()).await? {
                return Ok(Plan::Declined(format!(
                    "{} is at {old} on the remote, which the final checkpoint does not descend from: no force push",
                    m.reference
                )));
            }
            Ok(Plan::Update {
                old,
                new: commit.clone(),
            })
        }
        HandOn::Merge => {
            if old == ZERO {
                return Ok(Plan::Declined(format!(
                    "the remote has no {} to merge into",
                    m.reference
                )));
            }
            if is_ancestor(commit.clone(), old.clone()).await? {
                return Ok(Plan::UpToDate { at: old });
            }
            if is_ancestor(old.clone(), commit.clone()).await? {
                return Ok(Plan::Update {
                    old,
                    new: commit.clone(),
                });
            }
            let out = push::git_raw(
                mirror,
                &[
                    "merge-tree",
                    "--write-tree",
                    "--no-messages",
                    "--name-only",
                    &old,
                    commit,
                ],
                &[],
            )
            .await?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut lines = text.lines();
            let tree = lines.next().unwrap_or("").trim().to_string();
            match out.status.code() {
                Some(0) if push::is_oid(&tree) => {}
                Some(1) => {
                    let files: Vec<&str> = lines.filter(|l| !l.is_empty()).take(10).collect();
                    return Ok(Plan::Declined(format!(
                        "merging into {} conflicts in: {}",
                        m.reference,
                        files.join(", ")
                    )));
                }
                _ => {
                    return Err(PushError::Git(format!(
                        "`git merge-tree` failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                            .lines()
                            .next()
                            .unwrap_or("")
                    )))
                }
            }
            let message = format!(
                "Merge {} into {}\n\nMosaic workspace effect {} (checkpoint {}).\n",
                crate::protocol::repo::branch_of(&m.assignment_id),
                m.reference.trim_start_matches("refs/heads/"),
                m.effect_id,
                m.checkpoint.checkpoint_digest
            );
            let who = vec![
                ("GIT_AUTHOR_NAME".to_string(), "Mosaic".to_string()),
                (
                    "GIT_AUTHOR_EMAIL".to_string(),
                    "mosaic@localhost".to_string(),
                ),
                ("GIT_COMMITTER_NAME".to_string(), "Mosaic".to_string()),
                (
                    "GIT_COMMITTER_EMAIL".to_string(),
                    "mosaic@localhost".to_string(),
                ),
            ];
            let new = push::git(
                mirror,
                &[
                    "commit-tree",
                    &tree,
                    "-p",
                    &old,
                    "-p",
                    commit,
                    "-m",
                    &message,
                ],
                &who,
            )
            .await?
            .trim()
            .to_string();
            Ok(Plan::Update { old, new })
        }
    }
}
