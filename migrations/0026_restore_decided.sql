-- Mosaic schema 26: a chain's restore is decided once, whole.
--
-- The stage of work in a repository restores a point (a checkpoint with its objects) or
-- nothing (a fresh clone). The driver decides it once, before the first stage leaves, and
-- every resend sends the very point recorded here — never one computed again (a late
-- receipt could make another checkpoint the work's latest meanwhile). `restore_decided_at`
-- says it was decided (a fresh clone included); `restore_point` is the point, when there is
-- one, and names the checkpoint `restore_checkpoint_digest` holds.
ALTER TABLE reservations
    ADD COLUMN restore_decided_at timestamptz,
    ADD COLUMN restore_point jsonb,
    ADD CONSTRAINT reservations_restore_point_decided
        CHECK (restore_point IS NULL OR restore_decided_at IS NOT NULL),
    ADD CONSTRAINT reservations_restore_digest_is_the_point
        CHECK ((restore_checkpoint_digest IS NULL AND restore_point IS NULL)
            OR restore_point->>'checkpoint_digest' = restore_checkpoint_digest);
