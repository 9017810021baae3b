-- Manifest migration 27: the run report reads a bounded rollup of the
-- run's chunks, not every chunk.
--
-- chunk_buckets holds, per run, three kinds of rows (kind):
--
--   - 's', a bucket of consecutive chunks in plan order: lo is the first
--     seq of the bucket, a multiple of its width 2^k, the smallest power
--     of two that cuts the run's chunks_total (when the row is written)
--     into at most 512 buckets, by status; readers regroup by the run's
--     width (powers of two: the buckets nest);
--   - 'w', the chunks of one worker (the worker that completed them, ''
--     for none), by status;
--   - 'd', the timed chunks (started_at and finished_at set) of one bin
--     of durations: bin k holds durations in [2^(k/4), 2^((k+1)/4)) ms,
--     bin 0 everything below 2^(1/4) ms.
--
-- Each row sums its chunks: how many, how many timed, their attempts,
-- their counters and their durations (busy_seconds). A statement
-- trigger writes the rollup in the writing transaction, the same way as
-- chunk_counts (migration 26): delta rows merged, without waits, by the
-- statements that touch their group. Readers sum the rows of a group.
--
-- Three partial indexes find the report's notable chunks without
-- reading the run: the slowest (by duration), the most rejects, the
-- failed ones.

CREATE TABLE {s}.chunk_buckets (
	batch_id          bigint NOT NULL,
	kind              "char" NOT NULL,
	lo                int NOT NULL,
	status            text NOT NULL,
	worker            text NOT NULL,
	chunks            bigint NOT NULL,
	timed             bigint NOT NULL,
	attempts          bigint NOT NULL,
	rows_read         bigint NOT NULL,
	rows_inserted     bigint NOT NULL,
	rows_updated      bigint NOT NULL,
	rows_unchanged    bigint NOT NULL,
	rows_rejected     bigint NOT NULL,
	rows_deduplicated bigint NOT NULL,
	busy_seconds      numeric NOT NULL
);
CREATE INDEX chunk_buckets_batch ON {s}.chunk_buckets (batch_id, kind, lo, status, worker);
COMMENT ON TABLE {s}.chunk_buckets IS
	'Rollup of the chunks of each run for its report, kept by a trigger on chunks in the writing transaction: kind s (lo: first seq of a bucket of 2^k chunks, at most 512 buckets a run), w (worker: the worker that completed the chunks), d (lo: duration bin k, durations in [2^(k/4), 2^((k+1)/4)) ms); by status. Several rows of one group are deltas to add up.';

CREATE INDEX chunks_duration ON {s}.chunks (batch_id, (finished_at - started_at)) WHERE started_at IS NOT NULL AND finished_at IS NOT NULL;
CREATE INDEX chunks_rejects ON {s}.chunks (batch_id, rows_rejected) WHERE rows_rejected > 0;
CREATE INDEX chunks_failed ON {s}.chunks (batch_id, seq) WHERE status = 'failed';

-- Merges the rollup deltas p_deltas (a jsonb array of chunk_buckets
-- rows) of runs p_batch_ids into chunk_buckets.
CREATE FUNCTION {s}.chunk_buckets_apply(p_batch_ids bigint[], p_deltas jsonb) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
	-- As chunk_counts_apply: under read committed, merge the committed
	-- rows of the touched groups that no one else is merging; otherwise
	-- append the delta.
	IF current_setting('transaction_isolation') = 'read committed' THEN
		WITH d AS (
			SELECT * FROM jsonb_to_recordset(p_deltas) AS x(batch_id bigint, kind "char", lo int, status text, worker text, chunks bigint, timed bigint,
				attempts bigint, rows_read bigint, rows_inserted bigint, rows_updated bigint, rows_unchanged bigint, rows_rejected bigint,
				rows_deduplicated bigint, busy_seconds numeric)),
		old AS (
			DELETE FROM {s}.chunk_buckets b WHERE b.ctid = ANY (ARRAY(
				SELECT o.ctid FROM {s}.chunk_buckets o
				WHERE o.batch_id = ANY (p_batch_ids) AND (o.batch_id, o.kind, o.lo, o.status, o.worker) IN
					(SELECT d.batch_id, d.kind, d.lo, d.status, d.worker FROM d)
				FOR UPDATE SKIP LOCKED))
			RETURNING b.*)
		INSERT INTO {s}.chunk_buckets
		SELECT a.batch_id, a.kind, a.lo, a.status, a.worker, sum(a.chunks), sum(a.timed), sum(a.attempts), sum(a.rows_read), sum(a.rows_inserted),
			sum(a.rows_updated), sum(a.rows_unchanged), sum(a.rows_rejected), sum(a.rows_deduplicated), sum(a.busy_seconds)
		FROM (SELECT * FROM d UNION ALL SELECT * FROM old) a
		GROUP BY 1, 2, 3, 4, 5
		HAVING sum(a.chunks) <> 0 OR sum(a.timed) <> 0 OR sum(a.attempts) <> 0 OR sum(a.rows_read) <> 0 OR sum(a.rows_inserted) <> 0
			OR sum(a.rows_updated) <> 0 OR sum(a.rows_unchanged) <> 0 OR sum(a.rows_rejected) <> 0 OR sum(a.rows_deduplicated) <> 0
			OR sum(a.busy_seconds) <> 0;
	ELSE
		INSERT INTO {s}.chunk_buckets
		SELECT * FROM jsonb_to_recordset(p_deltas) AS x(batch_id bigint, kind "char", lo int, status text, worker text, chunks bigint, timed bigint,
			attempts bigint, rows_read bigint, rows_inserted bigint, rows_updated bigint, rows_unchanged bigint, rows_rejected bigint,
			rows_deduplicated bigint, busy_seconds numeric);
	END IF;
