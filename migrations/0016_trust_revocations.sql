-- Mosaic schema 16: revocations of trust registry keys and principals (issue: deployment).
--
-- `mosaic trust revoke SUBJECT` revokes a key (`host:h/session`) or every key of a
-- principal (`host:h`) at once and for good: the revocation is authority, so it lives
-- here, decided by a fenced transition (its transition receipt is its audit), and every
-- coordinator of the database applies it on top of the registry file it loads — a
-- restart, a reload or a standby taking over never brings a revoked key back. What is
-- revoked is the key material the subject had (`public_keys`): the same public key under
-- any id stays refused, and a host enrolled again under new keys is trusted again. An
-- operator has no signing keys: `operator:o` revokes its certificate's principal, by name.
CREATE TABLE trust_revocations (
    subject text PRIMARY KEY CHECK (subject ~ '^(coordinator|host):[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/(session|ordinary))?$'
                                    OR subject ~ '^operator:[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    public_keys text[] NOT NULL DEFAULT '{}' CHECK (array_to_string(public_keys, ',') ~ '^([0-9a-f]{64}(,[0-9a-f]{64})*)?$'),
    CHECK ((subject LIKE 'operator:%') = (cardinality(public_keys) = 0)),
    revoked_epoch bigint NOT NULL,
    revoked_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Where each coordinator process (by its launch id, as the leadership row names its
-- holder's) takes operator requests: a standby answering `not-leader` names the leader's
-- address, and the CLI follows it. A declaration, not authority (never read to decide).
CREATE TABLE coordinator_endpoints (
    launch_id text PRIMARY KEY,
    principal text NOT NULL,
    operator_address text CHECK (operator_address IS NULL OR length(operator_address) BETWEEN 1 AND 300),
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
