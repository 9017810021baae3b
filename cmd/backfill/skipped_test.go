package main

import (
	"context"
	"fmt"
	"regexp"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestCLISkippedChunks: the chunks a replay with SkipUnchanged skipped
// show in runs, chunks, status and report, for people and with --json,
// read from the manifest alone.
func TestCLISkippedChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	_, err := db.Exec(`CREATE TABLE fares (id bigint PRIMARY KEY, route text NOT NULL, fare numeric NOT NULL)`)
	require.NoError(t, err)
	factor := map[int64]int64{} // chunk start -> fare factor
	job := backfill.Job{Name: "fares", NewRun: true, Rollback: backfill.RollbackNone, Chunker: backfill.IntRange(0, 3000, 1000), ChunkColumn: "id", SkipUnchanged: true,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, "R", id*max(1, factor[c.Lo])); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "fares", Key: []string{"id"}, Columns: []string{"id", "route", "fare"}}}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1})
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	factor[1000] = 2 // the replay merges chunk 1000-2000, skips the two others
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 2, rep.ChunksSkipped)
	b := fmt.Sprint(rep.BatchID)

	var runs runsResult
	cliJSON(t, u, &runs, "runs")
	require.Equal(t, runChunks{Total: 3, Done: 3, Skipped: 2}, runs.Runs[0].Chunks)
	require.Equal(t, runChunks{Total: 3, Done: 3}, runs.Runs[1].Chunks)
	require.Regexp(t, `3/3 \(2 skipped\)`, cliOK(t, u, "runs"))

	var chunks chunksResult
	cliJSON(t, u, &chunks, "chunks", "--batch", b)
	var skipped []bool
	for _, c := range chunks.Chunks {
		skipped = append(skipped, c.Skipped)
	}
	require.Equal(t, []bool{true, false, true}, skipped)
	out := cliOK(t, u, "chunks", "--batch", b)
	require.Len(t, regexp.MustCompile(`done \(skipped\)`).FindAllString(out, -1), 2, out)

	var st backfill.Status
	cliJSON(t, u, &st, "status", "--batch", b)
	require.Equal(t, 2, st.Chunks.Skipped)
	require.Contains(t, cliOK(t, u, "status", "--batch", b), "2 skipped unchanged")

	var rr backfill.RunReport
	cliJSON(t, u, &rr, "report", "--batch", b)
	require.Equal(t, 2, rr.Totals.ChunksSkipped)
	require.Contains(t, cliOK(t, u, "report", "--batch", b), "3 of 3 done, 2 skipped unchanged")
}
