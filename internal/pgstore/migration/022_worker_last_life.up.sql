-- Manifest migration 22: a worker's last sign of life (worker_last_life):
-- its last heartbeat, or later its chunk activity (the latest lease it
-- still holds, the latest checkpoint of a chunk it completed). A worker
-- killed before its first heartbeat read rows all the same: the
-- run_progress view now counts a stale worker live up to its last sign
-- of life, not only up to its last heartbeat.

CREATE OR REPLACE FUNCTION {s}.worker_last_life(p_worker_key text) RETURNS timestamptz LANGUAGE sql STABLE AS $fn$
	SELECT greatest(w.heartbeat_at,
		(SELECT max(c.leased_at) FROM {s}.chunks c WHERE c.batch_id = w.batch_id AND c.lease_key = w.worker_key),
		(SELECT max(c.checkpointed_at) FROM {s}.chunks c WHERE c.batch_id = w.batch_id AND c.worker = w.worker_id
			AND c.checkpointed_at >= w.started_at
			AND c.checkpointed_at < coalesce((SELECT min(w2.started_at) FROM {s}.workers w2
				WHERE w2.batch_id = w.batch_id AND w2.worker_id = w.worker_id AND w2.started_at > w.started_at), 'infinity')))
	FROM {s}.workers w WHERE w.worker_key = p_worker_key
