package backfill

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
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

// TestSkipUnchangedComparesTheEncodingVersion: a source fingerprint
// recorded under the earlier row encoding (version 1: no version tag) is
// never taken for one of today's, even of the very same rows: the chunk
// merges once (its rows unchanged) and records today's, and the next
// replay skips it.
func TestSkipUnchangedComparesTheEncodingVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE ev (id bigint PRIMARY KEY, note text, amount numeric(12,2), at timestamptz)`)
	at := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	target := Target{Table: "ev", Key: []string{"id"}, Columns: []string{"id", "note", "amount", "at"}}
	x := ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		for id := c.Lo; id < c.Hi; id++ {
			if err := w.Write(ctx, id, fmt.Sprint("n", id), "1.50", at.Add(time.Duration(id)*time.Minute)); err != nil {
				return err
			}
		}
		return nil
	})
	job := Job{Name: "ev", Chunker: IntRange(0, 20, 10), ChunkColumn: "id", Extractor: x, Target: target, SkipUnchanged: true, NewRun: true, Rollback: RollbackNone}
	r, err := New(db, &Config{Concurrency: 1})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(20), rep.Counts.Inserted)

	// The version-1 fingerprint of chunk int:0/10's rows as the row
	// writer converts them.
	var info TableInfo
	require.NoError(t, pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		info, err = pgstore.NewMerger().Prepare(ctx, tx, target)
		return err
	}))
	c := Chunk{ID: "int:0/10", Kind: backfilltype.KindInt, Lo: 0, Hi: 10}
	v1 := &legacyV1Adder{info: info}
	w := newRowWriter(c, job, info, v1, 0, time.Now())
	require.NoError(t, x.Extract(ctx, c, w))
	var recorded string
	require.NoError(t, db.Get(&recorded, `SELECT source_fingerprint FROM backfill.chunks WHERE batch_id = $1 AND chunk_id = $2`, rep.BatchID, c.ID))
	require.True(t, strings.HasPrefix(recorded, pgstore.SourceEncodingVersion+":10:"), "recorded %q", recorded)
	require.NotEqual(t, recorded, v1.String())
	db.MustExec(`UPDATE backfill.chunks SET source_fingerprint = $1 WHERE batch_id = $2 AND chunk_id = $3`, v1.String(), rep.BatchID, c.ID)

	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 1, rep.ChunksSkipped, "the chunk recorded under version 1 merges, the other skips")
	require.Equal(t, Counts{Read: 20, Unchanged: 20}, rep.Counts)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 2, rep.ChunksSkipped, "the merge recorded today's fingerprint")
}

// legacyV1Adder sums the source fingerprint of the rows added as the
// first encoding did (fixed-width lengths and integers, no version tag).
type legacyV1Adder struct {
	info TableInfo
	rows int64
	sum  [2]uint64
}

func (a *legacyV1Adder) Add(_ context.Context, _ int64, values []any) error {
	var buf []byte
	for i := range a.info.Written {
		switch x := values[i].(type) {
		case nil:
			buf = append(buf, 0)
		case int64:
			buf = binary.BigEndian.AppendUint64(append(buf, 'i'), uint64(x))
		case float64:
			buf = binary.BigEndian.AppendUint64(append(buf, 'f'), math.Float64bits(x))
		case bool:
			buf = append(buf, 'b', map[bool]byte{false: 0, true: 1}[x])
		case string:
			buf = binary.BigEndian.AppendUint64(append(buf, 's'), uint64(len(x)))
			buf = append(buf, x...)
		case time.Time:
			_, off := x.Zone()
			buf = binary.BigEndian.AppendUint64(append(buf, 't'), uint64(x.Unix()))
			buf = binary.BigEndian.AppendUint32(buf, uint32(x.Nanosecond()))
			buf = binary.BigEndian.AppendUint64(buf, uint64(int64(off)))
		default:
			return fmt.Errorf("legacy encoding: %T", x)
		}
	}
	sum := sha256.Sum256(buf)
	a.rows++
	a.sum[0] += binary.BigEndian.Uint64(sum[0:8])
	a.sum[1] += binary.BigEndian.Uint64(sum[8:16])
	return nil
}

func (a *legacyV1Adder) String() string {
	return fmt.Sprintf("%d:%016x:%016x", a.rows, a.sum[0], a.sum[1])
}

// TestSourceEncodingIsOneToOne: two converted rows encode alike exactly
// when they are equal: same types, same values, NULLs in the same
// columns (an empty string or byte slice is not NULL, false is not 0),
// a time the same instant in the same zone offset. Values of every type
// the row writer produces, with lengths near the varints' byte
// boundaries, so that a length or an integer cannot swallow the next
// value.
func TestSourceEncodingIsOneToOne(t *testing.T) {
	t.Parallel()
	const cols = 4
	info := TableInfo{Written: cols}
	for i := range cols {
		info.Columns = append(info.Columns, Column{Name: fmt.Sprint("c", i), BaseType: "text"})
	}
	str := rapid.Custom(func(rt *rapid.T) string {
		n := rapid.SampledFrom([]int{0, 1, 2, 126, 127, 128, 129, 300}).Draw(rt, "len")
		return strings.Repeat(rapid.SampledFrom([]string{"a", "b", "\x00", "\x80"}).Draw(rt, "char"), n)
	})
	zones := []*time.Location{time.UTC, time.FixedZone("plus1", 3600), time.FixedZone("minus0130", -5400)}
	value := rapid.Custom(func(rt *rapid.T) any {
		switch rapid.IntRange(0, 6).Draw(rt, "type") {
		case 0:
			return nil
		case 1:
			return rapid.SampledFrom([]int64{0, 1, -1, 63, 64, -64, -65, 127, 128, 1 << 20, math.MaxInt64, math.MinInt64}).Draw(rt, "int")
		case 2:
			return rapid.SampledFrom([]float64{0, math.Copysign(0, -1), 1, -1.5, math.Inf(1), math.MaxFloat64}).Draw(rt, "float")
		case 3:
			return rapid.Bool().Draw(rt, "bool")
		case 4:
			return str.Draw(rt, "string")
		case 5:
			return []byte(str.Draw(rt, "bytes"))
		default:
			sec := rapid.SampledFrom([]int64{0, 1, -1, 63, 64, 1_700_000_000, -62135596800}).Draw(rt, "sec")
			ns := rapid.SampledFrom([]int64{0, 1, 127, 128, 999_999_999}).Draw(rt, "ns")
			return time.Unix(sec, ns).In(rapid.SampledFrom(zones).Draw(rt, "zone"))
		}
	})
	row := rapid.SliceOfN(value, cols, cols)
	// same is equality of converted values: the same type and value (a
	// float bit for bit), a time the same instant and offset.
	same := func(a, b any) bool {
		if ta, ok := a.(time.Time); ok {
			tb, ok := b.(time.Time)
			_, oa := ta.Zone()
			_, ob := tb.Zone()
			return ok && ta.Equal(tb) && oa == ob
		}
		if fa, ok := a.(float64); ok {
			fb, ok := b.(float64)
			return ok && math.Float64bits(fa) == math.Float64bits(fb)
		}
		return reflect.TypeOf(a) == reflect.TypeOf(b) && reflect.DeepEqual(a, b)
	}
	rapid.Check(t, func(rt *rapid.T) {
		a := row.Draw(rt, "a")
		b := row.Draw(rt, "b")
		if rapid.Bool().Draw(rt, "near") {
			// b differs from a in one column at most.
			b = append([]any{}, a...)
			b[rapid.IntRange(0, cols-1).Draw(rt, "col")] = value.Draw(rt, "other")
		}
		equal := true
		for i := range a {
			equal = equal && same(a[i], b[i])
		}
		ea, eb := string(pgstore.EncodeSourceRow(nil, info.Columns, a)), string(pgstore.EncodeSourceRow(nil, info.Columns, b))
		if (ea == eb) != equal {
			rt.Fatalf("rows %#v and %#v: encodings equal %t, rows equal %t", a, b, ea == eb, equal)
		}
	})
}