END
$fn$;

CREATE FUNCTION {s}.chunk_buckets_trigger() RETURNS trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	v_ids bigint[];
	v_deltas jsonb;
BEGIN
	-- The statement's new rows count +1, its old rows -1 (an update's
	-- rows that it left as the rollup sees them, a lease's heartbeat,
	-- count neither), grouped in one pass: the deltas are a few rows
	-- whatever the statement's size. Static statements: their plans are
	-- kept by the session.
	IF TG_OP = 'INSERT' THEN
		WITH c AS (
			SELECT x.sign, x.batch_id, x.seq, x.status, x.worker, x.attempts, x.rows_read, x.rows_inserted, x.rows_updated, x.rows_unchanged,
				x.rows_rejected, x.rows_deduplicated,
				CASE WHEN r.chunks_total <= 512 THEN 0 ELSE ceil(log(2, r.chunks_total / 512.0))::int END AS shift,
				CASE WHEN x.started_at IS NOT NULL AND x.finished_at IS NOT NULL THEN greatest(extract(epoch FROM x.finished_at - x.started_at), 0) END AS d
			FROM (SELECT 1 AS sign, n.batch_id, n.seq, n.status, n.worker, n.attempts, n.rows_read, n.rows_inserted, n.rows_updated, n.rows_unchanged, n.rows_rejected, n.rows_deduplicated, n.started_at, n.finished_at FROM new_chunks n) x JOIN {s}.runs r ON r.batch_id = x.batch_id),
		k AS (
			SELECT 's'::"char" AS kind, (c.seq >> c.shift) << c.shift AS lo, c.status AS k_status, ''::text AS k_worker, c.* FROM c
			UNION ALL
			SELECT 'w', 0, c.status, c.worker, c.* FROM c
			UNION ALL
			SELECT 'd', CASE WHEN c.d * 1000 < 2 ^ 0.25 THEN 0 ELSE floor(4 * log(2, (c.d * 1000)::numeric))::int END, '', '', c.* FROM c WHERE c.d IS NOT NULL),
		g AS (
			SELECT k.batch_id, k.kind, k.lo, k.k_status AS status, k.k_worker AS worker, sum(k.sign) AS chunks,
				coalesce(sum(k.sign) FILTER (WHERE k.d IS NOT NULL), 0) AS timed,
				sum(k.sign * k.attempts) AS attempts, sum(k.sign * k.rows_read) AS rows_read, sum(k.sign * k.rows_inserted) AS rows_inserted,
				sum(k.sign * k.rows_updated) AS rows_updated, sum(k.sign * k.rows_unchanged) AS rows_unchanged, sum(k.sign * k.rows_rejected) AS rows_rejected,
				sum(k.sign * k.rows_deduplicated) AS rows_deduplicated, coalesce(sum(k.sign * k.d), 0) AS busy_seconds
			FROM k GROUP BY 1, 2, 3, 4, 5)
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM g
		WHERE g.chunks <> 0 OR g.timed <> 0 OR g.attempts <> 0 OR g.rows_read <> 0 OR g.rows_inserted <> 0 OR g.rows_updated <> 0
			OR g.rows_unchanged <> 0 OR g.rows_rejected <> 0 OR g.rows_deduplicated <> 0 OR g.busy_seconds <> 0;
	ELSIF TG_OP = 'DELETE' THEN
		DELETE FROM {s}.chunk_buckets b WHERE b.batch_id IN (SELECT DISTINCT o.batch_id FROM old_chunks o)
			AND NOT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = b.batch_id);
		-- A run's delete cascades here: its rollup went with it (the join
		-- on runs in the grouping drops its rows).
		WITH c AS (
			SELECT x.sign, x.batch_id, x.seq, x.status, x.worker, x.attempts, x.rows_read, x.rows_inserted, x.rows_updated, x.rows_unchanged,
				x.rows_rejected, x.rows_deduplicated,
				CASE WHEN r.chunks_total <= 512 THEN 0 ELSE ceil(log(2, r.chunks_total / 512.0))::int END AS shift,
				CASE WHEN x.started_at IS NOT NULL AND x.finished_at IS NOT NULL THEN greatest(extract(epoch FROM x.finished_at - x.started_at), 0) END AS d
			FROM (SELECT -1 AS sign, o.batch_id, o.seq, o.status, o.worker, o.attempts, o.rows_read, o.rows_inserted, o.rows_updated, o.rows_unchanged, o.rows_rejected, o.rows_deduplicated, o.started_at, o.finished_at FROM old_chunks o) x JOIN {s}.runs r ON r.batch_id = x.batch_id),
		k AS (
			SELECT 's'::"char" AS kind, (c.seq >> c.shift) << c.shift AS lo, c.status AS k_status, ''::text AS k_worker, c.* FROM c
			UNION ALL
			SELECT 'w', 0, c.status, c.worker, c.* FROM c
			UNION ALL
			SELECT 'd', CASE WHEN c.d * 1000 < 2 ^ 0.25 THEN 0 ELSE floor(4 * log(2, (c.d * 1000)::numeric))::int END, '', '', c.* FROM c WHERE c.d IS NOT NULL),
		g AS (
			SELECT k.batch_id, k.kind, k.lo, k.k_status AS status, k.k_worker AS worker, sum(k.sign) AS chunks,
				coalesce(sum(k.sign) FILTER (WHERE k.d IS NOT NULL), 0) AS timed,
				sum(k.sign * k.attempts) AS attempts, sum(k.sign * k.rows_read) AS rows_read, sum(k.sign * k.rows_inserted) AS rows_inserted,
				sum(k.sign * k.rows_updated) AS rows_updated, sum(k.sign * k.rows_unchanged) AS rows_unchanged, sum(k.sign * k.rows_rejected) AS rows_rejected,
				sum(k.sign * k.rows_deduplicated) AS rows_deduplicated, coalesce(sum(k.sign * k.d), 0) AS busy_seconds
			FROM k GROUP BY 1, 2, 3, 4, 5)
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM g
		WHERE g.chunks <> 0 OR g.timed <> 0 OR g.attempts <> 0 OR g.rows_read <> 0 OR g.rows_inserted <> 0 OR g.rows_updated <> 0
			OR g.rows_unchanged <> 0 OR g.rows_rejected <> 0 OR g.rows_deduplicated <> 0 OR g.busy_seconds <> 0;
	ELSE
		WITH c AS (
			SELECT x.sign, x.batch_id, x.seq, x.status, x.worker, x.attempts, x.rows_read, x.rows_inserted, x.rows_updated, x.rows_unchanged,
				x.rows_rejected, x.rows_deduplicated,
				CASE WHEN r.chunks_total <= 512 THEN 0 ELSE ceil(log(2, r.chunks_total / 512.0))::int END AS shift,
				CASE WHEN x.started_at IS NOT NULL AND x.finished_at IS NOT NULL THEN greatest(extract(epoch FROM x.finished_at - x.started_at), 0) END AS d
			FROM (SELECT 1 AS sign, n.batch_id, n.seq, n.status, n.worker, n.attempts, n.rows_read, n.rows_inserted, n.rows_updated, n.rows_unchanged, n.rows_rejected, n.rows_deduplicated, n.started_at, n.finished_at FROM new_chunks n
				LEFT JOIN old_chunks o ON o.batch_id = n.batch_id AND o.seq = n.seq
				WHERE o.seq IS NULL OR (o.status, o.worker, o.attempts, o.rows_read, o.rows_inserted, o.rows_updated, o.rows_unchanged, o.rows_rejected,
					o.rows_deduplicated, o.started_at, o.finished_at) IS DISTINCT FROM
					(n.status, n.worker, n.attempts, n.rows_read, n.rows_inserted, n.rows_updated, n.rows_unchanged, n.rows_rejected,
					n.rows_deduplicated, n.started_at, n.finished_at)
				UNION ALL
				SELECT -1 AS sign, o.batch_id, o.seq, o.status, o.worker, o.attempts, o.rows_read, o.rows_inserted, o.rows_updated, o.rows_unchanged, o.rows_rejected, o.rows_deduplicated, o.started_at, o.finished_at FROM old_chunks o
				LEFT JOIN new_chunks n ON n.batch_id = o.batch_id AND n.seq = o.seq
				WHERE n.seq IS NULL OR (o.status, o.worker, o.attempts, o.rows_read, o.rows_inserted, o.rows_updated, o.rows_unchanged, o.rows_rejected,
					o.rows_deduplicated, o.started_at, o.finished_at) IS DISTINCT FROM
					(n.status, n.worker, n.attempts, n.rows_read, n.rows_inserted, n.rows_updated, n.rows_unchanged, n.rows_rejected,
					n.rows_deduplicated, n.started_at, n.finished_at)) x JOIN {s}.runs r ON r.batch_id = x.batch_id),
		k AS (
			SELECT 's'::"char" AS kind, (c.seq >> c.shift) << c.shift AS lo, c.status AS k_status, ''::text AS k_worker, c.* FROM c
			UNION ALL
			SELECT 'w', 0, c.status, c.worker, c.* FROM c
			UNION ALL
			SELECT 'd', CASE WHEN c.d * 1000 < 2 ^ 0.25 THEN 0 ELSE floor(4 * log(2, (c.d * 1000)::numeric))::int END, '', '', c.* FROM c WHERE c.d IS NOT NULL),
		g AS (
			SELECT k.batch_id, k.kind, k.lo, k.k_status AS status, k.k_worker AS worker, sum(k.sign) AS chunks,
				coalesce(sum(k.sign) FILTER (WHERE k.d IS NOT NULL), 0) AS timed,
				sum(k.sign * k.attempts) AS attempts, sum(k.sign * k.rows_read) AS rows_read, sum(k.sign * k.rows_inserted) AS rows_inserted,
				sum(k.sign * k.rows_updated) AS rows_updated, sum(k.sign * k.rows_unchanged) AS rows_unchanged, sum(k.sign * k.rows_rejected) AS rows_rejected,
				sum(k.sign * k.rows_deduplicated) AS rows_deduplicated, coalesce(sum(k.sign * k.d), 0) AS busy_seconds
			FROM k GROUP BY 1, 2, 3, 4, 5)
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM g
		WHERE g.chunks <> 0 OR g.timed <> 0 OR g.attempts <> 0 OR g.rows_read <> 0 OR g.rows_inserted <> 0 OR g.rows_updated <> 0
			OR g.rows_unchanged <> 0 OR g.rows_rejected <> 0 OR g.rows_deduplicated <> 0 OR g.busy_seconds <> 0;
	END IF;
	IF v_deltas IS NOT NULL THEN
		PERFORM {s}.chunk_buckets_apply(v_ids, v_deltas);
	END IF;
	RETURN NULL;
