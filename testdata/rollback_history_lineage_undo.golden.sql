-- conflicts: batch
WITH c AS (
	SELECT DISTINCT u.key, t."updated_by" AS by FROM (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint, "valid_from" timestamp with time zone)
	JOIN "sales"."orders" t ON t."id" = r."id" AND t."valid_from" = r."valid_from"
	WHERE t."updated_by" IS DISTINCT FROM $1 AND NOT coalesce(t."updated_by" = ANY ($3::bigint[]), false)
	UNION
	SELECT jsonb_build_object('id', t."id", 'valid_from', t."valid_from"), t."updated_by" FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND t."updated_by" IS DISTINCT FROM $1 AND NOT coalesce(t."updated_by" = ANY ($3::bigint[]), false) AND true)
SELECT (SELECT count(*) FROM c) AS n, (SELECT array_agg(DISTINCT c.by) FROM c WHERE c.by IS NOT NULL) AS batches,
	c.key::text AS key, coalesce(c.by, 0) AS by FROM c ORDER BY c.key::text LIMIT 100;

-- conflicts: chunk
WITH c AS (
	SELECT DISTINCT u.key, t."updated_by" AS by FROM (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint, "valid_from" timestamp with time zone)
	JOIN "sales"."orders" t ON t."id" = r."id" AND t."valid_from" = r."valid_from"
	WHERE t."updated_by" IS DISTINCT FROM $1 AND NOT coalesce(t."updated_by" = ANY ($3::bigint[]), false)
	UNION
	SELECT jsonb_build_object('id', t."id", 'valid_from', t."valid_from"), t."updated_by" FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND t."updated_by" IS DISTINCT FROM $1 AND NOT coalesce(t."updated_by" = ANY ($3::bigint[]), false) AND t."version" >= $4 AND t."version" < $5)
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
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint, "valid_from" timestamp with time zone)
JOIN "sales"."orders" t ON t."id" = r."id" AND t."valid_from" = r."valid_from"
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
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint, "valid_from" timestamp with time zone)
JOIN "sales"."orders" t ON t."id" = r."id" AND t."valid_from" = r."valid_from"
WHERE (t."updated_by" IS NOT DISTINCT FROM $1 OR $3);

-- restore
UPDATE "sales"."orders" t SET ("valid_from", "id", "name", "amount", "doc", "pos", "Odd ""col""", "version", "ingested_at", "inserted_by", "updated_by", "valid_to") = ROW(r."valid_from", r."id", r."name", r."amount", r."doc", r."pos", r."Odd ""col""", r."version", r."ingested_at", r."inserted_by", r."updated_by", r."valid_to")
FROM (SELECT DISTINCT ON (u.key) u.key, u.before FROM (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq)
	CROSS JOIN LATERAL (SELECT u.key, u.id, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'update' OFFSET 0) u) u ORDER BY u.key, u.id) u
CROSS JOIN LATERAL jsonb_populate_record(NULL::"sales"."orders", u.before) r
WHERE t."id" = r."id" AND t."valid_from" = r."valid_from" AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $3);

-- delete logged inserts
DELETE FROM "sales"."orders" t
USING (SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint, "valid_from" timestamp with time zone)
WHERE u.op = 'insert' AND t."id" = r."id" AND t."valid_from" = r."valid_from" AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $3);

-- delete inserted: batch
WITH d AS (DELETE FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $2) AND true RETURNING jsonb_build_object('id', t."id", 'valid_from', t."valid_from") AS key)
INSERT INTO backfill_rollback_keys SELECT key FROM d;

-- delete inserted: chunk
WITH d AS (DELETE FROM "sales"."orders" t WHERE t."inserted_by" = $1 AND (t."updated_by" IS NOT DISTINCT FROM $1 OR $2) AND t."version" >= $3 AND t."version" < $4 RETURNING jsonb_build_object('id', t."id", 'valid_from', t."valid_from") AS key)
INSERT INTO backfill_rollback_keys SELECT key FROM d;

-- retile
WITH x AS (SELECT "id", "valid_from", lead("valid_from") OVER (PARTITION BY "id" ORDER BY "valid_from") AS _backfill_next_from
	FROM "sales"."orders" WHERE ("id") IN (SELECT DISTINCT r."id" FROM (
	SELECT u.key FROM (SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.op = 'inserts' AND u.batch_id = $1 AND (u.seq = $2 OR $2 < 0)
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.op IN ('insert', 'update') AND u.batch_id = $1 AND (u.seq = $2 OR $2 < 0)) u
	UNION ALL SELECT k.key FROM backfill_rollback_keys k) u
CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint, "valid_from" timestamp with time zone)))
UPDATE "sales"."orders" t SET "valid_to" = x._backfill_next_from FROM x
WHERE t."id" = x."id" AND t."valid_from" = x."valid_from" AND t."valid_to" IS DISTINCT FROM x._backfill_next_from;

