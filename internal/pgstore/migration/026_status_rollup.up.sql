-- Manifest migration 26: operator reads (Status, run_progress, backfill
-- status, the Prometheus scrape, the report) no longer scan a run's
-- chunks and exceptions. Two rollups hold their counts:
--
--   - chunk_counts: per run and group of chunks (status, leased, skipped,
--     whether the plan knows a span), the chunks and the sums of their
--     counters and spans;
--   - exception_counts: per run, reason and column, the queued
--     exceptions (failed_attempt IS NULL).
--
-- Statement triggers on chunks and exceptions write them in the writing
-- transaction: a chunk's checkpoint, a claim, a failure, a rollback, a
-- resume, the plan's insert, whatever the path. A rolled-back
-- transaction (a failed attempt, a worker killed with -9) leaves no
-- count. A rollup is a set of delta rows summed by the readers; a
-- statement merges the rows of the groups it touches into one, skipping
-- (SKIP LOCKED) the rows that concurrent transactions are merging, so
-- that no transaction ever waits for another on a rollup row (no hot
-- row per run) and a group keeps about one row per concurrent writer.
-- The trigger functions run as the manifest's owner (SECURITY DEFINER,
-- pinned search path): a loader granted before this version writes the
-- rollups without a new grant.

CREATE TABLE {s}.chunk_counts (
	batch_id          bigint NOT NULL,
	status            text NOT NULL,
	leased            boolean NOT NULL,
	skipped           boolean NOT NULL,
	has_span          boolean NOT NULL,
	chunks            bigint NOT NULL,
	rows_read         bigint NOT NULL,
	rows_inserted     bigint NOT NULL,
	rows_updated      bigint NOT NULL,
	rows_unchanged    bigint NOT NULL,
	rows_rejected     bigint NOT NULL,
	rows_deduplicated bigint NOT NULL,
	rows_processed    bigint NOT NULL,
	reads             bigint NOT NULL,
	span              numeric NOT NULL
);
CREATE INDEX chunk_counts_batch ON {s}.chunk_counts (batch_id, status, leased, skipped, has_span);
COMMENT ON TABLE {s}.chunk_counts IS
	'Rollup of the chunks of each run, kept by triggers on chunks in the writing transaction: sum the rows of a run grouped by (status, leased, skipped, has_span) for its chunks by group and the sums of their counters; span is seconds (time chunks) or keys (int chunks), has_span when it is positive. Several rows of one group are deltas to add up.';

CREATE TABLE {s}.exception_counts (
	batch_id    bigint NOT NULL,
	reason      text NOT NULL,
	column_name text NOT NULL,
	n           bigint NOT NULL
);
CREATE INDEX exception_counts_batch ON {s}.exception_counts (batch_id, reason, column_name);
COMMENT ON TABLE {s}.exception_counts IS
	'Rollup of the queued exceptions (failed_attempt IS NULL) of each run by reason and column, kept by triggers on exceptions in the writing transaction: sum n grouped by (batch_id, reason, column_name). Several rows of one group are deltas to add up.';

