-- Manifest migration 24: a resume accepts the rejects so far. The
-- control function records, in the detail of a resume's
-- run_resumed_by_operator event, the run's rows read and rejected at the
-- resume (its done and open chunks, as the run reject gate sums them):
-- the run reject gate (backfill.Job.MaxRunRejectRate) and the "no row
-- loaded" pause then judge only the rows read after the resume, whether
-- the run was resumed from SQL, the CLI or the library. The rest of the
-- function is migration 16's, run as the owner (migration 23).

CREATE OR REPLACE FUNCTION {s}.control(p_batch_id bigint, p_action text, p_actor text, p_reason text) RETURNS text
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	r record;
	v_next text;
	allowed text[];
	v_kind text;
	v_detail jsonb;
	v_read bigint;
	v_rejected bigint;
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
	ELSE
		-- The rows the resume accepts: the run's totals now.
		SELECT coalesce(sum(rows_read), 0)::int8, coalesce(sum(rows_rejected), 0)::int8 INTO v_read, v_rejected
			FROM {s}.chunks WHERE batch_id = p_batch_id AND status IN ('done', 'open');
		v_detail := v_detail || jsonb_build_object('read', v_read, 'rejected', v_rejected);
	END IF;
	INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail) VALUES (p_batch_id, r.job_name, v_kind, p_actor, v_detail);
	-- The job name is cut: a notification's payload is under 8000 bytes.
	PERFORM pg_notify({schema}, json_build_object('batch_id', p_batch_id, 'action', p_action, 'job', left(r.job_name, 200))::text);
	RETURN v_next;
END
$fn$;
