package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
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

// selectQuakes returns the rows of table ordered by id.
func selectQuakes(t *testing.T, db *sqlx.DB, table string) []Quake {
	t.Helper()
	var rows []Quake
	if err := db.Select(&rows, `SELECT `+strings.Join(quakeColumns, ", ")+` FROM `+table+` ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	return rows
}

// loadable returns the convertible features of src, ordered by id.
func loadable(src *Quakes) []Quake {
	var qs []Quake
	for _, f := range src.Features() {
		if f.Reason == "" {
			qs = append(qs, f.Quake)
		}
	}
	slices.SortFunc(qs, func(a, b Quake) int { return strings.Compare(a.ID, b.ID) })
	return qs
}

type rowVersion struct {
	ID   string `db:"id"`
	Xmin string `db:"xmin"`
	Ctid string `db:"ctid"`
}

func rowVersionsOf(t *testing.T, db *sqlx.DB) []rowVersion {
	t.Helper()
	var v []rowVersion
	if err := db.Select(&v, `SELECT id, xmin::text AS xmin, ctid::text AS ctid FROM earthquakes ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestLoadReplay loads a synthetic file, checks the table and the
// exception queue, then replays it with Job.NewRun: every row is
// unchanged and not one is rewritten (same xmin and ctid).
func TestLoadReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	src := openSynthetic(t)
	first, end, _ := src.Scope()
	days := backfill.Days(first, end, time.UTC)
	chunks, _ := days.Chunks(ctx)

	var out bytes.Buffer
	rep, err := load(ctx, &out, db, nil, src, days, options{concurrency: 2})
	if err != nil {
		t.Fatalf("load: %v\n%s", err, out.String())
	}
	n := int64(src.Len())
	if diff := cmp.Diff(backfill.Counts{Read: n, Inserted: n - syntheticRejects, Rejected: syntheticRejects}, rep.Counts); diff != "" {
		t.Errorf("counts (-want +got):\n%s\n%s", diff, out.String())
	}
	if diff := cmp.Diff(loadable(src), selectQuakes(t, db, quakesTable)); diff != "" {
		t.Errorf("earthquakes table (-want +got):\n%s", diff)
	}
	for _, s := range []string{"balanced: true", "chunks whose ledger disagrees with the target: 0", `1 x "id: feature id: missing"`} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}

	// The exception queue: the feature without id in its own day, the
	// feature without time in the first chunk, each with the raw feature.
	exc, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	type ex struct{ Chunk, Column, Reason string }
	var got []ex
	for _, e := range exc {
		got = append(got, ex{e.ChunkID, e.Column, e.Reason})
		if !strings.Contains(string(e.Raw), `"feature_index"`) || !strings.Contains(string(e.Raw), `"Feature"`) {
			t.Errorf("exception raw %s lacks the feature", e.Raw)
		}
	}
	want := []ex{
		{chunks[0].ID, "event_time", "property time: missing"},
		{chunks[1].ID, "id", "feature id: missing"},
		{chunks[1].ID, "mag", `property mag: "big" is not a number`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("exceptions (-want +got):\n%s", diff)
	}

	// Replay: a new run over the same file writes nothing.
	before := rowVersionsOf(t, db)
	out.Reset()
	rep2, rewritten, err := replay(ctx, &out, db, nil, src, days, options{concurrency: 2})
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out.String())
	}
	if rep2.BatchID == rep.BatchID {
		t.Errorf("replay reused batch %d", rep.BatchID)
	}
	if diff := cmp.Diff(backfill.Counts{Read: n, Unchanged: n - syntheticRejects, Rejected: syntheticRejects}, rep2.Counts); diff != "" {
		t.Errorf("replay counts (-want +got):\n%s\n%s", diff, out.String())
	}
	if diff := cmp.Diff(before, rowVersionsOf(t, db)); diff != "" || rewritten != 0 {
		t.Errorf("replay rewrote rows (reported %d; -before +after):\n%s", rewritten, diff)
	}

	// Running the job again without NewRun does nothing, and says so: the
	// run is complete, which is a success (the command exits 0 and goes
	// on to -replay).
	out.Reset()
	rep3, err := load(ctx, &out, db, nil, src, days, options{concurrency: 2})
	if err != nil || rep3.BatchID != rep2.BatchID || rep3.Resumed || rep3.ChunksRun != 0 || !strings.Contains(out.String(), "nothing to do: the run was complete") {
		t.Errorf("third call: %+v, %v\n%s", rep3, err, out.String())
	}
	out.Reset()
	if rep4, _, err := replay(ctx, &out, db, nil, src, days, options{concurrency: 2}); err != nil || rep4.BatchID == rep3.BatchID {
		t.Errorf("replay after a complete load: %+v, %v\n%s", rep4, err, out.String())
	}
}

