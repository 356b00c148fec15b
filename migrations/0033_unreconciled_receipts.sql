-- Mosaic schema 33: the "no unreconciled end on this lane" predicate stays O(1) as history grows.
--
-- The reserve CAS, the fence step, a handoff's target check and placement's candidates each
-- ask whether a lane incarnation has a termination receipt not yet reconciled. With only
-- the (lane incarnation, generation) index, that reads every receipt the lane has ever had:
-- a long-lived lane made every reservation slower. Unreconciled receipts are few at any
-- moment (each is reconciled at ingest or by the reconciler soon after): this index holds
-- only them.
CREATE INDEX termination_receipts_unreconciled ON termination_receipts (lane_incarnation_id)
    WHERE reconciled_at IS NULL;
