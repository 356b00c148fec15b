//! Queue isolation (spec §12): nothing addressed to a fenced or older generation is ever
//! delivered — not replayed, drained, summarized or copied into a newer one.
//!
//! **Owns:** the per-lane "current generation" each receiver delivers to, and the verdict
//! on every lane-addressed envelope before delivery.
//!
//! **Never:** delivers on a partial match (lane, incarnation and generation must all be
//! current), keeps a rejected envelope's payload, or lets a generation number move
//! backwards or be reused.

use std::collections::HashMap;

use serde::Serialize;

use super::envelope::{Envelope, Verified};

/// What a receiver is currently delivering to, for one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Current {
    incarnation: String,
    generation: u64,
    fenced: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    #[error("no generation is current on lane {0}")]
    NoCurrent(String),
    #[error("envelope is for incarnation {got}, the lane is on {current}")]
    OtherIncarnation { got: String, current: String },
    #[error("envelope is for generation {got}, the lane is on {current}")]
    OldGeneration { got: u64, current: u64 },
    #[error("envelope is for generation {got}, ahead of the lane's {current}")]
    FutureGeneration { got: u64, current: u64 },
    #[error("generation {0} is fenced")]
    Fenced(u64),
    #[error("envelope carries no lane address")]
    Unaddressed,
}

impl Stale {
    pub fn category(&self) -> &'static str {
        match self {
            Self::NoCurrent(_) => "no-current-generation",
            Self::OtherIncarnation { .. } => "stale-incarnation",
            Self::OldGeneration { .. } => "stale-generation",
            Self::FutureGeneration { .. } => "future-generation",
            Self::Fenced(_) => "fenced-generation",
            Self::Unaddressed => "unaddressed",
        }
    }
}

/// A redacted audit record of a rejected envelope: identifiers only, never the payload.
#[derive(Debug, Clone, Serialize)]
pub struct StaleAudit {
    #[serde(skip)]
    pub reason: Stale,
    pub category: &'static str,
    pub message_type: &'static str,
    pub message_id: String,
    pub issuer: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub generation: Option<u64>,
    pub detail: String,
}

#[derive(Debug, Default)]
pub struct GenerationGate {
    lanes: HashMap<String, Current>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("generation {new} does not advance lane {lane} past {current}")]
    NotMonotonic {
        lane: String,
        current: u64,
        new: u64,
    },
}

impl GenerationGate {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes (incarnation, generation) current for `lane`, fencing whatever was current.
    /// Within one incarnation the generation must strictly increase; a new incarnation
    /// starts its own numbering.
    pub fn advance(
        &mut self,
        lane: &str,
        incarnation: &str,
        generation: u64,
    ) -> Result<(), GateError> {
        if let Some(c) = self.lanes.get(lane) {
            if c.incarnation == incarnation && generation <= c.generation {
                return Err(GateError::NotMonotonic {
                    lane: lane.into(),
                    current: c.generation,
                    new: generation,
                });
            }
        }
        self.lanes.insert(
            lane.into(),
            Current {
                incarnation: incarnation.into(),
                generation,
                fenced: false,
            },
        );
        Ok(())
    }

    /// Fences the lane's current generation: nothing more is delivered to it.
    pub fn fence(&mut self, lane: &str) {
        if let Some(c) = self.lanes.get_mut(lane) {
            c.fenced = true;
        }
    }

    /// Fences `generation` of `incarnation` on `lane` if it is the current one (a
    /// coordinator ended it); anything else is already not deliverable.
    pub fn fence_generation(&mut self, lane: &str, incarnation: &str, generation: u64) {
        if let Some(c) = self.lanes.get_mut(lane) {
            if c.incarnation == incarnation && c.generation == generation {
                c.fenced = true;
            }
        }
    }

    /// Whether (incarnation, generation) is the lane's current, unfenced generation.
    pub fn is_current(&self, lane: &str, incarnation: &str, generation: u64) -> bool {
        self.lanes.get(lane).is_some_and(|c| {
            c.incarnation == incarnation && c.generation == generation && !c.fenced
        })
    }

    /// Admits `env` for delivery only if it is addressed to the lane's current, unfenced
    /// generation of the current incarnation.
    /// On rejection, returns the redacted audit record (which carries the reason).
    pub fn admit(&self, env: &Envelope<Verified>) -> Result<(), Box<StaleAudit>> {
        let address = env.address();
        let lane = address.lane_id.unwrap_or("").to_string();
        let inc = address.lane_incarnation_id.unwrap_or("").to_string();
        let generation = address.generation;
        let audit = |s: Stale| StaleAudit {
            category: s.category(),
            message_type: env.message_type().as_str(),
            message_id: env.message_id().into(),
            issuer: env.issuer().into(),
            lane_id: lane.clone(),
            lane_incarnation_id: inc.clone(),
            generation,
            detail: s.to_string(),
            reason: s,
        };
        let verdict = (|| {
            let g = generation.ok_or(Stale::Unaddressed)?;
            if lane.is_empty() || inc.is_empty() {
                return Err(Stale::Unaddressed);
            }
            let c = self
                .lanes
                .get(&lane)
                .ok_or_else(|| Stale::NoCurrent(lane.clone()))?;
            if c.incarnation != inc {
                return Err(Stale::OtherIncarnation {
                    got: inc.clone(),
                    current: c.incarnation.clone(),
                });
            }
            if g < c.generation {
                return Err(Stale::OldGeneration {
                    got: g,
                    current: c.generation,
                });
            }
            if g > c.generation {
                return Err(Stale::FutureGeneration {
                    got: g,
                    current: c.generation,
                });
            }
            if c.fenced {
                return Err(Stale::Fenced(g));
            }
            Ok(())
        })();
        verdict.map_err(|s| Box::new(audit(s)))
    }
}
