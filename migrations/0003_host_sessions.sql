-- Mosaic schema 3: host sessions.
--
-- Every host session the leader admits gets a row before it is live: its id (the
-- coordinator's 256-bit challenge, so no id is ever admitted twice, and with it no message
-- id, which embeds it) and a per-host session epoch that only rises. Closing records why.

CREATE TABLE host_sessions (
    session_id        text PRIMARY KEY,
    host_id           text NOT NULL,
    session_epoch     bigint NOT NULL CHECK (session_epoch > 0),
    coordinator_epoch bigint NOT NULL,
    opened_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    closed_at         timestamptz,
    close_reason      text,
    UNIQUE (host_id, session_epoch)
);

-- Session ids are written once; only the close may be recorded later.
CREATE FUNCTION mosaic_host_session_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'mosaic: host sessions are never deleted';
    END IF;
    IF NEW.session_id <> OLD.session_id OR NEW.host_id <> OLD.host_id
       OR NEW.session_epoch <> OLD.session_epoch OR NEW.opened_at <> OLD.opened_at
       OR OLD.closed_at IS NOT NULL THEN
        RAISE EXCEPTION 'mosaic: a host session row changes only once, at its close';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER host_session_immutable BEFORE UPDATE ON host_sessions
    FOR EACH ROW EXECUTE FUNCTION mosaic_host_session_immutable();
CREATE TRIGGER host_session_no_delete BEFORE DELETE ON host_sessions
    FOR EACH ROW EXECUTE FUNCTION mosaic_host_session_immutable();
