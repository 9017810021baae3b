package backfill_test

import (
	"context"
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// Go values PostgreSQL can store are taken: slices into arrays of the
// matching type (quoted, with NULLs, nested), *big.Rat with a finite
// decimal expansion into numeric exactly. A Rat without one (1/3) is
// queued naming why; a slice of a type no element can be (a struct into
// int8[]) stays an extractor bug.
func TestWriteGoSlicesAndBigNumbers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE ga (id bigint PRIMARY KEY, i int8[], s text[], f float8[], b bool[], m int4[], n numeric, by bytea[])`)
	require.NoError(t, err)
	str := "x"
	rows := [][]any{
		{int64(0), []int64{1, -2}, []string{`a "b"`, `c\d`, "NULL", "", "é,{}"}, []float64{0.1, math.Inf(-1), math.NaN()}, []bool{true, false},
			[][]int32{{1, 2}, {3, 4}}, big.NewRat(1, 8), [][]byte{{0, 1}, nil}},
		{int64(1), []int64{}, []*string{&str, nil}, []any{1.5, nil}, []bool(nil), []int{7}, big.NewRat(-123456789, 1000), [][]byte{}},
		{int64(2), []int64{1}, []string{"x"}, []float64{1}, []bool{true}, []int64{math.MaxInt32 + 1}, big.NewRat(1, 3), nil},
	}
	job := backfill.Job{Name: "ga", Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "ga", Key: []string{"id"}, Columns: []string{"id", "i", "s", "f", "b", "m", "n", "by"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range rows {
				if err := w.Write(ctx, r...); err != nil {
					return err
				}
			}
			return nil
		})}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	var got []string
	require.NoError(t, db.Select(&got, `SELECT concat_ws(' | ', i, s, f, b, m, n, by) FROM ga ORDER BY id`))
	require.Equal(t, []string{
		`{1,-2} | {"a \"b\"","c\\d","NULL","","é,{}"} | {0.1,-Infinity,NaN} | {t,f} | {{1,2},{3,4}} | 0.125 | {"\\x0001",NULL}`,
		`{} | {x,NULL} | {1.5,NULL} | {7} | -123456.789 | {}`,
	}, got)
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, 1, "row 3: an int4 element out of range, and 1/3")
	require.Contains(t, ex[0].Reason, "array element 1: out of range")

	job.Name, job.NewRun = "ga2", true
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, int64(3), []struct{}{{}}, nil, nil, nil, nil, big.NewRat(1, 3), nil)
	})
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrExtractor, "a struct is no int8 element")
	job.Name = "ga3"
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, int64(3), nil, nil, nil, nil, nil, big.NewRat(1, 3), nil)
	})
	rep, err = r.Run(ctx, job)
	require.Error(t, err, "the run loaded none of its rows")
	ex, err = backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, 1)
	require.Contains(t, ex[0].Reason, "1/3 has no finite decimal expansion")
}
