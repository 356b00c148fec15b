-- Mosaic schema 23: hosts' copies of done work, released.
--
-- A host keeps an assignment's workspace (and its checkpoint refs) while the work may run
-- there again. Once the work has ended it asks to release them; the coordinator allows it
-- only when the files the host holds are a checkpoint of that work its store holds whole
-- (`matched = 'stored'`), or when no workspace is left there (`'none'`: only refs of stored
-- checkpoints): so a release never loses the only copy of anything. The row is written
-- when the release is allowed and completed (`released_at`, `refs_removed`,
-- `receipt_digest`) when the host says it deleted them: the deletion receipt of a host's
-- copy.
-- A host that holds a copy again later (a late stage made one) releases it again: another
-- row, the next `release_seq`; at most one is open (allowed, not yet released) at a time.
CREATE TABLE workspace_releases (
    assignment_id text NOT NULL REFERENCES assignments,
    host_id text NOT NULL,
    release_seq integer NOT NULL CHECK (release_seq >= 1),
    tree_id text CHECK (tree_id IS NULL OR tree_id ~ '^[0-9a-f]{40}$'),
    checkpoint_digest text CHECK (checkpoint_digest IS NULL OR checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    matched text NOT NULL CHECK (matched IN ('stored', 'none')),
    authorized_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    released_at timestamptz,
    refs_removed bigint CHECK (refs_removed IS NULL OR refs_removed >= 0),
    receipt_digest text CHECK (receipt_digest IS NULL OR receipt_digest ~ '^sha256:[0-9a-f]{64}$'),
    CHECK ((tree_id IS NULL) = (checkpoint_digest IS NULL)),
    CHECK ((tree_id IS NULL) = (matched = 'none')),
    CHECK ((released_at IS NULL) = (refs_removed IS NULL) AND (released_at IS NULL) = (receipt_digest IS NULL)),
    PRIMARY KEY (assignment_id, host_id, release_seq)
);
CREATE UNIQUE INDEX workspace_releases_one_open ON workspace_releases (assignment_id, host_id)
    WHERE released_at IS NULL;
