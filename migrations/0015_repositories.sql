-- Mosaic schema 15: repositories and the assignments that work in them (issue: workspaces).
--
-- A repository is a roster declaration, not authority: a name for a git repository an
-- assignment's workspace is cloned from, where the supervisor finds it (a path on the
-- host named, or a URL any host can fetch). An assignment names at most one, with the ref
-- its branch `mosaic/<assignment_id>` starts from; both are fixed for the assignment's
-- life (a resume, a replacement or a handoff works in the same workspace).
CREATE TABLE repositories (
    name text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' AND name !~ '\.\.'),
    -- A path is meaningful on one host only; a URL on any (NULL).
    host_id text CHECK (host_id IS NULL OR btrim(host_id) <> ''),
    source_kind text NOT NULL CHECK (source_kind IN ('path', 'url')),
    source text NOT NULL CHECK (length(source) BETWEEN 1 AND 4096 AND source !~ '[[:cntrl:]]'),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK (source_kind = 'url' OR (host_id IS NOT NULL AND source ~ '^/'))
);

ALTER TABLE assignments
    ADD COLUMN repository text REFERENCES repositories (name),
    ADD COLUMN base_ref text CHECK (base_ref IS NULL OR (base_ref ~ '^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$' AND base_ref !~ '\.\.')),
    ADD CHECK ((repository IS NULL) = (base_ref IS NULL));
