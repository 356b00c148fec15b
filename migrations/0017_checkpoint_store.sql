-- Mosaic schema 17: the checkpoint store (issue: workspaces and checkpoints).
--
-- A checkpoint's bytes cannot stay only on the host that took it: any host granted it must
-- be able to restore it. Its host uploads them here — a git bundle of the checkpoint
-- relative to its base commit, and a bundle of that base — into a content-addressed store
-- kept in PostgreSQL itself, so it is as durable as the authority, replicated with it, and
-- reachable by every coordinator (a standby taking over serves the same objects). An
-- object is stored in parts of at most 48 KiB (the size one host message carries), written
-- in order; it is `stored` once every byte is there and the digest of the whole has been
-- verified; every read verifies it again.
CREATE TABLE checkpoint_objects (
    object_digest text PRIMARY KEY CHECK (object_digest ~ '^sha256:[0-9a-f]{64}$'),
    size bigint NOT NULL CHECK (size > 0),
    received bigint NOT NULL DEFAULT 0 CHECK (received BETWEEN 0 AND size),
    uploaded_by text NOT NULL,
    -- When its last part arrived: an incomplete object another host left idle for five
    -- minutes may be taken over.
    touched_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    stored_at timestamptz,
    CHECK ((stored_at IS NULL) OR (received = size)),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE checkpoint_object_parts (
    object_digest text NOT NULL REFERENCES checkpoint_objects ON DELETE CASCADE,
    part integer NOT NULL CHECK (part >= 0),
    data bytea NOT NULL CHECK (octet_length(data) BETWEEN 1 AND 49152),
    PRIMARY KEY (object_digest, part)
);

-- A host naming an object another host stored proves it holds its bytes: it sends every
-- part, each compared with the stored one, before the object is named on its checkpoint.
CREATE TABLE checkpoint_object_proofs (
    object_digest text NOT NULL REFERENCES checkpoint_objects ON DELETE CASCADE,
    lane_incarnation_id text NOT NULL,
    generation bigint NOT NULL,
    proven bigint NOT NULL DEFAULT 0 CHECK (proven >= 0),
    PRIMARY KEY (object_digest, lane_incarnation_id, generation)
);

-- A checkpoint's objects once stored; `transfer_error` when its host's upload was refused
-- for good (too large for the store, bytes that do not match their digest): the
-- checkpoint then stays on its host only, and says why.
ALTER TABLE checkpoints
    ADD COLUMN base_commit_id text CHECK (base_commit_id IS NULL OR base_commit_id ~ '^[0-9a-f]{40}$'),
    ADD COLUMN base_object text REFERENCES checkpoint_objects (object_digest),
    ADD COLUMN bundle_object text REFERENCES checkpoint_objects (object_digest),
    ADD COLUMN transfer_error text CHECK (transfer_error IS NULL OR length(transfer_error) BETWEEN 1 AND 400),
    ADD CHECK ((base_object IS NULL) OR (base_commit_id IS NOT NULL));

-- Every restore of a checkpoint's objects by a host other than the one that took it: the
-- recovery it served (assignment, attempt, reservation), what it read, and when.
CREATE TABLE checkpoint_restores (
    reservation_id text NOT NULL,
    object_digest text NOT NULL REFERENCES checkpoint_objects (object_digest),
    assignment_id text NOT NULL REFERENCES assignments,
    assignment_attempt_id text NOT NULL,
    host_id text NOT NULL,
    purpose text NOT NULL CHECK (purpose IN ('same-assignment-recovery')),
    served_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (reservation_id, object_digest)
);

-- Work in a repository completes on its final checkpoint: the one its last generation's
-- receipt carries, bound into its final evidence and named here.
ALTER TABLE assignments
    ADD COLUMN final_checkpoint_digest text CHECK (final_checkpoint_digest IS NULL OR final_checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    ADD CHECK (final_checkpoint_digest IS NULL OR lifecycle = 'COMPLETED');
