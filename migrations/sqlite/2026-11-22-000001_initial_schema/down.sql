DROP TABLE batch_events;
DROP TABLE batch_statuses;
DROP TABLE batches;
DROP TABLE cluster_leases;
DROP TABLE service_id_claims;
DROP TABLE services;
DROP TABLE instances;
