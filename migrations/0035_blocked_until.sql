-- Work blocked until a known time (issue 23: a provider's rate limit): the database time at
-- which the watchdog resumes it without an operator. Decided at primary database time from
-- the duration the host reports (never a host clock's timestamp).
ALTER TABLE assignments ADD COLUMN blocked_until timestamptz;

-- Only blocked work waits for a time: any other status clears it. Named to run after
-- `work_record` (BEFORE triggers fire in name order), which settles the status first.
-- Another block (other evidence: a quarantine, an operator's block, an ending's) set by a
-- statement that does not name the time does not inherit it either.
CREATE FUNCTION mosaic_blocked_until() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.work_status <> 'blocked' THEN
        NEW.blocked_until := NULL;
    ELSIF TG_OP = 'UPDATE' AND NEW.blocker_evidence_digest IS DISTINCT FROM OLD.blocker_evidence_digest
          AND NEW.blocked_until IS NOT DISTINCT FROM OLD.blocked_until THEN
        NEW.blocked_until := NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER work_record_until BEFORE INSERT OR UPDATE ON assignments
    FOR EACH ROW EXECUTE FUNCTION mosaic_blocked_until();

ALTER TABLE assignments ADD CONSTRAINT blocked_until_only_while_blocked
    CHECK (blocked_until IS NULL OR work_status = 'blocked');
CREATE INDEX assignments_blocked_until ON assignments (blocked_until) WHERE blocked_until IS NOT NULL;
