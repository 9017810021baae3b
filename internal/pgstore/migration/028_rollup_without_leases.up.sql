-- Manifest migration 28: a chunk's lease and its fence write no rollup.
-- chunk_counts no longer groups the chunks by whether they are leased:
-- the lease (its short transaction) and the fence (the first statement
-- of the chunk's transaction) change only the chunk's lease columns, so
-- the rollup's statement triggers find old and new rows in the same
-- groups and merge nothing; the checkpoint is the one write of a chunk
-- that moves it between groups. run_progress counts the chunks in
-- flight (pending or open, leased) from the index on leased chunks
-- (chunks_leased), which holds only the chunks leased now: one per chunk
-- being worked, and the leases of workers that died until they are
-- taken over.

-- The view first: it must no longer read the column it drops below.
CREATE OR REPLACE VIEW {s}.run_progress AS
SELECT r.batch_id, r.job_name, r.status, l.liveness, l.live_workers, l.last_heartbeat,
	r.created_at, t.t_end AS as_of,
	c.chunks_total, c.chunks_done, c.chunks_open, c.chunks_pending, c.chunks_failed, c.chunks_staged, c.chunks_rolled_back,
	c.chunks_other, c.chunks_leased,
	c.rows_read, c.rows_inserted, c.rows_updated, c.rows_unchanged, c.rows_rejected, c.rows_deduplicated,
	c.rows_processed, c.chunk_reads, c.last_checkpoint,
	s.total_seconds, s.working_seconds, s.throttled_seconds, s.paused_seconds, s.idle_seconds,
	CASE WHEN s.total_seconds > 0 THEN s.throttled_seconds / s.total_seconds END AS throttled_fraction,
	w.window_start, w.window_rows, w.window_working_seconds,
	rate.recent_rate, rate.overall_rate,
	CASE WHEN s.total_seconds > 0 THEN c.rows_processed / s.total_seconds END AS wall_rate,
	rem.remaining_rows, rem.remaining_chunks,
	CASE WHEN rem.remaining_chunks = 0 THEN 0::float8
		WHEN coalesce(rate.recent_rate, rate.overall_rate) > 0 THEN rem.remaining_rows / coalesce(rate.recent_rate, rate.overall_rate) END AS eta_seconds,
	c.chunks_skipped
FROM {s}.runs r
LEFT JOIN {s}.run_liveness l ON l.batch_id = r.batch_id
CROSS JOIN LATERAL (SELECT coalesce(r.finished_at, CASE WHEN r.status IN ('running', 'paused') THEN now() ELSE greatest(r.updated_at, r.created_at) END) AS t_end OFFSET 0) t
CROSS JOIN LATERAL (
	-- The run's rollup (chunk_counts, a few rows) pivoted; the latest
	-- checkpoint from the index on checkpointed_at, the chunks in flight
	-- from the index on leased chunks.
	SELECT coalesce(sum(g.n), 0)::int AS chunks_total,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'done'), 0)::int AS chunks_done,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'open'), 0)::int AS chunks_open,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'pending'), 0)::int AS chunks_pending,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'failed'), 0)::int AS chunks_failed,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'staged'), 0)::int AS chunks_staged,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'rolled_back'), 0)::int AS chunks_rolled_back,
		coalesce(sum(g.n) FILTER (WHERE g.status NOT IN ('done', 'open', 'pending', 'failed', 'staged', 'rolled_back')), 0)::int AS chunks_other,
		(SELECT count(*) FROM {s}.chunks k WHERE k.batch_id = r.batch_id AND k.lease_key IS NOT NULL
			AND k.status IN ('pending', 'open'))::int AS chunks_leased,
		coalesce(sum(g.n) FILTER (WHERE g.skipped AND g.checkpointed), 0)::int AS chunks_skipped,
		coalesce(sum(g.rows_read) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_read,
		coalesce(sum(g.rows_inserted) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_inserted,
		coalesce(sum(g.rows_updated) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_updated,
		coalesce(sum(g.rows_unchanged) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_unchanged,
		coalesce(sum(g.rows_rejected) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_rejected,
		coalesce(sum(g.rows_deduplicated) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_deduplicated,
		coalesce(sum(g.rows_processed), 0)::bigint AS rows_processed,
		coalesce(sum(g.reads), 0)::bigint AS chunk_reads,
		(SELECT max(k.checkpointed_at) FROM {s}.chunks k WHERE k.batch_id = r.batch_id AND k.checkpointed_at IS NOT NULL) AS last_checkpoint,
		coalesce(sum(g.rows_read) FILTER (WHERE g.checkpointed AND g.has_span), 0)::float8 AS known_span_rows,
		coalesce(sum(g.span) FILTER (WHERE g.checkpointed AND g.has_span), 0)::float8 AS known_span,
		coalesce(sum(g.rows_read) FILTER (WHERE g.checkpointed), 0)::float8 AS known_rows,
		coalesce(sum(g.n) FILTER (WHERE g.checkpointed), 0)::float8 AS known_chunks,
		coalesce(sum(g.span) FILTER (WHERE g.remaining AND g.has_span), 0)::float8 AS rem_span,
		coalesce(sum(g.n) FILTER (WHERE g.remaining AND g.has_span), 0)::int AS rem_span_chunks,
		coalesce(sum(g.n) FILTER (WHERE g.remaining), 0)::int AS rem_chunks
	FROM (SELECT x.status, x.skipped, x.has_span, x.status IN ('done', 'open') AS checkpointed,
			x.status IN ('pending', 'failed') AS remaining, x.chunks AS n, x.rows_read, x.rows_inserted, x.rows_updated,
			x.rows_unchanged, x.rows_rejected, x.rows_deduplicated, x.rows_processed, x.reads, x.span
		FROM {s}.chunk_counts x WHERE x.batch_id = r.batch_id) g
	OFFSET 0
) c
CROSS JOIN LATERAL (
	SELECT tstzmultirange(tstzrange(r.created_at, greatest(r.created_at, t.t_end))) AS total,
		coalesce((SELECT range_agg(tstzrange(e.created_at, greatest(e.created_at, coalesce(
				(SELECT min(e2.created_at) FROM {s}.events e2 WHERE e2.batch_id = e.batch_id AND e2.id > e.id
					AND e2.kind LIKE 'run\_%' AND e2.kind <> 'run_paused'), t.t_end))))
			FROM {s}.events e WHERE e.batch_id = r.batch_id AND e.kind LIKE 'run\_%' AND e.kind = 'run_paused'), '{}'::tstzmultirange) AS paused,
		coalesce((SELECT range_agg(tstzrange(p.started_at, greatest(p.started_at, coalesce(p.ended_at, pw.finished_at,
				CASE WHEN pw.heartbeat_at < now() - pw.stale_after THEN {s}.worker_last_life(pw.worker_key) END, now()))))
			FROM {s}.throttle_periods p LEFT JOIN {s}.workers pw ON pw.worker_key = p.worker_key
			WHERE p.batch_id = r.batch_id), '{}'::tstzmultirange) AS throttled,
		(SELECT range_agg(tstzrange(ww.started_at, greatest(ww.started_at, coalesce(ww.finished_at,
				CASE WHEN ww.heartbeat_at < now() - ww.stale_after THEN {s}.worker_last_life(ww.worker_key) END, now()))))
			FROM {s}.workers ww WHERE ww.batch_id = r.batch_id) AS workers
	OFFSET 0 -- computed once, not inlined in each use
) m
CROSS JOIN LATERAL (
	SELECT m.total * m.paused AS paused,
		m.total * m.throttled - m.paused AS throttled,
		m.total - coalesce(m.workers, m.total) - m.paused - m.throttled AS idle,
		m.total * coalesce(m.workers, m.total) - m.paused - m.throttled AS working
	OFFSET 0 -- computed once, not inlined in each use
) mr
CROSS JOIN LATERAL (
	SELECT (SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(m.total) z) AS total_seconds,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(mr.working) z) AS working_seconds,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(mr.throttled) z) AS throttled_seconds,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(mr.paused) z) AS paused_seconds,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(mr.idle) z) AS idle_seconds
	OFFSET 0 -- computed once, not inlined in each use
) s
CROSS JOIN LATERAL (
	SELECT ws.window_start,
		(SELECT coalesce(sum(k.rows_read), 0)::bigint FROM {s}.chunks k WHERE k.batch_id = r.batch_id
			AND k.checkpointed_at > ws.window_start AND k.checkpointed_at <= t.t_end) AS window_rows,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8
			FROM unnest(mr.working * tstzmultirange(tstzrange(ws.window_start, greatest(ws.window_start, t.t_end)))) z) AS window_working_seconds
	FROM (SELECT greatest(r.created_at, least(t.t_end - interval '20 seconds', coalesce(
			(SELECT k.checkpointed_at FROM {s}.chunks k WHERE k.batch_id = r.batch_id AND k.checkpointed_at IS NOT NULL
				ORDER BY k.checkpointed_at DESC OFFSET 20 LIMIT 1), r.created_at))) AS window_start OFFSET 0) ws
	OFFSET 0
) w
CROSS JOIN LATERAL (
	SELECT CASE WHEN w.window_working_seconds >= 1 AND w.window_rows > 0 THEN w.window_rows / w.window_working_seconds END AS recent_rate,
		CASE WHEN s.working_seconds > 0 AND c.rows_processed > 0 THEN c.rows_processed / s.working_seconds END AS overall_rate
) rate
CROSS JOIN LATERAL (
	-- A chunk in flight is counted half done.
	SELECT c.rem_chunks AS remaining_chunks,
		CASE WHEN c.known_chunks = 0 THEN NULL
			WHEN c.known_span > 0 THEN c.rem_span * (c.known_span_rows / c.known_span) + (c.rem_chunks - c.rem_span_chunks) * (c.known_rows / c.known_chunks)
			ELSE c.rem_chunks * (c.known_rows / c.known_chunks) END
		* CASE WHEN c.rem_chunks > 0 THEN 1 - 0.5 * least(c.chunks_leased, c.rem_chunks)::float8 / c.rem_chunks ELSE 1 END AS remaining_rows
) rem;

