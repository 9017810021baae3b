package backfill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestTargetFingerprintSeesEveryChange: the target fingerprint of a chunk
// (the rows within its ChunkColumn bounds) over their values (a target
// that is not a heap table's) is a function of those rows' content:
// recomputing it, or rewriting a row with its own value, keeps it;
// changing a value, setting one to NULL, deleting a row or adding one
// inside the bounds changes it, and only that chunk's; restoring the rows
// restores it. Over their row versions (a heap table's, the default),
// every write to one of the chunk's rows changes it, a rewrite with the
// same values and a restore too, and only that chunk's; recomputing it
// keeps it. A replay that skips on a matching fingerprint therefore
// never misses a changed target.
func TestTargetFingerprintSeesEveryChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE fp (id int PRIMARY KEY, grp bigint NOT NULL, amount numeric(12,2), note text, at timestamptz)`)
	db.MustExec(`INSERT INTO fp SELECT i, i, i * 1.25, 'n' || i, '2024-03-01'::timestamptz + i * interval '1 hour' FROM generate_series(0, 19) i`)
	var info TableInfo
	require.NoError(t, pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var err error
		info, err = pgstore.NewMerger().Prepare(ctx, tx, Target{Table: "fp", Key: []string{"id"}, Columns: []string{"id", "grp", "amount", "note", "at"}})
		return err
	}))
	require.True(t, info.TupleIdentity, "a heap table")
	chunks := []Chunk{{ID: "int:0/10", Seq: 0, Kind: backfilltype.KindInt, Lo: 0, Hi: 10}, {ID: "int:10/20", Seq: 1, Kind: backfilltype.KindInt, Lo: 10, Hi: 20}}
	fps := func() [2]pgstore.Fingerprint {
		t.Helper()
		var out [2]pgstore.Fingerprint
		require.NoError(t, pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
			for i, c := range chunks {
				fp, err := pgstore.TargetFingerprint(ctx, tx, info, "grp", nil, c)
				if err != nil {
					return err
				}
				out[i] = fp
			}
			return nil
		}))
		return out
	}
	changes := []struct{ name, do, undo string }{
		{"a changed text", `UPDATE fp SET note = 'changed' WHERE id = 3`, `UPDATE fp SET note = 'n3' WHERE id = 3`},
		{"a changed numeric", `UPDATE fp SET amount = amount + 0.01 WHERE id = 3`, `UPDATE fp SET amount = 3.75 WHERE id = 3`},
		{"a changed instant", `UPDATE fp SET at = at + interval '1 microsecond' WHERE id = 3`, `UPDATE fp SET at = '2024-03-01'::timestamptz + interval '3 hours' WHERE id = 3`},
		{"a value set to NULL", `UPDATE fp SET note = NULL WHERE id = 3`, `UPDATE fp SET note = 'n3' WHERE id = 3`},
		{"two values swapped between rows", `UPDATE fp SET note = CASE id WHEN 3 THEN 'n4' ELSE 'n3' END WHERE id IN (3, 4)`, `UPDATE fp SET note = 'n' || id WHERE id IN (3, 4)`},
		{"a deleted row", `DELETE FROM fp WHERE id = 3`, `INSERT INTO fp VALUES (3, 3, 3.75, 'n3', '2024-03-01'::timestamptz + interval '3 hours')`},
		{"an added row", `INSERT INTO fp VALUES (100, 5, 1, 'x', NULL)`, `DELETE FROM fp WHERE id = 100`},
		{"a duplicated row content under another key", `INSERT INTO fp SELECT 101, grp, amount, note, at FROM fp WHERE id = 3`, `DELETE FROM fp WHERE id = 101`},
	}

	// Row versions: every write of a row changes the chunk's fingerprint
	// to one not seen before; only deleting an added row goes back to the
	// state before it (the same row versions).
	base := fps()
	require.Equal(t, int64(10), base[0].Rows)
	require.Equal(t, int64(10), base[1].Rows)
	require.NotEqual(t, base[0], base[1])
	require.Equal(t, base, fps(), "recomputed")
	seen := map[pgstore.Fingerprint]string{base[0]: "base"}
	for _, change := range append(changes, struct{ name, do, undo string }{"a row rewritten with its own values", `UPDATE fp SET note = note WHERE id = 3`, ""}) {
		before := fps()[0]
		for _, step := range []struct{ what, sql string }{{change.name, change.do}, {change.name + " undone", change.undo}} {
			if step.sql == "" {
				continue
			}
			db.MustExec(step.sql)
			got := fps()
			if strings.HasPrefix(step.sql, "DELETE FROM fp WHERE id = 10") {
				require.Equal(t, before, got[0], "%s: the chunk's rows are the versions before the insert", step.what)
			} else {
				require.NotContains(t, seen, got[0], "%s: the changed chunk's fingerprint is one seen before", step.what)
			}
			seen[got[0]] = step.what
			require.Equal(t, base[1], got[1], "%s: the other chunk's fingerprint", step.what)
		}
	}

	// Values: a function of the rows' content.
	info.TupleIdentity = false
	base = fps()
	require.NotEqual(t, base[0], base[1])
	require.Equal(t, base, fps(), "recomputed")
	db.MustExec(`UPDATE fp SET note = note, amount = amount`)
	require.Equal(t, base, fps(), "rows rewritten with their own values")
	for _, change := range changes {
		db.MustExec(change.do)
		got := fps()
		require.NotEqual(t, base[0], got[0], "%s: the changed chunk's fingerprint", change.name)
		require.Equal(t, base[1], got[1], "%s: the other chunk's fingerprint", change.name)
		db.MustExec(change.undo)
		require.Equal(t, base, fps(), "%s undone", change.name)
	}

	require.NoError(t, pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := pgstore.TargetFingerprint(ctx, tx, info, "", nil, chunks[0])
		require.True(t, errors.Is(err, ErrUnsupported), "no ChunkColumn: %v", err)
		_, err = pgstore.TargetFingerprint(ctx, tx, info, "nope", nil, chunks[0])
		require.True(t, errors.Is(err, ErrInvalidConfig), "unknown ChunkColumn: %v", err)
		return nil
	}))
}

// TestSourceFingerprintIsAMultisetHash: the source fingerprint of a
// chunk's converted rows does not depend on their order, tells a changed
// value, a value moved to another column, an added or a repeated row
// apart (a value in another form too: the chunk is then merged).
func TestSourceFingerprintIsAMultisetHash(t *testing.T) {
	t.Parallel()
	info := TableInfo{Written: 4, Columns: []Column{
		{Name: "id", BaseType: "int8", Key: true}, {Name: "a", BaseType: "text"}, {Name: "b", BaseType: "text"}, {Name: "amount", BaseType: "numeric"},
	}}
	of := func(rows [][]any) string {
		var f pgstore.ChunkFingerprint
		for _, r := range rows {
			f.Add(info.Columns[:info.Written], r)
		}
		return f.String()
	}
	text := rapid.OneOf(rapid.Just[any](nil), rapid.Map(rapid.StringMatching(`[ab]{0,3}`), func(s string) any { return s }))
	row := rapid.Custom(func(rt *rapid.T) []any {
		return []any{rapid.Int64Range(0, 5).Draw(rt, "id"), text.Draw(rt, "a"), text.Draw(rt, "b"),
			rapid.SampledFrom([]any{nil, "1", "1.5", "-2.25"}).Draw(rt, "amount")}
	})
	rapid.Check(t, func(rt *rapid.T) {
		rows := rapid.SliceOfN(row, 1, 8).Draw(rt, "rows")
		f := of(rows)
		perm := rapid.Permutation(rows).Draw(rt, "perm")
		if of(perm) != f {
			rt.Fatalf("order changed the fingerprint")
		}
		if of(append(append([][]any{}, rows...), rows[0])) == f {
			rt.Fatalf("a repeated row did not change the fingerprint")
		}
		// Change one value of one row to a different one.
		i := rapid.IntRange(0, len(rows)-1).Draw(rt, "row")
		col := rapid.IntRange(0, 3).Draw(rt, "col")
		changed := make([][]any, len(rows))
		for j, r := range rows {
			changed[j] = append([]any{}, r...)
		}
		switch v := changed[i][col].(type) {
		case int64:
			changed[i][col] = v + 1
		case string:
			changed[i][col] = v + "z"
		case nil:
			if col == 3 {
				changed[i][col] = "0"
			} else {
				changed[i][col] = ""
			}
		}
		if of(changed) == f {
			rt.Fatalf("changing row %d column %d (%v -> %v) did not change the fingerprint", i, col, rows[i][col], changed[i][col])
		}
		// Swap a and b of one row, when they differ.
		a, b := rows[i][1], rows[i][2]
		if a != b {
			swapped := append([][]any{}, rows...)
			swapped[i] = []any{rows[i][0], b, a, rows[i][3]}
			if of(swapped) == f {
				rt.Fatalf("swapping columns a and b (%v, %v) did not change the fingerprint", a, b)
			}
		}
	})
	// Times: a microsecond apart, or the same instant in another zone
	// (another form: merged, never skipped wrongly).
	info.Columns[3] = Column{Name: "at", BaseType: "timestamptz"}
	paris, err := time.LoadLocation("Europe/Paris")
	require.NoError(t, err)
	at := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	require.Equal(t, of([][]any{{int64(1), "x", nil, at}}), of([][]any{{int64(1), "x", nil, at.Add(0)}}))
	require.NotEqual(t, of([][]any{{int64(1), "x", nil, at}}), of([][]any{{int64(1), "x", nil, at.In(paris)}}))
	require.NotEqual(t, of([][]any{{int64(1), "x", nil, at}}), of([][]any{{int64(1), "x", nil, at.Add(time.Microsecond)}}))
}

// TestTargetFingerprintFollowsRuns: the premise of a skip, on the real
// merge with lineage and an ingestion time: a replay of unchanged data
// (Job.NewRun) leaves every chunk's target fingerprint as its load left
// it, so a later replay can compare against it; a restatement that
// changes one source row changes its chunk's fingerprint only.
func TestTargetFingerprintFollowsRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE fr (id bigint PRIMARY KEY, note text, amount numeric(12,2), ingested timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	changed := int64(-1)
	job := func(newRun bool) Job {
		return Job{
			Name: "fr", Chunker: IntRange(0, 30, 10), ChunkColumn: "id", NewRun: newRun, Rollback: RollbackNone,
			Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
				for id := c.Lo; id < c.Hi; id++ {
					note := "n"
					if id == changed {
						note = "restated"
					}
					if err := w.Write(ctx, id, note, "1.50"); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: Target{Table: "fr", Key: []string{"id"}, Columns: []string{"id", "note", "amount"}, IngestedAt: "ingested"},
		}
	}
	r, err := New(db, &Config{Concurrency: 1})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job(false))
	require.NoError(t, err)
	require.Equal(t, int64(30), rep.Counts.Inserted)
	var info TableInfo
	require.NoError(t, pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var err error
		info, err = pgstore.NewMerger().Prepare(ctx, tx, Target{Table: "fr", Key: []string{"id"}, Columns: []string{"id", "note", "amount"}, IngestedAt: "ingested"})
		return err
	}))
	require.NotEmpty(t, info.Target.Lineage.UpdatedBy, "the default lineage columns are used")
	fps := func() []pgstore.Fingerprint {
		t.Helper()
		var out []pgstore.Fingerprint
		require.NoError(t, pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
			for i := range int64(3) {
				fp, err := pgstore.TargetFingerprint(ctx, tx, info, "id", nil, Chunk{ID: fmt.Sprintf("int:%d/%d", i*10, i*10+10), Seq: int(i), Kind: backfilltype.KindInt, Lo: i * 10, Hi: i*10 + 10})
				if err != nil {
					return err
				}
				out = append(out, fp)
			}
			return nil
		}))
		return out
	}
	loaded := fps()

	rep, err = r.Run(ctx, job(true))
	require.NoError(t, err)
	require.Equal(t, int64(30), rep.Counts.Unchanged)
	require.Equal(t, loaded, fps(), "an unchanged replay leaves the target fingerprints")

	changed = 15
	rep, err = r.Run(ctx, job(true))
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.Counts.Updated)
	after := fps()
	require.Equal(t, loaded[0], after[0])
	require.NotEqual(t, loaded[1], after[1], "the restated chunk")
	require.Equal(t, loaded[2], after[2])
}

// TestSourceEncodingKeepsEveryInstant: the source row encoding of a time
// tells apart any two instants of years 1 to 9999, those 2^64 ns apart
// (where UnixNano wraps) among them, and encodes the same instant in the
// same zone alike.
func TestSourceEncodingKeepsEveryInstant(t *testing.T) {
	t.Parallel()
	info := TableInfo{Columns: []Column{{Name: "t", BaseType: "timestamptz"}}, Written: 1}
	enc := func(x time.Time) string { return string(pgstore.EncodeSourceRow(nil, info.Columns, []any{x})) }
	const lo, hi = -62135596800, 253402300799       // 0001-01-01 and 9999-12-31T23:59:59, UTC
	wrap := func(x time.Time, sign int) time.Time { // x ± 2^64 ns
		for range 4 {
			x = x.Add(time.Duration(sign) * (1 << 62))
		}
		return x
	}
	rapid.Check(t, func(rt *rapid.T) {
		a := time.Unix(rapid.Int64Range(lo, hi).Draw(rt, "sec"), rapid.Int64Range(0, 999999999).Draw(rt, "nsec")).UTC()
		var b time.Time
		switch rapid.IntRange(0, 2).Draw(rt, "how") {
		case 0:
			b = wrap(a, 1)
		case 1:
			b = wrap(a, -1)
		default:
			b = time.Unix(rapid.Int64Range(lo, hi).Draw(rt, "sec2"), rapid.Int64Range(0, 999999999).Draw(rt, "nsec2")).UTC()
		}
		if enc(a) != enc(a.Add(0)) {
			rt.Fatalf("%s encodes in two ways", a)
		}
		if !a.Equal(b) && enc(a) == enc(b) {
			rt.Fatalf("%s and %s encode alike", a, b)
		}
	})
}
