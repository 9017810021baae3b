package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestDemoWaitsWhilePausedFromSQL: the demo paused from SQL mid-run (an
// operator's backfill.pause while its first chunks are in flight) does
// not end: its Run waits, a registered worker of the run; resumed from
// SQL, it loads the rest and finishes, every row once.
func TestDemoWaitsWhilePausedFromSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rows := synthetic(11, 3000, 10)
	src := open(t, writeParquet(t, rows, 500), 64)
	airportsPath := filepath.Join(t.TempDir(), airportsFile)
	if err := os.WriteFile(airportsPath, []byte("iata,name,city,state,country,latitude,longitude\nBOS,Logan,Boston,MA,USA,42.36,-71.00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	first, end, _ := src.Scope()
	days := backfill.Days(first, end, time.UTC)

	// The merges into flights wait in a trigger until the test opens
	// demo_gate: the pause comes while the first chunks are in flight.
	if _, err := db.Exec(schemaDDL); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE demo_gate (open bool NOT NULL);
		INSERT INTO demo_gate VALUES (false);
		CREATE FUNCTION demo_gate_wait() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			WHILE NOT (SELECT open FROM demo_gate) LOOP
				PERFORM pg_sleep(0.01);
			END LOOP;
			RETURN NULL;
		END $$;
		CREATE TRIGGER demo_gate AFTER INSERT ON flights FOR EACH STATEMENT EXECUTE FUNCTION demo_gate_wait()`); err != nil {
		t.Fatal(err)
	}

	type result struct {
		rep backfill.Report
		err error
		out string
	}
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		rep, err := load(ctx, &out, db, nil, src, days, airportsPath, options{concurrency: 2})
		done <- result{rep, err, out.String()}
	}()
	until := func(what, query string, args ...any) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			select {
			case res := <-done:
				t.Fatalf("the demo ended (%v) while waiting until %s:\n%s", res.err, what, res.out)
			default:
			}
			var ok bool
			if err := db.Get(&ok, query, args...); err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("never %s", what)
			}
		}
	}
	until("a chunk of the run is in flight", `SELECT EXISTS (SELECT FROM backfill.chunks c JOIN backfill.runs r USING (batch_id)
		WHERE r.job_name = $1 AND c.lease_key IS NOT NULL)`, flightsJob)
	if _, err := db.Exec(`SELECT backfill.pause($1::text, 'ann', 'replica lag')`, flightsJob); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE demo_gate SET open = true`); err != nil {
		t.Fatal(err)
	}
	until("the run is paused, no chunk leased, its worker registered", `SELECT r.status = 'paused'
		AND NOT EXISTS (SELECT FROM backfill.chunks c WHERE c.batch_id = r.batch_id AND c.lease_key IS NOT NULL)
		AND EXISTS (SELECT FROM backfill.workers w WHERE w.batch_id = r.batch_id AND w.finished_at IS NULL)
		FROM backfill.runs r WHERE r.job_name = $1`, flightsJob)
	var pending int
	if err := db.Get(&pending, `SELECT count(*) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $1 AND c.status = 'pending'`, flightsJob); err != nil || pending == 0 {
		t.Fatalf("%d chunks pending (%v): the pause is not mid-run", pending, err)
	}

	if _, err := db.Exec(`SELECT backfill.resume($1::text, 'ann', 'lag is fine')`, flightsJob); err != nil {
		t.Fatal(err)
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("the demo did not finish after the resume")
	}
	if res.err != nil {
		t.Fatalf("load: %v\n%s", res.err, res.out)
	}
	var rejects int64
	for k, n := range oracle(rows) {
		if strings.HasPrefix(k, "reject") {
			rejects += int64(n)
		}
	}
	want := backfill.Counts{Read: int64(len(rows)), Inserted: int64(len(rows)) - rejects, Rejected: rejects}
	if diff := cmp.Diff(want, res.rep.Counts); diff != "" {
		t.Errorf("counts (-want +got):\n%s\n%s", diff, res.out)
	}
	if res.rep.Status != backfill.RunCompleted {
		t.Errorf("run %s, want completed", res.rep.Status)
	}
	var n, distinct int64
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT (dep_local, origin, destination, seq)) FROM flights`).Scan(&n, &distinct); err != nil || n != want.Inserted || distinct != n {
		t.Errorf("flights: %d rows, %d distinct keys (%v); want %d each", n, distinct, err, want.Inserted)
	}
}
