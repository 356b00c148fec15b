//! Coordinator → host: every message the coordinator sends a host, as one struct each. The
//! coordinator builds them ([`ToHost::fields`] is the only place their field sets are
//! written) and the supervisor converts what it receives ([`ToHost::decode`] is the only
//! place they are read), so the two cannot disagree about a field.

use super::{Fields, WireError};
use crate::protocol::canonical::Value;
use crate::protocol::envelope::{n, s, Envelope, Verified};
use crate::protocol::report::{self, Reconcile as LaneOrders};
use crate::protocol::schema::MessageType;

/// The authority an ordinary coordinator message carries: the chain it was staged for,
/// under which leader (spec §7.2). A host checks it against the stage it acted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainAuthority {
    pub sot_incarnation: String,
    pub coordinator_epoch: u64,
    pub assignment_id: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub assignment_attempt_id: String,
    pub reservation_id: String,
    pub reservation_epoch: u64,
    pub reservation_deadline: String,
    pub runtime_id: String,
    pub generation: u64,
    /// A commitment on the stage, the reveal that opens it on every later message.
    pub fence_proof: String,
}

/// The contract digests every message after the stage binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    pub contracts_digest: String,
    pub scope_digest: String,
    pub holds_digest: String,
}

/// The idempotency key and the primary-database times a coordinator message is valid
/// between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub idempotency_key: String,
    pub issued_at: String,
    pub expires_at: String,
}

/// `stage`: start a fresh generation for this chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub authority: ChainAuthority,
    pub issued: Issued,
    /// The repository the work's workspace is cloned from (kept for its next
    /// generations); `None`: a private scratch directory.
    pub repository: Option<crate::protocol::repo::RepoBinding>,
    /// The checkpoint the workspace is restored from, when the assignment has one.
    pub restore: Option<crate::protocol::repo::RestorePoint>,
    /// Whom the harness's artifact (its session, as its adapter exports it) is encrypted
    /// to at the generation's end; empty: none is captured (never kept in the clear).
    pub artifact_recipients: Vec<crate::protocol::artifact::Recipient>,
}

/// `contract`: the task and the digests the harness must take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contract {
    pub authority: ChainAuthority,
    pub digests: Digests,
    pub task_text: String,
    pub issued: Issued,
}

/// `challenge`: the activation challenge the harness answers with its ACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub authority: ChainAuthority,
    pub digests: Digests,
    pub challenge_id: String,
    pub issued: Issued,
}

/// The fields of a handoff challenge its ACK echoes, each bound (spec §8.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffBound {
    pub handoff_challenge_id: String,
    pub source_assignment_attempt_id: String,
    pub responsibility_owner: String,
    pub execution_owner: String,
    pub pending_target: String,
    pub next_action_digest: String,
    pub challenge_deadline: String,
    /// Work in a repository: the checkpoint the offer took of the source's held workspace
    /// (the target's is restored from exactly it).
    pub checkpoint_digest: Option<String>,
}

impl HandoffBound {
    /// The bound fields, in the order both the challenge and the ACK write them.
    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut f = vec![
            ("handoff_challenge_id", s(&self.handoff_challenge_id)),
            (
                "source_assignment_attempt_id",
                s(&self.source_assignment_attempt_id),
            ),
            ("responsibility_owner", s(&self.responsibility_owner)),
            ("execution_owner", s(&self.execution_owner)),
            ("pending_target", s(&self.pending_target)),
            ("next_action_digest", s(&self.next_action_digest)),
            ("challenge_deadline", s(&self.challenge_deadline)),
        ];
        if let Some(d) = &self.checkpoint_digest {
            f.push(("checkpoint_digest", s(d)));
        }
        f
    }
}

/// `handoff_challenge`: a handoff target's generation is asked to take the work over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffChallenge {
    pub authority: ChainAuthority,
    pub digests: Digests,
    pub bound: HandoffBound,
    pub next_action: String,
    pub issued: Issued,
}

/// `handoff_checkpoint`: hold the source generation's workspace read-only and checkpoint
/// it for the handoff `handoff_id` (work in a repository; spec §8.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffCheckpoint {
    pub authority: ChainAuthority,
    pub digests: Digests,
    pub handoff_id: String,
    pub issued: Issued,
}

