-- Mosaic schema 14: effect claims (spec §5.5).
--
-- Every protected effect a generation makes — a provider request, an egress connection, a
-- push — goes through its host's broker, and the broker dispatches it only after one
-- fenced compare-and-swap has admitted a claim here. A claim binds the whole authority it
-- was admitted under (timeline, epoch, lease and lease epoch, both owner fields,
-- assignment, attempt, lane, incarnation, generation, process identity, fence reference,
-- scope and holds digests) and the digest of the exact operation. Its idempotency key is
-- bound to that digest for good: the same key with the same digest is the same claim; the
-- same key with another digest is refused (and the lane quarantined by the caller).
--
-- ADMITTED → COMPLETED | FAILED | ABORTED | NOT_DISPATCHED: what the broker observed.
-- ADMITTED → UNKNOWN: nobody observed it (the broker died with it) and its sink cannot
--            be reconciled by rule: it waits for its reconciliation owner.
-- ADMITTED | UNKNOWN → RECONCILED: by rule at the generation's end (a provider call), by a
--            late observation, or by the owner (`mosaic effect resolve`).

CREATE TABLE effect_claims (
    effect_id text PRIMARY KEY CHECK (effect_id ~ '^ef-[0-9a-f]{32}$'),
    idempotency_key text NOT NULL CHECK (idempotency_key ~ '^[A-Za-z0-9._:/-]{1,200}$'),
    operation_digest text NOT NULL CHECK (operation_digest ~ '^sha256:[0-9a-f]{64}$'),
    executor text NOT NULL CHECK (executor IN ('provider', 'egress', 'push')),
    sink_class text NOT NULL
        CHECK (sink_class IN ('transactional', 'sink-idempotent', 'reconcilable', 'non-retryable-on-ambiguity')),
    target text NOT NULL,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    lease_id text NOT NULL REFERENCES leases,
    lease_epoch bigint NOT NULL,
    responsibility_owner text NOT NULL CHECK (btrim(responsibility_owner) <> ''),
    execution_owner text NOT NULL CHECK (btrim(execution_owner) <> ''),
    assignment_id text NOT NULL REFERENCES assignments,
    assignment_attempt_id text NOT NULL REFERENCES attempts,
    lane_id text NOT NULL REFERENCES lanes,
    lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    generation bigint NOT NULL,
    reservation_id text NOT NULL REFERENCES reservations,
    process_identity_digest text NOT NULL,
    fence_reference text NOT NULL,
    scope_digest text NOT NULL,
    holds_digest text NOT NULL,
    state text NOT NULL DEFAULT 'ADMITTED'
        CHECK (state IN ('ADMITTED', 'COMPLETED', 'FAILED', 'ABORTED', 'NOT_DISPATCHED', 'UNKNOWN', 'RECONCILED')),
    result_digest text CHECK (result_digest ~ '^sha256:[0-9a-f]{64}$'),
    input_tokens bigint CHECK (input_tokens >= 0),
    output_tokens bigint CHECK (output_tokens >= 0),
    reconciliation text,
    reconciliation_owner text,
    admitted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    resolved_at timestamptz,
    FOREIGN KEY (lane_incarnation_id, generation) REFERENCES generations (lane_incarnation_id, generation),
    UNIQUE (assignment_id, idempotency_key),
    -- Open exactly while ADMITTED or UNKNOWN.
    CHECK ((state IN ('ADMITTED', 'UNKNOWN')) = (resolved_at IS NULL)),
    -- An unknown outcome always has someone to resolve it; a reconciliation says how.
    CHECK (state <> 'UNKNOWN' OR reconciliation_owner IS NOT NULL),
    CHECK ((state = 'RECONCILED') = (reconciliation IS NOT NULL)),
    -- What a broker observed carries the digest of what it observed.
    CHECK (state NOT IN ('COMPLETED', 'FAILED', 'ABORTED', 'NOT_DISPATCHED') OR result_digest IS NOT NULL)
);
CREATE INDEX effect_claims_open ON effect_claims (assignment_id) WHERE state IN ('ADMITTED', 'UNKNOWN');
CREATE INDEX effect_claims_generation ON effect_claims (lane_incarnation_id, generation);

-- The state machine and the binding, enforced here: only these moves, never a delete, and
-- nothing a claim was admitted under ever changes.
CREATE FUNCTION mosaic_effect_claim_moves() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'mosaic: effect claims are never deleted';
    END IF;
    IF NOT ((OLD.state, NEW.state) IN (('ADMITTED', 'COMPLETED'), ('ADMITTED', 'FAILED'), ('ADMITTED', 'ABORTED'),
            ('ADMITTED', 'NOT_DISPATCHED'), ('ADMITTED', 'UNKNOWN'), ('ADMITTED', 'RECONCILED'),
            ('UNKNOWN', 'RECONCILED'))) THEN
        RAISE EXCEPTION 'mosaic: effect claim % cannot move from % to %', OLD.effect_id, OLD.state, NEW.state;
    END IF;
    IF (NEW.effect_id, NEW.idempotency_key, NEW.operation_digest, NEW.executor, NEW.sink_class, NEW.target,
        NEW.sot_incarnation, NEW.coordinator_epoch, NEW.lease_id, NEW.lease_epoch, NEW.responsibility_owner,
        NEW.execution_owner, NEW.assignment_id, NEW.assignment_attempt_id, NEW.lane_id, NEW.lane_incarnation_id,
        NEW.generation, NEW.reservation_id, NEW.process_identity_digest, NEW.fence_reference, NEW.scope_digest,
        NEW.holds_digest, NEW.admitted_at)
       IS DISTINCT FROM
       (OLD.effect_id, OLD.idempotency_key, OLD.operation_digest, OLD.executor, OLD.sink_class, OLD.target,
        OLD.sot_incarnation, OLD.coordinator_epoch, OLD.lease_id, OLD.lease_epoch, OLD.responsibility_owner,
        OLD.execution_owner, OLD.assignment_id, OLD.assignment_attempt_id, OLD.lane_id, OLD.lane_incarnation_id,
        OLD.generation, OLD.reservation_id, OLD.process_identity_digest, OLD.fence_reference, OLD.scope_digest,
        OLD.holds_digest, OLD.admitted_at) THEN
        RAISE EXCEPTION 'mosaic: an effect claim''s binding does not change';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER effect_claim_moves BEFORE UPDATE OR DELETE ON effect_claims
    FOR EACH ROW EXECUTE FUNCTION mosaic_effect_claim_moves();
CREATE CONSTRAINT TRIGGER effect_claims_requires_receipt AFTER INSERT OR UPDATE OR DELETE ON effect_claims
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mosaic_requires_receipt();
