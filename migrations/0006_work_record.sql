-- Mosaic schema 6: the work record (no silent parking).
--
-- Every assignment carries who owns it, what happens next, the inactivity policy it was
-- approved under and the database-time deadline that policy gives it. The database refuses
-- unfinished work without an owner or a next action, a blocked claim without evidence, and
-- a policy edited after it was used; the work status follows the lifecycle by trigger, so no
-- code path can finish work without saying it is done.

-- Versioned inactivity policies. A (policy_id) is `name@version`; its body is frozen and its
-- digest computed here from the body, never supplied.
CREATE TABLE inactivity_policies (
    policy_id text PRIMARY KEY CHECK (policy_id ~ '^[a-z0-9][a-z0-9-]{0,62}@[1-9][0-9]{0,8}$'),
    body jsonb NOT NULL,
    digest text NOT NULL,
    warn_after_ms bigint NOT NULL,
    escalate_after_ms bigint NOT NULL,
    replace_after_ms bigint NOT NULL,
    replacements_before_reassign integer NOT NULL CHECK (replacements_before_reassign >= 0),
    max_attempts integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 100),
    exhaustion text NOT NULL CHECK (exhaustion IN ('blocked')),
    evidence_kinds text[] NOT NULL CHECK (cardinality(evidence_kinds) > 0),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (0 < warn_after_ms AND warn_after_ms < escalate_after_ms AND escalate_after_ms < replace_after_ms
           AND replace_after_ms <= 604800000)
);

-- The digest is the SHA-256 of the body's canonical jsonb text (jsonb orders keys and
-- normalizes whitespace), and the typed columns must agree with the body.
CREATE FUNCTION mosaic_policy_digest() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'mosaic: an inactivity policy version is frozen; publish a new version';
    END IF;
    NEW.digest := 'sha256:' || encode(sha256(convert_to(NEW.body::text, 'UTF8')), 'hex');
    IF (NEW.body->>'warn_after_ms')::bigint IS DISTINCT FROM NEW.warn_after_ms
       OR (NEW.body->>'escalate_after_ms')::bigint IS DISTINCT FROM NEW.escalate_after_ms
       OR (NEW.body->>'replace_after_ms')::bigint IS DISTINCT FROM NEW.replace_after_ms
       OR (NEW.body->>'replacements_before_reassign')::integer IS DISTINCT FROM NEW.replacements_before_reassign
       OR (NEW.body->>'max_attempts')::integer IS DISTINCT FROM NEW.max_attempts
       OR NEW.body->>'exhaustion' IS DISTINCT FROM NEW.exhaustion
       OR NEW.body->'evidence_kinds' IS DISTINCT FROM to_jsonb(NEW.evidence_kinds) THEN
        RAISE EXCEPTION 'mosaic: a policy''s columns must be its body';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER inactivity_policy_frozen BEFORE INSERT OR UPDATE OR DELETE ON inactivity_policies
    FOR EACH ROW EXECUTE FUNCTION mosaic_policy_digest();

-- The policy every assignment gets unless the operator names another: warn after 10 min
-- without progress, escalate after 20, replace the generation after 30; two replacements on
-- one lane, then another lane; six attempts in all, then blocked for review.
INSERT INTO inactivity_policies (policy_id, body, digest, warn_after_ms, escalate_after_ms, replace_after_ms,
                                 replacements_before_reassign, max_attempts, exhaustion, evidence_kinds)
VALUES ('default@1',
        '{"warn_after_ms": 600000, "escalate_after_ms": 1200000, "replace_after_ms": 1800000,
          "replacements_before_reassign": 2, "max_attempts": 6, "exhaustion": "blocked",
          "evidence_kinds": ["commit", "file-set", "test-result"]}',
        '', 600000, 1200000, 1800000, 2, 6, 'blocked', ARRAY['commit', 'file-set', 'test-result']);

ALTER TABLE assignments ADD COLUMN work_status text NOT NULL DEFAULT 'active'
    CHECK (work_status IN ('active', 'blocked', 'handoff', 'done'));
