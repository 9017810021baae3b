-- Manifest migration 25: record_event, which a loader executes, caps its
-- text arguments as the control functions do (control_cap, migration 23):
-- the actor and the kind at 200 characters, the job name at 1000 and the
-- detail at 65536 characters of its jsonb text; a longer one is refused
-- with SQLSTATE 22023 naming the argument, its length and the cap, and
-- nothing is recorded. The library fits its own actors and details
-- within the caps before the call. The rest of the function is migration
-- 23's; CREATE OR REPLACE keeps its owner and its grants (EXECUTE to the
-- loaders, none to PUBLIC), and it still runs as the owner with a pinned
-- search path.

CREATE OR REPLACE FUNCTION {s}.record_event(p_batch_id bigint, p_job text, p_kind text, p_actor text, p_detail jsonb) RETURNS bigint
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	v_id bigint;
BEGIN
	PERFORM {s}.control_cap('record_event', 'actor', p_actor, 200);
	PERFORM {s}.control_cap('record_event', 'job name', p_job, 1000);
	PERFORM {s}.control_cap('record_event', 'kind', p_kind, 200);
	PERFORM {s}.control_cap('record_event', 'detail', p_detail::text, 65536);
	IF p_kind IN ('run_resumed_by_operator', 'run_cancelled', 'knob_set') THEN
		RAISE EXCEPTION 'backfill: record_event: event kind % of batch % is recorded only by the control functions (resume, cancel, set_knob), which an operator role runs',
			p_kind, p_batch_id USING ERRCODE = '42501';
	END IF;
	INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail)
		VALUES (p_batch_id, p_job, p_kind, coalesce(p_actor, ''), coalesce(p_detail, '{}'))
		RETURNING id INTO v_id;
	RETURN v_id;
END
$fn$;
