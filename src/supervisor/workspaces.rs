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
use std::process::Command;

use super::state::GenRecord;
use super::Inner;
use crate::protocol::repo::{branch_of, checkpoint_ref, CheckpointRef, RepoBinding};

/// Where an assignment's workspace is on this host.
pub(crate) fn dir_of(inner: &Inner, assignment_id: &str) -> PathBuf {
    inner.cfg.state_dir.join("workspaces").join(assignment_id)
}

fn git(args: &[&str], dir: Option<&Path>) -> Result<String, String> {
    git_with(args, dir, &[])
}

/// How long one git command may take (a clone of a large repository, the capture of a
/// large workspace) before it is killed and the step fails.
const GIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

fn git_with(args: &[&str], dir: Option<&Path>, env: &[(&str, &Path)]) -> Result<String, String> {
    let mut c = Command::new("git");
    if let Some(d) = dir {
        c.arg("-C").arg(d);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    // Nothing of the host's git configuration (system, root's global, XDG), no prompt (a
    // remote that asks for a password fails instead of hanging the start).
    c.args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let what = args
        .iter()
        .find(|a| !a.starts_with('-') && !a.contains('='))
        .copied()
        .unwrap_or("");
    let child = c
        .spawn()
        .map_err(|e| format!("running git (is it installed?): {e}"))?;
    // Waited for with a deadline, killed past it: nothing git reads may hold a start or a
    // receipt forever.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(GIT_DEADLINE) {
        Ok(r) => r.map_err(|e| format!("waiting for git {what}: {e}"))?,
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = waiter.join();
            return Err(format!(
                "git {what} took longer than {} s: killed",
                GIT_DEADLINE.as_secs()
            ));
        }
    };
    let _ = waiter.join();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "git {what} failed: {}",
            err.trim().chars().take(400).collect::<String>()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The workspace of a coordinated generation's work, if it has a repository (`ensure`, off
/// the runtime's threads).
pub(crate) async fn prepare(
    inner: &std::sync::Arc<Inner>,
    binding: Option<&super::state::CoordBinding>,
    uid: Option<u32>,
) -> Result<Option<PathBuf>, String> {
    let Some((binding, repo)) = binding.and_then(|b| Some((b, b.repository.clone()?))) else {
        return Ok(None);
    };
    let (inner, asg) = (inner.clone(), binding.assignment_id.clone());
    tokio::task::spawn_blocking(move || ensure(&inner, &asg, &repo, uid))
        .await
        .map_err(|e| format!("workspace task failed: {e}"))?
        .map(Some)
}

