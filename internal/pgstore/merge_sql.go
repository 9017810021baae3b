package pgstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// ComparedColumns is the one definition of what a merge compares: which
// columns identify a row, which it writes, and which decide whether a
// staged row leaves its target row unchanged or updates it. The merge SQL,
// the validators, rollback and the fake merger in backfilltest all derive
// what they compare from it. Column lists are in
// [backfilltype.TableInfo.Columns] order.
type ComparedColumns struct {
	// Identity identifies one target row: Key, plus ValidFrom in History
	// mode.
	Identity []string
	// Content is every staged column that is not in Identity.
	Content []string
	// Written is what an update writes: Content without
	// Lineage.InsertedBy (the batch that inserted the row stays).
	Written []string
	// Tracked is the content change detection looks at: Content without
	// the columns the library fills (IngestedAt, HashColumn, lineage) and,
	// in Keyless mode, without the Derive sources (the key's raw forms:
	// rows that differ only there are one record). Exceptions name the
	// Tracked columns that differ; NewerVersionWins breaks version ties
	// by their text.
	Tracked []string
	// Compared decides whether two rows differ, NULL-safe (IS DISTINCT
	// FROM): Tracked, or, when HashColumn is set, HashColumn and the
	// Tracked columns the row hash does not cover (see NewRowHasher).
	Compared []string
	// Checked is what the validators compare after a merge the staged row
	// won: Tracked plus HashColumn (a function of the content).
	Checked []string

	Cols map[string]backfilltype.Column `json:"-" db:"-"`
}

// CompareColumns returns the definition of the columns a merge of info
// compares (see [ComparedColumns]). It is a pure function of info.
func CompareColumns(info backfilltype.TableInfo) ComparedColumns {
	t := info.Target
	cc := ComparedColumns{Identity: info.Identity(), Cols: map[string]backfilltype.Column{}}
	lineage := func(n string) bool { return n != "" && (n == t.Lineage.InsertedBy || n == t.Lineage.UpdatedBy) }
	derived := func(n string) bool {
		return t.Mode == backfilltype.Keyless && slices.ContainsFunc(t.Derive, func(r backfilltype.KeyRule) bool { return r.From == n })
	}
	for _, c := range info.Columns {
		cc.Cols[c.Name] = c
		n := c.Name
		if slices.Contains(cc.Identity, n) {
			continue
		}
		cc.Content = append(cc.Content, n)
		if n != t.Lineage.InsertedBy {
			cc.Written = append(cc.Written, n)
		}
		if n == t.IngestedAt || lineage(n) || derived(n) {
			continue
		}
		if n != t.HashColumn {
			cc.Tracked = append(cc.Tracked, n)
		}
		cc.Checked = append(cc.Checked, n)
	}
	cc.Compared = cc.Tracked
	if t.HashColumn != "" {
		// The hash stands for the Tracked columns it covers (see
		// NewRowHasher); the others are compared beside it.
		cc.Compared = []string{t.HashColumn}
		for _, n := range cc.Tracked {
			if !rowHashed(cc.Cols[n]) {
				cc.Compared = append(cc.Compared, n)
			}
		}
	}
	return cc
}

// expr is how the merge compares column n of alias: byte for byte
// ([ExactCompare]), as text under "C" where the type's
// equality is looser than its stored form or missing.
func (cc ComparedColumns) expr(alias, n string) string {
	return ExactCompare(cc.Cols[n], alias+"."+sqlgen.Ident(n))
}

// distinct is the merge's "rows a and b differ": the Compared columns,
// NULL-safe.
func (cc ComparedColumns) distinct(a, b string) string {
	if len(cc.Compared) == 0 {
		return "false"
	}
	return rowExpr(a, cc.Compared, cc.expr) + " IS DISTINCT FROM " + rowExpr(b, cc.Compared, cc.expr)
}

// rowExpr is ROW(...) of cols of alias, each compared as expr renders it.
func rowExpr(alias string, cols []string, expr func(alias, n string) string) string {
	parts := make([]string, len(cols))
	for i, n := range cols {
		parts[i] = expr(alias, n)
	}
	return "ROW(" + strings.Join(parts, ", ") + ")"
}

