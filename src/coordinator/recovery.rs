//! Preactivation retarget (spec §6.3): work whose target T failed before activation moves
//! to another lane U only through a recovery candidate.
//!
//! 1. [`Store::offer_recovery`] — one fenced transition that allocates *only* the candidate
//!    row (migration 0031): the exact failed-target snapshot (a database function of T's
//!    rows), the objective failure evidence, the selection, and one `recovery_deadline`
//!    rendered once by the primary. No attempt, reservation, generation, fence or ordinary
//!    challenge exists for U.
//! 2. The service sends the candidate host a `recovery_challenge` signed by the
//!    coordinator's recovery key; the host answers with a `recovery_ack` signed by its own
//!    recovery key.
//! 3. The reservation CAS (`chain::reserve` with [`RecoveryConsume`]) consumes the ACK:
//!    its lane predicate requires the candidate ISSUED, every bound fact equal, the
//!    deadline ahead of `clock_timestamp()` (equality is expired), the candidate's epoch
//!    the committing leader's, and the snapshot recomputed *now* equal to the one bound —
//!    then, in the same commit, U's fresh attempt, reservation and fence, the candidate
//!    CONSUMED, T's attempt marked retargeted, and every competing candidate invalidated.
//!
//! **Never:** allocates anything for U before the consuming CAS; treats a candidate, its
//! challenge or its ACK as authority; moves work whose latest chain was activated (that is
//! the inactivity policy's next attempt, or a handoff); reads or writes a deadline other
//! than the candidate row's `recovery_deadline` text.

use const_format::concatcp;
use serde::Serialize;
use serde_json::json;

use super::error::{AuthorityError, Category};
use super::rows::RowExt;
use super::states::{CandidateState, LaneState, Lifecycle, WorkStatus};
use super::txn::{body, request_digest, Decided, Step, Undecided};
use super::{Leader, Store};
use crate::protocol::messages::{RecoveryAck, RecoveryChallenge, RecoveryFacts};

/// The retarget policy: when work moves, and how its lane is chosen. Versioned like the
/// inactivity policy: a new rule is a new version, and every candidate records the digest
/// of the one it was selected under.
pub const POLICY: &str = "retarget@1";
const POLICY_BODY: &str = "retarget@1: work whose latest chain failed before activation, \
ended by a fenced transition on objective evidence of the target's own failure (an end-chain \
receipt for an expired reservation, a chain its host lost, or a host workspace that is not the \
one named; or, with no end-chain, the ingested termination receipt of its generation), moves \
to another lane only through a recovery candidate, within its inactivity policy's attempts. \
Automatic, for an initial or post-transfer target: when the inactivity policy's next attempt \
may not use the failed lane (its replacements there are used up), or at once when the failed \
lane cannot take work again soon (its host has had no session for 5 s; the lane is \
quarantined, retired or being recreated). Operator-approved (`mosaic retarget`): any of the three operations; a \
pre-transfer one only so. Selection: placement@2 over the published roster, without the failed \
lane, hosts without a recovery key, and, for work with a workspace, the failed lane's host and \
hosts its checkpoint cannot reach; with no roster, the first idle lane by lane id of a connected \
host advertising the runtime, under the same exclusions. The candidate's ACK must be consumed \
before its recovery_deadline, 30 s after issue (database time; equality is expired).";

/// How long a host must have been without a session before the policy treats its lane as
/// unable to take the work back (database time): a coordinator restart or a short network
/// cut is not a dead host.
pub const HOST_GONE_AFTER_MS: i64 = 5_000;

/// How long a candidate's challenge may be answered (database time).
pub const CANDIDATE_TTL_MS: i64 = 30_000;

pub fn policy_digest() -> String {
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/retarget-policy/v1", &[POLICY_BODY.as_bytes()])
    )
}

