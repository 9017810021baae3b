package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/parquet-go/parquet-go"

	"github.com/pgbackfill/backfill"
)

// flightColumns are the target columns, in the order Extract writes them.
var flightColumns = []string{"dep_local", "origin", "destination", "seq", "delay", "distance"}

// flightKey is the business key of the flights table.
var flightKey = []string{"dep_local", "origin", "destination", "seq"}

// Source column names in the parquet file.
const (
	colDate        = "date"
	colDelay       = "delay"
	colDistance    = "distance"
	colOrigin      = "origin"
	colDestination = "destination"
)

// The column order of a cursor opened on every column.
const (
	iDate = iota
	iDelay
	iDistance
	iOrigin
	iDestination
	numCols
)

// civilTimestamp is the logical type the date column must have: a
// timestamp that is NOT adjusted to UTC, i.e. a wall-clock reading without
// a zone, in microseconds.
const civilTimestamp = "TIMESTAMP(isAdjustedToUTC=false,unit=MICROS)"

// defaultStride is the distance in rows between two samples of the
// position index: a chunk starts reading at most this many rows before its
// first row.
const defaultStride = 1024

// batchSize is how many values a cursor reads per column at once.
const batchSize = 1024

// Flights reads flights-3m.parquet (or any file with the same columns) one
// chunk at a time. It implements [backfill.Extractor] for KindTime chunks
// whose bounds are civil times expressed in UTC (see Extract).
//
// OpenFlights scans the date column once and keeps a small index; each
// Extract then reads only the rows near its interval, from row groups
// decoded once and shared by the calls in flight (rowGroup). Extract is
// safe for concurrent use: the file is only read with ReadAt, and a
// decoded row group is only read.
type Flights struct {
	file    *os.File
	pf      *parquet.File
	cols    [numCols]int // leaf column index of each source column
	rgFirst []int64      // global row number of each row group's first row
	idx     flightIndex
	rgs     rowGroups // decoded row groups shared by the Extract calls

	// scanned counts the rows Extract iterated over (emitted or skipped),
	// summed over all calls; it measures read amplification.
	scanned atomic.Int64
}

// flightIndex is built once by OpenFlights from the date column alone.
// Null dates take the "effective date" of the previous non-null date in
// file order (the first non-null date for leading nulls), so that every
// row belongs to exactly one chunk.
type flightIndex struct {
	rows      int64
	nullDates int64
	// min and max are the smallest and largest non-null dates, in
	// microseconds since 1970-01-01T00:00 civil time; ok is false when the
	// file has no non-null date.
	min, max int64
	ok       bool
	// leading is the effective date of null dates before the first
	// non-null one (the first non-null date).
	leading int64
	// sorted is true when the non-null dates never decrease in file order.
	sorted bool
	// stride and samples: samples[i] is the effective date of global row
	// i*stride. Only used when sorted.
	stride  int64
	samples []int64
	// rgs holds, per row group, the range of effective dates and the
	// effective date carried into it. Used when not sorted.
	rgs []rgRange
	// built is how long the index took to build.
	built time.Duration
}

type rgRange struct {
	min, max int64 // effective dates
	carryIn  int64 // effective date of the row before the group
	empty    bool
}

// OpenFlights opens path, checks its schema and builds the index.
func OpenFlights(path string) (*Flights, error) {
	return openFlights(path, defaultStride)
}

func openFlights(path string, stride int64) (*Flights, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("flights: %w", err)
	}
	st, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("flights: %w", err)
	}
	pf, err := parquet.OpenFile(file, st.Size(), parquet.SkipBloomFilters(true))
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("flights: open %s: %w", path, err)
	}
	f := &Flights{file: file, pf: pf}
	if err := f.checkSchema(); err != nil {
		file.Close()
		return nil, fmt.Errorf("flights: %s: %w", path, err)
	}
	var first int64
	for _, rg := range pf.RowGroups() {
		f.rgFirst = append(f.rgFirst, first)
		first += rg.NumRows()
	}
	if err := f.buildIndex(stride); err != nil {
		file.Close()
		return nil, fmt.Errorf("flights: %s: index: %w", path, err)
	}
	return f, nil
}

