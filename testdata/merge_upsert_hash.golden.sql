-- stage
pg_temp."backfill_stage_b860c350e681ea2d";

-- create
CREATE TEMP TABLE IF NOT EXISTS "backfill_stage_b860c350e681ea2d" ("id" bigint, "name" text COLLATE pg_catalog."C", "amount" numeric(12,2), "doc" json, "pos" point, "Odd ""col""" text, "version" timestamp with time zone, "row_hash" bytea, _backfill_row bigint NOT NULL) ON COMMIT DELETE ROWS;

-- copyIn
COPY pg_temp."backfill_stage_b860c350e681ea2d" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", _backfill_row) FROM STDIN;

-- dupCheck
SELECT EXISTS (SELECT 1 FROM pg_temp."backfill_stage_b860c350e681ea2d" GROUP BY "id" HAVING count(*) > 1);

-- dedup
DELETE FROM pg_temp."backfill_stage_b860c350e681ea2d" WHERE _backfill_row IN (
	SELECT _backfill_row FROM (
		SELECT s._backfill_row, row_number() OVER (PARTITION BY s."id" ORDER BY _backfill_row DESC) AS rn FROM pg_temp."backfill_stage_b860c350e681ea2d" s) x
	WHERE x.rn > 1);

-- deleteRows
DELETE FROM pg_temp."backfill_stage_b860c350e681ea2d" WHERE _backfill_row = ANY ($1::bigint[]);

-- upsert
WITH j AS MATERIALIZED (
	SELECT s.*, t."id" IS NOT NULL AS _backfill_found, coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")), false) AS _backfill_apply
	FROM pg_temp."backfill_stage_b860c350e681ea2d" s LEFT JOIN "sales"."orders" t ON t."id" = s."id"),
u AS (UPDATE "sales"."orders" t SET "name" = j."name", "amount" = j."amount", "doc" = j."doc", "pos" = j."pos", "Odd ""col""" = j."Odd ""col""", "version" = j."version", "row_hash" = j."row_hash" FROM j WHERE j._backfill_apply AND t."id" = j."id" RETURNING 1),
i AS (INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash") SELECT j."id", j."name", j."amount", j."doc", j."pos", j."Odd ""col""", j."version", j."row_hash" FROM j WHERE NOT j._backfill_found RETURNING 1)
SELECT (SELECT count(*) FROM j WHERE j._backfill_found AND NOT j._backfill_apply) AS unchanged,
	(SELECT count(*) FROM u) AS updated, (SELECT count(*) FROM i) AS inserted;

-- insertAll
INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash") SELECT "id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash" FROM pg_temp."backfill_stage_b860c350e681ea2d";

-- replayCheck
SELECT count(*) FILTER (WHERE t."id" IS NULL) AS inserted,
	count(*) FILTER (WHERE coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")), false)) AS updated,
	count(*) FILTER (WHERE t."id" IS NOT NULL AND NOT coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")), false)) AS unchanged
FROM pg_temp."backfill_stage_b860c350e681ea2d" s LEFT JOIN "sales"."orders" t ON t."id" = s."id";

-- lockChanging
SELECT FROM pg_temp."backfill_stage_b860c350e681ea2d" s LEFT JOIN "sales"."orders" t ON t."id" = s."id"
HAVING sum(CASE WHEN coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")), false)
		THEN 1 + (SELECT count(*) FROM (SELECT 1 FROM "sales"."orders" t WHERE t."id" = s."id" AND t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")) FOR UPDATE OF t) x) ELSE 0 END) > 0
	OR count(*) FILTER (WHERE t."id" IS NULL) > 0 OR count(*) <>;

-- insert
INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash") SELECT s."id", s."name", s."amount", s."doc", s."pos", s."Odd ""col""", s."version", s."row_hash" FROM pg_temp."backfill_stage_b860c350e681ea2d" s WHERE NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."id" = s."id" OFFSET 0);
