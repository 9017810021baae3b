package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
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

// TestMain gives the tests that need it a PostgreSQL server (DATABASE_URL,
// or a throwaway one); the extractor tests do not use it.
func TestMain(m *testing.M) { pgtest.Main(m) }

func TestLoadEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	rows := synthetic(7, 3000, 4)
	src := open(t, writeParquet(t, rows, 500), 64)
	// Every synthetic code but SFO, so that SFO counts as unknown.
	airports := "iata,name,city,state,country,latitude,longitude\n" +
		"ABE,Lehigh Valley,Allentown,PA,USA,40.65,-75.44\n" +
		"BOS,Logan,Boston,MA,USA,42.36,-71.00\n" +
		"LAS,McCarran,Las Vegas,NV,USA,36.08,-115.15\n" +
		"PHX,Sky Harbor,Phoenix,AZ,USA,33.43,-112.01\n" +
		"YAP,Yap International,NA,NA,Federated States of Micronesia,9.5167,138.1\n"
	airportsPath := filepath.Join(dir, airportsFile)
	if err := os.WriteFile(airportsPath, []byte(airports), 0o644); err != nil {
		t.Fatal(err)
	}
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { db.Close() })
	first, end, _ := src.Scope()
	days := backfill.Days(first, end, time.UTC)

	var out bytes.Buffer
	rep, err := load(ctx, &out, db, nil, src, days, airportsPath, options{concurrency: 2})
	if err != nil {
		t.Fatalf("load: %v\n%s", err, out.String())
	}
	want := oracle(rows)
	var rejects int64
	for k, n := range want {
		if strings.HasPrefix(k, "reject") {
			rejects += int64(n)
		}
	}
	wantCounts := backfill.Counts{Read: int64(len(rows)), Inserted: int64(len(rows)) - rejects, Rejected: rejects}
	if diff := cmp.Diff(wantCounts, rep.Counts); diff != "" {
		t.Errorf("counts (-want +got):\n%s\n%s", diff, out.String())
	}
	if rejects == 0 {
		t.Fatal("synthetic data has no unkeyable row; the test would not test rejects")
	}

	// The target holds exactly the keyable rows, with seq over the file.
	var got []struct {
		Dep    string `db:"dep"`
		Origin string `db:"origin"`
		Dest   string `db:"destination"`
		Seq    int32  `db:"seq"`
		Delay  int64  `db:"delay"`
	}
	if err := db.SelectContext(ctx, &got, `SELECT to_char(dep_local, 'YYYY-MM-DD HH24:MI:SS') AS dep, origin, destination, seq, delay FROM flights`); err != nil {
		t.Fatal(err)
	}
	set := map[string]int{}
	for _, r := range got {
		set[fmt.Sprintf("%s %s %s #%d %d", r.Dep, r.Origin, r.Dest, r.Seq, r.Delay)]++
	}
	for k := range want {
		if strings.HasPrefix(k, "reject") {
			delete(want, k)
		}
	}
	if diff := cmp.Diff(want, set); diff != "" {
		t.Errorf("flights table (-want +got):\n%s", diff)
	}

	// The manifest's exception queue has one entry per unkeyable row.
	exc, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(exc)) != rejects {
		t.Errorf("%d exceptions, want %d", len(exc), rejects)
	}
	for _, e := range exc {
		if !strings.HasPrefix(e.Reason, "cannot derive key: ") || e.Column == "" || !strings.Contains(string(e.Raw), "file_row") {
			t.Errorf("exception %+v", e)
		}
	}
	for _, s := range []string{"balanced: true", "airport references not in airports SFO:", "peak RSS"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	var nullCities int
	if err := db.GetContext(ctx, &nullCities, `SELECT count(*) FROM airports WHERE city IS NULL AND state IS NULL`); err != nil || nullCities != 1 {
		t.Errorf("airports with NULL city and state: %d, %v; want 1 (the NA row)", nullCities, err)
	}

	// A new run, from a session whose TimeZone is not UTC, changes nothing:
	// dep_local is a civil time and never passes through a zone.
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := pu.Query()
	q.Set("timezone", "America/New_York")
	pu.RawQuery = q.Encode()
	ny := sqlx.MustOpen("postgres", pu.String())
	t.Cleanup(func() { ny.Close() })
	out.Reset()
	rep, err = load(ctx, &out, ny, nil, src, days, airportsPath, options{concurrency: 2, newRun: true})
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out.String())
	}
	wantCounts = backfill.Counts{Read: int64(len(rows)), Unchanged: int64(len(rows)) - rejects, Rejected: rejects}
	if diff := cmp.Diff(wantCounts, rep.Counts); diff != "" {
		t.Errorf("replay counts (-want +got):\n%s\n%s", diff, out.String())
	}

	// The same command once more finds the run complete: a success that
	// says so (the command exits 0).
	out.Reset()
	again, err := load(ctx, &out, db, nil, src, days, airportsPath, options{concurrency: 2})
	if err != nil || again.BatchID != rep.BatchID || again.ChunksRun != 0 || !strings.Contains(out.String(), "nothing to do: the run was complete (-replay replays it)") {
		t.Errorf("load of a complete run: %+v, %v\n%s", again, err, out.String())
	}
}
