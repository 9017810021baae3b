-- Manifest migration 12: the workers table (workers and their heartbeats)
-- and the run_liveness view, each run's liveness (manifest_worker.go).

CREATE TABLE {s}.workers (
	worker_key   text PRIMARY KEY,
	worker_id    text NOT NULL,
	batch_id     bigint NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
	job_name     text NOT NULL,
	host         text NOT NULL DEFAULT '',
	pid          int NOT NULL DEFAULT 0,
	stale_after  interval NOT NULL,
	started_at   timestamptz NOT NULL DEFAULT now(),
	heartbeat_at timestamptz NOT NULL DEFAULT now(),
	finished_at  timestamptz,
	state        text NOT NULL DEFAULT 'working' CHECK (state IN ('working', 'finished', 'lost'))
);
CREATE INDEX workers_batch ON {s}.workers (batch_id, heartbeat_at DESC);
CREATE VIEW {s}.run_liveness AS
	SELECT r.batch_id, r.job_name, r.status,
		CASE WHEN r.status <> 'running' THEN r.status
			WHEN EXISTS (SELECT 1 FROM {s}.workers w WHERE w.batch_id = r.batch_id AND w.finished_at IS NULL
				AND w.heartbeat_at >= now() - w.stale_after) THEN 'running'
			WHEN EXISTS (SELECT 1 FROM {s}.workers w WHERE w.batch_id = r.batch_id AND w.finished_at IS NULL
				AND w.heartbeat_at >= now() - 2 * w.stale_after) THEN 'stalled'
			ELSE 'dead' END AS liveness,
		(SELECT max(w.heartbeat_at) FROM {s}.workers w WHERE w.batch_id = r.batch_id) AS last_heartbeat,
		(SELECT count(*) FROM {s}.workers w WHERE w.batch_id = r.batch_id AND w.finished_at IS NULL
			AND w.heartbeat_at >= now() - w.stale_after) AS live_workers
	FROM {s}.runs r;
COMMENT ON VIEW {s}.run_liveness IS
	'Liveness of each run: for a running run, running (a worker heartbeated within its stale bound), stalled (the freshest unfinished worker is past the bound but within twice it), dead (no unfinished worker heartbeated within twice the bound, or none ever did: nobody works the run; run the job again to resume it); otherwise the run''s status.';
