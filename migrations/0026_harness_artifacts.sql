-- Mosaic schema 26: harness artifacts (issue: workspaces and checkpoints; spec §11).
--
-- What a harness kept of its own session (its transcript or state file, as its adapter
-- exports it), captured by its host at the generation's end once the cgroup was verified
-- empty, encrypted there to the coordinator's recovery recipients and named in the
-- termination receipt by the digest of its encrypted bytes. One per generation, recorded
-- with its receipt (same transaction). The bytes reach the store like a checkpoint's
-- (`checkpoint_objects`, uploaded by the host that sealed them, the object's address the
-- artifact's digest); `object` is set once they are whole and verified.
ALTER TABLE retention_policies DROP CONSTRAINT retention_policies_classification_check;
ALTER TABLE retention_policies ADD CHECK (classification IN ('workspace', 'sensitive'));

CREATE TABLE harness_artifacts (
    lane_incarnation_id text NOT NULL,
    generation bigint NOT NULL,
    artifact_digest text NOT NULL CHECK (artifact_digest ~ '^sha256:[0-9a-f]{64}$'),
    size bigint NOT NULL CHECK (size > 0),
    files integer NOT NULL CHECK (files > 0),
    -- Whom it is encrypted to, as the host reports it, and whether that is the list this
    -- coordinator names (a host cannot be made to prove what it encrypted to; an operator
    -- whose key does not open it sees here why).
    recipients_digest text NOT NULL CHECK (recipients_digest ~ '^sha256:[0-9a-f]{64}$'),
    recipients_match boolean NOT NULL,
    classification text NOT NULL CHECK (classification = 'sensitive'),
    retention_policy_digest text NOT NULL CHECK (retention_policy_digest ~ '^sha256:[0-9a-f]{64}$'),
    purpose text NOT NULL CHECK (purpose = 'operator-recovery'),
    assignment_id text NOT NULL REFERENCES assignments,
    assignment_attempt_id text NOT NULL,
    host_id text NOT NULL,
    termination_receipt text NOT NULL REFERENCES termination_receipts (idempotency_key),
    object text REFERENCES checkpoint_objects (object_digest),
    transfer_error text CHECK (transfer_error IS NULL OR length(transfer_error) BETWEEN 1 AND 400),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (lane_incarnation_id, generation),
    -- Content addressed: the stored object is the artifact's own bytes.
    CHECK (object IS NULL OR object = artifact_digest)
);
CREATE INDEX harness_artifacts_of_assignment ON harness_artifacts (assignment_id, created_at);
CREATE INDEX harness_artifacts_by_digest ON harness_artifacts (artifact_digest);

-- An operator's read of an artifact is recorded like a checkpoint's.
ALTER TABLE checkpoint_reads DROP CONSTRAINT checkpoint_reads_what_check;
ALTER TABLE checkpoint_reads DROP CONSTRAINT checkpoint_reads_check1;
ALTER TABLE checkpoint_reads ADD CHECK (what IN ('checkpoint-show', 'checkpoint-read', 'artifact-read'));
ALTER TABLE checkpoint_reads ADD CHECK ((what IN ('checkpoint-read', 'artifact-read')) = (object_digest IS NOT NULL));

-- The recipient lists coordinators were configured with (`recovery_recipients`), by
-- digest: each coordinator registers its own when it starts, and it becomes the active
-- one. An artifact records whether it was encrypted to the active list; the listing names
-- the principals of the list it was encrypted to.
CREATE TABLE recovery_recipient_lists (
    recipients_digest text PRIMARY KEY CHECK (recipients_digest ~ '^sha256:[0-9a-f]{64}$'),
    recipients text[] NOT NULL,
    active boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE UNIQUE INDEX recovery_recipient_lists_one_active ON recovery_recipient_lists (active) WHERE active;
