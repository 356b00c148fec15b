//! Checkpoints of workspaces on this host: each a synthetic commit of every file the
//! repository does not ignore, on a hidden ref of the host's own checkpoint repository for
//! that repository (`<state_dir>/checkpoints/<repo>.git`), its parent the workspace's base
//! commit. git reads the workspace as files there — its own git directory, a private index,
//! no attributes, no configuration of the host or of the workspace: the agent's `.git`
//! (index, hooks, config) is never consulted.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::state::GenRecord;
use super::Inner;
use crate::protocol::repo::{checkpoint_ref, CheckpointRef, RepoBinding, RepoName};
use crate::util::git::{git, git_with};

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
    // Held read-only (then fenced) since its handoff's checkpoint: that is its tree, and
    // its workspace may since be another generation's (never read again).
    if let Some(h) = &rec.handoff_checkpoint {
        return Some(end_at(inner, &c.assignment_id, rec, repo, &h.checkpoint));
    }
    let ws = super::workspaces::dir_of(inner, &c.assignment_id);
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
        Kind::End,
    ))
}

/// The end checkpoint of `rec` is `taken` (its handoff's): the generation's checkpoint ref
/// set to it (so it is uploaded as this generation's end).
fn end_at(
    inner: &Inner,
    assignment_id: &str,
    rec: &GenRecord,
    repo: &RepoBinding,
    taken: &CheckpointRef,
) -> Result<CheckpointRef, String> {
    let store = store_of(inner, &repo.name)?;
    let reference = checkpoint_ref(assignment_id, &rec.lane_incarnation_id, rec.generation);
    git(&["update-ref", &reference, &taken.commit_id], Some(&store))?;
    tracing::info!(assignment_id, generation = rec.generation, digest = %taken.digest(),
        "the generation ends on its handoff's checkpoint (its workspace was read-only since)");
    Ok(taken.clone())
}

/// Which checkpoint of a generation a capture is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// At its end (its cgroup verified empty).
    End,
    /// For a handoff, its workspace held read-only.
    Handoff,
    /// Its harness's `n`th request, its cgroup frozen.
    Requested(u32),
}

/// The hidden ref of a checkpoint of `kind`.
fn ref_of(assignment_id: &str, incarnation: &str, generation: u64, kind: Kind) -> String {
    let r = checkpoint_ref(assignment_id, incarnation, generation);
    match kind {
        Kind::End => r,
        Kind::Handoff => format!("{r}{HANDOFF_SUFFIX}"),
        Kind::Requested(n) => format!("{r}{REQUEST_SUFFIX}{n}"),
    }
}

/// What ends the ref of a handoff's checkpoint.
pub(crate) const HANDOFF_SUFFIX: &str = ".handoff";
/// What precedes the number that ends the ref of a requested checkpoint.
pub(crate) const REQUEST_SUFFIX: &str = ".request-";

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

/// The checkpoint repository of `repo` on this host (bare; made when first needed).
pub(crate) fn store_of(inner: &Inner, repo: &RepoName) -> Result<PathBuf, String> {
    let dir = inner.cfg.state_dir.join("checkpoints");
    crate::util::durable::ensure_dir(&dir, 0o700).map_err(|e| e.to_string())?;
    let store = dir.join(format!("{}.git", repo.as_str()));
    init_store(&store)?;
    Ok(store)
}

/// Removes the temporary index files a git run on a workspace left in the checkpoint
/// repositories when the supervisor died under it (`mosaic-index-<id>`, beside the kept
/// indexes' `mosaic-index/` directory). At start only: no capture runs then.
pub(crate) fn sweep_temporary_indexes(inner: &Inner) {
    for (_, store) in stores(inner) {
        let Ok(entries) = std::fs::read_dir(&store) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("mosaic-index-") && e.path().is_file() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// This host's checkpoint repositories (`<state_dir>/checkpoints/<repo>.git`), with the
/// repository each is for.
pub(crate) fn stores(inner: &Inner) -> Vec<(RepoName, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(inner.cfg.state_dir.join("checkpoints")) else {
        return vec![];
    };
    entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let repo = RepoName::parse(name.strip_suffix(".git")?).ok()?;
            Some((repo, e.path()))
        })
        .collect()
}