/// The objective evidence of T's failure, from durable rows only (spec §6.3: a receipt,
/// never a narrative): the end-chain receipt that released T's reservation — objective only
/// for a failure of T itself (`ending::TARGET_FAILURE_CAUSES`: expired, lost by its host,
/// its host's workspace not the one named; not a withdrawn offer or a checkpoint that would
/// fail U alike) — or, when no end-chain released it, the ingested termination receipt of
/// T's generation (it died before activation). A takeover alone is no evidence: the work
/// waits for its lane or an operator.
const EVIDENCE: &str = concatcp!(
    "SELECT x.*, CASE WHEN x.end_chain IS NOT NULL THEN x.end_chain->>'cause' IN ", super::ending::TARGET_FAILURE_CAUSES, " \
                     ELSE x.termination IS NOT NULL END AS objective \
     FROM (SELECT t.reservation_id, \
        (SELECT jsonb_build_object('receipt_id', tr.receipt_id, 'cause', tr.body->>'cause') FROM transition_receipts tr \
          WHERE tr.assignment_id = t.assignment_id AND tr.transition = 'end-chain' AND tr.body->'chain'->>'reservation_id' = t.reservation_id \
          ORDER BY tr.decided_at LIMIT 1) AS end_chain, \
        (SELECT jsonb_build_object('idempotency_key', x.idempotency_key, 'body_digest', x.body_digest) FROM termination_receipts x \
          WHERE x.lane_incarnation_id = t.lane_incarnation_id AND x.generation = t.generation ORDER BY x.ingested_at LIMIT 1) AS termination, \
        mosaic_ts(t.released_at) AS released_at, \
        EXISTS (SELECT 1 FROM transition_receipts tr WHERE tr.transition = 'activate' AND tr.assignment_id = t.assignment_id \
                AND tr.body->'chain'->>'reservation_id' = t.reservation_id) AS activated \
     FROM reservations t WHERE t.assignment_id = $1 ORDER BY t.created_at DESC, t.reservation_id DESC LIMIT 1) x"
);

/// The operation a snapshot's provenance names (§6.3.1), as SQL over `s0.snap`: no source
/// attempt is `initial`; a source attempt without an accepted handoff's receipt is
/// `pre-transfer`; with one, `post-transfer`.
const OPERATION: &str =
    "CASE WHEN s0.snap->>'source_assignment_attempt_id' IS NULL THEN 'initial' \
     WHEN s0.snap->>'handoff_receipt_digest' IS NULL THEN 'pre-transfer' ELSE 'post-transfer' END";

/// Work a candidate may be offered for, over `a` (the work) and `s.operation`: in recovery
/// after an initial or post-transfer target failed; or, pre-transfer, ACTIVE with its source
/// still executing (its reservation open, the snapshot's source attempt) and no handoff
/// pending. Work in recovery whose failed target was a never-accepted handoff's has lost
/// its source too: that is no retarget (an operator resumes it). A retarget is an attempt:
/// none once the inactivity policy's attempts are spent.
const RETARGETABLE: &str = concatcp!(
    "a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL \
     AND ((a.lifecycle = ", Lifecycle::Recovery.sql(), " AND s.operation <> 'pre-transfer') \
       OR (a.lifecycle = ", Lifecycle::Active.sql(), " AND s.operation = 'pre-transfer' \
           AND a.execution_owner IS NOT NULL AND a.pending_target IS NULL \
           AND EXISTS (SELECT 1 FROM reservations sr WHERE sr.assignment_id = a.assignment_id AND sr.released_at IS NULL \
                       AND sr.assignment_attempt_id = s.snap->>'source_assignment_attempt_id'))) \
     AND (SELECT count(*) FROM attempts at2 WHERE at2.assignment_id = a.assignment_id) - a.attempts_before_budget \
         < (SELECT p.max_attempts FROM inactivity_policies p WHERE p.policy_id = a.inactivity_policy)"
);

/// What the service chose U by: recorded whole with the candidate.
#[derive(Debug, Clone, Serialize)]
pub struct Selection {
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub host_id: String,
    /// `placement@2` with its inputs' digest, or `first-idle` with the lanes it saw.
    pub method: String,
    pub inputs_digest: String,
    pub excluded_lane: String,
}

impl Selection {
    pub fn digest(&self) -> String {
        format!(
            "sha256:{}",
            crate::util::sha256_hex(
                "mosaic/retarget-selection/v1",
                &[
                    policy_digest().as_bytes(),
                    self.method.as_bytes(),
                    self.inputs_digest.as_bytes(),
                    self.excluded_lane.as_bytes(),
                    self.lane_id.as_bytes(),
                    self.lane_incarnation_id.as_bytes(),
                ]
            )
        )
    }
}

/// Work in recovery whose start failed before activation, and its failed lane.
#[derive(Debug, Clone)]
pub struct Stranded {
    pub assignment_id: String,
    pub lane_id: String,
    pub host_id: String,
    /// Quarantined, retired or being recreated: it cannot take the work again soon.
    pub lane_unusable: bool,
    /// Its host's last session closed at least `HOST_GONE_AFTER_MS` ago (database time).
    pub host_gone: bool,
}

