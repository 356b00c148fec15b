-- Mosaic schema 38: a stop finds its work's latest termination receipt by an index. The
-- request to end an assignment reads that receipt (whether its cleanup was verified, its
-- digest, its checkpoint) three times, and `termination_receipts` had no index on the
-- assignment: each stop read every receipt ever ingested (issue 22).
CREATE INDEX termination_receipts_assignment_at ON termination_receipts (assignment_id, ingested_at);