END
$fn$;

CREATE TRIGGER chunk_buckets_insert AFTER INSERT ON {s}.chunks REFERENCING NEW TABLE AS new_chunks
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.chunk_buckets_trigger();
CREATE TRIGGER chunk_buckets_update AFTER UPDATE ON {s}.chunks REFERENCING OLD TABLE AS old_chunks NEW TABLE AS new_chunks
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.chunk_buckets_trigger();
CREATE TRIGGER chunk_buckets_delete AFTER DELETE ON {s}.chunks REFERENCING OLD TABLE AS old_chunks
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.chunk_buckets_trigger();

-- TRUNCATE of chunks empties this rollup too (migration 26's trigger
-- function, which TRUNCATE of chunks and exceptions runs).
CREATE OR REPLACE FUNCTION {s}.rollups_truncate() RETURNS trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
	IF TG_TABLE_NAME = 'chunks' THEN
		DELETE FROM {s}.chunk_counts;
		DELETE FROM {s}.chunk_buckets;
	ELSE
		DELETE FROM {s}.exception_counts;
	END IF;
	RETURN NULL;
END
$fn$;

REVOKE EXECUTE ON FUNCTION {s}.chunk_buckets_apply(bigint[], jsonb), {s}.chunk_buckets_trigger() FROM PUBLIC;

