-- Manifest migration 23: three roles. The owner (the migrating role) owns
-- the manifest and the control functions, which now run as it (SECURITY
-- DEFINER, search_path pinned); their EXECUTE is revoked from PUBLIC and
-- given to operator roles (backfill migrate --grant-operator). Loaders
-- (the runtime role, Manifest.Grants) no longer write the audit log nor
-- schema_migrations: they append events through record_event, which
-- refuses the kinds only the control functions record, and pause or
-- cancel on a signal through library_control (actor "backfill"). Every
-- event records the session's role (db_role, set by a trigger whatever
-- the path). The control functions cap their text arguments. Roles that
-- held INSERT on events (loaders granted before this version) get
-- EXECUTE on record_event and library_control, and every non-owner's
-- INSERT, UPDATE, DELETE and TRUNCATE on events and schema_migrations is
-- revoked, as a fresh install granted with Manifest.Grants has them.

ALTER TABLE {s}.events ADD COLUMN db_role text;
COMMENT ON COLUMN {s}.events.db_role IS
	'The session''s role (session_user) that recorded the event, set by a trigger; NULL for the events recorded before manifest version 23.';

CREATE FUNCTION {s}.events_db_role() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
	NEW.db_role := session_user;
	RETURN NEW;
END
$fn$;
CREATE TRIGGER events_db_role BEFORE INSERT ON {s}.events
	FOR EACH ROW EXECUTE FUNCTION {s}.events_db_role();

-- The caps of the control functions' text arguments, in characters.
CREATE FUNCTION {s}.control_cap(p_action text, p_what text, p_value text, p_max int) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
	IF char_length(p_value) > p_max THEN
		RAISE EXCEPTION 'backfill: %: the % is % characters long; at most % are accepted (shorten it)',
			left(p_action, 200), p_what, char_length(p_value), p_max USING ERRCODE = '22023';
	END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION {s}.control_args(p_action text, p_actor text, p_reason text) RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
	PERFORM {s}.control_cap(p_action, 'actor', p_actor, 200);
	PERFORM {s}.control_cap(p_action, 'reason', p_reason, 2000);
	IF p_actor IS NULL OR btrim(p_actor) = '' THEN
		RAISE EXCEPTION 'backfill: %: an actor is required (who decides)', p_action USING ERRCODE = '22023';
	END IF;
	IF p_reason IS NULL OR btrim(p_reason) = '' THEN
		RAISE EXCEPTION 'backfill: %: a reason is required (why)', p_action USING ERRCODE = '22023';
	END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION {s}.control_run(p_job text, p_action text) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
	id bigint;
BEGIN
	PERFORM {s}.control_cap(p_action, 'job name', p_job, 1000);
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

-- set_knob by batch id: the caps of the key and value, then the checks
-- and the change of set_knob_apply (migration 21's set_knob).
ALTER FUNCTION {s}.set_knob(bigint, text, text, text, text) RENAME TO set_knob_apply;
CREATE FUNCTION {s}.set_knob(p_batch_id bigint, p_key text, p_value text, p_actor text, p_reason text) RETURNS text LANGUAGE plpgsql AS $fn$
BEGIN
	PERFORM {s}.control_cap('set_knob', 'knob name', p_key, 200);
	PERFORM {s}.control_cap('set_knob ' || p_key, 'knob value', p_value, 100);
	RETURN {s}.set_knob_apply(p_batch_id, p_key, p_value, p_actor, p_reason);
END
$fn$;

-- The library's own pause and cancel (PauseOnSignal), as a loader: actor
-- "backfill", the session's role in db_role.
CREATE FUNCTION {s}.library_control(p_batch_id bigint, p_action text, p_reason text) RETURNS text LANGUAGE plpgsql AS $fn$
BEGIN
	IF p_action IS NULL OR p_action NOT IN ('pause', 'cancel') THEN
		RAISE EXCEPTION 'backfill: library_control: action % refused: the library pauses or cancels; an operator resumes (resume)',
			quote_nullable(left(p_action, 200)) USING ERRCODE = '22023';
	END IF;
	RETURN {s}.control(p_batch_id, p_action, 'backfill', p_reason);
END
$fn$;

-- The library's events, as a loader. The kinds the control functions
-- record are theirs alone.
CREATE FUNCTION {s}.record_event(p_batch_id bigint, p_job text, p_kind text, p_actor text, p_detail jsonb) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
	v_id bigint;
BEGIN
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

-- Every control function runs as the manifest's owner, with a search path
-- no caller can shadow (every reference is schema-qualified).
ALTER FUNCTION {s}.control_run(text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.control_args(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.control(bigint, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.set_knob_apply(bigint, text, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.set_knob(bigint, text, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.set_knob(text, text, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.pause(bigint, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.resume(bigint, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.cancel(bigint, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.pause(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.resume(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.cancel(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.library_control(bigint, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {s}.record_event(bigint, text, text, text, jsonb) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE EXECUTE ON FUNCTION {s}.control_cap(text, text, text, int), {s}.control_run(text, text),
	{s}.control_args(text, text, text), {s}.control(bigint, text, text, text),
	{s}.set_knob_apply(bigint, text, text, text, text), {s}.set_knob(bigint, text, text, text, text),
	{s}.set_knob(text, text, text, text, text), {s}.pause(bigint, text, text), {s}.resume(bigint, text, text),
	{s}.cancel(bigint, text, text), {s}.pause(text, text, text), {s}.resume(text, text, text),
	{s}.cancel(text, text, text), {s}.library_control(bigint, text, text),
	{s}.record_event(bigint, text, text, text, jsonb), {s}.events_append_only(), {s}.events_db_role() FROM PUBLIC;

-- Existing installs: the loaders granted before this version (INSERT on
-- events) get the functions they now append through; nobody but the
-- owner writes events or schema_migrations directly.
DO $do$
DECLARE
	g record;
BEGIN
	FOR g IN
		SELECT DISTINCT a.grantee::regrole::text AS role
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a
		WHERE n.nspname = {schema} AND c.relname = 'events' AND a.privilege_type = 'INSERT'
			AND a.grantee <> c.relowner AND a.grantee <> 0
	LOOP
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s.record_event(bigint, text, text, text, jsonb), %s.library_control(bigint, text, text) TO %s',
			quote_ident({schema}), quote_ident({schema}), g.role);
	END LOOP;
	FOR g IN
		SELECT DISTINCT c.relname, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS role
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a
		WHERE n.nspname = {schema} AND c.relname IN ('events', 'schema_migrations')
			AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE') AND a.grantee <> c.relowner
	LOOP
		EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON TABLE %s.%I FROM %s', quote_ident({schema}), g.relname, g.role);
	END LOOP;
END
$do$;
