//! An assignment's workspace on this host: a clone of its repository on the branch
//! `mosaic/<assignment_id>`, made once (at its first stage here) and kept for its next
//! generations — a resume, a watchdog replacement, a handoff to another lane of this
//! host — each of which works in it under its own lane's uid.
//!
//! A clone, not a linked `git worktree`: a worktree's git directory lives inside the
//! source repository, which a confined generation must not be able to write (its objects,
//! its other branches, and its hooks, which run as whoever next uses that repository). The
//! clone carries its own objects (`--no-hardlinks`: an object shared by a hard link would
//! be handed to the lane's uid with the source's copy) and lives below the supervisor's
//! state directory, which every confined generation sees covered; the generation sees it
//! only bound over its own working directory (`confine::Policy::workspace_source`).
//!
//! The supervisor runs git here only on a clone it has just made, before any harness has
//! touched it (never in a directory a generation could have written: its config and hooks
//! would be the harness's).

use std::path::{Path, PathBuf};

use super::checkpoints::{has_commit, index_of, store_of};
use super::Inner;
use crate::protocol::repo::{
    base_ref, branch_of, RepoBinding, RepoSource, RestorePoint, WorkspaceInputs,
};
use crate::util::git::git;

/// Where an assignment's workspace is on this host.
pub(crate) fn dir_of(inner: &Inner, assignment_id: &str) -> PathBuf {
    inner.cfg.state_dir.join("workspaces").join(assignment_id)
}

/// What this host knows of a workspace beside it: the commit it was made from (its
/// checkpoints' parent) and the checkpoint its files are known equal to (`at`: the one
/// taken at its last generation's end or for a handoff, or the one it was restored from —
/// cleared when it is handed to a generation, which may write anything from then on).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Marker {
    pub base_commit_id: Option<String>,
    pub at: Option<String>,
    /// What it was made from (its checkpoints carry the digest); `None` for a workspace
    /// made before inputs were recorded.
    #[serde(default)]
    pub inputs: Option<WorkspaceInputs>,
    /// The checkpoint it held when it was last handed to a generation (restored from it,
    /// or kept because its files were known equal to it): what that generation's `staged`
    /// says it started from.
    #[serde(default)]
    pub started_from: Option<String>,
}

fn marker_path(inner: &Inner, assignment_id: &str) -> PathBuf {
    inner
        .cfg
        .state_dir
        .join("workspaces")
        .join(format!(".{assignment_id}.json"))
}

pub(crate) fn marker(inner: &Inner, assignment_id: &str) -> Option<Marker> {
    let text = std::fs::read(marker_path(inner, assignment_id)).ok()?;
    serde_json::from_slice(&text).ok()
}

pub(crate) fn set_marker(
    inner: &Inner,
    assignment_id: &str,
    base_commit_id: Option<String>,
    at: Option<&str>,
) -> Result<(), String> {
    let old = marker(inner, assignment_id).unwrap_or_default();
    let m = Marker {
        base_commit_id,
        at: at.map(String::from),
        inputs: old.inputs,
        started_from: old.started_from,
    };
    let bytes = serde_json::to_vec(&m).map_err(|e| e.to_string())?;
    crate::util::durable::write_atomic(&marker_path(inner, assignment_id), &bytes)
        .map_err(|e| format!("recording the workspace of {assignment_id}: {e}"))
}

/// Forgets the record of `assignment_id`'s workspace (once the workspace is gone).
pub(crate) fn forget(inner: &Inner, assignment_id: &str) -> Result<(), String> {
    match std::fs::remove_file(marker_path(inner, assignment_id)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!(
            "removing the record of workspace {assignment_id}: {e}"
        )),
        _ => Ok(()),
    }
}

/// The workspace of a coordinated generation's work, if it has a repository (`ensure`, off
/// the runtime's threads).
pub(crate) async fn prepare(
    inner: &std::sync::Arc<Inner>,
    binding: Option<&super::state::CoordBinding>,
    lane: Lane<'_>,
) -> Result<Option<PathBuf>, String> {
    let Some((binding, repo)) = binding.and_then(|b| Some((b, b.repository.clone()?))) else {
        return Ok(None);
    };
    let (inner, asg) = (inner.clone(), binding.assignment_id.clone());
    let restore = binding.restore.clone();
    let (name, id, uid, cg) = (
        lane.name.to_string(),
        lane.id.to_string(),
        lane.uid,
        inner.tree.at_abs(lane.cg.path()),
    );
    tokio::task::spawn_blocking(move || {
        let lane = Lane {
            name: &name,
            id: &id,
            uid,
            cg: &cg,
        };
        ensure(&inner, &asg, &repo, restore.as_deref(), lane)
    })
    .await
    .map_err(|e| format!("workspace task failed: {e}"))?
    .map(Some)
}