-- The existing runs' rollups (the migration holds the table's lock).
LOCK TABLE {s}.chunks IN SHARE MODE;
WITH c AS (
		SELECT x.sign, x.batch_id, x.seq, x.status, x.worker, x.attempts, x.rows_read, x.rows_inserted, x.rows_updated, x.rows_unchanged,
			x.rows_rejected, x.rows_deduplicated,
			CASE WHEN r.chunks_total <= 512 THEN 0 ELSE ceil(log(2, r.chunks_total / 512.0))::int END AS shift,
			CASE WHEN x.started_at IS NOT NULL AND x.finished_at IS NOT NULL THEN greatest(extract(epoch FROM x.finished_at - x.started_at), 0) END AS d
		FROM (SELECT 1 AS sign, c.batch_id, c.seq, c.status, c.worker, c.attempts, c.rows_read, c.rows_inserted, c.rows_updated, c.rows_unchanged, c.rows_rejected, c.rows_deduplicated, c.started_at, c.finished_at FROM {s}.chunks c) x JOIN {s}.runs r ON r.batch_id = x.batch_id),
	k AS (
		SELECT 's'::"char" AS kind, (c.seq >> c.shift) << c.shift AS lo, c.status AS k_status, ''::text AS k_worker, c.* FROM c
		UNION ALL
		SELECT 'w', 0, c.status, c.worker, c.* FROM c
		UNION ALL
		SELECT 'd', CASE WHEN c.d * 1000 < 2 ^ 0.25 THEN 0 ELSE floor(4 * log(2, (c.d * 1000)::numeric))::int END, '', '', c.* FROM c WHERE c.d IS NOT NULL),
	g AS (
		SELECT k.batch_id, k.kind, k.lo, k.k_status AS status, k.k_worker AS worker, sum(k.sign) AS chunks,
			coalesce(sum(k.sign) FILTER (WHERE k.d IS NOT NULL), 0) AS timed,
			sum(k.sign * k.attempts) AS attempts, sum(k.sign * k.rows_read) AS rows_read, sum(k.sign * k.rows_inserted) AS rows_inserted,
			sum(k.sign * k.rows_updated) AS rows_updated, sum(k.sign * k.rows_unchanged) AS rows_unchanged, sum(k.sign * k.rows_rejected) AS rows_rejected,
			sum(k.sign * k.rows_deduplicated) AS rows_deduplicated, coalesce(sum(k.sign * k.d), 0) AS busy_seconds
		FROM k GROUP BY 1, 2, 3, 4, 5)
