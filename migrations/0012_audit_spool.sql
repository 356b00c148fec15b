-- Audit records a coordinator could not write while the database was unreachable are
-- spooled on its disk and written when it returns, with the time they were recorded. Each
-- carries the id it was spooled under, so a replay cut short by a crash (rows written, the
-- spool not yet emptied) writes none of them twice.
ALTER TABLE audit ADD COLUMN spool_id text;
CREATE UNIQUE INDEX audit_spool_id ON audit (spool_id) WHERE spool_id IS NOT NULL;
