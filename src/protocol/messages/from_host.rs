//! Host → coordinator: the chain messages a host sends about one of its generations, and
//! its session messages. The host builds each chain message from its struct
//! ([`FromHostChain::fields`], which also derives its idempotency key) and the coordinator
//! reads it back with [`FromHostChain::decode`]: one field set, written once.

use super::{ChainRef, Digests, Fields, HandoffBound, WireError};
use crate::protocol::canonical::{self, Value};
use crate::protocol::envelope::{n, s, Envelope, Verified};
use crate::protocol::repo::CheckpointRef;
use crate::protocol::report::{self, HostReport};
use crate::protocol::schema::MessageType;

/// What every host message after the contract repeats from the stage and the contract
/// (spec §7.2's ordinary fields beyond the chain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractBound {
    pub reservation_epoch: u64,
    pub reservation_deadline: String,
    pub runtime_id: String,
    pub digests: Digests,
}

/// `staged`: the host started a fresh, verified process tree for this generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged {
    pub chain: ChainRef,
    pub process_identity: serde_json::Value,
    /// The checkpoint its workspace was restored from, or found already equal to (work in
    /// a repository whose stage named one); the activation binds it.
    pub restored_checkpoint_digest: Option<String>,
}

/// `injected`: the host delivered exactly this contract digest to that process.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub delivered_contracts_digest: String,
    pub process_identity: serde_json::Value,
}

/// `ack`: the harness answered the activation challenge; every bound field (spec §8).
#[derive(Debug, Clone, PartialEq)]
pub struct Ack {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub challenge_id: String,
    pub process_identity: serde_json::Value,
    /// The digest of the verified ACK envelope itself (empty on a message being built).
    pub ack_digest: String,
}

/// `progress`: objective evidence of progress from the RUNNING generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub evidence_kind: String,
    pub evidence_digest: String,
    pub next_action: Option<String>,
    /// The envelope's message id (empty on a message being built: the link assigns it).
    pub message_id: String,
}

/// `blocked`: the RUNNING generation cannot go on without someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub blocker_code: String,
    pub blocker_evidence_digest: String,
    pub next_action: String,
    /// When the block ends by itself (a provider's rate limit resets): this long after the
    /// coordinator decides it, at its database's time. A duration, never a host timestamp.
    pub resume_after_ms: Option<u64>,
}

/// `handoff_ack`: a handoff target's harness acknowledged the handoff (spec §8.1), echoing
/// every bound field of its challenge.
#[derive(Debug, Clone, PartialEq)]
pub struct HandoffAck {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub handoff: HandoffBound,
    pub process_identity: serde_json::Value,
    /// The digest of the verified handoff-ACK envelope itself (empty on a message being
    /// built).
    pub ack_digest: String,
}

/// `continuation_accept`: the host accepts an offered continuation for its settled harness.
#[derive(Debug, Clone, PartialEq)]
pub struct ContinuationAccept {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub continuation_id: String,
    pub claim_ref: String,
    pub next_action_digest: String,
    pub process_identity: serde_json::Value,
}

/// `continuation_result`: what the harness produced for a continuation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuationResult {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub continuation_id: String,
    pub result_evidence_digest: String,
}

/// `effect`: the broker asks to admit one protected effect of a RUNNING generation (spec
/// §5.5). Its idempotency key is the claim's own.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub idempotency_key: String,
    pub effect_id: String,
    pub executor: String,
    pub target: String,
    pub operation_digest: String,
    pub responsibility_owner: String,
    pub execution_owner: String,
    pub process_identity: serde_json::Value,
}

/// `effect_result`: what the broker observed of an admitted effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectResult {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub effect_id: String,
    pub outcome: String,
    pub result_digest: String,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// `checkpoint_taken`: a checkpoint of a live generation's workspace (the coordinator
/// derives its digest from its ids) — the source host's answer to a `handoff_checkpoint`
/// (or why there is none), or one its harness asked for (`mosaic lane checkpoint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointTaken {
    pub chain: ChainRef,
    pub bound: ContractBound,
    pub origin: TakenFor,
    pub taken: Result<crate::protocol::repo::CheckpointRef, String>,
}

