//! Every message type's field sets (required, optional, prohibited), its purpose, signer
//! roles and direction: the table envelopes are checked against.

use super::*;

use Kind::*;

use super::fields::*;

macro_rules! schema {
    ($t:ident, $wire:literal, $purpose:ident, $origin:ident, [$($req:expr),*], [$($opt:expr),*], [$($pro:expr),*]) => {
        Schema {
            message_type: MessageType::$t,
            version: concat!("mosaic.", $wire, ".v1"),
            purpose: Purpose::$purpose,
            origin: Role::$origin,
            required: &[$($req),*],
            optional: &[$($opt),*],
            prohibited: &[$($pro),*],
        }
    };
}

pub static SCHEMAS: [Schema; 41] = [
    // The coordinator's first frame on every connection: a fresh, single-use session id
    // (256 random bits) the host's hello must name. `issued_at` is the coordinator's
    // database time, from which the host estimates coordinator time for expiry checks.
    schema!(
        SessionChallenge,
        "session_challenge",
        Session,
        Coordinator,
        [COMMON, AUTHORITY_NULLABLE, ISSUED, &[("session_id", Str)]],
        [],
        []
    ),
    // The host's state again, on its live session, whenever it changes (the hello is
    // single-use: one per session, answering the session challenge).
    schema!(
        Report,
        "report",
        Session,
        Host,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[("session_id", Str), ("host_id", Str)]
        ],
        [
            ("lanes", StrList),
            ("runtimes", StrList),
            ("lane_states", Object)
        ],
        [NO_AUTHORITATIVE_TIME]
    ),
    schema!(
        Hello,
        "hello",
        Session,
        Host,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[("session_id", Str), ("host_id", Str)]
        ],
        // `lanes`: `lane@incarnation` of every live lane; `runtimes`: the `family@version`
        // entries of the host's registry; `lane_states`: per lane, the host's status and
        // its live generations (what the coordinator reconciles against).
        // `host_clock`: the host's own wall clock when it sent the hello, never an
        // authoritative time: the coordinator measures the host's offset with it.
        [
            ("lanes", StrList),
            ("runtimes", StrList),
            ("lane_states", Object),
            ("host_clock", Str)
        ],
        [NO_AUTHORITATIVE_TIME]
    ),
    schema!(
        Heartbeat,
        "heartbeat",
        Session,
        Host,
        [COMMON, AUTHORITY_NULLABLE, &[("session_id", Str)]],
        [],
        [NO_AUTHORITATIVE_TIME]
    ),
    schema!(
        Receipt,
        "receipt",
        Session,
        Host,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[
                ("session_id", Str),
                ("lane_id", Str),
                ("lane_incarnation_id", Str),
                ("generation", Uint),
                ("receipt_idempotency_key", Str),
                ("receipt", Object)
            ]
        ],
        [],
        [NO_AUTHORITATIVE_TIME]
    ),
    schema!(
        ReceiptAck,
        "receipt_ack",
        Session,
        Coordinator,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[("session_id", Str), ("receipt_idempotency_key", Str)]
        ],
        // `verdict`: `ingested`, or `retry:<category>` (send it again later) or
        // `refused:<category>` (never ingestible; kept aside by the host for an operator).
        [("verdict", Str)],
        [&["receipt"]]
    ),
    // The coordinator's answer to what a host reported: per lane, the generations to end
    // (stop, or fence as never started) and whether to recreate the lane — or, for an
    // elastic lane, to make it for its lease or destroy its incarnation. It can only take
    // authority away: a lane made for a lease holds none until a chain is activated on it.
    schema!(
        Reconcile,
        "reconcile",
        Session,
        Coordinator,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[("session_id", Str), ("lanes", Object)]
        ],
        [],
        [NO_AUTHORITATIVE_TIME]
    ),
    schema!(
        Stage,
        "stage",
        Ordinary,
        Coordinator,
        [
            COMMON,
            AUTHORITY,
            ISSUED,
            &[
                ("lane_id", Str),
                ("lane_incarnation_id", Str),
                ("assignment_attempt_id", Str),
                ("reservation_id", Str),
                ("reservation_epoch", Uint),
                ("reservation_deadline", Time),
                ("runtime_id", Str),
                ("generation", Uint),
                ("fence_proof", Str)
            ]
        ],
        // The assignment's workspace, when it works in a repository: all four or none.
        // `restore_*`: the checkpoint its workspace is restored from (the assignment's
        // latest), and its objects in the coordinator's store once uploaded.
        [
            ("repository", Str),
            ("repository_kind", Str),
            ("repository_source", Text),
            ("base_ref", Str),
            ("restore_checkpoint_digest", Digest),
            ("restore_commit_id", Str),
            ("restore_tree_id", Str),
            ("restore_host_id", Str),
            ("restore_base_commit_id", Str),
            ("restore_base_object", Digest),
            ("restore_base_size", Uint),
            ("restore_bundle_object", Digest),
            ("restore_bundle_size", Uint),
            // The repository's setup, when it has one: `setup_timeout_s` with either list.
            ("setup_copy", StrList),
            ("setup_commands", StrList),
            ("setup_timeout_s", Uint),
            // Whom the harness's artifact is encrypted to (`PRINCIPAL=age1…`); absent:
            // none is captured.
            ("artifact_recipients", StrList)
        ],
        [PRE_CONTRACT]
    ),
    schema!(
        Staged,
        "staged",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            &[
                ("lane_id", Str),
                ("lane_incarnation_id", Str),
                ("assignment_attempt_id", Str),
                ("reservation_id", Str),
                ("generation", Uint),
                ("fence_proof", Str),
                ("process_identity", ProcessIdentity)
            ]
        ],
        // The checkpoint the workspace was restored from (or found equal to), when the
        // stage named one: the activation binds it.
        [("restored_checkpoint_digest", Digest)],
        [PRE_CONTRACT, NO_AUTHORITATIVE_TIME]
    ),
    schema!(
        Contract,
        "contract",
        Ordinary,
        Coordinator,
        [COMMON, AUTHORITY, ORDINARY, ISSUED, &[("task_text", Text)]],
        [],
        [&["challenge_id", "lease_id", "effect_id"]]
    ),
    schema!(
        Injected,
        "injected",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            &[
                ("delivered_contracts_digest", Digest),
                ("process_identity", ProcessIdentity)
            ]
        ],
        [],
        [
            &["challenge_id", "lease_id", "effect_id"],
            NO_AUTHORITATIVE_TIME
        ]
    ),
    schema!(
        Challenge,
        "challenge",
        Ordinary,
        Coordinator,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            ISSUED,
            &[("challenge_id", Str)]
        ],
        [],
        [&["lease_id", "effect_id"]]
    ),
    schema!(
        Ack,
        "ack",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            &[("challenge_id", Str), ("process_identity", ProcessIdentity)]
        ],
        [],
        [&["lease_id", "effect_id"], NO_AUTHORITATIVE_TIME]
    ),
    // A RUNNING generation's progress: objective evidence (its kind, and the digest the
    // supervisor computed from it), never a self-claim. The coordinator counts each piece of
    // evidence once per assignment.
    schema!(
        Progress,
        "progress",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            &[("evidence_kind", Str), ("evidence_digest", Digest)]
        ],
        [("next_action", Str)],
        [
            &["lease_id", "effect_id", "challenge_id"],
            NO_AUTHORITATIVE_TIME
        ]
    ),
    // A RUNNING generation says it is blocked: a canonical code, the digest of its evidence
    // and the executable action that would unblock it.
    schema!(
        Blocked,
        "blocked",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            &[
                ("blocker_code", Str),
                ("blocker_evidence_digest", Digest),
                ("next_action", Str)
            ]
        ],
        // A block that ends by itself (a provider's rate limit): how long after its decision.
        [("resume_after_ms", Uint)],
        [
            &["lease_id", "effect_id", "challenge_id"],
            NO_AUTHORITATIVE_TIME
        ]
    ),
    // The target generation's handoff challenge (spec §8.1): minted only after its contract
    // injection was recorded. It is not an activation challenge and carries no `challenge_id`.
    schema!(
        HandoffChallenge,
        "handoff_challenge",
        Ordinary,
        Coordinator,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            ISSUED,
            HANDOFF_BOUND,
            &[("next_action", Str)]
        ],
        // Work in a repository: the checkpoint the target's workspace was restored from.
        [("checkpoint_digest", Digest)],
        [&["challenge_id", "lease_id", "effect_id"]]
    ),
    // The target's handoff ACK, binding every §8.1 field; it transfers responsibility only.
    schema!(
        HandoffAck,
        "handoff_ack",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            HANDOFF_BOUND,
            &[("process_identity", ProcessIdentity)]
        ],
        [("checkpoint_digest", Digest)],
        [
            &["challenge_id", "lease_id", "effect_id"],
            HANDOFF_ACK_NO_TIME
        ]
    ),
    // A continuation for the live generation (spec §14 rule 11), signed by the coordinator
    // for one claim. `phase` is `offer` (the host accepts it when the harness is settled)
    // or `accepted` (the acceptance is committed: make it visible, once).
    schema!(
        Continuation,
        "continuation",
        Ordinary,
        Coordinator,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            ISSUED,
            &[
                ("continuation_id", Str),
                ("claim_ref", Str),
                ("next_action", Str),
                ("next_action_digest", Digest),
                ("loop_budget", Uint),
                ("phase", Str),
                ("result_to", Str)
            ]
        ],
        [],
        [&["challenge_id", "lease_id", "effect_id"]]
    ),
    schema!(
        ContinuationAccept,
        "continuation_accept",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            &[
                ("continuation_id", Str),
                ("claim_ref", Str),
                ("next_action_digest", Digest),
                ("process_identity", ProcessIdentity)
            ]
        ],
        [],
        [
            &["challenge_id", "lease_id", "effect_id"],
            NO_AUTHORITATIVE_TIME
        ]
    ),
    schema!(
        ContinuationResult,
        "continuation_result",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            &[("continuation_id", Str), ("result_evidence_digest", Digest)]
        ],
        [],
        [
            &["challenge_id", "lease_id", "effect_id"],
            NO_AUTHORITATIVE_TIME
        ]
    ),
    schema!(
        Task,
        "task",
        Ordinary,
        Coordinator,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            ISSUED,
            &[("task_digest", Digest)]
        ],
        [],
        []
    ),
    schema!(
        Control,
        "control",
        Ordinary,
        Coordinator,
        [COMMON, AUTHORITY, ORDINARY, ISSUED, &[("control_op", Str)]],
        [("lease_id", Str)],
        []
    ),
    // An effect claim (spec §5.5): the host's broker asks the coordinator to admit one
    // protected effect of a RUNNING generation before dispatching it. The envelope's
    // idempotency key is the claim's; the lease is the coordinator's to find (one that
    // licenses the target), never the host's to name.
    schema!(
        Effect,
        "effect",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            &[
                ("effect_id", Str),
                ("executor", Str),
                ("target", Str),
                ("operation_digest", Digest),
                ("responsibility_owner", Str),
                ("execution_owner", Str),
                ("process_identity", ProcessIdentity)
            ]
        ],
        [],
        [&["lease_id", "challenge_id"], NO_AUTHORITATIVE_TIME]
    ),
    // What the broker observed of an admitted effect.
    schema!(
        EffectResult,
        "effect_result",
        Ordinary,
        Host,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            &[
                ("effect_id", Str),
                ("outcome", Str),
                ("result_digest", Digest)
            ]
        ],
        [("input_tokens", Uint), ("output_tokens", Uint)],
        [&["lease_id", "challenge_id"], NO_AUTHORITATIVE_TIME]
    ),
    // The coordinator's answer to a claim (admitted, settled before, refused) or to a
    // result (recorded, not recorded).
    schema!(
        EffectVerdict,
        "effect_verdict",
        Ordinary,
        Coordinator,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            ISSUED,
            &[("effect_id", Str), ("verdict", Str)]
        ],
        [
            ("category", Str),
            ("claim_state", Str),
            ("lease_id", Str),
            ("lease_epoch", Uint),
            ("result_digest", Digest)
        ],
        [&["challenge_id"]]
    ),
    schema!(
        Lease,
        "lease",
        Ordinary,
        Coordinator,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            ISSUED,
            &[("lease_id", Str), ("lease_epoch", Uint)]
        ],
        [],
        []
    ),
    schema!(
        Stop,
        "stop",
        Ordinary,
        Coordinator,
        [COMMON, AUTHORITY, ORDINARY, ISSUED, &[("stop_reason", Str)]],
        [],
        []
    ),
    schema!(
        Destroy,
        "destroy",
        Ordinary,
        Coordinator,
        [
            COMMON,
            AUTHORITY,
            ORDINARY,
            ISSUED,
            &[("destroy_reason", Str)]
        ],
        [],
        []
    ),
    schema!(
        RecoveryChallenge,
        "recovery_challenge",
        Recovery,
        Coordinator,
        [COMMON, AUTHORITY, RECOVERY_COMMON, &[("issued_at", Time)]],
        [],
        [RECOVERY_PROHIBITED, RECOVERY_ALT_BOUNDARIES]
    ),
    schema!(
        RecoveryAck,
        "recovery_ack",
        Recovery,
        Candidate,
        [
            COMMON,
            AUTHORITY,
            RECOVERY_COMMON,
            &[
                ("acknowledged_recovery_message_id", Str),
                ("acknowledged_recovery_challenge_digest", Digest)
            ]
        ],
        [],
        [
            RECOVERY_PROHIBITED,
            RECOVERY_ALT_BOUNDARIES,
            RECOVERY_ACK_NO_TIME
        ]
    ),
    // Checkpoint transfer (session plumbing: the message ids bind the session). A host
    // uploads the objects of a checkpoint it recorded — its bundle, and the bundle of the
    // base commit it is relative to — one part at a time, each answered by
    // `checkpoint_stored`; a host restoring a checkpoint its stage names fetches them one
    // part at a time, each answered by `checkpoint_data`. `data` is base64 of at most
    // 48 KiB; `offset` is where it starts in the object.
    schema!(
        CheckpointUpload,
        "checkpoint_upload",
        Session,
        Host,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[
                ("lane_incarnation_id", Str),
                ("generation", Uint),
                ("checkpoint_digest", Digest),
                ("role", Str),
                ("object_digest", Digest),
                ("object_size", Uint),
                ("offset", Uint),
                ("data", Str)
            ]
        ],
        // `base_commit_id`: with role `base`, the commit the bundle holds.
        [("base_commit_id", Str)],
        [NO_AUTHORITATIVE_TIME]
    ),
    // `verdict`: `more` (send the part at `received`), `stored` (the object is whole and
    // verified), `retry:<category>` (later) or `refused:<category>` (never).
    schema!(
        CheckpointStored,
        "checkpoint_stored",
        Session,
        Coordinator,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[
                ("object_digest", Digest),
                ("verdict", Str),
                ("received", Uint)
            ]
        ],
        [],
        [&["data"]]
    ),
    schema!(
        CheckpointFetch,
        "checkpoint_fetch",
        Session,
        Host,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[
                ("reservation_id", Str),
                ("object_digest", Digest),
                ("offset", Uint)
            ]
        ],
        [],
        [NO_AUTHORITATIVE_TIME, &["data"]]
    ),
    // `verdict`: `data` (with `object_size` and `data`), or `refused:<category>`.
    schema!(
        CheckpointData,
        "checkpoint_data",
        Session,
        Coordinator,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[
                ("object_digest", Digest),
                ("offset", Uint),
                ("verdict", Str)
            ]
        ],
        [("object_size", Uint), ("data", Str)],
        []
    ),
    // A handoff of work in a repository: the source generation's workspace is held
    // read-only and checkpointed, under the source chain's authority (spec §8.1).
    schema!(
        HandoffCheckpoint,
        "handoff_checkpoint",
        Ordinary,
        Coordinator,
        [COMMON, AUTHORITY, ORDINARY, ISSUED, &[("handoff_id", Str)]],
        [],
        [&["challenge_id", "lease_id", "effect_id"]]
    ),
    // A checkpoint of a live generation's workspace, for a handoff (`handoff_id`: the
    // source host's answer) or because its harness asked (`request_seq`: its number in
    // the generation); exactly one of the two. The checkpoint it took (`repository`,
    // `commit_id`, `tree_id`; the coordinator derives the digest; `inputs_digest` when the
    // host recorded what the workspace was made from) or why it took none (`error`).
    schema!(
        CheckpointTaken,
        "checkpoint_taken",
        Ordinary,
        Host,
        [COMMON, AUTHORITY, ORDINARY],
        [
            ("handoff_id", Str),
            ("request_seq", Uint),
            ("repository", Str),
            ("commit_id", Str),
            ("tree_id", Str),
            ("inputs_digest", Digest),
            ("error", Text)
        ],
        [
            &["challenge_id", "lease_id", "effect_id"],
            NO_AUTHORITATIVE_TIME
        ]
    ),
    // Releasing a host's copy of done work (session plumbing). `step`: `ask` (with
    // `tree_id` and `checkpoint_digest` together: the tree the host's workspace holds now
    // and the checkpoint it says has it; neither when only checkpoint refs are left) or
    // `done` (with `refs_removed`). The answer's `verdict`: `release` (to an ask),
    // `recorded` (to a done), `keep:<category>` or `retry:<category>`.
    schema!(
        WorkspaceRelease,
        "workspace_release",
        Session,
        Host,
        [COMMON, AUTHORITY_NULLABLE, &[("step", Str)]],
        [
            ("tree_id", Str),
            ("checkpoint_digest", Digest),
            ("refs_removed", Uint)
        ],
        [NO_AUTHORITATIVE_TIME]
    ),
    schema!(
        WorkspaceReleaseAnswer,
        "workspace_release_answer",
        Session,
        Coordinator,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[("step", Str), ("verdict", Str)]
        ],
        [],
        []
    ),
    // Handing done work's branch on (session plumbing; the authority is the effect's row,
    // admitted by a CAS). The order: `kind` (`push` or `merge`), the repository, the ref it
    // updates, and the work's final checkpoint with where its bytes are (`restore_*`).
    schema!(
        WorkspaceOrder,
        "workspace_order",
        Session,
        Coordinator,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[
                ("effect_id", Str),
                ("kind", Str),
                ("repository", Str),
                ("reference", Str),
                ("restore_checkpoint_digest", Digest),
                ("restore_commit_id", Str),
                ("restore_tree_id", Str),
                ("restore_host_id", Str)
            ]
        ],
        [
            ("restore_base_commit_id", Str),
            ("restore_base_object", Digest),
            ("restore_base_size", Uint),
            ("restore_bundle_object", Digest),
            ("restore_bundle_size", Uint)
        ],
        []
    ),
    // The host's side: `step` `claim` (the exact update: `old_id`, `new_id`,
    // `operation_digest`) or `settle` (`outcome`, `result_digest`, and `detail`).
    schema!(
        WorkspaceEffect,
        "workspace_effect",
        Session,
        Host,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[("effect_id", Str), ("step", Str)]
        ],
        [
            ("old_id", Str),
            ("new_id", Str),
            ("operation_digest", Digest),
            ("outcome", Str),
            ("result_digest", Digest),
            ("detail", Text)
        ],
        [NO_AUTHORITATIVE_TIME]
    ),
    // Its answer: `verdict` `admitted` (to a claim, with the `operation_digest` admitted and
    // `dispatch_within_ms`, the window it has left), `recorded` (to a settle),
    // `refused:<category>` or `retry:<category>`.
    schema!(
        WorkspaceEffectAnswer,
        "workspace_effect_answer",
        Session,
        Coordinator,
        [
            COMMON,
            AUTHORITY_NULLABLE,
            &[("effect_id", Str), ("step", Str), ("verdict", Str)]
        ],
        [("operation_digest", Digest), ("dispatch_within_ms", Uint)],
        []
    ),
];

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
