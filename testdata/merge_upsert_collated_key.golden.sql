-- stage
pg_temp."backfill_stage_d62ffa9c297ef90e";

-- create
CREATE TEMP TABLE IF NOT EXISTS "backfill_stage_d62ffa9c297ef90e" ("id" bigint, "name" text COLLATE pg_catalog."C", "amount" numeric(12,2), "doc" json, "pos" point, "Odd ""col""" text, "version" timestamp with time zone, _backfill_row bigint NOT NULL) ON COMMIT DELETE ROWS;

-- copyIn
COPY pg_temp."backfill_stage_d62ffa9c297ef90e" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", _backfill_row) FROM STDIN;

-- dupCheck
SELECT EXISTS (SELECT 1 FROM pg_temp."backfill_stage_d62ffa9c297ef90e" GROUP BY "name" HAVING count(*) > 1);

-- dedup
DELETE FROM pg_temp."backfill_stage_d62ffa9c297ef90e" WHERE _backfill_row IN (
	SELECT _backfill_row FROM (
		SELECT s._backfill_row, row_number() OVER (PARTITION BY s."name" ORDER BY _backfill_row DESC) AS rn FROM pg_temp."backfill_stage_d62ffa9c297ef90e" s) x
	WHERE x.rn > 1);

-- deleteRows
DELETE FROM pg_temp."backfill_stage_d62ffa9c297ef90e" WHERE _backfill_row = ANY ($1::bigint[]);

-- upsert
WITH j AS MATERIALIZED (
	SELECT s.*, t."name" IS NOT NULL AS _backfill_found, coalesce(t."name" IS NOT NULL AND ROW(t."id", (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version") IS DISTINCT FROM ROW(s."id", (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version"), false) AS _backfill_apply
	FROM pg_temp."backfill_stage_d62ffa9c297ef90e" s LEFT JOIN "sales"."orders" t ON t."name" = s."name"),
u AS (UPDATE "sales"."orders" t SET "id" = j."id", "amount" = j."amount", "doc" = j."doc", "pos" = j."pos", "Odd ""col""" = j."Odd ""col""", "version" = j."version" FROM j WHERE j._backfill_apply AND t."name" = j."name" RETURNING 1),
i AS (INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version") SELECT j."id", j."name", j."amount", j."doc", j."pos", j."Odd ""col""", j."version" FROM j WHERE NOT j._backfill_found RETURNING 1)
SELECT (SELECT count(*) FROM j WHERE j._backfill_found AND NOT j._backfill_apply) AS unchanged,
	(SELECT count(*) FROM u) AS updated, (SELECT count(*) FROM i) AS inserted;

-- insertAll
INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version") SELECT "id", "name", "amount", "doc", "pos", "Odd ""col""", "version" FROM pg_temp."backfill_stage_d62ffa9c297ef90e";

-- replayCheck
SELECT count(*) FILTER (WHERE t."name" IS NULL) AS inserted,
	count(*) FILTER (WHERE coalesce(t."name" IS NOT NULL AND ROW(t."id", (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version") IS DISTINCT FROM ROW(s."id", (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version"), false)) AS updated,
	count(*) FILTER (WHERE t."name" IS NOT NULL AND NOT coalesce(t."name" IS NOT NULL AND ROW(t."id", (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version") IS DISTINCT FROM ROW(s."id", (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version"), false)) AS unchanged
FROM pg_temp."backfill_stage_d62ffa9c297ef90e" s LEFT JOIN "sales"."orders" t ON t."name" = s."name";

-- lockChanging
SELECT FROM pg_temp."backfill_stage_d62ffa9c297ef90e" s LEFT JOIN "sales"."orders" t ON t."name" = s."name"
HAVING sum(CASE WHEN coalesce(t."name" IS NOT NULL AND ROW(t."id", (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version") IS DISTINCT FROM ROW(s."id", (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version"), false)
		THEN 1 + (SELECT count(*) FROM (SELECT 1 FROM "sales"."orders" t WHERE t."name" = s."name" AND t."name" IS NOT NULL AND ROW(t."id", (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version") IS DISTINCT FROM ROW(s."id", (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version") FOR UPDATE OF t) x) ELSE 0 END) > 0
	OR count(*) FILTER (WHERE t."name" IS NULL) > 0 OR count(*) <>;

-- insert
INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version") SELECT s."id", s."name", s."amount", s."doc", s."pos", s."Odd ""col""", s."version" FROM pg_temp."backfill_stage_d62ffa9c297ef90e" s WHERE NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."name" = s."name" OFFSET 0);