/// Why a live generation's checkpoint was taken: exactly one of the two (on the wire,
/// `handoff_id` or `request_seq`, never both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakenFor {
    /// The handoff whose offer holds the workspace.
    Handoff(String),
    /// The generation's harness asked: its `n`th request (from 1).
    Request(u32),
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
    Effect(Effect),
    EffectResult(EffectResult),
    CheckpointTaken(CheckpointTaken),
}

impl FromHostChain {
    pub fn message_type(&self) -> MessageType {
        match self {
            Self::Staged(_) => MessageType::Staged,
            Self::Injected(_) => MessageType::Injected,
            Self::Ack(_) => MessageType::Ack,
            Self::Progress(_) => MessageType::Progress,
            Self::Blocked(_) => MessageType::Blocked,
            Self::HandoffAck(_) => MessageType::HandoffAck,
            Self::ContinuationAccept(_) => MessageType::ContinuationAccept,
            Self::ContinuationResult(_) => MessageType::ContinuationResult,
            Self::Effect(_) => MessageType::Effect,
            Self::EffectResult(_) => MessageType::EffectResult,
            Self::CheckpointTaken(_) => MessageType::CheckpointTaken,
        }
    }

    pub fn chain(&self) -> &ChainRef {
        match self {
            Self::Staged(m) => &m.chain,
            Self::Injected(m) => &m.chain,
            Self::Ack(m) => &m.chain,
            Self::Progress(m) => &m.chain,
            Self::Blocked(m) => &m.chain,
            Self::HandoffAck(m) => &m.chain,
            Self::ContinuationAccept(m) => &m.chain,
            Self::ContinuationResult(m) => &m.chain,
            Self::Effect(m) => &m.chain,
            Self::EffectResult(m) => &m.chain,
            Self::CheckpointTaken(m) => &m.chain,
        }
    }

    /// The key a retry of this message carries: derived from what it reports, so the
    /// coordinator's step for it is the same step however often it is sent.
    pub fn idempotency_key(&self) -> String {
        let res = &self.chain().reservation_id;
        match self {
            Self::Staged(_) => format!("staged/{res}"),
            Self::Injected(_) => format!("injected/{res}"),
            Self::Ack(m) => format!("ack/{}", m.challenge_id),
            Self::Progress(m) => format!("progress/{res}/{}", m.evidence_digest),
            Self::Blocked(m) => format!("blocked/{res}/{}", m.blocker_evidence_digest),
            Self::HandoffAck(m) => format!("handoff-ack/{}", m.handoff.handoff_challenge_id),
            Self::ContinuationAccept(m) => {
                format!("continuation-accept/{}/{}", m.continuation_id, m.claim_ref)
            }
            Self::ContinuationResult(m) => format!("continuation-result/{}", m.continuation_id),
            Self::Effect(m) => m.idempotency_key.clone(),
            Self::EffectResult(m) => format!("effect-result/{}", m.effect_id),
            Self::CheckpointTaken(m) => match &m.origin {
                TakenFor::Handoff(h) => format!("checkpoint-taken/{h}"),
                TakenFor::Request(n) => format!(
                    "checkpoint-requested/{}/{}/{n}",
                    m.chain.lane_incarnation_id, m.chain.generation
                ),
            },
        }
    }