/// The workspace of `assignment_id`, made from `repo` if this host has none yet, and
/// given to `uid` (the lane's) when there is one. Blocking.
pub(crate) fn ensure(
    inner: &Inner,
    assignment_id: &str,
    repo: &RepoBinding,
    uid: Option<u32>,
) -> Result<PathBuf, String> {
    if !crate::protocol::report::id_ok(assignment_id) {
        return Err(format!(
            "assignment id {assignment_id:?} is not one Mosaic mints"
        ));
    }
    let dir = dir_of(inner, assignment_id);
    if !dir.is_dir() {
        let parent = dir.parent().unwrap_or(&inner.cfg.state_dir).to_path_buf();
        crate::util::durable::ensure_dir(&parent, 0o700).map_err(|e| e.to_string())?;
        // Made aside and renamed into place: a start that dies half-way leaves no
        // half-made workspace under the assignment's name.
        let tmp = parent.join(format!(
            ".new-{assignment_id}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let made = clone_into(&tmp, assignment_id, repo);
        if let Err(e) = made.and_then(|()| std::fs::rename(&tmp, &dir).map_err(|e| e.to_string())) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(format!(
                "making the workspace of {assignment_id} from repository {}: {e}",
                repo.name.as_str()
            ));
        }
        tracing::info!(assignment_id, repository = repo.name.as_str(), base = repo.base.as_str(),
            branch = %branch_of(assignment_id), "workspace made");
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
    Ok(dir)
}

fn clone_into(tmp: &Path, assignment_id: &str, repo: &RepoBinding) -> Result<(), String> {
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
    // Commits the agent makes need an author; no host identity is lent to it.
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

/// git's empty tree: the attribute source of a checkpoint, so no `.gitattributes` of the
/// workspace converts a byte of what is captured (line endings, filters).
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// A checkpoint of the workspace of `rec`'s work, if it works in a repository and its
/// workspace exists here: every file the repository does not ignore (committed or not,
/// untracked too), as a synthetic commit on a hidden ref of this host's checkpoint
/// repository for it. The call comes only once the generation's cgroup is verified empty
/// (nothing of it can change the tree meanwhile). git runs with the checkpoint
/// repository's own directory, index and configuration: the workspace is read as files,
/// its `.git` (config, hooks, index) never consulted. Blocking.
pub(crate) fn checkpoint(inner: &Inner, rec: &GenRecord) -> Option<Result<CheckpointRef, String>> {
    let c = rec.coord.as_ref()?;
    let repo = c.repository.as_ref()?;
    let ws = dir_of(inner, &c.assignment_id);
    if !ws.is_dir() {
        return None; // never made (its start failed before): nothing was written
    }
    Some(capture(
        inner,
        &ws,
        &c.assignment_id,
        &rec.lane_incarnation_id,
        rec.generation,
        repo,
    ))
}

/// Most a workspace may hold to be checkpointed (regular files' sizes, sparse ones
/// counted whole) and most files: beyond, the checkpoint fails with the reason.
pub(crate) const CHECKPOINT_MAX_BYTES: u64 = 1 << 30;
pub(crate) const CHECKPOINT_MAX_FILES: usize = 200_000;

/// What the capture would refuse to read, found before git runs (nothing of the assignment
/// runs now, so the tree cannot change after this walk): a `.gitignore` that is not a
/// regular file (git would open a FIFO and wait forever, or follow a link as root), a
/// nested repository (git would read whatever its `.git` names and record only a commit
/// id: its files would be lost), more than the limits. Links are never followed.
fn survey(ws: &Path) -> Result<(), String> {
    let (mut bytes, mut files) = (0u64, 0usize);
    let mut stack = vec![ws.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for e in entries {
            let e = e.map_err(|e| e.to_string())?;
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).map_err(|e| e.to_string())?;
            let name = e.file_name();
            let rel = p.strip_prefix(ws).unwrap_or(&p).display().to_string();
            if name == ".git" {
                if dir == ws {
                    continue; // the agent's own repository: never read
                }
                return Err(format!(
                    "a nested repository at {rel}: its files cannot be checkpointed"
                ));
            }
            if (name == ".gitignore" || name == ".gitattributes") && !meta.is_file() {
                return Err(format!("{rel} is not a regular file"));
            }
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() {
                files += 1;
                bytes = bytes.saturating_add(meta.len());
            }
            if bytes > CHECKPOINT_MAX_BYTES || files > CHECKPOINT_MAX_FILES {
                return Err(format!(
                    "the workspace holds more than {} MiB or {CHECKPOINT_MAX_FILES} files",
                    CHECKPOINT_MAX_BYTES >> 20
                ));
            }
        }
    }
    Ok(())
}

fn capture(
    inner: &Inner,
    ws: &Path,
    assignment_id: &str,
    incarnation: &str,
    generation: u64,
    repo: &RepoBinding,
) -> Result<CheckpointRef, String> {
    survey(ws)?;
    let dir = inner.cfg.state_dir.join("checkpoints");
    crate::util::durable::ensure_dir(&dir, 0o700).map_err(|e| e.to_string())?;
    let store = dir.join(format!("{}.git", repo.name.as_str()));
    if !store.is_dir() {
        let s = store.to_string_lossy().to_string();
        git(&["init", "--quiet", "--bare", &s], None)?;
    }
    let index = dir.join(format!(".index-{}", uuid::Uuid::new_v4().simple()));
    let null = Path::new("/dev/null");
    let env: [(&str, &Path); 5] = [
        ("GIT_DIR", &store),
        ("GIT_WORK_TREE", ws),
        ("GIT_INDEX_FILE", &index),
        ("GIT_CONFIG_GLOBAL", null),
        ("GIT_ATTR_SOURCE", Path::new(EMPTY_TREE)),
    ];
    let exact = [
        "-c",
        "core.autocrlf=false",
        "-c",
        "core.safecrlf=false",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.untrackedCache=false",
        "-c",
        "core.symlinks=true",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "user.name=Mosaic",
        "-c",
        "user.email=checkpoint@mosaic.invalid",
        "-c",
        "core.excludesFile=/dev/null",
        "-c",
        "core.attributesFile=/dev/null",
    ];
    let run = |args: &[&str]| {
        let all: Vec<&str> = exact.iter().chain(args).copied().collect();
        git_with(&all, Some(ws), &env)
    };
    let made = (|| {
        run(&["add", "--all", "--", "."])?;
        let tree_id = run(&["write-tree"])?;
        let msg =
            format!("mosaic checkpoint of {assignment_id}, {incarnation} generation {generation}");
        let commit_id = run(&["commit-tree", &tree_id, "-m", &msg])?;
        // Never over another checkpoint's ref (the zero id: it must not exist yet).
        let zero = "0".repeat(40);
        let r = checkpoint_ref(assignment_id, incarnation, generation);
        run(&["update-ref", &r, &commit_id, &zero])?;
        Ok::<_, String>(CheckpointRef {
            repository: repo.name.clone(),
            commit_id,
            tree_id,
        })
    })();
    let _ = std::fs::remove_file(&index);
    let c = made?;
    if !c.well_formed() {
        return Err(format!(
            "git answered {:?} / {:?} for the checkpoint's ids",
            c.commit_id, c.tree_id
        ));
    }
    tracing::info!(assignment_id, generation, repository = repo.name.as_str(),
        commit = %c.commit_id, digest = %c.digest(), "workspace checkpointed");
    Ok(c)
}
