//! Checkpoint transfer on this host: every checkpoint this host took is uploaded to the
//! coordinator's store (the bundle of its base commit, then its own bundle, relative to
//! that base), and a stage whose workspace restores a checkpoint this host does not hold
//! fetches its objects first. One part at a time, each answered; an object is verified
//! against its digest before git reads it, and imported with git checking every object.
//!
//! **Never:** imports a checkpoint another host took under this host's checkpoint refs
//! (it would be uploaded as this host's), reads an object it has not verified, or gives
//! up on an upload the coordinator has not answered for good (it tries again later).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::protocol::messages::{
    CheckpointData, CheckpointFetch, CheckpointStored, CheckpointUpload, DataAnswer, ObjectRole,
    StoredVerdict, PART_BYTES,
};
use crate::protocol::repo::{base_ref, CheckpointRef, StoredObject};
use crate::supervisor::checkpoints::{
    has_base, has_commit, store_of, Kind, HANDOFF_SUFFIX, REQUEST_SUFFIX,
};
use crate::util::git::git;

/// How long one part waits for its answer before the transfer is given up for now.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// How many new sessions one fetch outlives before it gives up.
const FETCH_RELINKS: u32 = 5;
/// How often the host looks for checkpoints not uploaded yet.
const UPLOAD_EVERY: Duration = Duration::from_secs(2);
/// Why a part went unanswered: nothing else is tried this round (the link is down).
pub(super) const NO_LINK: &str = "the coordinator link is gone";
pub(super) const NO_ANSWER: &str = "the coordinator did not answer in time";

/// Answers the transfers of this host wait for, by `u:`/`f:` and object digest.
#[derive(Default)]
pub(super) struct Transfers {
    waiting: Mutex<HashMap<String, tokio::sync::oneshot::Sender<ToHost>>>,
    /// Held by a restore while it fetches: two never wait on the same object's answers.
    pub(super) fetching: tokio::sync::Mutex<()>,
    /// Workspace effects this host is making now (one executor per effect).
    pub(super) hand_ons: Mutex<std::collections::HashSet<String>>,
    /// Told after each checkpoint's upload mark is written.
    uploaded: tokio::sync::Notify,
    /// When each requested checkpoint was last reported again (by its ref).
    reported_again: Mutex<HashMap<String, std::time::Instant>>,
}

/// How often a requested checkpoint the coordinator has not recorded is reported again.
const REPORT_AGAIN_EVERY: Duration = Duration::from_secs(30);

/// How long a harness's checkpoint request waits to hear it is in the coordinator's store
/// (the upload goes on after; the answer then says it is not stored yet).
const STORED_WAIT: Duration = Duration::from_secs(60);

/// A checkpoint of this host not uploaded yet.
struct Pending {
    store: PathBuf,
    reference: String,
    assignment_id: String,
    lane_incarnation_id: String,
    generation: u64,
    kind: Kind,
    checkpoint: CheckpointRef,
    base_commit_id: Option<String>,
}

fn sha256_file(path: &Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| e.to_string())?;
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

pub(super) fn scratch(inner: &crate::supervisor::Inner) -> Result<PathBuf, String> {
    let dir = inner.cfg.state_dir.join("checkpoints").join("transfer");
    crate::util::durable::ensure_dir(&dir, 0o700).map_err(|e| e.to_string())?;
    Ok(dir.join(uuid::Uuid::new_v4().simple().to_string()))
}

/// The mark that the checkpoint of `p` is uploaded (or refused for good): one per
/// generation end; one per commit of a handoff's (a handoff taken again after a crash is
/// another commit).
pub(super) fn done_marker(
    inner: &crate::supervisor::Inner,
    inc: &str,
    generation: u64,
    kind: Kind,
    commit: &str,
) -> PathBuf {
    let name = match kind {
        Kind::End => format!("{inc}.{generation}"),
        Kind::Handoff => format!("{inc}.{generation}.{commit}"),
        Kind::Requested(n) => format!("{inc}.{generation}.request-{n}"),
    };
    inner
        .cfg
        .state_dir
        .join("checkpoints")
        .join("uploaded")
        .join(name)
}

