DROP INDEX batch_events_committed_at;
ALTER TABLE services DROP COLUMN exclude_label;
ALTER TABLE services DROP COLUMN pin_label;
ALTER TABLE instances DROP COLUMN labels;