// diffsExpr is a text[] expression naming the columns of cols in which
// rows a and b differ (NULL-safe), each compared as expr renders it.
func diffsExpr(a, b string, cols []string, expr func(alias, n string) string) string {
	if len(cols) == 0 {
		return "ARRAY[]::text[]"
	}
	parts := make([]string, len(cols))
	for i, n := range cols {
		parts[i] = fmt.Sprintf("CASE WHEN %s IS DISTINCT FROM %s THEN %s END", expr(a, n), expr(b, n), pq.QuoteLiteral(n))
	}
	return "array_remove(ARRAY[" + strings.Join(parts, ", ") + "]::text[], NULL)"
}

// newerVersionWins is NewerVersionWins' rule for staged row s against
// target row t: a newer version, a version where there was none, or an
// equal version whose Tracked columns' text (as expr renders them) is
// greater byte for byte.
func newerVersionWins(s, t, version string, tracked []string, expr func(alias, n string) string) string {
	return SQLf(`({s}.{v} > {t}.{v} OR ({t}.{v} IS NULL AND {s}.{v} IS NOT NULL)
	OR ({s}.{v} IS NOT DISTINCT FROM {t}.{v} AND {srow}::text COLLATE "C" > {trow}::text COLLATE "C"))`,
		"s", s, "t", t, "v", sqlgen.Ident(version), "srow", rowExpr(s, tracked, expr), "trow", rowExpr(t, tracked, expr))
}

// SQLf replaces each {name} in tmpl by its value; pairs are name, value,
// name, value... A brace not opening a known name stays as it is, and
// values are not scanned again.
func SQLf(tmpl string, pairs ...string) string {
	var b strings.Builder
	b.Grow(len(tmpl))
	for {
		i := strings.IndexByte(tmpl, '{')
		if i < 0 {
			b.WriteString(tmpl)
			return b.String()
		}
		b.WriteString(tmpl[:i])
		tmpl = tmpl[i:]
		j := strings.IndexByte(tmpl, '}')
		v, ok := "", false
		if j > 0 {
			v, ok = lookup(pairs, tmpl[1:j])
		}
		if !ok {
			b.WriteByte('{')
			tmpl = tmpl[1:]
			continue
		}
		b.WriteString(v)
		tmpl = tmpl[j+1:]
	}
}

// lookup returns the value of name in pairs (name, value, ...).
func lookup(pairs []string, name string) (string, bool) {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] == name {
			return pairs[i+1], true
		}
	}
	return "", false
}

// PGMergeSQL is the generated SQL of one target shape. Statements that do
// not apply to the mode are empty.
type PGMergeSQL struct {
	Stage, create, copyIn, dupCheck string `json:"-" db:"-"`
	// dedup deletes the rows that lose to another row of the same identity
	// (Upsert, History).
	dedup string
	// inChunkConflicts lists (row, first row, differing columns, raw) of
	// staged rows whose identity repeats with other content
	// (AppendOnly, Keyless); sameDup lists rows identical to an earlier one.
	inChunkConflicts string
	// TargetConflicts lists (row, differing columns, raw, existing) of
	// staged rows whose key exists in the target with other content
	// (AppendOnly, Keyless).
	TargetConflicts string `json:"-" db:"-"`
	deleteRows      string
	// Upsert is the whole Upsert merge in one statement, returning
	// (updated, inserted); insertAll the fast path's plain INSERT.
	Upsert, insertAll string `json:"-" db:"-"`
	// replayCheck counts, without writing, what replaying the merge would
	// insert and update (Upsert).
	replayCheck string
	// disagreed counts the staged rows whose target row this batch ($1)
	// wrote with other content (TargetWins with lineage); "" otherwise.
	disagreed string
	// lockChanging locks the target rows the merge would change, before
	// the statement that decides ([PGStager.lockChanging]); "" when none can.
	lockChanging string
	// upsertDelivers: Upsert records the delivered summary of the rows
	// it leaves unchanged (mergeShape.upsertDelivered); the stager does
	// not after it.
	upsertDelivers bool
	Update         string `json:"-" db:"-"`
	Insert         string `json:"-" db:"-"`
	// CloseIntervals recomputes, before the insert, valid_to of the
	// touched keys' versions when the chunk adds versions (History);
	// lockClosing locks, before it, the versions it would change;
	// CheckIntervals finds keys whose intervals overlap or leave a gap.
	CloseIntervals, lockClosing, CheckIntervals string `json:"-" db:"-"`
}