-- The contribution of chunk rows to the rollup, signed.
CREATE FUNCTION {s}.chunk_counts_apply(p_batch_ids bigint[], p_deltas jsonb) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
	-- Under read committed, merge the committed rows of the touched
	-- groups with the delta; under a stricter isolation a locked row
	-- changed since the snapshot would fail the transaction, so the delta
	-- is only appended (the next read-committed writer merges it).
	IF current_setting('transaction_isolation') = 'read committed' THEN
		WITH d AS (
			SELECT * FROM jsonb_to_recordset(p_deltas) AS x(batch_id bigint, status text, leased boolean, skipped boolean, has_span boolean,
				chunks bigint, rows_read bigint, rows_inserted bigint, rows_updated bigint, rows_unchanged bigint, rows_rejected bigint,
				rows_deduplicated bigint, rows_processed bigint, reads bigint, span numeric)),
		old AS (
			DELETE FROM {s}.chunk_counts k WHERE k.ctid = ANY (ARRAY(
				SELECT o.ctid FROM {s}.chunk_counts o
				WHERE o.batch_id = ANY (p_batch_ids) AND (o.batch_id, o.status, o.leased, o.skipped, o.has_span) IN
					(SELECT d.batch_id, d.status, d.leased, d.skipped, d.has_span FROM d)
				FOR UPDATE SKIP LOCKED))
			RETURNING k.*)
		INSERT INTO {s}.chunk_counts
		SELECT a.batch_id, a.status, a.leased, a.skipped, a.has_span, sum(a.chunks), sum(a.rows_read), sum(a.rows_inserted), sum(a.rows_updated),
			sum(a.rows_unchanged), sum(a.rows_rejected), sum(a.rows_deduplicated), sum(a.rows_processed), sum(a.reads), sum(a.span)
		FROM (SELECT * FROM d UNION ALL SELECT * FROM old) a
		GROUP BY 1, 2, 3, 4, 5
		HAVING sum(a.chunks) <> 0 OR sum(a.rows_read) <> 0 OR sum(a.rows_processed) <> 0 OR sum(a.reads) <> 0 OR sum(a.span) <> 0
			OR sum(a.rows_inserted) <> 0 OR sum(a.rows_updated) <> 0 OR sum(a.rows_unchanged) <> 0 OR sum(a.rows_rejected) <> 0
			OR sum(a.rows_deduplicated) <> 0;
	ELSE
		INSERT INTO {s}.chunk_counts
		SELECT * FROM jsonb_to_recordset(p_deltas) AS x(batch_id bigint, status text, leased boolean, skipped boolean, has_span boolean,
			chunks bigint, rows_read bigint, rows_inserted bigint, rows_updated bigint, rows_unchanged bigint, rows_rejected bigint,
			rows_deduplicated bigint, rows_processed bigint, reads bigint, span numeric);
	END IF;
END
$fn$;

CREATE FUNCTION {s}.chunk_counts_trigger() RETURNS trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	v_ids bigint[];
	v_deltas jsonb;
BEGIN
	-- One pass over the statement's old and new rows, grouped; groups
	-- whose old and new rows cancel out (a heartbeat of a lease, a
	-- retry's attempt count) add nothing.
	IF TG_OP = 'INSERT' THEN
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT c.batch_id, c.status, c.lease_key IS NOT NULL AS leased, c.skipped,
				coalesce(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END > 0, false) AS has_span,
				count(*) AS chunks, sum(c.rows_read) AS rows_read, sum(c.rows_inserted) AS rows_inserted, sum(c.rows_updated) AS rows_updated,
				sum(c.rows_unchanged) AS rows_unchanged, sum(c.rows_rejected) AS rows_rejected, sum(c.rows_deduplicated) AS rows_deduplicated,
				sum(c.rows_processed) AS rows_processed, sum(c.reads) AS reads,
				coalesce(sum(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END), 0) AS span
			FROM new_chunks c GROUP BY 1, 2, 3, 4, 5) g;
	ELSIF TG_OP = 'DELETE' THEN
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT c.batch_id, c.status, c.lease_key IS NOT NULL AS leased, c.skipped,
				coalesce(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END > 0, false) AS has_span,
				-count(*) AS chunks, -sum(c.rows_read) AS rows_read, -sum(c.rows_inserted) AS rows_inserted, -sum(c.rows_updated) AS rows_updated,
				-sum(c.rows_unchanged) AS rows_unchanged, -sum(c.rows_rejected) AS rows_rejected, -sum(c.rows_deduplicated) AS rows_deduplicated,
				-sum(c.rows_processed) AS rows_processed, -sum(c.reads) AS reads,
				-coalesce(sum(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END), 0) AS span
			FROM old_chunks c
			-- A run's delete cascades here: its rollup goes with it.
			WHERE EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = c.batch_id)
			GROUP BY 1, 2, 3, 4, 5) g;
		DELETE FROM {s}.chunk_counts k WHERE k.batch_id IN (SELECT DISTINCT c.batch_id FROM old_chunks c)
			AND NOT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = k.batch_id);
	ELSE
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT c.batch_id, c.status, c.leased, c.skipped, c.has_span,
				sum(c.sign) AS chunks, sum(c.sign * c.rows_read) AS rows_read, sum(c.sign * c.rows_inserted) AS rows_inserted,
				sum(c.sign * c.rows_updated) AS rows_updated, sum(c.sign * c.rows_unchanged) AS rows_unchanged,
				sum(c.sign * c.rows_rejected) AS rows_rejected, sum(c.sign * c.rows_deduplicated) AS rows_deduplicated,
				sum(c.sign * c.rows_processed) AS rows_processed, sum(c.sign * c.reads) AS reads, coalesce(sum(c.sign * c.span), 0) AS span
			FROM (
				SELECT 1 AS sign, n.batch_id, n.status, n.lease_key IS NOT NULL AS leased, n.skipped, n.rows_read, n.rows_inserted, n.rows_updated,
					n.rows_unchanged, n.rows_rejected, n.rows_deduplicated, n.rows_processed, n.reads,
					CASE n.kind WHEN 'time' THEN extract(epoch FROM n.end_at - n.start_at) WHEN 'int' THEN (n.hi - n.lo)::numeric END AS span
				FROM new_chunks n
				UNION ALL
				SELECT -1, o.batch_id, o.status, o.lease_key IS NOT NULL, o.skipped, o.rows_read, o.rows_inserted, o.rows_updated,
					o.rows_unchanged, o.rows_rejected, o.rows_deduplicated, o.rows_processed, o.reads,
					CASE o.kind WHEN 'time' THEN extract(epoch FROM o.end_at - o.start_at) WHEN 'int' THEN (o.hi - o.lo)::numeric END
				FROM old_chunks o) c0
			CROSS JOIN LATERAL (SELECT c0.*, coalesce(c0.span > 0, false) AS has_span) c
			GROUP BY 1, 2, 3, 4, 5
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

