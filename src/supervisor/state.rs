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
    pub activated: bool,
    /// The chain fields this host's messages about the generation carry (identifiers,
    /// digests, the fence commitment — nothing secret), recorded at activation so that a
    /// restarted supervisor can serve the harness's lane socket again and sign its reports.
    #[serde(default)]
    pub chain_fields: Option<serde_json::Value>,
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
}

#[derive(Debug, Clone)]
pub struct Store {
    lanes: PathBuf,
    gens: PathBuf,
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
        };
        durable::ensure_dir(&s.lanes, 0o700)?;
        durable::ensure_dir(&s.gens, 0o700)?;
        Ok(s)
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

    pub fn save_gen(&self, r: &GenRecord) -> Result<(), SupervisorError> {
        let dir = self.gen_dir(&r.lane_incarnation_id);
        durable::ensure_dir(&dir, 0o700)?;
        durable::write_atomic(&dir.join(format!("gen-{}.json", r.generation)), &json(r)?)?;
        Ok(())
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
