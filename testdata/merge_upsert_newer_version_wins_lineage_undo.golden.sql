-- stage
pg_temp."backfill_stage_7a1feba7197bdce2";

-- create
CREATE TEMP TABLE IF NOT EXISTS "backfill_stage_7a1feba7197bdce2" ("id" bigint, "name" text COLLATE pg_catalog."C", "amount" numeric(12,2), "doc" json, "pos" point, "Odd ""col""" text, "version" timestamp with time zone, "row_hash" bytea, "ingested_at" timestamp with time zone, "inserted_by" bigint, "updated_by" bigint, _backfill_row bigint NOT NULL) ON COMMIT DELETE ROWS;

-- copyIn
COPY pg_temp."backfill_stage_7a1feba7197bdce2" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", "ingested_at", "inserted_by", "updated_by", _backfill_row) FROM STDIN;

-- dupCheck
SELECT EXISTS (SELECT 1 FROM pg_temp."backfill_stage_7a1feba7197bdce2" GROUP BY "id" HAVING count(*) > 1);

-- dedup
DELETE FROM pg_temp."backfill_stage_7a1feba7197bdce2" WHERE _backfill_row IN (
	SELECT _backfill_row FROM (
		SELECT s._backfill_row, row_number() OVER (PARTITION BY s."id" ORDER BY "version" DESC NULLS LAST, ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version")::text COLLATE "C" DESC, _backfill_row DESC) AS rn FROM pg_temp."backfill_stage_7a1feba7197bdce2" s) x
	WHERE x.rn > 1);

-- deleteRows
DELETE FROM pg_temp."backfill_stage_7a1feba7197bdce2" WHERE _backfill_row = ANY ($1::bigint[]);

-- upsert
WITH j AS MATERIALIZED (
	SELECT s.*, t."id" IS NOT NULL AS _backfill_found, coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")) AND (s."version" > t."version" OR (t."version" IS NULL AND s."version" IS NOT NULL)
	OR (s."version" IS NOT DISTINCT FROM t."version" AND ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version")::text COLLATE "C" > ROW((t."name" COLLATE "C"), (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version")::text COLLATE "C")), false) AS _backfill_apply, CASE WHEN coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")) AND (s."version" > t."version" OR (t."version" IS NULL AND s."version" IS NOT NULL)
	OR (s."version" IS NOT DISTINCT FROM t."version" AND ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version")::text COLLATE "C" > ROW((t."name" COLLATE "C"), (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version")::text COLLATE "C")), false) THEN to_jsonb(t.*) END AS _backfill_before, t."updated_by" AS _backfill_owner
	FROM pg_temp."backfill_stage_7a1feba7197bdce2" s LEFT JOIN "sales"."orders" t ON t."id" = s."id"),