/// Makes `store` a bare repository unless it is a directory already.
pub fn init_store(store: &Path) -> Result<(), String> {
    if !store.is_dir() {
        let s = store.to_string_lossy().to_string();
        git(&["init", "--quiet", "--bare", &s], None)?;
    }
    Ok(())
}

/// Flags that make git read a tree as files, byte for byte, with nothing of the host or
/// the workspace configuring it.
const EXACT: [&str; 20] = [
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

/// The checkpoint repository's own index for `assignment_id`'s workspace: kept between its
/// checkpoints so git rehashes only what changed (its stat data checks size, mtime, ctime
/// and inode: a file changed in any way is read again). Never the agent's index.
pub fn index_of(store: &Path, assignment_id: &str) -> PathBuf {
    store.join("mosaic-index").join(assignment_id)
}

/// git on `ws` as files, with the checkpoint repository `store` as its git directory and a
/// private index — a copy of `keep` when given (written back, with `write_back`, only when
/// `f` succeeded: a git killed half-way leaves no lock or torn index behind), else a fresh
/// one — removed after: the workspace's own `.git` is never consulted.
fn on_tree<T>(
    store: &Path,
    ws: &Path,
    keep: Option<&Path>,
    write_back: bool,
    f: impl FnOnce(&dyn Fn(&[&str]) -> Result<String, String>) -> Result<T, String>,
) -> Result<T, String> {
    let index = store.join(format!("mosaic-index-{}", uuid::Uuid::new_v4().simple()));
    if let Some(k) = keep.filter(|k| k.is_file()) {
        std::fs::copy(k, &index).map_err(|e| format!("copying {}: {e}", k.display()))?;
    }
    let null = Path::new("/dev/null");
    let env: [(&str, &Path); 5] = [
        ("GIT_DIR", store),
        ("GIT_WORK_TREE", ws),
        ("GIT_INDEX_FILE", &index),
        ("GIT_CONFIG_GLOBAL", null),
        ("GIT_ATTR_SOURCE", Path::new(EMPTY_TREE)),
    ];
    let run = |args: &[&str]| {
        let all: Vec<&str> = EXACT.iter().chain(args).copied().collect();
        git_with(&all, Some(ws), &env)
    };
    let out = f(&run);
    if let (Ok(_), Some(k), true) = (&out, keep, write_back) {
        let kept = k
            .parent()
            .map(|d| crate::util::durable::ensure_dir(d, 0o700))
            .transpose()
            .is_ok()
            && std::fs::rename(&index, k).is_ok();
        if !kept {
            tracing::debug!(index = %k.display(), "the checkpoint index was not kept (the next checkpoint reads every file)");
        }
    }
    let _ = std::fs::remove_file(&index);
    out
}

/// Commits every file of `ws` the repository does not ignore into `store` as a synthetic
/// commit (its parent `base`, if any) on `reference`, which must not exist yet; `(commit,
/// tree)`. `keep` as in [`on_tree`].
pub fn commit_workspace(
    store: &Path,
    ws: &Path,
    keep: Option<&Path>,
    base: Option<&str>,
    message: &str,
    reference: &str,
) -> Result<(String, String), String> {
    survey(ws)?;
    on_tree(store, ws, keep, true, |run| {
        run(&["add", "--all", "--", "."])?;
        let tree_id = run(&["write-tree"])?;
        let mut args = vec!["commit-tree", tree_id.as_str(), "-m", message];
        if let Some(b) = base {
            args.extend(["-p", b]);
        }
        let commit_id = run(&args)?;
        // Never over another checkpoint's ref (the zero id: it must not exist yet).
        let zero = "0".repeat(40);
        run(&["update-ref", reference, &commit_id, &zero])?;
        Ok((commit_id, tree_id))
    })
}

/// The tree every file of `ws` the repository does not ignore makes, as a checkpoint of it
/// would record it (written into `store`, no ref set). `keep`'s stat data spares reading
/// unchanged files again; it is never written back (a capture or restore meanwhile keeps
/// its own).
pub fn tree_of(store: &Path, ws: &Path, keep: Option<&Path>) -> Result<String, String> {
    survey(ws)?;
    on_tree(store, ws, keep, false, |run| {
        run(&["add", "--all", "--", "."])?;
        run(&["write-tree"])
    })
}

/// Makes `dir` (absent) a repository on `branch` at `base` (from `store`; an orphan branch
/// without one) whose files are exactly `tree_id`'s, checked by writing them back into a
/// tree (with `keep` as in [`on_tree`], which then holds their stat data): `git status`
/// there shows the checkpoint as changes against the base. The base's files are never
/// written: its index is read from the tree, the checkpoint's files alone are checked out.
pub fn materialize(
    store: &Path,
    dir: &Path,
    branch: &str,
    base: Option<&str>,
    tree_id: &str,
    keep: Option<&Path>,
) -> Result<(), String> {
    let dir_s = dir.to_string_lossy().to_string();
    let store_s = store.to_string_lossy().to_string();
    git(&["init", "--quiet", &dir_s], None)?;
    let head = format!("refs/heads/{branch}");
    git(&["symbolic-ref", "HEAD", &head], Some(dir))?;
    if let Some(base) = base {
        let r = crate::protocol::repo::base_ref(base);
        git(
            &[
                "fetch",
                "--quiet",
                "--no-tags",
                "--update-head-ok",
                &store_s,
                &format!("+{r}:{head}"),
            ],
            Some(dir),
        )?;
        git(&["read-tree", base], Some(dir))?;
    }
    let got = on_tree(store, dir, keep, true, |run| {
        run(&["read-tree", tree_id])?;
        // `--index`: the stat data of what it wrote goes into the index, so the check
        // below stats the files instead of reading them again.
        run(&["checkout-index", "--all", "--force", "--index"])?;
        run(&["add", "--all", "--", "."])?;
        run(&["write-tree"])
    })?;
    if got != tree_id {
        return Err(format!(
            "the restored files make tree {got}, not the checkpoint's {tree_id}"
        ));
    }
    Ok(())
}

/// Whether `store` holds base `commit` under its base ref (what a checkpoint's bundle is
/// relative to and a restore checks out).
pub fn has_base(store: &Path, commit: &str) -> bool {
    git(
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{}^{{commit}}", crate::protocol::repo::base_ref(commit)),
        ],
        Some(store),
    )
    .is_ok_and(|c| c == commit)
}

