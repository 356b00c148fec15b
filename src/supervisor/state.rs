//! Persisted lane and generation records: what a restarted supervisor re-adopts from.
//!
//! Every record write is atomic and fsync'd (`util::durable`). Records are facts about
//! this host only; they confer no authority.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::identity::{NonceDigest, ProcessIdentity};
use super::SupervisorError;
use crate::util::durable;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LaneStatus {
    Active,
    /// Something could not be proven clean; no new generation until the lane is destroyed
    /// and recreated (a new incarnation).
    Quarantined,
    Destroyed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaneRecord {
    pub lane: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub status: LaneStatus,
    pub quarantine_reason: Option<String>,
    pub created_at: String,
    /// The next generation number to hand out; persisted before the generation starts,
    /// so a crash can never cause a number to be used twice.
    pub next_generation: u64,
    pub current_generation: Option<u64>,
    /// Every incarnation this lane name has had, oldest first.
    pub past_incarnations: Vec<String>,
    /// The unprivileged uid (and gid, the same number) this incarnation's confined
    /// generations run as: allocated once per incarnation from `lane_uids`, never
    /// handed out again (`Store::allocate_uid`). `None` in a record from before lanes had
    /// their own; allocated at its next confined start.
    #[serde(default)]
    pub uid: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GenStatus {
    /// Cgroup made, shim launched, identity not yet verified.
    Starting,
    /// Identity verified; the harness runs.
    Live,
    /// Receipt written.
    Terminated,
}

/// What a coordinated generation was staged for: enough for a restarted supervisor to
/// recognize the coordinator's messages about it, and to say whether it was activated.
/// Facts about this host; they confer no authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordBinding {
    pub reservation_id: String,
    pub assignment_id: String,
    pub assignment_attempt_id: String,
    pub sot_incarnation: String,
    pub coordinator_epoch: u64,
    pub fence_proof: String,
    /// The coordinator told this host the generation is RUNNING (recorded before the
    /// harness is told).
    /// The repository the work's workspace is cloned from (`None`: a scratch directory).
    #[serde(default)]
    pub repository: Option<crate::protocol::repo::RepoBinding>,
    /// The checkpoint its workspace is restored from, when the work has one.
    #[serde(default)]
    pub restore: Option<Box<crate::protocol::repo::RestorePoint>>,
    pub activated: bool,
    /// The chain fields this host's messages about the generation carry (identifiers,
    /// digests, the fence commitment — nothing secret), recorded at activation so that a
    /// restarted supervisor can serve the harness's lane socket again and sign its reports.
    #[serde(default)]
    pub chain_fields: Option<serde_json::Value>,
    /// Whom its harness's artifact is encrypted to (`PRINCIPAL=age1…`, as its stage
    /// named them); none: no artifact is captured (it is never kept in the clear).
    #[serde(default)]
    pub artifact_recipients: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenRecord {
    pub lane: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub runtime: String,
    pub status: GenStatus,
    pub cgroup: PathBuf,
    pub socket: PathBuf,
    pub exit_record: PathBuf,
    pub nonce_digest: NonceDigest,
    pub graceful_signal: String,
    pub grace_period_ms: u64,
    pub identity: Option<ProcessIdentity>,
    pub started_at: String,
    pub receipt_key: String,
    /// Set for a generation started by the coordinator's chain.
    #[serde(default)]
    pub coord: Option<CoordBinding>,
    /// The conversation id the harness was started with (real harnesses); every hook event
    /// must name it.
    #[serde(default)]
    pub conversation_id: Option<String>,
    /// The uid (and gid) its harness runs as; `None`: the supervisor's own (an unconfined
    /// lane).
    #[serde(default)]
    pub uid: Option<u32>,
    /// Its workspace (working directory), when it is read-only to the harness until the
    /// coordinator activates it (a confined, coordinated generation): the mount the
    /// supervisor opens at activation and closes at a fence (`confine::workspace`).
    #[serde(default)]
    pub workspace: Option<PathBuf>,
    /// The coordinator ordered it ended: its workspace is closed for good (an activation
    /// that arrives after is not honoured, a restarted supervisor does not reopen it).
    #[serde(default)]
    pub fenced: bool,
    /// Its work is offered to another lane (a handoff offer is open): its workspace is
    /// read-only until the offer ends without moving the work (then open again) or the
    /// accepted handoff fences it.
    #[serde(default)]
    pub held: bool,
    /// The checkpoint taken of its held workspace for a handoff: its tree until the hold
    /// is released (the workspace stays read-only held, then fenced), so its end's
    /// checkpoint is this one, never taken again (on this host another generation may by
    /// then be working in another copy, or nothing may be left to read).
    #[serde(default)]
    pub handoff_checkpoint: Option<HandoffTaken>,
    /// How many checkpoints its harness has asked for (`mosaic lane checkpoint`): the
    /// number is taken, and recorded, before each capture, so none is ever used twice.
    #[serde(default)]
    pub requested_checkpoints: u32,
    /// When the last of them was taken (unix seconds): they are spaced.
    #[serde(default)]
    pub requested_checkpoint_at: Option<u64>,
    /// Where its harness keeps its session under its private area (its adapter's
    /// `artifact_paths`, fixed at launch): captured as its artifact at its end.
    #[serde(default)]
    pub artifact_paths: Vec<String>,
}

/// A checkpoint taken for a handoff of a generation's work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffTaken {
    pub handoff_id: String,
    pub checkpoint: crate::protocol::repo::CheckpointRef,
}

impl GenRecord {
    /// Whether its workspace is to be writable: activated, neither fenced nor held. The
    /// one rule the activation, the coordinator's orders and re-adoption all follow.
    pub fn workspace_open(&self) -> bool {
        self.coord.as_ref().is_some_and(|c| c.activated) && !self.fenced && !self.held
    }
}

#[derive(Debug, Clone)]
pub struct Store {
    lanes: PathBuf,
    gens: PathBuf,
    /// The uid counter (`uids.json`): the next uid of `lane_uids` to hand out.
    uids: PathBuf,
    uid_lock: std::sync::Arc<std::sync::Mutex<()>>,
}

/// The range lane uids come from (`lane_uids` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UidRange {
    pub first: u32,
    pub count: u32,
}