/// The assignment, lane incarnation, generation and kind a checkpoint ref
/// (`refs/mosaic/checkpoints/<assignment>/<incarnation>/<generation>[suffix]`) names.
pub(super) fn parse_ref(r: &str) -> Option<(&str, &str, u64, Kind)> {
    let parts: Vec<&str> = r.split('/').collect();
    let [_, _, _, asg, inc, gen] = parts[..] else {
        return None;
    };
    let (gen, kind) = match (
        gen.strip_suffix(HANDOFF_SUFFIX),
        gen.split_once(REQUEST_SUFFIX),
    ) {
        (Some(g), _) => (g, Kind::Handoff),
        (None, Some((g, n))) => (g, Kind::Requested(n.parse::<u32>().ok()?)),
        (None, None) => (gen, Kind::End),
    };
    Some((asg, inc, gen.parse::<u64>().ok()?, kind))
}

/// A checkpoint ref of this host's checkpoint repository, read.
pub(super) struct HostRef {
    pub reference: String,
    pub commit: String,
    pub assignment_id: String,
    pub incarnation: String,
    pub generation: u64,
    pub kind: Kind,
    /// Where its upload mark is (`done_marker`).
    pub marker: PathBuf,
}

/// Every checkpoint ref this host took in `store` (none if git cannot list them).
pub(super) fn host_refs(inner: &crate::supervisor::Inner, store: &Path) -> Vec<HostRef> {
    refs_under(inner, store, "refs/mosaic/checkpoints/")
}

/// Every ref under `prefix` (`refs/mosaic/checkpoints/`: this host's checkpoints;
/// `refs/mosaic/restored/`: other hosts' it imported to restore), read as a checkpoint ref.
pub(super) fn refs_under(
    inner: &crate::supervisor::Inner,
    store: &Path,
    prefix: &str,
) -> Vec<HostRef> {
    let Ok(refs) = git(
        &["for-each-ref", "--format=%(refname) %(objectname)", prefix],
        Some(store),
    ) else {
        return vec![];
    };
    refs.lines()
        .filter_map(|line| {
            let (r, commit) = line.split_once(' ')?;
            let (asg, inc, generation, kind) = parse_ref(r)?;
            Some(HostRef {
                reference: r.to_string(),
                commit: commit.to_string(),
                assignment_id: asg.to_string(),
                incarnation: inc.to_string(),
                generation,
                kind,
                marker: done_marker(inner, inc, generation, kind, commit),
            })
        })
        .collect()
}

/// Every checkpoint this host took that is not uploaded (or refused for good) yet.
fn pending(inner: &crate::supervisor::Inner) -> Vec<Pending> {
    let mut out = vec![];
    for (repo, store) in crate::supervisor::checkpoints::stores(inner) {
        for h in host_refs(inner, &store) {
            if h.marker.exists() {
                continue;
            }
            let commit = h.commit.as_str();
            let Ok(tree_id) = git(&["rev-parse", &format!("{commit}^{{tree}}")], Some(&store))
            else {
                continue;
            };
            let base = git(
                &["rev-parse", "--verify", "--quiet", &format!("{commit}^")],
                Some(&store),
            )
            .ok()
            .filter(|b| !b.is_empty());
            out.push(Pending {
                store: store.clone(),
                reference: h.reference.clone(),
                assignment_id: h.assignment_id.clone(),
                lane_incarnation_id: h.incarnation.clone(),
                generation: h.generation,
                kind: h.kind,
                checkpoint: CheckpointRef {
                    repository: repo.clone(),
                    commit_id: h.commit.clone(),
                    tree_id,
                    // What an upload needs is the objects; the inputs were reported with
                    // the checkpoint.
                    inputs_digest: None,
                },
                base_commit_id: base,
            });
        }
    }
    out
}

/// How one object's upload ended.
pub(super) enum Uploaded {
    Stored,
    Refused(String),
}