// version returns a copy of the features of src with ids in ids, changed
// by edit: another source version of those events.
func version(src *Quakes, ids []string, edit func(q *Quake)) []Feature {
	var out []Feature
	for _, f := range src.Features() {
		if f.Reason == "" && slices.Contains(ids, f.Quake.ID) {
			q := f.Quake
			edit(&q)
			f.Quake = q
			out = append(out, f)
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// TestVersionOrder delivers three source versions of some events in every
// order, and all at once, each arrangement into a table of its own. With
// NewerVersionWins on source_updated_at every table ends equal to the
// in-order one, which holds each event's newest version.
func TestVersionOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	if _, err := db.Exec(schemaDDL); err != nil {
		t.Fatal(err)
	}
	src := openSynthetic(t)
	first, end, _ := src.Scope()
	days := backfill.Days(first, end, time.UTC)

	// older: a version before the file's (an automatic solution, later
	// reviewed), of events on every day; newer: corrections after it. "ak2"
	// has a newer version with the file's very same updated time and
	// another magnitude: a tie, broken by the library by content.
	older := version(src, []string{"uw6", "nc1", "ci3", "hv5"}, func(q *Quake) {
		q.Updated = q.Updated.Add(-30 * time.Minute)
		q.Status, q.Mag = ptr("automatic"), ptr(1.0)
	})
	newer := version(src, []string{"uw6", "us7", "ci3"}, func(q *Quake) {
		q.Updated = q.Updated.Add(6 * time.Hour)
		q.Status, q.Mag, q.Place = ptr("reviewed"), ptr(5.5), ptr("revised place")
	})
	newer = append(newer, version(src, []string{"ak2"}, func(q *Quake) { q.Mag = ptr(9.9) })...)
	deliveries := map[string]*Quakes{"older": NewQuakes(older), "file": src, "newer": NewQuakes(newer)}

	run := func(table string, order []*Quakes) []Quake {
		t.Helper()
		if _, err := db.Exec(`CREATE TABLE ` + table + ` (LIKE earthquakes INCLUDING ALL)`); err != nil {
			t.Fatal(err)
		}
		r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range order {
			if _, err := r.Run(ctx, quakeJob(fmt.Sprintf("%s-%d", table, i), "test", d, days, table, false)); err != nil {
				t.Fatalf("%s delivery %d: %v", table, i, err)
			}
		}
		return selectQuakes(t, db, table)
	}

	inOrder := run("in_order", []*Quakes{deliveries["older"], deliveries["file"], deliveries["newer"]})
	// The in-order table: the file's events, with the newer versions
	// applied; "ak2" keeps whichever side of the tie wins, in every order.
	want := map[string]Quake{}
	for _, q := range loadable(src) {
		want[q.ID] = q
	}
	for _, f := range newer {
		if f.Quake.ID != "ak2" {
			want[f.Quake.ID] = f.Quake
		}
	}
	var ak2 Quake
	for i, q := range inOrder {
		if q.ID == "ak2" {
			ak2 = q
			inOrder[i] = want["ak2"] // compared below, whichever won
		}
	}
	if ak2.Mag == nil || (*ak2.Mag != 9.9 && *ak2.Mag != 1.4) {
		t.Errorf("ak2 after a tie: %+v", ak2)
	}
	var wantRows []Quake
	for _, q := range loadable(src) {
		wantRows = append(wantRows, want[q.ID])
	}
	if diff := cmp.Diff(wantRows, inOrder); diff != "" {
		t.Errorf("in-order table (-want +got):\n%s", diff)
	}
	inOrder = selectQuakes(t, db, "in_order")

	perms := [][]string{
		{"older", "newer", "file"}, {"file", "older", "newer"}, {"file", "newer", "older"},
		{"newer", "older", "file"}, {"newer", "file", "older"},
	}
	for i, p := range perms {
		var order []*Quakes
		for _, name := range p {
			order = append(order, deliveries[name])
		}
		got := run(fmt.Sprintf("perm_%d", i), order)
		if diff := cmp.Diff(inOrder, got); diff != "" {
			t.Errorf("arrival order %v differs from in order (-in order +got):\n%s", p, diff)
		}
	}
	// All versions in one delivery (so in the same chunks), newest last
	// and newest first in the stream.
	all := append(append(append([]Feature{}, older...), src.Features()...), newer...)
	reversed := slices.Clone(all)
	slices.Reverse(reversed)
	for name, fs := range map[string][]Feature{"one_delivery": all, "one_delivery_reversed": reversed} {
		got := run(name, []*Quakes{NewQuakes(fs)})
		if diff := cmp.Diff(inOrder, got); diff != "" {
			t.Errorf("%s differs from in order (-in order +got):\n%s", name, diff)
		}
	}
}

// TestCorrectionDemo runs the -correction demo on the synthetic file.
func TestCorrectionDemo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	src := openSynthetic(t)
	first, end, _ := src.Scope()
	hours := backfill.Hours(first, end, time.UTC)
	var out bytes.Buffer
	o := options{concurrency: 2, corrections: 2}
	if _, err := load(ctx, &out, db, nil, src, hours, o); err != nil {
		t.Fatalf("load: %v\n%s", err, out.String())
	}
	for range 2 { // rerunnable
		out.Reset()
		res, err := correction(ctx, &out, db, nil, src, hours, o)
		if err != nil {
			t.Fatalf("correction: %v\n%s", err, out.String())
		}
		if !res.Same() || res.Corrections != 2 {
			t.Errorf("correction: %+v\n%s", res, out.String())
		}
		// Out of order: the late original's two older versions lose, and
		// the library counts them as unchanged.
		late := res.Arrangements[1].Reports[1].Counts
		loadableN := int64(src.Len() - syntheticRejects)
		if diff := cmp.Diff(backfill.Counts{Read: int64(src.Len()), Inserted: loadableN - 2, Unchanged: 2, Rejected: syntheticRejects}, late); diff != "" {
			t.Errorf("late original (-want +got):\n%s\n%s", diff, out.String())
		}
		// One delivery: the older versions lose inside their chunks.
		one := res.Arrangements[2].Reports[0].Counts
		if one.Deduplicated != 2 || one.Inserted != loadableN {
			t.Errorf("one delivery: %+v\n%s", one, out.String())
		}
	}
	// The earthquakes table itself is untouched.
	if diff := cmp.Diff(loadable(src), selectQuakes(t, db, quakesTable)); diff != "" {
		t.Errorf("earthquakes table (-want +got):\n%s", diff)
	}
}