impl UidRange {
    /// Far above the accounts a distribution makes and the usual subordinate-uid ranges
    /// of rootless containers (100000 and up, 65536 each), below 2^31.
    pub const DEFAULT: Self = Self {
        first: 1_900_000_000,
        count: 1_000_000,
    };

    pub fn check(&self) -> Result<(), String> {
        if self.first < 1000 {
            return Err(format!(
                "lane_uids.first {} would hand out system accounts (below 1000)",
                self.first
            ));
        }
        if self.count == 0
            || self
                .first
                .checked_add(self.count)
                .is_none_or(|e| e > 1 << 31)
        {
            return Err("lane_uids must be a non-empty range below 2^31".into());
        }
        Ok(())
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct UidCounter {
    next: u32,
}

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>, SupervisorError> {
    serde_json::to_vec_pretty(v).map_err(|e| SupervisorError::State {
        detail: e.to_string(),
    })
}

fn read_json<T: for<'de> Deserialize<'de>>(p: &Path) -> Result<T, SupervisorError> {
    let bytes = std::fs::read(p).map_err(|e| SupervisorError::State {
        detail: format!("read {}: {e}", p.display()),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| SupervisorError::State {
        detail: format!("parse {}: {e}", p.display()),
    })
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

impl Store {
    pub fn open(state_dir: &Path) -> Result<Self, SupervisorError> {
        let s = Self {
            lanes: state_dir.join("lanes"),
            gens: state_dir.join("generations"),
            uids: state_dir.join("uids.json"),
            uid_lock: Default::default(),
        };
        durable::ensure_dir(&s.lanes, 0o700)?;
        durable::ensure_dir(&s.gens, 0o700)?;
        Ok(s)
    }

    /// Hands out the next uid of `range` for a new lane incarnation: durable before it is
    /// returned, never handed out again, by this supervisor or any other on the host. Two
    /// counters only rise: this state directory's (`uids.json`) and the host's `ledger`
    /// (shared by every supervisor of the machine, taken under an exclusive lock); the uid
    /// is above both and above every uid a lane record here holds, and skips every uid or
    /// gid the account databases name. Exhausted: refused.
    pub fn allocate_uid(&self, range: UidRange, ledger: &Path) -> Result<u32, SupervisorError> {
        let _g = self.uid_lock.lock().unwrap_or_else(|p| p.into_inner());
        let state = |detail: String| SupervisorError::State { detail };
        if let Some(dir) = ledger.parent() {
            durable::ensure_dir(dir, 0o700)?;
        }
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(ledger.with_extension("lock"))
            .map_err(|e| state(format!("open {}: {e}", ledger.display())))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| state(format!("lock {}: {e}", ledger.display())))?;
        let read = |p: &Path| -> Result<Option<u32>, SupervisorError> {
            match std::fs::read(p) {
                Ok(b) => serde_json::from_slice::<UidCounter>(&b)
                    .map(|c| Some(c.next))
                    .map_err(|e| state(format!("parse {}: {e}", p.display()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(state(format!("read {}: {e}", p.display()))),
            }
        };
        let held = self
            .lanes()?
            .iter()
            .filter_map(|l| l.uid)
            .map(|u| u.saturating_add(1))
            .max()
            .unwrap_or(0);
        let end = range.first.saturating_add(range.count);
        let mut uid = [
            read(&self.uids)?,
            read(ledger)?,
            Some(held),
            Some(range.first),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(range.first);
        let taken = |id: u32| {
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(id))
                .ok()
                .flatten()
                .is_some()
                || nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(id))
                    .ok()
                    .flatten()
                    .is_some()
        };
        while uid < end && taken(uid) {
            uid += 1;
        }
        if uid >= end {
            return Err(SupervisorError::LaneUids {
                detail: format!(
                    "every uid of lane_uids ({}..{end}) has been handed out; uids are never reused, so widen or move the range",
                    range.first
                ),
            });
        }
        let next = json(&UidCounter { next: uid + 1 })?;
        durable::write_atomic(ledger, &next)?;
        durable::write_atomic(&self.uids, &next)?;
        Ok(uid)
    }

    pub fn save_lane(&self, r: &LaneRecord) -> Result<(), SupervisorError> {
        durable::write_atomic(&self.lanes.join(format!("{}.json", r.lane)), &json(r)?)?;
        Ok(())
    }

    pub fn lanes(&self) -> Result<Vec<LaneRecord>, SupervisorError> {
        json_files(&self.lanes)
            .iter()
            .map(|p| read_json(p))
            .collect()
    }

    pub fn gen_dir(&self, incarnation: &str) -> PathBuf {
        self.gens.join(incarnation)
    }

    /// Where a coordinated generation's continuation results are kept (not a `.json`: the
    /// generation records of the directory are those).
    pub fn continuation_results_path(&self, incarnation: &str, generation: u64) -> PathBuf {
        self.gen_dir(incarnation)
            .join(format!("gen-{generation}.continuation-results"))
    }

    /// Where the conversation id a harness named at its first session is kept
    /// (`GenSession::keep_conversation`).
    pub fn conversation_path(&self, incarnation: &str, generation: u64) -> PathBuf {
        self.gen_dir(incarnation)
            .join(format!("gen-{generation}.conversation"))
    }

    /// Where the progress the supervisor observes for a generation keeps its baseline
    /// (`supervisor::progress`; never in the harness's own areas, which it could rewrite).
    pub fn progress_path(&self, incarnation: &str, generation: u64) -> PathBuf {
        self.gen_dir(incarnation)
            .join(format!("gen-{generation}.progress"))
    }

    pub fn save_gen(&self, r: &GenRecord) -> Result<(), SupervisorError> {
        let dir = self.gen_dir(&r.lane_incarnation_id);
        durable::ensure_dir(&dir, 0o700)?;
        durable::write_atomic(&dir.join(format!("gen-{}.json", r.generation)), &json(r)?)?;
        Ok(())
    }

    /// The record of generation `generation` of `incarnation` as last saved.
    pub fn load_gen(
        &self,
        incarnation: &str,
        generation: u64,
    ) -> Result<GenRecord, SupervisorError> {
        read_json(
            &self
                .gen_dir(incarnation)
                .join(format!("gen-{generation}.json")),
        )
    }

    /// Whether generation `generation` of `incarnation` was begun here (its record exists,
    /// whatever its status).
    pub fn gen_exists(&self, incarnation: &str, generation: u64) -> bool {
        self.gen_dir(incarnation)
            .join(format!("gen-{generation}.json"))
            .exists()
    }

    pub fn gens(&self, incarnation: &str) -> Result<Vec<GenRecord>, SupervisorError> {
        let mut v: Vec<GenRecord> = json_files(&self.gen_dir(incarnation))
            .iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| !n.ends_with(".exit.json"))
            })
            .map(|p| read_json(p))
            .collect::<Result<_, _>>()?;
        v.sort_by_key(|g| g.generation);
        Ok(v)
    }
}
