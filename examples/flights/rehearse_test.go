package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestEstimateRows: the estimates of a sorted file's days sum to its rows
// within a stride a day.
func TestEstimateRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rows := synthetic(11, 3000, 4)
	src := open(t, writeParquet(t, rows, 500), 16)
	if !src.idx.sorted {
		t.Skip("synthetic file not sorted")
	}
	first, end, _ := src.Scope()
	chunks, err := backfill.Days(first, end, time.UTC).Chunks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, c := range chunks {
		n, err := src.EstimateRows(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		sum += n
	}
	if d := sum - int64(len(rows)); d < -16*int64(len(chunks)) || d > 16*int64(len(chunks)) {
		t.Errorf("estimates sum to %d for %d rows in %d days", sum, len(rows), len(chunks))
	}
}

// TestLoadRehearsed: -rehearse rehearses days before the run, leaves the
// target empty for it, and compares the run with the forecast.
func TestLoadRehearsed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rows := synthetic(7, 3000, 4)
	src := open(t, writeParquet(t, rows, 500), 64)
	airportsPath := filepath.Join(t.TempDir(), airportsFile)
	if err := os.WriteFile(airportsPath, []byte("iata,name,city,state,country,latitude,longitude\nBOS,Logan,Boston,MA,USA,42.36,-71.00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	first, end, _ := src.Scope()
	var out bytes.Buffer
	rep, err := load(ctx, &out, db, nil, src, backfill.Days(first, end, time.UTC), airportsPath, options{concurrency: 2, rehearse: 2})
	if err != nil {
		t.Fatalf("load: %v\n%s", err, out.String())
	}
	if rep.Counts.Inserted == 0 || rep.Counts.Unchanged != 0 {
		t.Errorf("the run after the rehearsal: %+v, want every row inserted (the rehearsal left none)\n%s", rep.Counts, out.String())
	}
	for _, w := range []string{"rehearsal 1: 2 of ", "forecast (by rows, concurrency 2)", "forecast   rehearsal 1 against the run: duration "} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
}
