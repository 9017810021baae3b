-- Manifest migration 34: a run records what a rehearsal forecasts of it
-- (Runner.Rehearse), for Status and the report to compare them.
--
--   - runs.wal_start: the server's WAL insert position when the run was
--     created (in the transaction that creates it); runs.wal_end, when
--     it completed (in the transaction that completes it).
--   - chunks.wal_lsn: the WAL insert position at the chunk's checkpoint,
--     in its transaction: the WAL of a run not completed is measured to
--     its latest checkpoint.
--   - runs.target_relid: the target table when the run was created;
--     target_start_bytes and index_start_bytes its pg_table_size and
--     pg_indexes_size then (summed over its partitions), target_end_bytes
--     and index_end_bytes when the run completed.
--
-- All NULL for runs and chunks written before this version (or a target
-- that did not exist). Adding nullable columns rewrites no row.

ALTER TABLE {s}.runs
	ADD COLUMN wal_start pg_lsn,
	ADD COLUMN wal_end pg_lsn,
	ADD COLUMN target_relid oid,
	ADD COLUMN target_start_bytes bigint,
	ADD COLUMN index_start_bytes bigint,
	ADD COLUMN target_end_bytes bigint,
	ADD COLUMN index_end_bytes bigint;
ALTER TABLE {s}.chunks ADD COLUMN wal_lsn pg_lsn;

COMMENT ON COLUMN {s}.runs.wal_start IS 'pg_current_wal_insert_lsn() when the run was created';
COMMENT ON COLUMN {s}.runs.wal_end IS 'pg_current_wal_insert_lsn() when the run completed';
COMMENT ON COLUMN {s}.runs.target_relid IS 'the target table when the run was created (NULL: it did not exist)';
COMMENT ON COLUMN {s}.runs.target_start_bytes IS 'pg_table_size of the target (and its partitions) when the run was created';
COMMENT ON COLUMN {s}.runs.index_start_bytes IS 'pg_indexes_size of the target (and its partitions) when the run was created';
COMMENT ON COLUMN {s}.runs.target_end_bytes IS 'pg_table_size of the target (and its partitions) when the run completed';
COMMENT ON COLUMN {s}.runs.index_end_bytes IS 'pg_indexes_size of the target (and its partitions) when the run completed';
COMMENT ON COLUMN {s}.chunks.wal_lsn IS 'pg_current_wal_insert_lsn() at the chunk''s checkpoint, in its transaction';
