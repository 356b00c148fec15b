-- Mosaic schema 4: every entry into and exit from QUARANTINED is counted by the database
-- itself, whichever transition caused it (metrics read these; nothing can forget to).

ALTER TABLE lane_incarnations ADD COLUMN quarantine_entries bigint NOT NULL DEFAULT 0;
ALTER TABLE lane_incarnations ADD COLUMN quarantine_exits bigint NOT NULL DEFAULT 0;

CREATE FUNCTION mosaic_count_quarantine() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'QUARANTINED' AND OLD.state IS DISTINCT FROM 'QUARANTINED' THEN
        NEW.quarantine_entries := OLD.quarantine_entries + 1;
    ELSIF OLD.state = 'QUARANTINED' AND NEW.state <> 'QUARANTINED' THEN
        NEW.quarantine_exits := OLD.quarantine_exits + 1;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER count_quarantine BEFORE UPDATE OF state ON lane_incarnations
    FOR EACH ROW EXECUTE FUNCTION mosaic_count_quarantine();
-- A lane incarnation may be born quarantined only through an update, never an insert:
-- the insert path starts IDLE_CLEAN (checked by the existing state machine).