/// Where a continuation is in its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContinuationPhase {
    /// Accept it once the harness is settled.
    Offer,
    /// The acceptance is committed: make it visible, once.
    Accepted,
}

impl ContinuationPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Offer => "offer",
            Self::Accepted => "accepted",
        }
    }
}

/// `continuation`: the next turn for the live generation, for one claim (spec §14 rule 11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    pub authority: ChainAuthority,
    pub digests: Digests,
    pub continuation_id: String,
    pub claim_ref: String,
    pub next_action: String,
    pub next_action_digest: String,
    pub loop_budget: u64,
    pub phase: ContinuationPhase,
    pub result_to: String,
    pub issued: Issued,
}

/// `control` with `control_op: activate`: the generation is RUNNING.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activate {
    pub authority: ChainAuthority,
    pub digests: Digests,
    pub issued: Issued,
}

/// `reconcile`: per lane, what the host must end. It only ever takes authority away.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconcile {
    pub idempotency_key: String,
    /// Absent only from a malformed sender: a host refuses such a reconcile.
    pub sot_incarnation: Option<String>,
    pub coordinator_epoch: Option<u64>,
    pub session_id: String,
    pub lanes: LaneOrders,
}

/// The coordinator's verdict on a termination receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Durable in PostgreSQL: the host may forget it.
    Ingested,
    /// Not ingestible yet (no leader, a database fault): send it again later.
    Retry(String),
    /// Never ingestible: kept aside on the host for an operator.
    Refused(String),
}

impl Verdict {
    pub fn encode(&self) -> String {
        match self {
            Self::Ingested => "ingested".into(),
            Self::Retry(c) => format!("retry:{c}"),
            Self::Refused(c) => format!("refused:{c}"),
        }
    }

    /// `None` for text this build does not know: such a verdict acknowledges nothing.
    pub fn parse(v: &str) -> Option<Self> {
        if v == "ingested" {
            return Some(Self::Ingested);
        }
        let (kind, category) = v.split_once(':')?;
        if category.is_empty() {
            return None;
        }
        match kind {
            "retry" => Some(Self::Retry(category.into())),
            "refused" => Some(Self::Refused(category.into())),
            _ => None,
        }
    }
}

/// `receipt_ack`: what became of one termination receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptAck {
    pub idempotency_key: String,
    pub coordinator_epoch: Option<u64>,
    pub session_id: String,
    pub receipt_idempotency_key: String,
    pub verdict: Verdict,
}

/// The coordinator's answer about one effect claim or result (spec §5.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectAnswer {
    /// The claim is admitted: the broker may dispatch it now, once.
    Admitted { lease_id: String, lease_epoch: u64 },
    /// The key already names this operation's claim, admitted before; this is what became
    /// of it (`ADMITTED` still, or settled). The broker does not dispatch it again.
    Settled {
        claim_state: String,
        result_digest: Option<String>,
    },
    /// The claim is refused (its category says why); nothing was admitted.
    Refused { category: String },
    /// The result is recorded.
    Recorded,
    /// The result was not recorded, for good (its category says why): the broker stops
    /// reporting it.
    NotRecorded { category: String },
}

impl EffectAnswer {
    fn verdict(&self) -> &'static str {
        match self {
            Self::Admitted { .. } => "admitted",
            Self::Settled { .. } => "settled",
            Self::Refused { .. } => "refused",
            Self::Recorded => "recorded",
            Self::NotRecorded { .. } => "not-recorded",
        }
    }
}

/// `effect_verdict`: the answer about one claim or result of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectVerdict {
    pub authority: ChainAuthority,
    pub digests: Digests,
    pub effect_id: String,
    pub answer: EffectAnswer,
    pub issued: Issued,
}

/// Every message the coordinator sends a host.
#[derive(Debug, Clone, PartialEq)]
pub enum ToHost {
    Stage(Stage),
    Contract(Contract),
    Challenge(Challenge),
    HandoffChallenge(HandoffChallenge),
    Continuation(Continuation),
    Activate(Activate),
    Reconcile(Reconcile),
    ReceiptAck(ReceiptAck),
    EffectVerdict(EffectVerdict),
    CheckpointStored(super::CheckpointStored),
    CheckpointData(super::CheckpointData),
    HandoffCheckpoint(HandoffCheckpoint),
    WorkspaceReleaseAnswer(super::WorkspaceReleaseAnswer),
    WorkspaceOrder(super::WorkspaceOrder),
    WorkspaceEffectAnswer(super::WorkspaceEffectAnswer),
    RecoveryChallenge(super::RecoveryChallenge),
}

