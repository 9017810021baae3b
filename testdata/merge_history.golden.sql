-- stage
pg_temp."backfill_stage_dbb50d90b2979430";

-- create
CREATE TEMP TABLE IF NOT EXISTS "backfill_stage_dbb50d90b2979430" ("valid_from" timestamp with time zone, "id" bigint, "name" text COLLATE pg_catalog."C", "amount" numeric(12,2), "doc" json, "pos" point, "Odd ""col""" text, "version" timestamp with time zone, _backfill_row bigint NOT NULL) ON COMMIT DELETE ROWS;

-- copyIn
COPY pg_temp."backfill_stage_dbb50d90b2979430" ("valid_from", "id", "name", "amount", "doc", "pos", "Odd ""col""", "version", _backfill_row) FROM STDIN;

-- dupCheck
SELECT EXISTS (SELECT 1 FROM pg_temp."backfill_stage_dbb50d90b2979430" GROUP BY "id", "valid_from" HAVING count(*) > 1);

-- dedup
DELETE FROM pg_temp."backfill_stage_dbb50d90b2979430" WHERE _backfill_row IN (
	SELECT _backfill_row FROM (
		SELECT s._backfill_row, row_number() OVER (PARTITION BY s."id", s."valid_from" ORDER BY _backfill_row DESC) AS rn FROM pg_temp."backfill_stage_dbb50d90b2979430" s) x
	WHERE x.rn > 1);

-- deleteRows
DELETE FROM pg_temp."backfill_stage_dbb50d90b2979430" WHERE _backfill_row = ANY ($1::bigint[]);

-- lockChanging
SELECT count(*) FROM (SELECT 1 FROM pg_temp."backfill_stage_dbb50d90b2979430" s JOIN "sales"."orders" t ON t."id" = s."id" AND t."valid_from" = s."valid_from" WHERE ROW((t."name" COLLATE "C"), (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version") IS DISTINCT FROM ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version") FOR UPDATE OF t) x;

-- update
UPDATE "sales"."orders" t SET "name" = s."name", "amount" = s."amount", "doc" = s."doc", "pos" = s."pos", "Odd ""col""" = s."Odd ""col""", "version" = s."version" FROM pg_temp."backfill_stage_dbb50d90b2979430" s WHERE t."id" = s."id" AND t."valid_from" = s."valid_from" AND ROW((t."name" COLLATE "C"), (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version") IS DISTINCT FROM ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version");

-- insert
INSERT INTO "sales"."orders" ("valid_from", "id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "valid_to")
SELECT u."valid_from", u."id", u."name", u."amount", u."doc", u."pos", u."Odd ""col""", u."version", u._backfill_next FROM (
	SELECT z.*, lead(z."valid_from") OVER (PARTITION BY z."id" ORDER BY z."valid_from") AS _backfill_next FROM (
		SELECT s."valid_from", s."id", s."name", s."amount", s."doc", s."pos", s."Odd ""col""", s."version", true AS _backfill_staged FROM pg_temp."backfill_stage_dbb50d90b2979430" s
		UNION ALL
		SELECT v."valid_from", v."id", v."name", v."amount", v."doc", v."pos", v."Odd ""col""", v."version", false FROM (SELECT t.* FROM (SELECT DISTINCT "id" FROM pg_temp."backfill_stage_dbb50d90b2979430") k CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."id" = k."id" OFFSET 0) t) v) z) u
WHERE u._backfill_staged AND NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."id" = u."id" AND t."valid_from" = u."valid_from" OFFSET 0);

-- closeIntervals
WITH _backfill_new AS MATERIALIZED (SELECT "id", "valid_from" FROM pg_temp."backfill_stage_dbb50d90b2979430" s WHERE NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."id" = s."id" AND t."valid_from" = s."valid_from" OFFSET 0)),
x AS (SELECT "id", "valid_from", lead("valid_from") OVER (PARTITION BY "id" ORDER BY "valid_from") AS _backfill_next_from FROM (
	SELECT "id", "valid_from" FROM _backfill_new UNION ALL SELECT "id", "valid_from" FROM (SELECT t.* FROM (SELECT DISTINCT "id" FROM pg_temp."backfill_stage_dbb50d90b2979430") k CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."id" = k."id" OFFSET 0) t) v WHERE EXISTS (SELECT FROM _backfill_new)) _backfill_z)
UPDATE "sales"."orders" t SET "valid_to" = x._backfill_next_from FROM x
WHERE t."id" = x."id" AND t."valid_from" = x."valid_from" AND t."valid_to" IS DISTINCT FROM x._backfill_next_from;

-- lockClosing
WITH _backfill_new AS MATERIALIZED (SELECT "id", "valid_from" FROM pg_temp."backfill_stage_dbb50d90b2979430" s WHERE NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."id" = s."id" AND t."valid_from" = s."valid_from" OFFSET 0)),
x AS (SELECT "id", "valid_from", lead("valid_from") OVER (PARTITION BY "id" ORDER BY "valid_from") AS _backfill_next_from FROM (
	SELECT "id", "valid_from" FROM _backfill_new UNION ALL SELECT "id", "valid_from" FROM (SELECT t.* FROM (SELECT DISTINCT "id" FROM pg_temp."backfill_stage_dbb50d90b2979430") k CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."id" = k."id" OFFSET 0) t) v WHERE EXISTS (SELECT FROM _backfill_new)) _backfill_z)
SELECT count(*) FROM (SELECT 1 FROM "sales"."orders" t JOIN x ON t."id" = x."id" AND t."valid_from" = x."valid_from"
	WHERE t."valid_to" IS DISTINCT FROM x._backfill_next_from FOR UPDATE OF t) _backfill_l;

-- checkIntervals
SELECT DISTINCT "id" FROM (
	SELECT "id", "valid_from", "valid_to", lead("valid_from") OVER (PARTITION BY "id" ORDER BY "valid_from") AS _backfill_next_from
	FROM (SELECT t.* FROM (SELECT DISTINCT "id" FROM pg_temp."backfill_stage_dbb50d90b2979430") k CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."id" = k."id" OFFSET 0) t) v) x
WHERE "valid_to" IS DISTINCT FROM _backfill_next_from OR "valid_to" <= "valid_from" LIMIT 5;