// mergeShape is what the statements of one target shape are built from.
type mergeShape struct {
	t      backfilltype.Target
	cc     ComparedColumns
	names  []string // staged columns, in Columns order
	stage  string   // pg_temp-qualified, quoted staging table
	target string   // quoted target table
	undo   string   // quoted undo log table, "" for none
	// delivered: the delivered table, "" for none or without lineage
	// UpdatedBy (owner): the Upsert records the rows it leaves unchanged
	// ([PGStager.recordDelivered]) in its own statement.
	delivered, owner string
	// insertOnly: the upsert counts the rows it would update instead of
	// updating them (prepareInsertOnly).
	insertOnly bool
}

// BuildMergeSQL returns the SQL that stages and merges a chunk into
// info's target: the temporary staging table, its COPY, and the merge
// statements of info's mode (empty where they do not apply). It only
// builds text: it runs nothing and cannot fail.
func BuildMergeSQL(info backfilltype.TableInfo) PGMergeSQL {
	m := mergeShape{t: info.Target, cc: CompareColumns(info), stage: stagingTable(info), target: sqlgen.Table(info.Target.Table),
		undo: info.Chunk.UndoTable}
	if info.Chunk.DeliveredTable != "" && info.Target.Lineage.UpdatedBy != "" {
		m.delivered, m.owner = info.Chunk.DeliveredTable, info.Target.Lineage.UpdatedBy
	}
	for _, c := range info.Columns {
		m.names = append(m.names, c.Name)
	}
	q := PGMergeSQL{Stage: m.stage, create: m.createStaging(info.Columns), copyIn: m.copyIn(), dupCheck: m.dupCheck(),
		deleteRows: m.deleteRows()}
	switch m.t.Mode {
	case backfilltype.Upsert, backfilltype.History:
		q.dedup = m.dedup()
	case backfilltype.AppendOnly, backfilltype.Keyless:
		q.inChunkConflicts, q.TargetConflicts = m.inChunkConflicts(), m.targetConflicts()
	}
	if m.t.Mode == backfilltype.Upsert {
		q.Upsert, q.insertAll, q.replayCheck, q.lockChanging = m.upsert(), m.insertAll(), m.replayCheck(), m.upsertLockChanging()
		q.disagreed, q.upsertDelivers = m.disagreed(), m.delivered != ""
		if info.InsertOnly {
			ro := m
			ro.undo, ro.insertOnly, ro.delivered = "", true, ""
			q.Upsert, q.lockChanging, q.upsertDelivers = ro.upsert(), "", false
		}
	}
	if m.t.Mode == backfilltype.History {
		q.Update, q.Insert, q.lockChanging = m.historyUpdate(), m.historyInsert(), m.historyLockChanging()
		q.CloseIntervals, q.lockClosing, q.CheckIntervals = m.closeIntervals(), m.lockClosing(), m.checkIntervals()
	} else {
		q.Insert = m.insert()
	}
	return q
}

// stagingTable names the staging table of info's shape: the target and
// its staged columns' names, types and key flags, hashed.
func stagingTable(info backfilltype.TableInfo) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", info.Target.Table)
	for _, c := range info.Columns {
		fmt.Fprintf(h, "%s\x00%s\x00%t\x00", c.Name, c.Type, c.Key)
	}
	return "pg_temp." + sqlgen.Ident("backfill_stage_"+hex.EncodeToString(h.Sum(nil))[:16])
}

// idEq is the condition that rows a and b have the same identity.
func (m mergeShape) idEq(a, b string) string { return sqlgen.Equal(a, b, m.cc.Identity) }

// rawOf renders a staged or target row as jsonb text without our columns.
func rawOf(alias string) string {
	return fmt.Sprintf("(to_jsonb(%s.*) - '_backfill_row')::text", alias)
}

// createStaging creates the staging table: the staged columns with the
// target's types and collations (staging compares and deduplicates keys
// as the target does), plus the row number.
func (m mergeShape) createStaging(cols []backfilltype.Column) string {
	defs := make([]string, len(cols))
	for i, c := range cols {
		defs[i] = sqlgen.Ident(c.Name) + " " + c.Type
		if c.Collation != "" {
			defs[i] += " COLLATE " + c.Collation
		}
	}
	return SQLf(`CREATE TEMP TABLE IF NOT EXISTS {name} ({defs}, _backfill_row bigint NOT NULL) ON COMMIT DELETE ROWS`,
		"name", strings.TrimPrefix(m.stage, "pg_temp."), "defs", strings.Join(defs, ", "))
}

func (m mergeShape) copyIn() string {
	return SQLf(`COPY {stage} ({names}, _backfill_row) FROM STDIN`, "stage", m.stage, "names", sqlgen.List("", m.names))
}

