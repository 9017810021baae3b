-- Manifest migration 13: the waits table, one row per try of a chunk that
-- waited and was rolled back (backfill_timeouts.go, manifest_waits.go).
-- Append-only, each row in a short transaction of its own after the
-- chunk's rollback.

CREATE TABLE {s}.waits (
	id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	batch_id          bigint NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
	seq               int NOT NULL,
	chunk_id          text NOT NULL,
	attempt           int NOT NULL,
	try               int NOT NULL,
	sqlstate          text NOT NULL,
	message           text NOT NULL DEFAULT '',
	lock_timeout      text NOT NULL DEFAULT '',
	statement_timeout text NOT NULL DEFAULT '',
	waited            interval NOT NULL,
	sleep             interval NOT NULL,
	final             boolean NOT NULL DEFAULT false,
	blockers          jsonb NOT NULL DEFAULT '[]',
	worker            text NOT NULL DEFAULT '',
	at                timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX waits_batch ON {s}.waits (batch_id, seq, id);
COMMENT ON TABLE {s}.waits IS
	'Tries of chunks that waited (lock timeout 55P03, deadlock 40P01, serialization failure 40001, statement timeout 57014) and were rolled back and retried: the try''s timeouts (ms), how long it waited, and the sessions that blocked it (pg_blocking_pids). Append-only; a crash between a rollback and its record loses that record.';
