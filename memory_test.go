package backfill

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// wideRows is an extractor of rows (id, pad) whose pad is width bytes;
// the row of id dupAt (-1: none) is written twice.
func wideRows(width int, dupAt int64) Extractor {
	return ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		for id := c.Lo; id < c.Hi; id++ {
			pad := strings.Repeat(string(rune('a'+id%26)), width)
			if err := w.Write(ctx, id, pad); err != nil {
				return err
			}
			if id == dupAt {
				if err := w.Write(ctx, id, pad); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// TestMemoryBudgetHoldsForWideRows: with 10 KiB rows and a 32 MiB budget,
// the spools, the tracked keys and the held rejects stay within their
// shares (the spools move to their files), the merge still finds a
// duplicate key once the key share is used up, and every row lands.
func TestMemoryBudgetHoldsForWideRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE wide (id bigint PRIMARY KEY, pad text NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	const budget = 32 << 20
	r, err := New(db, &Config{MemoryBudget: budget, Concurrency: 2})
	require.NoError(t, err)
	const rows, perChunk = 3000, 1000 // 10 MiB a chunk of 10 KiB rows
	job := Job{Name: "wide", Chunker: IntRange(0, rows, perChunk), Extractor: wideRows(10<<10, -1),
		Target: Target{Table: "wide", Key: []string{"id"}, Columns: []string{"id", "pad"}}}
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(rows), rep.Counts.Read)
	require.Equal(t, int64(rows), rep.Counts.Inserted)
	var n int
	var total int64
	require.NoError(t, db.QueryRow(`SELECT count(*), sum(length(pad)) FROM wide`).Scan(&n, &total))
	require.Equal(t, rows, n)
	require.Equal(t, int64(rows*10<<10), total)

	// One row over its limit at most (a spool counts a row, then moves).
	require.LessOrEqual(t, r.mem.rows.Peak(), r.mem.rows.Limit()+11<<10, "spools in memory")
	require.Greater(t, r.mem.rows.Peak(), int64(0))
	require.Zero(t, r.mem.rows.Used(), "every spool gave its share back")
	require.Zero(t, r.mem.rejects.Used())

	// Narrow rows, 60,000 a chunk: the key share (2 MiB) holds about
	// 52,000 identities; past them a stager stops tracking, and the
	// duplicate of row 59,000 is found in SQL.
	_, err = db.Exec(`CREATE TABLE narrow (id bigint PRIMARY KEY, pad text NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	job = Job{Name: "narrow", Chunker: IntRange(0, 120000, 60000), Extractor: wideRows(8, 59000),
		Target: Target{Table: "narrow", Key: []string{"id"}, Columns: []string{"id", "pad"}}}
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(120001), rep.Counts.Read)
	require.Equal(t, int64(120000), rep.Counts.Inserted)
	require.Equal(t, int64(1), rep.Counts.Deduplicated, "the duplicate is found with the key share used up")
	require.LessOrEqual(t, r.mem.keys.Peak(), r.mem.keys.Limit())
	require.Greater(t, r.mem.keys.Peak(), r.mem.keys.Limit()/2, "identities were tracked until the share ran out")
	require.Zero(t, r.mem.keys.Used(), "the stagers gave their share back")
}

// TestRejectsPastMemoryBudgetFailTheChunk: a chunk whose rejected rows
// hold more than their share of the budget fails with an error naming
// the chunk and wrapping ErrTooManyRejects, writes nothing, and loads
// with every reject queued once the budget is raised.
func TestRejectsPastMemoryBudgetFailTheChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE rj (id bigint PRIMARY KEY, pad text NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	raw := strings.Repeat("x", 60<<10)
	ext := ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		for id := c.Lo; id < c.Hi; id++ {
			if id%2 == 0 { // 50 rejects of 60 KiB in chunk [0,100)
				if c.Lo == 0 {
					if err := w.Reject(ctx, raw, "pad", "too wide"); err != nil {
						return err
					}
					continue
				}
			}
			if err := w.Write(ctx, id, "ok"); err != nil {
				return err
			}
		}
		return nil
	})
	job := Job{Name: "rj", Chunker: IntRange(0, 200, 100), Extractor: ext, MaxRunRejectRate: 1,
		Target: Target{Table: "rj", Key: []string{"id"}, Columns: []string{"id", "pad"}}}
	r, err := New(db, &Config{MemoryBudget: 32 << 20, MaxAttempts: 1}) // rejects' share: 2 MiB
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.Error(t, err)
	require.True(t, errors.Is(err, ErrTooManyRejects), "%v", err)
	require.Contains(t, err.Error(), "chunk int:0/100")
	require.Contains(t, err.Error(), "MemoryBudget")
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM rj WHERE id < 100`).Scan(&n))
	require.Zero(t, n, "the failed chunk wrote nothing")
	require.Zero(t, r.mem.rejects.Used(), "the failed chunk gave its share back")

	r2, err := New(db, &Config{MemoryBudget: 64 << 20})
	require.NoError(t, err)
	job.NewRun = true
	rep, err := r2.Run(ctx, job)
	require.NoError(t, err, "the rejects fit in a 6 MiB share")
	require.Equal(t, int64(50), rep.Counts.Rejected)
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM backfill.exceptions WHERE batch_id = $1 AND length(raw::text) >= 60<<10`, rep.BatchID).Scan(&n))
	require.Equal(t, 50, n, "every reject queued with its raw row")
}

func TestMemoryBudgetValidated(t *testing.T) {
	t.Parallel()
	for _, b := range []int64{-1, 1000, 16 << 20} {
		c := Config{MemoryBudget: b}
		require.ErrorIs(t, c.validate(), ErrInvalidConfig, "budget %d", b)
	}
}

// TestRejectsOverBudgetRetryable: a chunk whose own rejects hold at most
// half their share, the other chunks in flight the rest, is retried; one
// whose own rejects hold more fails for good.
func TestRejectsOverBudgetRetryable(t *testing.T) {
	t.Parallel()
	c := Chunk{ID: "int:0/10"}
	shared := errRejectsOverBudget(c, 3, 1000, 4096)
	require.ErrorIs(t, shared, ErrTooManyRejects)
	require.True(t, IsRetryable(shared), "%v", shared)
	require.Contains(t, shared.Error(), "other chunks in flight")
	own := errRejectsOverBudget(c, 9, 3000, 4096)
	require.ErrorIs(t, own, ErrTooManyRejects)
	require.False(t, IsRetryable(own), "%v", own)
}

// TestChunkSizingValidated: a bad adaptive-chunk setting is refused
// naming the field and its value.
func TestChunkSizingValidated(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{ChunkTarget: -time.Second}, "ChunkTarget (-1s)"},
		{Config{ChunkMinRows: -5}, "ChunkMinRows (-5)"},
		{Config{ChunkMaxRows: -7}, "ChunkMaxRows (-7)"},
		{Config{ChunkMinRows: 1000, ChunkMaxRows: 10}, "ChunkMinRows (1000) exceeds ChunkMaxRows (10)"},
	} {
		err := c.cfg.validate()
		require.ErrorIs(t, err, ErrInvalidConfig, c.want)
		require.ErrorContains(t, err, c.want)
	}
	require.NoError(t, (&Config{ChunkMinRows: 10, ChunkMaxRows: 10}).validate())
}
