package main

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestCLIRehearsals: a rehearsal made in Go shows in rehearsals (text
// and --json, also as "rehearse"), and status compares the run after it
// with its forecast.
func TestCLIRehearsals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	_, err := db.Exec(faresDDL)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	cliOK(t, u, "migrate")
	code, _, stderr := cli(t, u, "rehearsals", "fares")
	require.Equal(t, 3, code, "a job the manifest has never seen is not found")
	require.Contains(t, stderr, `no run or rehearsal of job "fares"`)

	job := faresJob(3000, 1, false)
	rh, err := r.Rehearse(ctx, job, backfill.RehearseOptions{Sample: 2})
	require.NoError(t, err)
	out := cliOK(t, u, "rehearse", "fares")
	require.Contains(t, out, "rehearsal 1 of job fares")
	require.Contains(t, out, "forecast (by chunks, concurrency 1): duration ")
	require.Contains(t, out, "int:2000/3000")
	require.Contains(t, out, "MERGE")
	var res rehearsalsResult
	cliJSON(t, u, &res, "rehearsals", "fares", "--limit", "0")
	require.Len(t, res.Rehearsals, 1)
	require.Equal(t, rh.Forecast, res.Rehearsals[0].Forecast)

	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	out = cliOK(t, u, "status", "fares")
	require.Contains(t, out, "forecast: rehearsal 1 (")
	require.Contains(t, out, "rows 3005 (forecast 3000: -0.2%)")
	// The run's own WAL and growth, beside the forecast's.
	require.Regexp(t, `WAL [1-9][0-9]* B \(forecast [0-9]+ B: [-+][0-9.]+%\), table \+[0-9]+ B \(forecast \+[0-9]+ B`, out)
}
