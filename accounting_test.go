package backfill_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// genRow is a source row of the accounting property test.
type genRow struct {
	ID   int64
	Name any // string, nil, or a bad value
	Bad  bool
}

// TestAccountingProperty generates chunks with duplicates, bad values and
// explicit rejects, runs them on PostgreSQL, and checks that every chunk
// balances, that the target equals a model (last row per key wins), and
// that running the same input again as a new run writes nothing.
func TestAccountingProperty(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	createItems(t, db)
	ctx := context.Background()
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		_, err := db.Exec(`TRUNCATE items`)
		require.NoError(rt, err)
		nChunks := rapid.IntRange(1, 4).Draw(rt, "chunks")
		source := map[int64][]genRow{}
		for c := range nChunks {
			n := rapid.IntRange(0, 30).Draw(rt, fmt.Sprintf("rows%d", c))
			for range n {
				id := int64(c*100) + rapid.Int64Range(0, 12).Draw(rt, "id")
				r := genRow{ID: id}
				switch rapid.IntRange(0, 9).Draw(rt, "kind") {
				case 0:
					r.Name, r.Bad = "bad\x00nul", true
				case 1:
					r.Name, r.Bad = "far too long a name", true
				case 2:
					r.Bad = true // explicit reject
				case 3:
					r.Name = nil
				default:
					r.Name = rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "name")
				}
				source[int64(c)] = append(source[int64(c)], r)
			}
		}
		extract := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range source[c.Lo/100] {
				var err error
				if r.Bad && r.Name == nil {
					err = w.Reject(ctx, map[string]any{"id": r.ID}, "", "explicit")
				} else {
					err = w.Write(ctx, "t", r.ID, r.Name, nil, nil)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
		job := backfill.Job{Name: fmt.Sprintf("prop-%d", iteration), Chunker: backfill.IntRange(0, int64(nChunks)*100, 100), Extractor: extract, MaxRunRejectRate: -1,
			Target: backfill.Target{Table: "items", Key: []string{"tenant", "id"}, Columns: []string{"tenant", "id", "name", "amount", "seen_at"}}}
		r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
		require.NoError(rt, err)
		rep, runErr := r.Run(ctx, job)

		// Model: per key, the last good row wins.
		model := map[int64]*string{}
		var read, rejected int64
		for _, rows := range source {
			for _, r := range rows {
				read++
				if r.Bad {
					rejected++
					continue
				}
				var name *string
				if s, ok := r.Name.(string); ok {
					name = &s
				}
				model[r.ID] = name
			}
		}
		allRejected := read > 0 && rejected == read
		if allRejected {
			// Nothing loaded: the run pauses rather than complete silently.
			require.ErrorIs(rt, runErr, backfill.ErrGateFailed)
			require.Equal(rt, backfill.RunPaused, rep.Status)
		} else {
			require.NoError(rt, runErr)
		}
		require.Equal(rt, read, rep.Counts.Read)
		require.Equal(rt, rejected, rep.Counts.Rejected)
		require.Equal(rt, int64(len(model)), rep.Counts.Inserted)
		require.Equal(rt, read-rejected-int64(len(model)), rep.Counts.Deduplicated)
		for _, c := range manifestChunks(t, db, rep.BatchID) {
			require.True(rt, c.Balanced(), "chunk %s: %+v", c.Chunk.ID, c.Counts)
		}
		got := itemRows(t, db)
		require.Len(rt, got, len(model))
		for _, g := range got {
			want, ok := model[g.ID]
			require.True(rt, ok)
			require.Equal(rt, want, g.Name, "id %d", g.ID)
		}

		job.NewRun = true
		rep2, err := r.Run(ctx, job)
		if allRejected {
			require.ErrorIs(rt, err, backfill.ErrGateFailed)
		} else {
			require.NoError(rt, err)
		}
		require.Zero(rt, rep2.Counts.Inserted+rep2.Counts.Updated, "replay writes nothing: %+v", rep2.Counts)
		require.Equal(rt, rep.Counts.Read, rep2.Counts.Read)
	})
}
