-- Mosaic schema 24: what operators read of stored checkpoints.
--
-- An operator's `checkpoint show` and every part of an object its `checkpoint restore`
-- reads is recorded here before the answer is given: who (a remote operator's principal,
-- or `local:uid=N` for the coordinator's socket), which checkpoint and object, from which
-- offset, when. Hosts' reads are recorded in `checkpoint_restores` and grants' in
-- `checkpoint_access_receipts`; nothing else serves checkpoint material.
CREATE TABLE checkpoint_reads (
    read_id bigserial PRIMARY KEY,
    what text NOT NULL CHECK (what IN ('checkpoint-show', 'checkpoint-read')),
    checkpoint_digest text NOT NULL CHECK (checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    object_digest text CHECK (object_digest IS NULL OR object_digest ~ '^sha256:[0-9a-f]{64}$'),
    byte_offset bigint CHECK (byte_offset IS NULL OR byte_offset >= 0),
    CHECK ((object_digest IS NULL) = (byte_offset IS NULL)),
    CHECK ((what = 'checkpoint-read') = (object_digest IS NOT NULL)),
    assignment_id text NOT NULL REFERENCES assignments,
    reader text NOT NULL CHECK (length(reader) BETWEEN 1 AND 200),
    read_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX checkpoint_reads_of_assignment ON checkpoint_reads (assignment_id, read_id);
CREATE TRIGGER checkpoint_reads_immutable BEFORE UPDATE OR DELETE ON checkpoint_reads
    FOR EACH ROW EXECUTE FUNCTION mosaic_immutable();
