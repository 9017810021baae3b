-- stage
pg_temp."backfill_stage_7a1feba7197bdce2";

-- create
CREATE TEMP TABLE IF NOT EXISTS "backfill_stage_7a1feba7197bdce2" ("id" bigint, "name" text COLLATE pg_catalog."C", "amount" numeric(12,2), "doc" json, "pos" point, "Odd ""col""" text, "version" timestamp with time zone, "row_hash" bytea, "ingested_at" timestamp with time zone, "inserted_by" bigint, "updated_by" bigint, _backfill_row bigint NOT NULL) ON COMMIT DELETE ROWS;

-- copyIn
COPY pg_temp."backfill_stage_7a1feba7197bdce2" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", "ingested_at", "inserted_by", "updated_by", _backfill_row) FROM STDIN;

-- dupCheck
SELECT EXISTS (SELECT 1 FROM pg_temp."backfill_stage_7a1feba7197bdce2" GROUP BY "id" HAVING count(*) > 1);

-- inChunkConflicts
WITH f AS (SELECT DISTINCT ON ("id") * FROM pg_temp."backfill_stage_7a1feba7197bdce2" ORDER BY "id", _backfill_row)
SELECT s._backfill_row AS row, f._backfill_row AS first_row, array_remove(ARRAY[CASE WHEN (s."name" COLLATE "C") IS DISTINCT FROM (f."name" COLLATE "C") THEN 'name' END, CASE WHEN (s."amount"::text COLLATE "C") IS DISTINCT FROM (f."amount"::text COLLATE "C") THEN 'amount' END, CASE WHEN (s."doc"::text COLLATE "C") IS DISTINCT FROM (f."doc"::text COLLATE "C") THEN 'doc' END, CASE WHEN (s."pos"::text COLLATE "C") IS DISTINCT FROM (f."pos"::text COLLATE "C") THEN 'pos' END, CASE WHEN s."Odd ""col""" IS DISTINCT FROM f."Odd ""col""" THEN 'Odd "col"' END, CASE WHEN s."version" IS DISTINCT FROM f."version" THEN 'version' END]::text[], NULL) AS diffs, (to_jsonb(s.*) - '_backfill_row')::text AS raw
FROM pg_temp."backfill_stage_7a1feba7197bdce2" s JOIN f ON s."id" = f."id"
WHERE EXISTS (SELECT 1 FROM pg_temp."backfill_stage_7a1feba7197bdce2" o WHERE o."id" = s."id" AND o._backfill_row <> s._backfill_row)
ORDER BY s._backfill_row;

-- targetConflicts
SELECT s._backfill_row AS row, array_remove(ARRAY[CASE WHEN (s."name" COLLATE "C") IS DISTINCT FROM (t."name" COLLATE "C") THEN 'name' END, CASE WHEN (s."amount"::text COLLATE "C") IS DISTINCT FROM (t."amount"::text COLLATE "C") THEN 'amount' END, CASE WHEN (s."doc"::text COLLATE "C") IS DISTINCT FROM (t."doc"::text COLLATE "C") THEN 'doc' END, CASE WHEN (s."pos"::text COLLATE "C") IS DISTINCT FROM (t."pos"::text COLLATE "C") THEN 'pos' END, CASE WHEN s."Odd ""col""" IS DISTINCT FROM t."Odd ""col""" THEN 'Odd "col"' END, CASE WHEN s."version" IS DISTINCT FROM t."version" THEN 'version' END]::text[], NULL) AS diffs, (to_jsonb(s.*) - '_backfill_row')::text AS raw, (to_jsonb(t.*))::text AS existing
FROM pg_temp."backfill_stage_7a1feba7197bdce2" s JOIN "sales"."orders" t ON t."id" = s."id"
WHERE ROW(t."row_hash", (t."pos"::text COLLATE "C")) IS DISTINCT FROM ROW(s."row_hash", (s."pos"::text COLLATE "C")) ORDER BY s._backfill_row;

-- deleteRows
DELETE FROM pg_temp."backfill_stage_7a1feba7197bdce2" WHERE _backfill_row = ANY ($1::bigint[]);

-- insert
INSERT INTO "sales"."orders" ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", "ingested_at", "inserted_by", "updated_by") SELECT s."id", s."name", s."amount", s."doc", s."pos", s."Odd ""col""", s."version", s."row_hash", s."ingested_at", s."inserted_by", s."updated_by" FROM pg_temp."backfill_stage_7a1feba7197bdce2" s WHERE NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."id" = s."id" OFFSET 0);
