-- conflicts: batch
WITH c AS (
	SELECT DISTINCT u.key, t."updated_by" AS by FROM (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint)
	JOIN "sales"."orders" t ON t."id" = r."id"
	WHERE t."updated_by" IS DISTINCT FROM $1 AND NOT coalesce(t."updated_by" = ANY ($3::bigint[]), false)
	UNION
	SELECT jsonb_build_object('id', t."id"), t."updated_by" FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND t."updated_by" IS DISTINCT FROM $1 AND NOT coalesce(t."updated_by" = ANY ($3::bigint[]), false) AND true)
SELECT (SELECT count(*) FROM c) AS n, (SELECT array_agg(DISTINCT c.by) FROM c WHERE c.by IS NOT NULL) AS batches,
	c.key::text AS key, coalesce(c.by, 0) AS by FROM c ORDER BY c.key::text LIMIT 100;

-- conflicts: chunk
WITH c AS (
	SELECT DISTINCT u.key, t."updated_by" AS by FROM (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint)
	JOIN "sales"."orders" t ON t."id" = r."id"
	WHERE t."updated_by" IS DISTINCT FROM $1 AND NOT coalesce(t."updated_by" = ANY ($3::bigint[]), false)
	UNION
	SELECT jsonb_build_object('id', t."id"), t."updated_by" FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND t."updated_by" IS DISTINCT FROM $1 AND NOT coalesce(t."updated_by" = ANY ($3::bigint[]), false) AND t."version" >= $4 AND t."version" < $5)
SELECT (SELECT count(*) FROM c) AS n, (SELECT array_agg(DISTINCT c.by) FROM c WHERE c.by IS NOT NULL) AS batches,
	c.key::text AS key, coalesce(c.by, 0) AS by FROM c ORDER BY c.key::text LIMIT 100;

-- preview: batch
SELECT
	(SELECT count(*) FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $3) AND true) +
	count(DISTINCT u.key) FILTER (WHERE u.op = 'insert') AS deleted,
	count(DISTINCT u.key) FILTER (WHERE u.op = 'update') AS restored
FROM (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint)
JOIN "sales"."orders" t ON t."id" = r."id"
WHERE (t."updated_by" IS NOT DISTINCT FROM $1 OR $3);

-- preview: chunk
SELECT
	(SELECT count(*) FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $3) AND t."version" >= $4 AND t."version" < $5) +
	count(DISTINCT u.key) FILTER (WHERE u.op = 'insert') AS deleted,
	count(DISTINCT u.key) FILTER (WHERE u.op = 'update') AS restored
FROM (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint)
JOIN "sales"."orders" t ON t."id" = r."id"
WHERE (t."updated_by" IS NOT DISTINCT FROM $1 OR $3);

