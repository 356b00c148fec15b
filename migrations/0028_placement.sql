-- Mosaic schema 28: placement (`mosaic assign` without `--lane`, spec §5.4).
--
-- The roster is a declaration of what each host's lanes are for (capacity, runtimes, labels,
-- roles), published in versions like an inactivity policy: a version never changes, and its
-- digest is the SHA-256 of its body's jsonb text. It is never authority: a placed assignment
-- is reserved by the same fenced CAS as any other.
CREATE TABLE roster_versions (
    version bigint PRIMARY KEY CHECK (version >= 1),
    body jsonb NOT NULL,
    digest text NOT NULL UNIQUE,
    published_epoch bigint NOT NULL,
    published_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION mosaic_roster_digest() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'mosaic: a roster version is frozen; publish a new one';
    END IF;
    NEW.digest := 'sha256:' || encode(sha256(convert_to(NEW.body::text, 'UTF8')), 'hex');
    RETURN NEW;
END $$;
CREATE TRIGGER roster_digest BEFORE INSERT OR UPDATE OR DELETE ON roster_versions
    FOR EACH ROW EXECUTE FUNCTION mosaic_roster_digest();

-- One row per placed reservation, written in the reservation's own transaction: the policy
-- and its digest, the inputs it decided from (whole, so an audit recomputes the choice) and
-- their digest, and the lane it chose — which must be the reservation's lane. Never changed.
CREATE TABLE placements (
    reservation_id text PRIMARY KEY REFERENCES reservations,
    request_key text NOT NULL UNIQUE CHECK (length(request_key) BETWEEN 1 AND 300),
    assignment_id text NOT NULL REFERENCES assignments,
    policy text NOT NULL CHECK (policy ~ '^[a-z0-9-]+@[0-9]+$'),
    policy_digest text NOT NULL CHECK (policy_digest ~ '^sha256:[0-9a-f]{64}$'),
    roster_version bigint NOT NULL REFERENCES roster_versions,
    inputs jsonb NOT NULL,
    inputs_digest text NOT NULL CHECK (inputs_digest ~ '^sha256:[0-9a-f]{64}$'),
    lane_id text NOT NULL,
    lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    coordinator_epoch bigint NOT NULL,
    decided_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (inputs->>'policy' = policy AND (inputs->>'roster_version')::bigint = roster_version)
);

CREATE FUNCTION mosaic_placement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'mosaic: a placement is a record; it never changes';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM reservations r JOIN lane_incarnations li USING (lane_incarnation_id)
                   WHERE r.reservation_id = NEW.reservation_id AND r.assignment_id = NEW.assignment_id
                     AND r.lane_incarnation_id = NEW.lane_incarnation_id AND li.lane_id = NEW.lane_id) THEN
        RAISE EXCEPTION 'mosaic: a placement names the lane its reservation holds';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER placement_record BEFORE INSERT OR UPDATE OR DELETE ON placements
    FOR EACH ROW EXECUTE FUNCTION mosaic_placement();
