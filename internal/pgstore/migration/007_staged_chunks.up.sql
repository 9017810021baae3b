-- Manifest migration 7: chunks staged for a publish at the end of the run.

ALTER TABLE {s}.chunks DROP CONSTRAINT chunks_status_check;
ALTER TABLE {s}.chunks ADD CONSTRAINT chunks_status_check CHECK (status IN ('pending', 'staged', 'done', 'failed', 'rolled_back'));
ALTER TABLE {s}.chunks ADD COLUMN rows_staged bigint NOT NULL DEFAULT 0;
ALTER TABLE {s}.chunks DROP CONSTRAINT chunk_rows_balance;
ALTER TABLE {s}.chunks ADD CONSTRAINT chunk_rows_balance CHECK (status = 'staged' OR
	rows_read = rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated);
ALTER TABLE {s}.chunks ADD CONSTRAINT chunk_staged_balance CHECK (status <> 'staged' OR rows_read = rows_staged + rows_rejected);