// dupCheck tells whether an identity repeats in staging.
func (m mergeShape) dupCheck() string {
	return SQLf(`SELECT EXISTS (SELECT 1 FROM {stage} GROUP BY {identity} HAVING count(*) > 1)`,
		"stage", m.stage, "identity", sqlgen.List("", m.cc.Identity))
}

// deleteRows drops the staged rows numbered $1.
func (m mergeShape) deleteRows() string {
	return SQLf(`DELETE FROM {stage} WHERE _backfill_row = ANY ($1::bigint[])`, "stage", m.stage)
}

// dedup deletes every staged row but the winner of its identity: the
// last (KeepLast), the first (KeepFirst), or by NewerVersionWins' order.
func (m mergeShape) dedup() string {
	order := "_backfill_row DESC"
	switch {
	case m.t.Conflict == backfilltype.NewerVersionWins:
		order = SQLf(`{v} DESC NULLS LAST, {row}::text COLLATE "C" DESC, _backfill_row DESC`,
			"v", sqlgen.Ident(m.t.Version), "row", rowExpr("s", m.cc.Tracked, m.cc.expr))
	case m.t.Duplicates == backfilltype.KeepFirst:
		order = "_backfill_row ASC"
	}
	return SQLf(`DELETE FROM {stage} WHERE _backfill_row IN (
	SELECT _backfill_row FROM (
		SELECT s._backfill_row, row_number() OVER (PARTITION BY {identity} ORDER BY {order}) AS rn FROM {stage} s) x
	WHERE x.rn > 1)`,
		"stage", m.stage, "identity", sqlgen.List("s.", m.cc.Identity), "order", order)
}

// inChunkConflicts lists the staged rows whose identity repeats, with the
// first row of the identity and the Tracked columns that differ from it
// (AppendOnly keeps the first row; Keyless rejects the whole group when
// any two rows differ).
func (m mergeShape) inChunkConflicts() string {
	return SQLf(`WITH f AS (SELECT DISTINCT ON ({identity}) * FROM {stage} ORDER BY {identity}, _backfill_row)
SELECT s._backfill_row AS row, f._backfill_row AS first_row, {diffs} AS diffs, {raw} AS raw
FROM {stage} s JOIN f ON {sf}
WHERE EXISTS (SELECT 1 FROM {stage} o WHERE {os} AND o._backfill_row <> s._backfill_row)
ORDER BY s._backfill_row`,
		"stage", m.stage, "identity", sqlgen.List("", m.cc.Identity), "diffs", diffsExpr("s", "f", m.cc.Tracked, m.cc.expr),
		"raw", rawOf("s"), "sf", m.idEq("s", "f"), "os", m.idEq("o", "s"))
}

// targetConflicts lists the staged rows whose identity exists in the
// target with other content (AppendOnly, Keyless).
func (m mergeShape) targetConflicts() string {
	return SQLf(`SELECT s._backfill_row AS row, {diffs} AS diffs, {raw} AS raw, (to_jsonb(t.*))::text AS existing
FROM {stage} s JOIN {target} t ON {ts}
WHERE {distinct} ORDER BY s._backfill_row`,
		"stage", m.stage, "target", m.target, "diffs", diffsExpr("s", "t", m.cc.Tracked, m.cc.expr), "raw", rawOf("s"),
		"ts", m.idEq("t", "s"), "distinct", m.cc.distinct("t", "s"))
}

// apply is Upsert's condition that staged row s updates its target row
// t: t exists and differs, and the policy lets the source win.
func (m mergeShape) apply() string {
	if m.t.Conflict == backfilltype.TargetWins || len(m.cc.Content) == 0 {
		return "false"
	}
	apply := "t." + sqlgen.Ident(m.t.Key[0]) + " IS NOT NULL AND " + m.cc.distinct("t", "s")
	if m.t.Conflict == backfilltype.NewerVersionWins {
		apply += " AND " + newerVersionWins("s", "t", m.t.Version, m.cc.Tracked, m.cc.expr)
	}
	return apply
}

