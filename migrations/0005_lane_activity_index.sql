-- Mosaic schema 5: when a lane last changed is read for every lane on every status (the
-- `since` of `mosaic lanes` and the terminal UI): index the receipts by incarnation.
CREATE INDEX transition_receipts_incarnation ON transition_receipts (lane_incarnation_id, decided_at);
