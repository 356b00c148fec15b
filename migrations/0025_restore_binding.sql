-- Mosaic schema 25: a chain's activation binds the checkpoint its workspace was restored
-- from (spec §6.2: activation state carries the checkpoint digests when checkpoint recovery
-- is relevant).
--
-- `restore_checkpoint_digest`: what the chain's stage restores (the work's latest, a
-- handoff's, a grant's), decided once, before the stage is sent, in its own fenced step.
-- `restored_checkpoint_digest`: what the host says its workspace was restored from (or
-- already equal to), recorded with its `staged` only when it is exactly the decided one.
-- Activation requires the two to agree whenever a restore was decided.
ALTER TABLE reservations
    ADD COLUMN restore_checkpoint_digest text
        CHECK (restore_checkpoint_digest IS NULL OR restore_checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    ADD COLUMN restored_checkpoint_digest text
        CHECK (restored_checkpoint_digest IS NULL OR restored_checkpoint_digest = restore_checkpoint_digest);
