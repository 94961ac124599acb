-- dltsub initial schema (PostgreSQL).
--
-- Every point in time is a BIGINT of microseconds since the Unix epoch, read from the
-- database clock (see store/src/clock.rs). One integer representation keeps the claim and
-- backoff queries identical on PostgreSQL and SQLite, and it does not overflow in 2038.

-- Live dltsub processes. A row whose heartbeat is older than a few ticks is pruned by the
-- cluster leader; fair share is computed over the rows that remain.
CREATE TABLE instances (
    instance_id      TEXT PRIMARY KEY,          -- "hostname:pid:suffix8", readable by operators
    hostname         TEXT NOT NULL,
    pid              BIGINT NOT NULL,
    version          TEXT NOT NULL,
    capacity         INTEGER NOT NULL CHECK (capacity > 0),
    state            TEXT NOT NULL CHECK (state IN ('running', 'draining')),
    started_at_us    BIGINT NOT NULL,
    heartbeat_at_us  BIGINT NOT NULL
);

-- A ledger service that batches are submitted to (for scabbard, "circuit::service").
CREATE TABLE services (
    service_id     TEXT PRIMARY KEY,
    max_in_flight  INTEGER NOT NULL DEFAULT 1 CHECK (max_in_flight >= 1),
    paused         BOOLEAN NOT NULL DEFAULT FALSE,
    created_at_us  BIGINT NOT NULL
);

-- The right to submit one service's batches. `epoch` is the fencing token: it grows by one
-- on every acquisition and never on renewal. Past `fast_expiry_us` the claim may be taken
-- only if nothing of the service is mid-submission; past `slow_expiry_us`, regardless.
CREATE TABLE service_id_claims (
    service_id      TEXT PRIMARY KEY REFERENCES services (service_id),
    claimant        TEXT NULL,
    epoch           BIGINT NOT NULL DEFAULT 0,
    fast_expiry_us  BIGINT NOT NULL DEFAULT 0,
    slow_expiry_us  BIGINT NOT NULL DEFAULT 0,
    claimed_at_us   BIGINT NULL,
    -- A stable pseudo-random number per service (a hash of its id). Instances try services
    -- in an order rotated by their position in the live-instance list, so they don't all
    -- reach for the same rows first.
    shard           BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX service_id_claims_claimant ON service_id_claims (claimant);

-- Cluster-wide leases with the same expiry and epoch rules as service claims; the holder of
-- 'leader' runs the chores (pruning dead instances, retention).
CREATE TABLE cluster_leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NULL,
    epoch       BIGINT NOT NULL DEFAULT 0,
    expiry_us   BIGINT NOT NULL DEFAULT 0
);

-- Accepted batches, immutable once written. `seq` is the global order of acceptance; per
-- service it is also the submission order (enqueue serialises on the service row so that a
-- reader never sees seq n of a service before every smaller seq of it).
CREATE TABLE batches (
    seq               BIGSERIAL PRIMARY KEY,
    service_id        TEXT NOT NULL REFERENCES services (service_id),
    batch_id          TEXT NOT NULL CHECK (batch_id ~ '^[0-9a-fA-F]{128}$'),  -- a header signature, never truncated
    serialized_batch  BYTEA NOT NULL,
    created_at_us     BIGINT NOT NULL,
    CONSTRAINT batches_service_batch_unique UNIQUE (service_id, batch_id)
);
CREATE INDEX batches_batch_id ON batches (batch_id);

-- The mutable state of each batch, kept apart from the (large, immutable) batch bytes so
-- that the frequent status updates never rewrite them.
CREATE TABLE batch_statuses (
    seq                 BIGINT PRIMARY KEY REFERENCES batches (seq),
    service_id          TEXT NOT NULL,
    status              TEXT NOT NULL CHECK (status IN ('QUEUED', 'SUBMITTING', 'PENDING', 'VALID',
                                                        'IN_DOUBT', 'COMMITTED', 'INVALID', 'CANCELLED')),
    attempts            INTEGER NOT NULL DEFAULT 0,
    submit_epoch        BIGINT NULL,             -- epoch of the claim under which it was last submitted
    submitted_by        TEXT NULL,               -- instance that last submitted it
    next_attempt_at_us  BIGINT NOT NULL,         -- backoff: not submittable before this time
    unknown_since_us    BIGINT NULL,             -- first time the ledger answered Unknown, in a row
    dlt_message         TEXT NULL,               -- the ledger's own status message (JSON)
    last_error          TEXT NULL,
    updated_at_us       BIGINT NOT NULL
);
-- Only unfinished batches are ever scanned by the submission path; terminal ones drop out
-- of this index, so it stays as small as the backlog.
CREATE INDEX batch_statuses_active ON batch_statuses (service_id, seq)
    WHERE status IN ('QUEUED', 'SUBMITTING', 'PENDING', 'VALID', 'IN_DOUBT');

-- Append-only history: every status transition of every batch.
CREATE TABLE batch_events (
    event_id     BIGSERIAL PRIMARY KEY,
    seq          BIGINT NOT NULL REFERENCES batches (seq),
    old_status   TEXT NULL,
    new_status   TEXT NOT NULL,
    epoch        BIGINT NULL,
    instance_id  TEXT NULL,
    detail       TEXT NULL,
    at_us        BIGINT NOT NULL
);
CREATE INDEX batch_events_seq ON batch_events (seq);
