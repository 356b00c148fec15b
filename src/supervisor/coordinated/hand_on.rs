//! The host's side of handing done work on (`workspace_order`, migration 0027): its push
//! executor reads the work's final checkpoint from the coordinator's store (verified), works
//! out the exact ref update in its own mirror (`hand_on_plan`), claims it, pushes only once
//! admitted (with a lease on the old id, inside the window the admission names), and
//! reports what the remote shows (`hand_on_kept` keeps the intent and the observation on
//! disk until the coordinator recorded it).
//!
//! **Never:** pushes without an admission of exactly its update, after its window, with a
//! force, or from a repository a generation can write; names the remote's URL or a
//! credential in anything it reports; reports an outcome it did not observe.

use std::path::Path;
use std::time::{Duration, Instant};

use super::hand_on_kept::{clean, keep, result_digest, settle_dir, Intent, Settlement};
use super::*;
use crate::protocol::messages::{
    hand_on_operation_digest, EffectStep, HandOnOutcome, HandOnVerdict, WorkspaceEffect,
    WorkspaceOrder,
};
use crate::protocol::repo::base_ref;
use crate::protocol::schema::MessageType;
use crate::supervisor::hand_on_plan::{plan, remote_failure, Plan};
use crate::supervisor::push::{self, ZERO};

/// The longest window this side takes an admission to give (the coordinator's is 30 s
/// from its commit; the answer's own figure is counted from before the claim was sent).
const MAX_WINDOW: Duration = Duration::from_secs(30);
/// How long an unanswered or not-now claim is sent again (the same claim: a repeat is
/// the same admission, answered only while it holds).
const CLAIM_FOR: Duration = Duration::from_secs(120);
const CLAIM_AGAIN_EVERY: Duration = Duration::from_secs(2);

/// The key an answer about effect `effect_id` is waited for under.
pub(super) fn answer_key(effect_id: &str, claim: bool) -> String {
    format!("e:{effect_id}:{}", if claim { "claim" } else { "settle" })
}

/// Takes an effect's id out of the running set however its executor ends (a panic
/// included), and the name that kept its checkpoint reachable in the mirror.
struct Running<'a> {
    host: &'a CoordinatedHost,
    effect_id: String,
    mirror: Option<std::path::PathBuf>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.host.transfers.hand_ons.lock() {
            s.remove(&self.effect_id);
        }
        if let Some(m) = &self.mirror {
            let r = format!("refs/mosaic/handed-on/{}", self.effect_id);
            let _ = crate::util::git::git(&["update-ref", "-d", &r], Some(m));
        }
    }
}