// Close closes the file.
func (f *Flights) Close() error { return f.file.Close() }

// checkSchema finds the source columns by name and checks their types, so
// that a different export fails here rather than loading wrong values.
func (f *Flights) checkSchema() error {
	want := [numCols]struct {
		name string
		ok   func(parquet.Type) bool
		desc string
	}{
		iDate:        {colDate, func(t parquet.Type) bool { return t.Kind() == parquet.Int64 && logical(t) == civilTimestamp }, "int64 " + civilTimestamp},
		iDelay:       {colDelay, isInt, "int32 or int64"},
		iDistance:    {colDistance, isInt, "int32 or int64"},
		iOrigin:      {colOrigin, isString, "byte array (STRING)"},
		iDestination: {colDestination, isString, "byte array (STRING)"},
	}
	schema := f.pf.Schema()
	for i, w := range want {
		leaf, ok := schema.Lookup(w.name)
		if !ok {
			return fmt.Errorf("column %q not found", w.name)
		}
		if leaf.MaxRepetitionLevel > 0 {
			return fmt.Errorf("column %q is repeated, want a flat column", w.name)
		}
		if t := leaf.Node.Type(); !w.ok(t) {
			return fmt.Errorf("column %q has type %v %s, want %s", w.name, t.Kind(), logical(t), w.desc)
		}
		f.cols[i] = leaf.ColumnIndex
	}
	return nil
}

func logical(t parquet.Type) string {
	if lt := t.LogicalType(); lt != nil {
		return lt.String()
	}
	return ""
}

func isInt(t parquet.Type) bool { return t.Kind() == parquet.Int64 || t.Kind() == parquet.Int32 }

func isString(t parquet.Type) bool {
	return t.Kind() == parquet.ByteArray && (logical(t) == "STRING" || logical(t) == "")
}

func intOf(v parquet.Value) int64 {
	if v.Kind() == parquet.Int32 {
		return int64(v.Int32())
	}
	return v.Int64()
}

// buildIndex reads the date column once, keeping O(rows/stride + row
// groups) numbers.
func (f *Flights) buildIndex(stride int64) error {
	start := time.Now()
	ix := flightIndex{sorted: true, stride: stride}
	var (
		prev       int64 // last non-null date
		firstDated int64 = -1
		pending    []int // row groups that start before the first date
	)
	for g, rg := range f.pf.RowGroups() {
		ix.rgs = append(ix.rgs, rgRange{carryIn: prev, empty: true})
		if firstDated < 0 {
			pending = append(pending, g)
		}
		cur, err := f.openCursor(g, 0, []int{f.cols[iDate]})
		if err != nil {
			return err
		}
		row := f.rgFirst[g]
		for {
			n, err := cur.next()
			if err != nil {
				cur.close()
				return err
			}
			if n == 0 {
				break
			}
			for _, v := range cur.vals[0][:n] {
				if v.IsNull() {
					ix.nullDates++
				} else {
					d := v.Int64()
					if firstDated < 0 {
						firstDated, ix.ok, ix.min, ix.max, ix.leading = row, true, d, d, d
					} else if d < prev {
						ix.sorted = false
					}
					ix.min, ix.max = min(ix.min, d), max(ix.max, d)
					prev = d
				}
				// Effective date; rows before the first date are patched below.
				eff := prev
				if row%stride == 0 {
					ix.samples = append(ix.samples, eff)
				}
				if r := &ix.rgs[g]; firstDated >= 0 {
					if r.empty {
						r.min, r.max, r.empty = eff, eff, false
					}
					r.min, r.max = min(r.min, eff), max(r.max, eff)
				}
				row++
			}
		}
		cur.close()
		ix.rows += rg.NumRows()
	}
	if ix.rows != f.pf.NumRows() {
		return fmt.Errorf("row groups hold %d rows, footer says %d", ix.rows, f.pf.NumRows())
	}
	if !ix.ok {
		firstDated = ix.rows
	}
	// Rows before the first date take the first date as effective date.
	for i := range ix.samples {
		if int64(i)*stride < firstDated {
			ix.samples[i] = ix.leading
		}
	}
	for _, g := range pending {
		r := &ix.rgs[g]
		r.carryIn = ix.leading
		if ix.ok && f.pf.RowGroups()[g].NumRows() > 0 {
			if r.empty {
				r.min, r.max, r.empty = ix.leading, ix.leading, false
			}
			r.min = min(r.min, ix.leading)
		}
	}
	ix.built = time.Since(start)
	f.idx = ix
	return nil
}

