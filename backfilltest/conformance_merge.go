package backfilltest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// ColumnDef is a column of a table created by [MergerHarness.CreateTable].
// Type is a PostgreSQL type: "text", "bigint" or "timestamptz" (the suite
// uses no others); fakes may ignore it.
type ColumnDef struct {
	Name, Type string
}

// MergerHarness is what [TestMerger] needs from an implementation under
// test.
type MergerHarness struct {
	Merger backfill.Merger
	DB     backfill.DB
	// CreateTable creates an empty table with the columns in order and a
	// unique index on the unique columns.
	CreateTable func(t *testing.T, table string, columns []ColumnDef, unique []string)
	// Truncate deletes every row of table.
	Truncate func(t *testing.T, table string)
	// Rows returns the committed rows of table in column order (any
	// order of rows), with text as string, bigint as int64, timestamptz
	// as time.Time in UTC and NULL as nil.
	Rows func(t *testing.T, table string) [][]any
	// AddUnique adds a unique constraint (or index) named name on columns
	// of table, besides its key. Nil skips the refusal tests.
	AddUnique func(t *testing.T, table, name string, columns []string)
	// AddCheck adds the constraint CHECK (column >= min) named name to
	// table (column bigint). Nil skips the refusal tests.
	AddCheck func(t *testing.T, table, name, column string, min int64)
	// Manifest, when set, is a manifest in DB for the runner properties
	// (RunnerProperty/...): jobs run by a [backfill.Runner] on DB with
	// Merger and Manifest, at Concurrency 1 to 8. Without it they are
	// skipped.
	Manifest backfill.Manifest
}

var (
	itemsDef   = []ColumnDef{{"tenant", "text"}, {"id", "bigint"}, {"name", "text"}}
	eventsDef  = []ColumnDef{{"event_id", "text"}, {"kind", "text"}, {"amount", "bigint"}}
	productDef = []ColumnDef{{"sku", "text"}, {"name", "text"}, {"version", "bigint"}}
	historyDef = []ColumnDef{{"customer", "text"}, {"valid_from", "timestamptz"}, {"valid_to", "timestamptz"}, {"city", "text"}}
	legacyDef  = []ColumnDef{{"name_key", "text"}, {"name", "text"}, {"city", "text"}}
)

// sortRows orders rows by their printed form, for multiset comparison.
func sortRows(rows [][]any) [][]any {
	out := slices.Clone(rows)
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]) < fmt.Sprint(out[j]) })
	return out
}

func day(n int) time.Time { return time.Date(2024, 1, n, 0, 0, 0, 0, time.UTC) }