-- check retiled
SELECT DISTINCT row("id")::text FROM (
	SELECT "id", "valid_from", "valid_to", lead("valid_from") OVER (PARTITION BY "id" ORDER BY "valid_from") AS _backfill_next_from
	FROM "sales"."orders" WHERE ("id") IN (SELECT DISTINCT r."id" FROM (
	SELECT u.key FROM (SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.op = 'inserts' AND u.batch_id = $1 AND (u.seq = $2 OR $2 < 0)
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.op IN ('insert', 'update') AND u.batch_id = $1 AND (u.seq = $2 OR $2 < 0)) u
	UNION ALL SELECT k.key FROM backfill_rollback_keys k) u
CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint, "valid_from" timestamp with time zone))) x
WHERE "valid_to" IS DISTINCT FROM _backfill_next_from OR "valid_to" <= "valid_from" LIMIT 5;

-- delivered: batch
WITH d AS MATERIALIZED (
	SELECT d.batch_id, d.key_columns = $2::text[] AS ranged, lo."id" AS _backfill_lo_0, lo."valid_from" AS _backfill_lo_1, hi."id" AS _backfill_hi_0, hi."valid_from" AS _backfill_hi_1
	FROM "backfill".delivered d JOIN "backfill".chunks c ON c.batch_id = d.batch_id AND c.seq = d.seq
	LEFT JOIN LATERAL jsonb_to_record(CASE WHEN d.key_columns = $2::text[] THEN d.lo END) AS lo("id" bigint, "valid_from" timestamp with time zone) ON true LEFT JOIN LATERAL jsonb_to_record(CASE WHEN d.key_columns = $2::text[] THEN d.hi END) AS hi("id" bigint, "valid_from" timestamp with time zone) ON true
	WHERE d.owner = $1 AND d.batch_id <> $1 AND c.status IN ('done', 'open') AND d.batch_id <> ALL ($3::bigint[])),
hit AS (
	SELECT jsonb_build_object('id', t."id", 'valid_from', t."valid_from") AS key, d.batch_id AS by, t."inserted_by" = $1 AS del
	FROM d CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."updated_by" = $1 AND ROW(t."id", t."valid_from") >= ROW(d._backfill_lo_0, d._backfill_lo_1) AND ROW(t."id", t."valid_from") <= ROW(d._backfill_hi_0, d._backfill_hi_1) AND true OFFSET 0) t
	WHERE d.ranged
	UNION ALL
	SELECT jsonb_build_object('id', t."id", 'valid_from', t."valid_from"), d.batch_id, t."inserted_by" = $1
	FROM (SELECT DISTINCT d.batch_id FROM d WHERE NOT d.ranged) d CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."updated_by" = $1 AND true OFFSET 0) t),
x AS (SELECT DISTINCT ON (key) key, by, del FROM hit ORDER BY key, by)
SELECT count(*) OVER () AS n, count(*) FILTER (WHERE del) OVER () AS deleted, (SELECT array_agg(DISTINCT x.by) FROM x) AS batches,
	key::text AS key, by
FROM x ORDER BY key::text LIMIT 100;

-- delivered: chunk
WITH d AS MATERIALIZED (
	SELECT d.batch_id, d.key_columns = $2::text[] AS ranged, lo."id" AS _backfill_lo_0, lo."valid_from" AS _backfill_lo_1, hi."id" AS _backfill_hi_0, hi."valid_from" AS _backfill_hi_1
	FROM "backfill".delivered d JOIN "backfill".chunks c ON c.batch_id = d.batch_id AND c.seq = d.seq
	LEFT JOIN LATERAL jsonb_to_record(CASE WHEN d.key_columns = $2::text[] THEN d.lo END) AS lo("id" bigint, "valid_from" timestamp with time zone) ON true LEFT JOIN LATERAL jsonb_to_record(CASE WHEN d.key_columns = $2::text[] THEN d.hi END) AS hi("id" bigint, "valid_from" timestamp with time zone) ON true
	WHERE d.owner = $1 AND d.batch_id <> $1 AND c.status IN ('done', 'open') AND d.batch_id <> ALL ($3::bigint[])),