ALTER TABLE assignments ADD COLUMN inactivity_policy text NOT NULL DEFAULT 'default@1' REFERENCES inactivity_policies;
ALTER TABLE assignments ADD COLUMN inactivity_policy_digest text;
ALTER TABLE assignments ADD COLUMN inactivity_base_at timestamptz;
ALTER TABLE assignments ADD COLUMN inactivity_deadline timestamptz;
ALTER TABLE assignments ADD COLUMN last_progress_at timestamptz;
-- Where the watchdog stands: none → warned → escalated → replacing (the generation is being
-- ended; the next attempt is the watchdog's to start).
ALTER TABLE assignments ADD COLUMN watchdog_step text NOT NULL DEFAULT 'none'
    CHECK (watchdog_step IN ('none', 'warned', 'escalated', 'replacing'));
-- Attempts made before the current budget (an operator's unblock grants a fresh one).
ALTER TABLE assignments ADD COLUMN attempts_before_budget integer NOT NULL DEFAULT 0;
ALTER TABLE assignments ADD COLUMN blocker_code text
    CHECK (blocker_code IS NULL OR blocker_code ~ '^[a-z0-9][a-z0-9-]{0,62}$');
ALTER TABLE assignments ADD COLUMN blocker_evidence_digest text
    CHECK (blocker_evidence_digest IS NULL OR blocker_evidence_digest ~ '^sha256:[0-9a-f]{64}$');
ALTER TABLE assignments ADD COLUMN handoff_ack text;

-- Existing rows get their work record here, outside any transition (the migration is the
-- schema's own change, not an authority change), so the receipt check is paused for it.
ALTER TABLE assignments DISABLE TRIGGER assignments_requires_receipt;
UPDATE assignments a SET inactivity_policy_digest = p.digest FROM inactivity_policies p WHERE p.policy_id = a.inactivity_policy;
UPDATE assignments SET work_status = 'done' WHERE lifecycle IN ('COMPLETED', 'FAILED', 'CANCELLED');
UPDATE assignments SET work_status = 'blocked', blocker_code = 'quarantined',
       blocker_evidence_digest = coalesce(final_evidence_digest, requested_evidence_digest)
 WHERE lifecycle = 'QUARANTINED';
ALTER TABLE assignments ENABLE TRIGGER assignments_requires_receipt;

-- The digest recorded is the policy's own (not a value the caller typed).
CREATE FUNCTION mosaic_work_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.inactivity_policy IS DISTINCT FROM OLD.inactivity_policy THEN
        SELECT digest INTO NEW.inactivity_policy_digest FROM inactivity_policies WHERE policy_id = NEW.inactivity_policy;
    END IF;
    -- The work status follows an outcome: finished work is done; a quarantined outcome is
    -- blocked for review, with the outcome's evidence.
    IF NEW.lifecycle IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN
        NEW.work_status := 'done';
    ELSIF NEW.lifecycle = 'QUARANTINED' THEN
        NEW.work_status := 'blocked';
        NEW.blocker_code := 'quarantined';
        NEW.blocker_evidence_digest := coalesce(NEW.final_evidence_digest, NEW.requested_evidence_digest, NEW.blocker_evidence_digest);
    ELSIF TG_OP = 'UPDATE' AND OLD.work_status = 'done' THEN
        RAISE EXCEPTION 'mosaic: done work does not come back';
    END IF;
    IF NEW.work_status <> 'blocked' THEN
        NEW.blocker_code := NULL;
        NEW.blocker_evidence_digest := NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER work_record BEFORE INSERT OR UPDATE ON assignments FOR EACH ROW EXECUTE FUNCTION mosaic_work_record();

ALTER TABLE assignments ADD CONSTRAINT work_status_matches_lifecycle
    CHECK ((work_status = 'done') = (lifecycle IN ('COMPLETED', 'FAILED', 'CANCELLED')));
-- Rule: unfinished work always has an owner and an executable next action.
ALTER TABLE assignments ADD CONSTRAINT unfinished_work_is_owned
    CHECK (work_status = 'done' OR (btrim(responsibility_owner) <> '' AND btrim(next_action) <> ''));
-- Blocked only with a canonical code and the digest of its evidence.
ALTER TABLE assignments ADD CONSTRAINT blocked_has_evidence
    CHECK (work_status <> 'blocked' OR (blocker_code IS NOT NULL AND blocker_evidence_digest IS NOT NULL));
ALTER TABLE assignments ADD CONSTRAINT policy_digest_recorded CHECK (inactivity_policy_digest IS NOT NULL);

-- Progress receipts: each accepted one, immutable. One piece of evidence counts once per
-- assignment, so a replayed or repeated claim cannot extend anything.
CREATE TABLE progress_receipts (
    progress_id text PRIMARY KEY,
    assignment_id text NOT NULL REFERENCES assignments,
    assignment_attempt_id text NOT NULL REFERENCES attempts,
    lane_incarnation_id text NOT NULL,
    generation bigint NOT NULL,
    reservation_id text NOT NULL REFERENCES reservations,
    evidence_kind text NOT NULL,
    evidence_digest text NOT NULL CHECK (evidence_digest ~ '^sha256:[0-9a-f]{64}$'),
    message_id text NOT NULL UNIQUE,
    sot_incarnation text NOT NULL,
    coordinator_epoch bigint NOT NULL,
    accepted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    new_deadline timestamptz NOT NULL,
    UNIQUE (assignment_id, evidence_digest)
);
CREATE TRIGGER progress_receipts_immutable BEFORE UPDATE OR DELETE ON progress_receipts
    FOR EACH ROW EXECUTE FUNCTION mosaic_immutable();
CREATE CONSTRAINT TRIGGER progress_receipts_requires_receipt AFTER INSERT OR UPDATE OR DELETE ON progress_receipts
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mosaic_requires_receipt();
CREATE CONSTRAINT TRIGGER inactivity_policies_requires_receipt AFTER INSERT ON inactivity_policies
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mosaic_requires_receipt();

CREATE INDEX assignments_watchdog ON assignments (inactivity_deadline) WHERE work_status = 'active';
