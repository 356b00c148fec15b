//! Typed messages: a verified envelope converted, in one place, into one struct per message
//! type, so handlers take fields by name and type instead of reading `env.str("…")`.
//!
//! Today this covers the chain messages a host sends the coordinator (staged, injected,
//! ACK, progress, blocked, handoff ACK, continuation accept and result) — [`FromHostChain`].
//! The session messages and the coordinator → host direction are still read from the
//! envelope by their handlers.
//!
//! **Never:** converts an envelope that was not verified (`Envelope<Verified>` only), or
//! fills a missing required field with a default: the schema guarantees each one, and a
//! conversion that finds one missing is a typed error naming the field.

use super::canonical::{self, Value};
use super::envelope::{Envelope, Verified};
use super::schema::MessageType;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{message_type}: required field {field} is missing or not {expected}")]
    Field {
        message_type: &'static str,
        field: &'static str,
        expected: &'static str,
    },
}

/// The chain a host's chain message speaks for: what the coordinator checks against the
/// reservation's rows before anything else (`hosts::owned`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRef {
    pub reservation_id: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub assignment_id: String,
    pub assignment_attempt_id: String,
    pub generation: u64,
    pub sot_incarnation: String,
    pub coordinator_epoch: u64,
    /// The stage's fence commitment, shown back.
    pub fence_proof: String,
}

/// `staged`: the host started a fresh, verified process tree for this generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged {
    pub chain: ChainRef,
    pub process_identity: serde_json::Value,
}

/// `injected`: the host delivered exactly this contract digest to that process.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    pub chain: ChainRef,
    pub delivered_contracts_digest: String,
    pub process_identity: serde_json::Value,
}

/// `ack`: the harness answered the activation challenge; every bound field (spec §8).
#[derive(Debug, Clone, PartialEq)]
pub struct Ack {
    pub chain: ChainRef,
    pub challenge_id: String,
    pub reservation_epoch: u64,
    pub reservation_deadline: String,
    pub process_identity: serde_json::Value,
    pub contracts_digest: String,
    pub scope_digest: String,
    pub holds_digest: String,
    pub runtime_id: String,
    /// The digest of the verified ACK envelope itself.
    pub ack_digest: String,
}

/// `progress`: objective evidence of progress from the RUNNING generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub chain: ChainRef,
    pub evidence_kind: String,
    pub evidence_digest: String,
    pub next_action: Option<String>,
    pub message_id: String,
}

/// `blocked`: the RUNNING generation cannot go on without someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub chain: ChainRef,
    pub blocker_code: String,
    pub blocker_evidence_digest: String,
    pub next_action: String,
}

/// `handoff_ack`: a handoff target's harness acknowledged the handoff (spec §8.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffAck {
    pub chain: ChainRef,
    pub handoff_challenge_id: String,
    pub source_assignment_attempt_id: String,
    pub responsibility_owner: String,
    pub execution_owner: String,
    pub pending_target: String,
    pub next_action_digest: String,
    pub scope_digest: String,
    pub holds_digest: String,
    pub contracts_digest: String,
    pub challenge_deadline: String,
    /// The digest of the verified handoff-ACK envelope itself.
    pub ack_digest: String,
}

/// `continuation_accept`: the host accepts an offered continuation for its settled harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuationAccept {
    pub chain: ChainRef,
    pub continuation_id: String,
    pub claim_ref: String,
    pub next_action_digest: String,
}

/// `continuation_result`: what the harness produced for a continuation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuationResult {
    pub chain: ChainRef,
    pub continuation_id: String,
    pub result_evidence_digest: String,
}

/// Every chain message a host sends the coordinator.
#[derive(Debug, Clone, PartialEq)]
pub enum FromHostChain {
    Staged(Staged),
    Injected(Injected),
    Ack(Ack),
    Progress(Progress),
    Blocked(Blocked),
    HandoffAck(HandoffAck),
    ContinuationAccept(ContinuationAccept),
    ContinuationResult(ContinuationResult),
}

