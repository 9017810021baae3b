-- Manifest migration 32: approvals bound to the plan's fingerprint.
--
-- A run whose plan has an approval policy (runs.plan->'approval':
-- {"approvers": n, "author_may_approve": bool}) is created with status
-- awaiting_approval: the lease claims only running runs, so no chunk is
-- leased and nothing is written until approve() has recorded n approvals
-- of the run's plan_fingerprint by n distinct approvers (distinct names
-- and distinct database roles), which sets it running. Each approval is
-- an event of kind approval_recorded in the append-only audit log
-- (actor: the approver's name; db_role: the session's role, set by the
-- trigger of migration 23); approve() runs as the owner, an operator
-- role executes it (ControlFunctions), and record_event refuses the
-- kind, so a loader cannot record one. A refused approval (a stale
-- fingerprint, the author under a policy that forbids it, the same
-- approver twice, a run that does not await approval) raises an error
-- and records nothing.

ALTER TABLE {s}.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE {s}.runs ADD CONSTRAINT runs_status_check
	CHECK (status IN ('running', 'completed', 'failed', 'abandoned', 'paused', 'rolled_back', 'cancelled', 'awaiting_approval'));

-- One unfinished run per job, a run awaiting approval included.
DROP INDEX {s}.runs_one_active_per_job;
CREATE UNIQUE INDEX runs_one_active_per_job ON {s}.runs (job_name) WHERE status IN ('running', 'failed', 'paused', 'awaiting_approval');

CREATE INDEX events_approvals ON {s}.events (batch_id, id) WHERE kind = 'approval_recorded';

CREATE FUNCTION {s}.approve(p_batch_id bigint, p_fingerprint text, p_approver text, p_reason text) RETURNS text
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	r record;
	v_required int;
	v_author_may boolean;
	v_author text;
	v_author_role text;
	v_prior record;
	v_count int;
	v_next text;
BEGIN
	PERFORM {s}.control_args('approve', p_approver, p_reason);
	PERFORM {s}.control_cap('approve', 'fingerprint', p_fingerprint, 200);
	SELECT batch_id, job_name, status, plan_fingerprint, plan->'approval' AS policy INTO r
		FROM {s}.runs WHERE batch_id = p_batch_id FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'backfill: approve: no run with batch id %', p_batch_id USING ERRCODE = 'P0002';
	END IF;
	IF r.status <> 'awaiting_approval' THEN
		RAISE EXCEPTION 'backfill: cannot approve batch % of job %: it is %, not awaiting_approval (its plan has no approval policy, or it was approved already)',
			p_batch_id, quote_literal(r.job_name), r.status USING ERRCODE = '55000';
	END IF;
	IF p_fingerprint IS NULL OR p_fingerprint <> r.plan_fingerprint THEN
		RAISE EXCEPTION 'backfill: approval of batch % of job % refused: stale fingerprint %: the run''s plan has fingerprint %; review its blueprint (backfill plan --batch %) and approve that one',
			p_batch_id, quote_literal(r.job_name), quote_nullable(p_fingerprint), r.plan_fingerprint, p_batch_id USING ERRCODE = 'BFA01';
	END IF;
	v_required := greatest(coalesce((r.policy->>'approvers')::int, 1), 1);
	v_author_may := coalesce((r.policy->>'author_may_approve')::boolean, false);
	SELECT e.actor, coalesce(e.db_role, '') INTO v_author, v_author_role FROM {s}.events e
		WHERE e.batch_id = p_batch_id AND e.kind = 'run_started' ORDER BY e.id LIMIT 1;
	IF NOT v_author_may AND (p_approver = v_author OR session_user::text = v_author_role) THEN
		RAISE EXCEPTION 'backfill: approval of batch % of job % refused: % (role %) is its author by % (started by % as role %), and its policy forbids the author to approve',
			p_batch_id, quote_literal(r.job_name), quote_literal(p_approver), session_user,
			CASE WHEN p_approver = v_author THEN 'name' ELSE 'database role' END,
			quote_literal(v_author), v_author_role USING ERRCODE = 'BFA02';
	END IF;
	SELECT e.actor, e.db_role, e.created_at INTO v_prior FROM {s}.events e
		WHERE e.batch_id = p_batch_id AND e.kind = 'approval_recorded'
			AND (e.actor = p_approver OR e.db_role = session_user::text) ORDER BY e.id LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'backfill: approval of batch % of job % refused: the same approver twice: % (role %) approved it at % already; % (role %) cannot approve again: an approval needs another name and another role',
			p_batch_id, quote_literal(r.job_name), quote_literal(v_prior.actor), v_prior.db_role, v_prior.created_at,
			quote_literal(p_approver), session_user USING ERRCODE = 'BFA03';
	END IF;
	SELECT count(*) + 1 INTO v_count FROM {s}.events e WHERE e.batch_id = p_batch_id AND e.kind = 'approval_recorded';
	v_next := CASE WHEN v_count >= v_required THEN 'running' ELSE 'awaiting_approval' END;
	IF v_next = 'running' THEN
		UPDATE {s}.runs SET status = 'running', updated_at = now(), last_error = '' WHERE batch_id = p_batch_id;
	END IF;
	INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail) VALUES (p_batch_id, r.job_name, 'approval_recorded', p_approver,
		jsonb_build_object('why', p_reason, 'fingerprint', p_fingerprint, 'approvals', v_count, 'required', v_required,
			'from', r.status, 'to', v_next));
	PERFORM pg_notify({schema}, json_build_object('batch_id', p_batch_id, 'action', 'approve', 'job', left(r.job_name, 200))::text);
	RETURN v_next;
END
$fn$;
REVOKE EXECUTE ON FUNCTION {s}.approve(bigint, text, text, text) FROM PUBLIC;

-- The operators (roles that may pause) may approve.
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
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s.approve(bigint, text, text, text) TO %s', quote_ident({schema}), g.role);
	END LOOP;
END
$do$;

-- record_event (a loader's) refuses the kinds only approve() records too;
-- the rest is migration 25's.
CREATE OR REPLACE FUNCTION {s}.record_event(p_batch_id bigint, p_job text, p_kind text, p_actor text, p_detail jsonb) RETURNS bigint
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
	v_id bigint;
BEGIN
	PERFORM {s}.control_cap('record_event', 'actor', p_actor, 200);
	PERFORM {s}.control_cap('record_event', 'job name', p_job, 1000);
	PERFORM {s}.control_cap('record_event', 'kind', p_kind, 200);
	PERFORM {s}.control_cap('record_event', 'detail', p_detail::text, 65536);
	IF p_kind IN ('run_resumed_by_operator', 'run_cancelled', 'knob_set', 'approval_recorded') THEN
		RAISE EXCEPTION 'backfill: record_event: event kind % of batch % is recorded only by the control functions (resume, cancel, set_knob, approve), which an operator role runs',
			p_kind, p_batch_id USING ERRCODE = '42501';
	END IF;
	INSERT INTO {s}.events (batch_id, job_name, kind, actor, detail)
		VALUES (p_batch_id, p_job, p_kind, coalesce(p_actor, ''), coalesce(p_detail, '{}'))
		RETURNING id INTO v_id;
	RETURN v_id;
END
$fn$;
