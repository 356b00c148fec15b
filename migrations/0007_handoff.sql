-- Mosaic schema 7: responsibility handoff (spec §8.1), a protocol of its own.
--
-- A handoff is offered for RUNNING work to an idle target lane: the target gets a fresh
-- chain of its own (reservation, generation, contract), and once its contract injection is
-- recorded a single-use handoff challenge is minted for that generation. Only the target's
-- ACK of that challenge, binding every field below, moves responsibility — in one CAS that
-- also fences the source (leases revoked, reservation released, generation stopped). The
-- target still needs its own activation challenge and ACK before RUNNING or any lease:
-- the activation CAS demands `execution_owner IS NULL AND pending_target = target`, which
-- only an accepted handoff produces for a target chain.

CREATE TABLE handoffs (
    handoff_id text PRIMARY KEY,
    assignment_id text NOT NULL REFERENCES assignments,
    state text NOT NULL DEFAULT 'OFFERED' CHECK (state IN ('OFFERED', 'CHALLENGED', 'ACCEPTED', 'EXPIRED', 'WITHDRAWN')),
    -- The owner fields as they were at the offer: the ACK must bind exactly these.
    responsibility_owner text NOT NULL,
    execution_owner text NOT NULL,
    pending_target text NOT NULL,
    source_attempt_id text NOT NULL REFERENCES attempts,
    source_reservation_id text NOT NULL REFERENCES reservations,
    target_attempt_id text NOT NULL UNIQUE REFERENCES attempts,
    target_reservation_id text NOT NULL UNIQUE REFERENCES reservations,
    target_lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    next_action text NOT NULL,
    next_action_digest text NOT NULL,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    offered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The challenge exists only once the target's contract injection is recorded.
    challenge_id text UNIQUE,
    challenge_deadline timestamptz,
    challenge_epoch bigint,
    accepted_at timestamptz,
    ack_digest text,
    ack_body jsonb,
    CHECK ((state IN ('OFFERED')) = (challenge_id IS NULL) OR state IN ('EXPIRED', 'WITHDRAWN')),
    CHECK ((state = 'ACCEPTED') = (accepted_at IS NOT NULL AND ack_digest IS NOT NULL))
);
-- At most one open handoff per assignment.
CREATE UNIQUE INDEX one_open_handoff_per_assignment ON handoffs (assignment_id) WHERE state IN ('OFFERED', 'CHALLENGED');

-- An accepted handoff is evidence forever: nothing about it changes again.
CREATE FUNCTION mosaic_handoff_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR OLD.state IN ('ACCEPTED', 'EXPIRED', 'WITHDRAWN') THEN
        RAISE EXCEPTION 'mosaic: a decided handoff does not change';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER handoff_final BEFORE UPDATE OR DELETE ON handoffs FOR EACH ROW EXECUTE FUNCTION mosaic_handoff_final();
CREATE CONSTRAINT TRIGGER handoffs_requires_receipt AFTER INSERT OR UPDATE OR DELETE ON handoffs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mosaic_requires_receipt();

-- The target chain names its handoff.
ALTER TABLE reservations ADD COLUMN handoff_id text REFERENCES handoffs DEFERRABLE INITIALLY DEFERRED;

-- While a handoff is pending, the source still executes and the target is pending: both
-- owner fields are set, and only then.
ALTER TABLE assignments DROP CONSTRAINT assignments_check;
ALTER TABLE assignments ADD CONSTRAINT execution_or_pending
    CHECK (execution_owner IS NULL OR pending_target IS NULL OR work_status = 'handoff');

-- The work record follows the handoff too: once the pending target is cleared (the target
-- activated, or the work left ACTIVE) the work is no longer in handoff, and an open offer of
-- work that left ACTIVE is withdrawn in the same statement.
CREATE OR REPLACE FUNCTION mosaic_work_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.inactivity_policy IS DISTINCT FROM OLD.inactivity_policy THEN
        SELECT digest INTO NEW.inactivity_policy_digest FROM inactivity_policies WHERE policy_id = NEW.inactivity_policy;
    END IF;
    IF NEW.lifecycle IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
        NEW.work_status := 'done';
    ELSIF NEW.lifecycle = 'QUARANTINED' THEN
        NEW.work_status := 'blocked';
        NEW.blocker_code := 'quarantined';
        NEW.blocker_evidence_digest := coalesce(NEW.final_evidence_digest, NEW.requested_evidence_digest, NEW.blocker_evidence_digest);
    ELSIF TG_OP = 'UPDATE' AND OLD.work_status = 'done' THEN
        RAISE EXCEPTION 'mosaic: done work does not come back';
    ELSIF NEW.work_status = 'handoff' AND (NEW.pending_target IS NULL OR NEW.lifecycle <> 'ACTIVE') THEN
        NEW.work_status := 'active';
    END IF;
    IF NEW.work_status <> 'blocked' THEN
        NEW.blocker_code := NULL;
        NEW.blocker_evidence_digest := NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.lifecycle <> 'ACTIVE' THEN
        UPDATE handoffs SET state = 'WITHDRAWN' WHERE assignment_id = NEW.assignment_id AND state IN ('OFFERED', 'CHALLENGED');
    END IF;
    RETURN NEW;
END $$;