    /// The message's fields, for signing (the envelope's common fields are the signer's; a
    /// process identity that is not canonical JSON is an error).
    pub fn fields(&self) -> Result<Vec<(&'static str, Value)>, WireError> {
        let mut f = vec![("idempotency_key", s(&self.idempotency_key()))];
        chain(&mut f, self.chain());
        match self {
            Self::Staged(m) => {
                f.push(("process_identity", identity(&m.process_identity)?));
                if let Some(d) = &m.restored_checkpoint_digest {
                    f.push(("restored_checkpoint_digest", s(d)));
                }
            }
            Self::Injected(m) => {
                bound(&mut f, &m.bound);
                f.push((
                    "delivered_contracts_digest",
                    s(&m.delivered_contracts_digest),
                ));
                f.push(("process_identity", identity(&m.process_identity)?));
            }
            Self::Ack(m) => {
                bound(&mut f, &m.bound);
                f.push(("challenge_id", s(&m.challenge_id)));
                f.push(("process_identity", identity(&m.process_identity)?));
            }
            Self::Progress(m) => {
                bound(&mut f, &m.bound);
                f.push(("evidence_kind", s(&m.evidence_kind)));
                f.push(("evidence_digest", s(&m.evidence_digest)));
                if let Some(next) = &m.next_action {
                    f.push(("next_action", s(next)));
                }
            }
            Self::Blocked(m) => {
                bound(&mut f, &m.bound);
                f.extend([
                    ("blocker_code", s(&m.blocker_code)),
                    ("blocker_evidence_digest", s(&m.blocker_evidence_digest)),
                    ("next_action", s(&m.next_action)),
                ]);
                if let Some(ms) = m.resume_after_ms {
                    f.push(("resume_after_ms", n(ms)));
                }
            }
            Self::HandoffAck(m) => {
                bound(&mut f, &m.bound);
                f.extend(m.handoff.fields());
                f.push(("process_identity", identity(&m.process_identity)?));
            }
            Self::ContinuationAccept(m) => {
                bound(&mut f, &m.bound);
                f.extend([
                    ("continuation_id", s(&m.continuation_id)),
                    ("claim_ref", s(&m.claim_ref)),
                    ("next_action_digest", s(&m.next_action_digest)),
                ]);
                f.push(("process_identity", identity(&m.process_identity)?));
            }
            Self::ContinuationResult(m) => {
                bound(&mut f, &m.bound);
                f.extend([
                    ("continuation_id", s(&m.continuation_id)),
                    ("result_evidence_digest", s(&m.result_evidence_digest)),
                ]);
            }
            Self::Effect(m) => {
                bound(&mut f, &m.bound);
                f.extend([
                    ("effect_id", s(&m.effect_id)),
                    ("executor", s(&m.executor)),
                    ("target", s(&m.target)),
                    ("operation_digest", s(&m.operation_digest)),
                    ("responsibility_owner", s(&m.responsibility_owner)),
                    ("execution_owner", s(&m.execution_owner)),
                ]);
                f.push(("process_identity", identity(&m.process_identity)?));
            }
            Self::EffectResult(m) => {
                bound(&mut f, &m.bound);
                f.extend([
                    ("effect_id", s(&m.effect_id)),
                    ("outcome", s(&m.outcome)),
                    ("result_digest", s(&m.result_digest)),
                ]);
                if let Some(t) = m.input_tokens {
                    f.push(("input_tokens", n(t)));
                }
                if let Some(t) = m.output_tokens {
                    f.push(("output_tokens", n(t)));
                }
            }
            Self::CheckpointTaken(m) => {
                bound(&mut f, &m.bound);
                match &m.origin {
                    TakenFor::Handoff(h) => f.push(("handoff_id", s(h))),
                    TakenFor::Request(k) => f.push(("request_seq", n(u64::from(*k)))),
                }
                match &m.taken {
                    Ok(c) => f.extend([
                        ("repository", s(c.repository.as_str())),
                        ("commit_id", s(&c.commit_id)),
                        ("tree_id", s(&c.tree_id)),
                    ]),
                    Err(e) => f.push(("error", s(e))),
                }
                if let Ok(CheckpointRef {
                    inputs_digest: Some(d),
                    ..
                }) = &m.taken
                {
                    f.push(("inputs_digest", s(d)));
                }
            }
        }
        Ok(f)
    }