CREATE TRIGGER chunk_counts_insert AFTER INSERT ON {s}.chunks REFERENCING NEW TABLE AS new_chunks
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.chunk_counts_trigger();
CREATE TRIGGER chunk_counts_update AFTER UPDATE ON {s}.chunks REFERENCING OLD TABLE AS old_chunks NEW TABLE AS new_chunks
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.chunk_counts_trigger();
CREATE TRIGGER chunk_counts_delete AFTER DELETE ON {s}.chunks REFERENCING OLD TABLE AS old_chunks
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.chunk_counts_trigger();

CREATE FUNCTION {s}.exception_counts_trigger() RETURNS trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	v_ids bigint[];
	v_deltas jsonb;
BEGIN
	IF TG_OP = 'INSERT' THEN
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT e.batch_id, e.reason, e.column_name, count(*) AS n FROM new_exceptions e
			WHERE e.failed_attempt IS NULL GROUP BY 1, 2, 3) g;
	ELSIF TG_OP = 'DELETE' THEN
		DELETE FROM {s}.exception_counts k WHERE k.batch_id IN (SELECT DISTINCT e.batch_id FROM old_exceptions e)
			AND NOT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = k.batch_id);
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT e.batch_id, e.reason, e.column_name, -count(*) AS n FROM old_exceptions e
			WHERE e.failed_attempt IS NULL AND EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = e.batch_id) GROUP BY 1, 2, 3) g;
	ELSE
		SELECT array_agg(DISTINCT g.batch_id), jsonb_agg(g) INTO v_ids, v_deltas FROM (
			SELECT e.batch_id, e.reason, e.column_name, sum(e.sign) AS n FROM (
				SELECT 1 AS sign, x.batch_id, x.reason, x.column_name FROM new_exceptions x WHERE x.failed_attempt IS NULL
				UNION ALL
				SELECT -1, x.batch_id, x.reason, x.column_name FROM old_exceptions x WHERE x.failed_attempt IS NULL) e
			GROUP BY 1, 2, 3 HAVING sum(e.sign) <> 0) g;
	END IF;
	IF v_deltas IS NULL THEN
		RETURN NULL;
	END IF;
	IF current_setting('transaction_isolation') = 'read committed' THEN
		WITH d AS (SELECT * FROM jsonb_to_recordset(v_deltas) AS x(batch_id bigint, reason text, column_name text, n bigint)),
		old AS (
			DELETE FROM {s}.exception_counts k WHERE k.ctid = ANY (ARRAY(
				SELECT o.ctid FROM {s}.exception_counts o
				WHERE o.batch_id = ANY (v_ids) AND (o.batch_id, o.reason, o.column_name) IN (SELECT d.batch_id, d.reason, d.column_name FROM d)
				FOR UPDATE SKIP LOCKED))
			RETURNING k.*)
		INSERT INTO {s}.exception_counts
		SELECT a.batch_id, a.reason, a.column_name, sum(a.n) FROM (SELECT * FROM d UNION ALL SELECT * FROM old) a
		GROUP BY 1, 2, 3 HAVING sum(a.n) <> 0;
	ELSE
		INSERT INTO {s}.exception_counts
		SELECT * FROM jsonb_to_recordset(v_deltas) AS x(batch_id bigint, reason text, column_name text, n bigint);
	END IF;
	RETURN NULL;
