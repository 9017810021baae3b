-- Manifest migration 15: the lease columns of chunks, leases of chunks
-- across transactions (manifest_lease.go).

ALTER TABLE {s}.chunks ADD COLUMN lease_key text, ADD COLUMN lease_epoch bigint NOT NULL DEFAULT 0, ADD COLUMN leased_at timestamptz;
COMMENT ON COLUMN {s}.chunks.lease_key IS
	'The worker (workers.worker_key) extracting the chunk outside a transaction; NULL when none. A lease is live while its worker is unfinished and heartbeating within its stale_after.';
COMMENT ON COLUMN {s}.chunks.lease_epoch IS
	'Incremented by each lease of the chunk: the chunk''s transaction commits only while lease_key and lease_epoch are still its worker''s.';
