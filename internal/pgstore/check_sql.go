package pgstore

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// idMatch returns the condition that rows a and b have the same identity,
// by the rule of the merge (the package documentation of backfill,
// "Equality"): each identity column by its type's own equality, under
// its collation, which is the equality of the target's unique index; a
// key spelled otherwise (numeric 1.0 for 1.00, another case under a
// case-insensitive collation) is the same row. = for columns that cannot
// be NULL in staging (Key columns, NOT NULL Columns), IS NOT DISTINCT
// FROM otherwise: PostgreSQL uses an index or a hash for = only (see
// backfill.Completeness).
func (c *PGCheck) idMatch(a, b string) string {
	id := c.scope.Info.Identity()
	parts := make([]string, len(id))
	for i, n := range id {
		col := c.Cols[n]
		op := " = "
		if !col.Key && !col.NotNull && !slices.Contains(c.scope.Info.Target.Key, n) {
			op = " IS NOT DISTINCT FROM "
		}
		parts[i] = a + "." + sqlgen.Ident(n) + op + b + "." + sqlgen.Ident(n)
	}
	return strings.Join(parts, " AND ")
}

// Content returns the staged columns whose values must equal the target's
// after a merge the staged row won: [ComparedColumns].Checked, every
// staged column but the identity, the columns the library fills for the
// row (ingestion time, lineage; the hash stays, it is a function of the
// content) and, in Keyless mode, the raw sources of derived keys.
func (c *PGCheck) Content() []string { return slices.Clone(CompareColumns(c.scope.Info).Checked) }

// cmpExpr is how the checks compare a column: as text for types without
// an equality operator (as the merge does), and byte for byte where the
// column's own equality is looser (see exactForm).
func (c *PGCheck) cmpExpr(alias, n string) string {
	// The merge's rule ([ExactCompare]): a check that compares content
	// fails when the target holds another form of an equal value.
	return ExactCompare(c.Cols[n], alias+"."+sqlgen.Ident(n))
}

// exactForm returns the expression e, a value of column n, in a form
// whose equality tells apart every two values that differ by a byte: a
// column with a collation of its own (which may be nondeterministic,
// equating 'a' and 'A', PostgreSQL docs, 24.2.2.4 "Nondeterministic
// Collations") compares under "C", whose equality is byte for byte;
// citext (case-insensitive by design) as its text under "C". Other
// columns keep their type's equality, which is exact for every built-in
// type the checks compare: floats, numerics, timestamps compare their
// full values, never a rounded form. The database's default collation is
// always deterministic.
func (c *PGCheck) exactForm(n, e string) string {
	col := c.Cols[n]
	switch {
	case col.BaseType == "citext":
		return "(" + e + `::text COLLATE "C")`
	case col.Collation != "" && !strings.HasSuffix(e, "::text") && collatable[col.BaseType]:
		return "(" + e + ` COLLATE "C")`
	case col.Collation != "" && strings.HasSuffix(e, "::text"):
		return "(" + e + ` COLLATE "C")`
	}
	return e
}

// groupForm returns the expression e, a value of dimension n, in the form
// Aggregates groups by: the stored value, as the merge compares content
// (the package documentation of backfill, "Equality"). A column whose
// equality is exact groups by its value; text under a collation of its
// own byte for byte (exactForm: 'a' and 'A' are two groups under a
// case-insensitive collation); any other type by its text under "C"
// (numeric 1.5 and 1.50, float -0 and 0, interval '1 day' and '24 hours'
// are two groups), which Aggregates prints exactly (it pins
// extra_float_digits) and which also groups types without an equality.
// A staged identity column takes its stored value from the target row
// the staged row merged into (see groupsByTarget).
func (c *PGCheck) groupForm(n, e string) string {
	col := c.Cols[n]
	switch {
	case exactEquality(col) || col.BaseType == "":
		// A column of unknown type groups by its value.
		return e
	case c.collated(n):
		return c.exactForm(n, e)
	}
	return "(" + textForm(col, e) + ` COLLATE "C")`
}