/// Whose object an upload is: the checkpoint (or artifact) the coordinator names it for.
pub(super) struct UploadHead {
    pub assignment_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub checkpoint_digest: String,
    pub base_commit_id: Option<String>,
}

impl CoordinatedHost {
    /// A coordinator answer about a transfer: to the part waiting for it.
    pub(super) fn on_transfer_answer(&self, msg: ToHost) {
        let key = match &msg {
            ToHost::CheckpointStored(m) => format!("u:{}", m.object_digest),
            ToHost::CheckpointData(m) => format!("f:{}", m.object_digest),
            ToHost::WorkspaceReleaseAnswer(m) => {
                super::release::answer_key(&m.assignment_id, m.done)
            }
            ToHost::WorkspaceEffectAnswer(m) => super::hand_on::answer_key(&m.effect_id, m.claim),
            _ => return,
        };
        let tx = self
            .transfers
            .waiting
            .lock()
            .ok()
            .and_then(|mut w| w.remove(&key));
        match tx {
            Some(tx) => {
                let _ = tx.send(msg);
            }
            None => tracing::debug!(key, "a transfer answer nobody waits for"),
        }
    }

    /// Sends `fields` as `t` and waits for the answer keyed `key`, on the session that is
    /// up now. Between sessions nothing is queued (`NO_LINK` at once: the caller's own loop
    /// asks again once a session is up), and the end of the session it was sent on ends the
    /// wait (`NO_LINK`): an answer, if one comes, would come on that session, so waiting
    /// longer would only hold up the caller's next try, never bring the answer.
    pub(super) async fn ask(
        &self,
        key: String,
        t: crate::protocol::schema::MessageType,
        fields: Vec<(&'static str, Value)>,
    ) -> Result<ToHost, String> {
        let mut session = self.sup.inner.link_session.subscribe();
        let Some(on) = *session.borrow_and_update() else {
            return Err(NO_LINK.into());
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Ok(mut w) = self.transfers.waiting.lock() {
            w.insert(key.clone(), tx);
        }
        let forget = || {
            if let Ok(mut w) = self.transfers.waiting.lock() {
                w.remove(&key);
            }
        };
        if self
            .out
            .send(Outgoing::new(&self.session_signer, t, fields))
            .await
            .is_err()
        {
            forget();
            return Err(NO_LINK.into());
        }
        // Ended, or the link is gone for good (the daemon is stopping): no answer either way.
        let ended = async {
            let _ = session.wait_for(|s| *s != Some(on)).await;
        };
        tokio::select! {
            // An answer already here wins over the end of its session.
            biased;
            answer = tokio::time::timeout(ANSWER_TIMEOUT, rx) => match answer {
                Ok(Ok(m)) => Ok(m),
                _ => {
                    forget();
                    Err(NO_ANSWER.into())
                }
            },
            () = ended => {
                forget();
                Err(NO_LINK.into())
            }
        }
    }

    /// Waits up to `within` for a coordinator session to be up; whether one is.
    async fn session_up(&self, within: Duration) -> bool {
        let mut s = self.sup.inner.link_session.subscribe();
        let up = tokio::time::timeout(within, s.wait_for(|v| v.is_some()))
            .await
            .is_ok_and(|r| r.is_ok());
        up
    }

    /// Uploads every checkpoint of this host not uploaded yet, every `UPLOAD_EVERY`.
    pub(super) async fn upload_loop(host: std::sync::Weak<Self>) {
        // Failed rounds per checkpoint: said at warn the first time and every 30th, so a
        // checkpoint the coordinator cannot take yet does not fill the log.
        let mut failures: HashMap<String, u64> = HashMap::new();
        let mut releases = super::release::Backoff::default();
        loop {
            tokio::time::sleep(UPLOAD_EVERY).await;
            let Some(this) = host.upgrade() else { return };
            let inner = this.sup.inner.clone();
            let Ok(list) = tokio::task::spawn_blocking(move || pending(&inner)).await else {
                continue;
            };
            for p in list {
                let key = p.checkpoint.digest();
                match this.upload_checkpoint(&p).await {
                    Ok(()) => {
                        failures.remove(&key);
                    }
                    Err(e) => {
                        let n = failures.entry(key).or_default();
                        *n += 1;
                        if *n == 1 || *n % 30 == 0 {
                            tracing::warn!(assignment_id = %p.assignment_id, generation = p.generation,
                                error = %e, attempts = *n, "checkpoint upload not finished; trying again later");
                        }
                        // One checkpoint the coordinator cannot take yet never holds up
                        // the others; an unanswered part ends the round (the link is down).
                        if e == NO_LINK || e == NO_ANSWER {
                            break;
                        }
                    }
                }
            }
            // Harness artifacts: each once, then gone from here.
            this.artifact_round(&mut failures).await;
            // What this host observed of its workspace effects, until recorded.
            this.resend_hand_on_settlements().await;
            // Copies of done work, once everything of theirs is uploaded.
            this.release_round(&mut releases).await;
        }
    }

    async fn upload_checkpoint(&self, p: &Pending) -> Result<(), String> {
        let out = self.upload_checkpoint_once(p).await;
        // A checkpoint its harness asked for that the coordinator has not recorded: its
        // report was lost (a full queue, a leader change); sent again while its chain runs
        // here (the same report is the same step there).
        if let (Err(e), Kind::Requested(n)) = (&out, p.kind) {
            if e.ends_with("no-checkpoint") {
                self.report_requested_again(p, n);
            }
        }
        out
    }

    fn report_requested_again(&self, p: &Pending, n: u32) {
        if let Ok(mut last) = self.transfers.reported_again.lock() {
            let now = std::time::Instant::now();
            if last
                .get(&p.reference)
                .is_some_and(|t| now.duration_since(*t) < REPORT_AGAIN_EVERY)
            {
                return;
            }
            last.retain(|_, t| now.duration_since(*t) < REPORT_AGAIN_EVERY);
            last.insert(p.reference.clone(), now);
        }
        let ctx = self.chains.lock().ok().and_then(|c| {
            c.values()
                .find(|x| {
                    x.lane_incarnation_id == p.lane_incarnation_id && x.generation == p.generation
                })
                .cloned()
        });
        let Some(base) = ctx.and_then(|x| x.report_base.lock().ok().and_then(|f| f.clone())) else {
            return; // not running here: the coordinator refuses it for good once it ends
        };
        let mut taken = p.checkpoint.clone();
        taken.inputs_digest =
            crate::supervisor::workspaces::marker(&self.sup.inner, &p.assignment_id)
                .and_then(|m| m.inputs)
                .map(|i| i.digest());
        tracing::info!(assignment_id = %p.assignment_id, generation = p.generation, request_seq = n,
            "a requested checkpoint the coordinator has not recorded: reported again");
        self.send(FromHostChain::CheckpointTaken(wire::CheckpointTaken {
            chain: base.chain,
            bound: base.bound,
            origin: wire::TakenFor::Request(n),
            taken: Ok(taken),
        }));
    }

    async fn upload_checkpoint_once(&self, p: &Pending) -> Result<(), String> {
        let inner = self.sup.inner.clone();
        let mut outcome = Uploaded::Stored;
        if let Some(base) = &p.base_commit_id {
            let args = vec![base_ref(base)];
            outcome = self.upload_object(p, ObjectRole::Base, args).await?;
        }
        if let Uploaded::Stored = outcome {
            let mut args = vec![p.reference.clone()];
            if let Some(base) = &p.base_commit_id {
                args.push(format!("^{base}"));
            }
            outcome = self.upload_object(p, ObjectRole::Bundle, args).await?;
        }
        let note = match &outcome {
            Uploaded::Stored => {
                tracing::info!(assignment_id = %p.assignment_id, generation = p.generation,
                    digest = %p.checkpoint.digest(), "checkpoint uploaded to the coordinator's store");
                "stored".to_string()
            }
            Uploaded::Refused(c) => {
                tracing::error!(assignment_id = %p.assignment_id, generation = p.generation,
                    digest = %p.checkpoint.digest(), category = %c,
                    "the coordinator's store refused this checkpoint for good: it stays on this host only (mosaic checkpoint list says why)");
                format!("refused:{c}")
            }
        };
        let path = done_marker(
            &inner,
            &p.lane_incarnation_id,
            p.generation,
            p.kind,
            &p.checkpoint.commit_id,
        );
        if let Some(dir) = path.parent() {
            crate::util::durable::ensure_dir(dir, 0o700).map_err(|e| e.to_string())?;
        }
        crate::util::durable::write_atomic(&path, note.as_bytes()).map_err(|e| e.to_string())?;
        self.transfers.uploaded.notify_waiters();
        Ok(())
    }

    /// What became of the upload of requested checkpoint `seq` of generation (`inc`,
    /// `generation`), `commit`, within [`STORED_WAIT`]: `{"stored": true}` once the
    /// coordinator's store holds it, `{"stored": false, "store_refused": why}` once it
    /// refused it for good, `{"stored": false}` if neither was heard yet (the upload goes
    /// on: `mosaic checkpoint list` tells).
    pub(super) async fn await_upload(
        &self,
        inc: &str,
        generation: u64,
        seq: u32,
        commit: &str,
    ) -> serde_json::Value {
        let path = done_marker(
            &self.sup.inner,
            inc,
            generation,
            Kind::Requested(seq),
            commit,
        );
        let until = tokio::time::Instant::now() + STORED_WAIT;
        loop {
            let told = self.transfers.uploaded.notified();
            if let Ok(note) = std::fs::read_to_string(&path) {
                return match note.strip_prefix("refused:") {
                    Some(why) => serde_json::json!({ "stored": false, "store_refused": why }),
                    None => serde_json::json!({ "stored": note == "stored" }),
                };
            }
            if tokio::time::timeout_at(until, told).await.is_err() {
                return serde_json::json!({ "stored": false });
            }
        }
    }

    /// Makes the bundle `args` name in `p`'s store and uploads it as `role`.
    async fn upload_object(
        &self,
        p: &Pending,
        role: ObjectRole,
        args: Vec<String>,
    ) -> Result<Uploaded, String> {
        // A base's bundle is made once and kept (every checkpoint of the work names the
        // same base, and the store answers at its first part when it has it); a
        // checkpoint's own is made for this upload and removed after.
        let cached = match (role, &p.base_commit_id) {
            (ObjectRole::Base, Some(b)) => Some(
                self.sup
                    .inner
                    .cfg
                    .state_dir
                    .join("checkpoints")
                    .join("transfer")
                    .join(format!(
                        "base-{}-{b}.bundle",
                        p.checkpoint.repository.as_str()
                    )),
            ),
            _ => None,
        };
        // Its directory made too when the name is the cache's.
        let fresh = scratch(&self.sup.inner)?;
        let file = cached.clone().unwrap_or(fresh);
        let (store, f) = (p.store.clone(), file.clone());
        let made = tokio::task::spawn_blocking(move || {
            if !f.is_file() {
                let tmp = f.with_extension(format!("new-{}", uuid::Uuid::new_v4().simple()));
                let t_s = tmp.to_string_lossy().to_string();
                let mut all = vec!["bundle", "create", "--quiet", t_s.as_str()];
                all.extend(args.iter().map(String::as_str));
                let made = git(&all, Some(&store))
                    .and_then(|_| std::fs::rename(&tmp, &f).map_err(|e| e.to_string()));
                if made.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                made?;
            }
            let size = std::fs::metadata(&f).map_err(|e| e.to_string())?.len();
            Ok::<_, String>((sha256_file(&f)?, size))
        })
        .await
        .map_err(|e| e.to_string())?;
        let out = match made {
            Ok((digest, size)) => {
                let head = UploadHead {
                    assignment_id: p.assignment_id.clone(),
                    lane_incarnation_id: p.lane_incarnation_id.clone(),
                    generation: p.generation,
                    checkpoint_digest: p.checkpoint.digest(),
                    base_commit_id: p.base_commit_id.clone(),
                };
                self.send_object(&head, role, &file, &digest, size).await
            }
            Err(e) => Err(e),
        };
        if cached.is_none() {
            let _ = std::fs::remove_file(&file);
        }
        out
    }

    pub(super) async fn send_object(
        &self,
        p: &UploadHead,
        role: ObjectRole,
        file: &Path,
        digest: &str,
        size: u64,
    ) -> Result<Uploaded, String> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(file).map_err(|e| e.to_string())?;
        let mut offset = 0u64;
        loop {
            let len = (size - offset).min(PART_BYTES as u64) as usize;
            let mut data = vec![0u8; len];
            f.read_exact_at(&mut data, offset)
                .map_err(|e| e.to_string())?;
            let m = CheckpointUpload {
                assignment_id: p.assignment_id.clone(),
                lane_incarnation_id: p.lane_incarnation_id.clone(),
                generation: p.generation,
                checkpoint_digest: p.checkpoint_digest.clone(),
                role,
                base_commit_id: (role == ObjectRole::Base)
                    .then(|| p.base_commit_id.clone())
                    .flatten(),
                object_digest: digest.to_string(),
                object_size: size,
                offset,
                data,
            };
            let answer = self
                .ask(
                    format!("u:{digest}"),
                    crate::protocol::schema::MessageType::CheckpointUpload,
                    m.fields(),
                )
                .await?;
            let ToHost::CheckpointStored(CheckpointStored {
                verdict, received, ..
            }) = answer
            else {
                return Err("an unexpected answer".into());
            };
            match verdict {
                StoredVerdict::Stored => return Ok(Uploaded::Stored),
                StoredVerdict::Refused(c) => return Ok(Uploaded::Refused(c)),
                StoredVerdict::Retry(c) => return Err(format!("the coordinator says later: {c}")),
                StoredVerdict::More if received < size && received % PART_BYTES as u64 == 0 => {
                    offset = received
                }
                StoredVerdict::More => {
                    return Err(format!(
                        "the store holds {received} of {size} bytes: not a part boundary"
                    ))
                }
            }
        }
    }

    /// Makes sure this host's checkpoint repository holds the checkpoint `stage` restores:
    /// its own already, or fetched from the coordinator's store (base, then bundle),
    /// verified and imported. Nothing to do without a restore point.
    pub(super) async fn obtain(&self, stage: &wire::Stage) -> Result<(), String> {
        let (Some(repo), Some(point)) = (&stage.repository, &stage.restore) else {
            return Ok(());
        };
        if !point.well_formed(&repo.name) {
            return Err("the stage's checkpoint is malformed".into());
        }
        let inner = self.sup.inner.clone();
        let (name, p) = (repo.name.clone(), point.clone());
        let (store, has, base_here) = tokio::task::spawn_blocking(move || {
            let store = store_of(&inner, &name)?;
            let has = has_commit(&store, &p.commit_id);
            let base_here = p
                .base_commit_id
                .as_deref()
                .is_none_or(|b| has_base(&store, b));
            Ok::<_, String>((store, has, base_here))
        })
        .await
        .map_err(|e| e.to_string())??;
        if has {
            return Ok(());
        }
        let a = &stage.authority;
        let missing = |what: &str| {
            format!(
                "checkpoint {} (taken on host:{}) has no {what} in the coordinator's store yet",
                point.checkpoint_digest, point.host_id
            )
        };
        // One restore's fetches at a time on this host (answers are matched by object).
        let _one = self.transfers.fetching.lock().await;
        if let (false, Some(b)) = (base_here, &point.base_commit_id) {
            let base = point.base_object.as_ref().ok_or_else(|| missing("base"))?;
            // Exactly this base's ref, created only (never over one this host has), and
            // checked to name this commit: a bundle carries whatever refs its maker put in.
            let r = base_ref(b);
            self.fetch_into(a, &store, base, &format!("{r}:{r}"))
                .await?;
            let (s, b) = (store.clone(), b.clone());
            let ok = tokio::task::spawn_blocking(move || has_base(&s, &b))
                .await
                .map_err(|e| e.to_string())?;
            if !ok {
                return Err(format!(
                    "checkpoint {}: its base bundle does not hold base {}",
                    point.checkpoint_digest,
                    point.base_commit_id.as_deref().unwrap_or("")
                ));
            }
        }
        let bundle = point
            .bundle_object
            .as_ref()
            .ok_or_else(|| missing("bundle"))?;
        self.fetch_into(
            a,
            &store,
            bundle,
            "+refs/mosaic/checkpoints/*:refs/mosaic/restored/*",
        )
        .await?;
        let (s, p) = (store.clone(), point.clone());
        tokio::task::spawn_blocking(move || {
            crate::supervisor::checkpoints::check_imported(
                &s,
                &p.checkpoint_digest,
                &p.commit_id,
                p.base_commit_id.as_deref(),
                &p.tree_id,
            )
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Fetches `obj`, verifies it, and imports it into `store` with `refspec`.
    async fn fetch_into(
        &self,
        a: &crate::protocol::messages::ChainAuthority,
        store: &Path,
        obj: &StoredObject,
        refspec: &str,
    ) -> Result<(), String> {
        let file = scratch(&self.sup.inner)?;
        let got = self
            .fetch_object(&a.assignment_id, &a.reservation_id, obj, &file)
            .await;
        let out = match got {
            Ok(()) => {
                let (s, f, r) = (store.to_path_buf(), file.clone(), refspec.to_string());
                tokio::task::spawn_blocking(move || {
                    let f_s = f.to_string_lossy().to_string();
                    crate::util::git::fetch_checked(&s, &f_s, &r).map(|_| ())
                })
                .await
                .map_err(|e| e.to_string())?
            }
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&file);
        out
    }

    /// Fetches stored object `obj` into `file`, part by part, and verifies it whole. `via`
    /// is what the coordinator serves it for: the reservation of a stage that restores it,
    /// or a workspace effect that hands it on.
    pub(super) async fn fetch_object(
        &self,
        assignment_id: &str,
        via: &str,
        obj: &StoredObject,
        file: &Path,
    ) -> Result<(), String> {
        let mut f = std::fs::File::create(file).map_err(|e| e.to_string())?;
        let mut offset = 0u64;
        while offset < obj.size {
            let m = CheckpointFetch {
                assignment_id: assignment_id.to_string(),
                reservation_id: via.to_string(),
                object_digest: obj.digest.clone(),
                offset,
            };
            // A session that ends mid-fetch is not the end of the fetch: the part is asked
            // again on the next session (a few times, each waiting up to the answer timeout
            // for one), from where it stopped.
            let mut relinks = 0;
            let answer = loop {
                match self
                    .ask(
                        format!("f:{}", obj.digest),
                        crate::protocol::schema::MessageType::CheckpointFetch,
                        m.fields(),
                    )
                    .await
                {
                    Err(e)
                        if e == NO_LINK
                            && relinks < FETCH_RELINKS
                            && self.session_up(ANSWER_TIMEOUT).await =>
                    {
                        relinks += 1;
                    }
                    r => break r?,
                }
            };
            let ToHost::CheckpointData(CheckpointData {
                answer, offset: at, ..
            }) = answer
            else {
                return Err("an unexpected answer".into());
            };
            match answer {
                DataAnswer::Refused(c) => {
                    return Err(format!(
                        "the coordinator refused checkpoint object {}: {c}",
                        obj.digest
                    ))
                }
                DataAnswer::Data { object_size, data } => {
                    let want = (obj.size - offset).min(PART_BYTES as u64) as usize;
                    if at != offset || object_size != obj.size || data.len() != want {
                        return Err(format!(
                            "checkpoint object {}: a part that does not fit",
                            obj.digest
                        ));
                    }
                    f.write_all(&data).map_err(|e| e.to_string())?;
                    offset += data.len() as u64;
                }
            }
        }
        f.sync_all().map_err(|e| e.to_string())?;
        let got = sha256_file(file)?;
        if got != obj.digest {
            return Err(format!(
                "checkpoint object {} arrived as {got}: refused",
                obj.digest
            ));
        }
        Ok(())
    }
}