// Rows returns the number of rows in the file.
func (f *Flights) Rows() int64 { return f.idx.rows }

// Scope returns the half-open civil-day range [first, end) that covers
// every row: midnight of the earliest date and midnight after the latest,
// as UTC times standing for civil times. ok is false when no row has a
// date.
func (f *Flights) Scope() (first, end time.Time, ok bool) {
	if !f.idx.ok {
		return time.Time{}, time.Time{}, false
	}
	day := func(us int64) time.Time { return civil(us).Truncate(24 * time.Hour) }
	return day(f.idx.min), day(f.idx.max).AddDate(0, 0, 1), true
}

// Scanned returns how many rows Extract calls have iterated over so far.
func (f *Flights) Scanned() int64 { return f.scanned.Load() }

// civil returns the civil time us (microseconds since 1970-01-01T00:00 on
// a wall clock without zone) as a time.Time in UTC whose fields read that
// wall clock. No zone conversion happens anywhere.
func civil(us int64) time.Time { return time.UnixMicro(us).UTC() }

// civilMicros is the inverse of civil for a bound of a chunk. A chunk
// chunked in UTC (offset 0) is read as a civil range; any other offset
// would mean the caller thinks of instants, which this data does not have.
func civilMicros(t time.Time) (int64, error) {
	if _, off := t.Zone(); off != 0 {
		return 0, fmt.Errorf("chunk bound %s has UTC offset %ds: flights dates are civil times, chunk them in time.UTC", t.Format(time.RFC3339), off)
	}
	return t.UnixMicro(), nil
}

// Extract writes the flights whose civil departure time lies in the
// half-open [c.Start, c.End), in file order, as (dep_local, origin,
// destination, seq, delay, distance). c must be a KindTime chunk in UTC,
// whose bounds are read as civil times (see README: "Time").
//
// seq numbers the rows of one (dep_local, origin, destination) triple
// 1, 2, 3... in file order. All rows of a triple share dep_local and so
// lie in the same chunk, whatever the chunking: seq needs no state across
// chunks.
//
// Rows without a date, origin or destination cannot be keyed and go to
// w.Reject; a row without a date belongs to the chunk of the previous
// dated row in file order. Nothing is dropped.
func (f *Flights) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	if c.Kind != backfilltype.KindTime {
		return fmt.Errorf("flights: extract: chunk %s is %s, want %s", c.ID, c.Kind, backfilltype.KindTime)
	}
	lo, err := civilMicros(c.Start)
	if err != nil {
		return fmt.Errorf("flights: extract: %w", err)
	}
	hi, err := civilMicros(c.End)
	if err != nil {
		return fmt.Errorf("flights: extract: %w", err)
	}
	// Every effective date lies in [min, max].
	if !f.idx.ok || lo >= hi || hi <= f.idx.min || lo > f.idx.max {
		return ctx.Err()
	}
	e := emitter{f: f, w: w, lo: lo, hi: hi, seq: make(map[triple]int32)}
	if f.idx.sorted {
		// The last sample before lo: every row before it has an
		// effective date <= that sample < lo.
		i := sort.Search(len(f.idx.samples), func(i int) bool { return f.idx.samples[i] >= lo }) - 1
		from, carry := int64(0), f.idx.leading
		if i >= 0 {
			from, carry = int64(i)*f.idx.stride, f.idx.samples[i]
		}
		g := sort.Search(len(f.rgFirst), func(g int) bool { return f.rgFirst[g] > from }) - 1
		e.prev = carry
		for off := from - f.rgFirst[g]; g < len(f.rgFirst); g, off = g+1, 0 {
			done, err := e.scan(ctx, g, off)
			if err != nil || done {
				return err
			}
		}
		return nil
	}
	for g, r := range f.idx.rgs {
		if r.empty || r.max < lo || r.min >= hi {
			continue
		}
		e.prev = r.carryIn
		if _, err := e.scan(ctx, g, 0); err != nil {
			return err
		}
	}
	return nil
}