// TestMerger is the conformance suite of [backfilldriver.Merger]: every
// mode's semantics, identical for [Merger] and the PostgreSQL merger.
// newHarness is called once per subtest (and per property-test case set).
func TestMerger(t *testing.T, newHarness func(t *testing.T) MergerHarness) {
	t.Helper()
	ctx := context.Background()
	prepare := func(t *testing.T, h MergerHarness, tg backfill.Target) backfill.TableInfo {
		t.Helper()
		info, err := h.Merger.Prepare(ctx, h.DB, tg)
		require.NoError(t, err)
		return info
	}
	merge := func(t *testing.T, h MergerHarness, info backfill.TableInfo, commit bool, rows ...[]any) backfilltype.MergeResult {
		t.Helper()
		tx, err := h.DB.Begin(ctx)
		require.NoError(t, err)
		st, err := h.Merger.Stage(ctx, tx, info)
		require.NoError(t, err)
		defer st.Close()
		for i, r := range rows {
			require.NoError(t, st.Add(ctx, int64(i+1), r))
		}
		res, err := st.Merge(ctx)
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit())
		} else {
			require.NoError(t, tx.Rollback())
		}
		return res
	}
	counts := func(r backfilltype.MergeResult) [5]int64 {
		return [5]int64{r.Inserted, r.Updated, r.Unchanged, r.Deduplicated, int64(len(r.Rejected))}
	}
	rows := func(t *testing.T, h MergerHarness, table string) [][]any {
		t.Helper()
		return sortRows(h.Rows(t, table))
	}
	items := func(t *testing.T, h MergerHarness) backfill.Target {
		h.CreateTable(t, "items", itemsDef, []string{"tenant", "id"})
		return backfill.Target{Table: "items", Key: []string{"tenant", "id"}, Columns: []string{"tenant", "id", "name"}}
	}

	t.Run("UpsertInsertReplayUpdate", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		info := prepare(t, h, items(t, h))
		require.Equal(t, backfill.Upsert, info.Target.Mode)
		require.Equal(t, backfill.KeepLast, info.Target.Duplicates)
		require.Equal(t, backfill.SourceWins, info.Target.Conflict)
		require.Equal(t, 3, info.Written)
		require.Len(t, info.Columns, 3)
		require.True(t, info.Columns[0].Key)
		require.False(t, info.Columns[2].Key)
		in := [][]any{{"a", int64(1), "x"}, {"a", int64(2), nil}, {"b", int64(1), "z"}}
		require.Equal(t, [5]int64{3, 0, 0, 0, 0}, counts(merge(t, h, info, true, in...)))
		require.Equal(t, [5]int64{0, 0, 3, 0, 0}, counts(merge(t, h, info, true, in...)), "replay writes nothing")
		changed := [][]any{{"a", int64(1), "x2"}, {"a", int64(2), "now set"}, {"b", int64(1), "z"}, {"c", int64(9), "new"}}
		require.Equal(t, [5]int64{1, 2, 1, 0, 0}, counts(merge(t, h, info, true, changed...)))
		require.Equal(t, [][]any{{"a", int64(1), "x2"}, {"a", int64(2), "now set"}, {"b", int64(1), "z"}, {"c", int64(9), "new"}}, rows(t, h, "items"))
		back := []any{"a", int64(2), nil}
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, back)), "value to NULL is a change")
		require.Equal(t, [5]int64{0, 0, 1, 0, 0}, counts(merge(t, h, info, true, back)), "NULL to NULL is not")
	})

	t.Run("UpsertComparesWhatTableInfoComparedSays", func(t *testing.T) {
		// The columns the library fills (ingestion time, lineage) are
		// written but never compared, and an update keeps the batch that
		// inserted the row: TableInfo.Compared is the one definition.
		h := newHarness(t)
		h.CreateTable(t, "stamped", append(slices.Clone(itemsDef), ColumnDef{"inserted_by", "bigint"}, ColumnDef{"updated_by", "bigint"},
			ColumnDef{"ingested_at", "timestamptz"}), []string{"tenant", "id"})
		info := prepare(t, h, backfill.Target{Table: "stamped", Key: []string{"tenant", "id"}, Columns: []string{"tenant", "id", "name"},
			IngestedAt: "ingested_at", Lineage: backfill.Lineage{InsertedBy: "inserted_by", UpdatedBy: "updated_by"}})
		cc := pgstore.CompareColumns(info)
		require.Equal(t, []string{"name"}, cc.Tracked)
		require.Equal(t, []string{"name"}, cc.Compared)
		require.Equal(t, []string{"name", "ingested_at", "updated_by"}, cc.Written)
		// Staged in info.Columns order: written, ingested_at, inserted_by, updated_by.
		require.Equal(t, [5]int64{1, 0, 0, 0, 0}, counts(merge(t, h, info, true, []any{"a", int64(1), "x", day(1), int64(1), int64(1)})))
		require.Equal(t, [5]int64{0, 0, 1, 0, 0}, counts(merge(t, h, info, true, []any{"a", int64(1), "x", day(2), int64(2), int64(2)})),
			"another batch delivering the same content changes nothing")
		require.Equal(t, [][]any{{"a", int64(1), "x", int64(1), int64(1), day(1)}}, rows(t, h, "stamped"))
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, []any{"a", int64(1), "y", day(3), int64(3), int64(3)})))
		require.Equal(t, [][]any{{"a", int64(1), "y", int64(1), int64(3), day(3)}}, rows(t, h, "stamped"), "the update keeps inserted_by")
	})

	t.Run("UpsertRespelledValuesAreTheSameRow", func(t *testing.T) {
		// The equality rule (package backfill, "Equality"): a key or a
		// value written as another Go type or in another zone that
		// PostgreSQL stores as the same value is the same row with the
		// same content, in a chunk and across chunks.
		t.Parallel()
		h := newHarness(t)
		h.CreateTable(t, "spelled", []ColumnDef{{"id", "bigint"}, {"at", "timestamptz"}, {"name", "text"}, {"qty", "bigint"}}, []string{"id", "at"})
		info := prepare(t, h, backfill.Target{Table: "spelled", Key: []string{"id", "at"}})
		east := time.FixedZone("UTC+2", 2*3600)
		require.Equal(t, [5]int64{1, 0, 0, 0, 0}, counts(merge(t, h, info, true, []any{int64(1), day(1), "x", int64(5)})))
		require.Equal(t, [5]int64{0, 0, 1, 0, 0}, counts(merge(t, h, info, true, []any{1, day(1).In(east), "x", int32(5)})),
			"an int for a bigint, another zone: the same row, unchanged")
		require.Equal(t, [5]int64{0, 0, 1, 1, 0}, counts(merge(t, h, info, true, []any{int32(1), day(1), "x", 5}, []any{int64(1), day(1).In(east), "x", int64(5)})),
			"two spellings of one key in a chunk are duplicates")
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, []any{1, day(1).In(east), "x", 6})))
		got := rows(t, h, "spelled")
		require.Len(t, got, 1)
		require.EqualValues(t, 6, got[0][3], "the update wrote qty")
	})

	t.Run("UpsertDuplicatesInAChunk", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		tg := items(t, h)
		for _, p := range []backfill.DuplicatePolicy{backfill.KeepLast, backfill.KeepFirst} {
			tg.Duplicates = p
			info := prepare(t, h, tg)
			res := merge(t, h, info, true, []any{"d", int64(1), "first-" + string(p)}, []any{"d", int64(2), "other"},
				[]any{"d", int64(1), "second-" + string(p)}, []any{"d", int64(1), "third-" + string(p)})
			want := "third-" + string(p)
			if p == backfill.KeepFirst {
				want = "first-" + string(p)
			}
			require.Equal(t, int64(2), res.Deduplicated, p)
			require.Equal(t, int64(4), res.Inserted+res.Updated+res.Unchanged+res.Deduplicated)
			require.Contains(t, h.Rows(t, "items"), []any{"d", int64(1), want}, p)
		}
	})

	t.Run("UpsertTargetWins", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		tg := items(t, h)
		tg.Conflict = backfill.TargetWins
		info := prepare(t, h, tg)
		merge(t, h, info, true, []any{"a", int64(1), "original"})
		require.Equal(t, [5]int64{1, 0, 1, 0, 0}, counts(merge(t, h, info, true, []any{"a", int64(1), "changed"}, []any{"a", int64(2), "new"})))
		require.Equal(t, [][]any{{"a", int64(1), "original"}, {"a", int64(2), "new"}}, rows(t, h, "items"))
	})

	t.Run("UpsertNewerVersionWins", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		h.CreateTable(t, "products", productDef, []string{"sku"})
		tg := backfill.Target{Table: "products", Key: []string{"sku"}, Conflict: backfill.NewerVersionWins, Version: "version"}
		info := prepare(t, h, tg)
		require.Equal(t, []string{"sku", "name", "version"}, []string{info.Columns[0].Name, info.Columns[1].Name, info.Columns[2].Name})
		require.Equal(t, [5]int64{1, 0, 0, 0, 0}, counts(merge(t, h, info, true, []any{"p1", "v2", int64(2)})))
		require.Equal(t, [5]int64{0, 0, 1, 0, 0}, counts(merge(t, h, info, true, []any{"p1", "v1", int64(1)})), "older version loses")
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, []any{"p1", "v3", int64(3)})), "newer version wins")
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, []any{"p1", "x3", int64(3)})), "tie: greater content wins")
		require.Equal(t, [5]int64{0, 0, 1, 0, 0}, counts(merge(t, h, info, true, []any{"p1", "a3", int64(3)})), "tie: lesser content loses")
		require.Equal(t, [5]int64{1, 0, 0, 0, 0}, counts(merge(t, h, info, true, []any{"p2", "unversioned", nil})))
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, []any{"p2", "versioned", int64(1)})), "any version beats NULL")
		require.Equal(t, [5]int64{0, 0, 1, 0, 0}, counts(merge(t, h, info, true, []any{"p2", "zzz", nil})), "NULL loses to any version")
		res := merge(t, h, info, true, []any{"p9", "b", int64(1)}, []any{"p9", "c", int64(3)}, []any{"p9", "a", int64(2)})
		require.Equal(t, [5]int64{1, 0, 0, 2, 0}, counts(res), "in a chunk, the newest version survives")
		require.Equal(t, [][]any{{"p1", "x3", int64(3)}, {"p2", "versioned", int64(1)}, {"p9", "c", int64(3)}}, rows(t, h, "products"))
	})

	t.Run("AppendOnly", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		h.CreateTable(t, "events", eventsDef, []string{"event_id"})
		info := prepare(t, h, backfill.Target{Table: "events", Key: []string{"event_id"}, Mode: backfill.AppendOnly})
		require.Equal(t, [5]int64{2, 0, 0, 0, 0}, counts(merge(t, h, info, true, []any{"e1", "a", int64(1)}, []any{"e2", "b", int64(2)})))
		require.Equal(t, [5]int64{0, 0, 2, 0, 0}, counts(merge(t, h, info, true, []any{"e1", "a", int64(1)}, []any{"e2", "b", int64(2)})), "a replay resolves to the existing events")
		res := merge(t, h, info, true, []any{"e3", "c", int64(3)}, []any{"e1", "a", int64(999)})
		require.Equal(t, [5]int64{1, 0, 0, 0, 1}, counts(res))
		rej := res.Rejected[0]
		require.Equal(t, int64(2), rej.Row)
		require.Equal(t, "amount", rej.Column)
		require.Contains(t, rej.Reason, "conflicting content for existing event")
		require.Contains(t, rej.Value, "e1")
		require.Contains(t, string(rej.Raw), "999")
		res = merge(t, h, info, true, []any{"e4", "x", int64(1)}, []any{"e4", "x", int64(1)}, []any{"e4", "y", int64(2)})
		require.Equal(t, [5]int64{1, 0, 0, 1, 1}, counts(res), "same event twice in a chunk: duplicate; with other content: conflict")
		require.Equal(t, int64(3), res.Rejected[0].Row)
		require.Equal(t, "kind,amount", res.Rejected[0].Column)
		require.Equal(t, [][]any{{"e1", "a", int64(1)}, {"e2", "b", int64(2)}, {"e3", "c", int64(3)}, {"e4", "x", int64(1)}}, rows(t, h, "events"),
			"conflicting events never overwrite")
	})

	t.Run("History", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		h.CreateTable(t, "addresses", historyDef, []string{"customer", "valid_from"})
		info := prepare(t, h, backfill.Target{Table: "addresses", Key: []string{"customer"}, Mode: backfill.History})
		require.Equal(t, "valid_from", info.Target.ValidFrom)
		require.Equal(t, "valid_to", info.Target.ValidTo)
		require.Equal(t, 3, info.Written, "valid_to is not written")
		require.Equal(t, [5]int64{2, 0, 0, 0, 0}, counts(merge(t, h, info, true, []any{"c1", day(1), "A"}, []any{"c1", day(3), "C"})))
		require.Equal(t, [][]any{{"c1", day(1), day(3), "A"}, {"c1", day(3), nil, "C"}}, rows(t, h, "addresses"))
		res := merge(t, h, info, true, []any{"c1", day(2), "B"})
		require.Equal(t, [5]int64{1, 0, 0, 0, 0}, counts(res), "a late version is inserted")
		require.Equal(t, int64(1), res.Closed, "splitting the interval it falls into")
		require.Equal(t, [][]any{{"c1", day(1), day(2), "A"}, {"c1", day(2), day(3), "B"}, {"c1", day(3), nil, "C"}}, rows(t, h, "addresses"))
		require.Equal(t, [5]int64{0, 0, 1, 0, 0}, counts(merge(t, h, info, true, []any{"c1", day(2), "B"})), "an identical replay adds no version")
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, []any{"c1", day(2), "B2"})), "same valid_from, other content: a correction")
		require.Equal(t, [5]int64{2, 0, 0, 0, 0}, counts(merge(t, h, info, true, []any{"c1", day(0), "Z"}, []any{"c2", day(5), nil})))
		require.Equal(t, [5]int64{0, 0, 1, 0, 0}, counts(merge(t, h, info, true, []any{"c2", day(5), nil})), "NULL to NULL is no change")
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, []any{"c2", day(5), "X"})), "NULL to value is a change")
		require.Equal(t, [5]int64{0, 1, 0, 0, 0}, counts(merge(t, h, info, true, []any{"c2", day(5), nil})), "value to NULL is a change")
		require.Equal(t, [][]any{
			{"c1", day(0), day(1), "Z"}, {"c1", day(1), day(2), "A"}, {"c1", day(2), day(3), "B2"}, {"c1", day(3), nil, "C"},
			{"c2", day(5), nil, nil},
		}, rows(t, h, "addresses"))
		res = merge(t, h, info, true, []any{"c3", day(9), "late"}, []any{"c3", day(7), "early"}, []any{"c3", day(9), "later"})
		require.Equal(t, [5]int64{2, 0, 0, 1, 0}, counts(res), "a repeated (key, valid_from) in a chunk: the last row wins")
		require.Contains(t, h.Rows(t, "addresses"), []any{"c3", day(7), day(9), "early"})
		require.Contains(t, h.Rows(t, "addresses"), []any{"c3", day(9), nil, "later"})
	})

	t.Run("Keyless", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		h.CreateTable(t, "legacy", legacyDef, []string{"name_key"})
		tg := backfill.Target{Table: "legacy", Key: []string{"name_key"}, Mode: backfill.Keyless,
			Derive: []backfill.KeyRule{{Column: "name_key", From: "name", Rules: []backfill.Normalizer{backfill.Trim, backfill.CaseFold}}}}
		info := prepare(t, h, tg)
		require.Equal(t, 2, info.Written, "the derived key is not written")
		require.Equal(t, "name_key", info.Columns[2].Name)
		require.Equal(t, "derive", info.Columns[2].Computed)
		// Values as the runner stages them: written columns, then the derived key.
		res := merge(t, h, info, true,
			[]any{"Ann", "Oslo", "ann"}, []any{" ANN", "Oslo", "ann"},
			[]any{"Bob", "Rome", "bob"}, []any{"bob", "Paris", "bob"},
			[]any{"Cy", "Lima", "cy"})
		require.Equal(t, [5]int64{2, 0, 0, 1, 2}, counts(res), "identical content: a duplicate; different content: every row is ambiguous")
		require.ElementsMatch(t, []int64{3, 4}, []int64{res.Rejected[0].Row, res.Rejected[1].Row})
		require.Contains(t, res.Rejected[0].Reason, "ambiguous derived key")
		res = merge(t, h, info, true, []any{"ann", "Bergen", "ann"}, []any{"CY", "Lima", "cy"})
		require.Equal(t, [5]int64{0, 0, 1, 0, 1}, counts(res), "a different row under an existing derived key is ambiguous too")
		require.Contains(t, res.Rejected[0].Reason, "ambiguous derived key")
		require.Equal(t, [][]any{{"ann", "Ann", "Oslo"}, {"cy", "Cy", "Lima"}}, rows(t, h, "legacy"))
	})

	t.Run("RollbackLeavesTheTargetAlone", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		info := prepare(t, h, items(t, h))
		merge(t, h, info, true, []any{"a", int64(1), "kept"})
		res := merge(t, h, info, false, []any{"a", int64(1), "rolled back"}, []any{"a", int64(2), "rolled back"})
		require.Equal(t, [5]int64{1, 1, 0, 0, 0}, counts(res))
		require.Equal(t, [][]any{{"a", int64(1), "kept"}}, rows(t, h, "items"))
		require.Equal(t, backfilltype.MergeResult{}, merge(t, h, info, true), "an empty chunk merges nothing")
	})

	t.Run("PrepareErrors", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		tg := items(t, h)
		h.CreateTable(t, "addresses", historyDef, []string{"customer", "valid_from"})
		bad := []struct {
			name   string
			mutate func(*backfill.Target)
			want   error
			text   string
		}{
			{"unknown table", func(t *backfill.Target) { t.Table = "no_such_table" }, backfill.ErrTargetNotFound, "no_such_table"},
			{"table name with two unquoted dots", func(t *backfill.Target) { t.Table = "public.items.x" }, backfill.ErrInvalidConfig, "public.items.x"},
			{"table name with an unterminated quote", func(t *backfill.Target) { t.Table = `"items` }, backfill.ErrInvalidConfig, "unterminated"},
			{"unknown column", func(t *backfill.Target) { t.Columns = []string{"tenant", "id", "no_such_column"} }, backfill.ErrTargetNotFound, "no_such_column"},
			{"key without index", func(t *backfill.Target) { t.Key = []string{"tenant"} }, backfill.ErrNoUniqueKey, "tenant"},
			{"key not written", func(t *backfill.Target) { t.Columns = []string{"tenant", "name"} }, backfill.ErrInvalidConfig, `"id"`},
			{"newer wins without version", func(t *backfill.Target) { t.Conflict = backfill.NewerVersionWins }, backfill.ErrInvalidConfig, "Version"},
			{"version is a key", func(t *backfill.Target) { t.Conflict, t.Version = backfill.NewerVersionWins, "id" }, backfill.ErrInvalidConfig, "Version"},
			{"conflict outside upsert", func(t *backfill.Target) { t.Mode, t.Conflict = backfill.AppendOnly, backfill.TargetWins }, backfill.ErrInvalidConfig, "Conflict"},
			{"keyless without rule", func(t *backfill.Target) { t.Mode = backfill.Keyless }, backfill.ErrInvalidConfig, "Derive"},
			{"history key includes valid_from", func(t *backfill.Target) {
				*t = backfill.Target{Table: "addresses", Key: []string{"customer", "valid_from"}, Mode: backfill.History}
			}, backfill.ErrInvalidConfig, "ValidFrom"},
			{"history valid_from and valid_to of different types", func(t *backfill.Target) {
				*t = backfill.Target{Table: "items", Key: []string{"tenant"}, Mode: backfill.History, ValidFrom: "id", ValidTo: "name"}
			}, backfill.ErrInvalidConfig, ""},
		}
		for _, b := range bad {
			tc := tg
			tc.Columns = slices.Clone(tg.Columns)
			b.mutate(&tc)
			_, err := h.Merger.Prepare(ctx, h.DB, tc)
			require.ErrorIs(t, err, b.want, b.name)
			require.Contains(t, err.Error(), b.text, b.name)
		}
		tc := tg
		tc.Columns = nil
		info, err := h.Merger.Prepare(ctx, h.DB, tc)
		require.NoError(t, err)
		require.Len(t, info.Columns, 3, "empty Columns means all columns")
	})

	// Property: for every mode, merging any permutation of the same chunks,
	// any number of times, yields the same final table.
	permutation := func(t *testing.T, name string, def []ColumnDef, unique []string, tg backfill.Target, gen func(*rapid.T, int) []any) {
		t.Run("PermutationProperty/"+name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.CreateTable(t, name+"_a", def, unique)
			h.CreateTable(t, name+"_b", def, unique)
			n := 0
			rapid.Check(t, func(rt *rapid.T) {
				nChunks := rapid.IntRange(1, 4).Draw(rt, "chunks")
				chunks := make([][][]any, nChunks)
				for i := range chunks {
					size := rapid.IntRange(0, 6).Draw(rt, "size")
					for range size {
						chunks[i] = append(chunks[i], gen(rt, i))
					}
				}
				final := func(order []int, repeat int) [][]any {
					n++
					table := name + "_a"
					if n%2 == 0 {
						table = name + "_b"
					}
					h.Truncate(t, table)
					tg := tg
					tg.Table = table
					info, err := h.Merger.Prepare(ctx, h.DB, tg)
					require.NoError(rt, err)
					for range repeat {
						for _, i := range order {
							res := merge(t, h, info, true, chunks[i]...)
							require.Equal(rt, int64(len(chunks[i])), res.Inserted+res.Updated+res.Unchanged+res.Deduplicated+int64(len(res.Rejected)))
						}
					}
					return sortRows(h.Rows(t, table))
				}
				identity := make([]int, nChunks)
				for i := range identity {
					identity[i] = i
				}
				want := final(identity, 1)
				perm := rapid.Permutation(identity).Draw(rt, "order")
				got := final(perm, rapid.IntRange(1, 2).Draw(rt, "repeat"))
				if d := cmp.Diff(want, got); d != "" {
					rt.Fatalf("order %v gives another table (-want +got):\n%s", perm, d)
				}
			})
		})
	}
	// Content is a function of the identity, so that replays agree; the
	// identities repeat across and within chunks.
	permutation(t, "append_only", eventsDef, []string{"event_id"},
		backfill.Target{Key: []string{"event_id"}, Mode: backfill.AppendOnly},
		func(rt *rapid.T, _ int) []any {
			id := rapid.IntRange(0, 5).Draw(rt, "id")
			return []any{fmt.Sprintf("e%d", id), fmt.Sprintf("k%d", id%2), int64(id * 10)}
		})
	permutation(t, "newer_wins", productDef, []string{"sku"},
		backfill.Target{Key: []string{"sku"}, Conflict: backfill.NewerVersionWins, Version: "version"},
		func(rt *rapid.T, _ int) []any {
			var v any
			if x := rapid.IntRange(0, 3).Draw(rt, "version"); x > 0 {
				v = int64(x)
			}
			return []any{fmt.Sprintf("p%d", rapid.IntRange(0, 3).Draw(rt, "sku")), rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "name"), v}
		})
	permutation(t, "history", historyDef, []string{"customer", "valid_from"},
		backfill.Target{Key: []string{"customer"}, Mode: backfill.History},
		func(rt *rapid.T, _ int) []any {
			c := rapid.IntRange(0, 2).Draw(rt, "customer")
			d := rapid.IntRange(1, 6).Draw(rt, "day")
			var city any
			if (c+d)%3 != 0 {
				city = fmt.Sprintf("city%d", (c*d)%4)
			}
			return []any{fmt.Sprintf("c%d", c), day(d), city}
		})
	permutation(t, "upsert_disjoint", itemsDef, []string{"tenant", "id"},
		backfill.Target{Key: []string{"tenant", "id"}},
		func(rt *rapid.T, chunk int) []any {
			// Chunks own disjoint keys, as a chunked source's do; within a
			// chunk the last row of a key wins.
			id := int64(chunk*10 + rapid.IntRange(0, 3).Draw(rt, "id"))
			return []any{"t", id, rapid.SampledFrom([]string{"x", "y"}).Draw(rt, "name")}
		})
	permutation(t, "keyless", legacyDef, []string{"name_key"},
		backfill.Target{Key: []string{"name_key"}, Mode: backfill.Keyless,
			Derive: []backfill.KeyRule{{Column: "name_key", From: "name", Rules: []backfill.Normalizer{backfill.CaseFold}}}},
		func(rt *rapid.T, _ int) []any {
			k := rapid.IntRange(0, 3).Draw(rt, "k")
			name := fmt.Sprintf("Name%d", k)
			return []any{name, fmt.Sprintf("city%d", k), strings.ToLower(name)}
		})
	testRefusals(t, newHarness)
	runnerProperties(t, newHarness)
	testMergerCapabilities(t, newHarness)
	testUndoRollback(t, newHarness)
}
