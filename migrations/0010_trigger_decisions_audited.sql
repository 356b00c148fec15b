-- Decisions the database makes by itself (triggers) leave a row an operator can see: an
-- `audit` row with operation 'derived', category the trigger's name, and the subject in
-- the detail. They are written in the same transaction as the change that caused them, so
-- a transition that rolls back leaves none. (ARCHITECTURE.md lists these decision points.)

CREATE FUNCTION mosaic_audit_derived(p_trigger text, p_assignment text, p_lane_incarnation text, p_detail text)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO audit (operation, category, coordinator_epoch, assignment_id, lane_incarnation_id, detail)
    VALUES ('derived', p_trigger, (SELECT epoch FROM leadership), p_assignment, p_lane_incarnation, p_detail);
$$;

-- The work record derived from the lifecycle (migrations 0006, 0007), now recording each
-- status it derives and each handoff offer it withdraws.
CREATE OR REPLACE FUNCTION mosaic_work_record() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    asked text := NEW.work_status;
    withdrawn integer;
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
    IF TG_OP = 'UPDATE' AND NEW.work_status IS DISTINCT FROM asked AND NEW.work_status IS DISTINCT FROM OLD.work_status THEN
        PERFORM mosaic_audit_derived('work-record', NEW.assignment_id, NEW.lane_incarnation_id,
            'work status ' || OLD.work_status || ' -> ' || NEW.work_status || ' (lifecycle ' || NEW.lifecycle || ')');
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.lifecycle <> 'ACTIVE' THEN
        UPDATE handoffs SET state = 'WITHDRAWN' WHERE assignment_id = NEW.assignment_id AND state IN ('OFFERED', 'CHALLENGED');
        GET DIAGNOSTICS withdrawn = ROW_COUNT;
        IF withdrawn > 0 THEN
            PERFORM mosaic_audit_derived('handoff-withdrawn', NEW.assignment_id, NEW.lane_incarnation_id,
                'open handoff offer withdrawn: the work left ACTIVE (lifecycle ' || NEW.lifecycle || ')');
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- A generation's end ends its open continuations (migration 0008), now recorded.
CREATE OR REPLACE FUNCTION mosaic_generation_ends_continuations() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    IF NEW.state = 'ENDED' OR (NEW.stop_requested_at IS NOT NULL AND OLD.stop_requested_at IS NULL) THEN
        FOR c IN UPDATE continuations SET state = 'EXPIRED'
                  WHERE lane_incarnation_id = NEW.lane_incarnation_id AND generation = NEW.generation AND state IN ('PENDING', 'CLAIMED')
                  RETURNING continuation_id, assignment_id LOOP
            PERFORM mosaic_audit_derived('generation-ended', c.assignment_id, NEW.lane_incarnation_id,
                'continuation ' || c.continuation_id || ' expired undelivered: generation ' || NEW.generation || ' ended or is stopping');
        END LOOP;
        FOR c IN UPDATE continuations SET state = 'ABANDONED'
                  WHERE lane_incarnation_id = NEW.lane_incarnation_id AND generation = NEW.generation AND state = 'DELIVERY_ACCEPTED'
                  RETURNING continuation_id, assignment_id LOOP
            PERFORM mosaic_audit_derived('generation-ended', c.assignment_id, NEW.lane_incarnation_id,
                'continuation ' || c.continuation_id || ' abandoned after acceptance: generation ' || NEW.generation || ' ended or is stopping');
        END LOOP;
    END IF;
    RETURN NEW;
END $$;

-- A handoff target's chain released before its ACK hands the work back (migration 0009),
-- now recorded.
CREATE OR REPLACE FUNCTION mosaic_target_released() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE target text;
BEGIN
    IF NEW.released_at IS NOT NULL AND OLD.released_at IS NULL AND NEW.handoff_id IS NOT NULL THEN
        UPDATE handoffs SET state = 'EXPIRED'
         WHERE handoff_id = NEW.handoff_id AND state IN ('OFFERED', 'CHALLENGED')
        RETURNING pending_target INTO target;
        IF FOUND THEN
            UPDATE assignments a SET pending_target = NULL, work_status = 'active', watchdog_step = 'none',
                   inactivity_base_at = clock_timestamp(),
                   inactivity_deadline = clock_timestamp() + p.replace_after_ms * interval '1 millisecond',
                   next_action = 'run the task under its contract (the handoff to ' || target || ' ended before its ACK)'
              FROM inactivity_policies p
             WHERE a.assignment_id = NEW.assignment_id AND a.work_status = 'handoff' AND p.policy_id = a.inactivity_policy;
            PERFORM mosaic_audit_derived('handoff-target-released', NEW.assignment_id, NEW.lane_incarnation_id,
                'handoff ' || NEW.handoff_id || ' to ' || target || ' expired: its target chain ended before the ACK; the work is back with its source');
        END IF;
    END IF;
    RETURN NULL;
END $$;
