-- Mosaic schema 34: operator notifications (spec §14, issue 23 part 6).
--
-- An event an operator must hear about — work blocked (with its code: a rate limit, a
-- harness waiting for a human, attempts exhausted), a lane quarantined, a handoff offered
-- or expired — is written here by the database itself, in the transaction that changed the
-- state, so no code path can forget one and a rolled-back change notifies nobody. One row
-- per event: its key is what makes the event itself (the same blocker with the same
-- evidence, the same quarantine entry, the same handoff) and a repeat is dropped. The
-- coordinator's notifier delivers each row to the configured sinks afterwards, outside any
-- transition, so a slow or failing sink never holds authority.
--
-- Only identifiers, codes, states and digests go in a body: never a next action's text,
-- a task, a token or evidence bytes (the same rule as the logs).

CREATE TABLE notifications (
    event_key text PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('blocked', 'waiting-for-input', 'exhausted', 'quarantine',
        'handoff-offered', 'handoff-expired')),
    body jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Delivery: claimed by a notifier until `next_attempt_at`, retried with backoff.
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The sinks that took it (`command`, `webhook`); done once every configured one has.
    delivered_to text[] NOT NULL DEFAULT '{}',
    done_at timestamptz,
    last_error text
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE done_at IS NULL;

CREATE FUNCTION mosaic_notify(p_key text, p_kind text, p_body jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notifications (event_key, kind, body)
    VALUES (p_key, p_kind, p_body || jsonb_build_object('kind', p_kind, 'event_key', p_key,
        'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))
    ON CONFLICT (event_key) DO NOTHING;
END $$;

-- Work becomes blocked, or blocked again for another reason or other evidence.
CREATE FUNCTION mosaic_notify_blocked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_kind text;
    v_lane text;
BEGIN
    v_kind := CASE
        WHEN NEW.blocker_code = 'waiting-for-input' THEN 'waiting-for-input'
        WHEN NEW.blocker_code LIKE '%-exhausted' THEN 'exhausted'
        ELSE 'blocked' END;
    SELECT li.lane_id INTO v_lane FROM lane_incarnations li
     WHERE li.lane_incarnation_id = NEW.lane_incarnation_id;
    -- Each change is its own event (an unblock and the same block again notify twice); the
    -- transaction id keeps one change one row.
    PERFORM mosaic_notify(
        'blocked/' || NEW.assignment_id || '/' || NEW.blocker_code || '/' || NEW.blocker_evidence_digest
            || '/' || pg_current_xact_id()::text,
        v_kind,
        jsonb_build_object('assignment_id', NEW.assignment_id, 'lane_id', v_lane,
            'code', NEW.blocker_code, 'evidence_digest', NEW.blocker_evidence_digest));
    RETURN NULL;
END $$;
-- Whatever set it (a statement naming the columns, or `work_record` deriving them from an
-- outcome): the condition is on the row, not on the statement's column list.
CREATE TRIGGER notify_blocked_insert AFTER INSERT ON assignments FOR EACH ROW
    WHEN (NEW.work_status = 'blocked') EXECUTE FUNCTION mosaic_notify_blocked();
CREATE TRIGGER notify_blocked AFTER UPDATE ON assignments FOR EACH ROW
    WHEN (NEW.work_status = 'blocked' AND (OLD.work_status IS DISTINCT FROM 'blocked'
        OR OLD.blocker_code IS DISTINCT FROM NEW.blocker_code
        OR OLD.blocker_evidence_digest IS DISTINCT FROM NEW.blocker_evidence_digest))
    EXECUTE FUNCTION mosaic_notify_blocked();

-- A lane incarnation enters quarantine (each entry is its own event).
CREATE FUNCTION mosaic_notify_quarantine() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mosaic_notify(
        'quarantine/' || NEW.lane_incarnation_id || '/' || NEW.quarantine_entries,
        'quarantine',
        jsonb_build_object('lane_id', NEW.lane_id, 'lane_incarnation_id', NEW.lane_incarnation_id,
            'reason', left(coalesce(NEW.quarantine_reason, ''), 300)));
    RETURN NULL;
END $$;
CREATE TRIGGER notify_quarantine AFTER UPDATE ON lane_incarnations FOR EACH ROW
    WHEN (NEW.state = 'QUARANTINED' AND OLD.state IS DISTINCT FROM 'QUARANTINED')
    EXECUTE FUNCTION mosaic_notify_quarantine();

-- A handoff offered, and one that expired without moving the work.
CREATE FUNCTION mosaic_notify_handoff() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_lane text;
BEGIN
    SELECT li.lane_id INTO v_lane FROM lane_incarnations li
     WHERE li.lane_incarnation_id = NEW.target_lane_incarnation_id;
    IF TG_OP = 'INSERT' THEN
        PERFORM mosaic_notify('handoff-offered/' || NEW.handoff_id, 'handoff-offered',
            jsonb_build_object('assignment_id', NEW.assignment_id, 'handoff_id', NEW.handoff_id,
                'target_lane_id', v_lane));
    ELSE
        PERFORM mosaic_notify('handoff-expired/' || NEW.handoff_id, 'handoff-expired',
            jsonb_build_object('assignment_id', NEW.assignment_id, 'handoff_id', NEW.handoff_id,
                'target_lane_id', v_lane));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER notify_handoff_offered AFTER INSERT ON handoffs
    FOR EACH ROW EXECUTE FUNCTION mosaic_notify_handoff();
CREATE TRIGGER notify_handoff_expired AFTER UPDATE ON handoffs FOR EACH ROW
    WHEN (NEW.state = 'EXPIRED' AND OLD.state <> 'EXPIRED')
    EXECUTE FUNCTION mosaic_notify_handoff();

-- An elastic lane's lease quarantined (a destruction collision or ambiguity): its lane needs
-- an operator (`mosaic lane unlease`).
CREATE FUNCTION mosaic_notify_lease_quarantine() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mosaic_notify('quarantine/lease/' || NEW.lease_id || '/' || pg_current_xact_id()::text,
        'quarantine',
        jsonb_build_object('lane_id', NEW.lane_id, 'lease_id', NEW.lease_id,
            'lane_incarnation_id', NEW.lane_incarnation_id));
    RETURN NULL;
END $$;
CREATE TRIGGER notify_lease_quarantine AFTER UPDATE ON lane_leases FOR EACH ROW
    WHEN (NEW.state = 'QUARANTINED' AND OLD.state IS DISTINCT FROM 'QUARANTINED')
    EXECUTE FUNCTION mosaic_notify_lease_quarantine();