impl ToHost {
    pub fn message_type(&self) -> MessageType {
        match self {
            Self::Stage(_) => MessageType::Stage,
            Self::Contract(_) => MessageType::Contract,
            Self::Challenge(_) => MessageType::Challenge,
            Self::HandoffChallenge(_) => MessageType::HandoffChallenge,
            Self::Continuation(_) => MessageType::Continuation,
            Self::Activate(_) => MessageType::Control,
            Self::Reconcile(_) => MessageType::Reconcile,
            Self::ReceiptAck(_) => MessageType::ReceiptAck,
            Self::EffectVerdict(_) => MessageType::EffectVerdict,
            Self::CheckpointStored(_) => MessageType::CheckpointStored,
            Self::CheckpointData(_) => MessageType::CheckpointData,
            Self::HandoffCheckpoint(_) => MessageType::HandoffCheckpoint,
            Self::WorkspaceReleaseAnswer(_) => MessageType::WorkspaceReleaseAnswer,
            Self::WorkspaceOrder(_) => MessageType::WorkspaceOrder,
            Self::WorkspaceEffectAnswer(_) => MessageType::WorkspaceEffectAnswer,
            Self::RecoveryChallenge(_) => MessageType::RecoveryChallenge,
        }
    }

    /// The chain authority of an ordinary message; `None` for a session message.
    pub fn authority(&self) -> Option<&ChainAuthority> {
        match self {
            Self::Stage(m) => Some(&m.authority),
            Self::Contract(m) => Some(&m.authority),
            Self::Challenge(m) => Some(&m.authority),
            Self::HandoffChallenge(m) => Some(&m.authority),
            Self::Continuation(m) => Some(&m.authority),
            Self::Activate(m) => Some(&m.authority),
            Self::EffectVerdict(m) => Some(&m.authority),
            Self::HandoffCheckpoint(m) => Some(&m.authority),
            Self::Reconcile(_)
            | Self::ReceiptAck(_)
            | Self::CheckpointStored(_)
            | Self::CheckpointData(_)
            | Self::WorkspaceReleaseAnswer(_)
            | Self::WorkspaceOrder(_)
            | Self::WorkspaceEffectAnswer(_)
            | Self::RecoveryChallenge(_) => None,
        }
    }