-- restore
UPDATE "sales"."orders" t SET ("id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "row_hash", "ingested_at", "inserted_by", "updated_by") = ROW(r."id", r."name", r."amount", r."doc", r."pos", r."Odd ""col""", r."version", r."row_hash", r."ingested_at", r."inserted_by", r."updated_by")
FROM (SELECT DISTINCT ON (u.key) u.key, u.before FROM (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq)
	CROSS JOIN LATERAL (SELECT u.key, u.id, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'update' OFFSET 0) u) u ORDER BY u.key, u.id) u
CROSS JOIN LATERAL jsonb_populate_record(NULL::"sales"."orders", u.before) r
WHERE t."id" = r."id" AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $3);

-- delete logged inserts
DELETE FROM "sales"."orders" t
USING (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint)
WHERE u.op = 'insert' AND t."id" = r."id" AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $3);

-- delete inserted: batch
DELETE FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $2) AND true;

-- delete inserted: chunk
DELETE FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $2) AND t."version" >= $3 AND t."version" < $4;

-- delivered: batch
WITH d AS MATERIALIZED (
	SELECT d.batch_id, d.key_columns = $2::text[] AS ranged, lo."id" AS _backfill_lo_0, hi."id" AS _backfill_hi_0
	FROM "backfill".delivered d JOIN "backfill".chunks c ON c.batch_id = d.batch_id AND c.seq = d.seq
	LEFT JOIN LATERAL jsonb_to_record(CASE WHEN d.key_columns = $2::text[] THEN d.lo END) AS lo("id" bigint) ON true LEFT JOIN LATERAL jsonb_to_record(CASE WHEN d.key_columns = $2::text[] THEN d.hi END) AS hi("id" bigint) ON true
	WHERE d.owner = $1 AND d.batch_id <> $1 AND c.status IN ('done', 'open') AND d.batch_id <> ALL ($3::bigint[])),
hit AS (
	SELECT jsonb_build_object('id', t."id") AS key, d.batch_id AS by, t."inserted_by" = $1 AS del
	FROM d CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."updated_by" = $1 AND ROW(t."id") >= ROW(d._backfill_lo_0) AND ROW(t."id") <= ROW(d._backfill_hi_0) AND true OFFSET 0) t
	WHERE d.ranged
	UNION ALL
	SELECT jsonb_build_object('id', t."id"), d.batch_id, t."inserted_by" = $1
	FROM (SELECT DISTINCT d.batch_id FROM d WHERE NOT d.ranged) d CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."updated_by" = $1 AND true OFFSET 0) t),
x AS (SELECT DISTINCT ON (key) key, by, del FROM hit ORDER BY key, by)
SELECT count(*) OVER () AS n, count(*) FILTER (WHERE del) OVER () AS deleted, (SELECT array_agg(DISTINCT x.by) FROM x) AS batches,
	key::text AS key, by
FROM x ORDER BY key::text LIMIT 100;

-- delivered: chunk
WITH d AS MATERIALIZED (
	SELECT d.batch_id, d.key_columns = $2::text[] AS ranged, lo."id" AS _backfill_lo_0, hi."id" AS _backfill_hi_0
	FROM "backfill".delivered d JOIN "backfill".chunks c ON c.batch_id = d.batch_id AND c.seq = d.seq
	LEFT JOIN LATERAL jsonb_to_record(CASE WHEN d.key_columns = $2::text[] THEN d.lo END) AS lo("id" bigint) ON true LEFT JOIN LATERAL jsonb_to_record(CASE WHEN d.key_columns = $2::text[] THEN d.hi END) AS hi("id" bigint) ON true
	WHERE d.owner = $1 AND d.batch_id <> $1 AND c.status IN ('done', 'open') AND d.batch_id <> ALL ($3::bigint[])),
hit AS (
	SELECT jsonb_build_object('id', t."id") AS key, d.batch_id AS by, t."inserted_by" = $1 AS del
	FROM d CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."updated_by" = $1 AND ROW(t."id") >= ROW(d._backfill_lo_0) AND ROW(t."id") <= ROW(d._backfill_hi_0) AND t."inserted_by" = $1 AND t."version" >= $5 AND t."version" < $6 OFFSET 0) t
	WHERE d.ranged
	UNION ALL
	SELECT jsonb_build_object('id', t."id"), d.batch_id, t."inserted_by" = $1
	FROM (SELECT DISTINCT d.batch_id FROM d WHERE NOT d.ranged) d CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."updated_by" = $1 AND t."inserted_by" = $1 AND t."version" >= $5 AND t."version" < $6 OFFSET 0) t
	UNION ALL
	SELECT jsonb_build_object('id', t."id"), d.batch_id, false FROM (SELECT u.* FROM unnest($4::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint)
	JOIN "sales"."orders" t ON t."id" = r."id"
	JOIN d ON (NOT d.ranged OR (ROW(t."id") >= ROW(d._backfill_lo_0) AND ROW(t."id") <= ROW(d._backfill_hi_0)))
	WHERE t."updated_by" = $1),
x AS (SELECT DISTINCT ON (key) key, by, del FROM hit ORDER BY key, by)
SELECT count(*) OVER () AS n, count(*) FILTER (WHERE del) OVER () AS deleted, (SELECT array_agg(DISTINCT x.by) FROM x) AS batches,
	key::text AS key, by
FROM x ORDER BY key::text LIMIT 100;

-- record delivered (merge)
WITH x AS MATERIALIZED (SELECT t.* FROM pg_temp."backfill_stage_7a1feba7197bdce2" s CROSS JOIN LATERAL (
		SELECT t."id", t."updated_by" AS _backfill_owner FROM "sales"."orders" t WHERE t."id" = s."id" OFFSET 0) t
		WHERE t._backfill_owner <> $1::bigint),
o AS MATERIALIZED (SELECT x._backfill_owner, count(*) AS _backfill_n FROM x GROUP BY x._backfill_owner LIMIT 8 + 1)
INSERT INTO "backfill"."delivered" (owner, batch_id, seq, key_columns, lo, hi, row_count)
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
	WHERE (SELECT count(*) FROM o) > 8) y;
