-- How other instances can tell that this instance's process is gone (expand-only: older
-- instances leave it NULL and are never judged gone).
--   PostgreSQL: the `application_name` of every database session of the instance; when no
--   session carries it any more, the process is dead (a killed process's sockets close).
--   SQLite: set too; the process is probed by host and pid (instances share one host).
-- A claim whose holder is gone is taken at its fast expiry even with a batch
-- mid-submission, instead of waiting for the slow expiry (see store/src/claims.rs).
ALTER TABLE instances ADD COLUMN session_tag TEXT NULL;