    /// The message's fields, for signing (the envelope's common fields are the signer's).
    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut f = vec![];
        match self {
            Self::Stage(m) => {
                authority(&mut f, &m.authority);
                issued(&mut f, &m.issued);
                if let Some(r) = &m.repository {
                    f.extend([
                        ("repository", s(r.name.as_str())),
                        ("repository_kind", s(r.source.kind())),
                        ("repository_source", s(r.source.as_str())),
                        ("base_ref", s(r.base.as_str())),
                    ]);
                    if !r.setup.is_empty() {
                        let list = |v: Vec<&str>| Value::Array(v.into_iter().map(s).collect());
                        if !r.setup.copy().is_empty() {
                            f.push((
                                "setup_copy",
                                list(r.setup.copy().iter().map(|c| c.as_str()).collect()),
                            ));
                        }
                        if !r.setup.commands().is_empty() {
                            f.push((
                                "setup_commands",
                                list(r.setup.commands().iter().map(|c| c.as_str()).collect()),
                            ));
                        }
                        f.push(("setup_timeout_s", n(u64::from(r.setup.timeout_s()))));
                    }
                }
                if let Some(r) = &m.restore {
                    super::checkpoint::restore_fields(&mut f, r);
                }
                if !m.artifact_recipients.is_empty() {
                    let list = m.artifact_recipients.iter().map(|r| s(&r.to_string()));
                    f.push(("artifact_recipients", Value::Array(list.collect())));
                }
            }
            Self::Contract(m) => {
                authority(&mut f, &m.authority);
                digests(&mut f, &m.digests);
                f.push(("task_text", s(&m.task_text)));
                issued(&mut f, &m.issued);
            }
            Self::Challenge(m) => {
                authority(&mut f, &m.authority);
                digests(&mut f, &m.digests);
                f.push(("challenge_id", s(&m.challenge_id)));
                issued(&mut f, &m.issued);
            }
            Self::HandoffChallenge(m) => {
                authority(&mut f, &m.authority);
                digests(&mut f, &m.digests);
                f.extend(m.bound.fields());
                f.push(("next_action", s(&m.next_action)));
                issued(&mut f, &m.issued);
            }
            Self::Continuation(m) => {
                authority(&mut f, &m.authority);
                digests(&mut f, &m.digests);
                f.extend([
                    ("continuation_id", s(&m.continuation_id)),
                    ("claim_ref", s(&m.claim_ref)),
                    ("next_action", s(&m.next_action)),
                    ("next_action_digest", s(&m.next_action_digest)),
                    ("loop_budget", n(m.loop_budget)),
                    ("phase", s(m.phase.as_str())),
                    ("result_to", s(&m.result_to)),
                ]);
                issued(&mut f, &m.issued);
            }
            Self::Activate(m) => {
                authority(&mut f, &m.authority);
                digests(&mut f, &m.digests);
                f.push(("control_op", s("activate")));
                issued(&mut f, &m.issued);
            }
            Self::Reconcile(m) => {
                let lanes = m
                    .lanes
                    .iter()
                    .map(|(lane, o)| {
                        let gens = |g: &[u64]| Value::Array(g.iter().map(|g| n(*g)).collect());
                        let order = Value::Object(vec![
                            ("create".into(), Value::Bool(o.create)),
                            ("destroy".into(), Value::Bool(o.destroy)),
                            ("end".into(), gens(&o.end)),
                            ("hold".into(), gens(&o.hold)),
                            ("lane_incarnation_id".into(), s(&o.lane_incarnation_id)),
                            ("recreate".into(), Value::Bool(o.recreate)),
                            ("release".into(), gens(&o.release)),
                        ]);
                        (lane.clone(), order)
                    })
                    .collect();
                f.extend([
                    ("idempotency_key", s(&m.idempotency_key)),
                    ("sot_incarnation", opt_s(m.sot_incarnation.as_deref())),
                    ("coordinator_epoch", opt_n(m.coordinator_epoch)),
                    ("assignment_id", Value::Null),
                    ("session_id", s(&m.session_id)),
                    ("lanes", Value::Object(lanes)),
                ]);
            }
            Self::EffectVerdict(m) => {
                authority(&mut f, &m.authority);
                digests(&mut f, &m.digests);
                f.push(("effect_id", s(&m.effect_id)));
                f.push(("verdict", s(m.answer.verdict())));
                match &m.answer {
                    EffectAnswer::Admitted {
                        lease_id,
                        lease_epoch,
                    } => {
                        f.push(("lease_id", s(lease_id)));
                        f.push(("lease_epoch", n(*lease_epoch)));
                    }
                    EffectAnswer::Settled {
                        claim_state,
                        result_digest,
                    } => {
                        f.push(("claim_state", s(claim_state)));
                        if let Some(d) = result_digest {
                            f.push(("result_digest", s(d)));
                        }
                    }
                    EffectAnswer::Refused { category } | EffectAnswer::NotRecorded { category } => {
                        f.push(("category", s(category)))
                    }
                    EffectAnswer::Recorded => {}
                }
                issued(&mut f, &m.issued);
            }
            Self::ReceiptAck(m) => f.extend([
                ("idempotency_key", s(&m.idempotency_key)),
                ("sot_incarnation", Value::Null),
                ("coordinator_epoch", opt_n(m.coordinator_epoch)),
                ("assignment_id", Value::Null),
                ("session_id", s(&m.session_id)),
                ("receipt_idempotency_key", s(&m.receipt_idempotency_key)),
                ("verdict", s(&m.verdict.encode())),
            ]),
            Self::CheckpointStored(m) => m.fields(&mut f),
            Self::CheckpointData(m) => m.fields(&mut f),
            Self::WorkspaceReleaseAnswer(m) => m.fields(&mut f),
            Self::WorkspaceOrder(m) => m.fields(&mut f),
            Self::WorkspaceEffectAnswer(m) => m.fields(&mut f),
            Self::RecoveryChallenge(m) => f = m.fields(),
            Self::HandoffCheckpoint(m) => {
                authority(&mut f, &m.authority);
                digests(&mut f, &m.digests);
                f.push(("handoff_id", s(&m.handoff_id)));
                issued(&mut f, &m.issued);
            }
        }
        f
    }

    /// Converts a verified envelope; `Ok(None)` for a type the coordinator does not send
    /// a host (or a `control` operation this build does not know: an error).
    pub fn decode(env: &Envelope<Verified>) -> Result<Option<Self>, WireError> {
        let f = Fields::of(env);
        let msg = match env.message_type() {
            MessageType::Stage => Self::Stage(Stage {
                authority: f.authority()?,
                issued: f.issued()?,
                repository: f.repository()?,
                restore: f.restore()?,
                artifact_recipients: crate::protocol::artifact::parse_recipients(
                    &f.str_list("artifact_recipients"),
                )
                .map_err(|e| f.unknown("artifact_recipients", &e.to_string()))?,
            }),
            MessageType::Contract => Self::Contract(Contract {
                authority: f.authority()?,
                digests: f.digests()?,
                task_text: f.str("task_text")?,
                issued: f.issued()?,
            }),
            MessageType::Challenge => Self::Challenge(Challenge {
                authority: f.authority()?,
                digests: f.digests()?,
                challenge_id: f.str("challenge_id")?,
                issued: f.issued()?,
            }),
            MessageType::HandoffChallenge => Self::HandoffChallenge(HandoffChallenge {
                authority: f.authority()?,
                digests: f.digests()?,
                bound: f.handoff_bound()?,
                next_action: f.str("next_action")?,
                issued: f.issued()?,
            }),
            MessageType::Continuation => Self::Continuation(Continuation {
                authority: f.authority()?,
                digests: f.digests()?,
                continuation_id: f.str("continuation_id")?,
                claim_ref: f.str("claim_ref")?,
                next_action: f.str("next_action")?,
                next_action_digest: f.str("next_action_digest")?,
                loop_budget: f.uint("loop_budget")?,
                phase: match f.str("phase")?.as_str() {
                    "offer" => ContinuationPhase::Offer,
                    "accepted" => ContinuationPhase::Accepted,
                    other => return Err(f.unknown("phase", other)),
                },
                result_to: f.str("result_to")?,
                issued: f.issued()?,
            }),
            MessageType::Control => match f.str("control_op")?.as_str() {
                "activate" => Self::Activate(Activate {
                    authority: f.authority()?,
                    digests: f.digests()?,
                    issued: f.issued()?,
                }),
                other => return Err(f.unknown("control_op", other)),
            },
            MessageType::Reconcile => Self::Reconcile(Reconcile {
                idempotency_key: f.str("idempotency_key")?,
                sot_incarnation: f.opt_str("sot_incarnation"),
                coordinator_epoch: f.opt_uint("coordinator_epoch"),
                session_id: f.str("session_id")?,
                lanes: match env.get("lanes") {
                    Some(v) => report::from_value("reconcile", v)
                        .map_err(|e| f.unknown("lanes", &e.to_string()))?,
                    None => return Err(f.miss("lanes", "an object")),
                },
            }),
            MessageType::EffectVerdict => {
                let answer = match f.str("verdict")?.as_str() {
                    "admitted" => EffectAnswer::Admitted {
                        lease_id: f.str("lease_id")?,
                        lease_epoch: f.uint("lease_epoch")?,
                    },
                    "settled" => EffectAnswer::Settled {
                        claim_state: f.str("claim_state")?,
                        result_digest: f.opt_str("result_digest"),
                    },
                    "refused" => EffectAnswer::Refused {
                        category: f.str("category")?,
                    },
                    "recorded" => EffectAnswer::Recorded,
                    "not-recorded" => EffectAnswer::NotRecorded {
                        category: f.str("category")?,
                    },
                    other => return Err(f.unknown("verdict", other)),
                };
                Self::EffectVerdict(EffectVerdict {
                    authority: f.authority()?,
                    digests: f.digests()?,
                    effect_id: f.str("effect_id")?,
                    answer,
                    issued: f.issued()?,
                })
            }
            MessageType::ReceiptAck => {
                let verdict = f.str("verdict")?;
                Self::ReceiptAck(ReceiptAck {
                    idempotency_key: f.str("idempotency_key")?,
                    coordinator_epoch: f.opt_uint("coordinator_epoch"),
                    session_id: f.str("session_id")?,
                    receipt_idempotency_key: f.str("receipt_idempotency_key")?,
                    verdict: Verdict::parse(&verdict)
                        .ok_or_else(|| f.unknown("verdict", &verdict))?,
                })
            }
            MessageType::CheckpointStored => {
                Self::CheckpointStored(super::CheckpointStored::decode(&f)?)
            }
            MessageType::CheckpointData => Self::CheckpointData(super::CheckpointData::decode(&f)?),
            MessageType::WorkspaceReleaseAnswer => {
                Self::WorkspaceReleaseAnswer(super::WorkspaceReleaseAnswer::decode(&f)?)
            }
            MessageType::WorkspaceOrder => Self::WorkspaceOrder(super::WorkspaceOrder::decode(&f)?),
            MessageType::WorkspaceEffectAnswer => {
                Self::WorkspaceEffectAnswer(super::WorkspaceEffectAnswer::decode(&f)?)
            }
            MessageType::RecoveryChallenge => {
                Self::RecoveryChallenge(super::RecoveryChallenge::decode(&f)?)
            }
            MessageType::HandoffCheckpoint => Self::HandoffCheckpoint(HandoffCheckpoint {
                authority: f.authority()?,
                digests: f.digests()?,
                handoff_id: f.str("handoff_id")?,
                issued: f.issued()?,
            }),
            _ => return Ok(None),
        };
        Ok(Some(msg))
    }
}

