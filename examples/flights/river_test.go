package main

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// riverChildEnv, set to "URL|PARQUET", makes the test binary the River
// worker that TestFlightsThroughRiverWorkerKilled kills: it works the
// flights run's River queue with one worker whose extractor notes the
// chunk it reached in table reached and blocks there.
const riverChildEnv = "FLIGHTS_RIVER_TEST_CHILD"

func init() {
	v := os.Getenv(riverChildEnv)
	if v == "" {
		return
	}
	u, path, _ := strings.Cut(v, "|")
	if err := riverChild(u, path); err != nil {
		os.Stderr.WriteString("river child: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

func riverChild(u, path string) error {
	ctx := context.Background()
	db, err := sqlx.Open("postgres", u)
	if err != nil {
		return err
	}
	src, err := openFlights(path, 64)
	if err != nil {
		return err
	}
	first, end, _ := src.Scope()
	block := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if _, err := db.ExecContext(ctx, `INSERT INTO reached VALUES ($1)`, c.Seq); err != nil {
			return err
		}
		select {} // until killed
	})
	_, err = riverLoad(ctx, io.Discard, db, nil, backfill.Days(first, end, time.UTC), block, options{concurrency: 1, riverTimeout: 20 * time.Second})
	return err
}

// TestFlightsThroughRiverWorkerKilled runs the flights job through River
// with two workers, a child process and this one; the child is killed
// with SIGKILL in the middle of a chunk, River rescues its job, and this
// worker finishes the run. The River run's target equals a plain run's,
// row for row; its counts balance; every River job completed.
func TestFlightsThroughRiverWorkerKilled(t *testing.T) {
	ctx := context.Background()
	rows := synthetic(11, 3000, 4)
	path := writeParquet(t, rows, 500)
	src := open(t, path, 64)
	first, end, _ := src.Scope()
	days := backfill.Days(first, end, time.UTC)
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE reached (seq int)`); err != nil {
		t.Fatal(err)
	}

	// The plain run.
	if _, err := db.Exec(schemaDDL); err != nil {
		t.Fatal(err)
	}
	r, err := backfill.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := r.Run(ctx, backfill.Job{Name: flightsJob, Source: flightsSrc, CodeVersion: codeVersion, Chunker: days, Extractor: src,
		Target: backfill.Target{Table: "flights", Key: flightKey, Columns: flightColumns}})
	if err != nil {
		t.Fatal(err)
	}

	// The killed worker: it enqueues the run and blocks in its first chunk.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), riverChildEnv+"="+u+"|"+path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var seq int
		err := db.Get(&seq, `SELECT seq FROM reached LIMIT 1`)
		if err == nil {
			break
		}
		if !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the child reached no chunk")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The other worker starts while the child holds its chunk, which is
	// killed once this one runs.
	type result struct {
		st  backfill.Status
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := riverLoad(ctx, io.Discard, db, nil, days, src, options{concurrency: 2, riverTimeout: 20 * time.Second})
		done <- result{st, err}
	}()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	var res result
	select {
	case res = <-done:
	case <-time.After(4 * time.Minute):
		t.Fatal("the River run did not end")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	st := res.st
	if st.Status != backfill.RunCompleted {
		t.Fatalf("River run %s, want completed", st.Status)
	}
	c := st.Rows
	if c.Read != c.Inserted+c.Updated+c.Unchanged+c.Rejected+c.Deduplicated || c.Read != int64(len(rows)) {
		t.Errorf("counts %+v do not balance over %d source rows", c, len(rows))
	}
	if c.Read != plain.Counts.Read || c.Inserted != plain.Counts.Inserted || c.Rejected != plain.Counts.Rejected {
		t.Errorf("River run counts %+v, plain run %+v", c, plain.Counts)
	}
	sum := func(table string) (s string) {
		if err := db.Get(&s, `SELECT md5(string_agg(concat_ws(' ', dep_local, origin, destination, seq, delay, distance), ',' ORDER BY dep_local, origin, destination, seq)) FROM `+table); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if a, b := sum("flights"), sum("flights_river"); a != b {
		t.Errorf("flights_river (%s) differs from the plain run's flights (%s)", b, a)
	}
	if left, err := riverJobsLeft(ctx, db.DB, st.BatchID); err != nil || left != 0 {
		t.Errorf("%d River jobs not completed (%v)", left, err)
	}
}