/// The imported checkpoint is there, with its tree.
pub fn check_imported(
    store: &Path,
    checkpoint_digest: &str,
    commit_id: &str,
    base_commit_id: Option<&str>,
    tree_id: &str,
) -> Result<(), String> {
    if !has_commit(store, commit_id) {
        return Err(format!(
            "checkpoint {}: its bundle does not hold commit {}",
            checkpoint_digest, commit_id
        ));
    }
    let parent = git(
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{}^", commit_id),
        ],
        Some(store),
    )
    .ok()
    .filter(|c| !c.is_empty());
    if parent.as_deref() != base_commit_id {
        return Err(format!(
            "checkpoint {}: its commit's parent is not the base it names",
            checkpoint_digest
        ));
    }
    let tree = git(
        &["rev-parse", &format!("{}^{{tree}}", commit_id)],
        Some(store),
    )?;
    if tree != tree_id {
        return Err(format!(
            "checkpoint {}: its commit's tree is {tree}, not {}",
            checkpoint_digest, tree_id
        ));
    }
    Ok(())
}

/// Whether `store` has `object` (a commit id).
pub fn has_commit(store: &Path, object: &str) -> bool {
    git(
        &["cat-file", "-e", &format!("{object}^{{commit}}")],
        Some(store),
    )
    .is_ok()
}