END
$fn$;

CREATE TRIGGER exception_counts_insert AFTER INSERT ON {s}.exceptions REFERENCING NEW TABLE AS new_exceptions
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.exception_counts_trigger();
CREATE TRIGGER exception_counts_update AFTER UPDATE ON {s}.exceptions REFERENCING OLD TABLE AS old_exceptions NEW TABLE AS new_exceptions
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.exception_counts_trigger();
CREATE TRIGGER exception_counts_delete AFTER DELETE ON {s}.exceptions REFERENCING OLD TABLE AS old_exceptions
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.exception_counts_trigger();

REVOKE EXECUTE ON FUNCTION {s}.chunk_counts_apply(bigint[], jsonb), {s}.chunk_counts_trigger(), {s}.exception_counts_trigger() FROM PUBLIC;

-- The existing runs' rollups (the migration holds the tables' locks).
LOCK TABLE {s}.chunks, {s}.exceptions IN SHARE MODE;
INSERT INTO {s}.chunk_counts
SELECT c.batch_id, c.status, c.lease_key IS NOT NULL, c.skipped,
	coalesce(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END > 0, false),
	count(*), sum(c.rows_read), sum(c.rows_inserted), sum(c.rows_updated), sum(c.rows_unchanged), sum(c.rows_rejected),
	sum(c.rows_deduplicated), sum(c.rows_processed), sum(c.reads),
	coalesce(sum(CASE c.kind WHEN 'time' THEN extract(epoch FROM c.end_at - c.start_at) WHEN 'int' THEN (c.hi - c.lo)::numeric END), 0)
FROM {s}.chunks c GROUP BY 1, 2, 3, 4, 5;
INSERT INTO {s}.exception_counts
SELECT e.batch_id, e.reason, e.column_name, count(*) FROM {s}.exceptions e WHERE e.failed_attempt IS NULL GROUP BY 1, 2, 3;

-- The roles granted on chunks get the same privileges on the rollups
-- (readers SELECT; a loader writes them only through the triggers, which
-- run as the owner, but gets what it has on chunks, as Grants gives).
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
		EXECUTE format('GRANT %s ON TABLE %s.chunk_counts, %s.exception_counts TO %s',
			g.privilege_type, quote_ident({schema}), quote_ident({schema}), g.role);
	END LOOP;
END
$do$;

-- run_progress reads the rollup: the same columns and numbers as before,
-- without a pass over the run's chunks; its time split is computed once
-- (it was inlined in each of its uses), and the run's pauses and resumes
-- are read by an index on the run lifecycle events (kind run_*), not
-- among all its events.
CREATE INDEX events_run_lifecycle ON {s}.events (batch_id, id) WHERE kind LIKE 'run\_%';

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
	-- checkpoint from the index on checkpointed_at.
	SELECT coalesce(sum(g.n), 0)::int AS chunks_total,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'done'), 0)::int AS chunks_done,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'open'), 0)::int AS chunks_open,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'pending'), 0)::int AS chunks_pending,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'failed'), 0)::int AS chunks_failed,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'staged'), 0)::int AS chunks_staged,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'rolled_back'), 0)::int AS chunks_rolled_back,
		coalesce(sum(g.n) FILTER (WHERE g.status NOT IN ('done', 'open', 'pending', 'failed', 'staged', 'rolled_back')), 0)::int AS chunks_other,
		coalesce(sum(g.n) FILTER (WHERE g.leased AND g.status IN ('pending', 'open')), 0)::int AS chunks_leased,
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
	FROM (SELECT x.status, x.leased, x.skipped, x.has_span, x.status IN ('done', 'open') AS checkpointed,
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

-- The run_progress row of one run through a plan the session keeps
-- (PL/pgSQL caches it, generic in the batch id): the view's planning
-- costs more than its execution, and Status reads it on every call.
CREATE FUNCTION {s}.run_progress_of(p_batch_id bigint) RETURNS SETOF {s}.run_progress
	LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN
	RETURN QUERY SELECT * FROM {s}.run_progress WHERE batch_id = p_batch_id;
END
$fn$;
COMMENT ON FUNCTION {s}.run_progress_of(bigint) IS
	'The run_progress row of run p_batch_id (none when there is no such run), through a plan cached by the session.';
