-- The roles of the Kubernetes example, created once by an administrator (a
-- superuser, or a role with CREATEROLE that may grant these) in the
-- application's database, before the migrate Job. None of them is a
-- superuser. Store each LOGIN role's credentials in its Secret
-- (manifests/00-secrets.example.yaml). The example's test runs this file.

-- The owner: runs the migrate Job (the target's DDL, backfill migrate).
CREATE ROLE backfill_owner LOGIN PASSWORD 'change-me';
GRANT CREATE ON DATABASE app TO backfill_owner;  -- CREATE SCHEMA backfill
GRANT CREATE ON SCHEMA public TO backfill_owner; -- the demo's target table

-- The loader: what every worker pod logs in as. DML only; the migrate Job
-- grants it the manifest's privileges and the target's. All pods share
-- it, so a pod may end a frozen pod's backend (fencing) without
-- pg_signal_backend.
CREATE ROLE backfill_loader LOGIN PASSWORD 'change-me';
GRANT TEMPORARY ON DATABASE app TO backfill_loader; -- staging tables

-- The operator: pause, resume, cancel, set knobs, read everything; no
-- login. People (here the on-call rota) are its members. The migrate Job
-- grants it the control functions (--grant-operator).
CREATE ROLE backfill_operator NOLOGIN;
-- So that backfill status shows which sessions the loader's chunks wait
-- for (PostgreSQL hides other roles' waits otherwise).
GRANT pg_read_all_stats TO backfill_operator;
CREATE ROLE oncall LOGIN PASSWORD 'change-me' IN ROLE backfill_operator;
