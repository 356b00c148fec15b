-- Mosaic schema 9: closing the gaps an outside review found in schemas 6–8.
--
-- 1. Work that was unfinished before schema 6 gets its inactivity clock now (database
--    time), so its progress can count and the watchdog sees it.
-- 2. A handoff's target chain can be ended by anything that releases its reservation
--    (expiry, a dead target generation, a quarantine, a lane recreate, a takeover): the
--    release itself expires the open offer and hands the work back to its source, with a
--    fresh inactivity period (progress was refused while the offer was open). No code path
--    can forget to.

ALTER TABLE assignments DISABLE TRIGGER assignments_requires_receipt;
UPDATE assignments a SET inactivity_base_at = clock_timestamp(),
       inactivity_deadline = clock_timestamp() + p.replace_after_ms * interval '1 millisecond'
  FROM inactivity_policies p
 WHERE p.policy_id = a.inactivity_policy AND a.work_status <> 'done' AND a.inactivity_deadline IS NULL;
ALTER TABLE assignments ENABLE TRIGGER assignments_requires_receipt;

CREATE FUNCTION mosaic_target_released() RETURNS trigger LANGUAGE plpgsql AS $$
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
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER target_released AFTER UPDATE OF released_at ON reservations
    FOR EACH ROW EXECUTE FUNCTION mosaic_target_released();