INSERT INTO {s}.chunk_buckets
SELECT g.batch_id, g.kind, g.lo, g.status, g.worker, g.chunks, g.timed, g.attempts, g.rows_read, g.rows_inserted, g.rows_updated,
	g.rows_unchanged, g.rows_rejected, g.rows_deduplicated, g.busy_seconds
FROM g WHERE g.chunks <> 0 OR g.timed <> 0 OR g.attempts <> 0 OR g.rows_read <> 0 OR g.rows_inserted <> 0 OR g.rows_updated <> 0
		OR g.rows_unchanged <> 0 OR g.rows_rejected <> 0 OR g.rows_deduplicated <> 0 OR g.busy_seconds <> 0;

-- The roles granted on chunks get the same privileges on the rollup, as
-- in migration 26.
DO $do$
DECLARE
	g record;
BEGIN
	FOR g IN
		SELECT DISTINCT a.privilege_type, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS role
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a
		WHERE n.nspname = {schema} AND c.relname = 'chunks' AND a.grantee <> c.relowner
			AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
	LOOP
		EXECUTE format('GRANT %s ON TABLE %s.chunk_buckets TO %s', g.privilege_type, quote_ident({schema}), g.role);
	END LOOP;
END
$do$;

-- The report's exceptions come from their rollup (exception_counts); the
-- first rows of a group by this index (it replaces the one on reason and
-- column, a prefix of it), and the count of the failed attempts' rows by
-- the partial index on them.
CREATE INDEX exceptions_batch_reason_id ON {s}.exceptions (batch_id, reason, column_name, id) WHERE failed_attempt IS NULL;
DROP INDEX {s}.exceptions_batch_reason;
CREATE INDEX exceptions_failed_attempt ON {s}.exceptions (batch_id) WHERE failed_attempt IS NOT NULL;
