-- Manifest migration 1: runs, chunks, the exception queue and the audit
-- log.

CREATE TABLE {s}.runs (
	batch_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	job_name         text NOT NULL,
	source           text NOT NULL DEFAULT '',
	code_version     text NOT NULL DEFAULT '',
	plan_fingerprint text NOT NULL,
	plan             jsonb NOT NULL,
	scope            text NOT NULL,
	scope_lower      text NOT NULL,
	scope_upper      text NOT NULL,
	status           text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'abandoned')),
	chunks_total     int NOT NULL,
	started_by       text NOT NULL DEFAULT '',
	created_at       timestamptz NOT NULL DEFAULT now(),
	updated_at       timestamptz NOT NULL DEFAULT now(),
	finished_at      timestamptz,
	last_error       text NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX runs_one_active_per_job ON {s}.runs (job_name) WHERE status IN ('running', 'failed');
CREATE INDEX runs_job ON {s}.runs (job_name, batch_id DESC);

CREATE TABLE {s}.chunks (
	batch_id          bigint NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
	seq               int NOT NULL,
	chunk_id          text NOT NULL,
	kind              text NOT NULL,
	lower_bound       text NOT NULL,
	upper_bound       text NOT NULL,
	start_at          timestamptz,
	end_at            timestamptz,
	lo                bigint,
	hi                bigint,
	item              text,
	status            text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'failed')),
	attempts          int NOT NULL DEFAULT 0,
	rows_read         bigint NOT NULL DEFAULT 0,
	rows_inserted     bigint NOT NULL DEFAULT 0,
	rows_updated      bigint NOT NULL DEFAULT 0,
	rows_unchanged    bigint NOT NULL DEFAULT 0,
	rows_rejected     bigint NOT NULL DEFAULT 0,
	rows_deduplicated bigint NOT NULL DEFAULT 0,
	started_at        timestamptz,
	finished_at       timestamptz,
	worker            text NOT NULL DEFAULT '',
	last_error        text NOT NULL DEFAULT '',
	PRIMARY KEY (batch_id, seq),
	UNIQUE (batch_id, chunk_id),
	CONSTRAINT chunk_rows_balance CHECK (rows_read = rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated)
);
CREATE INDEX chunks_pending ON {s}.chunks (batch_id, seq) WHERE status = 'pending';

CREATE TABLE {s}.exceptions (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	batch_id    bigint NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
	chunk_id    text NOT NULL,
	row_number  bigint NOT NULL,
	raw         jsonb,
	column_name text NOT NULL DEFAULT '',
	value       text NOT NULL DEFAULT '',
	reason      text NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX exceptions_batch_chunk ON {s}.exceptions (batch_id, chunk_id, row_number);

CREATE TABLE {s}.events (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	batch_id   bigint REFERENCES {s}.runs ON DELETE CASCADE,
	job_name   text NOT NULL,
	kind       text NOT NULL,
	actor      text NOT NULL DEFAULT '',
	detail     jsonb NOT NULL DEFAULT '{}',
	created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_batch ON {s}.events (batch_id, id);