/// How a claim went.
enum Claimed {
    /// Admitted: push before this instant.
    Admitted(Instant),
    /// Refused for good (the category): nothing pushed.
    Refused(String),
    /// Never answered as admitted while it was sent: nothing pushed.
    Unanswered,
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
            let mut running = Running {
                host: &this,
                effect_id: m.effect_id.clone(),
                mirror: None,
            };
            this.hand_on(m, &mut running).await;
        });
    }

    async fn hand_on(&self, m: WorkspaceOrder, running: &mut Running<'_>) {
        let url = self
            .sup
            .inner
            .cfg
            .repositories
            .get(m.repository.as_str())
            .map(|r| r.url.clone());
        tracing::info!(effect_id = %m.effect_id, assignment_id = %m.assignment_id, kind = m.kind.as_str(),
            reference = %m.reference, "workspace effect: reading its checkpoint");
        let settlement = match self.plan_and_push(&m, running).await {
            Ok(s) => s,
            Err(e) => Settlement {
                effect_id: m.effect_id.clone(),
                assignment_id: m.assignment_id.clone(),
                outcome: HandOnOutcome::Declined.as_str().into(),
                result_digest: result_digest(&m.effect_id, HandOnOutcome::Declined, &[&e]),
                detail: Some(e),
            },
        };
        let settlement = Settlement {
            detail: settlement.detail.map(|d| clean(&d, url.as_deref())),
            ..settlement
        };
        tracing::info!(effect_id = %m.effect_id, outcome = %settlement.outcome,
            detail = settlement.detail.as_deref().unwrap_or(""), "workspace effect settled here");
        let file = format!("{}.json", settlement.effect_id);
        let dir = settle_dir(&self.sup.inner);
        let mut kept = match keep(&dir, &file, &settlement) {
            Ok(()) => true,
            Err(e) => {
                // Held in memory instead, and sent until recorded (or kept after all);
                // only a restart before then would lose it.
                tracing::error!(effect_id = %m.effect_id, error = %e,
                    "what this workspace effect came to cannot be kept on disk; sending it until it is recorded");
                false
            }
        };
        crate::supervisor::broker::hold("workspace-effect:settle").await;
        let mut wait = Duration::from_secs(1);
        // A kept settlement is sent again by the upload loop; one only in memory, here.
        while self.send_settlement(&settlement).await != super::hand_on_kept::Sent::Done && !kept {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(30));
            kept = keep(&dir, &file, &settlement).is_ok();
        }
    }

    /// Reads the checkpoint, works out the update, claims it, and pushes once admitted;
    /// what came of it. `Err`: a decline before any claim, with its reason.
    async fn plan_and_push(
        &self,
        m: &WorkspaceOrder,
        running: &mut Running<'_>,
    ) -> Result<Settlement, String> {
        let cfg = &self.sup.inner.cfg;
        let name = m.repository.as_str();
        let repo = cfg.repositories.get(name).ok_or_else(|| {
            format!(
                "no repository {name:?} is configured for pushes on this host (its supervisor config needs [repositories.{name}])"
            )
        })?;
        let env = push::repo_env(name, repo)
            .map_err(|_| format!("the env file of repository {name:?} cannot be read"))?;
        let mirror = push::ensure_mirror(&cfg.state_dir.join("push"), name)
            .await
            .map_err(|e| e.to_string())?;
        running.mirror = Some(mirror.clone());
        self.checkpoint_into(m, &mirror).await?;
        let settle = |outcome: HandOnOutcome, parts: &[&str], detail: Option<String>| Settlement {
            effect_id: m.effect_id.clone(),
            assignment_id: m.assignment_id.clone(),
            outcome: outcome.as_str().into(),
            result_digest: result_digest(&m.effect_id, outcome, parts),
            detail,
        };
        let (old, new) = match plan(m, &mirror, &repo.url, &env).await? {
            Plan::Declined(why) => return Err(why),
            Plan::UpToDate { at } => return Ok(settle(HandOnOutcome::UpToDate, &[&at], None)),
            Plan::Update { old, new } => (old, new),
        };
        let operation_digest = hand_on_operation_digest(
            &m.effect_id,
            m.kind.as_str(),
            name,
            &m.reference,
            &m.checkpoint.commit_id,
            &old,
            &new,
        );
        let until = match self.claim(m, &old, &new, &operation_digest).await {
            Claimed::Admitted(until) => until,
            // Whatever the claim's row is now (still requested, admitted to a repeat whose
            // answer was lost, unknown), "not dispatched" is what happened here.
            Claimed::Refused(c) => {
                return Ok(settle(
                    HandOnOutcome::NotDispatched,
                    &[&old, &new],
                    Some(format!("its claim was refused ({c}): nothing was pushed")),
                ))
            }
            Claimed::Unanswered => {
                return Ok(settle(
                    HandOnOutcome::NotDispatched,
                    &[&old, &new],
                    Some("its claim was never answered as admitted: nothing was pushed".into()),
                ))
            }
        };
        // The exact update, on disk before it is sent: a process that dies pushing leaves
        // it for the next one to settle by what the remote shows.
        let intent = Intent {
            effect_id: m.effect_id.clone(),
            assignment_id: m.assignment_id.clone(),
            repository: name.to_string(),
            reference: m.reference.clone(),
            old: old.clone(),
            new: new.clone(),
        };
        if let Err(e) = keep(
            &settle_dir(&self.sup.inner),
            &format!("{}.intent.json", m.effect_id),
            &intent,
        ) {
            return Ok(settle(
                HandOnOutcome::NotDispatched,
                &[&old, &new],
                Some(format!(
                    "its intent could not be kept on disk ({e}): nothing was pushed"
                )),
            ));
        }
        crate::supervisor::broker::hold("workspace-effect:pre-push").await;
        if Instant::now() >= until {
            return Ok(settle(
                HandOnOutcome::NotDispatched,
                &[&old, &new],
                Some("admitted too late to push: nothing was pushed".into()),
            ));
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
        Ok(match (&pushed, now) {
            (_, Ok(n)) if n == new => settle(HandOnOutcome::Completed, &[&old, &new, &n], None),
            (Err(e), Ok(n)) => settle(
                HandOnOutcome::Failed,
                &[&old, &new, &n],
                Some(format!(
                    "{}; its ref is at {n}",
                    remote_failure("the remote refused the update", e)
                )),
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
                Some(remote_failure(
                    "the remote cannot be read after the push",
                    &e,
                )),
            ),
        })
    }

    /// Claims exactly `old` → `new`: sent again while unanswered or answered "not now"
    /// (a repeat is the same claim), for up to `CLAIM_FOR`. An admission counts only when
    /// it names this very update; its window runs from before the claim was sent.
    async fn claim(&self, m: &WorkspaceOrder, old: &str, new: &str, digest: &str) -> Claimed {
        let claim = WorkspaceEffect {
            effect_id: m.effect_id.clone(),
            assignment_id: m.assignment_id.clone(),
            step: EffectStep::Claim {
                old_id: old.to_string(),
                new_id: new.to_string(),
                operation_digest: digest.to_string(),
            },
        };
        let started = Instant::now();
        loop {
            let sent_at = Instant::now();
            let answer = self
                .ask(
                    answer_key(&m.effect_id, true),
                    MessageType::WorkspaceEffect,
                    claim.fields(),
                )
                .await;
            // Not answered: whether it committed is unknown; the same claim again says (a
            // repeat of it is answered as it stands). Another claim's answer, or "not now":
            // asked again too.
            if let Ok(ToHost::WorkspaceEffectAnswer(a)) = answer {
                match (a.verdict, a.admitted) {
                    (HandOnVerdict::Admitted, Some((d, ms))) if d == digest => {
                        let window = Duration::from_millis(ms).min(MAX_WINDOW);
                        return Claimed::Admitted(sent_at + window);
                    }
                    (HandOnVerdict::Refused(c), _) => return Claimed::Refused(c),
                    _ => {}
                }
            }
            if started.elapsed() >= CLAIM_FOR {
                return Claimed::Unanswered;
            }
            tokio::time::sleep(CLAIM_AGAIN_EVERY).await;
        }
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
