-- Manifest migration 3: paused and rolled back runs; validation evidence.

ALTER TABLE {s}.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE {s}.runs ADD CONSTRAINT runs_status_check
	CHECK (status IN ('running', 'completed', 'failed', 'abandoned', 'paused', 'rolled_back'));
DROP INDEX {s}.runs_one_active_per_job;
CREATE UNIQUE INDEX runs_one_active_per_job ON {s}.runs (job_name) WHERE status IN ('running', 'failed', 'paused');
CREATE TABLE {s}.validations (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	batch_id   bigint NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
	chunk_id   text NOT NULL,
	check_name text NOT NULL,
	severity   text NOT NULL,
	passed     boolean NOT NULL,
	expected   text NOT NULL DEFAULT '',
	actual     text NOT NULL DEFAULT '',
	sample     jsonb NOT NULL DEFAULT '[]',
	detail     jsonb,
	created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX validations_batch ON {s}.validations (batch_id, chunk_id, id);
