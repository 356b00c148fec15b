-- Mosaic schema 18: a handoff of work in a repository carries its checkpoint (spec §8.1).
--
-- The offer holds the source generation's workspace read-only; its host checkpoints it
-- then and answers with the checkpoint, recorded here as a checkpoint of the source
-- generation with purpose `handoff` (no termination receipt: the generation still lives).
-- The target's workspace is restored from exactly that checkpoint before its harness
-- starts, and the target's handoff ACK binds its digest.
ALTER TABLE handoffs
    -- Set at the offer: the work has a workspace, so the handoff needs a checkpoint.
    ADD COLUMN needs_checkpoint boolean NOT NULL DEFAULT false,
    ADD COLUMN checkpoint_digest text CHECK (checkpoint_digest IS NULL OR checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    -- Why the source host took none (the offer then expires: nothing moves without one).
    ADD COLUMN checkpoint_error text CHECK (checkpoint_error IS NULL OR length(checkpoint_error) BETWEEN 1 AND 400),
    ADD CHECK (checkpoint_digest IS NULL OR checkpoint_error IS NULL),
    ADD CHECK (needs_checkpoint OR (checkpoint_digest IS NULL AND checkpoint_error IS NULL)),
    -- No challenge (and so no ACK, no acceptance) before the checkpoint is recorded.
    ADD CHECK (NOT needs_checkpoint OR state IN ('OFFERED', 'EXPIRED', 'WITHDRAWN') OR checkpoint_digest IS NOT NULL);

ALTER TABLE checkpoints
    DROP CONSTRAINT checkpoints_purpose_check,
    ADD CONSTRAINT checkpoints_purpose_check CHECK (purpose IN ('same-assignment-recovery', 'handoff')),
    ALTER COLUMN termination_receipt DROP NOT NULL,
    ADD COLUMN handoff_id text REFERENCES handoffs,
    -- Exactly one origin: a generation's end (its receipt) or a handoff's offer.
    ADD CHECK ((purpose = 'handoff') = (handoff_id IS NOT NULL)),
    ADD CHECK ((handoff_id IS NULL) = (termination_receipt IS NOT NULL)),
    DROP CONSTRAINT checkpoints_pkey,
    -- One per handoff (a generation may be offered again after an offer expired).
    ADD CONSTRAINT checkpoints_one_per_handoff UNIQUE (handoff_id);
-- One per generation end (two generations may well leave the same tree).
CREATE UNIQUE INDEX checkpoints_one_per_generation_end ON checkpoints (lane_incarnation_id, generation)
    WHERE handoff_id IS NULL;

ALTER TABLE checkpoint_restores
    DROP CONSTRAINT checkpoint_restores_purpose_check,
    ADD CONSTRAINT checkpoint_restores_purpose_check CHECK (purpose IN ('same-assignment-recovery', 'handoff'));

-- The inactivity watchdog watches offered work too (§17 Unacknowledged handoff).
DROP INDEX assignments_watchdog;
CREATE INDEX assignments_watchdog ON assignments (inactivity_deadline) WHERE work_status IN ('active', 'handoff');