-- The rollup's functions without the leased grouping (otherwise as in
-- migration 26).
CREATE OR REPLACE FUNCTION {s}.chunk_counts_apply(p_batch_ids bigint[], p_deltas jsonb) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
	-- Under read committed, merge the committed rows of the touched
	-- groups with the delta; under a stricter isolation a locked row
	-- changed since the snapshot would fail the transaction, so the delta
	-- is only appended (the next read-committed writer merges it).
	IF current_setting('transaction_isolation') = 'read committed' THEN
		WITH d AS (
			SELECT * FROM jsonb_to_recordset(p_deltas) AS x(batch_id bigint, status text, skipped boolean, has_span boolean,
				chunks bigint, rows_read bigint, rows_inserted bigint, rows_updated bigint, rows_unchanged bigint, rows_rejected bigint,
				rows_deduplicated bigint, rows_processed bigint, reads bigint, span numeric)),
		old AS (
			DELETE FROM {s}.chunk_counts k WHERE k.ctid = ANY (ARRAY(
				SELECT o.ctid FROM {s}.chunk_counts o
				WHERE o.batch_id = ANY (p_batch_ids) AND (o.batch_id, o.status, o.skipped, o.has_span) IN
					(SELECT d.batch_id, d.status, d.skipped, d.has_span FROM d)
				FOR UPDATE SKIP LOCKED))
			RETURNING k.batch_id, k.status, k.skipped, k.has_span, k.chunks, k.rows_read, k.rows_inserted, k.rows_updated, k.rows_unchanged,
				k.rows_rejected, k.rows_deduplicated, k.rows_processed, k.reads, k.span)
		INSERT INTO {s}.chunk_counts (batch_id, status, skipped, has_span, chunks, rows_read, rows_inserted, rows_updated, rows_unchanged,
			rows_rejected, rows_deduplicated, rows_processed, reads, span)
		SELECT a.batch_id, a.status, a.skipped, a.has_span, sum(a.chunks), sum(a.rows_read), sum(a.rows_inserted), sum(a.rows_updated),
			sum(a.rows_unchanged), sum(a.rows_rejected), sum(a.rows_deduplicated), sum(a.rows_processed), sum(a.reads), sum(a.span)
		FROM (SELECT * FROM d UNION ALL SELECT * FROM old) a
		GROUP BY 1, 2, 3, 4
		HAVING sum(a.chunks) <> 0 OR sum(a.rows_read) <> 0 OR sum(a.rows_processed) <> 0 OR sum(a.reads) <> 0 OR sum(a.span) <> 0
			OR sum(a.rows_inserted) <> 0 OR sum(a.rows_updated) <> 0 OR sum(a.rows_unchanged) <> 0 OR sum(a.rows_rejected) <> 0
			OR sum(a.rows_deduplicated) <> 0;
	ELSE
		INSERT INTO {s}.chunk_counts (batch_id, status, skipped, has_span, chunks, rows_read, rows_inserted, rows_updated, rows_unchanged,
			rows_rejected, rows_deduplicated, rows_processed, reads, span)
		SELECT * FROM jsonb_to_recordset(p_deltas) AS x(batch_id bigint, status text, skipped boolean, has_span boolean,
			chunks bigint, rows_read bigint, rows_inserted bigint, rows_updated bigint, rows_unchanged bigint, rows_rejected bigint,
			rows_deduplicated bigint, rows_processed bigint, reads bigint, span numeric);
	END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION {s}.chunk_counts_trigger() RETURNS trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	v_ids bigint[];
	v_deltas jsonb;
