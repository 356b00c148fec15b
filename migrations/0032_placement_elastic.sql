-- Mosaic schema 32: an elastic placement records how its host was chosen.
--
-- `assign --elastic` with no eligible lane leases a lane on a host chosen by a rule
-- (connected hosts by fewest busy lanes, then host id; the first that admits the lease).
-- The choice is recorded with the placement, whole, so an audit recomputes it like the
-- lane choice: the inputs under which no lane was eligible, every roster host with its
-- busy count and session, the refusals in order, and the lease. NULL for a placement that
-- found an eligible lane at once. Like the rest of a placement, never changed.
ALTER TABLE placements ADD COLUMN elastic jsonb
    CHECK (elastic IS NULL OR (jsonb_typeof(elastic) = 'object' AND elastic ? 'leased_host' AND elastic ? 'lease_id'
                               AND elastic ? 'first_inputs' AND elastic ? 'first_inputs_digest'));
