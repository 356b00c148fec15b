//! Releasing this host's copies of done work: an assignment's workspace and the checkpoint
//! refs this host holds of it stay while the work may run here again; once no generation of
//! it is live here and every one of its checkpoints is uploaded, the host asks the
//! coordinator (`workspace_release`, with the tree the workspace's files make now and the
//! checkpoint it last equalled) and deletes them only on `release`: the work has ended and
//! its files are in the coordinator's store. Then it reports the deletion, which the
//! coordinator records as the copy's deletion receipt.
//!
//! The deletion is noted durably (`workspaces/.releasing/<assignment>`, the refs it removes)
//! before anything is removed, and finished and reported from that note after a crash.
//!
//! **Never:** deletes a copy the coordinator has not allowed, a copy a live generation of
//! this host works in, a checkpoint not uploaded yet, or a checkpoint the store refused
//! (this host's copy is then the only one: it stays, with its ref).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::transfer::{done_marker, host_refs, parse_ref, refs_under, NO_ANSWER, NO_LINK};
use super::*;
use crate::protocol::messages::{HeldTree, ReleaseStep, ReleaseVerdict, WorkspaceRelease};
use crate::protocol::schema::MessageType;
use crate::supervisor::checkpoints::{self, index_of, store_of, tree_of};
use crate::supervisor::workspaces;
use crate::supervisor::Inner;
use crate::util::git::git;

/// How long a copy the coordinator said to keep waits before it is asked about again: from
/// `FIRST_WAIT`, doubling to `MOST_WAIT`.
const FIRST_WAIT: Duration = Duration::from_secs(2);
const MOST_WAIT: Duration = Duration::from_secs(60);

/// The key an answer about `assignment_id`'s release is awaited under.
pub(super) fn answer_key(assignment_id: &str, done: bool) -> String {
    format!("w:{assignment_id}:{}", if done { "done" } else { "ask" })
}

/// A checkpoint ref of this host.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct HeldRef {
    store: PathBuf,
    reference: String,
    commit: String,
}

/// What this host holds of one assignment's work.
#[derive(Debug, Default)]
struct Copy {
    workspace: bool,
    /// Refs whose checkpoint is in the coordinator's store.
    stored: Vec<HeldRef>,
    /// Refs not uploaded yet: the copy is not asked about until they are.
    pending: usize,
    /// Other hosts' checkpoints of the work this host imported to restore it.
    imported: Vec<HeldRef>,
}

/// A release allowed and under way: what it removes.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Note {
    refs: Vec<HeldRef>,
}

fn notes_dir(inner: &Inner) -> PathBuf {
    inner.cfg.state_dir.join("workspaces").join(".releasing")
}

fn stores(inner: &Inner) -> Vec<PathBuf> {
    checkpoints::stores(inner)
        .into_iter()
        .map(|(_, s)| s)
        .collect()
}

/// Every assignment this host holds a workspace or a checkpoint ref of.
fn copies(inner: &Inner) -> BTreeMap<String, Copy> {
    let mut out: BTreeMap<String, Copy> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(inner.cfg.state_dir.join("workspaces")) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !name.starts_with('.') && crate::protocol::report::id_ok(&name) && e.path().is_dir()
            {
                out.entry(name).or_default().workspace = true;
            }
        }
    }
    let stores = stores(inner);
    for store in &stores {
        for h in host_refs(inner, store) {
            let copy = out.entry(h.assignment_id.clone()).or_default();
            match std::fs::read_to_string(&h.marker) {
                Ok(note) if note == "stored" => copy.stored.push(HeldRef {
                    store: store.clone(),
                    reference: h.reference,
                    commit: h.commit,
                }),
                // Refused for good: this host's copy is the only one; it stays.
                Ok(_) => {}
                Err(_) => copy.pending += 1,
            }
        }
    }
    // Other hosts' checkpoints of the work imported here to restore it: removed with the
    // copy (the workspace's checkpoint index, which names their objects, goes too), never
    // a reason to ask on their own.
    for store in &stores {
        for h in refs_under(inner, store, "refs/mosaic/restored/") {
            if let Some(copy) = out.get_mut(&h.assignment_id) {
                copy.imported.push(HeldRef {
                    store: store.clone(),
                    reference: h.reference,
                    commit: h.commit,
                });
            }
        }
    }
    out
}