BEGIN
	-- One pass over the statement's old and new rows, grouped; groups
	-- whose old and new rows cancel out (a lease, its fence, a heartbeat,
	-- a retry's attempt count) add nothing.
	IF TG_OP = 'INSERT' THEN
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT c.batch_id, c.status, c.skipped,
				coalesce(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END > 0, false) AS has_span,
				count(*) AS chunks, sum(c.rows_read) AS rows_read, sum(c.rows_inserted) AS rows_inserted, sum(c.rows_updated) AS rows_updated,
				sum(c.rows_unchanged) AS rows_unchanged, sum(c.rows_rejected) AS rows_rejected, sum(c.rows_deduplicated) AS rows_deduplicated,
				sum(c.rows_processed) AS rows_processed, sum(c.reads) AS reads,
				coalesce(sum(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END), 0) AS span
			FROM new_chunks c GROUP BY 1, 2, 3, 4) g;
	ELSIF TG_OP = 'DELETE' THEN
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT c.batch_id, c.status, c.skipped,
				coalesce(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END > 0, false) AS has_span,
				-count(*) AS chunks, -sum(c.rows_read) AS rows_read, -sum(c.rows_inserted) AS rows_inserted, -sum(c.rows_updated) AS rows_updated,
				-sum(c.rows_unchanged) AS rows_unchanged, -sum(c.rows_rejected) AS rows_rejected, -sum(c.rows_deduplicated) AS rows_deduplicated,
				-sum(c.rows_processed) AS rows_processed, -sum(c.reads) AS reads,
				-coalesce(sum(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END), 0) AS span
			FROM old_chunks c
			-- A run's delete cascades here: its rollup goes with it.
			WHERE EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = c.batch_id)
			GROUP BY 1, 2, 3, 4) g;
		DELETE FROM {s}.chunk_counts k WHERE k.batch_id IN (SELECT DISTINCT c.batch_id FROM old_chunks c)
			AND NOT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = k.batch_id);
	ELSE
		-- An update that changes none of the rollup's columns (a lease,
		-- its fence, a heartbeat) adds nothing: found without the
		-- grouping.
		IF NOT EXISTS (SELECT 1 FROM new_chunks n LEFT JOIN old_chunks o ON o.batch_id = n.batch_id AND o.seq = n.seq
				WHERE o.seq IS NULL OR (o.status, o.skipped, o.kind, o.start_at, o.end_at, o.lo, o.hi, o.rows_read, o.rows_inserted, o.rows_updated,
					o.rows_unchanged, o.rows_rejected, o.rows_deduplicated, o.rows_processed, o.reads) IS DISTINCT FROM
					(n.status, n.skipped, n.kind, n.start_at, n.end_at, n.lo, n.hi, n.rows_read, n.rows_inserted, n.rows_updated,
					n.rows_unchanged, n.rows_rejected, n.rows_deduplicated, n.rows_processed, n.reads)) THEN
			RETURN NULL;
		END IF;
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT c.batch_id, c.status, c.skipped, c.has_span,
				sum(c.sign) AS chunks, sum(c.sign * c.rows_read) AS rows_read, sum(c.sign * c.rows_inserted) AS rows_inserted,
				sum(c.sign * c.rows_updated) AS rows_updated, sum(c.sign * c.rows_unchanged) AS rows_unchanged,
				sum(c.sign * c.rows_rejected) AS rows_rejected, sum(c.sign * c.rows_deduplicated) AS rows_deduplicated,
				sum(c.sign * c.rows_processed) AS rows_processed, sum(c.sign * c.reads) AS reads, coalesce(sum(c.sign * c.span), 0) AS span
			FROM (
				SELECT 1 AS sign, n.batch_id, n.status, n.skipped, n.rows_read, n.rows_inserted, n.rows_updated,
					n.rows_unchanged, n.rows_rejected, n.rows_deduplicated, n.rows_processed, n.reads,
					CASE n.kind WHEN 'time' THEN extract(epoch FROM n.end_at - n.start_at) WHEN 'int' THEN (n.hi - n.lo)::numeric END AS span
				FROM new_chunks n
				UNION ALL
				SELECT -1, o.batch_id, o.status, o.skipped, o.rows_read, o.rows_inserted, o.rows_updated,
					o.rows_unchanged, o.rows_rejected, o.rows_deduplicated, o.rows_processed, o.reads,
					CASE o.kind WHEN 'time' THEN extract(epoch FROM o.end_at - o.start_at) WHEN 'int' THEN (o.hi - o.lo)::numeric END
				FROM old_chunks o) c0
			CROSS JOIN LATERAL (SELECT c0.*, coalesce(c0.span > 0, false) AS has_span) c
			GROUP BY 1, 2, 3, 4
			HAVING sum(c.sign) <> 0 OR sum(c.sign * c.rows_read) <> 0 OR sum(c.sign * c.rows_processed) <> 0 OR sum(c.sign * c.reads) <> 0
				OR sum(c.sign * c.rows_inserted) <> 0 OR sum(c.sign * c.rows_updated) <> 0 OR sum(c.sign * c.rows_unchanged) <> 0
				OR sum(c.sign * c.rows_rejected) <> 0 OR sum(c.sign * c.rows_deduplicated) <> 0 OR coalesce(sum(c.sign * c.span), 0) <> 0) g;
	END IF;
	IF v_deltas IS NOT NULL THEN
		PERFORM {s}.chunk_counts_apply(v_ids, v_deltas);
	END IF;
	RETURN NULL;
