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

-- relation_sizes: the pg_table_size and pg_indexes_size of relation
-- p_relid, summed over its partitions (NULL for NULL or a relation that
-- no longer exists), without waiting for a lock: the sizes open the
-- relation (ACCESS SHARE), and a run must start and complete while
-- another session holds a stronger lock on its target (its chunks then
-- wait, bounded by their lock_timeout, and say who holds it). A lock not
-- granted within 50 ms gives NULL sizes: that run's growth is not
-- compared. The setting applies inside the function only.
CREATE FUNCTION {s}.relation_sizes(p_relid oid, OUT table_bytes bigint, OUT index_bytes bigint)
LANGUAGE plpgsql SET lock_timeout = '50ms' AS $fn$
BEGIN
	-- pg_partition_tree has no row for a table outside a partition tree.
	SELECT coalesce((SELECT sum(pg_table_size(p.relid)) FROM pg_partition_tree(p_relid) p), pg_table_size(p_relid))::bigint,
		coalesce((SELECT sum(pg_indexes_size(p.relid)) FROM pg_partition_tree(p_relid) p), pg_indexes_size(p_relid))::bigint
	INTO table_bytes, index_bytes;
EXCEPTION WHEN lock_not_available THEN
	table_bytes := NULL;
	index_bytes := NULL;
END
$fn$;

-- It runs as the caller, with its privileges: any role may execute it.
GRANT EXECUTE ON FUNCTION {s}.relation_sizes(oid) TO PUBLIC;
