-- stage
pg_temp."backfill_stage_9b1ce5ed2e97023a";

-- create
CREATE TEMP TABLE IF NOT EXISTS "backfill_stage_9b1ce5ed2e97023a" ("id" bigint, _backfill_row bigint NOT NULL) ON COMMIT DELETE ROWS;

-- copyIn
COPY pg_temp."backfill_stage_9b1ce5ed2e97023a" ("id", _backfill_row) FROM STDIN;

-- dupCheck
SELECT EXISTS (SELECT 1 FROM pg_temp."backfill_stage_9b1ce5ed2e97023a" GROUP BY "id" HAVING count(*) > 1);

-- dedup
DELETE FROM pg_temp."backfill_stage_9b1ce5ed2e97023a" WHERE _backfill_row IN (
	SELECT _backfill_row FROM (
		SELECT s._backfill_row, row_number() OVER (PARTITION BY s."id" ORDER BY _backfill_row DESC) AS rn FROM pg_temp."backfill_stage_9b1ce5ed2e97023a" s) x
	WHERE x.rn > 1);

-- deleteRows
DELETE FROM pg_temp."backfill_stage_9b1ce5ed2e97023a" WHERE _backfill_row = ANY ($1::bigint[]);

-- upsert
WITH j AS MATERIALIZED (
	SELECT s.*, t."id" IS NOT NULL AS _backfill_found, coalesce(false, false) AS _backfill_apply
	FROM pg_temp."backfill_stage_9b1ce5ed2e97023a" s LEFT JOIN "sales"."orders" t ON t."id" = s."id"),
u AS (SELECT WHERE false),
i AS (INSERT INTO "sales"."orders" ("id") SELECT j."id" FROM j WHERE NOT j._backfill_found RETURNING 1)
SELECT (SELECT count(*) FROM j WHERE j._backfill_found AND NOT j._backfill_apply) AS unchanged,
	(SELECT count(*) FROM u) AS updated, (SELECT count(*) FROM i) AS inserted;

-- insertAll
INSERT INTO "sales"."orders" ("id") SELECT "id" FROM pg_temp."backfill_stage_9b1ce5ed2e97023a";

-- replayCheck
SELECT count(*) FILTER (WHERE t."id" IS NULL) AS inserted,
	count(*) FILTER (WHERE coalesce(false, false)) AS updated,
	count(*) FILTER (WHERE t."id" IS NOT NULL AND NOT coalesce(false, false)) AS unchanged
FROM pg_temp."backfill_stage_9b1ce5ed2e97023a" s LEFT JOIN "sales"."orders" t ON t."id" = s."id";

-- insert
INSERT INTO "sales"."orders" ("id") SELECT s."id" FROM pg_temp."backfill_stage_9b1ce5ed2e97023a" s WHERE NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."id" = s."id" OFFSET 0);