/// A candidate as its row holds it, and the challenge it is sent as.
#[derive(Debug, Clone, Serialize)]
pub struct Offer {
    pub candidate_host_id: String,
    pub candidate_lane_id: String,
    pub candidate_lane_incarnation_id: String,
    pub failed_reservation_id: String,
    pub state: CandidateState,
    /// Whether its deadline is still ahead (database time, when read).
    pub open: bool,
    /// How long ago it was issued (database time, when read).
    pub age_ms: i64,
    #[serde(skip)]
    pub challenge: RecoveryChallenge,
}

impl Offer {
    fn from_row(r: &tokio_postgres::Row) -> Result<Self, AuthorityError> {
        let principal: String = r.col("candidate_principal")?;
        Ok(Self {
            candidate_host_id: principal.trim_start_matches("host:").to_string(),
            candidate_lane_id: r.col("candidate_lane_id")?,
            candidate_lane_incarnation_id: r.col("candidate_lane_incarnation_id")?,
            failed_reservation_id: r.col("failed_reservation_id")?,
            state: r.col("state")?,
            open: r.col("open")?,
            age_ms: r.col("age_ms")?,
            challenge: RecoveryChallenge {
                idempotency_key: r.col("idempotency_key")?,
                issued_at: r.col("issued_at")?,
                facts: RecoveryFacts {
                    sot_incarnation: r.col("sot_incarnation")?,
                    coordinator_epoch: r.col::<i64>("coordinator_epoch")?.max(0) as u64,
                    assignment_id: r.col("assignment_id")?,
                    recovery_candidate_id: r.col("recovery_candidate_id")?,
                    recovery_handoff_challenge_id: r.col("recovery_handoff_challenge_id")?,
                    candidate_principal: principal,
                    expected_retarget_operation: r.col("expected_retarget_operation")?,
                    failed_target_snapshot_digest: r.col("failed_target_snapshot_digest")?,
                    objective_failure_evidence_digest: r
                        .col("objective_failure_evidence_digest")?,
                    policy_selection_digest: r.col("policy_selection_digest")?,
                    scope_digest: r.col("scope_digest")?,
                    holds_digest: r.col("holds_digest")?,
                    contracts_digest: r.col("contracts_digest")?,
                    recovery_deadline: r.col("recovery_deadline")?,
                },
            },
        })
    }
}

const OFFER_COLUMNS: &str = "rc.recovery_candidate_id, rc.recovery_handoff_challenge_id, rc.idempotency_key, rc.assignment_id, \
    rc.failed_reservation_id, rc.expected_retarget_operation, rc.failed_target_snapshot_digest, rc.objective_failure_evidence_digest, \
    rc.policy_selection_digest, rc.candidate_principal, rc.candidate_lane_id, rc.candidate_lane_incarnation_id, rc.scope_digest, \
    rc.holds_digest, rc.contracts_digest, rc.sot_incarnation, rc.coordinator_epoch, rc.issued_at, rc.recovery_deadline, rc.state, \
    (clock_timestamp() < rc.recovery_deadline::timestamptz) AS open, \
    (EXTRACT(EPOCH FROM clock_timestamp() - rc.issued_at::timestamptz) * 1000)::bigint AS age_ms";

/// A verified recovery ACK, as the reservation CAS consumes it: every fact it binds (one
/// JSON parameter, compared field by field against the candidate row in SQL).
#[derive(Debug, Clone)]
pub struct RecoveryConsume {
    pub ack: RecoveryAck,
    /// The principal whose recovery key signed the ACK (the session's host).
    pub signer_principal: String,
}

impl RecoveryConsume {
    pub(crate) fn param(&self) -> serde_json::Value {
        let f = &self.ack.facts;
        json!({
            "candidate_id": f.recovery_candidate_id, "challenge_id": f.recovery_handoff_challenge_id,
            "candidate_principal": f.candidate_principal, "signer": self.signer_principal,
            "operation": f.expected_retarget_operation, "snapshot": f.failed_target_snapshot_digest,
            "evidence": f.objective_failure_evidence_digest, "selection": f.policy_selection_digest,
            "scope": f.scope_digest, "holds": f.holds_digest, "contracts": f.contracts_digest,
            "sot": f.sot_incarnation, "epoch": f.coordinator_epoch, "assignment": f.assignment_id,
            "deadline": f.recovery_deadline,
            "idem": self.ack.idempotency_key,
            "ack_message_id": self.ack.acknowledged_recovery_message_id,
            "ack_digest": self.ack.acknowledged_recovery_challenge_digest,
        })
    }
}

