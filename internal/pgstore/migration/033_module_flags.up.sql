-- Manifest migration 33: module flags of graphs of modules.
--
-- A graph's run (a run named after the graph, with no chunks) carries
-- the graph's plan: runs.plan->'modules', each module with its jobs,
-- dependencies, priority, class and flag ("enabled"). A module's flag is
-- switched by set_module_flag, which records it in the audit log of the
-- graph's latest run (kind module_flag_set: actor, db_role, the old and
-- new value, why); the latest switch of a module wins over the flag the
-- code gives: the next plan of the graph reads it. The
-- flag is part of the graph's fingerprint, so a switch is a plan change:
-- an unfinished run of the graph (awaiting approval, running, paused or
-- failed) is abandoned with it (its approvals cannot complete; the next
-- run has the new fingerprint and needs its own). The jobs' own runs are
-- left as they are. set_module_flag takes the graph's name's advisory
-- lock (the one StartRun takes), so a switch and the start of a run of
-- the graph are serialised. It runs as the owner; operator roles execute
-- it (ControlFunctions); record_event refuses the kind.

-- The flags switched are read from the audit log itself (the latest
-- module_flag_set event of each module of the graph): append-only, and
-- written only by set_module_flag.
CREATE INDEX events_module_flags ON {s}.events (job_name, id) WHERE kind = 'module_flag_set';

CREATE FUNCTION {s}.set_module_flag(p_graph text, p_module text, p_enabled boolean, p_actor text, p_reason text) RETURNS text
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	r record;
	v_plan_flag boolean;
	v_old boolean;
	v_abandoned bigint;
BEGIN
	PERFORM {s}.control_args('set_module_flag', p_actor, p_reason);
	PERFORM {s}.control_cap('set_module_flag', 'graph name', p_graph, 1000);
	PERFORM {s}.control_cap('set_module_flag', 'module name', p_module, 200);
	IF p_enabled IS NULL THEN
		RAISE EXCEPTION 'backfill: set_module_flag: the flag is required (true: enabled, false: disabled)' USING ERRCODE = '22023';
	END IF;
	PERFORM pg_advisory_xact_lock(hashtextextended('backfill.job:' || p_graph, 0));
	SELECT batch_id, job_name, status, plan INTO r FROM {s}.runs
		WHERE job_name = p_graph AND plan ? 'modules' ORDER BY batch_id DESC LIMIT 1 FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'backfill: set_module_flag: graph % has no run (run it, or print its blueprint, first)', quote_literal(p_graph) USING ERRCODE = 'P0002';
	END IF;
	SELECT (m->>'enabled')::boolean INTO v_plan_flag FROM jsonb_array_elements(r.plan->'modules') m WHERE m->>'name' = p_module;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'backfill: set_module_flag: graph % has no module % (its modules: %)', quote_literal(p_graph), quote_literal(p_module),
			(SELECT string_agg(m->>'name', ', ') FROM jsonb_array_elements(r.plan->'modules') m) USING ERRCODE = 'P0002';
	END IF;
	SELECT (e.detail->>'new')::boolean INTO v_old FROM {s}.events e
		WHERE e.job_name = p_graph AND e.kind = 'module_flag_set' AND e.detail->>'module' = p_module ORDER BY e.id DESC LIMIT 1;
	IF NOT FOUND THEN
		v_old := v_plan_flag;
	END IF;
	IF v_old = p_enabled THEN
		RETURN 'unchanged';
	END IF;
	IF r.status IN ('awaiting_approval', 'running', 'paused', 'failed') THEN
		UPDATE {s}.runs SET status = 'abandoned', updated_at = now(),
			last_error = format('plan changed: module %s %s by %s', p_module, CASE WHEN p_enabled THEN 'enabled' ELSE 'disabled' END, p_actor)
			WHERE batch_id = r.batch_id;
		INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail) VALUES (r.batch_id, r.job_name, 'run_abandoned', p_actor,
			jsonb_build_object('why', format('plan changed: module %s %s', p_module, CASE WHEN p_enabled THEN 'enabled' ELSE 'disabled' END), 'from', r.status, 'to', 'abandoned'));
		v_abandoned := r.batch_id;
	END IF;
	INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail) VALUES (r.batch_id, r.job_name, 'module_flag_set', p_actor,
		jsonb_build_object('graph', p_graph, 'module', p_module, 'old', v_old, 'new', p_enabled, 'why', p_reason, 'abandoned', v_abandoned));
	PERFORM pg_notify({schema}, json_build_object('batch_id', r.batch_id, 'action', 'set_module_flag', 'job', left(r.job_name, 200))::text);
	RETURN CASE WHEN p_enabled THEN 'enabled' ELSE 'disabled' END;
END
$fn$;
REVOKE EXECUTE ON FUNCTION {s}.set_module_flag(text, text, boolean, text, text) FROM PUBLIC;

-- The operators (roles that may pause) may switch flags.
DO $do$
DECLARE
	g record;
BEGIN
	FOR g IN
		SELECT DISTINCT a.grantee::regrole::text AS role
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace, aclexplode(p.proacl) a
		WHERE n.nspname = {schema} AND p.proname = 'pause' AND a.privilege_type = 'EXECUTE'
			AND a.grantee <> p.proowner AND a.grantee <> 0
	LOOP
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s.set_module_flag(text, text, boolean, text, text) TO %s', quote_ident({schema}), g.role);
	END LOOP;
END
$do$;

-- record_event (a loader's) refuses the kinds only the control
-- functions record, module_flag_set included; the rest is migration 32's.
CREATE OR REPLACE FUNCTION {s}.record_event(p_batch_id bigint, p_job text, p_kind text, p_actor text, p_detail jsonb) RETURNS bigint
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	v_id bigint;
BEGIN
	PERFORM {s}.control_cap('record_event', 'actor', p_actor, 200);
	PERFORM {s}.control_cap('record_event', 'job name', p_job, 1000);
	PERFORM {s}.control_cap('record_event', 'kind', p_kind, 200);
	PERFORM {s}.control_cap('record_event', 'detail', p_detail::text, 65536);
	IF p_kind IN ('run_resumed_by_operator', 'run_cancelled', 'knob_set', 'approval_recorded', 'module_flag_set') THEN
		RAISE EXCEPTION 'backfill: record_event: event kind % of batch % is recorded only by the control functions (resume, cancel, set_knob, approve, set_module_flag), which an operator role runs',
			p_kind, p_batch_id USING ERRCODE = '42501';
	END IF;
	INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail)
		VALUES (p_batch_id, p_job, p_kind, coalesce(p_actor, ''), coalesce(p_detail, '{}'))
		RETURNING id INTO v_id;
	RETURN v_id;
END
$fn$;
