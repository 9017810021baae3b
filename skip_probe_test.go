package backfill

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestRawEncodingDistinguishesValues: values of every Go type the source
// fingerprint encodes as written, each changed in one way or another,
// and the same number under other types, all encode differently.
func TestRawEncodingDistinguishesValues(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 3, 1, 12, 0, 0, 123456000, time.UTC)
	values := []any{
		nil, "", "a", "b", "ab", []byte(nil), []byte{}, []byte("a"), []byte("b"),
		int(1), int(2), int64(1), int64(2), int32(1), int32(2), int16(1), int16(2), int8(1), int8(2),
		uint(1), uint(2), uint64(1), uint64(2), uint32(1), uint32(2), uint16(1), uint16(2), uint8(1), uint8(2),
		float64(1), float64(1.5), math.Copysign(0, -1), float64(0), float32(1), float32(1.5),
		true, false, at, at.Add(time.Microsecond), at.Add(time.Second), at.In(time.FixedZone("x", 3600)),
		time.Duration(1), time.Duration(2),
	}
	seen := map[string]int{}
	for i, v := range values {
		b, ok := appendRawValue(nil, v)
		require.True(t, ok, "%T %v", v, v)
		if j, dup := seen[string(b)]; dup {
			t.Fatalf("%T %#v encodes as %T %#v", v, v, values[j], values[j])
		}
		seen[string(b)] = i
	}
	// Rows: the same values split otherwise encode otherwise.
	var f rawFingerprint
	require.True(t, f.encodeRaw([]any{"ab", "c"}))
	x := string(f.buf)
	require.True(t, f.encodeRaw([]any{"a", "bc"}))
	require.NotEqual(t, x, string(f.buf))
	type named int
	_, ok := appendRawValue(nil, named(1))
	require.False(t, ok, "a named type is encoded as converted, by the row writer")
}

// probeTarget is a table with a column per Go type the probe encodes,
// and the job loading one chunk of 3 rows into it from rows (guarded by
// mu), counting the extractions and the probes among them.
type probeTarget struct {
	mu               sync.Mutex
	rows             [][]any
	extracts, probes int
	failAfterProbe   error
	changeAfterProbe func([][]any)
}