// upsert is the whole Upsert merge in one statement, one index lookup per
// staged row: a materialised LEFT JOIN finds each row's target row and
// decides, then a data-modifying CTE updates the rows to change and
// another inserts the absent keys (PostgreSQL docs, 7.8.4
// "Data-Modifying Statements in WITH"). Both see the same snapshot and
// touch disjoint keys. The outer SELECT reads j first, in full: every
// lookup into the target is done before u or i writes to it.
func (m mergeShape) upsert() string {
	apply := m.apply()
	before, undo := m.upsertUndo(apply)
	owner, delivered := m.upsertDelivered()
	return SQLf(`WITH j AS MATERIALIZED (
	SELECT s.*, t.{key} IS NOT NULL AS _backfill_found, coalesce({apply}, false) AS _backfill_apply{before}{owner}
	FROM {stage} s LEFT JOIN {target} t ON {ts}),
u AS ({update}),
i AS (INSERT INTO {target} ({names}) SELECT {jnames} FROM j WHERE NOT j._backfill_found RETURNING 1){undo}{delivered}
SELECT (SELECT count(*) FROM j WHERE j._backfill_found AND NOT j._backfill_apply) AS unchanged,
	(SELECT count(*) FROM u) AS updated, (SELECT count(*) FROM i) AS inserted`,
		"stage", m.stage, "target", m.target, "names", sqlgen.List("", m.names), "key", sqlgen.Ident(m.t.Key[0]),
		"apply", apply, "ts", m.idEq("t", "s"), "update", m.upsertUpdate(apply), "jnames", sqlgen.List("j.", m.names),
		"before", before, "undo", undo, "owner", owner, "delivered", delivered)
}

// upsertDelivered returns the upsert's column of the found rows' owner
// (lineage UpdatedBy) and its CTEs recording the delivered summary
// (DeliveredSummarySQL) of the rows it finds and leaves unchanged that
// another batch last wrote: those a separate statement after it would
// find ([PGStager.recordDelivered]), decided from the upsert's own
// snapshot and without a second lookup of every staged row. Both are ""
// without a delivered table.
func (m mergeShape) upsertDelivered() (owner, ctes string) {
	if m.delivered == "" {
		return "", ""
	}
	owner = SQLf(`, t.{ub} AS _backfill_owner`, "ub", sqlgen.Ident(m.owner))
	rows := SQLf(`SELECT {jid}, j._backfill_owner FROM j WHERE j._backfill_found AND NOT j._backfill_apply AND j._backfill_owner <> $1::bigint`,
		"jid", sqlgen.List("j.", m.cc.Identity))
	x, insert := deliveredSummaryParts(m.delivered, m.cc.Identity, rows)
	return owner, ",\n" + x + ",\ndl AS (" + insert + ")"
}

// upsertUpdate is the upsert's update of the rows j decided to apply.
func (m mergeShape) upsertUpdate(apply string) string {
	if apply == "false" {
		return "SELECT WHERE false"
	}
	if m.insertOnly {
		return "SELECT 1 FROM j WHERE j._backfill_apply"
	}
	return SQLf(`UPDATE {target} t SET {sets} FROM j WHERE j._backfill_apply AND {tj} RETURNING 1`,
		"target", m.target, "sets", setList(m.cc.Written, "j"), "tj", m.idEq("t", "j"))
}

// upsertUndo returns the upsert's column of prior images and its CTE
// writing them to the undo log: the prior image of every row updated, in
// the same statement and transaction. Inserted rows are not logged:
// their lineage (InsertedBy) finds them. Both are "" without an undo log.
func (m mergeShape) upsertUndo(apply string) (before, cte string) {
	if m.undo == "" {
		return "", ""
	}
	before = SQLf(`, CASE WHEN coalesce({apply}, false) THEN to_jsonb(t.*) END AS _backfill_before`, "apply", apply)
	cte = SQLf(`,
uu AS (INSERT INTO {undo} (batch_id, seq, op, key, before) SELECT $1::bigint, $2::int, 'update', {key}, j._backfill_before FROM j WHERE j._backfill_apply)`,
		"undo", m.undo, "key", keyJSON("j", m.cc.Identity))
	return before, cte
}

// disagreed counts, for TargetWins on a target with lineage columns, the
// staged rows whose target row batch $1 (this one, another chunk) wrote
// with other content: TargetWins keeps it, so the winner between the
// chunks is the first to commit. "" for other policies or without
// lineage.
func (m mergeShape) disagreed() string {
	l := m.t.Lineage
	if m.t.Conflict != backfilltype.TargetWins || l.InsertedBy == "" && l.UpdatedBy == "" || len(m.cc.Compared) == 0 {
		return ""
	}
	var by []string
	for _, c := range []string{l.InsertedBy, l.UpdatedBy} {
		if c != "" {
			by = append(by, "t."+sqlgen.Ident(c)+" = $1::bigint")
		}
	}
	return SQLf(`SELECT count(*) FROM {stage} s JOIN {target} t ON {ts} WHERE ({by}) AND {distinct}`,
		"stage", m.stage, "target", m.target, "ts", m.idEq("t", "s"), "by", strings.Join(by, " OR "),
		"distinct", m.cc.distinct("t", "s"))
}

