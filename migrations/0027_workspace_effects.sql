-- Mosaic schema 27: handing done work's branch on (`mosaic workspace push|merge`).
--
-- Work in a repository completes on its final checkpoint (migration 0017). An operator hands
-- that checkpoint on: `push` puts it on the repository's `refs/heads/mosaic/<assignment>`,
-- `merge` into a branch of the repository (a fast-forward, or a merge commit when the branch
-- moved on). Either is a protected effect on the repository, made by a host's push executor
-- (its own credentials), and, like every protected effect, only after one fenced CAS here
-- admitted the exact update:
--
-- REQUESTED      the operator's request, bound to the work's final checkpoint and one host.
--   → ADMITTED   the host's claim: the exact ref update (old and new object ids) it will
--                make, before `claim_deadline` (database time), while the work is still
--                COMPLETED; it pushes only with a lease on that old id.
--   → DECLINED   the host made no claim and changed nothing (no such repository there, no
--                fast-forward, a merge conflict, the checkpoint unreadable): `detail` says why.
--   → UP_TO_DATE the remote already had it: nothing claimed, nothing pushed.
--   → EXPIRED    nobody claimed it in time (set when the next request of the work comes).
-- ADMITTED → COMPLETED | FAILED | NOT_DISPATCHED: what the host observed of the remote.
-- ADMITTED → UNKNOWN: the host could not tell whether the remote took it.
-- ADMITTED | UNKNOWN → RECONCILED: a late observation, or the operator with its evidence
--                (`mosaic workspace resolve`).
--
-- At most one of a work's effects is open (claimable, ADMITTED, UNKNOWN) at a time; none is
-- ever deleted, and nothing it was requested or admitted under changes.
CREATE TABLE workspace_effects (
    effect_id text PRIMARY KEY CHECK (effect_id ~ '^we-[0-9a-f]{32}$'),
    request_key text NOT NULL UNIQUE CHECK (length(request_key) BETWEEN 1 AND 200),
    kind text NOT NULL CHECK (kind IN ('push', 'merge')),
    assignment_id text NOT NULL REFERENCES assignments,
    repository text NOT NULL,
    reference text NOT NULL CHECK (reference ~ '^refs/heads/[A-Za-z0-9._/-]{1,200}$'),
    checkpoint_digest text NOT NULL CHECK (checkpoint_digest ~ '^sha256:[0-9a-f]{64}$'),
    commit_id text NOT NULL CHECK (commit_id ~ '^[0-9a-f]{40}$'),
    host_id text NOT NULL,
    requested_by text NOT NULL CHECK (length(requested_by) BETWEEN 1 AND 200),
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    claim_deadline timestamptz NOT NULL,
    state text NOT NULL DEFAULT 'REQUESTED' CHECK (state IN ('REQUESTED', 'ADMITTED', 'DECLINED', 'UP_TO_DATE',
        'EXPIRED', 'COMPLETED', 'FAILED', 'NOT_DISPATCHED', 'UNKNOWN', 'RECONCILED')),
    old_id text CHECK (old_id ~ '^[0-9a-f]{40}$'),
    new_id text CHECK (new_id ~ '^[0-9a-f]{40}$'),
    operation_digest text CHECK (operation_digest ~ '^sha256:[0-9a-f]{64}$'),
    admitted_at timestamptz,
    dispatch_until timestamptz,
    result_digest text CHECK (result_digest ~ '^sha256:[0-9a-f]{64}$'),
    detail text CHECK (detail IS NULL OR length(detail) BETWEEN 1 AND 400),
    reconciliation text CHECK (reconciliation IS NULL OR length(reconciliation) BETWEEN 1 AND 400),
    resolved_at timestamptz,
    -- Open exactly while REQUESTED, ADMITTED or UNKNOWN.
    CHECK ((state IN ('REQUESTED', 'ADMITTED', 'UNKNOWN')) = (resolved_at IS NULL)),
    -- An admission binds the whole update; nothing that never claimed has one.
    CHECK ((admitted_at IS NULL) = (state IN ('REQUESTED', 'DECLINED', 'UP_TO_DATE', 'EXPIRED'))),
    CHECK ((admitted_at IS NULL) = (old_id IS NULL) AND (admitted_at IS NULL) = (new_id IS NULL)
        AND (admitted_at IS NULL) = (operation_digest IS NULL) AND (admitted_at IS NULL) = (dispatch_until IS NULL)),
    -- A push puts exactly the checkpoint's commit on the ref; a merge the commit or a merge of it.
    CHECK (kind <> 'push' OR new_id IS NULL OR new_id = commit_id),
    -- What a host observed carries the digest of what it observed; a decline says why.
    CHECK (state NOT IN ('COMPLETED', 'FAILED', 'NOT_DISPATCHED', 'UP_TO_DATE', 'DECLINED') OR result_digest IS NOT NULL),
    CHECK (state <> 'DECLINED' OR detail IS NOT NULL),
    CHECK ((state = 'RECONCILED') = (reconciliation IS NOT NULL))
);
-- One admitted or unknown effect per work, whatever happens; a request is refused while
-- another is open or still claimable (checked under the work's row lock: a request nobody
-- claimed in time stays REQUESTED until the next request closes it EXPIRED).
CREATE UNIQUE INDEX workspace_effects_one_open ON workspace_effects (assignment_id)
    WHERE state IN ('ADMITTED', 'UNKNOWN');