type triple struct {
	dep                 int64
	origin, destination string
}

// emitter is the state of one Extract call.
type emitter struct {
	f      *Flights
	w      backfill.RowWriter
	lo, hi int64
	prev   int64 // effective date of the previous row
	seq    map[triple]int32
	seqDep int64 // the dep_local the seq map holds (sorted files only)
	// dep is depAt as the time Write takes, boxed once per minute.
	dep   any
	depAt int64
	args  [6]any // the values of the row being written
}

// scan reads row group g from row off and emits the rows in [lo, hi). It
// returns done once a sorted file passes hi.
func (e *emitter) scan(ctx context.Context, g int, off int64) (done bool, err error) {
	f := e.f
	rg, release, err := f.rowGroup(g)
	if err != nil {
		return false, err
	}
	defer release()
	dates := &rg.cols[iDate]
	scanned := int64(0)
	defer func() { f.scanned.Add(scanned) }()
	for r := off; r < rg.rows; r++ {
		if scanned%batchSize == 0 {
			if err := ctx.Err(); err != nil {
				return false, err
			}
		}
		scanned++
		dv := dates.value(r)
		d := e.prev
		if !dv.IsNull() {
			d = dv.Int64()
			e.prev = d
		}
		if d >= e.hi && f.idx.sorted && !dv.IsNull() {
			return true, nil
		}
		if d < e.lo || d >= e.hi {
			continue
		}
		if err := e.emit(ctx, rg, f.rgFirst[g]+r, d, r); err != nil {
			return false, err
		}
	}
	return false, nil
}

// emit writes row r of rg (row of the file), whose effective date is d.
func (e *emitter) emit(ctx context.Context, rg *rowGroup, row, d, r int64) error {
	cols := &rg.cols
	date, origin, dest := cols[iDate].codes.at(r), cols[iOrigin].codes.at(r), cols[iDestination].codes.at(r)
	var column, why string
	switch {
	case date == 0:
		column, why = "dep_local", "date is null"
	case origin == 0:
		column, why = "origin", "origin is null"
	case dest == 0:
		column, why = "destination", "destination is null"
	case strings.TrimSpace(cols[iOrigin].boxed[origin].(string)) == "":
		column, why = "origin", "origin is empty"
	case strings.TrimSpace(cols[iDestination].boxed[dest].(string)) == "":
		column, why = "destination", "destination is empty"
	}
	if why != "" {
		return e.w.Reject(ctx, rawRow(row, rg, r), column, "cannot derive key: "+why)
	}
	k := triple{dep: d, origin: cols[iOrigin].boxed[origin].(string), destination: cols[iDestination].boxed[dest].(string)}
	if e.f.idx.sorted && d != e.seqDep {
		// Rows of one dep_local are contiguous: the map only ever holds
		// the current minute's triples.
		clear(e.seq)
		e.seqDep = d
	}
	e.seq[k]++
	if e.dep == nil || d != e.depAt {
		// Rows of one minute are mostly adjacent: one boxed time each.
		e.dep, e.depAt = civil(d), d
	}
	delay, distance := &cols[iDelay], &cols[iDistance]
	// One slice for every row: a variadic call would allocate one per row.
	e.args = [...]any{e.dep, cols[iOrigin].boxed[origin], cols[iDestination].boxed[dest], e.seq[k],
		delay.boxed[delay.codes.at(r)], distance.boxed[distance.codes.at(r)]}
	return e.w.Write(ctx, e.args[:]...)
}