/// The reservation CAS's recovery predicate (`$7` is the [`RecoveryConsume`] parameter, `$8`
/// the leader's epoch, `$2` the assignment, `li` the candidate lane's incarnation row): the candidate ISSUED,
/// every bound fact equal, signed by its own principal, its deadline ahead (equality is
/// expired), issued under the committing leader's epoch, and the failed target's snapshot
/// recomputed now equal to the one bound.
macro_rules! admits {
    ($c:expr, $e:expr) => {
        concatcp!(
    "EXISTS (SELECT 1 FROM recovery_candidates rc WHERE rc.recovery_candidate_id = ", $c, "->>'candidate_id' \
       AND rc.state = ", CandidateState::Issued.sql(), " AND rc.assignment_id = $2 AND rc.assignment_id = ", $c, "->>'assignment' \
       AND rc.candidate_lane_incarnation_id = li.lane_incarnation_id \
       AND rc.recovery_handoff_challenge_id = ", $c, "->>'challenge_id' \
       AND rc.candidate_principal = ", $c, "->>'candidate_principal' AND rc.candidate_principal = ", $c, "->>'signer' \
       AND rc.expected_retarget_operation = ", $c, "->>'operation' AND rc.failed_target_snapshot_digest = ", $c, "->>'snapshot' \
       AND rc.objective_failure_evidence_digest = ", $c, "->>'evidence' AND rc.policy_selection_digest = ", $c, "->>'selection' \
       AND rc.scope_digest = ", $c, "->>'scope' AND rc.holds_digest = ", $c, "->>'holds' AND rc.contracts_digest = ", $c, "->>'contracts' \
       AND rc.sot_incarnation = ", $c, "->>'sot' AND rc.coordinator_epoch = (", $c, "->>'epoch')::bigint AND rc.coordinator_epoch = ", $e, " \
       AND rc.recovery_deadline = ", $c, "->>'deadline' AND clock_timestamp() < rc.recovery_deadline::timestamptz \
       AND ", $c, "->>'idem' = 'recovery-ack/' || rc.recovery_handoff_challenge_id \
       AND rc.failed_target_snapshot_digest = mosaic_failed_target_snapshot_digest(rc.assignment_id))"
)
    };
}
pub(crate) const ADMITS: &str = admits!("$7", "$8");
/// The same predicate in a handoff offer's CAS (`$3` the consume parameter, `$4` the epoch).
pub(crate) const ADMITS_OFFER: &str = admits!("$3", "$4");

/// After the reservation CAS admitted the candidate: the candidate CONSUMED (with the
/// database's receipt times), T's attempt marked retargeted, and every other open
/// candidate of the work invalidated — in the reservation's own commit.
pub(crate) async fn consume(
    d: &Decided<'_>,
    c: &RecoveryConsume,
    reservation: &str,
) -> Result<serde_json::Value, AuthorityError> {
    let f = &c.ack.facts;
    // One database time for both receipt fields, and the deadline tested again at it: the
    // consumption the receipt records is never at or past the deadline.
    let rows = d
        .query(
            concatcp!("UPDATE recovery_candidates SET state = ", CandidateState::Consumed.sql(), ", ack_message_id = $2, ack_digest = $3, \
                    received_at = n.at, consumed_at = n.at, retarget_reservation_id = $4 \
             FROM (SELECT clock_timestamp() AS at) n \
             WHERE recovery_candidate_id = $1 AND state = ", CandidateState::Issued.sql(), " AND n.at < recovery_deadline::timestamptz \
             RETURNING failed_attempt_id, failed_reservation_id, expected_retarget_operation, mosaic_ts(consumed_at) AS consumed_at"),
            &[&f.recovery_candidate_id, &c.ack.acknowledged_recovery_message_id, &c.ack.acknowledged_recovery_challenge_digest, &reservation],
        )
        .await?;
    let Some(row) = rows.first() else {
        return Err(super::error::reject(
            "retarget",
            Category::Expired,
            "the candidate's recovery_deadline passed before its consumption (database time; equality is expired)",
        ));
    };
    let failed_attempt: String = row.col("failed_attempt_id")?;
    d.exec_one(
        "UPDATE attempts SET retargeted_by = $2 WHERE assignment_attempt_id = $1 AND retargeted_by IS NULL",
        &[&failed_attempt, &f.recovery_candidate_id],
    )
    .await?;
    let invalidated = d
        .exec(
            concatcp!(
                "UPDATE recovery_candidates SET state = ",
                CandidateState::Invalidated.sql(),
                ", \
                    invalidated_reason = 'candidate ' || $2 || ' won the retarget' \
             WHERE assignment_id = $1 AND state = ",
                CandidateState::Issued.sql()
            ),
            &[&f.assignment_id, &f.recovery_candidate_id],
        )
        .await?;
    Ok(json!({
        "recovery_candidate_id": f.recovery_candidate_id,
        "recovery_handoff_challenge_id": f.recovery_handoff_challenge_id,
        "candidate_principal": f.candidate_principal,
        "expected_retarget_operation": row.col::<String>("expected_retarget_operation")?,
        "failed_target_snapshot_digest": f.failed_target_snapshot_digest,
        "objective_failure_evidence_digest": f.objective_failure_evidence_digest,
        "policy_selection_digest": f.policy_selection_digest,
        "recovery_deadline": f.recovery_deadline,
        "ack_digest": c.ack.acknowledged_recovery_challenge_digest,
        "retargeted_attempt": failed_attempt,
        "failed_reservation_id": row.col::<String>("failed_reservation_id")?,
        "consumed_at": row.col::<String>("consumed_at")?,
        "competitors_invalidated": invalidated,
    }))
}

