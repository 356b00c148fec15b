-- Mosaic schema 39: a generation's checkpoint debt is a fact on its own row, kept by the
-- database.
--
-- A generation that ran a process for work in a repository owes its lane a checkpoint once
-- its end receipt is known; its end checkpoint, or the operator's waiver (a release of the
-- lane's quarantine), pays it. The fence needs every earlier generation's debt paid.
--
-- It used to be derived each time from the history (receipt, reservation, assignment and
-- checkpoint of each of the lane's generations), which had two faults:
-- * a fence read every generation its lane ever ran (O(history): issue 22);
-- * a checkpoint deleted by its retention policy (or the operator) made its generation
--   owe again: the lane could never be fenced, so never take work, again.
-- Now the debt is incurred once, when the end receipt is recorded, and only its checkpoint
-- or a waiver clears it; a deletion later clears nothing and owes nothing.
ALTER TABLE generations ADD COLUMN checkpoint_owed boolean NOT NULL DEFAULT false;

-- What a generation owes when its end receipt `receipt` is recorded. (PL/pgSQL: its plan
-- is cached per connection; as an SQL function called from a trigger it was planned again
-- on every call, 0.4 ms a receipt.) An end checkpoint is the one with neither a handoff nor
-- a request (`checkpoints_one_origin`): said so, the lookup uses its unique index.
CREATE FUNCTION mosaic_checkpoint_owed(inc text, gen bigint, receipt text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM termination_receipts tg
                   WHERE tg.idempotency_key = receipt
                     AND jsonb_typeof(tg.body->'process_identity') = 'object')
       AND EXISTS (SELECT 1 FROM reservations rg JOIN assignments ag ON ag.assignment_id = rg.assignment_id
                   WHERE rg.lane_incarnation_id = inc AND rg.generation = gen
                     AND ag.repository IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM checkpoints k
                       WHERE k.lane_incarnation_id = inc AND k.generation = gen
                         AND k.handoff_id IS NULL AND k.request_seq IS NULL
                         AND k.termination_receipt IS NOT NULL);
END $$;

-- On the generation's own row: its end receipt is written once; recording the operator's
-- waiver pays the debt; the end receipt, once recorded, decides it; nothing else clears it
-- but its checkpoint.
CREATE FUNCTION mosaic_generation_checkpoint_debt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.end_receipt IS NOT NULL
       AND NEW.end_receipt IS DISTINCT FROM OLD.end_receipt THEN
        RAISE EXCEPTION USING ERRCODE = 'MS003',
            MESSAGE = format('mosaic: generation %s of %s has its end receipt already',
                             NEW.generation, NEW.lane_incarnation_id);
    END IF;
    IF NEW.checkpoint_waived_at IS NOT NULL THEN
        NEW.checkpoint_owed := false;
    ELSIF TG_OP = 'INSERT' OR NEW.end_receipt IS DISTINCT FROM OLD.end_receipt THEN
        NEW.checkpoint_owed := NEW.end_receipt IS NOT NULL
            AND mosaic_checkpoint_owed(NEW.lane_incarnation_id, NEW.generation, NEW.end_receipt);
    ELSIF OLD.checkpoint_owed AND NOT NEW.checkpoint_owed AND NOT EXISTS (
            SELECT 1 FROM checkpoints k
            WHERE k.lane_incarnation_id = NEW.lane_incarnation_id AND k.generation = NEW.generation
              AND k.handoff_id IS NULL AND k.request_seq IS NULL
              AND k.termination_receipt IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'MS003',
            MESSAGE = format('mosaic: generation %s of %s owes a checkpoint; only its checkpoint or the operator''s waiver clears that',
                             NEW.generation, NEW.lane_incarnation_id);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER generations_checkpoint_debt BEFORE INSERT OR UPDATE ON generations
    FOR EACH ROW EXECUTE FUNCTION mosaic_generation_checkpoint_debt();

-- The end receipt's row may be inserted after the generation names it (same transaction).
CREATE FUNCTION mosaic_receipt_checkpoint_debt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE generations g SET checkpoint_owed = true
    WHERE g.lane_incarnation_id = NEW.lane_incarnation_id AND g.generation = NEW.generation
      AND g.end_receipt = NEW.idempotency_key AND g.checkpoint_waived_at IS NULL
      AND NOT g.checkpoint_owed
      AND mosaic_checkpoint_owed(g.lane_incarnation_id, g.generation, g.end_receipt);
    RETURN NULL;
END $$;
CREATE TRIGGER termination_receipts_checkpoint_debt AFTER INSERT ON termination_receipts
    FOR EACH ROW EXECUTE FUNCTION mosaic_receipt_checkpoint_debt();

-- Its end checkpoint pays it.
CREATE FUNCTION mosaic_checkpoint_pays_debt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE generations SET checkpoint_owed = false
    WHERE lane_incarnation_id = NEW.lane_incarnation_id AND generation = NEW.generation
      AND checkpoint_owed;
    RETURN NULL;
END $$;
CREATE TRIGGER checkpoints_pay_debt AFTER INSERT OR UPDATE OF termination_receipt ON checkpoints
    FOR EACH ROW WHEN (NEW.termination_receipt IS NOT NULL)
    EXECUTE FUNCTION mosaic_checkpoint_pays_debt();

-- The debts there are now: the old derivation, less every generation whose end checkpoint
-- was deleted (recorded in checkpoint_deletions: paid then; an end checkpoint's record has
-- neither handoff nor request and its purpose, where a harness artifact's deletion has
-- 'operator-recovery'). A function, so a test can run it over rows a real lane left.
CREATE FUNCTION mosaic_backfill_checkpoint_debts() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    UPDATE generations g SET checkpoint_owed = true
    WHERE g.checkpoint_waived_at IS NULL AND g.end_receipt IS NOT NULL AND NOT g.checkpoint_owed
      AND mosaic_checkpoint_owed(g.lane_incarnation_id, g.generation, g.end_receipt)
      AND NOT EXISTS (SELECT 1 FROM checkpoint_deletions d
                      WHERE d.lane_incarnation_id = g.lane_incarnation_id AND d.generation = g.generation
                        AND d.handoff_id IS NULL AND d.request_seq IS NULL
                        AND d.purpose = 'same-assignment-recovery');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
-- Outside any transition (the schema's own change, not an authority change), so the
-- receipt check is paused for it.
ALTER TABLE generations DISABLE TRIGGER generations_requires_receipt;
SELECT mosaic_backfill_checkpoint_debts();
ALTER TABLE generations ENABLE TRIGGER generations_requires_receipt;

-- A fence finds its lane's unpaid debts by this index alone.
CREATE INDEX generations_owing_checkpoint ON generations (lane_incarnation_id) WHERE checkpoint_owed;
