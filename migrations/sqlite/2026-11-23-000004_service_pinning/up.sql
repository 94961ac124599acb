-- Pinning (from Disbatch): instances carry labels, and a service may be pinned to a label
-- or kept away from one. Expand-only: older instances leave `labels` empty and ignore the
-- pins, so pins hold once every instance runs a version that reads them.
--
-- An instance's labels, comma-separated, each [a-z0-9][a-z0-9.-]* (validated by dltsub;
-- no LIKE wildcards, so `',' || labels || ','` LIKE '%,label,%' is an exact match on
-- both backends). Empty: no labels.
ALTER TABLE instances ADD COLUMN labels TEXT NOT NULL DEFAULT '';
-- Only instances carrying `pin_label` may hold the service (NULL: any instance).
ALTER TABLE services ADD COLUMN pin_label TEXT NULL;
-- No instance carrying `exclude_label` may hold the service (NULL: none excluded).
ALTER TABLE services ADD COLUMN exclude_label TEXT NULL;
-- The console's throughput and commit latency over the last minutes read recent commits.
CREATE INDEX batch_events_committed_at ON batch_events (at_us) WHERE new_status = 'COMMITTED';
