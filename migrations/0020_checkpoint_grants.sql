-- Mosaic schema 20: cross-assignment checkpoint grants (spec §11).
--
-- An assignment may read another's checkpoint only under a grant: expiring, revocable,
-- single-use, binding every field below. It is made with the remediation assignment
-- (`mosaic assign --from-checkpoint`), in the same transaction as its reservation, and
-- consumed by the stage of that assignment's first chain — one fenced statement that
-- checks every bound field against what the stage presents and writes the one scoped
-- access receipt. Nothing else discloses a checkpoint to another assignment: a stage's
-- restore point, and the store's serving of objects, name only the work's own
-- checkpoints or the one a grant consumed by that very reservation names.
CREATE TABLE checkpoint_grants (
    grant_id text PRIMARY KEY CHECK (grant_id ~ '^cg-[0-9a-f]{32}$'),
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    source_assignment_id text NOT NULL REFERENCES assignments,
    source_attempt_id text NOT NULL,
    source_lane_incarnation_id text NOT NULL,
    source_generation bigint NOT NULL,
    checkpoint_digest text NOT NULL CHECK (checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    target_assignment_id text NOT NULL REFERENCES assignments,
    target_attempt_id text NOT NULL UNIQUE,
    recovery_principal text NOT NULL CHECK (recovery_principal ~ '^host:.'),
    recovery_role text NOT NULL CHECK (recovery_role IN ('remediation')),
    purpose text NOT NULL CHECK (purpose IN ('cross-assignment-recovery')),
    classification text NOT NULL CHECK (classification IN ('workspace')),
    permitted_fields_digest text NOT NULL CHECK (permitted_fields_digest ~ '^sha256:[0-9a-f]{64}$'),
    transformation_digest text CHECK (transformation_digest IS NULL OR transformation_digest ~ '^sha256:[0-9a-f]{64}$'),
    retention_policy_digest text NOT NULL CHECK (retention_policy_digest ~ '^sha256:[0-9a-f]{64}$'),
    deadline timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at timestamptz,
    consumed_at timestamptz,
    consumed_by_reservation text,
    CHECK (source_assignment_id <> target_assignment_id),
    CHECK ((consumed_at IS NULL) = (consumed_by_reservation IS NULL)),
    -- Spent one way only: revoked, or consumed.
    CHECK (revoked_at IS NULL OR consumed_at IS NULL),
    CHECK (deadline > created_at)
);
CREATE INDEX checkpoint_grants_of_target ON checkpoint_grants (target_assignment_id);

-- The one scoped access receipt of a consumed grant, written by the statement that consumes
-- it (never apart): what was disclosed, to whom, for which chain.
CREATE TABLE checkpoint_access_receipts (
    receipt_id text PRIMARY KEY CHECK (receipt_id ~ '^ca-[0-9a-f]{32}$'),
    grant_id text NOT NULL UNIQUE REFERENCES checkpoint_grants,
    reservation_id text NOT NULL,
    recovery_principal text NOT NULL,
    checkpoint_digest text NOT NULL,
    purpose text NOT NULL,
    -- sha256 over every bound field presented, the reservation and the receipt id.
    receipt_digest text NOT NULL CHECK (receipt_digest ~ '^sha256:[0-9a-f]{64}$'),
    accessed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

ALTER TABLE checkpoint_restores
    DROP CONSTRAINT checkpoint_restores_purpose_check,
    ADD CONSTRAINT checkpoint_restores_purpose_check
        CHECK (purpose IN ('same-assignment-recovery', 'handoff', 'cross-assignment-recovery'));
