//! The ref update a `workspace push|merge` makes, worked out in the supervisor's mirror of
//! the repository (`coordinated::hand_on` claims and pushes it): the remote read with the
//! host's credentials, nothing written to it.
//!
//! - A push puts the final checkpoint's commit on the work's branch, only over an ancestor
//!   of it (never a force).
//! - A merge fast-forwards the branch when it has not moved, finds it up to date when it
//!   already holds the checkpoint, else makes a two-parent commit of `git merge-tree`'s
//!   tree; a conflict is declined with the files.
//!
//! **Never:** writes to the remote, reads git's configuration from anywhere but the
//! mirror, or reports what git said about the remote (it names the remote's location): a
//! failure talking to the remote is a fixed reason and the digest of git's words.

use std::path::Path;

use crate::protocol::messages::{HandOn, WorkspaceOrder};
use crate::supervisor::push::{self, PushError, ZERO};

/// The update an effect claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    Update { old: String, new: String },
    UpToDate { at: String },
    Declined(String),
}

/// What a git failure talking to the remote is reported as: `what`, and the digest of
/// git's own words (kept in this host's log; they may name the remote).
pub(crate) fn remote_failure(what: &str, e: &PushError) -> String {
    let said = e.to_string();
    tracing::warn!(error = %said, "{what}");
    format!(
        "{what} (git's message, in this host's log: sha256:{})",
        &crate::util::sha256_hex("mosaic/git-message/v1", &[said.as_bytes()])[..16]
    )
}

/// Whether `a` is an ancestor of `b` in `mirror` (an error when git cannot tell: a
/// missing object is not "no").
async fn is_ancestor(mirror: &Path, a: &str, b: &str) -> Result<bool, PushError> {
    let out = push::git_raw(mirror, &["merge-base", "--is-ancestor", a, b], &[]).await?;
    match out.status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => Err(PushError::Git(format!(
            "`git merge-base` could not compare {a} and {b}"
        ))),
    }
}

/// The update `m` makes on the remote at `url`, worked out in `mirror`.
pub(crate) async fn plan(
    m: &WorkspaceOrder,
    mirror: &Path,
    url: &str,
    env: &[(String, String)],
) -> Result<Plan, String> {
    let commit = &m.checkpoint.commit_id;
    let old = push::remote_ref(mirror, url, &m.reference, env)
        .await
        .map_err(|e| remote_failure("the remote could not be read", &e))?;
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
        push::git(mirror, &["fetch", "--no-tags", "--quiet", url, &old], env)
            .await
            .map_err(|e| remote_failure("the remote's commit could not be fetched", &e))?;
    }
    let ancestor = |a: &str, b: &str| {
        let (a, b) = (a.to_string(), b.to_string());
        async move { is_ancestor(mirror, &a, &b).await.map_err(|e| e.to_string()) }
    };
    match m.kind {
        HandOn::Push => {
            if old != ZERO && !ancestor(&old, commit).await? {
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
            if ancestor(commit, &old).await? {
                return Ok(Plan::UpToDate { at: old });
            }
            if ancestor(&old, commit).await? {
                return Ok(Plan::Update {
                    old,
                    new: commit.clone(),
                });
            }
            merged(m, mirror, old).await.map_err(|e| e.to_string())
        }
    }
}

/// A merge commit of the remote's `old` and the checkpoint, or the decline of a conflict.
async fn merged(m: &WorkspaceOrder, mirror: &Path, old: String) -> Result<Plan, PushError> {
    let commit = &m.checkpoint.commit_id;
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
        _ => return Err(PushError::Git("`git merge-tree` failed".into())),
    }
    let message = format!(
        "Merge {} into {}\n\nMosaic workspace effect {} (checkpoint {}).\n",
        crate::protocol::repo::branch_of(&m.assignment_id),
        m.reference.trim_start_matches("refs/heads/"),
        m.effect_id,
        m.checkpoint.checkpoint_digest
    );
    let who: Vec<(String, String)> = [
        ("GIT_AUTHOR_NAME", "Mosaic"),
        ("GIT_AUTHOR_EMAIL", "mosaic@localhost"),
        ("GIT_COMMITTER_NAME", "Mosaic"),
        ("GIT_COMMITTER_EMAIL", "mosaic@localhost"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
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
