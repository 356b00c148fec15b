//! The discriminated union: every `message_type`, with its exact required, optional and
//! prohibited field sets, the kind each field must have, and the purpose class of key
//! that may sign it.
//!
//! A field not listed as required or optional for a variant is unknown; a field listed as
//! prohibited is rejected with its own reason (so "this variant must never carry a
//! deadline alias" is explicit, not an accident of omission). The schema digest — over
//! the variant's name, version and all three sets — is part of the domain separator, so a
//! proof binds the explicit absence of every prohibited field too.

/// Which class of key may sign a variant. A key has exactly one purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Purpose {
    /// Host↔coordinator session plumbing: hello, heartbeat, receipts.
    Session,
    /// Post-allocation assignment traffic (spec §7.2) and the activation chain.
    Ordinary,
    /// Preallocation-free recovery (spec §7.3/§7.4).
    Recovery,
}

/// Which side originates a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Coordinator,
    Host,
    /// A recovery candidate (spec §7.4).
    Candidate,
    Operator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageType {
    SessionChallenge,
    Hello,
    Report,
    Heartbeat,
    Receipt,
    ReceiptAck,
    Reconcile,
    Stage,
    Staged,
    Contract,
    Injected,
    Challenge,
    Ack,
    Task,
    Control,
    Effect,
    Lease,
    Stop,
    Destroy,
    RecoveryChallenge,
    RecoveryAck,
    Progress,
    Blocked,
    HandoffChallenge,
    HandoffAck,
    Continuation,
    ContinuationAccept,
    ContinuationResult,
    EffectResult,
    EffectVerdict,
    CheckpointUpload,
    CheckpointStored,
    CheckpointFetch,
    CheckpointData,
    HandoffCheckpoint,
    CheckpointTaken,
    WorkspaceRelease,
    WorkspaceReleaseAnswer,
    WorkspaceOrder,
    WorkspaceEffect,
    WorkspaceEffectAnswer,
}

pub const ALL_TYPES: [MessageType; 41] = [
    MessageType::SessionChallenge,
    MessageType::Hello,
    MessageType::Report,
    MessageType::Heartbeat,
    MessageType::Receipt,
    MessageType::ReceiptAck,
    MessageType::Reconcile,
    MessageType::Stage,
    MessageType::Staged,
    MessageType::Contract,
    MessageType::Injected,
    MessageType::Challenge,
    MessageType::Ack,
    MessageType::Task,
    MessageType::Control,
    MessageType::Effect,
    MessageType::Lease,
    MessageType::Stop,
    MessageType::Destroy,
    MessageType::RecoveryChallenge,
    MessageType::RecoveryAck,
    MessageType::Progress,
    MessageType::Blocked,
    MessageType::HandoffChallenge,
    MessageType::HandoffAck,
    MessageType::Continuation,
    MessageType::ContinuationAccept,
    MessageType::ContinuationResult,
    MessageType::EffectResult,
    MessageType::EffectVerdict,
    MessageType::CheckpointUpload,
    MessageType::CheckpointStored,
    MessageType::CheckpointFetch,
    MessageType::CheckpointData,
    MessageType::HandoffCheckpoint,
    MessageType::CheckpointTaken,
    MessageType::WorkspaceRelease,
    MessageType::WorkspaceReleaseAnswer,
    MessageType::WorkspaceOrder,
    MessageType::WorkspaceEffect,
    MessageType::WorkspaceEffectAnswer,
];