impl FromHostChain {
    /// Converts a verified envelope; `Ok(None)` for a type that is not a host chain
    /// message.
    pub fn decode(env: &Envelope<Verified>) -> Result<Option<Self>, WireError> {
        let f = Fields {
            env,
            t: env.message_type().as_str(),
        };
        let msg = match env.message_type() {
            MessageType::Staged => Self::Staged(Staged {
                chain: f.chain()?,
                process_identity: f.json("process_identity")?,
            }),
            MessageType::Injected => Self::Injected(Injected {
                chain: f.chain()?,
                delivered_contracts_digest: f.str("delivered_contracts_digest")?,
                process_identity: f.json("process_identity")?,
            }),
            MessageType::Ack => Self::Ack(Ack {
                chain: f.chain()?,
                challenge_id: f.str("challenge_id")?,
                reservation_epoch: f.uint("reservation_epoch")?,
                reservation_deadline: f.str("reservation_deadline")?,
                process_identity: f.json("process_identity")?,
                contracts_digest: f.str("contracts_digest")?,
                scope_digest: f.str("scope_digest")?,
                holds_digest: f.str("holds_digest")?,
                runtime_id: f.str("runtime_id")?,
                ack_digest: env.digest(),
            }),
            MessageType::Progress => Self::Progress(Progress {
                chain: f.chain()?,
                evidence_kind: f.str("evidence_kind")?,
                evidence_digest: f.str("evidence_digest")?,
                next_action: f.opt_str("next_action"),
                message_id: f.str("message_id")?,
            }),
            MessageType::Blocked => Self::Blocked(Blocked {
                chain: f.chain()?,
                blocker_code: f.str("blocker_code")?,
                blocker_evidence_digest: f.str("blocker_evidence_digest")?,
                next_action: f.str("next_action")?,
            }),
            MessageType::HandoffAck => Self::HandoffAck(HandoffAck {
                chain: f.chain()?,
                handoff_challenge_id: f.str("handoff_challenge_id")?,
                source_assignment_attempt_id: f.str("source_assignment_attempt_id")?,
                responsibility_owner: f.str("responsibility_owner")?,
                execution_owner: f.str("execution_owner")?,
                pending_target: f.str("pending_target")?,
                next_action_digest: f.str("next_action_digest")?,
                scope_digest: f.str("scope_digest")?,
                holds_digest: f.str("holds_digest")?,
                contracts_digest: f.str("contracts_digest")?,
                challenge_deadline: f.str("challenge_deadline")?,
                ack_digest: env.digest(),
            }),
            MessageType::ContinuationAccept => Self::ContinuationAccept(ContinuationAccept {
                chain: f.chain()?,
                continuation_id: f.str("continuation_id")?,
                claim_ref: f.str("claim_ref")?,
                next_action_digest: f.str("next_action_digest")?,
            }),
            MessageType::ContinuationResult => Self::ContinuationResult(ContinuationResult {
                chain: f.chain()?,
                continuation_id: f.str("continuation_id")?,
                result_evidence_digest: f.str("result_evidence_digest")?,
            }),
            _ => return Ok(None),
        };
        Ok(Some(msg))
    }
}

/// Field access for one envelope, each miss a typed error naming the field.
struct Fields<'e> {
    env: &'e Envelope<Verified>,
    t: &'static str,
}

impl Fields<'_> {
    fn miss(&self, field: &'static str, expected: &'static str) -> WireError {
        WireError::Field {
            message_type: self.t,
            field,
            expected,
        }
    }

    fn str(&self, field: &'static str) -> Result<String, WireError> {
        match self.env.get(field) {
            Some(Value::Str(s)) => Ok(s.clone()),
            _ => Err(self.miss(field, "a string")),
        }
    }

    fn opt_str(&self, field: &'static str) -> Option<String> {
        match self.env.get(field) {
            Some(Value::Str(s)) => Some(s.clone()),
            _ => None,
        }
    }

    fn uint(&self, field: &'static str) -> Result<u64, WireError> {
        match self.env.get(field) {
            Some(Value::Int(i)) if *i >= 0 => Ok(*i as u64),
            _ => Err(self.miss(field, "a non-negative integer")),
        }
    }

    fn json(&self, field: &'static str) -> Result<serde_json::Value, WireError> {
        match self.env.get(field) {
            Some(v @ Value::Object(_)) => Ok(canonical::to_json(v)),
            _ => Err(self.miss(field, "an object")),
        }
    }

    fn chain(&self) -> Result<ChainRef, WireError> {
        Ok(ChainRef {
            reservation_id: self.str("reservation_id")?,
            lane_id: self.str("lane_id")?,
            lane_incarnation_id: self.str("lane_incarnation_id")?,
            assignment_id: self.str("assignment_id")?,
            assignment_attempt_id: self.str("assignment_attempt_id")?,
            generation: self.uint("generation")?,
            sot_incarnation: self.str("sot_incarnation")?,
            coordinator_epoch: self.uint("coordinator_epoch")?,
            fence_proof: self.str("fence_proof")?,
        })
    }
}
