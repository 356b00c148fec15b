-- Mosaic schema 31: preactivation retarget through recovery candidates (spec §6.3, §7.3-§7.5).
--
-- Work whose target T failed before activation (its chain ended by a fenced transition on
-- objective evidence, so the work is in RECOVERY) moves to another lane U only through
-- this protocol: the coordinator allocates a candidate row — and nothing else — binding
-- the exact failed-target snapshot, the evidence, the selection, and one database-rendered
-- `recovery_deadline`; the candidate host answers the signed challenge with a signed ACK;
-- one reservation CAS consumes the ACK and allocates U's fresh attempt, reservation and
-- fence in the same commit. A candidate grants nothing by itself.

-- The canonical failed-target snapshot of an assignment: every mutable preactivation fact
-- of its latest chain (T), each as a value or an explicit null. Computed by the same
-- function when the candidate is allocated and inside the retarget CAS, so "any T mutation
-- after the snapshot changes a bound value" is a comparison of two outputs of one
-- function. It reads no clock, only rows. (`to_jsonb` renders the work row's few
-- timestamps in the session's TimeZone, the same on every coordinator connection; were it
-- not, the two digests would differ and the retarget would be refused, never admitted.)
-- It names T's facts, not the source's or the lane's: a running source's progress, its
-- watchdog step and T's old lane's state (which another work may take) are left out.
CREATE FUNCTION mosaic_failed_target_snapshot(p_assignment text) RETURNS jsonb LANGUAGE sql STABLE AS $$
    WITH a AS (SELECT * FROM assignments WHERE assignment_id = p_assignment),
         r AS (SELECT * FROM reservations WHERE assignment_id = p_assignment
               ORDER BY created_at DESC, reservation_id DESC LIMIT 1),
         li AS (SELECT li.* FROM lane_incarnations li, r WHERE li.lane_incarnation_id = r.lane_incarnation_id),
         g AS (SELECT g.* FROM generations g, r WHERE g.lane_incarnation_id = r.lane_incarnation_id AND g.generation = r.generation),
         c AS (SELECT c.* FROM challenges c, r WHERE c.reservation_id = r.reservation_id),
         ak AS (SELECT ak.* FROM ack_receipts ak, r WHERE ak.reservation_id = r.reservation_id),
         -- The handoff whose target T was (pre-transfer: not accepted; post-transfer: accepted).
         h AS (SELECT h.* FROM handoffs h, r WHERE h.target_reservation_id = r.reservation_id),
         act AS (SELECT tr.receipt_id FROM transition_receipts tr, r
                 WHERE tr.transition = 'activate' AND tr.assignment_id = p_assignment
                   AND tr.body->'chain'->>'reservation_id' = r.reservation_id)
    SELECT jsonb_build_object(
        'lifecycle_substate', (SELECT a.lifecycle || '/' || a.work_status FROM a),
        'responsibility_owner', (SELECT responsibility_owner FROM a),
        'execution_owner', (SELECT execution_owner FROM a),
        'pending_target', (SELECT pending_target FROM a),
        'assignment_id', (SELECT assignment_id FROM a),
        'source_assignment_attempt_id', (SELECT source_attempt_id FROM h),
        'handoff_receipt_digest', (SELECT ack_digest FROM h WHERE h.state = 'ACCEPTED'),
        'failed_target_attempt_id', (SELECT assignment_attempt_id FROM r),
        'failed_target_generation', (SELECT generation FROM r),
        'lane_id', (SELECT lane_id FROM li),
        'lane_incarnation_id', (SELECT lane_incarnation_id FROM r),
        'reservation_id', (SELECT reservation_id FROM r),
        'reservation_epoch', (SELECT reservation_epoch FROM r),
        'reservation_lease_id', (SELECT reservation_lease_id FROM r),
        'reservation_deadline', (SELECT mosaic_ts(deadline) FROM r),
        'challenge_id', (SELECT challenge_id FROM c),
        'challenge_consumption_state', CASE
            WHEN NOT EXISTS (SELECT 1 FROM c) THEN 'unissued'
            WHEN EXISTS (SELECT 1 FROM ak) THEN 'consumed'
            WHEN (SELECT released_at FROM r) IS NOT NULL THEN 'invalidated'
            ELSE 'unconsumed' END,
        'ack_receipt_digest', (SELECT ack_digest FROM ak),
        'ready_state', CASE WHEN EXISTS (SELECT 1 FROM ak) THEN 'READY' END,
        'fence_reference_digest', (SELECT 'sha256:' || encode(sha256(convert_to('mosaic/fence-reference/v1' || fence_digest, 'UTF8')), 'hex') FROM r),
        'outbox_state_digest', (SELECT 'sha256:' || encode(sha256(convert_to(coalesce(jsonb_agg(jsonb_build_array(k.continuation_id, k.state, k.attempts)
                                     ORDER BY k.continuation_id)::text, '[]'), 'UTF8')), 'hex')
                                FROM continuations k, r WHERE k.reservation_id = r.reservation_id),
        'inbox_state_digest', (SELECT 'sha256:' || encode(sha256(convert_to(coalesce(jsonb_agg(jsonb_build_array(p.progress_id, p.evidence_digest)
                                     ORDER BY p.progress_id)::text, '[]'), 'UTF8')), 'hex')
                               FROM progress_receipts p, r WHERE p.reservation_id = r.reservation_id),
        'continuation_state_digest', (SELECT 'sha256:' || encode(sha256(convert_to(coalesce(jsonb_agg(jsonb_build_array(k.continuation_id,
                                          k.claimant_epoch, mosaic_ts(k.accepted_at), mosaic_ts(k.result_at)) ORDER BY k.continuation_id)::text, '[]'), 'UTF8')), 'hex')
                                      FROM continuations k, r WHERE k.reservation_id = r.reservation_id),
        'activation_idempotency_identity', (SELECT receipt_id FROM act),
        'all_other_mutable_preactivation_fields_digest', (SELECT 'sha256:' || encode(sha256(convert_to(jsonb_build_array(
                -- The work's row without what a pre-transfer source, still running, moves
                -- by itself (its progress and inactivity clock, its continuation budget).
                (SELECT to_jsonb(a) - 'scope' - 'holds' - 'last_progress_at' - 'inactivity_base_at'
                        - 'inactivity_deadline' - 'continuation_budget' - 'watchdog_step' FROM a),
                (SELECT h.state FROM h),
                (SELECT mosaic_ts(released_at) FROM r), (SELECT contracts_digest FROM r), (SELECT process_identity FROM r),
                (SELECT state FROM g),
                (SELECT count(*) FROM reservations rx WHERE rx.assignment_id = p_assignment))::text, 'UTF8')), 'hex'))
    )