func nullableInt(v parquet.Value) any {
	if v.IsNull() {
		return nil
	}
	return intOf(v)
}

// rawRow is the source row as given to Reject: the file's own column names
// and values, plus its 0-based position in the file.
func rawRow(row int64, rg *rowGroup, r int64) map[string]any {
	str := func(v parquet.Value) any {
		if v.IsNull() {
			return nil
		}
		return string(v.ByteArray())
	}
	var date any
	if v := rg.cols[iDate].value(r); !v.IsNull() {
		date = civil(v.Int64()).Format("2006-01-02T15:04:05.999999")
	}
	return map[string]any{
		"file_row":     row,
		colDate:        date,
		colDelay:       nullableInt(rg.cols[iDelay].value(r)),
		colDistance:    nullableInt(rg.cols[iDistance].value(r)),
		colOrigin:      str(rg.cols[iOrigin].value(r)),
		colDestination: str(rg.cols[iDestination].value(r)),
	}
}

// cursor reads some columns of one row group in aligned batches, starting
// at a row offset. Memory: one decoded page per column plus batchSize
// values per column. Pages go back to parquet-go's buffer pool once the
// batch that used them has been consumed (the next call to next, or close).
type cursor struct {
	pages   []parquet.Pages
	page    []parquet.Page // the page each column is reading, or nil
	rdrs    []parquet.ValueReader
	retired []parquet.Page // pages finished during the last batch
	vals    [numCols][]parquet.Value
	left    int64 // rows left in the row group
}

func (f *Flights) openCursor(g int, off int64, cols []int) (*cursor, error) {
	rg := f.pf.RowGroups()[g]
	chunks := rg.ColumnChunks()
	cur := &cursor{
		left: rg.NumRows() - off,
		page: make([]parquet.Page, len(cols)),
		rdrs: make([]parquet.ValueReader, len(cols)),
	}
	for i, col := range cols {
		p := chunks[col].Pages()
		cur.pages = append(cur.pages, p)
		if err := p.SeekToRow(off); err != nil {
			cur.close()
			return nil, fmt.Errorf("row group %d: seek to row %d: %w", g, off, err)
		}
		cur.vals[i] = make([]parquet.Value, batchSize)
	}
	return cur, nil
}

// next reads the next batch and returns its length, 0 at the end. The
// values of the previous batch are invalid afterwards.
func (c *cursor) next() (int, error) {
	c.release()
	want := int(min(int64(batchSize), c.left))
	if want == 0 {
		return 0, nil
	}
	for i := range c.pages {
		got := 0
		for got < want {
			if c.page[i] == nil {
				p, err := c.pages[i].ReadPage()
				if err != nil {
					if errors.Is(err, io.EOF) {
						return 0, fmt.Errorf("column %d ended %d rows early", i, c.left-int64(got))
					}
					return 0, err
				}
				c.page[i], c.rdrs[i] = p, p.Values()
			}
			n, err := c.rdrs[i].ReadValues(c.vals[i][got:want])
			got += n
			if errors.Is(err, io.EOF) {
				c.retired = append(c.retired, c.page[i])
				c.page[i], c.rdrs[i] = nil, nil
			} else if err != nil {
				return 0, err
			}
		}
	}
	c.left -= int64(want)
	return want, nil
}

func (c *cursor) release() {
	for _, p := range c.retired {
		parquet.Release(p)
	}
	c.retired = c.retired[:0]
}

func (c *cursor) close() {
	c.release()
	for i, p := range c.page {
		if p != nil {
			parquet.Release(p)
			c.page[i] = nil
		}
	}
	for _, p := range c.pages {
		p.Close()
	}
}