func newProbeTarget(t *testing.T) (*Runner, Job, *probeTarget, func() [][]any) {
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE pt (id bigint PRIMARY KEY, i4 int, i2 smallint, u8 bigint, f8 float8, f4 real, b bool, s text, y bytea, ts timestamptz, d date, iv interval)`)
	at := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	p := &probeTarget{}
	for id := range int64(3) {
		p.rows = append(p.rows, []any{id, int(id), int16(id), uint64(id), float64(id) / 2, float32(id) / 4, id%2 == 0,
			fmt.Sprint("s", id), []byte{byte(id)}, at.Add(time.Duration(id) * time.Hour), at.AddDate(0, 0, int(id)), time.Duration(id) * time.Second})
	}
	x := ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		p.mu.Lock()
		p.extracts++
		_, probing := w.(*probeWriter)
		if probing {
			p.probes++
		} else if p.probes > 0 {
			if p.failAfterProbe != nil {
				err := p.failAfterProbe
				p.mu.Unlock()
				return err
			}
			if p.changeAfterProbe != nil {
				p.changeAfterProbe(p.rows)
				p.changeAfterProbe = nil
			}
		}
		rows := make([][]any, len(p.rows))
		copy(rows, p.rows)
		p.mu.Unlock()
		for _, r := range rows {
			if err := w.Write(ctx, r...); err != nil {
				return err
			}
		}
		return nil
	})
	cols := []string{"id", "i4", "i2", "u8", "f8", "f4", "b", "s", "y", "ts", "d", "iv"}
	job := Job{Name: "pt", Chunker: IntRange(0, 3, 3), ChunkColumn: "id", Extractor: x, NewRun: true, Rollback: RollbackNone,
		Target: Target{Table: "pt", Key: []string{"id"}, Columns: cols}}
	r, err := New(db, &Config{Concurrency: 1, SerialExtract: true, MaxAttempts: 1})
	require.NoError(t, err)
	read := func() [][]any {
		out := [][]any{}
		rs, err := db.Query(`SELECT i4, s, ts FROM pt ORDER BY id`)
		require.NoError(t, err)
		defer rs.Close()
		for rs.Next() {
			var i4 int
			var s string
			var ts time.Time
			require.NoError(t, rs.Scan(&i4, &s, &ts))
			out = append(out, []any{i4, s, ts.UTC()})
		}
		return out
	}
	return r, job, p, read
}

// reset sets the counts of extractions to zero.
func (p *probeTarget) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.extracts, p.probes = 0, 0
}

// TestProbeSkipsUnchangedChunk: an unchanged replay extracts the chunk
// once, through the probe (no conversion, no spool), and skips it; a
// change of one value of any column's Go type is seen by the probe, and
// the chunk is extracted again, merged and recorded, then skipped by the
// next replay.
func TestProbeSkipsUnchangedChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, job, p, _ := newProbeTarget(t)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(3), rep.Counts.Inserted)
	p.reset()
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 1, rep.ChunksSkipped)
	require.Equal(t, Counts{Read: 3, Unchanged: 3}, rep.Counts)
	require.Equal(t, 1, p.extracts, "unchanged: extracted once, by the probe")
	require.Equal(t, 1, p.probes)

	changes := []func(r []any){
		func(r []any) { r[1] = r[1].(int) + 10 },
		func(r []any) { r[2] = r[2].(int16) + 10 },
		func(r []any) { r[3] = r[3].(uint64) + 10 },
		func(r []any) { r[4] = r[4].(float64) + 0.25 },
		func(r []any) { r[5] = r[5].(float32) + 0.25 },
		func(r []any) { r[6] = !r[6].(bool) },
		func(r []any) { r[7] = r[7].(string) + "x" },
		func(r []any) { r[8] = append([]byte{9}, r[8].([]byte)...) },
		func(r []any) { r[9] = r[9].(time.Time).Add(time.Microsecond) },
		func(r []any) { r[10] = r[10].(time.Time).AddDate(0, 0, 1) },
		func(r []any) { r[11] = r[11].(time.Duration) + time.Second },
		func(r []any) { r[7] = nil },
	}
	for i, change := range changes {
		p.mu.Lock()
		row := append([]any(nil), p.rows[1]...)
		change(row)
		p.rows[1] = row
		p.mu.Unlock()
		p.reset()
		rep, err = r.Run(ctx, job)
		require.NoError(t, err, "change %d", i)
		require.Equal(t, 0, rep.ChunksSkipped, "change %d", i)
		require.Equal(t, int64(1), rep.Counts.Updated, "change %d", i)
		require.Equal(t, 2, p.extracts, "change %d: the probe, then the row writer", i)
		p.reset()
		rep, err = r.Run(ctx, job)
		require.NoError(t, err, "change %d", i)
		require.Equal(t, 1, rep.ChunksSkipped, "change %d: recorded after its merge", i)
		require.Equal(t, 1, p.extracts, "change %d", i)
	}
}

// TestProbeSourceChangesBetweenExtractions: the source changes between
// the probe and the row writer's extraction: the chunk merges the rows
// the second extraction read, and records their fingerprint, so that a
// replay of those rows skips and one of the probe's merges.
func TestProbeSourceChangesBetweenExtractions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, job, p, read := newProbeTarget(t)
	_, err := r.Run(ctx, job)
	require.NoError(t, err)

	p.mu.Lock()
	p.rows[0] = append([]any(nil), p.rows[0]...)
	p.rows[0][7] = "probed"
	p.changeAfterProbe = func(rows [][]any) {
		rows[0] = append([]any(nil), rows[0]...)
		rows[0][7] = "extracted"
	}
	p.mu.Unlock()
	p.reset()
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 0, rep.ChunksSkipped)
	require.Equal(t, 2, p.extracts)
	require.Equal(t, "extracted", read()[0][1])

	// The source as the second extraction read it: skipped.
	p.reset()
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 1, rep.ChunksSkipped)
	require.Equal(t, 1, p.extracts)

	// The source as the probe read it: merged.
	p.mu.Lock()
	p.rows[0] = append([]any(nil), p.rows[0]...)
	p.rows[0][7] = "probed"
	p.mu.Unlock()
	p.reset()
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 0, rep.ChunksSkipped)
	require.Equal(t, int64(1), rep.Counts.Updated)
	require.Equal(t, "probed", read()[0][1])
}

// TestProbeSecondExtractionError: the probe finds the chunk changed, and
// the row writer's extraction fails: the run's error names the chunk and
// wraps the extractor's, and the target keeps its rows.
func TestProbeSecondExtractionError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, job, p, read := newProbeTarget(t)
	_, err := r.Run(ctx, job)
	require.NoError(t, err)
	before := read()

	boom := errors.New("source went away")
	p.mu.Lock()
	p.rows[2] = append([]any(nil), p.rows[2]...)
	p.rows[2][1] = 99
	p.failAfterProbe = boom
	p.mu.Unlock()
	_, err = r.Run(ctx, job)
	require.Error(t, err)
	require.ErrorIs(t, err, boom)
	var ce *ChunkError
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, "int:0/3", ce.Chunk.ID)
	require.Contains(t, err.Error(), "int:0/3")
	require.Equal(t, before, read())
}

// TestProbeStopsWhenMostChunksChanged: a replay in which every chunk
// changed probes only the first few (probeChangedMost), then extracts
// each chunk once; every chunk merges its new rows.
func TestProbeStopsWhenMostChunksChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE pm (id bigint PRIMARY KEY, v int)`)
	var mu sync.Mutex
	add, extracts, probes := 0, 0, 0
	x := ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		mu.Lock()
		extracts++
		if _, ok := w.(*probeWriter); ok {
			probes++
		}
		v := add
		mu.Unlock()
		for id := c.Lo; id < c.Hi; id++ {
			if err := w.Write(ctx, id, int(id)+v); err != nil {
				return err
			}
		}
		return nil
	})
	job := Job{Name: "pm", Chunker: IntRange(0, 40, 2), ChunkColumn: "id", Extractor: x, NewRun: true, Rollback: RollbackNone,
		Target: Target{Table: "pm", Key: []string{"id"}, Columns: []string{"id", "v"}}}
	r, err := New(db, &Config{Concurrency: 1, SerialExtract: true})
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	mu.Lock()
	add, extracts, probes = 1, 0, 0
	mu.Unlock()
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(40), rep.Counts.Updated)
	require.Equal(t, 0, rep.ChunksSkipped)
	require.Equal(t, probeChangedMost, probes)
	require.Equal(t, 20+probeChangedMost, extracts)
	var sum int
	require.NoError(t, db.Get(&sum, `SELECT sum(v - id) FROM pm`))
	require.Equal(t, 40, sum)
}