/// Why the reservation CAS did not admit a recovery ACK: the first bound fact that fails,
/// read from the candidate row.
pub(crate) async fn why_not(
    u: Undecided<'_>,
    c: &RecoveryConsume,
    lane_incarnation_id: &str,
    epoch: i64,
) -> Result<Option<AuthorityError>, AuthorityError> {
    let f = &c.ack.facts;
    let row = u
        .read_opt(
            concatcp!(
                "SELECT ",
                OFFER_COLUMNS,
                ", mosaic_failed_target_snapshot_digest(rc.assignment_id) AS snapshot_now \
             FROM recovery_candidates rc WHERE rc.recovery_candidate_id = $1"
            ),
            &[&f.recovery_candidate_id],
        )
        .await?;
    let Some(r) = row else {
        return Ok(Some(
            u.reject(Category::NotFound, "no such recovery candidate")
                .await?,
        ));
    };
    let o = Offer::from_row(&r)?;
    let e = &o.challenge.facts;
    let (category, why) = if o.state == CandidateState::Consumed {
        (
            Category::ChallengeConsumed,
            "the candidate's ACK was already consumed".to_string(),
        )
    } else if o.state == CandidateState::Invalidated {
        (
            Category::WrongState,
            "the candidate was invalidated (another candidate won, or the work moved on)".into(),
        )
    } else if e != f
        || c.ack.idempotency_key != format!("recovery-ack/{}", e.recovery_handoff_challenge_id)
    {
        (
            Category::Mismatch,
            "the ACK does not bind the candidate's exact facts".into(),
        )
    } else if o.candidate_lane_incarnation_id != lane_incarnation_id {
        (
            Category::Mismatch,
            "the candidate was selected for another lane".into(),
        )
    } else if e.coordinator_epoch != epoch.max(0) as u64 {
        (
            Category::Expired,
            "the candidate was issued under another leadership epoch: a takeover leaves it no authority".into(),
        )
    } else if c.signer_principal != e.candidate_principal {
        (
            Category::NotOwner,
            format!(
                "the ACK was signed by {}, not by the candidate",
                c.signer_principal
            ),
        )
    } else if !o.open {
        (
            Category::Expired,
            "the candidate's recovery_deadline has passed (database time; equality is expired)"
                .into(),
        )
    } else if r.col::<String>("snapshot_now")? != e.failed_target_snapshot_digest {
        (
            Category::SnapshotChanged,
            "the failed target changed after the candidate's snapshot".into(),
        )
    } else {
        return Ok(None); // the candidate holds: the lane or the work is the reason
    };
    Ok(Some(u.reject(category, why).await?))
}

