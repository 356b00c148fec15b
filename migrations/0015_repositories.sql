-- Mosaic schema 15: repositories and the assignments that work in them (issue: workspaces).
--
-- A repository is a roster declaration, not authority: a name for a git repository an
-- assignment's workspace is cloned from, where the supervisor finds it (a path on the
-- host named, or a URL any host can fetch). An assignment names at most one, with the ref
-- its branch `mosaic/<assignment_id>` starts from; both are fixed for the assignment's
-- life (a resume, a replacement or a handoff works in the same workspace).
CREATE TABLE repositories (
    name text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' AND name !~ '\.\.'),
    -- A path is meaningful on one host only; a URL on any (NULL).
    host_id text CHECK (host_id IS NULL OR btrim(host_id) <> ''),
    source_kind text NOT NULL CHECK (source_kind IN ('path', 'url')),
    source text NOT NULL CHECK (length(source) BETWEEN 1 AND 4096 AND source !~ '[[:cntrl:]]'),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (source_kind = 'url' OR (host_id IS NOT NULL AND source ~ '^/'))
);

ALTER TABLE assignments
    ADD COLUMN repository text REFERENCES repositories (name),
    ADD COLUMN base_ref text CHECK (base_ref IS NULL OR (base_ref ~ '^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$' AND base_ref !~ '\.\.')),
    ADD CHECK ((repository IS NULL) = (base_ref IS NULL));

-- A checkpoint of an assignment's workspace, taken by its host when one of its generations
-- ended with its cleanup verified (nothing of it left to write): a synthetic commit of
-- every file the repository does not ignore — committed, staged, unstaged and untracked
-- alike — on a hidden ref of the host's own checkpoint repository, never in the agent's.
-- Content addressed: the digest is derived from the commit and tree ids (the coordinator
-- derives it again before it records the row), and it is the receipt's checkpoint_digest.
CREATE TABLE checkpoints (
    checkpoint_digest text NOT NULL CHECK (checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    commit_id text NOT NULL CHECK (commit_id ~ '^[0-9a-f]{40}$'),
    tree_id text NOT NULL CHECK (tree_id ~ '^[0-9a-f]{40}$'),
    repository text NOT NULL REFERENCES repositories (name),
    classification text NOT NULL CHECK (classification IN ('workspace')),
    retention_policy_digest text NOT NULL CHECK (retention_policy_digest ~ '^sha256:[0-9a-f]{64}$'),
    purpose text NOT NULL CHECK (purpose IN ('same-assignment-recovery')),
    assignment_id text NOT NULL REFERENCES assignments,
    assignment_attempt_id text NOT NULL,
    lane_incarnation_id text NOT NULL,
    generation bigint NOT NULL,
    host_id text NOT NULL,
    termination_receipt text NOT NULL REFERENCES termination_receipts (idempotency_key),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- One per generation (two generations may well leave the same tree).
    PRIMARY KEY (lane_incarnation_id, generation)
);
CREATE INDEX checkpoints_of_assignment ON checkpoints (assignment_id, created_at);

-- A generation of work in a repository that ran and ended without a recorded checkpoint
-- (its capture failed, or its cleanup was never verified) quarantines its lane; the
-- operator's release of that quarantine is the explicit decision to go on without it,
-- recorded here (and in the release's transition receipt). The lane's next fence needs,
-- for every such generation, a checkpoint or this.
ALTER TABLE generations ADD COLUMN checkpoint_waived_at timestamptz;