u AS (UPDATE "sales"."orders" t SET "name" = j."name", "amount" = j."amount", "doc" = j."doc", "pos" = j."pos", "Odd ""col""" = j."Odd ""col""", "version" = j."version", "row_hash" = j."row_hash", "ingested_at" = j."ingested_at", "updated_by" = j."updated_by" FROM j WHERE j._backfill_apply AND t."id" = j."id" RETURNING 1),
i AS (INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", "ingested_at", "inserted_by", "updated_by") SELECT j."id", j."name", j."amount", j."doc", j."pos", j."Odd ""col""", j."version", j."row_hash", j."ingested_at", j."inserted_by", j."updated_by" FROM j WHERE NOT j._backfill_found RETURNING 1),
uu AS (INSERT INTO "backfill"."undo" (batch_id, seq, op, key, before) SELECT $1::bigint, $2::int, 'update', jsonb_build_object('id', j."id"), j._backfill_before FROM j WHERE j._backfill_apply),
x AS MATERIALIZED (SELECT j."id", j._backfill_owner FROM j WHERE j._backfill_found AND NOT j._backfill_apply AND j._backfill_owner <> $1::bigint),
o AS MATERIALIZED (SELECT x._backfill_owner, count(*) AS _backfill_n FROM x GROUP BY x._backfill_owner LIMIT 8 + 1),
dl AS (INSERT INTO "backfill"."delivered" (owner, batch_id, seq, key_columns, lo, hi, row_count)
SELECT y._backfill_owner, $1::bigint, $2::int, $3::text[], jsonb_build_object('id', y._backfill_lo_0), jsonb_build_object('id', y._backfill_hi_0), y._backfill_n FROM (
	SELECT o._backfill_owner, o._backfill_n, l.*, h.* FROM o
	CROSS JOIN LATERAL (SELECT x."id" AS _backfill_lo_0 FROM x WHERE x._backfill_owner = o._backfill_owner ORDER BY x."id" LIMIT 1) l
	CROSS JOIN LATERAL (SELECT x."id" AS _backfill_hi_0 FROM x WHERE x._backfill_owner = o._backfill_owner ORDER BY x."id" DESC LIMIT 1) h
	WHERE (SELECT count(*) FROM o) <= 8
	UNION ALL
	SELECT * FROM (
		SELECT DISTINCT ON (x._backfill_owner) x._backfill_owner, count(*) OVER w AS _backfill_n, first_value(x."id") OVER w AS _backfill_lo_0, last_value(x."id") OVER w AS _backfill_hi_0
		FROM x
		WINDOW w AS (PARTITION BY x._backfill_owner ORDER BY x."id" ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
		ORDER BY x._backfill_owner) z
	WHERE (SELECT count(*) FROM o) > 8) y)
SELECT (SELECT count(*) FROM j WHERE j._backfill_found AND NOT j._backfill_apply) AS unchanged,
	(SELECT count(*) FROM u) AS updated, (SELECT count(*) FROM i) AS inserted;

-- insertAll
INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", "ingested_at", "inserted_by", "updated_by") SELECT "id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", "ingested_at", "inserted_by", "updated_by" FROM pg_temp."backfill_stage_7a1feba7197bdce2";

-- replayCheck
SELECT count(*) FILTER (WHERE t."id" IS NULL) AS inserted,
	count(*) FILTER (WHERE coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")) AND (s."version" > t."version" OR (t."version" IS NULL AND s."version" IS NOT NULL)
	OR (s."version" IS NOT DISTINCT FROM t."version" AND ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version")::text COLLATE "C" > ROW((t."name" COLLATE "C"), (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version")::text COLLATE "C")), false)) AS updated,
	count(*) FILTER (WHERE t."id" IS NOT NULL AND NOT coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")) AND (s."version" > t."version" OR (t."version" IS NULL AND s."version" IS NOT NULL)
	OR (s."version" IS NOT DISTINCT FROM t."version" AND ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version")::text COLLATE "C" > ROW((t."name" COLLATE "C"), (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version")::text COLLATE "C")), false)) AS unchanged
FROM pg_temp."backfill_stage_7a1feba7197bdce2" s LEFT JOIN "sales"."orders" t ON t."id" = s."id";

-- lockChanging
SELECT FROM pg_temp."backfill_stage_7a1feba7197bdce2" s LEFT JOIN "sales"."orders" t ON t."id" = s."id"
HAVING sum(CASE WHEN coalesce(t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")) AND (s."version" > t."version" OR (t."version" IS NULL AND s."version" IS NOT NULL)
	OR (s."version" IS NOT DISTINCT FROM t."version" AND ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version")::text COLLATE "C" > ROW((t."name" COLLATE "C"), (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version")::text COLLATE "C")), false)
		THEN 1 + (SELECT count(*) FROM (SELECT 1 FROM "sales"."orders" t WHERE t."id" = s."id" AND t."id" IS NOT NULL AND ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")) AND (s."version" > t."version" OR (t."version" IS NULL AND s."version" IS NOT NULL)
	OR (s."version" IS NOT DISTINCT FROM t."version" AND ROW((s."name" COLLATE "C"), (s."amount"::text COLLATE "C"), (s."doc"::text COLLATE "C"), (s."pos"::text COLLATE "C"), s."Odd ""col""", s."version")::text COLLATE "C" > ROW((t."name" COLLATE "C"), (t."amount"::text COLLATE "C"), (t."doc"::text COLLATE "C"), (t."pos"::text COLLATE "C"), t."Odd ""col""", t."version")::text COLLATE "C")) FOR UPDATE OF t) x) ELSE 0 END) > 0
	OR count(*) FILTER (WHERE t."id" IS NULL) > 0 OR count(*) <>;

-- insert
INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", "ingested_at", "inserted_by", "updated_by") SELECT s."id", s."name", s."amount", s."doc", s."pos", s."Odd ""col""", s."version", s."row_hash", s."ingested_at", s."inserted_by", s."updated_by" FROM pg_temp."backfill_stage_7a1feba7197bdce2" s WHERE NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."id" = s."id" OFFSET 0);