fn capture(
    inner: &Inner,
    ws: &Path,
    assignment_id: &str,
    incarnation: &str,
    generation: u64,
    repo: &RepoBinding,
    kind: Kind,
) -> Result<CheckpointRef, String> {
    let store = store_of(inner, &repo.name)?;
    let reference = ref_of(assignment_id, incarnation, generation, kind);
    if kind == Kind::Handoff {
        // One left by a capture whose record was never written was never reported.
        let _ = git(&["update-ref", "-d", &reference], Some(&store));
    }
    // Relative to the workspace's base commit when this host's repository has it (its
    // bundle then carries only what changed).
    let here = super::workspaces::marker(inner, assignment_id);
    let inputs_digest = here
        .as_ref()
        .and_then(|m| m.inputs.as_ref())
        .map(|i| i.digest());
    let base = here
        .and_then(|m| m.base_commit_id)
        .filter(|b| has_commit(&store, b));
    let what = match kind {
        Kind::End => "checkpoint".to_string(),
        Kind::Handoff => "handoff checkpoint".to_string(),
        Kind::Requested(n) => format!("requested checkpoint {n}"),
    };
    let msg = format!("mosaic {what} of {assignment_id}, {incarnation} generation {generation}");
    let (commit_id, tree_id) = commit_workspace(
        &store,
        ws,
        Some(&index_of(&store, assignment_id)),
        base.as_deref(),
        &msg,
        &reference,
    )?;
    let c = CheckpointRef {
        repository: repo.name.clone(),
        commit_id,
        tree_id,
        inputs_digest,
    };
    if !c.well_formed() {
        return Err(format!(
            "git answered {:?} / {:?} for the checkpoint's ids",
            c.commit_id, c.tree_id
        ));
    }
    // The workspace's files are this checkpoint's from now on only when nothing writes
    // them after: at an end, or held for a handoff. A requested one is an instant of a
    // generation that goes on writing: its files are then known equal to no checkpoint
    // (a later stage restores rather than trusting them, and says so to the coordinator).
    let at = match kind {
        Kind::End | Kind::Handoff => Some(c.digest()),
        Kind::Requested(_) => None,
    };
    super::workspaces::set_marker(inner, assignment_id, base, at.as_deref())?;
    tracing::info!(assignment_id, generation, repository = repo.name.as_str(),
        commit = %c.commit_id, digest = %c.digest(), "workspace checkpointed");
    Ok(c)
}

/// The number the next requested checkpoint of a generation takes, given how many it took
/// and when the last was (unix seconds), at `now`: refused beyond
/// [`MAX_REQUESTED_CHECKPOINTS`](crate::protocol::repo::MAX_REQUESTED_CHECKPOINTS) or within
/// `REQUEST_INTERVAL_S` of the last (a clock stepped back since is no reason to refuse).
fn next_request(taken: u32, last_at: Option<u64>, now: u64) -> Result<u32, String> {
    use crate::protocol::repo::MAX_REQUESTED_CHECKPOINTS;
    if taken >= MAX_REQUESTED_CHECKPOINTS {
        return Err(format!(
            "a generation asks for at most {MAX_REQUESTED_CHECKPOINTS} checkpoints (its end is checkpointed anyway)"
        ));
    }
    if let Some(at) = last_at.filter(|at| *at <= now) {
        let since = now - at;
        if since < REQUEST_INTERVAL_S {
            return Err(format!(
                "its last checkpoint was taken {since} s ago: at most one per {REQUEST_INTERVAL_S} s"
            ));
        }
    }
    Ok(taken + 1)
}