/// The lane a workspace is prepared for: its name and id, its uid, and the cgroup of its
/// starting generation (empty: its shim has not started), where a setup's commands run.
#[derive(Clone, Copy)]
pub(crate) struct Lane<'a> {
    pub name: &'a str,
    pub id: &'a str,
    pub uid: Option<u32>,
    pub cg: &'a crate::cgroup::Cg,
}

/// The workspace of `assignment_id`: kept when this host's is already `restore`'s files
/// (or there is no checkpoint), else restored from `restore` (this host's checkpoint
/// repository must hold it: the stage fetched it), else made from `repo`; given to `uid`
/// (the lane's) when there is one. A workspace of this host that is not the latest
/// checkpoint's (the work went on elsewhere) is set aside, never deleted. Blocking.
pub(crate) fn ensure(
    inner: &Inner,
    assignment_id: &str,
    repo: &RepoBinding,
    restore: Option<&RestorePoint>,
    lane: Lane<'_>,
) -> Result<PathBuf, String> {
    let uid = lane.uid;
    if !crate::protocol::report::id_ok(assignment_id) {
        return Err(format!(
            "assignment id {assignment_id:?} is not one Mosaic mints"
        ));
    }
    let dir = dir_of(inner, assignment_id);
    let parent = dir.parent().unwrap_or(&inner.cfg.state_dir).to_path_buf();
    crate::util::durable::ensure_dir(&parent, 0o700).map_err(|e| e.to_string())?;
    if dir.is_dir() {
        let here = marker(inner, assignment_id);
        // Kept only when its files are known to be the point the stage restores. With no
        // point (the stage makes a fresh clone) a workspace here holds what some generation
        // wrote and no checkpoint recorded: never handed on as the fresh clone.
        let current = match (&here, restore) {
            (Some(m), Some(point)) => m.at.as_deref() == Some(point.checkpoint_digest.as_str()),
            // Made before markers: this host's own checkpoint is its files.
            (None, Some(point)) => point.host_id == inner.cfg.host.as_str(),
            (_, None) => false,
        };
        if !current {
            let aside = parent.join(format!(
                ".superseded-{assignment_id}-{}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::rename(&dir, &aside).map_err(|e| e.to_string())?;
            match restore {
                Some(point) => {
                    tracing::warn!(assignment_id, aside = %aside.display(), checkpoint = %point.checkpoint_digest,
                    "this host's workspace is not the work's latest checkpoint: set aside, restoring the checkpoint")
                }
                None => tracing::warn!(assignment_id, aside = %aside.display(),
                    "this host's workspace holds files no checkpoint recorded, and the stage makes a fresh clone: set aside"),
            }
        }
    }
    if !dir.is_dir() {
        // Made aside and renamed into place: a start that dies half-way leaves no
        // half-made workspace under the assignment's name.
        let tmp = parent.join(format!(
            ".new-{assignment_id}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let made = match restore {
            Some(point) => restore_into(inner, &tmp, assignment_id, repo, point),
            None => clone_into(inner, &tmp, assignment_id, repo),
        }
        .and_then(|()| set_up(inner, &tmp, assignment_id, repo, restore, lane));
        if let Err(e) = made.and_then(|()| std::fs::rename(&tmp, &dir).map_err(|e| e.to_string())) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(format!(
                "making the workspace of {assignment_id} from repository {}: {e}",
                repo.name.as_str()
            ));
        }
        match restore {
            Some(p) => tracing::info!(assignment_id, repository = repo.name.as_str(),
                checkpoint = %p.checkpoint_digest, from_host = %p.host_id, "workspace restored from its checkpoint"),
            None => {
                tracing::info!(assignment_id, repository = repo.name.as_str(), base = repo.base.as_str(),
                branch = %branch_of(assignment_id), "workspace made")
            }
        }
    }
    // Its next generation may run under another lane's uid: everything is handed over.
    // Nothing of the assignment runs now (its previous generation's cgroup is empty), so
    // nothing in the tree can change while it is walked; links are not followed.
    if let Some(uid) = uid {
        crate::util::durable::chown_tree(&dir, uid, uid)
            .map_err(|e| format!("giving the workspace of {assignment_id} to uid {uid}: {e}"))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| e.to_string())?;
    hand_over(
        inner,
        assignment_id,
        restore.map(|p| p.checkpoint_digest.clone()),
    )?;
    Ok(dir)
}

/// Records that `assignment_id`'s workspace files are known equal to no checkpoint any more
/// (a generation may write them again).
pub(crate) fn unknown_files(inner: &Inner, assignment_id: &str) -> Result<(), String> {
    let Some(m) = marker(inner, assignment_id) else {
        return Ok(());
    };
    if m.at.is_none() {
        return Ok(());
    }
    let bytes = serde_json::to_vec(&Marker { at: None, ..m }).map_err(|e| e.to_string())?;
    crate::util::durable::write_atomic(&marker_path(inner, assignment_id), &bytes)
        .map_err(|e| format!("recording the workspace of {assignment_id}: {e}"))
}

/// Records that `assignment_id`'s workspace is handed to a generation holding checkpoint
/// `started_from` (restored from it, or kept as equal to it): from now on its files are
/// known equal to no checkpoint (`at` cleared) until one is taken of them again — so a
/// generation whose end is never checkpointed leaves files no later stage trusts.
fn hand_over(
    inner: &Inner,
    assignment_id: &str,
    started_from: Option<String>,
) -> Result<(), String> {
    let m = Marker {
        at: None,
        started_from,
        ..marker(inner, assignment_id).unwrap_or_default()
    };
    let bytes = serde_json::to_vec(&m).map_err(|e| e.to_string())?;
    crate::util::durable::write_atomic(&marker_path(inner, assignment_id), &bytes)
        .map_err(|e| format!("recording the workspace of {assignment_id}: {e}"))
}

fn clone_into(
    inner: &Inner,
    tmp: &Path,
    assignment_id: &str,
    repo: &RepoBinding,
) -> Result<(), String> {
    let tmp_s = tmp.to_string_lossy().to_string();
    git(
        &[
            "clone",
            "--quiet",
            "--no-hardlinks",
            "--no-checkout",
            "--",
            repo.source.as_str(),
            &tmp_s,
        ],
        None,
    )?;
    // The base as the source names it: a local branch or tag, else a branch of the
    // source (a clone has only its default branch locally), else a commit id.
    let base = repo.base.as_str();
    let commit = [
        format!("{base}^{{commit}}"),
        format!("origin/{base}^{{commit}}"),
    ]
    .iter()
    .find_map(|r| git(&["rev-parse", "--verify", "--quiet", r], Some(tmp)).ok())
    .filter(|c| !c.is_empty())
    .ok_or_else(|| format!("no ref {base} in the repository"))?;
    git(
        &[
            "checkout",
            "--quiet",
            "-B",
            &branch_of(assignment_id),
            &commit,
        ],
        Some(tmp),
    )?;
    // The base goes into this host's checkpoint repository, from the clone just made (no
    // harness has touched it): checkpoints are relative to it.
    let store = store_of(inner, &repo.name)?;
    let tmp_s = tmp.to_string_lossy().to_string();
    let r = base_ref(&commit);
    git(
        &[
            "fetch",
            "--quiet",
            "--no-tags",
            &tmp_s,
            &format!("+{commit}:{r}"),
        ],
        Some(&store),
    )?;
    author(tmp, assignment_id)?;
    // The fresh checkout's index seeds the checkpoints' own (its stat data is the files'):
    // the first checkpoint reads only what the agent changed.
    let keep = index_of(&store, assignment_id);
    if let Some(d) = keep.parent() {
        crate::util::durable::ensure_dir(d, 0o700).map_err(|e| e.to_string())?;
    }
    std::fs::copy(tmp.join(".git").join("index"), &keep).map_err(|e| e.to_string())?;
    let bytes = serde_json::to_vec(&Marker {
        base_commit_id: Some(commit),
        at: None,
        inputs: None,
        started_from: None,
    })
    .map_err(|e| e.to_string())?;
    crate::util::durable::write_atomic(&marker_path(inner, assignment_id), &bytes)
        .map_err(|e| e.to_string())
}

/// The fresh workspace `tmp` (made from `repo`, or restored from `restore`) gets its
/// repository's setup — its files copied, then (given to the lane's uid) its commands run
/// — and what it was made from is recorded in its marker. Before it is renamed into place:
/// a setup that fails leaves no workspace, and the next start makes it again.
fn set_up(
    inner: &Inner,
    tmp: &Path,
    assignment_id: &str,
    repo: &RepoBinding,
    restore: Option<&RestorePoint>,
    lane: Lane<'_>,
) -> Result<(), String> {
    let setup = &repo.setup;
    let copied = match (&repo.source, setup.copy().is_empty()) {
        (_, true) => vec![],
        (RepoSource::Path(src), false) => {
            super::setup::copy_files(Path::new(src), tmp, setup.copy(), restore.is_some())?
        }
        (RepoSource::Url(_), false) => {
            return Err("files to copy are declared for a repository without a directory".into())
        }
    };
    let mut commands_run = 0;
    if !setup.commands().is_empty() {
        if let Some(uid) = lane.uid {
            crate::util::durable::chown_tree(tmp, uid, uid)
                .map_err(|e| format!("giving the fresh workspace to uid {uid}: {e}"))?;
        }
        let policy = super::confinement::for_setup(&inner.cfg, lane.name, lane.id, tmp, lane.uid)
            .map_err(|e| e.to_string())?;
        let runner = super::setup::Runner {
            cg: lane.cg,
            policy,
            log: setup_log(inner, assignment_id),
            env: vec![
                (
                    "PATH".into(),
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                ),
                ("HOME".into(), "/tmp".into()),
                ("LANG".into(), "C.UTF-8".into()),
                ("MOSAIC_ASSIGNMENT_ID".into(), assignment_id.into()),
                ("MOSAIC_REPOSITORY".into(), repo.name.as_str().into()),
                ("MOSAIC_WORKSPACE".into(), tmp.display().to_string()),
            ],
        };
        commands_run = super::setup::run_commands(&runner, tmp, setup)?;
        tracing::info!(
            assignment_id,
            repository = repo.name.as_str(),
            commands = commands_run,
            "the fresh workspace's setup ran"
        );
    }
    let mut m = marker(inner, assignment_id).unwrap_or_default();
    m.inputs = Some(WorkspaceInputs {
        repository: repo.name.clone(),
        source: repo.source.clone(),
        base_commit_id: m.base_commit_id.clone(),
        restored_from: restore.map(|p| p.checkpoint_digest.clone()),
        setup_digest: setup.digest(),
        copied,
        commands_run,
    });
    let bytes = serde_json::to_vec(&m).map_err(|e| e.to_string())?;
    crate::util::durable::write_atomic(&marker_path(inner, assignment_id), &bytes)
        .map_err(|e| format!("recording the workspace of {assignment_id}: {e}"))
}

/// Where a workspace's setup writes its commands' output (root's only, beside it).
pub(crate) fn setup_log(inner: &Inner, assignment_id: &str) -> PathBuf {
    inner
        .cfg
        .state_dir
        .join("workspaces")
        .join(format!(".setup-{assignment_id}.log"))
}

/// Commits the agent makes need an author; no host identity is lent to it.
fn author(tmp: &Path, assignment_id: &str) -> Result<(), String> {
    git(&["config", "user.name", "Mosaic agent"], Some(tmp))?;
    git(
        &[
            "config",
            "user.email",
            &format!("{assignment_id}@mosaic.invalid"),
        ],
        Some(tmp),
    )?;
    Ok(())
}

/// A workspace made from a checkpoint this host's checkpoint repository holds: a
/// repository on the branch `mosaic/<assignment_id>` at the checkpoint's base, its files
/// exactly the checkpoint's (checked: the tree they make is the checkpoint's tree), so
/// `git status` shows the work as changes against the base.
fn restore_into(
    inner: &Inner,
    tmp: &Path,
    assignment_id: &str,
    repo: &RepoBinding,
    point: &RestorePoint,
) -> Result<(), String> {
    if !point.well_formed(&repo.name) {
        return Err("the stage's checkpoint is malformed".into());
    }
    let store = store_of(inner, &repo.name)?;
    if !has_commit(&store, &point.commit_id) {
        return Err(format!(
            "checkpoint {} is not in this host's checkpoint repository",
            point.checkpoint_digest
        ));
    }
    super::checkpoints::materialize(
        &store,
        tmp,
        &branch_of(assignment_id),
        point.base_commit_id.as_deref(),
        &point.tree_id,
        Some(&index_of(&store, assignment_id)),
    )?;
    git(
        &["remote", "add", "origin", repo.source.as_str()],
        Some(tmp),
    )?;
    author(tmp, assignment_id)?;
    let bytes = serde_json::to_vec(&Marker {
        base_commit_id: point.base_commit_id.clone(),
        at: Some(point.checkpoint_digest.clone()),
        inputs: None,
        started_from: None,
    })
    .map_err(|e| e.to_string())?;
    crate::util::durable::write_atomic(&marker_path(inner, assignment_id), &bytes)
        .map_err(|e| e.to_string())
}