$$;

CREATE FUNCTION mosaic_failed_target_snapshot_digest(p_assignment text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT 'sha256:' || encode(sha256(convert_to('mosaic/failed-target-snapshot/v1' || chr(10)
                                                 || mosaic_failed_target_snapshot(p_assignment)::text, 'UTF8')), 'hex')
$$;

CREATE TABLE recovery_candidates (
    recovery_candidate_id text PRIMARY KEY CHECK (recovery_candidate_id ~ '^rk-[0-9a-f]{32}$'),
    recovery_handoff_challenge_id text NOT NULL UNIQUE CHECK (recovery_handoff_challenge_id ~ '^rh-[0-9a-f]{64}$'),
    idempotency_key text NOT NULL UNIQUE,
    assignment_id text NOT NULL REFERENCES assignments,
    -- The failed target: the chain the snapshot was taken of.
    failed_reservation_id text NOT NULL REFERENCES reservations,
    failed_attempt_id text NOT NULL REFERENCES attempts,
    expected_retarget_operation text NOT NULL CHECK (expected_retarget_operation IN ('initial', 'pre-transfer', 'post-transfer')),
    failed_target_snapshot jsonb NOT NULL,
    failed_target_snapshot_digest text NOT NULL CHECK (failed_target_snapshot_digest ~ '^sha256:[0-9a-f]{64}$'),
    objective_failure_evidence jsonb NOT NULL,
    objective_failure_evidence_digest text NOT NULL CHECK (objective_failure_evidence_digest ~ '^sha256:[0-9a-f]{64}$'),
    policy_selection jsonb NOT NULL,
    policy_selection_digest text NOT NULL CHECK (policy_selection_digest ~ '^sha256:[0-9a-f]{64}$'),
    -- U: the principal that must sign the ACK, and (coordinator-side only, never in an
    -- envelope) the lane the selection chose.
    candidate_principal text NOT NULL CHECK (candidate_principal ~ '^host:'),
    candidate_lane_id text NOT NULL REFERENCES lanes,
    candidate_lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    scope_digest text NOT NULL,
    holds_digest text NOT NULL,
    contracts_digest text NOT NULL,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    issued_at text NOT NULL,
    -- The one canonical rendering of the deadline, written once by the database; the
    -- envelopes, the ACK and the CAS compare this text and nothing derived from it.
    recovery_deadline text NOT NULL,
    state text NOT NULL DEFAULT 'ISSUED' CHECK (state IN ('ISSUED', 'CONSUMED', 'INVALIDATED')),
    ack_message_id text,
    ack_digest text,
    received_at timestamptz,
    consumed_at timestamptz,
    retarget_reservation_id text UNIQUE REFERENCES reservations,
    invalidated_reason text,
    CHECK ((state = 'CONSUMED') = (consumed_at IS NOT NULL AND received_at IS NOT NULL AND ack_digest IS NOT NULL
                                  AND ack_message_id IS NOT NULL AND retarget_reservation_id IS NOT NULL)),
    CHECK ((state = 'INVALIDATED') = (invalidated_reason IS NOT NULL)),
    CHECK (recovery_deadline::timestamptz > issued_at::timestamptz)
);
-- At most one recovery ACK is ever consumed for one failed target: two candidates racing
-- for the same snapshot cannot both allocate a chain.
CREATE UNIQUE INDEX one_retarget_per_failed_target ON recovery_candidates (failed_reservation_id) WHERE state = 'CONSUMED';
CREATE INDEX recovery_candidates_open ON recovery_candidates (assignment_id) WHERE state = 'ISSUED';

-- A candidate's bound facts never change; it moves once, from ISSUED, and never back.
CREATE FUNCTION mosaic_recovery_candidate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'mosaic: a recovery candidate is a record; it is never deleted';
    END IF;
    IF OLD.state <> 'ISSUED' THEN
        RAISE EXCEPTION 'mosaic: a % recovery candidate does not change', OLD.state;
    END IF;
    IF (to_jsonb(NEW) - ARRAY['state', 'ack_message_id', 'ack_digest', 'received_at', 'consumed_at',
                             'retarget_reservation_id', 'invalidated_reason'])
       IS DISTINCT FROM
       (to_jsonb(OLD) - ARRAY['state', 'ack_message_id', 'ack_digest', 'received_at', 'consumed_at',
                             'retarget_reservation_id', 'invalidated_reason']) THEN
        RAISE EXCEPTION 'mosaic: a recovery candidate keeps every fact it was issued with';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER recovery_candidate_record BEFORE UPDATE OR DELETE ON recovery_candidates
    FOR EACH ROW EXECUTE FUNCTION mosaic_recovery_candidate();
CREATE CONSTRAINT TRIGGER recovery_candidates_requires_receipt AFTER INSERT OR UPDATE OR DELETE ON recovery_candidates
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mosaic_requires_receipt();

-- T's attempt, once retargeted: RETARGETED_FENCED, naming the candidate that replaced it.
ALTER TABLE attempts ADD COLUMN retargeted_by text REFERENCES recovery_candidates;
