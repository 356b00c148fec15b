-- Mosaic authority schema, version 1.
--
-- PostgreSQL is the only writable authority. Uniqueness and immutability are enforced
-- here, by constraints and triggers, not by code paths. Every time-based decision uses
-- clock_timestamp() inside the deciding statement (never now(), which is the transaction
-- start), and a deadline equal to the current time is expired.

CREATE TABLE mosaic_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version integer NOT NULL
);

-- The authority timeline. Advanced (never reused) on rollback, PITR or uncertain history.
CREATE TABLE sot (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    sot_incarnation text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The leadership singleton: who may mutate, until when.
CREATE TABLE leadership (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    sot_incarnation text NOT NULL,
    epoch bigint NOT NULL CHECK (epoch >= 0),
    holder text,
    credential_digest text,
    launch_id text,
    acquired_at timestamptz,
    lease_expires_at timestamptz,
    released boolean NOT NULL DEFAULT true
);

-- Every epoch ever granted: the primary key makes reuse impossible.
CREATE TABLE epochs (
    epoch bigint PRIMARY KEY,
    sot_incarnation text NOT NULL,
    holder text NOT NULL,
    launch_id text NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- True when (epoch, holder, launch, credential, sot) is the current, unreleased,
-- unexpired leadership at this very instant. Used inside every deciding statement.
CREATE FUNCTION mosaic_leader_ok(p_epoch bigint, p_holder text, p_launch text, p_cred text, p_sot text)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT 1 FROM leadership l JOIN sot s ON s.sot_incarnation = l.sot_incarnation
        WHERE l.epoch = p_epoch AND l.holder = p_holder AND l.launch_id = p_launch
          AND l.credential_digest = p_cred AND l.sot_incarnation = p_sot
          AND NOT l.released AND l.lease_expires_at > clock_timestamp())
$$;

CREATE TABLE lanes (
    lane_id text PRIMARY KEY,
    host_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE lane_incarnations (
    lane_incarnation_id text PRIMARY KEY,
    lane_id text NOT NULL REFERENCES lanes,
    state text NOT NULL DEFAULT 'IDLE_CLEAN' CHECK (state IN (
        'IDLE_CLEAN', 'RESERVED', 'CHECKPOINTING', 'FENCED', 'STAGING', 'CONTRACT_INJECTING',
        'AWAITING_ACK', 'READY', 'RUNNING', 'DRAINING', 'RETIRING', 'QUARANTINED')),
    next_generation bigint NOT NULL DEFAULT 1 CHECK (next_generation >= 1),
    quarantine_reason text,
    created_epoch bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    retired_at timestamptz
);
CREATE UNIQUE INDEX one_current_incarnation_per_lane ON lane_incarnations (lane_id) WHERE retired_at IS NULL;

CREATE TABLE assignments (
    assignment_id text PRIMARY KEY,
    lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    lifecycle text NOT NULL DEFAULT 'ACTIVE' CHECK (lifecycle IN (
        'ACTIVE', 'RECOVERY', 'COMPLETED', 'FAILED', 'CANCELLED', 'QUARANTINED')),
    responsibility_owner text NOT NULL,
    execution_owner text,
    pending_target text,
    next_action text NOT NULL,
    runtime_id text NOT NULL,
    scope_digest text NOT NULL,
    holds_digest text NOT NULL,
    completion_policy_digest text NOT NULL,
    requested_outcome text CHECK (requested_outcome IN ('COMPLETED', 'FAILED', 'CANCELLED', 'QUARANTINED')),
    final_evidence_digest text,
    created_epoch bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Execution authority only with a responsible owner; pending and execution never both.
    CHECK (execution_owner IS NULL OR pending_target IS NULL)
);
CREATE UNIQUE INDEX one_active_assignment_per_incarnation ON assignments (lane_incarnation_id) WHERE lifecycle = 'ACTIVE';

CREATE TABLE attempts (
    assignment_attempt_id text PRIMARY KEY,
    assignment_id text NOT NULL REFERENCES assignments,
    created_epoch bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE reservations (
    reservation_id text PRIMARY KEY,
    reservation_epoch bigint NOT NULL,
    reservation_lease_id text NOT NULL UNIQUE,
    assignment_id text NOT NULL REFERENCES assignments,
    assignment_attempt_id text NOT NULL UNIQUE REFERENCES attempts,
    lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    deadline timestamptz NOT NULL,
    fence_digest text NOT NULL,
    generation bigint,
    process_identity jsonb,
    contracts_digest text,
    released_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE generations (
    lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    generation bigint NOT NULL CHECK (generation >= 1),
    reservation_id text NOT NULL REFERENCES reservations,
    state text NOT NULL CHECK (state IN ('STAGING', 'LIVE', 'ENDED')),
    process_identity jsonb,
    ended_at timestamptz,
    PRIMARY KEY (lane_incarnation_id, generation)
);
CREATE UNIQUE INDEX one_active_generation_per_incarnation ON generations (lane_incarnation_id) WHERE state <> 'ENDED';

CREATE TABLE contracts (
    contracts_digest text PRIMARY KEY,
    task_text text NOT NULL,
    scope_digest text NOT NULL,
    holds_digest text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE challenges (
    challenge_id text PRIMARY KEY,
    reservation_id text NOT NULL REFERENCES reservations,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    contracts_digest text NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL,
    consumed_at timestamptz
);
-- One challenge per reservation chain: a consumed or expired chain is not re-challenged.
CREATE UNIQUE INDEX one_challenge_per_reservation ON challenges (reservation_id);

-- Immutable: a consumed ACK is audit evidence forever.
CREATE TABLE ack_receipts (
    ack_receipt_id text PRIMARY KEY,
    challenge_id text NOT NULL UNIQUE REFERENCES challenges,
    reservation_id text NOT NULL REFERENCES reservations,
    ack_digest text NOT NULL,
    body jsonb NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE leases (
    lease_id text PRIMARY KEY,
    scope text NOT NULL,
    lease_epoch bigint NOT NULL,
    assignment_id text NOT NULL REFERENCES assignments,
    assignment_attempt_id text NOT NULL REFERENCES attempts,
    lane_incarnation_id text NOT NULL REFERENCES lane_incarnations,
    generation bigint NOT NULL,
    reservation_id text NOT NULL REFERENCES reservations,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL,
    released_at timestamptz,
    UNIQUE (reservation_id, scope)
);

-- One receipt per authority transition, written in the transition's own commit.
CREATE TABLE transition_receipts (
    receipt_id text PRIMARY KEY,
    transition text NOT NULL,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    assignment_id text,
    lane_incarnation_id text,
    body jsonb NOT NULL,
    decided_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Same key + same request → the original receipt; same key + other request → refused.
CREATE TABLE idempotency (
    idempotency_key text PRIMARY KEY,
    operation text NOT NULL,
    request_digest text NOT NULL,
    receipt_id text NOT NULL REFERENCES transition_receipts
);

-- Host termination receipts: advisory observations, reconciled by the leader.
CREATE TABLE termination_receipts (
    idempotency_key text PRIMARY KEY,
    lane_id text NOT NULL,
    lane_incarnation_id text NOT NULL,
    generation bigint NOT NULL,
    body jsonb NOT NULL,
    body_digest text NOT NULL,
    verified_empty boolean NOT NULL,
    ingested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ingested_epoch bigint NOT NULL,
    reconciled_at timestamptz,
    reconciliation text
);

-- Every rejection, with a countable reason category and no secret material.
CREATE TABLE audit (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    operation text NOT NULL,
    category text NOT NULL,
    coordinator_epoch bigint,
    assignment_id text,
    lane_incarnation_id text,
    detail text NOT NULL
);

CREATE FUNCTION mosaic_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'mosaic: % rows are immutable', TG_TABLE_NAME;
END $$;
CREATE TRIGGER ack_receipts_immutable BEFORE UPDATE OR DELETE ON ack_receipts FOR EACH ROW EXECUTE FUNCTION mosaic_immutable();
CREATE TRIGGER transition_receipts_immutable BEFORE UPDATE OR DELETE ON transition_receipts FOR EACH ROW EXECUTE FUNCTION mosaic_immutable();
CREATE TRIGGER epochs_immutable BEFORE UPDATE OR DELETE ON epochs FOR EACH ROW EXECUTE FUNCTION mosaic_immutable();

-- The one text form of a database time handed to clients and compared byte-for-byte when
-- they hand it back (a deadline is never re-parsed, normalized or restamped).
CREATE FUNCTION mosaic_ts(t timestamptz) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;