impl super::Supervisor {
    /// The checkpoint of `lane`'s live generation `generation` (of `incarnation`) for
    /// handoff `handoff_id`, once the coordinator's hold order has been applied (`None`
    /// before: the coordinator asks again, and a request that outlived its offer holds
    /// nothing): the hold asserted again (read-only, or its cgroup frozen when a write
    /// under way keeps it open; an error if neither), then captured; the same checkpoint
    /// again for the same handoff. Refused for a generation whose workspace cannot be held
    /// (an unconfined lane's, which its harness writes as the supervisor): a checkpoint of
    /// a tree still changing is no fact. The `Err` is the reason to report.
    pub async fn handoff_checkpoint(
        &self,
        lane: &str,
        incarnation: &str,
        generation: u64,
        handoff_id: &str,
    ) -> Result<Option<CheckpointRef>, String> {
        use super::start::WorkspaceOrder;
        let name = super::names::LaneName::parse(lane).map_err(|e| e.to_string())?;
        let slot = self.inner.slot(&name).map_err(|e| e.to_string())?;
        let held = {
            let l = slot.lock().await;
            let Some(live) = l.live.as_ref().filter(|g| {
                g.record.generation == generation && g.record.lane_incarnation_id == incarnation
            }) else {
                return Err("the generation is no longer live".into());
            };
            if let Some(h) = &live.record.handoff_checkpoint {
                if h.handoff_id == handoff_id {
                    return Ok(Some(h.checkpoint.clone()));
                }
            }
            live.record.held
        };
        if !held {
            return Ok(None);
        }
        self.order_workspace(lane, incarnation, generation, WorkspaceOrder::Hold)
            .await
            .map_err(|e| format!("its workspace could not be held read-only: {e}"))?;
        let mut l = slot.lock().await;
        let Some(live) = l.live.as_mut().filter(|g| {
            g.record.generation == generation && g.record.lane_incarnation_id == incarnation
        }) else {
            return Err("the generation is no longer live".into());
        };
        let rec = live.record.clone();
        if !rec.held {
            return Ok(None); // released meanwhile: its offer ended
        }
        let (Some(c), false) = (rec.coord.as_ref(), rec.fenced) else {
            return Err("the generation is fenced: its work moved on".into());
        };
        let Some(repo) = c.repository.clone() else {
            return Err("its work has no workspace".into());
        };
        if rec.workspace.is_none() {
            return Err("its lane is unconfined: its workspace cannot be held read-only, so no exact checkpoint can be taken (hand off work from a confined lane, or stop it and resume it)".into());
        }
        let (inner, asg) = (self.inner.clone(), c.assignment_id.clone());
        let (inc, hid) = (incarnation.to_string(), handoff_id.to_string());
        let taken = tokio::task::spawn_blocking(move || {
            let ws = super::workspaces::dir_of(&inner, &asg);
            capture(&inner, &ws, &asg, &inc, generation, &repo, Kind::Handoff)
        })
        .await
        .map_err(|e| format!("checkpoint task failed: {e}"))??;
        live.record.handoff_checkpoint = Some(super::state::HandoffTaken {
            handoff_id: hid,
            checkpoint: taken.clone(),
        });
        self.inner
            .store
            .save_gen(&live.record)
            .map_err(|e| format!("recording the handoff's checkpoint: {e}"))?;
        tracing::info!(lane, generation, handoff_id, digest = %taken.digest(),
            "the held workspace checkpointed for its handoff");
        Ok(Some(taken))
    }
}

/// How long a requested checkpoint waits for the generation's cgroup to freeze.
const FREEZE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// The least time between two checkpoints one generation asks for: each freezes it and
/// holds its lane while the workspace is read, and each is stored whole (relative to the
/// base), so a harness cannot make its host or the store do nothing else.
const REQUEST_INTERVAL_S: u64 = 60;

