-- duplicate_keys
-- args: [2024-03-01T00:00:00Z 2024-03-02T00:00:00Z]
WITH k AS (SELECT c."k" FROM "sales"."orders" c WHERE c."version" >= $1::timestamptz AND c."version" < $2::timestamptz AND c."k" IS NOT NULL)
SELECT ROW(x."k")::text || ': ' || x._backfill_n || ' rows' AS k, count(*) OVER () AS n FROM (
	SELECT k."k", count(*) AS _backfill_n FROM k GROUP BY k."k" HAVING count(*) > 1) x
ORDER BY x."k" LIMIT 10;

-- duplicate_keys across target
-- args: [2024-03-01T00:00:00Z 2024-03-02T00:00:00Z]
WITH k AS (SELECT d.* FROM "sales"."orders" d WHERE (d."name") IN (SELECT c."name" FROM (SELECT c."name" FROM "sales"."orders" c WHERE c."version" >= $1::timestamptz AND c."version" < $2::timestamptz AND c."name" IS NOT NULL) c))
SELECT ROW(x."name")::text || ': ' || x._backfill_n || ' rows' AS k, count(*) OVER () AS n FROM (
	SELECT k."name", count(*) AS _backfill_n FROM k GROUP BY k."name" HAVING count(*) > 1) x
ORDER BY x."name" LIMIT 10;

-- completeness: missing from target
SELECT ROW(s."k")::text AS k, count(*) OVER () AS n FROM pg_temp."backfill_stage_273c389e71776144" s
WHERE NOT EXISTS (SELECT 1 FROM "sales"."orders" t WHERE t."k" = s."k") ORDER BY s."k" LIMIT 10;

-- completeness: differing content
SELECT ROW(x."k")::text || ': ' || array_to_string(x._backfill_diffs, ', ') AS k, count(*) OVER () AS n
FROM (SELECT s."k", array_remove(ARRAY[CASE WHEN s."id" IS DISTINCT FROM t."id" THEN 'id' END, CASE WHEN (s."amount"::text COLLATE "C") IS DISTINCT FROM (t."amount"::text COLLATE "C") THEN 'amount' END, CASE WHEN (s."doc"::text COLLATE "C") IS DISTINCT FROM (t."doc"::text COLLATE "C") THEN 'doc' END, CASE WHEN (s."pos"::text COLLATE "C") IS DISTINCT FROM (t."pos"::text COLLATE "C") THEN 'pos' END, CASE WHEN s."Odd ""col""" IS DISTINCT FROM t."Odd ""col""" THEN 'Odd "col"' END, CASE WHEN s."version" IS DISTINCT FROM t."version" THEN 'version' END]::text[], NULL) AS _backfill_diffs FROM pg_temp."backfill_stage_273c389e71776144" s JOIN "sales"."orders" t ON t."k" = s."k" WHERE true) x
WHERE cardinality(x._backfill_diffs) > 0 ORDER BY x."k" LIMIT 10;

-- completeness: missing from staging
-- args: [2024-03-01T00:00:00Z 2024-03-02T00:00:00Z]
SELECT ROW(t."k")::text AS k, count(*) OVER () AS n FROM "sales"."orders" t
WHERE t."version" >= $1::timestamptz AND t."version" < $2::timestamptz AND NOT EXISTS (SELECT 1 FROM pg_temp."backfill_stage_273c389e71776144" s WHERE t."k" = s."k") ORDER BY t."k" LIMIT 10;

-- referential_integrity
SELECT ROW(t."k")::text || ' -> ' || ROW(t."name", t."k")::text AS k, count(*) OVER () AS n
FROM pg_temp."backfill_stage_273c389e71776144" s JOIN "sales"."orders" t ON t."k" = s."k"
WHERE t."name" IS NOT NULL AND t."k" IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "sales"."customers" p WHERE p."name" = t."name" AND p."code" = t."k")
ORDER BY t."k" LIMIT 10;

