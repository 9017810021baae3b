-- Manifest migration 16: cancelled runs, live knobs, the control
-- functions and the append-only audit log (manifest_control.go).
-- "{schema}" is the schema's name as a string literal (the notification
-- channel).

ALTER TABLE {s}.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE {s}.runs ADD CONSTRAINT runs_status_check
	CHECK (status IN ('running', 'completed', 'failed', 'abandoned', 'paused', 'rolled_back', 'cancelled'));

CREATE TABLE {s}.knobs (
	batch_id   bigint NOT NULL REFERENCES {s}.runs ON DELETE CASCADE,
	key        text NOT NULL,
	value      double precision NOT NULL,
	set_by     text NOT NULL,
	reason     text NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (batch_id, key)
);
COMMENT ON TABLE {s}.knobs IS
	'Live settings of a run, set with set_knob(): concurrency, job_concurrency, rows_per_second, throttle.<signal>.high and .low. Every worker re-reads them each throttle interval.';

-- No UPDATE, DELETE (a deleted run's cascade included: a run with an
-- audit trail cannot be deleted) or TRUNCATE of the audit log.
CREATE FUNCTION {s}.events_append_only() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
	RAISE EXCEPTION 'backfill: the audit log (events) is append-only: % refused', TG_OP
		USING ERRCODE = '55000';
END
$fn$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON {s}.events
	FOR EACH ROW EXECUTE FUNCTION {s}.events_append_only();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON {s}.events
	FOR EACH STATEMENT EXECUTE FUNCTION {s}.events_append_only();

CREATE FUNCTION {s}.control_run(p_job text, p_action text) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
	id bigint;
BEGIN
	-- The job's latest run: an older run is named by its batch id (and a
	-- resume refuses it when a newer run exists).
	SELECT batch_id INTO id FROM {s}.runs WHERE job_name = p_job ORDER BY batch_id DESC LIMIT 1;
	IF id IS NULL THEN
		RAISE EXCEPTION 'backfill: %: job % has no run', p_action, quote_literal(p_job)
			USING ERRCODE = 'P0002';
	END IF;
	RETURN id;
END
$fn$;

CREATE FUNCTION {s}.control_args(p_action text, p_actor text, p_reason text) RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
	IF p_actor IS NULL OR btrim(p_actor) = '' THEN
		RAISE EXCEPTION 'backfill: %: an actor is required (who decides)', p_action USING ERRCODE = '22023';
	END IF;
	IF p_reason IS NULL OR btrim(p_reason) = '' THEN
		RAISE EXCEPTION 'backfill: %: a reason is required (why)', p_action USING ERRCODE = '22023';
	END IF;
END
$fn$;

CREATE FUNCTION {s}.control(p_batch_id bigint, p_action text, p_actor text, p_reason text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
	r record;
	v_next text;
	allowed text[];
	v_kind text;
	v_detail jsonb;
BEGIN
	PERFORM {s}.control_args(p_action, p_actor, p_reason);
	CASE p_action
	WHEN 'pause' THEN v_next := 'paused'; allowed := ARRAY['running', 'failed']; v_kind := 'run_paused';
	WHEN 'resume' THEN v_next := 'running'; allowed := ARRAY['paused', 'cancelled']; v_kind := 'run_resumed_by_operator';
	WHEN 'cancel' THEN v_next := 'cancelled'; allowed := ARRAY['running', 'paused', 'failed']; v_kind := 'run_cancelled';
	ELSE RAISE EXCEPTION 'backfill: unknown control action %', quote_literal(p_action) USING ERRCODE = '22023';
	END CASE;
	SELECT batch_id, job_name, status INTO r FROM {s}.runs WHERE batch_id = p_batch_id FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'backfill: %: no run with batch id %', p_action, p_batch_id USING ERRCODE = 'P0002';
	END IF;
	IF NOT r.status = ANY (allowed) THEN
		RAISE EXCEPTION 'backfill: cannot % batch % of job %: it is %; % needs a run that is %',
			p_action, p_batch_id, quote_literal(r.job_name), r.status, p_action, array_to_string(allowed, ' or ')
			USING ERRCODE = '55000';
	END IF;
	IF p_action = 'resume' AND EXISTS (SELECT 1 FROM {s}.runs WHERE job_name = r.job_name AND batch_id <> p_batch_id
			AND status IN ('running', 'failed', 'paused')) THEN
		RAISE EXCEPTION 'backfill: cannot resume batch % of job %: the job has another unfinished run', p_batch_id, quote_literal(r.job_name)
			USING ERRCODE = '55000';
	END IF;
	IF p_action = 'resume' AND EXISTS (SELECT 1 FROM {s}.runs WHERE job_name = r.job_name AND batch_id > p_batch_id) THEN
		RAISE EXCEPTION 'backfill: cannot resume batch % of job %: a newer run of the job exists; start a new run instead', p_batch_id, quote_literal(r.job_name)
			USING ERRCODE = '55000';
	END IF;
	UPDATE {s}.runs SET status = v_next, updated_at = now(),
		last_error = CASE WHEN v_next = 'running' THEN '' ELSE format('%s by %s: %s', v_next, p_actor, p_reason) END,
		finished_at = CASE WHEN v_next = 'cancelled' THEN now() WHEN v_next = 'running' THEN NULL ELSE finished_at END
		WHERE batch_id = p_batch_id;
	v_detail := jsonb_build_object('why', p_reason);
	IF p_action <> 'resume' THEN
		v_detail := v_detail || jsonb_build_object('from', r.status);
	END IF;
	INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail) VALUES (p_batch_id, r.job_name, v_kind, p_actor, v_detail);
	-- The job name is cut: a notification's payload is under 8000 bytes.
	PERFORM pg_notify({schema}, json_build_object('batch_id', p_batch_id, 'action', p_action, 'job', left(r.job_name, 200))::text);
	RETURN v_next;
