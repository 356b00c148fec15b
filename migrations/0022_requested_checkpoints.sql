-- Mosaic schema 22: checkpoints a live generation asks for (`mosaic lane checkpoint`).
--
-- A RUNNING generation of work in a repository may ask its host for a checkpoint of its
-- workspace now (its cgroup frozen while it is read), so the work survives the loss of the
-- host itself, not only the end of the generation. Such a record has neither a termination
-- receipt nor a handoff: its origin is the request, numbered per generation
-- (`request_seq`). Its purpose is the work's own recovery, like an end's; an end's record
-- is later and is what a restore takes when there is one.
ALTER TABLE checkpoints ADD COLUMN request_seq integer
    CHECK (request_seq IS NULL OR request_seq BETWEEN 1 AND 1000);

-- Exactly one origin: a generation's end (its receipt), a handoff's offer, or a request.
DO $$
DECLARE c text;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'checkpoints'::regclass AND contype = 'c'
               AND pg_get_constraintdef(oid) LIKE '%termination_receipt%'
    LOOP
        EXECUTE format('ALTER TABLE checkpoints DROP CONSTRAINT %I', c);
    END LOOP;
END $$;
ALTER TABLE checkpoints
    ADD CONSTRAINT checkpoints_one_origin
        CHECK (num_nonnulls(termination_receipt, handoff_id, request_seq) = 1),
    ADD CONSTRAINT checkpoints_request_is_own_recovery
        CHECK (request_seq IS NULL OR purpose = 'same-assignment-recovery');

DROP INDEX checkpoints_one_per_generation_end;
CREATE UNIQUE INDEX checkpoints_one_per_generation_end ON checkpoints (lane_incarnation_id, generation)
    WHERE handoff_id IS NULL AND request_seq IS NULL;
CREATE UNIQUE INDEX checkpoints_one_per_request ON checkpoints (lane_incarnation_id, generation, request_seq)
    WHERE request_seq IS NOT NULL;

-- A deletion receipt names which record of its generation it removed.
ALTER TABLE checkpoint_deletions ADD COLUMN request_seq integer;