impl Store {
    /// Allocates a recovery candidate for work in recovery whose latest chain failed before
    /// activation: nothing but the candidate row (spec §6.3). A retried request (same
    /// `request_id`) returns the same candidate.
    pub async fn offer_recovery(
        &self,
        l: &Leader,
        assignment_id: &str,
        sel: &Selection,
        contracts_digest: &str,
        ttl_ms: i64,
        request_id: &str,
    ) -> Result<Offer, AuthorityError> {
        const OP: &str = "retarget-offer";
        let selection = serde_json::to_value(sel).map_err(|e| AuthorityError::Invariant {
            op: OP,
            detail: e.to_string(),
        })?;
        if !(1000..=600_000).contains(&ttl_ms) {
            return Err(super::error::reject(
                OP,
                Category::BadInput,
                "a recovery candidate lives 1 s to 10 min",
            ));
        }
        let selection_digest = sel.digest();
        let step = Step::new(
            OP,
            l,
            format!("retarget-offer/{request_id}"),
            request_digest(
                OP,
                &[
                    assignment_id,
                    &sel.lane_incarnation_id,
                    &selection_digest,
                    contracts_digest,
                ],
            ),
        )
        .about(Some(assignment_id), Some(&sel.lane_incarnation_id));
        let candidate = format!("rk-{}", uuid::Uuid::new_v4().simple());
        let challenge = format!(
            "rh-{}",
            crate::coordinator::secret::fence_salt()
                .map_err(|e| AuthorityError::Entropy(e.to_string()))?
        );
        let key = format!("retarget/{candidate}");
        let (assignment, lane_inc, contracts) = (
            assignment_id.to_string(),
            sel.lane_incarnation_id.clone(),
            contracts_digest.to_string(),
        );
        let (epoch, sot, ttl) = (l.epoch(), l.sot().to_string(), ttl_ms);
        let r = self
            .transition(
                &step,
                body!([assignment, lane_inc, contracts, candidate, challenge, key, selection, selection_digest, sot] |f| {
                    let d = f.cas(
                        concatcp!("WITH ev AS (", EVIDENCE, "), \
                              s0 AS (SELECT mosaic_failed_target_snapshot($1) AS snap, mosaic_failed_target_snapshot_digest($1) AS digest), \
                              s AS (SELECT s0.*, ", OPERATION, " AS operation FROM s0), \
                              e AS (SELECT ev.*, jsonb_build_object('reservation_id', ev.reservation_id, 'released_at', ev.released_at, \
                                      'end_chain', ev.end_chain, 'termination', ev.termination) AS evidence FROM ev) \
                         INSERT INTO recovery_candidates AS rc (recovery_candidate_id, recovery_handoff_challenge_id, idempotency_key, assignment_id, \
                                failed_reservation_id, failed_attempt_id, expected_retarget_operation, failed_target_snapshot, failed_target_snapshot_digest, \
                                objective_failure_evidence, objective_failure_evidence_digest, policy_selection, policy_selection_digest, \
                                candidate_principal, candidate_lane_id, candidate_lane_incarnation_id, scope_digest, holds_digest, contracts_digest, \
                                sot_incarnation, coordinator_epoch, issued_at, recovery_deadline) \
                         SELECT $2, $3, $4, a.assignment_id, t.reservation_id, t.assignment_attempt_id, \
                                s.operation, s.snap, s.digest, \
                                e.evidence, 'sha256:' || encode(sha256(convert_to('mosaic/objective-failure-evidence/v1' || chr(10) || e.evidence::text, 'UTF8')), 'hex'), \
                                $5::jsonb, $6, 'host:' || ln.host_id, ln.lane_id, li.lane_incarnation_id, a.scope_digest, a.holds_digest, $7, \
                                $8, $9, mosaic_ts(clock_timestamp()), mosaic_ts(clock_timestamp() + $10::bigint * interval '1 millisecond') \
                         FROM assignments a, reservations t, e, s, lane_incarnations li, lanes ln, lane_incarnations ti \
                         WHERE a.assignment_id = $1 AND ", RETARGETABLE, " \
                           AND t.reservation_id = e.reservation_id AND t.released_at IS NOT NULL AND NOT e.activated \
                           AND e.objective \
                           AND li.lane_incarnation_id = $11 AND li.retired_at IS NULL AND ln.lane_id = li.lane_id \
                           AND ti.lane_incarnation_id = t.lane_incarnation_id AND ti.lane_id <> li.lane_id \
                         RETURNING ", OFFER_COLUMNS),
                        &[&assignment, &candidate, &challenge, &key, &selection, &selection_digest, &contracts, &sot, &epoch, &ttl, &lane_inc],
                    ).await?;
                    let d = match d {
                        Ok(d) => d,
                        Err(u) => return Err(why_no_offer(u, &assignment, &lane_inc).await?),
                    };
                    let o = Offer::from_row(d.row())?;
                    d.decide(json!({ "recovery_candidate_id": candidate, "assignment_id": assignment,
                        "failed_reservation_id": o.failed_reservation_id,
                        "candidate_principal": o.challenge.facts.candidate_principal, "candidate_lane_id": o.candidate_lane_id,
                        "expected_retarget_operation": o.challenge.facts.expected_retarget_operation,
                        "failed_target_snapshot_digest": o.challenge.facts.failed_target_snapshot_digest,
                        "objective_failure_evidence_digest": o.challenge.facts.objective_failure_evidence_digest,
                        "policy_selection_digest": o.challenge.facts.policy_selection_digest,
                        "recovery_deadline": o.challenge.facts.recovery_deadline, "grants": "nothing" }))
                }),
            )
            .await?;
        let id = r.str("recovery_candidate_id")?;
        self.recovery_candidate(&id)
            .await?
            .ok_or_else(|| AuthorityError::Invariant {
                op: OP,
                detail: format!("candidate {id} offered and not found"),
            })
    }

