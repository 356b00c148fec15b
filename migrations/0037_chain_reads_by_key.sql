-- Mosaic schema 37: a chain is found from its lane incarnation and generation by an index
-- (a host's report names generations, not reservations), so that reading a chain costs
-- the same however long the lane's history is (issue 22: a report's chain read scanned
-- every reservation ever made).
CREATE INDEX reservations_by_generation ON reservations (lane_incarnation_id, generation)
    WHERE generation IS NOT NULL;

-- The chain row's latest receipt time (`max(decided_at)` of its assignment's receipts) is
-- one index probe, not a visit to every receipt the assignment ever had.
CREATE INDEX transition_receipts_assignment_at ON transition_receipts (assignment_id, decided_at);
DROP INDEX transition_receipts_assignment;
