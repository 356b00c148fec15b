//! The field groups message schemas are made of (spec §7.1, §7.2, §7.5, §8.1), shared by
//! the table (`table.rs`).

use super::*;

use Kind::*;

/// Spec §7.1: every variant binds these.
pub(crate) const COMMON: &[Field] = &[
    ("protocol_version", Uint),
    ("message_type", Str),
    ("message_id", Str),
    ("idempotency_key", Str),
    ("issuer", Str),
    ("audience", Str),
    ("key_id", Str),
    ("trust_domain", Str),
    ("authentication_profile_version", Str),
    ("envelope_schema_version", Str),
    ("authentication_suite_id", Str),
    ("authentication_proof", Str),
];
/// The authority timeline fields: always present, non-null once an assignment exists.
pub(crate) const AUTHORITY: &[Field] = &[
    ("sot_incarnation", Str),
    ("coordinator_epoch", Uint),
    ("assignment_id", Str),
];
/// Session variants bind them too, but may carry `null` before any assignment exists.
pub(crate) const AUTHORITY_NULLABLE: &[Field] = &[
    ("sot_incarnation", NullableStr),
    ("coordinator_epoch", NullableUint),
    ("assignment_id", NullableStr),
];
/// Spec §7.2: ordinary post-allocation fields.
pub(crate) const ORDINARY: &[Field] = &[
    ("lane_id", Str),
    ("lane_incarnation_id", Str),
    ("assignment_attempt_id", Str),
    ("reservation_id", Str),
    ("reservation_epoch", Uint),
    ("reservation_deadline", Time),
    ("runtime_id", Str),
    ("generation", Uint),
    ("fence_proof", Str),
    ("contracts_digest", Digest),
    ("scope_digest", Digest),
    ("holds_digest", Digest),
];
/// Coordinator-issued authority variants carry primary-database times.
pub(crate) const ISSUED: &[Field] = &[("issued_at", Time), ("expires_at", Time)];

/// Candidate/host-origin variants assert no authoritative time (spec §7.2, §8).
pub(crate) const NO_AUTHORITATIVE_TIME: &[&str] = &[
    "issued_at",
    "expires_at",
    "acknowledged_at",
    "received_at",
    "consumed_at",
    "authoritative_deadline",
    "challenge_deadline",
    "deadline",
];
/// A handoff ACK echoes the coordinator-issued challenge deadline (spec §8.1) and asserts
/// no other time.
pub(crate) const HANDOFF_ACK_NO_TIME: &[&str] = &[
    "issued_at",
    "expires_at",
    "acknowledged_at",
    "received_at",
    "consumed_at",
    "authoritative_deadline",
    "deadline",
];
/// The §8.1 fields a handoff challenge carries and its ACK binds (besides the ordinary
/// chain fields of the target's generation).
pub(crate) const HANDOFF_BOUND: &[Field] = &[
    ("handoff_challenge_id", Str),
    ("source_assignment_attempt_id", Str),
    ("responsibility_owner", Str),
    ("execution_owner", Str),
    ("pending_target", Str),
    ("next_action_digest", Digest),
    ("challenge_deadline", Time),
];
/// Spec §7.5: facts that do not exist for a recovery candidate.
pub(crate) const RECOVERY_PROHIBITED: &[&str] = &[
    "assignment_attempt_id",
    "reservation_id",
    "reservation_epoch",
    "reservation_deadline",
    "lane_id",
    "lane_incarnation_id",
    "runtime_id",
    "generation",
    "fence_proof",
    "challenge_id",
    "ready_state",
    "lease_id",
    "effect_id",
    "execution_owner",
    "activation_idempotency_identity",
];
/// Spec §7.3: `recovery_deadline` is the only expiry boundary; every alias is prohibited.
pub(crate) const RECOVERY_ALT_BOUNDARIES: &[&str] = &[
    "expires_at",
    "authoritative_deadline",
    "challenge_deadline",
    "deadline",
];
/// Recovery ACKs assert no clock at all.
pub(crate) const RECOVERY_ACK_NO_TIME: &[&str] =
    &["issued_at", "acknowledged_at", "received_at", "consumed_at"];
/// Nothing before the contract is recorded may carry contract, challenge or lease facts.
pub(crate) const PRE_CONTRACT: &[&str] = &[
    "contracts_digest",
    "challenge_id",
    "lease_id",
    "effect_id",
    "scope_digest",
    "holds_digest",
];

pub(crate) const RECOVERY_COMMON: &[Field] = &[
    ("recovery_candidate_id", Str),
    ("recovery_handoff_challenge_id", Str),
    ("candidate_principal", Str),
    ("expected_retarget_operation", Str),
    ("failed_target_snapshot_digest", Digest),
    ("objective_failure_evidence_digest", Digest),
    ("policy_selection_digest", Digest),
    ("scope_digest", Digest),
    ("holds_digest", Digest),
    ("contracts_digest", Digest),
    ("recovery_deadline", Time),
];