    /// Converts a verified envelope; `Ok(None)` for a type that is not a host chain
    /// message.
    pub fn decode(env: &Envelope<Verified>) -> Result<Option<Self>, WireError> {
        let f = Fields::of(env);
        let msg = match env.message_type() {
            MessageType::Staged => Self::Staged(Staged {
                chain: f.chain()?,
                process_identity: f.json("process_identity")?,
                restored_checkpoint_digest: f.opt_str("restored_checkpoint_digest"),
            }),
            MessageType::Injected => Self::Injected(Injected {
                chain: f.chain()?,
                bound: f.bound()?,
                delivered_contracts_digest: f.str("delivered_contracts_digest")?,
                process_identity: f.json("process_identity")?,
            }),
            MessageType::Ack => Self::Ack(Ack {
                chain: f.chain()?,
                bound: f.bound()?,
                challenge_id: f.str("challenge_id")?,
                process_identity: f.json("process_identity")?,
                ack_digest: env.digest(),
            }),
            MessageType::Progress => Self::Progress(Progress {
                chain: f.chain()?,
                bound: f.bound()?,
                evidence_kind: f.str("evidence_kind")?,
                evidence_digest: f.str("evidence_digest")?,
                next_action: f.opt_str("next_action"),
                message_id: f.str("message_id")?,
            }),
            MessageType::Blocked => Self::Blocked(Blocked {
                chain: f.chain()?,
                bound: f.bound()?,
                blocker_code: f.str("blocker_code")?,
                blocker_evidence_digest: f.str("blocker_evidence_digest")?,
                next_action: f.str("next_action")?,
                resume_after_ms: f.opt_uint("resume_after_ms"),
            }),
            MessageType::HandoffAck => Self::HandoffAck(HandoffAck {
                chain: f.chain()?,
                bound: f.bound()?,
                handoff: f.handoff_bound()?,
                process_identity: f.json("process_identity")?,
                ack_digest: env.digest(),
            }),
            MessageType::ContinuationAccept => Self::ContinuationAccept(ContinuationAccept {
                chain: f.chain()?,
                bound: f.bound()?,
                continuation_id: f.str("continuation_id")?,
                claim_ref: f.str("claim_ref")?,
                next_action_digest: f.str("next_action_digest")?,
                process_identity: f.json("process_identity")?,
            }),
            MessageType::ContinuationResult => Self::ContinuationResult(ContinuationResult {
                chain: f.chain()?,
                bound: f.bound()?,
                continuation_id: f.str("continuation_id")?,
                result_evidence_digest: f.str("result_evidence_digest")?,
            }),
            MessageType::Effect => Self::Effect(Effect {
                chain: f.chain()?,
                bound: f.bound()?,
                idempotency_key: f.str("idempotency_key")?,
                effect_id: f.str("effect_id")?,
                executor: f.str("executor")?,
                target: f.str("target")?,
                operation_digest: f.str("operation_digest")?,
                responsibility_owner: f.str("responsibility_owner")?,
                execution_owner: f.str("execution_owner")?,
                process_identity: f.json("process_identity")?,
            }),
            MessageType::EffectResult => Self::EffectResult(EffectResult {
                chain: f.chain()?,
                bound: f.bound()?,
                effect_id: f.str("effect_id")?,
                outcome: f.str("outcome")?,
                result_digest: f.str("result_digest")?,
                input_tokens: f.opt_uint("input_tokens"),
                output_tokens: f.opt_uint("output_tokens"),
            }),
            MessageType::CheckpointTaken => Self::CheckpointTaken(CheckpointTaken {
                chain: f.chain()?,
                bound: f.bound()?,
                origin: match (f.opt_str("handoff_id"), f.opt_uint("request_seq")) {
                    (Some(h), None) => TakenFor::Handoff(h),
                    (None, Some(k)) => TakenFor::Request(
                        u32::try_from(k)
                            .ok()
                            .filter(|n| (1..=1000).contains(n))
                            .ok_or_else(|| f.unknown("request_seq", "not a request number"))?,
                    ),
                    _ => {
                        return Err(f.miss(
                            "handoff_id",
                            "either a handoff or a request number, not both",
                        ))
                    }
                },
                taken: match (f.opt_str("error"), f.opt_str("repository")) {
                    (Some(e), None) => Err(e),
                    (None, Some(r)) => Ok(crate::protocol::repo::CheckpointRef {
                        repository: crate::protocol::repo::RepoName::parse(&r)
                            .map_err(|e| f.unknown("repository", &e.to_string()))?,
                        commit_id: f.str("commit_id")?,
                        tree_id: f.str("tree_id")?,
                        inputs_digest: f.opt_str("inputs_digest"),
                    }),
                    _ => return Err(f.miss("error", "either a checkpoint or an error")),
                },
            }),
            _ => return Ok(None),
        };
        Ok(Some(msg))
    }
}

