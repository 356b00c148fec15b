//! The host's memory of the authority it answers to: the coordinator's timeline
//! (`sot_incarnation`) and the highest coordinator epoch it has seen on it.
//!
//! Every coordinator envelope is checked against it before anything acts on it: one of
//! another timeline, or of an epoch below the highest seen, comes from a deposed or foreign
//! coordinator and is refused (audited). A higher epoch raises the mark durably (fsync'd)
//! before the envelope is acted on, so a restarted supervisor still refuses what its
//! predecessor would have.
//!
//! The way out when a timeline change is intended (a new coordinator database): stop the
//! supervisor, delete `coordinator-authority.json` from its state dir, start it again.
//!
//! **Never:** lowers the mark, or adopts another timeline on its own.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::SupervisorError;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Mark {
    sot_incarnation: String,
    coordinator_epoch: u64,
}

/// Why an envelope's authority was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Another coordinator timeline than the one this host answers to.
    OtherTimeline,
    /// An epoch below the highest this host has seen: a deposed leader.
    StaleEpoch,
    /// Authority fields missing where they are required.
    Missing,
    /// The mark could not be made durable.
    NotDurable,
}

impl Refusal {
    pub fn category(self) -> &'static str {
        match self {
            Self::OtherTimeline => "other-timeline",
            Self::StaleEpoch => "stale-epoch",
            Self::Missing => "authority-missing",
            Self::NotDurable => "authority-not-durable",
        }
    }
}

pub struct AuthorityFence {
    path: PathBuf,
    mark: Mutex<Option<Mark>>,
}

impl AuthorityFence {
    pub const FILE: &'static str = "coordinator-authority.json";

    pub fn load(state_dir: &Path) -> Result<Self, SupervisorError> {
        let path = state_dir.join(Self::FILE);
        let mark =
            match std::fs::read(&path) {
                Ok(b) => Some(serde_json::from_slice::<Mark>(&b).map_err(|e| {
                    SupervisorError::State {
                        detail: format!("{}: {e}", path.display()),
                    }
                })?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    return Err(SupervisorError::State {
                        detail: format!("{}: {e}", path.display()),
                    })
                }
            };
        Ok(Self {
            path,
            mark: Mutex::new(mark),
        })
    }

    /// Admits an envelope's timeline and epoch (either may be absent: a field that is
    /// `null` on the wire says nothing, and is checked by whoever requires it). Raises the
    /// durable mark when the epoch is new.
    pub fn admit(&self, sot: Option<&str>, epoch: Option<u64>) -> Result<(), Refusal> {
        let Ok(mut g) = self.mark.lock() else {
            return Err(Refusal::NotDurable);
        };
        let next = match (g.as_ref(), sot, epoch) {
            (_, None, None) => return Ok(()),
            (Some(m), Some(s), _) if m.sot_incarnation != s => return Err(Refusal::OtherTimeline),
            (Some(m), _, Some(e)) if e < m.coordinator_epoch => return Err(Refusal::StaleEpoch),
            (Some(m), _, Some(e)) if e > m.coordinator_epoch => Mark {
                sot_incarnation: m.sot_incarnation.clone(),
                coordinator_epoch: e,
            },
            (Some(_), _, _) => return Ok(()),
            // The first authority this host hears of binds it (needs both fields).
            (None, Some(s), Some(e)) => Mark {
                sot_incarnation: s.to_string(),
                coordinator_epoch: e,
            },
            (None, _, _) => return Ok(()),
        };
        let bytes = serde_json::to_vec(&next).map_err(|_| Refusal::NotDurable)?;
        crate::util::durable::write_atomic(&self.path, &bytes).map_err(|_| Refusal::NotDurable)?;
        *g = Some(next);
        Ok(())
    }

    /// The highest epoch seen, if any.
    pub fn epoch(&self) -> Option<u64> {
        self.mark
            .lock()
            .ok()
            .and_then(|m| m.as_ref().map(|m| m.coordinator_epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_only_rises_and_survives_a_reload() {
        let dir = std::env::temp_dir().join(format!("mosaic-fence-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = AuthorityFence::load(&dir).unwrap();
        assert_eq!(f.admit(Some("sot-a"), Some(3)), Ok(()));
        assert_eq!(f.admit(Some("sot-a"), Some(2)), Err(Refusal::StaleEpoch));
        assert_eq!(f.admit(Some("sot-b"), Some(9)), Err(Refusal::OtherTimeline));
        assert_eq!(f.admit(None, Some(5)), Ok(()));
        let again = AuthorityFence::load(&dir).unwrap();
        assert_eq!(again.epoch(), Some(5));
        assert_eq!(
            again.admit(Some("sot-a"), Some(4)),
            Err(Refusal::StaleEpoch)
        );
        assert_eq!(again.admit(Some("sot-a"), Some(5)), Ok(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