fn opt_s(v: Option<&str>) -> Value {
    v.map(s).unwrap_or(Value::Null)
}

fn opt_n(v: Option<u64>) -> Value {
    v.map(n).unwrap_or(Value::Null)
}

fn authority(f: &mut Vec<(&'static str, Value)>, a: &ChainAuthority) {
    f.extend([
        ("sot_incarnation", s(&a.sot_incarnation)),
        ("coordinator_epoch", n(a.coordinator_epoch)),
        ("assignment_id", s(&a.assignment_id)),
        ("lane_id", s(&a.lane_id)),
        ("lane_incarnation_id", s(&a.lane_incarnation_id)),
        ("assignment_attempt_id", s(&a.assignment_attempt_id)),
        ("reservation_id", s(&a.reservation_id)),
        ("reservation_epoch", n(a.reservation_epoch)),
        ("reservation_deadline", s(&a.reservation_deadline)),
        ("runtime_id", s(&a.runtime_id)),
        ("generation", n(a.generation)),
        ("fence_proof", s(&a.fence_proof)),
    ]);
}

fn digests(f: &mut Vec<(&'static str, Value)>, d: &Digests) {
    f.extend([
        ("contracts_digest", s(&d.contracts_digest)),
        ("scope_digest", s(&d.scope_digest)),
        ("holds_digest", s(&d.holds_digest)),
    ]);
}

fn issued(f: &mut Vec<(&'static str, Value)>, i: &Issued) {
    f.extend([
        ("idempotency_key", s(&i.idempotency_key)),
        ("issued_at", s(&i.issued_at)),
        ("expires_at", s(&i.expires_at)),
    ]);
}

impl Fields<'_> {
    fn authority(&self) -> Result<ChainAuthority, WireError> {
        Ok(ChainAuthority {
            sot_incarnation: self.str("sot_incarnation")?,
            coordinator_epoch: self.uint("coordinator_epoch")?,
            assignment_id: self.str("assignment_id")?,
            lane_id: self.str("lane_id")?,
            lane_incarnation_id: self.str("lane_incarnation_id")?,
            assignment_attempt_id: self.str("assignment_attempt_id")?,
            reservation_id: self.str("reservation_id")?,
            reservation_epoch: self.uint("reservation_epoch")?,
            reservation_deadline: self.str("reservation_deadline")?,
            runtime_id: self.str("runtime_id")?,
            generation: self.uint("generation")?,
            fence_proof: self.str("fence_proof")?,
        })
    }

    fn digests(&self) -> Result<Digests, WireError> {
        Ok(Digests {
            contracts_digest: self.str("contracts_digest")?,
            scope_digest: self.str("scope_digest")?,
            holds_digest: self.str("holds_digest")?,
        })
    }

    fn issued(&self) -> Result<Issued, WireError> {
        Ok(Issued {
            idempotency_key: self.str("idempotency_key")?,
            issued_at: self.str("issued_at")?,
            expires_at: self.str("expires_at")?,
        })
    }
}