fn identity(v: &serde_json::Value) -> Result<Value, WireError> {
    canonical::from_json(v).map_err(|e| WireError::Unknown {
        message_type: "host message",
        field: "process_identity",
        value: e.to_string(),
    })
}

fn chain(f: &mut Vec<(&'static str, Value)>, c: &ChainRef) {
    f.extend([
        ("sot_incarnation", s(&c.sot_incarnation)),
        ("coordinator_epoch", n(c.coordinator_epoch)),
        ("assignment_id", s(&c.assignment_id)),
        ("lane_id", s(&c.lane_id)),
        ("lane_incarnation_id", s(&c.lane_incarnation_id)),
        ("assignment_attempt_id", s(&c.assignment_attempt_id)),
        ("reservation_id", s(&c.reservation_id)),
        ("generation", n(c.generation)),
        ("fence_proof", s(&c.fence_proof)),
    ]);
}

fn bound(f: &mut Vec<(&'static str, Value)>, b: &ContractBound) {
    f.extend([
        ("reservation_epoch", n(b.reservation_epoch)),
        ("reservation_deadline", s(&b.reservation_deadline)),
        ("runtime_id", s(&b.runtime_id)),
        ("contracts_digest", s(&b.digests.contracts_digest)),
        ("scope_digest", s(&b.digests.scope_digest)),
        ("holds_digest", s(&b.digests.holds_digest)),
    ]);
}

impl Fields<'_> {
    fn bound(&self) -> Result<ContractBound, WireError> {
        Ok(ContractBound {
            reservation_epoch: self.uint("reservation_epoch")?,
            reservation_deadline: self.str("reservation_deadline")?,
            runtime_id: self.str("runtime_id")?,
            digests: Digests {
                contracts_digest: self.str("contracts_digest")?,
                scope_digest: self.str("scope_digest")?,
                holds_digest: self.str("holds_digest")?,
            },
        })
    }

    /// The bound fields of a handoff challenge, read the same way from the challenge and
    /// from the ACK that echoes them.
    pub(super) fn handoff_bound(&self) -> Result<HandoffBound, WireError> {
        Ok(HandoffBound {
            handoff_challenge_id: self.str("handoff_challenge_id")?,
            source_assignment_attempt_id: self.str("source_assignment_attempt_id")?,
            responsibility_owner: self.str("responsibility_owner")?,
            execution_owner: self.str("execution_owner")?,
            pending_target: self.str("pending_target")?,
            next_action_digest: self.str("next_action_digest")?,
            challenge_deadline: self.str("challenge_deadline")?,
            checkpoint_digest: self.opt_str("checkpoint_digest"),
        })
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
    CheckpointUpload(super::CheckpointUpload),
    CheckpointFetch(super::CheckpointFetch),
    WorkspaceRelease(super::WorkspaceRelease),
    WorkspaceEffect(super::WorkspaceEffect),
    RecoveryAck(Box<super::RecoveryAck>),
}

impl FromHostSession {
    /// The host a `hello` or `report` names, read on its own: a session is admitted on the
    /// host it names, while the rest of its state (which may come from a newer host, with
    /// fields this build does not know) is judged when it is handled, so a report this
    /// build cannot read refuses that report, not the session its receipts travel on.
    pub fn host_named(env: &Envelope<Verified>) -> Result<String, WireError> {
        Fields::of(env).str("host_id")
    }

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
            MessageType::CheckpointUpload => {
                Self::CheckpointUpload(super::CheckpointUpload::decode(&f)?)
            }
            MessageType::CheckpointFetch => {
                Self::CheckpointFetch(super::CheckpointFetch::decode(&f)?)
            }
            MessageType::WorkspaceRelease => {
                Self::WorkspaceRelease(super::WorkspaceRelease::decode(&f)?)
            }
            MessageType::WorkspaceEffect => {
                Self::WorkspaceEffect(super::WorkspaceEffect::decode(&f)?)
            }
            MessageType::RecoveryAck => {
                Self::RecoveryAck(Box::new(super::RecoveryAck::decode(&f)?))
            }
            _ => return Ok(None),
        };
        Ok(Some(msg))
    }
}