-- aggregates
-- args: [UTC 0.5 0]
WITH a AS (
	SELECT _g0, _g1, _g2, sum(_sn)::bigint AS _sn, sum(_tn)::bigint AS _tn, sum(_ss0) AS _ss0, sum(_ts0) AS _ts0, sum(_sz0)::bigint AS _sz0, sum(_tz0)::bigint AS _tz0, sum(_sx0_0)::bigint AS _sx0_0, sum(_sx0_1)::bigint AS _sx0_1, sum(_sx0_2)::bigint AS _sx0_2, sum(_tx0_0)::bigint AS _tx0_0, sum(_tx0_1)::bigint AS _tx0_1, sum(_tx0_2)::bigint AS _tx0_2, sum(_ss1) AS _ss1, sum(_ts1) AS _ts1, sum(_sz1)::bigint AS _sz1, sum(_tz1)::bigint AS _tz1, sum(_sx1_0)::bigint AS _sx1_0, sum(_sx1_1)::bigint AS _sx1_1, sum(_sx1_2)::bigint AS _sx1_2, sum(_tx1_0)::bigint AS _tx1_0, sum(_tx1_1)::bigint AS _tx1_1, sum(_tx1_2)::bigint AS _tx1_2 FROM (SELECT date_trunc('day', s."version" AT TIME ZONE $1::text)::date AS _g0, (s."name" COLLATE "C") AS _g1, s."Odd ""col""" AS _g2, count(*) AS _sn, 0 AS _tn, sum(s."amount"::numeric) FILTER (WHERE s."amount" NOT IN ('NaN', 'Infinity', '-Infinity')) AS _ss0, NULL::numeric AS _ts0, count(*) - count(s."amount") AS _sz0, 0 AS _tz0, count(*) FILTER (WHERE s."amount" = 'NaN') AS _sx0_0, 0 AS _tx0_0, count(*) FILTER (WHERE s."amount" = 'Infinity') AS _sx0_1, 0 AS _tx0_1, count(*) FILTER (WHERE s."amount" = '-Infinity') AS _sx0_2, 0 AS _tx0_2, sum(s."id"::numeric) AS _ss1, NULL::numeric AS _ts1, count(*) - count(s."id") AS _sz1, 0 AS _tz1, 0 AS _sx1_0, 0 AS _tx1_0, 0 AS _sx1_1, 0 AS _tx1_1, 0 AS _sx1_2, 0 AS _tx1_2 FROM pg_temp."backfill_stage_273c389e71776144" s GROUP BY 1, 2, 3 UNION ALL SELECT date_trunc('day', t."version" AT TIME ZONE $1::text)::date AS _g0, (t."name" COLLATE "C") AS _g1, t."Odd ""col""" AS _g2, 0 AS _sn, count(*) AS _tn, NULL::numeric AS _ss0, sum(t."amount"::numeric) FILTER (WHERE t."amount" NOT IN ('NaN', 'Infinity', '-Infinity')) AS _ts0, 0 AS _sz0, count(*) - count(t."amount") AS _tz0, 0 AS _sx0_0, count(*) FILTER (WHERE t."amount" = 'NaN') AS _tx0_0, 0 AS _sx0_1, count(*) FILTER (WHERE t."amount" = 'Infinity') AS _tx0_1, 0 AS _sx0_2, count(*) FILTER (WHERE t."amount" = '-Infinity') AS _tx0_2, NULL::numeric AS _ss1, sum(t."id"::numeric) AS _ts1, 0 AS _sz1, count(*) - count(t."id") AS _tz1, 0 AS _sx1_0, 0 AS _tx1_0, 0 AS _sx1_1, 0 AS _tx1_1, 0 AS _sx1_2, 0 AS _tx1_2 FROM pg_temp."backfill_stage_273c389e71776144" s JOIN "sales"."orders" t ON t."k" = s."k" GROUP BY 1, 2, 3) x GROUP BY _g0, _g1, _g2),
b AS (SELECT a.*, ARRAY[NOT ((_ss0 IS NOT DISTINCT FROM _ts0 OR abs(coalesce(_ss0, 0) - coalesce(_ts0, 0)) <= $2::numeric)
	AND _sx0_0 = _tx0_0 AND _sx0_1 = _tx0_1 AND _sx0_2 = _tx0_2), NOT ((_ss1 IS NOT DISTINCT FROM _ts1 OR abs(coalesce(_ss1, 0) - coalesce(_ts1, 0)) <= $3::numeric)
	AND _sx1_0 = _tx1_0 AND _sx1_1 = _tx1_1 AND _sx1_2 = _tx1_2)]::bool[] AS _mbad, ARRAY[_sz0, _sz1]::bigint[] AS _sz, ARRAY[_tz0, _tz1]::bigint[] AS _tz FROM a),
