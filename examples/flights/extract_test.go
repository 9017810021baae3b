package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"

	"github.com/pgbackfill/backfill"
)

// srcRow has the columns and types of flights-3m.parquet.
type srcRow struct {
	Date        *int64  `parquet:"date,optional,timestamp(microsecond:local)"`
	Delay       *int64  `parquet:"delay,optional"`
	Distance    *int64  `parquet:"distance,optional"`
	Origin      *string `parquet:"origin,optional"`
	Destination *string `parquet:"destination,optional"`
}

func ptr[T any](v T) *T { return &v }

// at returns the civil time "2001-01-02 15:04" as microseconds.
func at(t testing.TB, civilTime string) *int64 {
	t.Helper()
	tm, err := time.Parse("2006-01-02 15:04:05.999999", civilTime)
	if err != nil {
		t.Fatal(err)
	}
	return ptr(tm.UnixMicro())
}

func flight(date *int64, origin, dest string, delay int64) srcRow {
	r := srcRow{Date: date, Delay: ptr(delay), Distance: ptr(int64(100))}
	if origin != "-" {
		r.Origin = ptr(origin)
	}
	if dest != "-" {
		r.Destination = ptr(dest)
	}
	return r
}

// writeParquet writes rows to a file in t.TempDir() with small row groups
// and pages, so that seeks cross both.
func writeParquet(t testing.TB, rows []srcRow, rowsPerGroup int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "flights.parquet")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := parquet.NewGenericWriter[srcRow](f, parquet.MaxRowsPerRowGroup(rowsPerGroup), parquet.PageBufferSize(512))
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func open(t testing.TB, path string, stride int64) *Flights {
	t.Helper()
	f, err := openFlights(path, stride)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// days returns n one-day chunks from civil midnight of first, in UTC, as
// backfill.Days builds them (built by hand so that these tests depend on
// the extractor only).
func days(first string, n int) []backfill.Chunk {
	d, _ := time.Parse("2006-01-02", first)
	var cs []backfill.Chunk
	for i := range n {
		s, e := d.AddDate(0, 0, i), d.AddDate(0, 0, i+1)
		cs = append(cs, backfill.Chunk{
			ID: "time:" + s.Format(time.RFC3339) + "/" + e.Format(time.RFC3339), Seq: i,
			Kind: backfilltype.KindTime, Start: s, End: e,
		})
	}
	return cs
}

// out is one row an extractor produced: written (Reason == "") or rejected.
type out struct {
	Chunk    int
	Dep      string
	Origin   string
	Dest     string
	Seq      int32
	Delay    any
	Distance any
	Column   string
	Reason   string
	FileRow  int64
}

type recorder struct {
	chunk int
	rows  []out
}

func (r *recorder) Write(ctx context.Context, v ...any) error {
	if len(v) != len(flightColumns) {
		return fmt.Errorf("%d values, want %d", len(v), len(flightColumns))
	}
	dep := v[0].(time.Time)
	if dep.Location() != time.UTC {
		return fmt.Errorf("dep_local in %s, want UTC", dep.Location())
	}
	r.rows = append(r.rows, out{Chunk: r.chunk, Dep: dep.Format("2006-01-02 15:04:05.999999"),
		Origin: v[1].(string), Dest: v[2].(string), Seq: v[3].(int32), Delay: v[4], Distance: v[5], FileRow: -1})
	return nil
}

func (r *recorder) Reject(ctx context.Context, raw any, column, reason string) error {
	m := raw.(map[string]any)
	o := out{Chunk: r.chunk, Column: column, Reason: reason, FileRow: m["file_row"].(int64)}
	if d, ok := m["date"].(string); ok {
		o.Dep = strings.Replace(d, "T", " ", 1) // raw dates are ISO 8601, without zone
	}
	r.rows = append(r.rows, o)
	return nil
}

// extractAll runs every chunk, concurrently when parallel, and returns the
// rows in chunk order.
func extractAll(t testing.TB, f *Flights, chunks []backfill.Chunk, parallel bool) []out {
	t.Helper()
	recs := make([]*recorder, len(chunks))
	errs := make([]error, len(chunks))
	var wg sync.WaitGroup
	for i, c := range chunks {
		recs[i] = &recorder{chunk: i}
		do := func() { errs[i] = f.Extract(context.Background(), c, recs[i]) }
		if parallel {
			wg.Go(do)
		} else {
			do()
		}
	}
	wg.Wait()
	var all []out
	for i, r := range recs {
		if errs[i] != nil {
			t.Fatalf("chunk %s: %v", chunks[i].ID, errs[i])
		}
		all = append(all, r.rows...)
	}
	return all
}

func TestExtractDayBoundariesAreHalfOpen(t *testing.T) {
	t.Parallel()
	rows := []srcRow{
		flight(at(t, "2001-01-01 23:59:59.999999"), "AAA", "BBB", 1),
		flight(at(t, "2001-01-02 00:00:00"), "AAA", "BBB", 2),
		flight(at(t, "2001-01-02 23:59:59.999999"), "AAA", "BBB", 3),
		flight(at(t, "2001-01-03 00:00:00"), "AAA", "BBB", 4),
	}
	f := open(t, writeParquet(t, rows, 2), 1)
	got := extractAll(t, f, days("2001-01-01", 3), false)
	want := []out{
		{Chunk: 0, Dep: "2001-01-01 23:59:59.999999", Origin: "AAA", Dest: "BBB", Seq: 1, Delay: int64(1), Distance: int64(100), FileRow: -1},
		{Chunk: 1, Dep: "2001-01-02 00:00:00", Origin: "AAA", Dest: "BBB", Seq: 1, Delay: int64(2), Distance: int64(100), FileRow: -1},
		{Chunk: 1, Dep: "2001-01-02 23:59:59.999999", Origin: "AAA", Dest: "BBB", Seq: 1, Delay: int64(3), Distance: int64(100), FileRow: -1},
		{Chunk: 2, Dep: "2001-01-03 00:00:00", Origin: "AAA", Dest: "BBB", Seq: 1, Delay: int64(4), Distance: int64(100), FileRow: -1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	first, end, ok := f.Scope()
	if !ok || first.Format(time.DateTime) != "2001-01-01 00:00:00" || end.Format(time.DateTime) != "2001-01-04 00:00:00" {
		t.Errorf("Scope() = %s, %s, %t; want [2001-01-01, 2001-01-04)", first, end, ok)
	}
}

func TestExtractNumbersRepeatedTriplesInFileOrder(t *testing.T) {
	t.Parallel()
	m := at(t, "2001-03-05 07:00:00")
	rows := []srcRow{
		flight(m, "LAS", "PHX", 10),
		flight(m, "LAS", "SFO", 11),
		flight(m, "LAS", "PHX", 12),
		flight(m, "-", "PHX", 13), // rejected: does not take a seq
		flight(m, "LAS", "PHX", 14),
		flight(at(t, "2001-03-05 07:01:00"), "LAS", "PHX", 15),
	}
	f := open(t, writeParquet(t, rows, 4), 2)
	var got []string
	for _, o := range extractAll(t, f, days("2001-03-05", 1), false) {
		got = append(got, fmt.Sprintf("%s %s-%s #%d %v %s", o.Dep, o.Origin, o.Dest, o.Seq, o.Delay, o.Reason))
	}
	want := []string{
		"2001-03-05 07:00:00 LAS-PHX #1 10 ",
		"2001-03-05 07:00:00 LAS-SFO #1 11 ",
		"2001-03-05 07:00:00 LAS-PHX #2 12 ",
		"2001-03-05 07:00:00 - #0 <nil> cannot derive key: origin is null",
		"2001-03-05 07:00:00 LAS-PHX #3 14 ",
		"2001-03-05 07:01:00 LAS-PHX #1 15 ",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}

func TestExtractRejectsRowsWithoutKey(t *testing.T) {
	t.Parallel()
	rows := []srcRow{
		flight(nil, "AAA", "BBB", 0), // leading null date: first date's chunk
		flight(at(t, "2001-01-01 10:00:00"), "AAA", "BBB", 1),
		flight(at(t, "2001-01-01 23:00:00"), "-", "BBB", 2),
		flight(nil, "AAA", "BBB", 3), // previous dated row is on Jan 1
		flight(at(t, "2001-01-02 01:00:00"), "AAA", "-", 4),
		flight(at(t, "2001-01-02 02:00:00"), " ", "BBB", 5),
		flight(at(t, "2001-01-02 03:00:00"), "AAA", "", 6),
		{Date: at(t, "2001-01-02 04:00:00"), Origin: ptr("AAA"), Destination: ptr("BBB")}, // null delay, distance: kept
		flight(nil, "AAA", "BBB", 7),                                                      // trailing null date: last date's chunk
	}
	for _, stride := range []int64{1, 3, 1024} {
		f := open(t, writeParquet(t, rows, 3), stride)
		var got []string
		for _, o := range extractAll(t, f, days("2001-01-01", 2), true) {
			if o.Reason == "" {
				got = append(got, fmt.Sprintf("%d write %s %v %v", o.Chunk, o.Dep, o.Delay, o.Distance))
			} else {
				got = append(got, fmt.Sprintf("%d row %d %s: %s", o.Chunk, o.FileRow, o.Column, o.Reason))
			}
		}
		want := []string{
			"0 row 0 dep_local: cannot derive key: date is null",
			"0 write 2001-01-01 10:00:00 1 100",
			"0 row 2 origin: cannot derive key: origin is null",
			"0 row 3 dep_local: cannot derive key: date is null",
			"1 row 4 destination: cannot derive key: destination is null",
			"1 row 5 origin: cannot derive key: origin is empty",
			"1 row 6 destination: cannot derive key: destination is empty",
			"1 write 2001-01-02 04:00:00 <nil> <nil>",
			"1 row 8 dep_local: cannot derive key: date is null",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("stride %d: rows (-want +got):\n%s", stride, diff)
		}
	}
}

// synthetic returns n flights over the given number of days, sorted by
// date, with repeated triples and about 1% null keys.
func synthetic(seed uint64, n, nDays int) []srcRow {
	rnd := rand.New(rand.NewPCG(seed, 0))
	codes := []string{"ABE", "BOS", "LAS", "PHX", "SFO"}
	start := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	// Few distinct minutes so that triples repeat.
	minutes := make([]int64, n)
	for i := range minutes {
		minutes[i] = start + int64(rnd.IntN(nDays*24*4))*15*int64(time.Minute/time.Microsecond)
	}
	rows := make([]srcRow, n)
	for i := range rows {
		r := flight(ptr(minutes[i]), codes[rnd.IntN(len(codes))], codes[rnd.IntN(len(codes))], int64(i))
		switch rnd.IntN(300) {
		case 0:
			r.Date = nil
		case 1:
			r.Origin = nil
		case 2:
			r.Destination = nil
		}
		rows[i] = r
	}
	// Sort by date, nulls staying where they are relative to the rows around them.
	var dated []int64
	for _, r := range rows {
		if r.Date != nil {
			dated = append(dated, *r.Date)
		}
	}
	slices.Sort(dated)
	j := 0
	for i := range rows {
		if rows[i].Date != nil {
			rows[i].Date = ptr(dated[j])
			j++
		}
	}
	return rows
}

// oracle computes, from the whole file at once, what the chunks together
// must produce: seq over the whole file, rejects for unkeyable rows.
func oracle(rows []srcRow) map[string]int {
	want := map[string]int{}
	seq := map[string]int{}
	for i, r := range rows {
		switch {
		case r.Date == nil || r.Origin == nil || r.Destination == nil:
			want[fmt.Sprintf("reject row %d", i)]++
		default:
			dep := time.UnixMicro(*r.Date).UTC().Format("2006-01-02 15:04:05.999999")
			k := dep + " " + *r.Origin + " " + *r.Destination
			seq[k]++
			want[fmt.Sprintf("%s #%d %d", k, seq[k], *r.Delay)]++
		}
	}
	return want
}

func asSet(t *testing.T, got []out) map[string]int {
	t.Helper()
	set := map[string]int{}
	for _, o := range got {
		if o.Reason != "" {
			set[fmt.Sprintf("reject row %d", o.FileRow)]++
			continue
		}
		set[fmt.Sprintf("%s %s %s #%d %v", o.Dep, o.Origin, o.Dest, o.Seq, o.Delay)]++
	}
	return set
}

func TestExtractTilesTheFile(t *testing.T) {
	t.Parallel()
	rows := synthetic(1, 4000, 6)
	want := oracle(rows)
	// Shuffled: same rows, unsorted file order. seq follows file order, so
	// the oracle is recomputed for it.
	shuffled := append([]srcRow(nil), rows...)
	rand.New(rand.NewPCG(2, 0)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for _, tc := range []struct {
		name   string
		rows   []srcRow
		stride int64
		sorted bool
	}{
		{"sorted stride 1", rows, 1, true},
		{"sorted stride 7", rows, 7, true},
		{"sorted stride 1024", rows, 1024, true},
		{"unsorted", shuffled, 64, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := open(t, writeParquet(t, tc.rows, 333), tc.stride)
			if f.idx.sorted != tc.sorted {
				t.Fatalf("index sorted = %t, want %t", f.idx.sorted, tc.sorted)
			}
			first, end, _ := f.Scope()
			n := int(end.Sub(first) / (24 * time.Hour))
			got := extractAll(t, f, days(first.Format(time.DateOnly), n), true)
			if int64(len(got)) != f.Rows() {
				t.Errorf("%d rows extracted, file has %d", len(got), f.Rows())
			}
			w := want
			if !tc.sorted {
				w = oracle(tc.rows)
			}
			if diff := cmp.Diff(w, asSet(t, got)); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			for _, o := range got {
				if o.Reason != "" && o.Dep == "" {
					continue // null date: checked by TestExtractRejectsRowsWithoutKey
				}
				if d := o.Dep[:10]; d != first.AddDate(0, 0, o.Chunk).Format(time.DateOnly) {
					t.Fatalf("row %+v in chunk %d", o, o.Chunk)
				}
			}
		})
	}
}

func TestExtractReadsOnlyNearItsChunk(t *testing.T) {
	t.Parallel()
	const stride = 50
	rows := synthetic(3, 6000, 30)
	f := open(t, writeParquet(t, rows, 700), stride)
	first, end, _ := f.Scope()
	chunks := days(first.Format(time.DateOnly), int(end.Sub(first)/(24*time.Hour)))
	for _, c := range chunks {
		before := f.Scanned()
		r := &recorder{}
		if err := f.Extract(context.Background(), c, r); err != nil {
			t.Fatal(err)
		}
		scanned := f.Scanned() - before
		// At most one stride before the first row, the rows themselves,
		// and the row after the last one (the first date past End).
		if limit := int64(len(r.rows)) + stride + 1; scanned > limit {
			t.Errorf("chunk %s: %d rows iterated for %d emitted, want at most %d", c.ID, scanned, len(r.rows), limit)
		}
	}
	// Outside the file's dates nothing is read at all.
	before := f.Scanned()
	if err := f.Extract(context.Background(), days("1999-01-01", 1)[0], &recorder{}); err != nil {
		t.Fatal(err)
	}
	if n := f.Scanned() - before; n != 0 {
		t.Errorf("chunk before the file: %d rows iterated, want 0", n)
	}
}

func TestExtractRefusesChunksItCannotRead(t *testing.T) {
	t.Parallel()
	f := open(t, writeParquet(t, []srcRow{flight(at(t, "2001-01-01 10:00:00"), "AAA", "BBB", 1)}, 10), 1)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip(err)
	}
	c := days("2001-01-01", 1)[0]
	zoned := c
	zoned.Start, zoned.End = c.Start.In(ny), c.End.In(ny)
	if err := f.Extract(context.Background(), zoned, &recorder{}); err == nil || !strings.Contains(err.Error(), "civil") {
		t.Errorf("zoned chunk: err = %v, want an error about civil times", err)
	}
	if err := f.Extract(context.Background(), backfill.Chunk{ID: "int:0/10", Kind: backfilltype.KindInt, Hi: 10}, &recorder{}); err == nil {
		t.Error("int chunk: no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Extract(ctx, c, &recorder{}); err == nil {
		t.Error("cancelled context: no error")
	}
}

func TestOpenFlightsChecksTheSchema(t *testing.T) {
	t.Parallel()
	type utcDate struct {
		Date        *int64  `parquet:"date,optional,timestamp(microsecond)"`
		Delay       *int64  `parquet:"delay,optional"`
		Distance    *int64  `parquet:"distance,optional"`
		Origin      *string `parquet:"origin,optional"`
		Destination *string `parquet:"destination,optional"`
	}
	type noDest struct {
		Date     *int64  `parquet:"date,optional,timestamp(microsecond:local)"`
		Delay    *int64  `parquet:"delay,optional"`
		Distance *int64  `parquet:"distance,optional"`
		Origin   *string `parquet:"origin,optional"`
	}
	for name, write := range map[string]func(*os.File) error{
		"utc": func(f *os.File) error {
			return parquet.Write(f, []utcDate{{Date: ptr(int64(0))}})
		},
		"destination": func(f *os.File) error {
			return parquet.Write(f, []noDest{{Date: ptr(int64(0))}})
		},
	} {
		path := filepath.Join(t.TempDir(), name+".parquet")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := write(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
		_, err = OpenFlights(path)
		if err == nil || !strings.Contains(err.Error(), `"`+map[string]string{"utc": "date", "destination": "destination"}[name]+`"`) {
			t.Errorf("%s: OpenFlights err = %v, want an error naming the column", name, err)
		}
	}
}

// TestRealFile runs over data/flights-3m.parquet when fetch-data.sh has
// fetched it.
func TestRealFile(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	path := filepath.Join("data", flightsFile)
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not fetched (run fetch-data.sh)", path)
	}
	f, err := OpenFlights(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first, end, _ := f.Scope()
	chunks, err := backfill.Days(first, end, time.UTC).Chunks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n, rejected int64
	maxSeq := int32(0)
	for _, c := range chunks {
		w := &tally{}
		if err := f.Extract(context.Background(), c, w); err != nil {
			t.Fatal(err)
		}
		n, rejected, maxSeq = n+w.rows, rejected+w.rejects, max(maxSeq, w.maxSeq)
	}
	if len(chunks) != 182 || n != 3_000_000 || rejected != 0 || maxSeq != 3 {
		t.Errorf("%d chunks, %d rows, %d rejected, max seq %d; want 182, 3000000, 0, 3", len(chunks), n, rejected, maxSeq)
	}
	if amp := float64(f.Scanned()) / float64(n); amp > 1.05 {
		t.Errorf("%d rows iterated for %d emitted (%.3fx)", f.Scanned(), n, amp)
	}
}

type tally struct {
	rows, rejects int64
	maxSeq        int32
}

func (w *tally) Write(ctx context.Context, v ...any) error {
	w.rows++
	w.maxSeq = max(w.maxSeq, v[3].(int32))
	return nil
}

func (w *tally) Reject(ctx context.Context, raw any, column, reason string) error {
	w.rejects++
	return nil
}

func BenchmarkExtractDay(b *testing.B) {
	path := filepath.Join("data", flightsFile)
	if _, err := os.Stat(path); err != nil {
		b.Skipf("%s not fetched (run fetch-data.sh)", path)
	}
	f, err := OpenFlights(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	c := days("2001-04-11", 1)[0]
	for b.Loop() {
		if err := f.Extract(context.Background(), c, &tally{}); err != nil {
			b.Fatal(err)
		}
	}
}