END
$fn$;

-- The column, and the index over it, go (the rows of the existing runs
-- that differed only by it are deltas of one group now, which readers
-- add up and the next writer of the group merges).
LOCK TABLE {s}.chunk_counts IN EXCLUSIVE MODE;
ALTER TABLE {s}.chunk_counts DROP COLUMN leased;
CREATE INDEX chunk_counts_batch_group ON {s}.chunk_counts (batch_id, status, skipped, has_span);
COMMENT ON TABLE {s}.chunk_counts IS
	'Rollup of the chunks of each run, kept by triggers on chunks in the writing transaction: sum the rows of a run grouped by (status, skipped, has_span) for its chunks by group and the sums of their counters; span is seconds (time chunks) or keys (int chunks), has_span when it is positive. Several rows of one group are deltas to add up. The leased chunks are counted from chunks (the index chunks_leased).';

-- The report's rollup (chunk_buckets, migration 27): its update trigger
-- as there, with the early end of an update that changes none of its
-- columns.
CREATE OR REPLACE FUNCTION {s}.chunk_buckets_trigger() RETURNS trigger
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
		-- An update that changes none of the rollup's columns (a lease,
		-- its fence, a heartbeat) adds nothing: found without the
		-- grouping.
		IF NOT EXISTS (SELECT 1 FROM new_chunks n LEFT JOIN old_chunks o ON o.batch_id = n.batch_id AND o.seq = n.seq
				WHERE o.seq IS NULL OR (o.status, o.worker, o.attempts, o.rows_read, o.rows_inserted, o.rows_updated, o.rows_unchanged, o.rows_rejected,
					o.rows_deduplicated, o.started_at, o.finished_at) IS DISTINCT FROM
					(n.status, n.worker, n.attempts, n.rows_read, n.rows_inserted, n.rows_updated, n.rows_unchanged, n.rows_rejected,
					n.rows_deduplicated, n.started_at, n.finished_at)) THEN
			RETURN NULL;
		END IF;
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