END
$fn$;

CREATE FUNCTION {s}.pause(batch_id bigint, actor text, reason text) RETURNS text LANGUAGE sql AS
	$fn$ SELECT {s}.control(batch_id, 'pause', actor, reason) $fn$;
CREATE FUNCTION {s}.resume(batch_id bigint, actor text, reason text) RETURNS text LANGUAGE sql AS
	$fn$ SELECT {s}.control(batch_id, 'resume', actor, reason) $fn$;
CREATE FUNCTION {s}.cancel(batch_id bigint, actor text, reason text) RETURNS text LANGUAGE sql AS
	$fn$ SELECT {s}.control(batch_id, 'cancel', actor, reason) $fn$;
CREATE FUNCTION {s}.pause(job text, actor text, reason text) RETURNS text LANGUAGE sql AS
	$fn$ SELECT {s}.control({s}.control_run(job, 'pause'), 'pause', actor, reason) $fn$;
CREATE FUNCTION {s}.resume(job text, actor text, reason text) RETURNS text LANGUAGE sql AS
	$fn$ SELECT {s}.control({s}.control_run(job, 'resume'), 'resume', actor, reason) $fn$;
CREATE FUNCTION {s}.cancel(job text, actor text, reason text) RETURNS text LANGUAGE sql AS
	$fn$ SELECT {s}.control({s}.control_run(job, 'cancel'), 'cancel', actor, reason) $fn$;

CREATE FUNCTION {s}.set_knob(p_batch_id bigint, p_key text, p_value text, p_actor text, p_reason text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
	r record;
	v double precision;
	prev double precision;
BEGIN
	PERFORM {s}.control_args('set_knob ' || coalesce(p_key, ''), p_actor, p_reason);
	IF p_key IS NULL OR p_key !~ '^(concurrency|job_concurrency|rows_per_second|throttle\..+\.(high|low))$' THEN
		RAISE EXCEPTION 'backfill: set_knob: unknown knob % (value %): the knobs are concurrency, job_concurrency, rows_per_second, throttle.<signal>.high and throttle.<signal>.low',
			quote_nullable(p_key), quote_nullable(p_value) USING ERRCODE = '22023';
	END IF;
	SELECT batch_id, job_name, status INTO r FROM {s}.runs WHERE batch_id = p_batch_id FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'backfill: set_knob %: no run with batch id %', p_key, p_batch_id USING ERRCODE = 'P0002';
	END IF;
	IF r.status NOT IN ('running', 'failed', 'paused', 'cancelled') THEN
		RAISE EXCEPTION 'backfill: cannot set knob % of batch % of job %: it is %', p_key, p_batch_id, quote_literal(r.job_name), r.status
			USING ERRCODE = '55000';
	END IF;
	SELECT value INTO prev FROM {s}.knobs WHERE batch_id = p_batch_id AND key = p_key;
	IF lower(btrim(coalesce(p_value, ''))) = 'default' THEN
		-- Back to each process's Config.
		DELETE FROM {s}.knobs WHERE batch_id = p_batch_id AND key = p_key;
	ELSE
		BEGIN
			v := btrim(p_value)::double precision;
		EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range OR null_value_not_allowed THEN
			v := NULL;
		END;
		IF v IS NULL OR v IN ('NaN', 'Infinity', '-Infinity') THEN
			RAISE EXCEPTION 'backfill: set_knob: knob % value % is not a finite number (or default)', p_key, quote_nullable(p_value)
				USING ERRCODE = '22023';
		END IF;
		IF p_key IN ('concurrency', 'job_concurrency') AND (v <> trunc(v) OR v < 1 OR v > 100000) THEN
			RAISE EXCEPTION 'backfill: set_knob: knob % value % must be a whole number from 1 to 100000', p_key, quote_literal(p_value)
				USING ERRCODE = '22023';
		END IF;
		IF p_key = 'rows_per_second' AND (v < 0 OR v > 0 AND v < 1) THEN
			RAISE EXCEPTION 'backfill: set_knob: knob % value % must be 0 (no cap) or at least 1', p_key, quote_literal(p_value)
				USING ERRCODE = '22023';
		END IF;
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
CREATE FUNCTION {s}.set_knob(job text, key text, value text, actor text, reason text) RETURNS text LANGUAGE sql AS
	$fn$ SELECT {s}.set_knob({s}.control_run(job, 'set_knob'), key, value, actor, reason) $fn$;