// upsertLockChanging locks the target rows the upsert would update, by
// its own predicate (see [PGStager.lockChanging]), and tells in the same
// pass over Staging whether the upsert has anything to do; "" when it
// updates none. It ends in "count(*) <> " and the caller appends the
// number of staged rows (a literal, so that the statement has no
// parameters and goes in the batch after the planner settings).
//
// It returns no row when every staged row found its target row unchanged
// and the count matches: the chunk is then settled, decided wholly from
// this statement's snapshot, and the upsert is not run. Each staged row is
// looked up once (a LEFT JOIN); only rows whose target row differs are
// looked up again and locked FOR UPDATE, inside CASE so the lock runs for
// them only, and each counts at least 1 whether or not the lock found it.
// The design note docs/design/merge.md explains why this is safe.
func (m mergeShape) upsertLockChanging() string {
	apply := m.apply()
	if apply == "false" {
		return ""
	}
	return SQLf(`SELECT FROM {stage} s LEFT JOIN {target} t ON {ts}
HAVING sum(CASE WHEN coalesce({apply}, false)
		THEN 1 + (SELECT count(*) FROM (SELECT 1 FROM {target} t WHERE {ts} AND {apply} FOR UPDATE OF t) x) ELSE 0 END) > 0
	OR count(*) FILTER (WHERE t.{key} IS NULL) > 0 OR count(*) <> `,
		"stage", m.stage, "target", m.target, "ts", m.idEq("t", "s"), "apply", apply, "key", sqlgen.Ident(m.t.Key[0]))
}

// historyLockChanging locks the target rows historyUpdate would change
// ([PGStager.lockChanging]); "" when it changes none.
func (m mergeShape) historyLockChanging() string {
	if len(m.cc.Written) == 0 || len(m.cc.Compared) == 0 {
		return ""
	}
	return m.lockChanging(m.cc.distinct("t", "s"))
}

// lockChanging locks, FOR UPDATE, the target rows of the staged
// identities for which cond (on staged s and target t) holds.
func (m mergeShape) lockChanging(cond string) string {
	return SQLf(`SELECT count(*) FROM (SELECT 1 FROM {stage} s JOIN {target} t ON {ts} WHERE {cond} FOR UPDATE OF t) x`,
		"stage", m.stage, "target", m.target, "ts", m.idEq("t", "s"), "cond", cond)
}

// setList is the SET list of cols, each from the same column of alias.
func setList(cols []string, alias string) string {
	sets := make([]string, len(cols))
	for i, n := range cols {
		sets[i] = sqlgen.Ident(n) + " = " + alias + "." + sqlgen.Ident(n)
	}
	return strings.Join(sets, ", ")
}

// insertAll is Upsert's fast path for loads into new ground: every staged
// row, inserted without a lookup.
func (m mergeShape) insertAll() string {
	return SQLf(`INSERT INTO {target} ({names}) SELECT {names} FROM {stage}`,
		"target", m.target, "names", sqlgen.List("", m.names), "stage", m.stage)
}

// replayCheck counts, read-only, what a replay of the merged staging rows
// would insert, update and leave unchanged (Upsert).
func (m mergeShape) replayCheck() string {
	return SQLf(`SELECT count(*) FILTER (WHERE t.{key} IS NULL) AS inserted,
	count(*) FILTER (WHERE coalesce({apply}, false)) AS updated,
	count(*) FILTER (WHERE t.{key} IS NOT NULL AND NOT coalesce({apply}, false)) AS unchanged
FROM {stage} s LEFT JOIN {target} t ON {ts}`,
		"stage", m.stage, "target", m.target, "key", sqlgen.Ident(m.t.Key[0]), "apply", m.apply(), "ts", m.idEq("t", "s"))
}

// insert inserts the staged rows whose identity is absent from the
// target (AppendOnly, Keyless; Upsert's Replay). OFFSET 0 keeps NOT
// EXISTS a lookup per staged row through the unique index: as an
// anti-join the planner may read the whole target once and compare it
// with every staged row.
func (m mergeShape) insert() string {
	return SQLf(`INSERT INTO {target} ({names}) SELECT {snames} FROM {stage} s WHERE NOT EXISTS (SELECT 1 FROM {target} t WHERE {ts} OFFSET 0)`,
		"target", m.target, "names", sqlgen.List("", m.names), "snames", sqlgen.List("s.", m.names), "stage", m.stage,
		"ts", m.idEq("t", "s"))
}