d AS (SELECT * FROM b WHERE _sn <> _tn OR true = ANY (_mbad) OR _sz <> _tz)
SELECT (SELECT count(*) FROM a) AS groups, (SELECT count(*) FROM d) AS differing, y.*
FROM (SELECT 1) one LEFT JOIN LATERAL (
	SELECT ROW(_g0, _g1, _g2)::text AS grp, _sn, _tn, ARRAY[nullif(concat_ws(' + ', _ss0::text, CASE WHEN _sx0_0 > 0 THEN _sx0_0 || ' NaN' END, CASE WHEN _sx0_1 > 0 THEN _sx0_1 || ' Infinity' END, CASE WHEN _sx0_2 > 0 THEN _sx0_2 || ' -Infinity' END), ''), nullif(concat_ws(' + ', _ss1::text, CASE WHEN _sx1_0 > 0 THEN _sx1_0 || ' NaN' END, CASE WHEN _sx1_1 > 0 THEN _sx1_1 || ' Infinity' END, CASE WHEN _sx1_2 > 0 THEN _sx1_2 || ' -Infinity' END), '')]::text[] AS ss, ARRAY[nullif(concat_ws(' + ', _ts0::text, CASE WHEN _tx0_0 > 0 THEN _tx0_0 || ' NaN' END, CASE WHEN _tx0_1 > 0 THEN _tx0_1 || ' Infinity' END, CASE WHEN _tx0_2 > 0 THEN _tx0_2 || ' -Infinity' END), ''), nullif(concat_ws(' + ', _ts1::text, CASE WHEN _tx1_0 > 0 THEN _tx1_0 || ' NaN' END, CASE WHEN _tx1_1 > 0 THEN _tx1_1 || ' Infinity' END, CASE WHEN _tx1_2 > 0 THEN _tx1_2 || ' -Infinity' END), '')]::text[] AS ts, _sz, _tz, _mbad
	FROM d ORDER BY _g0, _g1, _g2 LIMIT 10) y ON true;

-- aggregates: zero value
WITH a AS (
	SELECT sum(_sn)::bigint AS _sn, sum(_tn)::bigint AS _tn FROM (SELECT count(*) AS _sn, 0 AS _tn FROM pg_temp."backfill_stage_273c389e71776144" s UNION ALL SELECT 0 AS _sn, count(*) AS _tn FROM pg_temp."backfill_stage_273c389e71776144" s JOIN "sales"."orders" t ON t."k" = s."k") x ),
b AS (SELECT a.*, ARRAY[]::bool[] AS _mbad, ARRAY[]::bigint[] AS _sz, ARRAY[]::bigint[] AS _tz FROM a),
d AS (SELECT * FROM b WHERE _sn <> _tn OR true = ANY (_mbad) OR _sz <> _tz)
SELECT (SELECT count(*) FROM a) AS groups, (SELECT count(*) FROM d) AS differing, y.*
FROM (SELECT 1) one LEFT JOIN LATERAL (
	SELECT '(all rows)' AS grp, _sn, _tn, ARRAY[]::text[] AS ss, ARRAY[]::text[] AS ts, _sz, _tz, _mbad
	FROM d  LIMIT 10) y ON true;

-- aggregates: key dimensions
-- args: [0]
WITH a AS (
	SELECT _g0, _g1, sum(_sn)::bigint AS _sn, sum(_tn)::bigint AS _tn, sum(_ss0) AS _ss0, sum(_ts0) AS _ts0, sum(_sz0)::bigint AS _sz0, sum(_tz0)::bigint AS _tz0, sum(_sx0_0)::bigint AS _sx0_0, sum(_sx0_1)::bigint AS _sx0_1, sum(_sx0_2)::bigint AS _sx0_2, sum(_tx0_0)::bigint AS _tx0_0, sum(_tx0_1)::bigint AS _tx0_1, sum(_tx0_2)::bigint AS _tx0_2 FROM (SELECT s."k" AS _g0, s."Odd ""col""" AS _g1, count(*) AS _sn, 0 AS _tn, sum(s."amount"::numeric) FILTER (WHERE s."amount" NOT IN ('NaN', 'Infinity', '-Infinity')) AS _ss0, NULL::numeric AS _ts0, count(*) - count(s."amount") AS _sz0, 0 AS _tz0, count(*) FILTER (WHERE s."amount" = 'NaN') AS _sx0_0, 0 AS _tx0_0, count(*) FILTER (WHERE s."amount" = 'Infinity') AS _sx0_1, 0 AS _tx0_1, count(*) FILTER (WHERE s."amount" = '-Infinity') AS _sx0_2, 0 AS _tx0_2 FROM pg_temp."backfill_stage_273c389e71776144" s GROUP BY 1, 2 UNION ALL SELECT t."k" AS _g0, t."Odd ""col""" AS _g1, 0 AS _sn, count(*) AS _tn, NULL::numeric AS _ss0, sum(t."amount"::numeric) FILTER (WHERE t."amount" NOT IN ('NaN', 'Infinity', '-Infinity')) AS _ts0, 0 AS _sz0, count(*) - count(t."amount") AS _tz0, 0 AS _sx0_0, count(*) FILTER (WHERE t."amount" = 'NaN') AS _tx0_0, 0 AS _sx0_1, count(*) FILTER (WHERE t."amount" = 'Infinity') AS _tx0_1, 0 AS _sx0_2, count(*) FILTER (WHERE t."amount" = '-Infinity') AS _tx0_2 FROM pg_temp."backfill_stage_273c389e71776144" s JOIN "sales"."orders" t ON t."k" = s."k" GROUP BY 1, 2) x GROUP BY _g0, _g1),
