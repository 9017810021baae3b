-- Manifest migration 30: rehearsals. A rehearsal runs a sample of a
-- job's chunks through the chunk path in transactions it rolls back
-- (Runner.Rehearse), and records here, in a short transaction of its
-- own, what each chunk took and its projection of the full run. Nothing
-- of the rehearsed chunks persists; this row is its only trace. Status
-- compares a run with the latest rehearsal of its job's plan.
--
-- chunks is a JSON array of the rehearsed chunks (backfilltype
-- RehearsalChunk); forecast is the projection (RehearsalForecast); the
-- columns beside them repeat what a reader filters on.

CREATE TABLE {s}.rehearsals (
	id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	job_name         text NOT NULL,
	plan_fingerprint text NOT NULL,
	code_version     text NOT NULL,
	worker           text NOT NULL,
	created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
	chunks_total     int NOT NULL,
	concurrency      int NOT NULL,
	chunks           jsonb NOT NULL,
	forecast         jsonb NOT NULL
);
CREATE INDEX rehearsals_job ON {s}.rehearsals (job_name, plan_fingerprint, id);
COMMENT ON TABLE {s}.rehearsals IS
	'Rehearsals of a job (Runner.Rehearse): the sampled chunks, run in transactions that rolled back, with what each took (chunks), and the projection of the full run (forecast).';

-- The roles granted on chunks get the same privileges on rehearsals, as
-- in migration 27 (the identity column needs no sequence privilege).
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
		EXECUTE format('GRANT %s ON TABLE %s.rehearsals TO %s', g.privilege_type, quote_ident({schema}), g.role);
	END LOOP;
END
$do$;
