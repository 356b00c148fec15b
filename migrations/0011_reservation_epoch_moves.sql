-- A reservation's epoch is the version of its lane incarnation's reservation authority
-- (spec §4: strictly increasing on replacement). Reservations are immutable, so replacing
-- the authority is inserting the next reservation for the same lane incarnation; its epoch
-- is one more than the highest that incarnation ever had. The inserting statement computes
-- it (under the lane row's lock, which every reserving CAS takes first); this constraint
-- refuses any insert that would not move it forward, so a chain can never be mistaken for
-- the one it replaced by its epoch. (Rows written before this migration keep epoch 1; the
-- next reservation of their incarnation gets 2.)

CREATE INDEX reservations_by_incarnation_epoch ON reservations (lane_incarnation_id, reservation_epoch);

CREATE FUNCTION mosaic_reservation_epoch_moves() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    highest bigint;
BEGIN
    SELECT max(reservation_epoch) INTO highest FROM reservations WHERE lane_incarnation_id = NEW.lane_incarnation_id;
    IF NEW.reservation_epoch < 1 OR NEW.reservation_epoch <= coalesce(highest, 0) THEN
        RAISE EXCEPTION 'mosaic: reservation epoch % does not replace epoch % of lane incarnation %',
            NEW.reservation_epoch, coalesce(highest, 0), NEW.lane_incarnation_id;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER reservation_epoch_moves BEFORE INSERT ON reservations
    FOR EACH ROW EXECUTE FUNCTION mosaic_reservation_epoch_moves();

CREATE FUNCTION mosaic_reservation_epoch_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'mosaic: a reservation''s epoch never changes';
END $$;

CREATE TRIGGER reservation_epoch_fixed BEFORE UPDATE OF reservation_epoch ON reservations
    FOR EACH ROW WHEN (NEW.reservation_epoch IS DISTINCT FROM OLD.reservation_epoch)
    EXECUTE FUNCTION mosaic_reservation_epoch_fixed();