$fn$;
COMMENT ON FUNCTION {s}.worker_last_life(text) IS
	'The last sign of life of a worker: the latest of its last heartbeat, the lease time of a chunk it still holds, and the checkpoint time of a chunk it completed (by worker id, before another worker of that id started). A worker that stopped heartbeating was live up to it.';

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
CROSS JOIN LATERAL (SELECT coalesce(r.finished_at, CASE WHEN r.status IN ('running', 'paused') THEN now() ELSE greatest(r.updated_at, r.created_at) END) AS t_end) t
CROSS JOIN LATERAL (
	-- One pass over the run's chunks, grouped by status and whether the
	-- plan knows a span (seconds of a time chunk, keys of an int chunk;
	-- none for a list chunk), then the few groups pivoted.
	SELECT coalesce(sum(g.n), 0)::int AS chunks_total,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'done'), 0)::int AS chunks_done,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'open'), 0)::int AS chunks_open,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'pending'), 0)::int AS chunks_pending,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'failed'), 0)::int AS chunks_failed,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'staged'), 0)::int AS chunks_staged,
		coalesce(sum(g.n) FILTER (WHERE g.status = 'rolled_back'), 0)::int AS chunks_rolled_back,
		coalesce(sum(g.n) FILTER (WHERE g.status NOT IN ('done', 'open', 'pending', 'failed', 'staged', 'rolled_back')), 0)::int AS chunks_other,
		coalesce(sum(g.skipped) FILTER (WHERE g.checkpointed), 0)::int AS chunks_skipped,
		coalesce(sum(g.leased) FILTER (WHERE g.status IN ('pending', 'open')), 0)::int AS chunks_leased,
		coalesce(sum(g.rows_read) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_read,
		coalesce(sum(g.rows_inserted) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_inserted,
		coalesce(sum(g.rows_updated) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_updated,
		coalesce(sum(g.rows_unchanged) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_unchanged,
		coalesce(sum(g.rows_rejected) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_rejected,
		coalesce(sum(g.rows_deduplicated) FILTER (WHERE g.checkpointed), 0)::bigint AS rows_deduplicated,
		coalesce(sum(g.rows_processed), 0)::bigint AS rows_processed,
		coalesce(sum(g.reads), 0)::bigint AS chunk_reads,
		max(g.last_checkpoint) AS last_checkpoint,
		coalesce(sum(g.rows_read) FILTER (WHERE g.checkpointed AND g.has_span), 0)::float8 AS known_span_rows,
		coalesce(sum(g.span) FILTER (WHERE g.checkpointed AND g.has_span), 0)::float8 AS known_span,
		coalesce(sum(g.rows_read) FILTER (WHERE g.checkpointed), 0)::float8 AS known_rows,
		coalesce(sum(g.n) FILTER (WHERE g.checkpointed), 0)::float8 AS known_chunks,
		coalesce(sum(g.span) FILTER (WHERE g.remaining AND g.has_span), 0)::float8 AS rem_span,
		coalesce(sum(g.n) FILTER (WHERE g.remaining AND g.has_span), 0)::int AS rem_span_chunks,
		coalesce(sum(g.n) FILTER (WHERE g.remaining), 0)::int AS rem_chunks
	FROM (SELECT x.status, x.status IN ('done', 'open') AS checkpointed, x.status IN ('pending', 'failed') AS remaining,
			coalesce(x.span > 0, false) AS has_span, count(*) AS n, count(x.lease_key) AS leased, count(*) FILTER (WHERE x.skipped) AS skipped,
			sum(x.rows_read) AS rows_read, sum(x.rows_inserted) AS rows_inserted, sum(x.rows_updated) AS rows_updated,
			sum(x.rows_unchanged) AS rows_unchanged, sum(x.rows_rejected) AS rows_rejected, sum(x.rows_deduplicated) AS rows_deduplicated,
			sum(x.rows_processed) AS rows_processed, sum(x.reads) AS reads, max(x.checkpointed_at) AS last_checkpoint,
			sum(x.span) AS span
		FROM (SELECT ch.status, ch.lease_key, ch.skipped, ch.rows_read, ch.rows_inserted, ch.rows_updated, ch.rows_unchanged, ch.rows_rejected,
				ch.rows_deduplicated, ch.rows_processed, ch.reads, ch.checkpointed_at,
				CASE ch.kind WHEN 'time' THEN extract(epoch FROM ch.end_at - ch.start_at)::float8
					WHEN 'int' THEN (ch.hi - ch.lo)::float8 END AS span
			FROM {s}.chunks ch WHERE ch.batch_id = r.batch_id) x
		GROUP BY 1, 2, 3, 4) g
) c
CROSS JOIN LATERAL (
	SELECT tstzmultirange(tstzrange(r.created_at, greatest(r.created_at, t.t_end))) AS total,
		coalesce((SELECT range_agg(tstzrange(e.created_at, greatest(e.created_at, coalesce(
				(SELECT min(e2.created_at) FROM {s}.events e2 WHERE e2.batch_id = e.batch_id AND e2.id > e.id
					AND e2.kind LIKE 'run\_%' AND e2.kind <> 'run_paused'), t.t_end))))
			FROM {s}.events e WHERE e.batch_id = r.batch_id AND e.kind = 'run_paused'), '{}'::tstzmultirange) AS paused,
		coalesce((SELECT range_agg(tstzrange(p.started_at, greatest(p.started_at, coalesce(p.ended_at, pw.finished_at,
				CASE WHEN pw.heartbeat_at < now() - pw.stale_after THEN {s}.worker_last_life(pw.worker_key) END, now()))))
			FROM {s}.throttle_periods p LEFT JOIN {s}.workers pw ON pw.worker_key = p.worker_key
			WHERE p.batch_id = r.batch_id), '{}'::tstzmultirange) AS throttled,
		(SELECT range_agg(tstzrange(ww.started_at, greatest(ww.started_at, coalesce(ww.finished_at,
				CASE WHEN ww.heartbeat_at < now() - ww.stale_after THEN {s}.worker_last_life(ww.worker_key) END, now()))))
			FROM {s}.workers ww WHERE ww.batch_id = r.batch_id) AS workers
) m
CROSS JOIN LATERAL (
	SELECT m.total * m.paused AS paused,
		m.total * m.throttled - m.paused AS throttled,
		m.total - coalesce(m.workers, m.total) - m.paused - m.throttled AS idle,
		m.total * coalesce(m.workers, m.total) - m.paused - m.throttled AS working
) mr
CROSS JOIN LATERAL (
	SELECT (SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(m.total) z) AS total_seconds,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(mr.working) z) AS working_seconds,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(mr.throttled) z) AS throttled_seconds,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(mr.paused) z) AS paused_seconds,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest(mr.idle) z) AS idle_seconds
) s
CROSS JOIN LATERAL (
	SELECT ws.window_start,
		(SELECT coalesce(sum(k.rows_read), 0)::bigint FROM {s}.chunks k WHERE k.batch_id = r.batch_id
			AND k.checkpointed_at > ws.window_start AND k.checkpointed_at <= t.t_end) AS window_rows,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8
			FROM unnest(mr.working * tstzmultirange(tstzrange(ws.window_start, greatest(ws.window_start, t.t_end)))) z) AS window_working_seconds
	FROM (SELECT greatest(r.created_at, least(t.t_end - interval '20 seconds', coalesce(
			(SELECT k.checkpointed_at FROM {s}.chunks k WHERE k.batch_id = r.batch_id AND k.checkpointed_at IS NOT NULL
				ORDER BY k.checkpointed_at DESC OFFSET 20 LIMIT 1), r.created_at))) AS window_start) ws
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
