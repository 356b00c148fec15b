-- Mosaic schema 8: continuations (spec §14 rule 11), a durable outbox/inbox.
--
-- PENDING → CLAIMED → DELIVERY_ACCEPTED → RESULT_RECORDED. A claim has a random reference,
-- the claimant's epoch, a database deadline and an attempt count; a claim past its deadline
-- or of an older epoch is reclaimed (a new reference), so a stale claimant's delivery is
-- refused at acceptance. Acceptance and the loop-budget debit are one transaction, before
-- the harness can see the prompt; a continuation is never delivered twice: one that was
-- accepted and whose generation ended is ABANDONED, never re-injected.

CREATE TABLE continuations (
    continuation_id text PRIMARY KEY,
    assignment_id text NOT NULL REFERENCES assignments,
    assignment_attempt_id text NOT NULL REFERENCES attempts,
    reservation_id text NOT NULL REFERENCES reservations,
    lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    generation bigint NOT NULL,
    next_action text NOT NULL CHECK (btrim(next_action) <> ''),
    next_action_digest text NOT NULL,
    scope_digest text NOT NULL,
    holds_digest text NOT NULL,
    contracts_digest text NOT NULL,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    state text NOT NULL DEFAULT 'PENDING'
        CHECK (state IN ('PENDING', 'CLAIMED', 'DELIVERY_ACCEPTED', 'RESULT_RECORDED', 'EXPIRED', 'ABANDONED')),
    expires_at timestamptz NOT NULL,
    claim_ref text UNIQUE,
    claimant_epoch bigint,
    claim_deadline timestamptz,
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 20),
    accepted_at timestamptz,
    budget_after integer,
    result_at timestamptz,
    result_evidence_digest text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((state IN ('PENDING')) OR claim_ref IS NOT NULL OR state IN ('EXPIRED')),
    CHECK ((state IN ('DELIVERY_ACCEPTED', 'RESULT_RECORDED', 'ABANDONED')) = (accepted_at IS NOT NULL)),
    CHECK ((state = 'RESULT_RECORDED') = (result_at IS NOT NULL))
);
CREATE UNIQUE INDEX one_open_continuation_per_assignment ON continuations (assignment_id)
    WHERE state IN ('PENDING', 'CLAIMED', 'DELIVERY_ACCEPTED');
CREATE INDEX continuations_open ON continuations (state) WHERE state IN ('PENDING', 'CLAIMED', 'DELIVERY_ACCEPTED');

-- The state machine, enforced here: only these moves, and a decided continuation is final.
CREATE FUNCTION mosaic_continuation_moves() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'mosaic: continuations are never deleted';
    END IF;
    IF NOT ((OLD.state, NEW.state) IN (('PENDING', 'CLAIMED'), ('CLAIMED', 'CLAIMED'), ('CLAIMED', 'DELIVERY_ACCEPTED'),
            ('DELIVERY_ACCEPTED', 'RESULT_RECORDED'), ('PENDING', 'EXPIRED'), ('CLAIMED', 'EXPIRED'),
            ('DELIVERY_ACCEPTED', 'ABANDONED'))) THEN
        RAISE EXCEPTION 'mosaic: continuation % cannot move from % to %', OLD.continuation_id, OLD.state, NEW.state;
    END IF;
    IF NEW.continuation_id <> OLD.continuation_id OR NEW.assignment_id <> OLD.assignment_id
       OR NEW.generation <> OLD.generation OR NEW.next_action <> OLD.next_action OR NEW.expires_at <> OLD.expires_at THEN
        RAISE EXCEPTION 'mosaic: a continuation''s binding does not change';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER continuation_moves BEFORE UPDATE OR DELETE ON continuations
    FOR EACH ROW EXECUTE FUNCTION mosaic_continuation_moves();
CREATE CONSTRAINT TRIGGER continuations_requires_receipt AFTER INSERT OR UPDATE OR DELETE ON continuations
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mosaic_requires_receipt();

-- The loop budget: continuations an assignment may still accept.
ALTER TABLE assignments ADD COLUMN continuation_budget integer NOT NULL DEFAULT 20 CHECK (continuation_budget >= 0);

-- When a generation ends, its open continuations end with it: never delivered afterwards,
-- and an accepted one is abandoned (its visibility is unknown; it is not re-injected).
CREATE FUNCTION mosaic_generation_ends_continuations() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'ENDED' OR (NEW.stop_requested_at IS NOT NULL AND OLD.stop_requested_at IS NULL) THEN
        UPDATE continuations SET state = 'EXPIRED'
         WHERE lane_incarnation_id = NEW.lane_incarnation_id AND generation = NEW.generation AND state IN ('PENDING', 'CLAIMED');
        UPDATE continuations SET state = 'ABANDONED'
         WHERE lane_incarnation_id = NEW.lane_incarnation_id AND generation = NEW.generation AND state = 'DELIVERY_ACCEPTED';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER generation_ends_continuations AFTER UPDATE OF state, stop_requested_at ON generations
    FOR EACH ROW EXECUTE FUNCTION mosaic_generation_ends_continuations();
