-- Mosaic schema 19: a repository's setup, and the recorded inputs of every checkpoint.
--
-- A repository declares what its fresh workspace gets before any harness runs in it:
-- files copied from its source directory (ignored `.env`-style files a clone does not
-- carry; only a path repository has a directory to copy from), then commands run in the
-- workspace, each within the timeout. Part of the declaration: a name keeps its setup as
-- it keeps its source. The host records what it made a workspace from (source, base,
-- the checkpoint it restored, the setup's digest, the digest of every copied file's
-- bytes) and every checkpoint of that workspace carries the digest of that record.
ALTER TABLE repositories
    ADD COLUMN setup_copy text[] NOT NULL DEFAULT '{}',
    ADD COLUMN setup_commands text[] NOT NULL DEFAULT '{}',
    ADD COLUMN setup_timeout_s integer NOT NULL DEFAULT 300 CHECK (setup_timeout_s BETWEEN 1 AND 3600),
    ADD CHECK (cardinality(setup_copy) <= 32 AND cardinality(setup_commands) <= 16),
    ADD CHECK (array_position(setup_copy, NULL) IS NULL AND array_position(setup_commands, NULL) IS NULL),
    ADD CHECK (cardinality(setup_copy) = 0 OR source_kind = 'path');

ALTER TABLE checkpoints
    ADD COLUMN inputs_digest text CHECK (inputs_digest IS NULL OR inputs_digest ~ '^sha256:[0-9a-f]{64}$');