/// The assignments of the generations live on this host (not yet ended with a receipt).
fn busy(inner: &Inner) -> HashSet<String> {
    let mut out = HashSet::new();
    let Ok(lanes) = inner.store.lanes() else {
        // Lanes that cannot be read: nothing on this host is released meanwhile.
        out.insert(String::new());
        return out;
    };
    for lane in lanes {
        let Some(g) = lane.current_generation else {
            continue;
        };
        match inner.store.load_gen(&lane.lane_incarnation_id, g) {
            Ok(rec) if rec.status != crate::supervisor::state::GenStatus::Terminated => {
                if let Some(c) = rec.coord {
                    out.insert(c.assignment_id);
                }
            }
            Ok(_) => {}
            // A record that cannot be read: nothing on this host is released meanwhile.
            Err(_) => {
                out.insert(String::new());
            }
        }
    }
    out
}

/// The tree `assignment_id`'s workspace holds now and the checkpoint it last equalled.
fn held_tree(inner: &Inner, assignment_id: &str) -> Result<HeldTree, String> {
    let m = workspaces::marker(inner, assignment_id)
        .ok_or("its workspace has no record of what it was made from")?;
    let (Some(inputs), Some(at)) = (m.inputs, m.at) else {
        return Err("no checkpoint its files are known to equal".into());
    };
    let store = store_of(inner, &inputs.repository)?;
    let ws = workspaces::dir_of(inner, assignment_id);
    // The workspace's checkpoint index spares reading what did not change; it is never
    // written back (a stage restoring the work meanwhile keeps its own).
    let tree_id = tree_of(&store, &ws, Some(&index_of(&store, assignment_id)))?;
    Ok(HeldTree {
        tree_id,
        checkpoint_digest: at,
    })
}

/// Removes what `note` names and the workspace of `assignment_id` (whatever of it is left);
/// how many refs are gone.
fn remove(inner: &Inner, assignment_id: &str, note: &Note) -> Result<u64, String> {
    let ws = workspaces::dir_of(inner, assignment_id);
    if ws.exists() {
        std::fs::remove_dir_all(&ws).map_err(|e| format!("removing {}: {e}", ws.display()))?;
    }
    for store in stores(inner) {
        let _ = std::fs::remove_file(index_of(&store, assignment_id));
    }
    let _ = std::fs::remove_file(workspaces::setup_log(inner, assignment_id));
    for r in &note.refs {
        git(
            &["update-ref", "-d", &r.reference, &r.commit],
            Some(&r.store),
        )
        .or_else(|e| {
            // Already gone (a removal before a crash): that is the outcome wanted.
            let left = git(
                &["rev-parse", "--verify", "--quiet", &r.reference],
                Some(&r.store),
            );
            if left.is_err() {
                Ok(String::new())
            } else {
                Err(e)
            }
        })?;
        if let Some((_, inc, generation, kind)) = parse_ref(&r.reference) {
            let _ = std::fs::remove_file(done_marker(inner, inc, generation, kind, &r.commit));
        }
    }
    workspaces::forget(inner, assignment_id)?;
    Ok(note.refs.len() as u64)
}

/// When each copy may next be asked about, and how long it waited last.
#[derive(Default)]
pub(super) struct Backoff {
    next: HashMap<String, (Instant, Duration)>,
    /// Copies whose keeping was said at warn (once each).
    told: HashSet<String>,
}

impl Backoff {
    fn due(&self, a: &str) -> bool {
        self.next.get(a).is_none_or(|(t, _)| Instant::now() >= *t)
    }

    /// Not before a while: doubling from `FIRST_WAIT` while the work may still end soon
    /// (`soon`), else `MOST_WAIT` at once (a copy kept for a reason that does not pass by
    /// itself in seconds).
    fn wait(&mut self, a: &str, soon: bool) {
        let w = match self.next.get(a) {
            _ if !soon => MOST_WAIT,
            Some((_, w)) => (*w * 2).min(MOST_WAIT),
            None => FIRST_WAIT,
        };
        self.next.insert(a.to_string(), (Instant::now() + w, w));
    }

    fn first_time(&mut self, a: &str, why: &str) -> bool {
        self.told.insert(format!("{a}/{why}"))
    }
}

