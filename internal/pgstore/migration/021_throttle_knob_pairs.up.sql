-- Manifest migration 21: the throttles' configured watermarks each worker
-- runs with (throttle_config, written when the worker registers), and a
-- set_knob that refuses a throttle watermark knob leaving a throttle's low
-- watermark above its high one (or both zero), which the workers would
-- ignore: against the other knob of the pair, and against the configured
-- watermarks every worker of the run recorded for that signal. The unused
-- job_slots table goes (Config.JobConcurrency counts live leases).

DROP TABLE IF EXISTS {s}.job_slots;

CREATE TABLE {s}.throttle_config (
	worker_key text NOT NULL REFERENCES {s}.workers ON DELETE CASCADE,
	signal     text NOT NULL,
	high       double precision NOT NULL,
	low        double precision NOT NULL,
	PRIMARY KEY (worker_key, signal, high, low)
);
COMMENT ON TABLE {s}.throttle_config IS
	'The High and Low of each throttle (Config.Throttles) of each worker, by signal: set_knob checks a throttle.<signal>.high or .low knob against them.';

CREATE OR REPLACE FUNCTION {s}.set_knob(p_batch_id bigint, p_key text, p_value text, p_actor text, p_reason text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
	r record;
	c record;
	v double precision;
	prev double precision;
	v_signal text;
	v_high_key text;
	v_low_key text;
	v_high_knob double precision;
	v_low_knob double precision;
	hi double precision;
	lo double precision;
	hi_src text;
	lo_src text;
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
		IF p_key IN ('concurrency', 'job_concurrency') AND (v <> trunc(v) OR v < 1 OR v > 100000) THEN
			RAISE EXCEPTION 'backfill: set_knob: knob % value % must be a whole number from 1 to 100000', p_key, quote_literal(p_value)
				USING ERRCODE = '22023';
		END IF;
		IF p_key = 'rows_per_second' AND (v < 0 OR v > 0 AND v < 1) THEN
			RAISE EXCEPTION 'backfill: set_knob: knob % value % must be 0 (no cap) or at least 1', p_key, quote_literal(p_value)
				USING ERRCODE = '22023';
		END IF;
	END IF;
	IF p_key ~ '^throttle\..+\.(high|low)$' THEN
		-- The pair the workers would apply after this change (v NULL: the
		-- knob dropped, back to the configured value), with the other knob
		-- of the pair when set and each configured pair the run's workers
		-- recorded for the signal (one pseudo-row with none: the knobs
		-- alone), must have Low <= High and not both zero, as the workers
		-- check (a knob of 0 for Low, like Low 0 in the Config, means
		-- High).
		v_signal := substring(p_key FROM '^throttle\.(.+)\.(?:high|low)$');
		v_high_key := 'throttle.' || v_signal || '.high';
		v_low_key := 'throttle.' || v_signal || '.low';
		IF p_key = v_high_key THEN
			v_high_knob := v;
			SELECT value INTO v_low_knob FROM {s}.knobs WHERE batch_id = p_batch_id AND key = v_low_key;
		ELSE
			v_low_knob := v;
			SELECT value INTO v_high_knob FROM {s}.knobs WHERE batch_id = p_batch_id AND key = v_high_key;
		END IF;
		FOR c IN
			SELECT NULL::double precision AS high, NULL::double precision AS low, NULL::text AS worker
			UNION ALL
			(SELECT DISTINCT ON (t.high, t.low) t.high, t.low, w.worker_id
				FROM {s}.throttle_config t JOIN {s}.workers w ON w.worker_key = t.worker_key
				WHERE w.batch_id = p_batch_id AND t.signal = v_signal ORDER BY t.high, t.low, w.started_at DESC)
		LOOP
			hi := coalesce(v_high_knob, c.high);
			lo := coalesce(v_low_knob, c.low);
			CONTINUE WHEN hi IS NULL OR lo IS NULL;
			hi_src := format('%s %s (%s)', v_high_key, hi, CASE WHEN v_high_knob IS NULL THEN format('the High configured by worker %s', quote_literal(c.worker))
				WHEN p_key = v_high_key THEN 'this knob' ELSE 'its knob' END);
			lo_src := format('%s %s (%s)', v_low_key, lo, CASE WHEN v_low_knob IS NULL THEN format('the Low configured by worker %s', quote_literal(c.worker))
				WHEN p_key = v_low_key THEN 'this knob' ELSE 'its knob' END);
			IF lo > hi THEN
				RAISE EXCEPTION 'backfill: set_knob: knob % value % refused: % would be above % (a throttle''s low watermark must not exceed its high one; the workers would ignore both); set both knobs so that low <= high, the one that makes room first',
					p_key, quote_nullable(p_value), lo_src, hi_src USING ERRCODE = '22023';
			END IF;
			IF hi = 0 AND lo = 0 THEN
				RAISE EXCEPTION 'backfill: set_knob: knob % value % refused: % and % would both be zero (a throttle needs a high watermark; the workers would ignore both)',
					p_key, quote_nullable(p_value), hi_src, lo_src USING ERRCODE = '22023';
			END IF;
		END LOOP;
	END IF;
	IF v IS NULL THEN
		-- Back to each process's Config.
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
