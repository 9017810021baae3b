package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestCLIJobSelection: the read commands take the job as their argument,
// and need no name while the manifest has runs of one job only; with
// several jobs they list them, quoted for the shell, and ask. Commands that change a run still
// need it named. chunks --status leased lists the chunks in flight.
func TestCLIJobSelection(t *testing.T) {
	t.Parallel()
	u, db, _, b2 := loadFares(t)

	require.Contains(t, cliOK(t, u, "status"), "fares")
	var byFlag, byArg, unnamed chunksResult
	cliJSON(t, u, &byFlag, "chunks", "--job", "fares")
	cliJSON(t, u, &byArg, "chunks", "fares")
	cliJSON(t, u, &unnamed, "chunks")
	require.Equal(t, b2, byArg.BatchID)
	require.Equal(t, byFlag, byArg)
	require.Equal(t, byFlag, unnamed)
	for _, cmd := range []string{"exceptions", "validations", "events", "report"} {
		cliOK(t, u, cmd, "fares")
		cliOK(t, u, cmd)
	}
	code, _, stderr := cli(t, u, "chunks", "fares", "--job", "other")
	require.Equal(t, exitUsage, code, stderr)
	code, _, stderr = cli(t, u, "pause", "--why", "x")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "name the run")

	// A second job, with a chunk in flight.
	_, err := db.Exec(`CREATE TABLE slow (id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	job := backfill.Job{Name: "slow job", Chunker: backfill.IntRange(0, 2, 1), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "slow", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Lo == 0 {
				close(entered)
				<-release
			}
			return w.Write(ctx, c.Lo)
		})}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, WorkerID: "slow-worker"})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), job)
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the run ended before its first chunk was extracted: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the first chunk was not extracted")
	}
	var leased chunksResult
	cliJSON(t, u, &leased, "chunks", "slow job", "--status", "leased")
	require.Equal(t, 1, leased.Total)
	require.Equal(t, "int:0/1", leased.Chunks[0].ID)
	require.True(t, leased.Chunks[0].Leased)
	require.Contains(t, leased.Chunks[0].Worker, "slow-worker", "the lease holder of the chunk in flight")
	require.Equal(t, 1, leased.Chunks[0].Attempts, "the attempt under way")
	require.Contains(t, cliOK(t, u, "chunks", "slow job", "--status", "leased"), "slow-worker")
	var pending chunksResult
	cliJSON(t, u, &pending, "chunks", "slow job", "--status", "pending")
	require.Equal(t, 1, pending.Total, "the chunk in flight is not listed as pending")
	require.Contains(t, cliOK(t, u, "chunks", "slow job"), "pending (leased)")

	code, _, stderr = cli(t, u, "status")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "several jobs ('slow job', fares, latest first)")
	require.Contains(t, cliOK(t, u, "status", "slow job"), "slow job")
	close(release)
	require.NoError(t, <-done)
	for _, s := range chunkFilters {
		cliOK(t, u, "chunks", "slow job", "--status", s)
	}
}