    /// One candidate, as its row holds it.
    pub async fn recovery_candidate(&self, id: &str) -> Result<Option<Offer>, AuthorityError> {
        let c = self.pool.get().await?;
        let row = c
            .query_opt(
                concatcp!(
                    "SELECT ",
                    OFFER_COLUMNS,
                    " FROM recovery_candidates rc WHERE rc.recovery_candidate_id = $1"
                ),
                &[&id],
            )
            .await?;
        row.as_ref().map(Offer::from_row).transpose()
    }

    /// The reservation a consumed candidate's retarget made.
    pub async fn retarget_reservation(
        &self,
        candidate_id: &str,
    ) -> Result<Option<String>, AuthorityError> {
        let c = self.pool.get().await?;
        let row = c
            .query_opt(
                "SELECT retarget_reservation_id FROM recovery_candidates WHERE recovery_candidate_id = $1",
                &[&candidate_id],
            )
            .await?;
        Ok(row
            .map(|r| r.col::<Option<String>>("retarget_reservation_id"))
            .transpose()?
            .flatten())
    }

    /// Work in recovery whose latest chain failed before activation, with whether its
    /// failed lane can take it again now (the retarget policy moves it at once when not).
    pub async fn preactivation_failures(&self) -> Result<Vec<Stranded>, AuthorityError> {
        let gone_after: i64 = HOST_GONE_AFTER_MS;
        let c = self.pool.get().await?;
        let rows = c
            .query(
                concatcp!("SELECT a.assignment_id, li.lane_id, ln.host_id, \
                        (li.state = ", LaneState::Quarantined.sql(), " OR li.recreate_requested_at IS NOT NULL \
                         OR li.host_quarantine_reason IS NOT NULL OR li.retired_at IS NOT NULL) AS lane_unusable, \
                        coalesce((SELECT hs.closed_at IS NOT NULL AND hs.closed_at <= clock_timestamp() - $1::bigint * interval '1 millisecond' \
                                  FROM host_sessions hs WHERE hs.host_id = ln.host_id ORDER BY hs.session_epoch DESC LIMIT 1), false) AS host_gone \
                 FROM assignments a \
                 JOIN LATERAL (SELECT t.* FROM reservations t WHERE t.assignment_id = a.assignment_id \
                               ORDER BY t.created_at DESC, t.reservation_id DESC LIMIT 1) t ON true \
                 JOIN lane_incarnations li ON li.lane_incarnation_id = t.lane_incarnation_id JOIN lanes ln ON ln.lane_id = li.lane_id \
                 WHERE a.lifecycle = ", Lifecycle::Recovery.sql(), " AND a.work_status = ", WorkStatus::Active.sql(), " \
                   AND a.requested_outcome IS NULL AND t.released_at IS NOT NULL \
                   AND NOT EXISTS (SELECT 1 FROM transition_receipts tr WHERE tr.assignment_id = a.assignment_id \
                                   AND tr.transition = 'activate' AND tr.body->'chain'->>'reservation_id' = t.reservation_id)"),

                &[&gone_after],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Stranded {
                    assignment_id: r.col("assignment_id")?,
                    lane_id: r.col("lane_id")?,
                    host_id: r.col("host_id")?,
                    lane_unusable: r.col("lane_unusable")?,
                    host_gone: r.col("host_gone")?,
                })
            })
            .collect()
    }

    /// The work's newest ISSUED candidate of `epoch` whose deadline is still ahead.
    pub async fn open_recovery_candidate(
        &self,
        assignment_id: &str,
        epoch: i64,
    ) -> Result<Option<Offer>, AuthorityError> {
        let c = self.pool.get().await?;
        let row = c
            .query_opt(
                concatcp!(
                    "SELECT ",
                    OFFER_COLUMNS,
                    " FROM recovery_candidates rc \
                 WHERE rc.assignment_id = $1 AND rc.state = ",
                    CandidateState::Issued.sql(),
                    " AND rc.coordinator_epoch = $2 \
                   AND clock_timestamp() < rc.recovery_deadline::timestamptz \
                   AND rc.failed_target_snapshot_digest = mosaic_failed_target_snapshot_digest(rc.assignment_id) \
                 ORDER BY rc.issued_at DESC LIMIT 1"
                ),
                &[&assignment_id, &epoch],
            )
            .await?;
        row.as_ref().map(Offer::from_row).transpose()
    }

    /// Whether the work may be retargeted now, and from which failed lane: `None` when it
    /// is not a start that failed before activation (not in recovery nor a pre-transfer
    /// failure, or its latest chain ran), `Err` with the reason when it is one but may not
    /// be retargeted (and so must not be moved at all).
    pub async fn retarget_eligible(
        &self,
        assignment_id: &str,
    ) -> Result<Option<Result<String, String>>, AuthorityError> {
        let c = self.pool.get().await?;
        let Some(a) = c
            .query_opt(
                concatcp!("WITH s0 AS (SELECT mosaic_failed_target_snapshot($1) AS snap), s AS (SELECT s0.*, ", OPERATION, " AS operation FROM s0) \
                 SELECT ", RETARGETABLE, " AS retargetable, a.lifecycle = ", Lifecycle::Recovery.sql(), " AS in_recovery, \
                        a.work_status = ", WorkStatus::Active.sql(), " AND a.requested_outcome IS NULL AS open, s.operation, s.snap->>'lane_id' AS failed_lane \
                 FROM assignments a, s WHERE a.assignment_id = $1"),
                &[&assignment_id],
            )
            .await?
        else {
            return Ok(None);
        };
        let (retargetable, in_recovery, open): (bool, bool, bool) = (
            a.col("retargetable")?,
            a.col("in_recovery")?,
            a.col("open")?,
        );
        let operation: String = a.col("operation")?;
        if !retargetable {
            return Ok(match (in_recovery && open, operation.as_str()) {
                (true, "pre-transfer") => Some(Err("its failed target was a handoff's, never accepted, and its source has ended too: resume it (assign --resume)".into())),
                (true, _) => Some(Err("the work in recovery has no failed target to retarget from".into())),
                (false, _) => None,
            });
        }
        let Some(e) = c.query_opt(EVIDENCE, &[&assignment_id]).await? else {
            return Ok(Some(Err("the work has no chain to retarget from".into())));
        };
        if e.col::<Option<String>>("released_at")?.is_none() {
            return Ok(None); // its latest chain is still open: nothing failed
        }
        if e.col::<bool>("activated")? {
            return Ok(None); // its latest chain ran: not a start that failed
        }
        if !e.col::<bool>("objective")? {
            return Ok(Some(Err(
                "no objective failure evidence for its latest chain".into(),
            )));
        }
        Ok(Some(Ok(a
            .col::<Option<String>>("failed_lane")?
            .unwrap_or_default())))
    }
}

