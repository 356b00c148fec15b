-- Mosaic schema 30: an elastic lane's incarnation closed to work on its own row.
--
-- A destruction (the TTL's or an operator's), a lease's quarantine, and a lane made outside
-- its lease set `lease_closed_at` on the incarnation in the same transaction. The reserve
-- and handoff CASes update that row and test the column on it, so a reservation racing a
-- destruction is decided by the row lock: whichever commits second sees the other (a
-- predicate over `lane_leases` alone would be read from the statement's snapshot).
ALTER TABLE lane_incarnations ADD COLUMN lease_closed_at timestamptz;
