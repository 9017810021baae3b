-- Manifest migration 14: throttle_periods (one row per hold of a throttle,
-- per worker) and job_slots (the run's concurrency slots,
-- Config.JobConcurrency); manifest_throttle.go.
--
-- The slots: a chunk's transaction locks one slot row of its run (FOR
-- UPDATE SKIP LOCKED) before it claims a chunk, and keeps it until it
-- ends, so at most JobConcurrency chunk transactions of the run are open
-- at once, across every process. The lock dies with the transaction (a
-- crash, a fenced worker, a rollback): nothing to clean up, and nothing
-- outside the transaction (pooler-safe).

CREATE TABLE {s}.throttle_periods (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	batch_id    bigint NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
	worker_key  text NOT NULL DEFAULT '',
	signal      text NOT NULL,
	reason      text NOT NULL DEFAULT '',
	value       double precision NOT NULL,
	high        double precision NOT NULL,
	low         double precision NOT NULL,
	started_at  timestamptz NOT NULL DEFAULT now(),
	ended_at    timestamptz,
	end_value   double precision
);
CREATE INDEX throttle_periods_batch ON {s}.throttle_periods (batch_id, started_at);
CREATE TABLE {s}.job_slots (
	batch_id bigint NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
	slot     int NOT NULL,
	PRIMARY KEY (batch_id, slot)
);