impl CoordinatedHost {
    /// One round: finishes the releases noted, then asks about every copy that is due.
    pub(super) async fn release_round(&self, backoff: &mut Backoff) {
        let inner = self.sup.inner.clone();
        let notes = notes_dir(&inner);
        let noted: Vec<String> = std::fs::read_dir(&notes)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| crate::protocol::report::id_ok(n))
                    .collect()
            })
            .unwrap_or_default();
        for a in noted {
            if let Err(e) = self.finish(&a).await {
                if e == NO_LINK || e == NO_ANSWER {
                    return;
                }
                tracing::warn!(assignment_id = %a, error = %e, "releasing this host's copy of done work: not finished; trying again later");
            }
        }
        let scan = inner.clone();
        let Ok((copies, busy)) =
            tokio::task::spawn_blocking(move || (copies(&scan), busy(&scan))).await
        else {
            return;
        };
        if busy.contains("") {
            return;
        }
        for (a, copy) in copies {
            // Something to remove, nothing under way, nothing not uploaded yet.
            if busy.contains(&a)
                || copy.pending > 0
                || (!copy.workspace && copy.stored.is_empty())
                || !backoff.due(&a)
            {
                continue;
            }
            match self.ask_release(&a, copy, backoff).await {
                Err(e) if e == NO_LINK || e == NO_ANSWER => return,
                Err(e) => {
                    backoff.wait(&a, false);
                    if backoff.first_time(&a, "error") {
                        tracing::warn!(assignment_id = %a, error = %e,
                            "this host's copy of the work is kept: it cannot be shown to be in the coordinator's store");
                    }
                }
                Ok(()) => {}
            }
        }
    }

    async fn ask_release(&self, a: &str, copy: Copy, backoff: &mut Backoff) -> Result<(), String> {
        // (Tests hold a release here, to change the copy before its tree is read.)
        crate::supervisor::broker::hold("release:ask").await;
        let workspace = if copy.workspace {
            let (inner, id) = (self.sup.inner.clone(), a.to_string());
            Some(
                tokio::task::spawn_blocking(move || held_tree(&inner, &id))
                    .await
                    .map_err(|e| e.to_string())??,
            )
        } else {
            None
        };
        let m = WorkspaceRelease {
            assignment_id: a.to_string(),
            step: ReleaseStep::Ask { workspace },
        };
        let answer = self
            .ask(
                answer_key(a, false),
                MessageType::WorkspaceRelease,
                m.fields(),
            )
            .await?;
        let ToHost::WorkspaceReleaseAnswer(ans) = answer else {
            return Err("an answer of another type".into());
        };
        match ans.verdict {
            ReleaseVerdict::Release => {
                let mut refs = copy.stored;
                refs.extend(copy.imported);
                let note = Note { refs };
                let path = notes_dir(&self.sup.inner).join(a);
                let bytes = serde_json::to_vec(&note).map_err(|e| e.to_string())?;
                crate::util::durable::ensure_dir(&notes_dir(&self.sup.inner), 0o700)
                    .map_err(|e| e.to_string())?;
                crate::util::durable::write_atomic(&path, &bytes).map_err(|e| e.to_string())?;
                self.finish(a).await
            }
            ReleaseVerdict::Keep(why) | ReleaseVerdict::Retry(why) => {
                backoff.wait(a, why == "active" || why == "unavailable");
                if why != "active" && backoff.first_time(a, &why) {
                    tracing::warn!(assignment_id = %a, reason = %why,
                        "this host's copy of the work is kept (the coordinator does not release it)");
                }
                Ok(())
            }
            ReleaseVerdict::Recorded => Err("`recorded` answered an ask".into()),
        }
    }

    /// Removes what the note of `a` names, and reports it; the note goes once the
    /// coordinator has recorded the deletion.
    async fn finish(&self, a: &str) -> Result<(), String> {
        let path = notes_dir(&self.sup.inner).join(a);
        let note: Note = serde_json::from_slice(
            &std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?,
        )
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let (inner, id) = (self.sup.inner.clone(), a.to_string());
        let refs_removed = tokio::task::spawn_blocking(move || remove(&inner, &id, &note))
            .await
            .map_err(|e| e.to_string())??;
        let m = WorkspaceRelease {
            assignment_id: a.to_string(),
            step: ReleaseStep::Done { refs_removed },
        };
        let answer = self
            .ask(
                answer_key(a, true),
                MessageType::WorkspaceRelease,
                m.fields(),
            )
            .await?;
        match answer {
            ToHost::WorkspaceReleaseAnswer(ans) => match ans.verdict {
                ReleaseVerdict::Recorded => {
                    tracing::info!(assignment_id = %a, refs_removed,
                        "this host's copy of done work is released (its deletion is recorded)");
                    remove_note(&path)
                }
                ReleaseVerdict::Keep(why) => {
                    // Nothing to record it against: the deletion stands, unrecorded.
                    tracing::error!(assignment_id = %a, reason = %why,
                        "the coordinator did not record this host's deletion of its copy of done work");
                    remove_note(&path)
                }
                ReleaseVerdict::Retry(why) => {
                    Err(format!("the coordinator cannot record it now: {why}"))
                }
                ReleaseVerdict::Release => Err("`release` answered a done".into()),
            },
            _ => Err("an answer of another type".into()),
        }
    }
}

fn remove_note(path: &Path) -> Result<(), String> {
    std::fs::remove_file(path).map_err(|e| format!("removing {}: {e}", path.display()))
}