async fn why_no_offer(
    u: Undecided<'_>,
    assignment: &str,
    lane_inc: &str,
) -> Result<AuthorityError, AuthorityError> {
    let a = u
        .read_opt(
            concatcp!(
                "SELECT ",
                RETARGETABLE,
                " AS retargetable FROM assignments a, \
                   (SELECT s0.snap, ",
                OPERATION,
                " AS operation FROM (SELECT mosaic_failed_target_snapshot($1) AS snap) s0) s \
                 WHERE a.assignment_id = $1"
            ),
            &[&assignment],
        )
        .await?;
    let Some(a) = a else {
        return u
            .reject(Category::NotFound, format!("no assignment {assignment}"))
            .await;
    };
    if !a.col::<bool>("retargetable")? {
        return u
            .reject(
                Category::WrongState,
                "only work in recovery (with no end requested), or whose handoff target failed while its source still runs, can be retargeted",
            )
            .await;
    }
    let e = u.read_opt(EVIDENCE, &[&assignment]).await?;
    match e {
        None => return u.reject(Category::WrongState, "the work has no chain to retarget from").await,
        Some(e) if e.col::<bool>("activated")? => {
            return u
                .reject(Category::WrongState, "its latest chain was activated: retarget is for a start that failed before activation")
                .await
        }
        Some(e) if !e.col::<bool>("objective")? => {
            return u.reject(Category::WrongState, "no objective failure evidence (a receipt) for its latest chain").await
        }
        Some(_) => {}
    }
    let lane = u
        .read_opt("SELECT retired_at IS NOT NULL AS retired FROM lane_incarnations WHERE lane_incarnation_id = $1", &[&lane_inc])
        .await?;
    match lane {
        None => {
            u.reject(
                Category::NotFound,
                format!("no lane incarnation {lane_inc}"),
            )
            .await
        }
        Some(r) if r.col::<bool>("retired")? => {
            u.reject(
                Category::WrongState,
                "the candidate lane's incarnation was retired",
            )
            .await
        }
        Some(_) => {
            u.reject(
                Category::WrongState,
                "the candidate lane is the failed target's own lane",
            )
            .await
        }
    }
}