b AS (SELECT a.*, ARRAY[NOT ((_ss0 IS NOT DISTINCT FROM _ts0 OR abs(coalesce(_ss0, 0) - coalesce(_ts0, 0)) <= $1::numeric)
	AND _sx0_0 = _tx0_0 AND _sx0_1 = _tx0_1 AND _sx0_2 = _tx0_2)]::bool[] AS _mbad, ARRAY[_sz0]::bigint[] AS _sz, ARRAY[_tz0]::bigint[] AS _tz FROM a),
d AS (SELECT * FROM b WHERE _sn <> _tn OR true = ANY (_mbad) OR _sz <> _tz)
SELECT (SELECT count(*) FROM a) AS groups, (SELECT count(*) FROM d) AS differing, y.*
FROM (SELECT 1) one LEFT JOIN LATERAL (
	SELECT ROW(_g0, _g1)::text AS grp, _sn, _tn, ARRAY[nullif(concat_ws(' + ', _ss0::text, CASE WHEN _sx0_0 > 0 THEN _sx0_0 || ' NaN' END, CASE WHEN _sx0_1 > 0 THEN _sx0_1 || ' Infinity' END, CASE WHEN _sx0_2 > 0 THEN _sx0_2 || ' -Infinity' END), '')]::text[] AS ss, ARRAY[nullif(concat_ws(' + ', _ts0::text, CASE WHEN _tx0_0 > 0 THEN _tx0_0 || ' NaN' END, CASE WHEN _tx0_1 > 0 THEN _tx0_1 || ' Infinity' END, CASE WHEN _tx0_2 > 0 THEN _tx0_2 || ' -Infinity' END), '')]::text[] AS ts, _sz, _tz, _mbad
	FROM d ORDER BY _g0, _g1 LIMIT 10) y ON true;

-- sample
-- args: [42 100]
SELECT ROW(s."k")::text AS k, t."k" IS NULL AS missing, CASE WHEN true THEN array_remove(ARRAY[CASE WHEN s."id" IS DISTINCT FROM t."id" THEN 'id' END, CASE WHEN (s."amount"::text COLLATE "C") IS DISTINCT FROM (t."amount"::text COLLATE "C") THEN 'amount' END, CASE WHEN (s."doc"::text COLLATE "C") IS DISTINCT FROM (t."doc"::text COLLATE "C") THEN 'doc' END, CASE WHEN (s."pos"::text COLLATE "C") IS DISTINCT FROM (t."pos"::text COLLATE "C") THEN 'pos' END, CASE WHEN s."Odd ""col""" IS DISTINCT FROM t."Odd ""col""" THEN 'Odd "col"' END, CASE WHEN s."version" IS DISTINCT FROM t."version" THEN 'version' END]::text[], NULL) ELSE ARRAY[]::text[] END AS diffs
FROM (SELECT s.*, md5(ROW(s."k")::text || $1::text) AS _backfill_order FROM pg_temp."backfill_stage_273c389e71776144" s ORDER BY _backfill_order, s."k" LIMIT $2) s
LEFT JOIN "sales"."orders" t ON t."k" = s."k"
ORDER BY s._backfill_order, s."k";

