-- Manifest migration 31: sub-chunks, the refinements of a plan chunk that
-- adaptive chunks (Config.ChunkTarget) commit one transaction each, and
-- the knobs that size or stop them (chunk_target_ms, chunk_max_rows).
--
-- A row is a committed sub-range [lo, hi) of plan chunk (batch_id, seq),
-- inserted in the sub-range's own transaction (under the chunk's fence)
-- with its counts. The plan chunk's row in chunks is untouched (pending)
-- until its last sub-range commits, whose transaction completes it with
-- the sums of every sub-range. Bounds are text as chunks records them
-- (decimal for int, RFC 3339 for time), the seq's kind tells which.

CREATE TABLE {s}.subchunks (
	batch_id          bigint NOT NULL,
	seq               int NOT NULL,
	lo                text NOT NULL,
	hi                text NOT NULL,
	-- pos orders the sub-ranges of a chunk (0, 1, ...): they are committed
	-- in order, each starting where the previous one ended.
	pos               int NOT NULL,
	rows_read         bigint NOT NULL,
	rows_inserted     bigint NOT NULL,
	rows_updated      bigint NOT NULL,
	rows_unchanged    bigint NOT NULL,
	rows_rejected     bigint NOT NULL,
	rows_deduplicated bigint NOT NULL,
	-- split: the sub-range was cut short after a statement timeout (or a
	-- lock wait beyond its budget) of a larger one.
	split             boolean NOT NULL DEFAULT false,
	duration_ms       double precision NOT NULL,
	worker            text NOT NULL,
	committed_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
	PRIMARY KEY (batch_id, seq, pos),
	UNIQUE (batch_id, seq, lo)
);
COMMENT ON TABLE {s}.subchunks IS
	'Committed sub-ranges [lo, hi) of plan chunks split to stay near Config.ChunkTarget; the plan chunk is done when its last sub-range commits (its counts are their sums).';

-- Loaders write sub-chunks as they write chunks.
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
		EXECUTE format('GRANT %s ON TABLE %s.subchunks TO %s', g.privilege_type, quote_ident({schema}), g.role);
	END LOOP;
END
$do$;

-- The adaptive chunk knobs: chunk_target_ms (the target duration of a
-- chunk's transaction in milliseconds; 0 turns adaptation off) and
-- chunk_max_rows (a cap on a sub-chunk's rows; 0: none). The other knobs
-- go on to set_knob_apply.
CREATE FUNCTION {s}.set_chunk_knob(p_batch_id bigint, p_key text, p_value text, p_actor text, p_reason text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
	r record;
	v double precision;
	prev double precision;
BEGIN
	PERFORM {s}.control_args('set_knob ' || coalesce(p_key, ''), p_actor, p_reason);
	SELECT batch_id, job_name, status INTO r FROM {s}.runs WHERE batch_id = p_batch_id FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'backfill: set_knob %: no run with batch id %', p_key, p_batch_id USING ERRCODE = 'P0002';
	END IF;
	IF r.status NOT IN ('running', 'failed', 'paused', 'cancelled') THEN
		RAISE EXCEPTION 'backfill: cannot set knob % of batch % of job %: it is %', p_key, p_batch_id, quote_literal(r.job_name), r.status
			USING ERRCODE = '55000';
	END IF;
	SELECT value INTO prev FROM {s}.knobs WHERE batch_id = p_batch_id AND key = p_key;
	IF lower(btrim(coalesce(p_value, ''))) <> 'default' THEN
		BEGIN
			v := btrim(p_value)::double precision;
		EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range OR null_value_not_allowed THEN
			v := NULL;
		END;
		IF v IS NULL OR v IN ('NaN', 'Infinity', '-Infinity') THEN
			RAISE EXCEPTION 'backfill: set_knob: knob % value % is not a finite number (or default)', p_key, quote_nullable(p_value)
				USING ERRCODE = '22023';
		END IF;
		IF v < 0 OR v <> trunc(v) OR v > 1e15 THEN
			RAISE EXCEPTION 'backfill: set_knob: knob % value % must be a whole number from 0 (off) to 1e15', p_key, quote_literal(p_value)
				USING ERRCODE = '22023';
		END IF;
	END IF;
	IF v IS NULL THEN
		DELETE FROM {s}.knobs WHERE batch_id = p_batch_id AND key = p_key;
	ELSE
		INSERT INTO {s}.knobs (batch_id, key, value, set_by, reason) VALUES (p_batch_id, p_key, v, p_actor, p_reason)
			ON CONFLICT (batch_id, key) DO UPDATE SET value = excluded.value, set_by = excluded.set_by,
				reason = excluded.reason, updated_at = now();
	END IF;
	INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail) VALUES (p_batch_id, r.job_name, 'knob_set', p_actor,
		jsonb_build_object('why', p_reason, 'key', p_key, 'value', v, 'previous', prev));
	PERFORM pg_notify({schema}, json_build_object('batch_id', p_batch_id, 'action', 'set_knob', 'job', left(r.job_name, 200), 'key', left(p_key, 200))::text);
	RETURN coalesce(v::text, 'default');
END
$fn$;

CREATE OR REPLACE FUNCTION {s}.set_knob(p_batch_id bigint, p_key text, p_value text, p_actor text, p_reason text) RETURNS text LANGUAGE plpgsql AS $fn$
BEGIN
	PERFORM {s}.control_cap('set_knob', 'knob name', p_key, 200);
	PERFORM {s}.control_cap('set_knob ' || p_key, 'knob value', p_value, 100);
	IF p_key IN ('chunk_target_ms', 'chunk_max_rows') THEN
		RETURN {s}.set_chunk_knob(p_batch_id, p_key, p_value, p_actor, p_reason);
	END IF;
	RETURN {s}.set_knob_apply(p_batch_id, p_key, p_value, p_actor, p_reason);
END
$fn$;
ALTER FUNCTION {s}.set_chunk_knob(bigint, text, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION {s}.set_chunk_knob(bigint, text, text, text, text) FROM PUBLIC;
-- CREATE OR REPLACE keeps set_knob's owner and grants, not its settings.
ALTER FUNCTION {s}.set_knob(bigint, text, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
