-- Indexes for the hot paths, so none of them scans the history of finished batches
-- (expand-only: safe while older instances run).

-- "Is anything of this service mid-submission?" — asked by every acquire and release.
CREATE INDEX batch_statuses_submitting ON batch_statuses (service_id)
    WHERE status = 'SUBMITTING';

-- The observer's "which batches wait for the ledger's verdict?"
CREATE INDEX batch_statuses_awaiting_verdict ON batch_statuses (service_id, seq)
    WHERE status IN ('PENDING', 'VALID', 'IN_DOUBT');