impl MessageType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionChallenge => "session_challenge",
            Self::Hello => "hello",
            Self::Report => "report",
            Self::Heartbeat => "heartbeat",
            Self::Receipt => "receipt",
            Self::ReceiptAck => "receipt_ack",
            Self::Reconcile => "reconcile",
            Self::Stage => "stage",
            Self::Staged => "staged",
            Self::Contract => "contract",
            Self::Injected => "injected",
            Self::Challenge => "challenge",
            Self::Ack => "ack",
            Self::Task => "task",
            Self::Control => "control",
            Self::Effect => "effect",
            Self::Lease => "lease",
            Self::Stop => "stop",
            Self::Destroy => "destroy",
            Self::RecoveryChallenge => "recovery_challenge",
            Self::RecoveryAck => "recovery_ack",
            Self::Progress => "progress",
            Self::Blocked => "blocked",
            Self::HandoffChallenge => "handoff_challenge",
            Self::HandoffAck => "handoff_ack",
            Self::Continuation => "continuation",
            Self::ContinuationAccept => "continuation_accept",
            Self::ContinuationResult => "continuation_result",
            Self::EffectResult => "effect_result",
            Self::EffectVerdict => "effect_verdict",
            Self::CheckpointUpload => "checkpoint_upload",
            Self::CheckpointStored => "checkpoint_stored",
            Self::CheckpointFetch => "checkpoint_fetch",
            Self::CheckpointData => "checkpoint_data",
            Self::HandoffCheckpoint => "handoff_checkpoint",
            Self::CheckpointTaken => "checkpoint_taken",
            Self::WorkspaceRelease => "workspace_release",
            Self::WorkspaceReleaseAnswer => "workspace_release_answer",
            Self::WorkspaceOrder => "workspace_order",
            Self::WorkspaceEffect => "workspace_effect",
            Self::WorkspaceEffectAnswer => "workspace_effect_answer",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        ALL_TYPES.into_iter().find(|t| t.as_str() == s)
    }

    pub fn schema(self) -> &'static Schema {
        SCHEMAS
            .iter()
            .find(|s| s.message_type == self)
            .unwrap_or(&SCHEMAS[0]) // unreachable: every type has a schema (tested)
    }
}

impl serde::Serialize for MessageType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for MessageType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown message type {s:?}")))
    }
}

/// The shape a field's value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Non-empty string of at most 64 KiB.
    Str,
    /// Non-empty text of at most `task::MAX_TASK_BYTES` (a task).
    Text,
    /// Non-negative safe integer.
    Uint,
    /// `sha256:` and 64 lower-case hex digits.
    Digest,
    /// RFC 3339 UTC timestamp as issued by the coordinator's database.
    Time,
    /// Any JSON object (its own schema is checked by the consumer).
    Object,
    /// Array of non-empty strings.
    StrList,
    /// A `Str` that may be `null` (session variants before any assignment exists).
    NullableStr,
    /// A `Uint` that may be `null`.
    NullableUint,
    /// The process identity object: exactly these keys.
    ProcessIdentity,
}

pub const PROCESS_IDENTITY_KEYS: [&str; 8] = [
    "boot_id",
    "cgroup_id",
    "cgroup_path",
    "exe_dev",
    "exe_ino",
    "launch_nonce_digest",
    "root_pid",
    "root_start_time",
];

pub type Field = (&'static str, Kind);

#[derive(Debug)]
pub struct Schema {
    pub message_type: MessageType,
    pub version: &'static str,
    pub purpose: Purpose,
    pub origin: Role,
    pub required: &'static [&'static [Field]],
    pub optional: &'static [Field],
    pub prohibited: &'static [&'static [&'static str]],
}

impl Schema {
    pub fn required_fields(&self) -> impl Iterator<Item = &Field> {
        self.required.iter().flat_map(|g| g.iter())
    }
    pub fn is_prohibited(&self, name: &str) -> bool {
        self.prohibited.iter().any(|g| g.contains(&name))
    }
    pub fn kind_of(&self, name: &str) -> Option<Kind> {
        self.required_fields()
            .chain(self.optional.iter())
            .find(|(n, _)| *n == name)
            .map(|(_, k)| *k)
    }

    /// Digest over the variant's identity and its three field sets (sorted), bound into the
    /// domain separator.
    pub fn digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut req: Vec<&str> = self.required_fields().map(|(n, _)| *n).collect();
        let mut opt: Vec<&str> = self.optional.iter().map(|(n, _)| *n).collect();
        let mut pro: Vec<&str> = self
            .prohibited
            .iter()
            .flat_map(|g| g.iter().copied())
            .collect();
        req.sort_unstable();
        opt.sort_unstable();
        pro.sort_unstable();
        let mut h = Sha256::new();
        for part in [self.message_type.as_str(), self.version] {
            h.update((part.len() as u32).to_be_bytes());
            h.update(part.as_bytes());
        }
        for (tag, set) in [(b'r', req), (b'o', opt), (b'p', pro)] {
            h.update([tag]);
            h.update((set.len() as u32).to_be_bytes());
            for n in set {
                h.update((n.len() as u32).to_be_bytes());
                h.update(n.as_bytes());
            }
        }
        h.finalize().into()
    }
}

mod fields;
mod table;

pub use table::*;