-- The rollups' functions keep one plan of each statement per session
-- (generic in the functions' arguments and variables): a custom plan,
-- PostgreSQL's choice for these statements, was planned again on every
-- call, which cost a chunk's checkpoint more than running them.
ALTER FUNCTION {s}.chunk_counts_apply(bigint[], jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {s}.chunk_buckets_apply(bigint[], jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {s}.chunk_counts_trigger() SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {s}.chunk_buckets_trigger() SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {s}.exception_counts_trigger() SET plan_cache_mode = force_generic_plan;

-- A chunk's lease (LeaseChunk) through a plan the session keeps: the
-- statement, sent as text, was parsed and planned again for every chunk,
-- which cost more than running it. The statement of LeaseQuery (see
-- there), with its parameters as arguments: batch p_batch_id, chunks to
-- avoid p_avoid, key p_key, stale bound p_stale_after seconds; first the
-- lock_timeout p_lock_timeout, locally, unless it is '' (a call outside
-- a transaction sets its own). Runs as the caller (a loader's privileges
-- on chunks, runs and knobs). Its result's columns are of scalar types,
-- not the chunks' row type: a call outside a transaction would otherwise
-- wait for a lock of the chunks table, unbounded, to parse its own
-- columns before the function set lock_timeout.
CREATE FUNCTION {s}.lease_chunk(p_batch_id bigint, p_avoid int[], p_key text, p_stale_after float8, p_lock_timeout text)
	RETURNS TABLE (batch_id bigint, seq int, chunk_id text, kind text, start_at timestamptz, end_at timestamptz, lo bigint, hi bigint,
		item text, status text, attempts int, rows_read bigint, rows_inserted bigint, rows_updated bigint, rows_unchanged bigint,
		rows_rejected bigint, rows_deduplicated bigint, started_at timestamptz, finished_at timestamptz, last_error text, worker text,
		skipped boolean, lease_epoch bigint, run_status text, run_reason text, run_knobs text)
	LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
	IF p_lock_timeout <> '' THEN
		PERFORM set_config('lock_timeout', p_lock_timeout, true);
	END IF;
	RETURN QUERY
	WITH l AS (
		UPDATE {s}.chunks SET lease_key = p_key, lease_epoch = lease_epoch + 1, leased_at = now()
		WHERE batch_id = p_batch_id AND seq = (SELECT c.seq FROM {s}.chunks c
			WHERE c.batch_id = p_batch_id AND c.status IN ('pending', 'open')
				AND (c.status = 'pending' OR c.open_call < (SELECT calls FROM {s}.runs WHERE batch_id = p_batch_id AND status = 'running'))
			AND EXISTS (SELECT 1 FROM {s}.runs WHERE batch_id = p_batch_id AND status = 'running')
			AND NOT (c.seq = ANY (p_avoid))
			AND (c.lease_key = p_key OR NOT (c.lease_key IS NOT NULL AND (c.leased_at >= now() - make_interval(secs => p_stale_after)
				OR EXISTS (SELECT 1 FROM {s}.workers w WHERE w.worker_key = c.lease_key AND w.finished_at IS NULL
					AND w.heartbeat_at >= now() - greatest(w.stale_after, make_interval(secs => p_stale_after))))))
			ORDER BY c.seq LIMIT 1 FOR UPDATE SKIP LOCKED)
		AND set_config('synchronous_commit', 'off', true) IS NOT NULL
		RETURNING chunks.batch_id, chunks.seq, chunks.chunk_id, chunks.kind, chunks.start_at, chunks.end_at, chunks.lo, chunks.hi, chunks.item,
			chunks.status, chunks.attempts, chunks.rows_read, chunks.rows_inserted, chunks.rows_updated, chunks.rows_unchanged,
			chunks.rows_rejected, chunks.rows_deduplicated, chunks.started_at, chunks.finished_at, chunks.last_error, chunks.worker,
			chunks.skipped, chunks.lease_epoch)
	SELECT l.*,
		(SELECT r.status FROM {s}.runs r WHERE r.batch_id = p_batch_id),
		(SELECT r.last_error FROM {s}.runs r WHERE r.batch_id = p_batch_id),
		coalesce((SELECT json_object_agg(k.key, k.value) FROM {s}.knobs k WHERE k.batch_id = p_batch_id), '{}')::text
	FROM l;
END
$fn$;

-- A leased chunk's fence (FenceLease) through a plan the session keeps,
-- as lease_chunk: the lease's settings of the chunk's transaction first
-- (see leaseSettings: p_stmt_timeout, p_lock_timeout, p_app, the TCP
-- keepalives p_keep_idle, p_keep_interval, p_keep_count and
-- p_user_timeout), then the chunk's row locked and its lease cleared
-- where it is still p_key's at p_epoch, the chunk claimable and the run
-- running or paused. Runs as the caller.
CREATE FUNCTION {s}.fence_lease(p_batch_id bigint, p_seq int, p_key text, p_epoch bigint, p_stmt_timeout text, p_lock_timeout text,
		p_app text, p_keep_idle text, p_keep_interval text, p_keep_count text, p_user_timeout text)
	RETURNS TABLE (chunk {s}.chunks, backend_pid int)
	LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN
	PERFORM set_config('statement_timeout', CASE WHEN set_config('backfill.statement_timeout',
			coalesce(nullif(p_stmt_timeout, ''), current_setting('statement_timeout')), true) IS NOT NULL THEN '0' END, true),
		set_config('backfill.lock_timeout', set_config('lock_timeout', coalesce(nullif(p_lock_timeout, ''), current_setting('lock_timeout')), true), true),
		set_config('application_name', left(p_app || current_setting('application_name'), 63), true),
		set_config('tcp_keepalives_idle', p_keep_idle, true),
		set_config('tcp_keepalives_interval', p_keep_interval, true),
		set_config('tcp_keepalives_count', p_keep_count, true),
		set_config('tcp_user_timeout', p_user_timeout, true);
	RETURN QUERY
	WITH f AS (
		UPDATE {s}.chunks c SET lease_key = NULL, leased_at = NULL
		WHERE c.batch_id = p_batch_id AND c.seq = p_seq AND c.lease_key = p_key AND c.lease_epoch = p_epoch
			AND (c.status = 'pending' OR c.status = 'open'
				AND c.open_call < (SELECT calls FROM {s}.runs WHERE batch_id = p_batch_id AND status IN ('running', 'paused')))
			AND EXISTS (SELECT 1 FROM {s}.runs WHERE batch_id = p_batch_id AND status IN ('running', 'paused'))
		RETURNING c)
	SELECT f.c, pg_backend_pid() FROM f;
END
$fn$;

-- Both run as the caller, with its privileges on the tables: any role
-- may execute them (whatever the database's default privileges), as it
-- could send their statements.
GRANT EXECUTE ON FUNCTION {s}.lease_chunk(bigint, int[], text, float8, text),
	{s}.fence_lease(bigint, int, text, bigint, text, text, text, text, text, text, text) TO PUBLIC;
