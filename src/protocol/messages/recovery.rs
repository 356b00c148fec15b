//! The two preallocation-free recovery variants (spec §7.3, §7.4): the coordinator's
//! `recovery_challenge` to a candidate host, and the candidate's `recovery_ack`.
//!
//! Both carry the same bound facts ([`RecoveryFacts`]) and nothing that exists only after
//! allocation (the schema rejects every §7.5 field and every deadline alias before these
//! structs are built). `recovery_deadline` is carried as the exact string the database
//! rendered once; nothing here parses, normalizes or re-renders it.
//!
//! **Never:** grants anything. A recovery ACK is one input to the retarget CAS
//! (`coordinator::recovery`), which checks it against the candidate row.

use super::super::canonical::Value;
use super::super::envelope::{n, s, Envelope, Signer, Verified};
use super::super::schema::MessageType;
use super::{Fields, WireError};

/// The facts a recovery challenge binds and its ACK repeats, field for field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryFacts {
    pub sot_incarnation: String,
    pub coordinator_epoch: u64,
    pub assignment_id: String,
    pub recovery_candidate_id: String,
    pub recovery_handoff_challenge_id: String,
    pub candidate_principal: String,
    pub expected_retarget_operation: String,
    pub failed_target_snapshot_digest: String,
    pub objective_failure_evidence_digest: String,
    pub policy_selection_digest: String,
    pub scope_digest: String,
    pub holds_digest: String,
    pub contracts_digest: String,
    /// The one canonical rendering the primary database produced.
    pub recovery_deadline: String,
}

impl RecoveryFacts {
    fn fields(&self, f: &mut Vec<(&'static str, Value)>) {
        f.extend([
            ("sot_incarnation", s(&self.sot_incarnation)),
            ("coordinator_epoch", n(self.coordinator_epoch)),
            ("assignment_id", s(&self.assignment_id)),
            ("recovery_candidate_id", s(&self.recovery_candidate_id)),
            (
                "recovery_handoff_challenge_id",
                s(&self.recovery_handoff_challenge_id),
            ),
            ("candidate_principal", s(&self.candidate_principal)),
            (
                "expected_retarget_operation",
                s(&self.expected_retarget_operation),
            ),
            (
                "failed_target_snapshot_digest",
                s(&self.failed_target_snapshot_digest),
            ),
            (
                "objective_failure_evidence_digest",
                s(&self.objective_failure_evidence_digest),
            ),
            ("policy_selection_digest", s(&self.policy_selection_digest)),
            ("scope_digest", s(&self.scope_digest)),
            ("holds_digest", s(&self.holds_digest)),
            ("contracts_digest", s(&self.contracts_digest)),
            ("recovery_deadline", s(&self.recovery_deadline)),
        ]);
    }

    fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        Ok(Self {
            sot_incarnation: f.str("sot_incarnation")?,
            coordinator_epoch: f.uint("coordinator_epoch")?,
            assignment_id: f.str("assignment_id")?,
            recovery_candidate_id: f.str("recovery_candidate_id")?,
            recovery_handoff_challenge_id: f.str("recovery_handoff_challenge_id")?,
            candidate_principal: f.str("candidate_principal")?,
            expected_retarget_operation: f.str("expected_retarget_operation")?,
            failed_target_snapshot_digest: f.str("failed_target_snapshot_digest")?,
            objective_failure_evidence_digest: f.str("objective_failure_evidence_digest")?,
            policy_selection_digest: f.str("policy_selection_digest")?,
            scope_digest: f.str("scope_digest")?,
            holds_digest: f.str("holds_digest")?,
            contracts_digest: f.str("contracts_digest")?,
            recovery_deadline: f.str("recovery_deadline")?,
        })
    }
}

/// Coordinator → candidate host (§7.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryChallenge {
    pub idempotency_key: String,
    pub facts: RecoveryFacts,
    /// Primary-database time the candidate row was written.
    pub issued_at: String,
}

impl RecoveryChallenge {
    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut f = vec![("idempotency_key", s(&self.idempotency_key))];
        self.facts.fields(&mut f);
        f.push(("issued_at", s(&self.issued_at)));
        f
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        Ok(Self {
            idempotency_key: f.str("idempotency_key")?,
            facts: RecoveryFacts::decode(f)?,
            issued_at: f.str("issued_at")?,
        })
    }

    /// The digest of the exact envelope `signer` sends for this challenge as `message_id`
    /// to `audience` (ed25519 signatures are deterministic, so the coordinator can compute
    /// the digest a candidate's ACK must name from the candidate row alone).
    pub fn envelope_digest(
        &self,
        signer: &Signer,
        audience: &str,
        message_id: &str,
    ) -> Result<String, super::super::envelope::EnvelopeError> {
        let mut fields = self.fields();
        fields.push(("message_id", s(message_id)));
        let bytes = signer.sign(MessageType::RecoveryChallenge, audience, fields)?;
        use sha2::{Digest, Sha256};
        Ok(format!("sha256:{}", hex::encode(Sha256::digest(&bytes))))
    }
}

/// Candidate host → coordinator (§7.4): the challenge's facts, its message id and digest;
/// no time of any kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryAck {
    pub idempotency_key: String,
    pub facts: RecoveryFacts,
    pub acknowledged_recovery_message_id: String,
    pub acknowledged_recovery_challenge_digest: String,
}

impl RecoveryAck {
    /// The ACK answering a verified challenge envelope.
    pub fn answering(env: &Envelope<Verified>, c: &RecoveryChallenge) -> Self {
        Self {
            idempotency_key: format!("recovery-ack/{}", c.facts.recovery_handoff_challenge_id),
            facts: c.facts.clone(),
            acknowledged_recovery_message_id: env.message_id().to_string(),
            acknowledged_recovery_challenge_digest: env.digest(),
        }
    }

    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut f = vec![("idempotency_key", s(&self.idempotency_key))];
        self.facts.fields(&mut f);
        f.extend([
            (
                "acknowledged_recovery_message_id",
                s(&self.acknowledged_recovery_message_id),
            ),
            (
                "acknowledged_recovery_challenge_digest",
                s(&self.acknowledged_recovery_challenge_digest),
            ),
        ]);
        f
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        Ok(Self {
            idempotency_key: f.str("idempotency_key")?,
            facts: RecoveryFacts::decode(f)?,
            acknowledged_recovery_message_id: f.str("acknowledged_recovery_message_id")?,
            acknowledged_recovery_challenge_digest: f
                .str("acknowledged_recovery_challenge_digest")?,
        })
    }
}