-- fingerprint: staged rows
SELECT count(*) AS rows, coalesce(sum(timestamp_hash_extended(coalesce(s."version", 'epoch') AT TIME ZONE 'UTC', (hashtextextended(coalesce(s."Odd ""col""", ''), (hashtextextended(coalesce((s."pos"::text COLLATE "C"), ''), (hashtextextended(coalesce((s."doc"::text COLLATE "C"), ''), (hashtextextended(coalesce((s."amount"::text COLLATE "C"), ''), (hashint8extended(s."id" >> 32, hashint8extended(s."id", (hashtextextended(s."k", (7020098106520436578::int8 # -2152535657050944081::int8)) # 7960286522194355700::int8))) # CASE WHEN s."amount" IS NULL THEN -7101224070970197970::int8 ELSE 487617019471545679::int8 END)) # CASE WHEN s."doc" IS NULL THEN 2884468851544726650::int8 ELSE -537132696929009172::int8 END)) # CASE WHEN s."pos" IS NULL THEN 4920621376332150912::int8 ELSE 1961750202426094747::int8 END)) # CASE WHEN s."Odd ""col""" IS NULL THEN 4756960546164755539::int8 ELSE 6038094601263162090::int8 END)) # CASE WHEN s."version" IS NULL THEN 1351495112774779490::int8 ELSE 3207296026000306913::int8 END))), 0)::text AS hash_sum FROM pg_temp."backfill_stage_273c389e71776144" s;

-- fingerprint: chunk's target rows
-- args: [2024-03-01T00:00:00Z 2024-03-02T00:00:00Z]
SELECT count(*) AS rows, coalesce(sum(timestamp_hash_extended(coalesce(t."version", 'epoch') AT TIME ZONE 'UTC', (hashtextextended(coalesce(t."Odd ""col""", ''), (hashtextextended(coalesce((t."pos"::text COLLATE "C"), ''), (hashtextextended(coalesce((t."doc"::text COLLATE "C"), ''), (hashtextextended(coalesce((t."amount"::text COLLATE "C"), ''), (hashint8extended(t."id" >> 32, hashint8extended(t."id", (hashtextextended(t."k", (7020098106520436578::int8 # -2152535657050944081::int8)) # 7960286522194355700::int8))) # CASE WHEN t."amount" IS NULL THEN -7101224070970197970::int8 ELSE 487617019471545679::int8 END)) # CASE WHEN t."doc" IS NULL THEN 2884468851544726650::int8 ELSE -537132696929009172::int8 END)) # CASE WHEN t."pos" IS NULL THEN 4920621376332150912::int8 ELSE 1961750202426094747::int8 END)) # CASE WHEN t."Odd ""col""" IS NULL THEN 4756960546164755539::int8 ELSE 6038094601263162090::int8 END)) # CASE WHEN t."version" IS NULL THEN 1351495112774779490::int8 ELSE 3207296026000306913::int8 END))), 0)::text AS hash_sum FROM "sales"."orders" t WHERE t."version" >= $1::timestamptz AND t."version" < $2::timestamptz;

-- fingerprint: target rows of staged identities
SELECT count(*) AS rows, coalesce(sum(timestamp_hash_extended(coalesce(t."version", 'epoch') AT TIME ZONE 'UTC', (hashtextextended(coalesce(t."Odd ""col""", ''), (hashtextextended(coalesce((t."pos"::text COLLATE "C"), ''), (hashtextextended(coalesce((t."doc"::text COLLATE "C"), ''), (hashtextextended(coalesce((t."amount"::text COLLATE "C"), ''), (hashint8extended(t."id" >> 32, hashint8extended(t."id", (hashtextextended(t."k", (7020098106520436578::int8 # -2152535657050944081::int8)) # 7960286522194355700::int8))) # CASE WHEN t."amount" IS NULL THEN -7101224070970197970::int8 ELSE 487617019471545679::int8 END)) # CASE WHEN t."doc" IS NULL THEN 2884468851544726650::int8 ELSE -537132696929009172::int8 END)) # CASE WHEN t."pos" IS NULL THEN 4920621376332150912::int8 ELSE 1961750202426094747::int8 END)) # CASE WHEN t."Odd ""col""" IS NULL THEN 4756960546164755539::int8 ELSE 6038094601263162090::int8 END)) # CASE WHEN t."version" IS NULL THEN 1351495112774779490::int8 ELSE 3207296026000306913::int8 END))), 0)::text AS hash_sum FROM pg_temp."backfill_stage_273c389e71776144" s JOIN "sales"."orders" t ON t."k" = s."k";