// historyUpdate rewrites the versions the chunk restates with other
// content, logging their prior images when there is an undo log; "" when
// an update would write nothing.
func (m mergeShape) historyUpdate() string {
	if len(m.cc.Written) == 0 {
		return ""
	}
	with := ""
	if m.undo != "" {
		with = SQLf(`WITH b AS (INSERT INTO {undo} (batch_id, seq, op, key, before)
	SELECT $1::bigint, $2::int, 'update', {key}, to_jsonb(t.*) FROM {target} t JOIN {stage} s ON {ts} WHERE {distinct}) `,
			"undo", m.undo, "key", keyJSON("t", m.cc.Identity), "target", m.target, "stage", m.stage, "ts", m.idEq("t", "s"),
			"distinct", m.cc.distinct("t", "s"))
	}
	return SQLf(`{with}UPDATE {target} t SET {sets} FROM {stage} s WHERE {ts} AND {distinct}`,
		"with", with, "target", m.target, "sets", setList(m.cc.Written, "s"), "stage", m.stage, "ts", m.idEq("t", "s"),
		"distinct", m.cc.distinct("t", "s"))
}

// historyKeyRows is the target's rows of the chunk's keys, one index
// lookup per distinct key. LATERAL with OFFSET 0 (which keeps the
// subquery from being pulled up into a plain join) keeps the keys on the
// outer side: as a semi-join or a join, the planner, which has no
// statistics on staging (it guesses 200 distinct keys), scanned the whole
// target in index order against every staged key to save the window's
// sort, quadratic in the chunk.
func (m mergeShape) historyKeyRows() string {
	return SQLf(`(SELECT t.* FROM (SELECT DISTINCT {key} FROM {stage}) k CROSS JOIN LATERAL (SELECT * FROM {target} t WHERE {tk} OFFSET 0) t)`,
		"key", sqlgen.List("", m.t.Key), "stage", m.stage, "target", m.target, "tk", sqlgen.Equal("t", "k", m.t.Key))
}

// historyInsert inserts the new versions. A new version ends where the
// next version of its key starts, in the target or in this chunk: the
// next valid_from among the chunk's versions and the target's versions of
// the chunk's keys, one sort of both (a window, PostgreSQL docs, 3.5
// "Window Functions"), not a lookup per staged row into staging, which
// made a History chunk quadratic.
func (m mergeShape) historyInsert() string {
	return SQLf(`INSERT INTO {target} ({names}, {vt})
SELECT {unames}, u._backfill_next FROM (
	SELECT z.*, lead(z.{vf}) OVER (PARTITION BY {zkey} ORDER BY z.{vf}) AS _backfill_next FROM (
		SELECT {snames}, true AS _backfill_staged FROM {stage} s
		UNION ALL
		SELECT {vnames}, false FROM {keyRows} v) z) u
WHERE u._backfill_staged AND NOT EXISTS (SELECT 1 FROM {target} t WHERE {tu} OFFSET 0)`,
		"target", m.target, "stage", m.stage, "names", sqlgen.List("", m.names), "unames", sqlgen.List("u.", m.names),
		"tu", m.idEq("t", "u"), "vf", sqlgen.Ident(m.t.ValidFrom), "vt", sqlgen.Ident(m.t.ValidTo),
		"zkey", sqlgen.List("z.", m.t.Key), "snames", sqlgen.List("s.", m.names), "vnames", sqlgen.List("v.", m.names),
		"keyRows", m.historyKeyRows())
}