hit AS (
	SELECT jsonb_build_object('id', t."id", 'valid_from', t."valid_from") AS key, d.batch_id AS by, t."inserted_by" = $1 AS del
	FROM d CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."updated_by" = $1 AND ROW(t."id", t."valid_from") >= ROW(d._backfill_lo_0, d._backfill_lo_1) AND ROW(t."id", t."valid_from") <= ROW(d._backfill_hi_0, d._backfill_hi_1) AND t."inserted_by" = $1 AND t."version" >= $5 AND t."version" < $6 OFFSET 0) t
	WHERE d.ranged
	UNION ALL
	SELECT jsonb_build_object('id', t."id", 'valid_from', t."valid_from"), d.batch_id, t."inserted_by" = $1
	FROM (SELECT DISTINCT d.batch_id FROM d WHERE NOT d.ranged) d CROSS JOIN LATERAL (SELECT * FROM "sales"."orders" t WHERE t."updated_by" = $1 AND t."inserted_by" = $1 AND t."version" >= $5 AND t."version" < $6 OFFSET 0) t
	UNION ALL
	SELECT jsonb_build_object('id', t."id", 'valid_from', t."valid_from"), d.batch_id, false FROM (SELECT u.* FROM unnest($4::int[]) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM "backfill".undo u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM "backfill".undo u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u) u CROSS JOIN LATERAL jsonb_to_record(u.key) AS r("id" bigint, "valid_from" timestamp with time zone)
	JOIN "sales"."orders" t ON t."id" = r."id" AND t."valid_from" = r."valid_from"
	JOIN d ON (NOT d.ranged OR (ROW(t."id", t."valid_from") >= ROW(d._backfill_lo_0, d._backfill_lo_1) AND ROW(t."id", t."valid_from") <= ROW(d._backfill_hi_0, d._backfill_hi_1)))
	WHERE t."updated_by" = $1),
x AS (SELECT DISTINCT ON (key) key, by, del FROM hit ORDER BY key, by)
SELECT count(*) OVER () AS n, count(*) FILTER (WHERE del) OVER () AS deleted, (SELECT array_agg(DISTINCT x.by) FROM x) AS batches,
	key::text AS key, by
FROM x ORDER BY key::text LIMIT 100;

-- record delivered (merge)
WITH x AS MATERIALIZED (SELECT t.* FROM pg_temp."backfill_stage_cafe1582c9a7672b" s CROSS JOIN LATERAL (
		SELECT t."id", t."valid_from", t."updated_by" AS _backfill_owner FROM "sales"."orders" t WHERE t."id" = s."id" AND t."valid_from" = s."valid_from" OFFSET 0) t
		WHERE t._backfill_owner <> $1::bigint),
o AS MATERIALIZED (SELECT x._backfill_owner, count(*) AS _backfill_n FROM x GROUP BY x._backfill_owner LIMIT 8 + 1)
INSERT INTO "backfill"."delivered" (owner, batch_id, seq, key_columns, lo, hi, row_count)
SELECT y._backfill_owner, $1::bigint, $2::int, $3::text[], jsonb_build_object('id', y._backfill_lo_0, 'valid_from', y._backfill_lo_1), jsonb_build_object('id', y._backfill_hi_0, 'valid_from', y._backfill_hi_1), y._backfill_n FROM (
	SELECT o._backfill_owner, o._backfill_n, l.*, h.* FROM o
	CROSS JOIN LATERAL (SELECT x."id" AS _backfill_lo_0, x."valid_from" AS _backfill_lo_1 FROM x WHERE x._backfill_owner = o._backfill_owner ORDER BY x."id", x."valid_from" LIMIT 1) l
	CROSS JOIN LATERAL (SELECT x."id" AS _backfill_hi_0, x."valid_from" AS _backfill_hi_1 FROM x WHERE x._backfill_owner = o._backfill_owner ORDER BY x."id" DESC, x."valid_from" DESC LIMIT 1) h
	WHERE (SELECT count(*) FROM o) <= 8
	UNION ALL
	SELECT * FROM (
		SELECT DISTINCT ON (x._backfill_owner) x._backfill_owner, count(*) OVER w AS _backfill_n, first_value(x."id") OVER w AS _backfill_lo_0, first_value(x."valid_from") OVER w AS _backfill_lo_1, last_value(x."id") OVER w AS _backfill_hi_0, last_value(x."valid_from") OVER w AS _backfill_hi_1
		FROM x
		WINDOW w AS (PARTITION BY x._backfill_owner ORDER BY x."id", x."valid_from" ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
		ORDER BY x._backfill_owner) z
	WHERE (SELECT count(*) FROM o) > 8) y;