CREATE INDEX workspace_effects_of_host ON workspace_effects (host_id) WHERE state IN ('REQUESTED', 'ADMITTED');

CREATE FUNCTION mosaic_workspace_effect_moves() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'mosaic: workspace effects are never deleted';
    END IF;
    IF NOT ((OLD.state, NEW.state) IN (('REQUESTED', 'ADMITTED'), ('REQUESTED', 'DECLINED'), ('REQUESTED', 'UP_TO_DATE'),
            ('REQUESTED', 'EXPIRED'), ('ADMITTED', 'COMPLETED'), ('ADMITTED', 'FAILED'), ('ADMITTED', 'NOT_DISPATCHED'),
            ('ADMITTED', 'UNKNOWN'), ('ADMITTED', 'RECONCILED'), ('UNKNOWN', 'RECONCILED'))) THEN
        RAISE EXCEPTION 'mosaic: workspace effect % cannot move from % to %', OLD.effect_id, OLD.state, NEW.state;
    END IF;
    IF (NEW.effect_id, NEW.request_key, NEW.kind, NEW.assignment_id, NEW.repository, NEW.reference,
        NEW.checkpoint_digest, NEW.commit_id, NEW.host_id, NEW.requested_by, NEW.sot_incarnation,
        NEW.coordinator_epoch, NEW.requested_at, NEW.claim_deadline)
       IS DISTINCT FROM
       (OLD.effect_id, OLD.request_key, OLD.kind, OLD.assignment_id, OLD.repository, OLD.reference,
        OLD.checkpoint_digest, OLD.commit_id, OLD.host_id, OLD.requested_by, OLD.sot_incarnation,
        OLD.coordinator_epoch, OLD.requested_at, OLD.claim_deadline) THEN
        RAISE EXCEPTION 'mosaic: what workspace effect % was requested under never changes', OLD.effect_id;
    END IF;
    IF OLD.admitted_at IS NOT NULL AND (NEW.old_id, NEW.new_id, NEW.operation_digest, NEW.admitted_at, NEW.dispatch_until)
       IS DISTINCT FROM (OLD.old_id, OLD.new_id, OLD.operation_digest, OLD.admitted_at, OLD.dispatch_until) THEN
        RAISE EXCEPTION 'mosaic: the update workspace effect % was admitted for never changes', OLD.effect_id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER workspace_effect_moves BEFORE UPDATE OR DELETE ON workspace_effects
    FOR EACH ROW EXECUTE FUNCTION mosaic_workspace_effect_moves();

-- The host of an effect reads the checkpoint it hands on from the store: recorded like a
-- restore, under the effect's id.
ALTER TABLE checkpoint_restores
    DROP CONSTRAINT checkpoint_restores_purpose_check,
    ADD CONSTRAINT checkpoint_restores_purpose_check
        CHECK (purpose IN ('same-assignment-recovery', 'handoff', 'cross-assignment-recovery', 'workspace-effect'));
