-- Mosaic schema 36: an assignment's continuation loop budget used up is an operator event
-- (issue 23, "budget exhaustion"), recorded in the acceptance that spent the last of it,
-- like every other event. The work itself goes on (nothing blocks it); every further
-- continuation is refused — also the watchdog's own after a rate limit — so the operator
-- hears of it once, when it happens, not at the next refusal.
CREATE FUNCTION mosaic_notify_budget_exhausted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_lane text;
BEGIN
    SELECT li.lane_id INTO v_lane FROM lane_incarnations li
     WHERE li.lane_incarnation_id = NEW.lane_incarnation_id;
    PERFORM mosaic_notify(
        'exhausted/continuation-budget/' || NEW.assignment_id || '/' || pg_current_xact_id()::text,
        'exhausted',
        jsonb_build_object('assignment_id', NEW.assignment_id, 'lane_id', v_lane,
            'code', 'continuation-budget-exhausted'));
    RETURN NULL;
END $$;
CREATE TRIGGER notify_budget_exhausted AFTER UPDATE OF continuation_budget ON assignments
    FOR EACH ROW WHEN (NEW.continuation_budget = 0 AND OLD.continuation_budget > 0)
    EXECUTE FUNCTION mosaic_notify_budget_exhausted();
