-- Mosaic schema 25: a chain's activation binds the checkpoint its workspace was restored
-- from (spec §6.2: activation state carries the checkpoint digests when checkpoint recovery
-- is relevant).
--
-- What the stage of work in a repository restores — a point (a checkpoint with its
-- objects) or nothing (a fresh clone) — is decided once, before the first stage leaves,
-- and every resend sends the very point recorded here, never one computed again (a late
-- receipt could make another checkpoint the work's latest meanwhile).
-- `restore_decided_at`: it was decided (a fresh clone included); `restore_point`: the
-- point, when there is one; `restore_checkpoint_digest`: its checkpoint.
-- `restored_checkpoint_digest`: what the host says its workspace was restored from (or
-- kept as equal to), recorded with its `staged` only when it is exactly the decided one.
-- Activation requires the two to agree whenever a restore was decided.
ALTER TABLE reservations
    ADD COLUMN restore_decided_at timestamptz,
    ADD COLUMN restore_point jsonb,
    ADD COLUMN restore_checkpoint_digest text
        CHECK (restore_checkpoint_digest IS NULL OR restore_checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    ADD COLUMN restored_checkpoint_digest text
        CHECK (restored_checkpoint_digest IS NULL OR restored_checkpoint_digest = restore_checkpoint_digest),
    -- A point only once decided, with its digest beside it (both or neither), naming it.
    ADD CONSTRAINT reservations_restore_point_decided
        CHECK (restore_point IS NULL OR restore_decided_at IS NOT NULL),
    ADD CONSTRAINT reservations_restore_digest_is_the_point
        CHECK ((restore_point IS NULL) = (restore_checkpoint_digest IS NULL)
           AND (restore_point IS NULL OR restore_point->>'checkpoint_digest' = restore_checkpoint_digest));