// groupsByTarget reports whether dimension n is an identity column that
// groupForm groups by a form finer than the column's own equality
// (numeric, text under a collation of its own, citext): a staged row
// then groups under the value its target row stores, which is the key as
// first stored (the package documentation of backfill, "Equality"), so
// that a key spelled otherwise (numeric 1.00 for 1.0, 'ABC' for 'abc'
// under a case-insensitive collation) is the group of the row it merged
// into. An identity column of exact equality (timestamptz, uuid, ...)
// stores one form per key and groups by its value alike on both sides.
func (c *PGCheck) groupsByTarget(n string) bool {
	return slices.Contains(c.scope.Info.Identity(), n) && c.groupForm(n, "x") != "x"
}

// collated reports whether column n is text (not an array) that
// exactForm compares byte for byte under "C".
func (c *PGCheck) collated(n string) bool {
	return c.exactForm(n, "x") != "x" && !strings.HasPrefix(c.Cols[n].BaseType, "_")
}

// collatable lists the built-in base types that take a collation.
var collatable = map[string]bool{"text": true, "varchar": true, "bpchar": true, "name": true,
	"_text": true, "_varchar": true, "_bpchar": true, "_name": true}

// diffs returns a text[] expression naming the content columns in which
// rows a and b differ (NULL-safe), compared as cmpExpr renders them.
func (c *PGCheck) diffs(a, b string) string { return diffsExpr(a, b, c.Content(), c.cmpExpr) }

// SourceWins returns the condition under which the merge must have made
// target row t equal to staged row s: "true" but for Upsert TargetWins
// ("false": the target keeps its content) and NewerVersionWins (the
// merge's rule, newerVersionWins, on the Tracked columns compared as
// cmpExpr renders them).
func (c *PGCheck) SourceWins(s, t string) string {
	tg := c.scope.Info.Target
	if tg.Mode != backfilltype.Upsert && tg.Mode != "" {
		return "true"
	}
	switch tg.Conflict {
	case backfilltype.TargetWins:
		return "false"
	case backfilltype.NewerVersionWins:
		return newerVersionWins(s, t, tg.Version, CompareColumns(c.scope.Info).Tracked, c.cmpExpr)
	}
	return "true"
}

// ChunkRows returns the condition selecting the chunk's target rows
// (alias): by ChunkColumn bounds when the job has one, by staged identity
// otherwise; how says which.
func (c *PGCheck) ChunkRows(alias string, a *SQLArgs) (cond, how string, err error) {
	if c.scope.ChunkColumn != "" {
		cond, err := c.InChunk(alias, a)
		return cond, "ChunkColumn " + c.scope.ChunkColumn + " in " + c.scope.Chunk.String(), err
	}
	return fmt.Sprintf("EXISTS (SELECT 1 FROM %s s WHERE %s)", c.Staging, c.idMatch(alias, "s")), "identities in staging", nil
}

// InChunk returns the condition that alias's ChunkColumn lies in the
// chunk's half-open interval, as the row writer checks it: instants for
// time chunks, a wall-clock column (timestamp, date) read in Job.Zone —
// by converting the bounds, so that an index on the column serves.
func (c *PGCheck) InChunk(alias string, a *SQLArgs) (string, error) {
	ch := c.scope.Chunk
	col := alias + "." + sqlgen.Ident(c.scope.ChunkColumn)
	switch ch.Kind {
	case backfilltype.KindTime:
		lo, hi := a.Bind(ch.Start.Format(time.RFC3339Nano)), a.Bind(ch.End.Format(time.RFC3339Nano))
		switch c.Cols[c.scope.ChunkColumn].BaseType {
		case "timestamp", "date":
			z, err := c.Zone()
			if err != nil {
				return "", err
			}
			zp := a.Bind(z)
			return SQLf("{col} >= ({lo}::timestamptz AT TIME ZONE {zone}::text) AND {col} < ({hi}::timestamptz AT TIME ZONE {zone}::text)",
				"col", col, "lo", lo, "hi", hi, "zone", zp), nil
		}
		return SQLf("{col} >= {lo}::timestamptz AND {col} < {hi}::timestamptz", "col", col, "lo", lo, "hi", hi), nil
	case backfilltype.KindInt:
		return SQLf("{col} >= {lo} AND {col} < {hi}", "col", col, "lo", a.Bind(ch.Lo), "hi", a.Bind(ch.Hi)), nil
	case backfilltype.KindList:
		return fmt.Sprintf("%s = %s", col, a.Bind(ch.Item)), nil
	}
	return "", c.errorf("%w: chunk %s has no kind", backfilltype.ErrInvalidScope, ch.ID)
}

