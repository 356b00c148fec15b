//! Host → coordinator: the chain messages a host sends about one of its generations.

use super::{ChainRef, Fields, WireError};
use crate::protocol::envelope::{Envelope, Verified};
use crate::protocol::report::{self, HostReport};
use crate::protocol::schema::MessageType;

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
        let f = Fields::of(env);
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

/// `hello` (the one that opened the session) or `report` (the host's state changed).
#[derive(Debug, Clone, PartialEq)]
pub struct HostState {
    /// Whether this is the session's hello (the coordinator then resends whatever every
    /// chain of the host waits for).
    pub hello: bool,
    pub session_id: String,
    pub host_id: String,
    /// `lane@incarnation` of every live lane (shapes are checked by the handler).
    pub lanes: Vec<String>,
    /// The `family@version` entries of the host's registry.
    pub runtimes: Vec<String>,
    /// Per lane, the host's status and live generations; empty when not sent.
    pub lane_states: HostReport,
}

/// `receipt`: a termination receipt, and the lane and generation its envelope names.
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    pub session_id: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub receipt_idempotency_key: String,
    /// The receipt body as the host recorded it.
    pub receipt: serde_json::Value,
}

/// Every session message a host sends the coordinator.
#[derive(Debug, Clone, PartialEq)]
pub enum FromHostSession {
    State(HostState),
    Receipt(Receipt),
    Heartbeat,
}

impl FromHostSession {
    /// Converts a verified envelope; `Ok(None)` for a type that is not a host session
    /// message.
    pub fn decode(env: &Envelope<Verified>) -> Result<Option<Self>, WireError> {
        let f = Fields::of(env);
        let msg = match env.message_type() {
            t @ (MessageType::Hello | MessageType::Report) => Self::State(HostState {
                hello: t == MessageType::Hello,
                session_id: f.str("session_id")?,
                host_id: f.str("host_id")?,
                lanes: f.str_list("lanes"),
                runtimes: f.str_list("runtimes"),
                lane_states: match env.get("lane_states") {
                    Some(v) => report::from_value("lane_states", v)
                        .map_err(|e| f.unknown("lane_states", &e.to_string()))?,
                    None => HostReport::new(),
                },
            }),
            MessageType::Receipt => Self::Receipt(Receipt {
                session_id: f.str("session_id")?,
                lane_id: f.str("lane_id")?,
                lane_incarnation_id: f.str("lane_incarnation_id")?,
                generation: f.uint("generation")?,
                receipt_idempotency_key: f.str("receipt_idempotency_key")?,
                receipt: f.json("receipt")?,
            }),
            MessageType::Heartbeat => Self::Heartbeat,
            _ => return Ok(None),
        };
        Ok(Some(msg))
    }
}