impl super::Supervisor {
    /// A checkpoint `lane`'s live generation `generation` (of `incarnation`) asked for
    /// (`mosaic lane checkpoint`): its number and the checkpoint. Only for activated work in
    /// a repository, on a confined lane (its workspace is written by nothing outside its
    /// cgroup), while its workspace is open (not held for a handoff, not fenced). The
    /// number is recorded first; the generation's cgroup is frozen while the workspace is
    /// read (nothing of it writes meanwhile: the checkpoint is one instant of the tree) and
    /// thawed after, whatever the capture did. The `Err` is the reason to tell the harness.
    pub async fn requested_checkpoint(
        &self,
        lane: &str,
        incarnation: &str,
        generation: u64,
    ) -> Result<(u32, CheckpointRef), String> {
        let name = super::names::LaneName::parse(lane).map_err(|e| e.to_string())?;
        let slot = self.inner.slot(&name).map_err(|e| e.to_string())?;
        // Held throughout: no hold, fence, stop or second request meanwhile.
        let mut l = slot.lock().await;
        let Some(live) = l.live.as_mut().filter(|g| {
            g.record.generation == generation && g.record.lane_incarnation_id == incarnation
        }) else {
            return Err("the generation is no longer live".into());
        };
        let rec = &live.record;
        let Some(c) = rec.coord.as_ref() else {
            return Err("this generation runs no coordinated work".into());
        };
        let Some(repo) = c.repository.clone() else {
            return Err(
                "its work has no workspace to checkpoint (assign --repo gives it one)".into(),
            );
        };
        if !rec.workspace_open() {
            return Err("its workspace is not open (not activated yet, held for a handoff, or fenced): nothing to checkpoint now".into());
        }
        if rec.workspace.is_none() {
            return Err("its lane is unconfined: its workspace may be written from outside its cgroup, so no exact checkpoint can be taken while it runs".into());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let seq = next_request(rec.requested_checkpoints, rec.requested_checkpoint_at, now)?;
        let (asg, cgroup) = (c.assignment_id.clone(), rec.cgroup.clone());
        live.record.requested_checkpoints = seq;
        live.record.requested_checkpoint_at = Some(now);
        self.inner
            .store
            .save_gen(&live.record)
            .map_err(|e| format!("recording the checkpoint's number: {e}"))?;
        let (inner, inc) = (self.inner.clone(), incarnation.to_string());
        let cg = Arc::new(self.inner.tree.at_abs(&cgroup));
        let in_task = cg.clone();
        let (taken, thawed) = tokio::task::spawn_blocking(move || {
            let cg = in_task;
            let taken = cg
                .freeze_and_wait(FREEZE_WAIT)
                .map_err(|e| format!("its cgroup did not freeze: {e}"))
                .and_then(|()| {
                    super::broker::hold_blocking("checkpoint:frozen");
                    let ws = super::workspaces::dir_of(&inner, &asg);
                    capture(
                        &inner,
                        &ws,
                        &asg,
                        &inc,
                        generation,
                        &repo,
                        Kind::Requested(seq),
                    )
                });
            (taken, cg.thaw())
        })
        .await
        .unwrap_or_else(|e| {
            // The task died (a panic): thawed here, whatever it did.
            (Err(format!("checkpoint task failed: {e}")), cg.thaw())
        });
        if let Err(e) = thawed {
            tracing::error!(lane, generation, error = %e,
                "the generation's cgroup could not be thawed after its checkpoint: it stays frozen until it is stopped");
        }
        let taken = taken?;
        tracing::info!(lane, generation, request_seq = seq, digest = %taken.digest(),
            "workspace checkpointed at its harness's request");
        Ok((seq, taken))
    }
}

#[cfg(test)]
mod tests {
    use super::{next_request, REQUEST_INTERVAL_S};
    use crate::protocol::repo::MAX_REQUESTED_CHECKPOINTS;

    #[test]
    fn requested_checkpoints_are_numbered_capped_and_spaced() {
        let t = 1_000_000;
        assert_eq!(next_request(0, None, t), Ok(1));
        assert_eq!(next_request(4, Some(t - REQUEST_INTERVAL_S), t), Ok(5));
        // The last one allowed, then none.
        let last = MAX_REQUESTED_CHECKPOINTS;
        assert_eq!(next_request(last - 1, Some(t - 3600), t), Ok(last));
        let over = next_request(last, Some(t - 3600), t).unwrap_err();
        assert!(over.contains("at most"), "{over}");
        // Within the interval: refused; a clock stepped back since: not a reason.
        let soon = next_request(1, Some(t - REQUEST_INTERVAL_S + 1), t).unwrap_err();
        assert!(soon.contains("at most one per"), "{soon}");
        assert_eq!(next_request(1, Some(t + 3600), t), Ok(2));
    }
}
