-- Mosaic authority schema, version 2: everything a chain needs to continue lives in these
-- rows, and the database itself refuses an authority change that was not made by a current
-- leader's transition.
--
-- 1. Every authority table may change only in a transaction that also writes a transition
--    receipt (a deferred constraint trigger checks it at COMMIT).
-- 2. A transition receipt may commit only while its epoch is the current, unreleased,
--    unexpired leadership *at commit time* (`clock_timestamp()` evaluated during COMMIT).
-- 3. One open reservation per lane incarnation; stop intents, the task text and the fence
--    salt are rows, so a fresh coordinator process can drive any chain on.

-- The transaction that wrote each receipt, so the triggers below can find "a receipt of
-- this very transaction".
ALTER TABLE transition_receipts ADD COLUMN xact xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX transition_receipts_xact ON transition_receipts (xact);
CREATE INDEX transition_receipts_assignment ON transition_receipts (assignment_id);

-- The task of each attempt (a resumed assignment may be given a new task text), and what
-- the operator supplied for scope, holds and completion: the digests are computed from these.
ALTER TABLE attempts ADD COLUMN task_text text NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN task_digest text NOT NULL DEFAULT '';
ALTER TABLE assignments ADD COLUMN scope jsonb NOT NULL DEFAULT '[]';
ALTER TABLE assignments ADD COLUMN holds jsonb NOT NULL DEFAULT '[]';
ALTER TABLE assignments ADD COLUMN completion_policy text NOT NULL DEFAULT 'operator-evidence/v1';
-- Evidence the operator supplied with a completion request (a digest, never the content).
ALTER TABLE assignments ADD COLUMN requested_evidence_digest text;
ALTER TABLE assignments ADD COLUMN finalized_at timestamptz;

-- The fence token is derived from the coordinator secret and this per-reservation salt; the
-- token itself is never stored (see coordinator/secret.rs). Version-1 rows have no salt:
-- their chains cannot be resumed and are dispositioned by the next takeover.
ALTER TABLE reservations ADD COLUMN fence_salt text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX one_open_reservation_per_incarnation ON reservations (lane_incarnation_id) WHERE released_at IS NULL;
CREATE INDEX reservations_assignment ON reservations (assignment_id);

-- A generation the coordinator wants ended: the host is told (again on every reconnect)
-- until its termination receipt arrives.
ALTER TABLE generations ADD COLUMN stop_requested_at timestamptz;
ALTER TABLE generations ADD COLUMN stop_reason text;
ALTER TABLE generations ADD COLUMN end_receipt text;

-- What the host reported about the lane (a host-side quarantine, shown to operators), and an
-- operator's request to have the host destroy and recreate the lane.
ALTER TABLE lane_incarnations ADD COLUMN host_quarantine_reason text;
ALTER TABLE lane_incarnations ADD COLUMN recreate_requested_at timestamptz;

-- The coordinator's copy of a termination receipt names what it concerned.
ALTER TABLE termination_receipts ADD COLUMN reservation_id text;
ALTER TABLE termination_receipts ADD COLUMN assignment_id text;
ALTER TABLE termination_receipts ADD COLUMN assignment_attempt_id text;
ALTER TABLE termination_receipts ADD COLUMN responsibility_owner text;
ALTER TABLE termination_receipts ADD COLUMN execution_owner text;
CREATE UNIQUE INDEX one_receipt_per_generation ON termination_receipts (lane_incarnation_id, generation);

-- What each host advertised at its last hello: declared capabilities, not authority.
CREATE TABLE hosts (
    host_id text PRIMARY KEY,
    runtimes text[] NOT NULL DEFAULT '{}',
    last_hello_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX audit_at ON audit (at);

-- (2) A receipt commits only under the current leadership, checked at COMMIT.
CREATE FUNCTION mosaic_receipt_leader_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM leadership l
        WHERE l.epoch = NEW.coordinator_epoch AND l.sot_incarnation = NEW.sot_incarnation
          AND NOT l.released AND l.lease_expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION USING ERRCODE = 'MS001',
            MESSAGE = format('mosaic: epoch %s is not the current unexpired leadership at commit', NEW.coordinator_epoch);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER receipt_leader_at_commit AFTER INSERT ON transition_receipts
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mosaic_receipt_leader_at_commit();

-- (1) No authority change without a transition receipt in the same transaction.
CREATE FUNCTION mosaic_requires_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM transition_receipts WHERE xact = pg_current_xact_id()) THEN
        RAISE EXCEPTION USING ERRCODE = 'MS002',
            MESSAGE = format('mosaic: %s changed without a transition receipt in the same transaction', TG_TABLE_NAME);
    END IF;
    RETURN NULL;
END $$;
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['lanes', 'lane_incarnations', 'assignments', 'attempts', 'reservations',
                             'generations', 'contracts', 'challenges', 'ack_receipts', 'leases',
                             'termination_receipts', 'epochs'] LOOP
        EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER INSERT OR UPDATE OR DELETE ON %I '
                       'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mosaic_requires_receipt()',
                       t || '_requires_receipt', t);
    END LOOP;
END $$;