// closeIntervals runs before the insert: the target's versions of the
// chunk's keys end where the next version starts, among them and the
// chunk's new versions (_backfill_new, those absent from the target;
// nothing changes when there are none). Closing first means the new last
// version is inserted after the old one was closed: a target with one
// open version per key (a partial unique index on the key WHERE valid_to
// IS NULL) never holds two. Closing an interval is a change by this
// batch: it sets UpdatedBy, and logs the prior image to the undo log.
func (m mergeShape) closeIntervals() string {
	vf, vt := sqlgen.Ident(m.t.ValidFrom), sqlgen.Ident(m.t.ValidTo)
	lineageSet, undo := "", ""
	if m.t.Lineage.UpdatedBy != "" {
		lineageSet = SQLf(`, {ub} = (SELECT s.{ub} FROM {stage} s LIMIT 1)`, "ub", sqlgen.Ident(m.t.Lineage.UpdatedBy), "stage", m.stage)
	}
	if m.undo != "" {
		undo = SQLf(`,
b AS (INSERT INTO {undo} (batch_id, seq, op, key, before)
	SELECT $1::bigint, $2::int, 'update', {key}, to_jsonb(t.*) FROM {target} t JOIN x ON {tx} AND t.{vf} = x.{vf}
	WHERE t.{vt} IS DISTINCT FROM x._backfill_next_from)`,
			"undo", m.undo, "key", keyJSON("t", m.cc.Identity), "target", m.target, "tx", sqlgen.Equal("t", "x", m.t.Key),
			"vf", vf, "vt", vt)
	}
	return SQLf(`{x}{undo}
UPDATE {target} t SET {vt} = x._backfill_next_from{lineageSet} FROM x
WHERE {tx} AND t.{vf} = x.{vf} AND t.{vt} IS DISTINCT FROM x._backfill_next_from`,
		"x", m.closingX(), "target", m.target, "vt", vt, "vf", vf,
		"tx", sqlgen.Equal("t", "x", m.t.Key), "lineageSet", lineageSet, "undo", undo)
}

// closingX is the WITH clause of closeIntervals and lockClosing: x, each
// version of the chunk's keys (the target's and the chunk's new ones) with
// the start of the next one.
func (m mergeShape) closingX() string {
	vf := sqlgen.Ident(m.t.ValidFrom)
	return SQLf(`WITH _backfill_new AS MATERIALIZED (SELECT {key}, {vf} FROM {stage} s WHERE NOT EXISTS (SELECT 1 FROM {target} t WHERE {ts} OFFSET 0)),
x AS (SELECT {key}, {vf}, lead({vf}) OVER (PARTITION BY {key} ORDER BY {vf}) AS _backfill_next_from FROM (
	SELECT {key}, {vf} FROM _backfill_new UNION ALL SELECT {key}, {vf} FROM {keyRows} v WHERE EXISTS (SELECT FROM _backfill_new)) _backfill_z)`,
		"target", m.target, "keyRows", m.historyKeyRows(), "key", sqlgen.List("", m.t.Key), "vf", vf,
		"stage", m.stage, "ts", m.idEq("t", "s"))
}

// lockClosing locks, FOR UPDATE, the target's versions closeIntervals
// would change, in a statement before it (as lockChanging does for the
// update): closeIntervals' snapshot, taken after the locks are granted,
// then sees their committed versions, so the prior images it logs to the
// undo log are the rows it overwrites, not older versions that a
// concurrent writer (an application's UPDATE) replaced while the merge
// waited for the row.
func (m mergeShape) lockClosing() string {
	return SQLf(`{x}
SELECT count(*) FROM (SELECT 1 FROM {target} t JOIN x ON {tx} AND t.{vf} = x.{vf}
	WHERE t.{vt} IS DISTINCT FROM x._backfill_next_from FOR UPDATE OF t) _backfill_l`,
		"x", m.closingX(), "target", m.target, "tx", sqlgen.Equal("t", "x", m.t.Key),
		"vf", sqlgen.Ident(m.t.ValidFrom), "vt", sqlgen.Ident(m.t.ValidTo))
}

// checkIntervals finds up to 5 keys of the chunk whose versions overlap
// or leave a gap (a concurrent writer of the same keys).
func (m mergeShape) checkIntervals() string {
	return SQLf(`SELECT DISTINCT {key} FROM (
	SELECT {key}, {vf}, {vt}, lead({vf}) OVER (PARTITION BY {key} ORDER BY {vf}) AS _backfill_next_from
	FROM {keyRows} v) x
WHERE {vt} IS DISTINCT FROM _backfill_next_from OR {vt} <= {vf} LIMIT 5`,
		"keyRows", m.historyKeyRows(), "key", sqlgen.List("", m.t.Key), "vf", sqlgen.Ident(m.t.ValidFrom), "vt", sqlgen.Ident(m.t.ValidTo))
}

// keyJSON builds a jsonb object of the identity columns of alias, the
// undo log's key.
func keyJSON(alias string, identity []string) string {
	parts := make([]string, len(identity))
	for i, n := range identity {
		parts[i] = pq.QuoteLiteral(n) + ", " + alias + "." + sqlgen.Ident(n)
	}
	return "jsonb_build_object(" + strings.Join(parts, ", ") + ")"
}
