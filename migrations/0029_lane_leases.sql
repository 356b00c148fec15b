-- Mosaic schema 29: elastic lanes (spec §13). A lease asks a host for a lane that exists
-- only while the lease lives: created on the host's side under a fresh incarnation, renewed
-- by a fenced CAS at database time, destroyed only through one CAS that compares the exact
-- ownership proof, lease epoch, lane, incarnation and generation counter it was decided on.
--
-- The raw ownership token never leaves the coordinator's memory: it is derived from the
-- coordinator secret and `token_salt`, and only its keyed digest (`token_proof`) is stored.
CREATE TABLE lane_leases (
    lease_id text PRIMARY KEY CHECK (lease_id ~ '^ll-[0-9a-f]{32}$'),
    host_id text NOT NULL,
    lane_id text NOT NULL UNIQUE,
    lane_incarnation_id text UNIQUE REFERENCES lane_incarnations,
    runtime text NOT NULL,
    labels jsonb NOT NULL DEFAULT '{}',
    role text,
    state text NOT NULL DEFAULT 'REQUESTED' CHECK (state IN (
        'REQUESTED', 'ACTIVE', 'DESTROYING', 'DESTROYED', 'QUARANTINED')),
    token_salt text NOT NULL CHECK (token_salt ~ '^[0-9a-f]{64}$'),
    token_proof text NOT NULL UNIQUE CHECK (token_proof ~ '^hmac-sha256:[0-9a-f]{64}$'),
    -- Moves by one with every renewal: a TTL decision taken on an older epoch is stale.
    lease_epoch bigint NOT NULL DEFAULT 1 CHECK (lease_epoch >= 1),
    owner_epoch bigint NOT NULL,
    ttl_ms bigint NOT NULL CHECK (ttl_ms BETWEEN 1000 AND 2592000000),
    renew_deadline timestamptz NOT NULL,
    max_deadline timestamptz NOT NULL,
    -- The destruction's idempotency key, fixed at the lease's creation.
    destroy_key text NOT NULL UNIQUE,
    -- What the destruction was decided on: the incarnation's generation counter then.
    destroy_next_generation bigint,
    destroy_decided_at timestamptz,
    destroy_epoch bigint,
    destroyed_at timestamptz,
    quarantine_reason text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (renew_deadline <= max_deadline),
    CHECK ((state = 'REQUESTED') = (lane_incarnation_id IS NULL) OR state IN ('DESTROYED', 'QUARANTINED')),
    -- A destruction the TTL decided says on what; a lane its host destroyed unasked is
    -- destroyed all the same (the host's report is the fact), without that decision.
    CHECK ((state = 'DESTROYING') <= (destroy_decided_at IS NOT NULL AND destroy_next_generation IS NOT NULL)),
    CHECK ((state = 'DESTROYED') = (destroyed_at IS NOT NULL)),
    CHECK ((state = 'QUARANTINED') <= (quarantine_reason IS NOT NULL))
);
CREATE INDEX lane_leases_due ON lane_leases (renew_deadline) WHERE state IN ('ACTIVE', 'DESTROYING');

-- A lease's identity never changes, and a destroyed lease is history. (A quarantined one
-- goes on only by an operator's resolution.) (A quarantined one
-- goes on only by an operator's resolution: destroyed, or given back to its TTL.)
CREATE FUNCTION mosaic_lane_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'mosaic: a lane lease is a record; it is never deleted';
    END IF;
    IF NEW.lease_id <> OLD.lease_id OR NEW.host_id <> OLD.host_id OR NEW.lane_id <> OLD.lane_id
       OR NEW.token_salt <> OLD.token_salt OR NEW.token_proof <> OLD.token_proof
       OR NEW.destroy_key <> OLD.destroy_key OR NEW.max_deadline <> OLD.max_deadline
       OR (OLD.lane_incarnation_id IS NOT NULL AND NEW.lane_incarnation_id IS DISTINCT FROM OLD.lane_incarnation_id)
       OR NEW.lease_epoch < OLD.lease_epoch THEN
        RAISE EXCEPTION 'mosaic: a lane lease keeps its identity, token and maximum lifetime';
    END IF;
    IF OLD.state = 'DESTROYED' AND NEW.state <> OLD.state THEN
        RAISE EXCEPTION 'mosaic: a destroyed lane lease is final';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER lane_lease_record BEFORE UPDATE OR DELETE ON lane_leases
    FOR EACH ROW EXECUTE FUNCTION mosaic_lane_lease();
