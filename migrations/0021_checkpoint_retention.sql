-- Mosaic schema 21: checkpoint retention and deletion receipts (spec §11: retention-bounded,
-- explicit deletion policy).
--
-- A retention policy is versioned by its content: its digest is what every checkpoint row
-- records (`retention_policy_digest`), and the policy in force for new checkpoints of a
-- classification is the one marked active (each coordinator registers the one its
-- configuration names when it starts). `keep_after_done_s` NULL keeps a checkpoint until an
-- operator deletes it; otherwise `mosaic checkpoint gc` deletes it once its assignment has
-- been done (COMPLETED, FAILED, CANCELLED) that long.
CREATE TABLE retention_policies (
    policy_digest text PRIMARY KEY CHECK (policy_digest ~ '^sha256:[0-9a-f]{64}$'),
    classification text NOT NULL CHECK (classification IN ('workspace')),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    keep_after_done_s bigint CHECK (keep_after_done_s IS NULL OR keep_after_done_s > 0),
    active boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE UNIQUE INDEX retention_policies_one_active ON retention_policies (classification) WHERE active;

-- What a deletion removed, in the transaction that removed it: the checkpoint's record and
-- the store's objects no other checkpoint names. `scope` says where: the coordinator's
-- store only (a host's own checkpoint repository and workspace are not reached by it).
CREATE TABLE checkpoint_deletions (
    deletion_id text PRIMARY KEY CHECK (deletion_id ~ '^cd-[0-9a-f]{32}$'),
    checkpoint_digest text NOT NULL,
    assignment_id text NOT NULL REFERENCES assignments,
    lane_incarnation_id text NOT NULL,
    generation bigint NOT NULL,
    purpose text NOT NULL,
    handoff_id text,
    retention_policy_digest text NOT NULL,
    reason text NOT NULL CHECK (reason IN ('retention', 'operator')),
    scope text NOT NULL CHECK (scope IN ('coordinator-store')),
    objects_deleted text[] NOT NULL,
    -- sha256 over the fields above and the objects deleted.
    receipt_digest text NOT NULL CHECK (receipt_digest ~ '^sha256:[0-9a-f]{64}$'),
    deleted_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX checkpoint_deletions_of_assignment ON checkpoint_deletions (assignment_id);

-- A restore's record outlives the objects it read (their digests stay).
ALTER TABLE checkpoint_restores DROP CONSTRAINT checkpoint_restores_object_digest_fkey;