// SQLArgs collects bind parameters, in the order of their placeholders
// $1, $2, ...: pass them with the statement that binds them.
type SQLArgs []any

// Bind appends v and returns its placeholder ("$n").
func (a *SQLArgs) Bind(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// DuplicateKeysSQL lists (k, n) the keys of cols that occur more than
// once among the chunk's target rows (chunkRows, of alias c), or, with
// acrossTarget, among all target rows that share a key with them; rows
// with a NULL in cols are no duplicates.
func (c *PGCheck) DuplicateKeysSQL(cols []string, chunkRows string, acrossTarget bool) string {
	notNull := make([]string, len(cols))
	for i, n := range cols {
		notNull[i] = "c." + sqlgen.Ident(n) + " IS NOT NULL"
	}
	keys := SQLf(`SELECT {ccols} FROM {target} c WHERE {chunkRows} AND {notNull}`,
		"ccols", sqlgen.List("c.", cols), "target", c.target, "chunkRows", chunkRows, "notNull", strings.Join(notNull, " AND "))
	if acrossTarget {
		keys = SQLf(`SELECT d.* FROM {target} d WHERE ({dcols}) IN (SELECT {ccols} FROM ({keys}) c)`,
			"target", c.target, "dcols", sqlgen.List("d.", cols), "ccols", sqlgen.List("c.", cols), "keys", keys)
	}
	return SQLf(`WITH k AS ({keys})
SELECT ROW({xcols})::text || ': ' || x._backfill_n || ' rows' AS k, count(*) OVER () AS n FROM (
	SELECT {kcols}, count(*) AS _backfill_n FROM k GROUP BY {kcols} HAVING count(*) > 1) x
ORDER BY {xcols} LIMIT {max}`,
		"keys", keys, "xcols", sqlgen.List("x.", cols), "kcols", sqlgen.List("k.", cols), "max", strconv.Itoa(maxSample))
}

// MissingFromTargetSQL lists (k, n) the staged identities the target
// lacks.
func (c *PGCheck) MissingFromTargetSQL() string {
	id := c.scope.Info.Identity()
	return SQLf(`SELECT ROW({sid})::text AS k, count(*) OVER () AS n FROM {staging} s
WHERE NOT EXISTS (SELECT 1 FROM {target} t WHERE {ts}) ORDER BY {sid} LIMIT {max}`,
		"sid", sqlgen.List("s.", id), "staging", c.Staging, "target", c.target, "ts", c.idMatch("t", "s"), "max", strconv.Itoa(maxSample))
}

// DifferingContentSQL lists (k, n) the staged rows whose target row holds
// other content where the staged row wins (wins, see SourceWins), with
// the columns that differ.
func (c *PGCheck) DifferingContentSQL(wins string) string {
	id := c.scope.Info.Identity()
	return SQLf(`SELECT ROW({xid})::text || ': ' || array_to_string(x._backfill_diffs, ', ') AS k, count(*) OVER () AS n
FROM (SELECT {sid}, {diffs} AS _backfill_diffs FROM {staging} s JOIN {target} t ON {ts} WHERE {wins}) x
WHERE cardinality(x._backfill_diffs) > 0 ORDER BY {xid} LIMIT {max}`,
		"xid", sqlgen.List("x.", id), "sid", sqlgen.List("s.", id), "diffs", c.diffs("s", "t"), "staging", c.Staging,
		"target", c.target, "ts", c.idMatch("t", "s"), "wins", wins, "max", strconv.Itoa(maxSample))
}

// MissingFromStagingSQL lists (k, n) the chunk's target rows (bounds, of
// alias t) whose identity is not staged.
func (c *PGCheck) MissingFromStagingSQL(bounds string) string {
	id := c.scope.Info.Identity()
	return SQLf(`SELECT ROW({tid})::text AS k, count(*) OVER () AS n FROM {target} t
WHERE {bounds} AND NOT EXISTS (SELECT 1 FROM {staging} s WHERE {ts}) ORDER BY {tid} LIMIT {max}`,
		"tid", sqlgen.List("t.", id), "target", c.target, "bounds", bounds, "staging", c.Staging, "ts", c.idMatch("t", "s"),
		"max", strconv.Itoa(maxSample))
}

// OrphansSQL lists (k, n) the chunk's target rows whose cols, all not
// NULL, name no row of parentTable in parentCols.
func (c *PGCheck) OrphansSQL(cols []string, parentTable string, parentCols []string) string {
	id := c.scope.Info.Identity()
	notNull := make([]string, len(cols))
	match := make([]string, len(cols))
	for i, n := range cols {
		notNull[i] = "t." + sqlgen.Ident(n) + " IS NOT NULL"
		match[i] = "p." + sqlgen.Ident(parentCols[i]) + " = t." + sqlgen.Ident(n)
	}
	return SQLf(`SELECT ROW({tid})::text || ' -> ' || ROW({tcols})::text AS k, count(*) OVER () AS n
FROM {staging} s JOIN {target} t ON {ts}
WHERE {notNull} AND NOT EXISTS (SELECT 1 FROM {parent} p WHERE {match})
ORDER BY {tid} LIMIT {max}`,
		"tid", sqlgen.List("t.", id), "tcols", sqlgen.List("t.", cols), "staging", c.Staging, "target", c.target,
		"ts", c.idMatch("t", "s"), "notNull", strings.Join(notNull, " AND "), "parent", sqlgen.Table(parentTable),
		"match", strings.Join(match, " AND "), "max", strconv.Itoa(maxSample))
}

// SampleSQL lists (k, missing, diffs) for the n staged rows with the
// smallest md5 of their identity and seed: whether the target lacks the
// row, and the columns that differ where the staged row wins (wins).
func (c *PGCheck) SampleSQL(n int, seed int64, wins string, a *SQLArgs) string {
	id := c.scope.Info.Identity()
	diffs := "ARRAY[]::text[]"
	if wins != "false" {
		diffs = SQLf("CASE WHEN {wins} THEN {diffs} ELSE ARRAY[]::text[] END", "wins", wins, "diffs", c.diffs("s", "t"))
	}
	order := SQLf("md5(ROW({sid})::text || {seed}::text)", "sid", sqlgen.List("s.", id), "seed", a.Bind(strconv.FormatInt(seed, 10)))
	return SQLf(`SELECT ROW({sid})::text AS k, t.{id0} IS NULL AS missing, {diffs} AS diffs
FROM (SELECT s.*, {order} AS _backfill_order FROM {staging} s ORDER BY _backfill_order, {sid} LIMIT {n}) s
LEFT JOIN {target} t ON {ts}
ORDER BY s._backfill_order, {sid}`,
		"sid", sqlgen.List("s.", id), "id0", sqlgen.Ident(id[0]), "diffs", diffs, "order", order, "staging", c.Staging,
		"n", a.Bind(n), "target", c.target, "ts", c.idMatch("t", "s"))
}

// AggregatesSQL compares, per group (day, the Day expression of an
// alias, nil for none, then dims), the row counts and each measure's
// exact sum, special values and NULLs of staging with those of the
// target rows of the staged identities (see backfill.Aggregates). It returns
// (groups, differing, grp, _sn, _tn, ss, ts, _sz, _tz, _mbad): the counts,
// then one differing group per row (up to maxSample), or one row of NULLs
// when no group differs. Tolerances are bound in a.
func (c *PGCheck) AggregatesSQL(day func(alias string) string, dims []string, measures []backfilltype.Measure, a *SQLArgs) string {
	var gcols []string
	n := len(dims)
	if day != nil {
		n++
	}
	for i := range n {
		gcols = append(gcols, fmt.Sprintf("_g%d", i))
	}
	aggs := []string{"sum(_sn)::bigint AS _sn", "sum(_tn)::bigint AS _tn"}
	var ss, ts, sz, tz, bad []string
	for i, m := range measures {
		aggs = append(aggs, SQLf("sum(_ss{i}) AS _ss{i}, sum(_ts{i}) AS _ts{i}, sum(_sz{i})::bigint AS _sz{i}, sum(_tz{i})::bigint AS _tz{i}", "i", strconv.Itoa(i)))
		// The sum as text: the finite values' sum, then the special
		// values' counts ("12.5 + 1 NaN"); NULL for no value at all.
		sumText := func(side string) string {
			parts := []string{fmt.Sprintf("_%ss%d::text", side, i)}
			for j, s := range []string{"NaN", "Infinity", "-Infinity"} {
				x := fmt.Sprintf("_%sx%d_%d", side, i, j)
				aggs = append(aggs, SQLf("sum({x})::bigint AS {x}", "x", x))
				parts = append(parts, SQLf("CASE WHEN {x} > 0 THEN {x} || ' {special}' END", "x", x, "special", s))
			}
			return "nullif(concat_ws(' + ', " + strings.Join(parts, ", ") + "), '')"
		}
		ss = append(ss, sumText("s"))
		ts = append(ts, sumText("t"))
		sz = append(sz, fmt.Sprintf("_sz%d", i))
		tz = append(tz, fmt.Sprintf("_tz%d", i))
		bad = append(bad, SQLf(`NOT ((_ss{i} IS NOT DISTINCT FROM _ts{i} OR abs(coalesce(_ss{i}, 0) - coalesce(_ts{i}, 0)) <= {tolerance}::numeric)
	AND _sx{i}_0 = _tx{i}_0 AND _sx{i}_1 = _tx{i}_1 AND _sx{i}_2 = _tx{i}_2)`,
			"i", strconv.Itoa(i), "tolerance", a.Bind(m.Tolerance)))
	}
	array := func(elems []string, typ string) string {
		return "ARRAY[" + strings.Join(elems, ", ") + "]::" + typ + "[]"
	}
	groupBy, orderBy, groupText := "", "", "'(all rows)'"
	if len(gcols) > 0 {
		groupBy = "GROUP BY " + strings.Join(gcols, ", ")
		orderBy = "ORDER BY " + strings.Join(gcols, ", ")
		groupText = "ROW(" + strings.Join(gcols, ", ") + ")::text"
	}
	return SQLf(`WITH a AS (
	SELECT {aggs} FROM ({staged} UNION ALL {target}) x {groupBy}),
b AS (SELECT a.*, {bad} AS _mbad, {sz} AS _sz, {tz} AS _tz FROM a),
d AS (SELECT * FROM b WHERE _sn <> _tn OR true = ANY (_mbad) OR _sz <> _tz)
SELECT (SELECT count(*) FROM a) AS groups, (SELECT count(*) FROM d) AS differing, y.*
FROM (SELECT 1) one LEFT JOIN LATERAL (
	SELECT {groupText} AS grp, _sn, _tn, {ss} AS ss, {ts} AS ts, _sz, _tz, _mbad
	FROM d {orderBy} LIMIT {max}) y ON true`,
		"aggs", strings.Join(append(slices.Clone(gcols), aggs...), ", "),
		"staged", c.aggregatesSideSQL(day, dims, measures, "s", 0), "target", c.aggregatesSideSQL(day, dims, measures, "t", 1),
		"groupBy", groupBy, "bad", array(bad, "bool"), "groupText", groupText, "ss", array(ss, "text"), "ts", array(ts, "text"),
		"sz", array(sz, "bigint"), "tz", array(tz, "bigint"), "orderBy", orderBy, "max", strconv.Itoa(maxSample))
}

// aggregatesSideSQL aggregates one side per group: side 0 staging (alias
// s), side 1 the target rows of the staged identities (alias t). Each
// side fills its own columns and zeros the other's, so that the two
// combine per group without FILTER, every row aggregated once.
//
// The staged side groups a dimension that is an identity column by the
// target's stored key (groupsByTarget): it looks up the target row of
// each staged row by identity, as the merge does (idMatch; at most one,
// by the target's unique index), and groups by that row's value, or by
// the staged value where the target has no such row. The staged rows
// then fall into the groups of the target rows they merged into, and a
// chunk that repeats a key spelled otherwise (which the merge
// deduplicates) into one group. The other dimensions are content and
// group by the staged value. The Day groups by the instant or wall
// clock, which every spelling of a key stores alike.
//
// Sums are exact. A float sum depends on the order of addition, which
// no query fixes, and loses what is small next to what is large
// (1e300 + 1e-300); float8::numeric rounds to 15 significant digits.
// So a float measure is summed as numeric of each value's shortest
// exact text (extra_float_digits >= 1, pinned by compareAggregates,
// PostgreSQL docs, 8.1.3 "Floating-Point Types"): distinct floats have
// distinct texts, each names its float exactly, and a numeric sum is
// exact and does not depend on the order: a float changed by one step
// changes the sum. NaN and the infinities (float and numeric) are
// counted apart instead of summed, because one NaN would make both sums
// NaN and hide every other difference; the finite values are summed.
func (c *PGCheck) aggregatesSideSQL(day func(alias string) string, dims []string, measures []backfilltype.Measure, alias string, side int) string {
	var groups []string
	if day != nil {
		groups = append(groups, day(alias))
	}
	byTarget := false
	for _, d := range dims {
		e := alias + "." + sqlgen.Ident(d)
		if side == 0 && c.groupsByTarget(d) {
			byTarget = true
			e = "coalesce(t." + sqlgen.Ident(d) + ", " + e + ")"
		}
		groups = append(groups, c.groupForm(d, e))
	}
	var parts, pos []string
	for i, g := range groups {
		parts = append(parts, fmt.Sprintf("%s AS _g%d", g, i))
		pos = append(pos, strconv.Itoa(i+1))
	}
	mine := func(expr, other string) (string, string) {
		if side == 0 {
			return expr, other
		}
		return other, expr
	}
	sn, tn := mine("count(*)", "0")
	parts = append(parts, sn+" AS _sn", tn+" AS _tn")
	for i, m := range measures {
		col := alias + "." + sqlgen.Ident(m.Column)
		special := false
		exact := col + "::numeric"
		switch c.Cols[m.Column].BaseType {
		case "float4", "float8":
			special, exact = true, col+"::text::numeric"
		case "numeric":
			special = true
		}
		finite := ""
		if special {
			finite = fmt.Sprintf(" FILTER (WHERE %s NOT IN ('NaN', 'Infinity', '-Infinity'))", col)
		}
		ssum, tsum := mine("sum("+exact+")"+finite, "NULL::numeric")
		snull, tnull := mine("count(*) - count("+col+")", "0")
		parts = append(parts, fmt.Sprintf("%s AS _ss%d, %s AS _ts%d", ssum, i, tsum, i), fmt.Sprintf("%s AS _sz%d, %s AS _tz%d", snull, i, tnull, i))
		for j, s := range []string{"NaN", "Infinity", "-Infinity"} {
			cnt := "0"
			if special {
				cnt = fmt.Sprintf("count(*) FILTER (WHERE %s = '%s')", col, s)
			}
			sx, tx := mine(cnt, "0")
			parts = append(parts, fmt.Sprintf("%s AS _sx%d_%d, %s AS _tx%d_%d", sx, i, j, tx, i, j))
		}
	}
	from := c.Staging + " s"
	switch {
	case side == 1:
		from = fmt.Sprintf("%s s JOIN %s t ON %s", c.Staging, c.target, c.idMatch("t", "s"))
	case byTarget:
		// A matched key is never NULL where the staged one is not
		// (idMatch), so coalesce picks the target's whenever it matched.
		from = fmt.Sprintf("%s s LEFT JOIN %s t ON %s", c.Staging, c.target, c.idMatch("t", "s"))
	}
	q := "SELECT " + strings.Join(parts, ", ") + " FROM " + from
	if len(pos) > 0 {
		q += " GROUP BY " + strings.Join(pos, ", ")
	}
	return q
}

// FingerprintStagingSQL counts the staged rows and sums their row hashes
// of cols (see RowHashSQL).
func (c *PGCheck) FingerprintStagingSQL(cols []string) string {
	return SQLf(`SELECT count(*) AS rows, coalesce(sum({hash}), 0)::text AS hash_sum FROM {staging} s`,
		"hash", RowHashSQL(c.scope.Info, cols, "s"), "staging", c.Staging)
}

// FingerprintTargetSQL counts the chunk's target rows and sums their row
// hashes of cols: the rows within bounds (a condition on alias t), or,
// for bounds "", the target rows of the staged identities.
func (c *PGCheck) FingerprintTargetSQL(cols []string, bounds string) string {
	if bounds == "" {
		return SQLf(`SELECT count(*) AS rows, coalesce(sum({hash}), 0)::text AS hash_sum FROM {staging} s JOIN {target} t ON {ts}`,
			"hash", RowHashSQL(c.scope.Info, cols, "t"), "staging", c.Staging, "target", c.target, "ts", c.idMatch("t", "s"))
	}
	return SQLf(`SELECT count(*) AS rows, coalesce(sum({hash}), 0)::text AS hash_sum FROM {target} t WHERE {bounds}`,
		"hash", RowHashSQL(c.scope.Info, cols, "t"), "target", c.target, "bounds", bounds)
}
