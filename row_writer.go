package backfill

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"github.com/pgbackfill/backfill/internal/spool"
	"math"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgconv"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/rawvalue"
)

// rowWriter converts, stages and counts one chunk's rows.
type rowWriter struct {
	chunk      Chunk
	info       TableInfo
	names      []string
	rules      map[string]KeyRule
	chunkCol   int // index of Job.ChunkColumn in the written columns, -1 for none
	zone       *time.Location
	ingested   string
	stager     pgstore.RowAdder // the chunk's Stager, or its spool
	maxRejects int
	// priorRejected are the rows the sub-chunks of the chunk committed
	// before this one rejected: maxRejects bounds the plan chunk's
	// rejects, theirs and this sub-chunk's together.
	priorRejected int64
	buf           []any
	convs         []pgconv.Converter // per column, resolved once
	hasher        pgstore.RowHasher  // Target.HashColumn's, built once
	// timeCols: per written column, whether it is a date, timestamp or
	// timestamptz (timeValue), resolved once.
	timeCols []bool

	row, read, rejected int64
	exceptions          []Exception
	err                 error // sticky: staging failed, the chunk cannot go on
	closed              bool

	// stagingRejects are values PostgreSQL refused in an earlier staging
	// of the chunk ([chunkStaging]); lines maps staged lines to rows.
	stagingRejects *stagingRejects
	lines          stagingLines

	// fp is the source fingerprint of the rows as written (a job with
	// SkipUnchanged; nil without), summed by Write and Reject; fpState
	// is the current row's: fpNone, or encoded in fp.buf (fpRaw), or to
	// be encoded with its converted values (fpMixed).
	fp      *rawFingerprint
	fpState uint8

	// mem, when set, is the share of Config.MemoryBudget the held
	// rejected rows are counted against; held is what this writer's
	// rejects reserved (given back by releaseMem).
	mem  *spool.Budget
	held int64
}

// releaseMem gives the bytes the writer's held rejects reserved back.
func (w *rowWriter) releaseMem() {
	if w.mem != nil && w.held > 0 {
		w.mem.Release(w.held)
		w.held = 0
	}
}

// States of the current row's fingerprint (rowWriter.fpState).
const (
	fpNone uint8 = iota
	fpRaw
	fpMixed
)

func newRowWriter(c Chunk, job Job, info TableInfo, st pgstore.RowAdder, maxRejects int, started time.Time) *rowWriter {
	names := make([]string, len(info.Columns))
	convs := make([]pgconv.Converter, len(info.Columns))
	timeCols := make([]bool, len(info.Columns))
	for i, col := range info.Columns {
		names[i] = col.Name
		convs[i] = pgconv.For(col.Conv())
		switch col.BaseType {
		case "date", "timestamp", "timestamptz":
			timeCols[i] = true
		}
	}
	rules := map[string]KeyRule{}
	for _, r := range info.Target.Derive {
		rules[r.Column] = r
	}
	w := &rowWriter{chunk: c, info: info, names: names, convs: convs, timeCols: timeCols, rules: rules, stager: st, maxRejects: maxRejects,
		buf: make([]any, len(info.Columns)), chunkCol: -1, zone: cmp.Or(job.Zone, time.UTC),
		ingested: started.Truncate(time.Microsecond).Format(time.RFC3339Nano)}
	if job.ChunkColumn != "" {
		w.chunkCol = slices.Index(names[:info.Written], job.ChunkColumn)
	}
	if info.Target.HashColumn != "" {
		w.hasher = pgstore.NewRowHasher(info)
	}
	return w
}

// next counts the next row written or rejected, or returns why the
// writer takes no more.
func (w *rowWriter) next() error {
	if w.closed {
		return ErrWriterClosed
	}
	if w.err != nil {
		return w.err
	}
	w.row++
	w.read++
	return nil
}

func (w *rowWriter) Write(ctx context.Context, values ...any) error {
	if err := w.next(); err != nil {
		return err
	}
	n := w.info.Written
	if len(values) != n {
		return w.extractorBug(values, fmt.Sprintf("wrong number of values: got %d, want %d", len(values), n))
	}
	if w.fp != nil {
		// Before any conversion: the fingerprint is of the values as
		// written (a probe's, skip_probe.go), added when the row is
		// staged or rejected (foldRow).
		w.fpState = fpMixed
		if w.fp.encodeRaw(values) {
			w.fpState = fpRaw
		}
	}
	var chunkIn any // the ChunkColumn's value as converted, for inChunk
	// By index: a Column is large, and copying it per value costs.
	for i := range n {
		in := values[i]
		if w.timeCols[i] {
			in = w.timeValue(&w.info.Columns[i], in)
		}
		if i == w.chunkCol {
			chunkIn = in
		}
		v, reason := w.convs[i].Convert(in)
		if reason != "" {
			col := &w.info.Columns[i]
			if pgconv.TypeMismatch(reason) {
				return w.extractorBug(values, fmt.Sprintf("column %q (%s, value %d of %d): %s", col.Name, cmp.Or(col.Type, col.BaseType), i+1, n, reason))
			}
			shown := pgstore.DisplayValue(values[i])
			return w.reject(pgstore.RawJSON(w.names[:n], values, nil), col.Name, shown, withValue(reason, shown))
		}
		w.buf[i] = v
	}
	if w.chunkCol >= 0 {
		v := values[w.chunkCol]
		if ok, why := w.inChunk(chunkIn, w.buf[w.chunkCol]); !ok {
			return w.reject(pgstore.RawJSON(w.names[:n], values, nil), w.names[w.chunkCol], pgstore.DisplayValue(v), why)
		}
	}
	for i := n; i < len(w.info.Columns); i++ {
		col := w.info.Columns[i]
		switch col.Computed {
		case "derive":
			rule := w.rules[col.Name]
			src := w.buf[slices.Index(w.names[:n], rule.From)]
			k, reason := rule.Derive(src)
			if reason == "" {
				var v any
				v, reason = w.convs[i].Convert(k)
				k, _ = v.(string)
			}
			if reason != "" {
				shown := pgstore.DisplayValue(src)
				return w.reject(pgstore.RawJSON(w.names[:n], values, nil), col.Name, shown, withValue(reason, shown))
			}
			w.buf[i] = k
		case "ingested":
			w.buf[i] = w.ingested
		case "inserted_by", "updated_by":
			w.buf[i] = w.info.Chunk.BatchID
		case "hash":
			sum := w.hasher.Sum(w.buf[:n])
			if col.BaseType == "bytea" || col.BaseType == "" {
				w.buf[i] = sum
			} else {
				w.buf[i] = hex.EncodeToString(sum)
			}
		}
	}
	w.foldRow(values, w.buf)
	return w.stageRow(ctx, values, w.buf)
}

// stageRow stages row w.row, converted to buf (values as the extractor
// wrote them, for the exception of a value refused in an earlier
// staging), or queues it when it holds such a value.
func (w *rowWriter) stageRow(ctx context.Context, values, buf []any) error {
	n := w.info.Written
	if w.stagingRejects != nil && w.stagingRejects.len() > 0 {
		if rej, i, ok := w.stagingRejects.match(w.row, w.names, buf); ok {
			value := rej.Value
			if i >= 0 && i < n {
				value = pgstore.DisplayValue(values[i])
			}
			return w.reject(pgstore.RawJSON(w.names[:n], values[:n], nil), rej.Column, value, withValue(rej.Reason, value))
		}
	}
	w.lines.Add(w.row)
	if err := w.stager.Add(ctx, w.row, buf); err != nil {
		w.err = err
		return err
	}
	return nil
}

// extractorBug fails the chunk for a row that no data can make valid (see
// [ErrExtractor]): the error names the chunk, the row, what is wrong, the
// columns expected and the values passed. It is sticky: the chunk fails
// even when the extractor ignores the error.
func (w *rowWriter) extractorBug(values []any, what string) error {
	shown := make([]string, len(values))
	for i, v := range values {
		d := pgstore.DisplayValue(v)
		shown[i] = fmt.Sprintf("%s (%T)", d, v)
		if t := reflect.TypeOf(v); t != nil && d == rawvalue.TypeOnly(t) {
			shown[i] = d // a channel, a function: its type, once
		}
		if len(shown[i]) > 200 {
			shown[i] = pgstore.ValidPrefix(shown[i], 200) + "…"
		}
	}
	w.err = fmt.Errorf("%w (%w): chunk %s row %d: %s; Write takes the columns %s in this order, got [%s]",
		ErrExtractor, backfilltype.ErrNotRetryable, w.chunk.ID, w.row, what, strings.Join(w.names[:w.info.Written], ", "), strings.Join(shown, ", "))
	return w.err
}

// foldRow adds the current row (values as written, converted its
// converted values, nil for a row rejected before) to the source
// fingerprint, if it has one pending.
func (w *rowWriter) foldRow(values, converted []any) {
	switch w.fpState {
	case fpRaw:
		w.fp.add()
	case fpMixed:
		w.fp.addMixed(w.info.Columns[:w.info.Written], values, converted)
	}
	w.fpState = fpNone
}

func (w *rowWriter) Reject(ctx context.Context, raw any, column, reason string) error {
	if err := w.next(); err != nil {
		return err
	}
	if reason == "" {
		reason = "rejected by extractor"
	}
	js := pgstore.RawJSON(nil, nil, raw)
	if w.fp != nil {
		w.fpState = fpNone
		w.fp.addReject(js, column, reason)
	}
	return w.reject(js, column, "", reason)
}

// maxReasonValue is the most bytes of a value withValue puts in a reason.
const maxReasonValue = 100

// withValue is reason with the value it judged, as shown (the exception's
// value column), unless the reason names it already: "out of range for
// type smallint: value 70000".
func withValue(reason, shown string) string {
	if shown == "" || strings.Contains(reason, "value "+shown) || strings.Contains(reason, `"`+shown+`"`) ||
		shown == "NULL" && strings.Contains(strings.ToLower(reason), "null") {
		return reason
	}
	if len(shown) > maxReasonValue {
		shown = pgstore.ValidPrefix(shown, maxReasonValue) + "…"
	}
	return reason + ": value " + shown
}

func (w *rowWriter) reject(raw []byte, column, value, reason string) error {
	// A row Write rejects before staging it: in the fingerprint as
	// written (its converted values are not all known).
	w.foldRow(nil, nil)
	w.rejected++
	if w.mem != nil {
		n := rejectSize(raw, column, value, reason)
		if !w.mem.Reserve(n) {
			w.err = errRejectsOverBudget(w.chunk, w.rejected, w.held+n, w.mem.Limit())
			return w.err
		}
		w.held += n
	}
	w.exceptions = append(w.exceptions, Exception{ChunkID: w.chunk.ID, Row: w.row, Raw: raw, Column: column, Value: value, Reason: reason})
	if w.maxRejects > 0 && w.rejected+w.priorRejected > int64(w.maxRejects) {
		before := ""
		if w.priorRejected > 0 {
			before = fmt.Sprintf("%d of them in its sub-chunks committed before; ", w.priorRejected)
		}
		w.err = fmt.Errorf("%w: more than %d in chunk %s (%slast: row %d column %q: %s)", ErrTooManyRejects, w.maxRejects, w.chunk.ID, before, w.row, column, withValue(reason, value))
		return w.err
	}
	return nil
}

// timeValue returns v, a value written to a date, timestamp or timestamptz
// column, with the time.Time it delivers unwrapped: bare, or through any
// wrapper pgconv.Normalize reduces (a pointer, sql.NullTime, sql.Null[time.Time],
// a named type such as type myTime time.Time, a driver.Valuer returning a
// time.Time). For a timestamp column the time is moved to Job.Zone: a
// time.Time is an instant, stored as its wall clock in Job.Zone, whatever
// location (a source session's TimeZone) it came in and whatever wrapper
// delivered it. This is the one place where Job.Zone applies to a Go
// value; the chunk check (inChunk) sees the value returned here. Other
// values are returned as they are (text) or reduced (a *string, a
// sql.NullString), and pgstore.ConvertValue judges them.
func (w *rowWriter) timeValue(col *Column, v any) any {
	switch x := v.(type) {
	case time.Time:
		if col.BaseType == "timestamp" {
			return x.In(w.zone)
		}
		return v
	case nil, string:
		return v
	}
	norm, _, reason := pgconv.Normalize(v)
	switch x := norm.(type) {
	case time.Time:
		if reason == "" && col.BaseType == "timestamp" {
			return x.In(w.zone)
		}
		if reason == "" {
			return x
		}
	case nil, string:
		if reason == "" {
			return norm
		}
	}
	// Not a time nor text: pgstore.ConvertValue gives the reason, naming the
	// value's own Go type.
	return v
}

// inChunk reports whether v, a row's value of Job.ChunkColumn (as
// timeValue reduced it, for a time column), lies in the chunk's half-open
// interval; stored is the value pgstore.ConvertValue gave for it. Times are
// compared as instants, the instant stored: a time.Time truncated to
// microseconds, as pgconv stores it (a date column: its civil date,
// at midnight in Job.Zone); text as its stored canonical form reads (so
// that rounding and the forms pgconv takes agree with the
// check), a wall-clock value (date, timestamp) in Job.Zone.
func (w *rowWriter) inChunk(v, stored any) (bool, string) {
	c := w.chunk
	col := w.info.Columns[w.chunkCol]
	outside := func(shown string) (bool, string) {
		lo, hi := c.Bounds()
		if c.Kind == backfilltype.KindList {
			return false, fmt.Sprintf("outside chunk {%s}: value %s", lo, shown)
		}
		return false, fmt.Sprintf("outside chunk [%s, %s): value %s", lo, hi, shown)
	}
	switch c.Kind {
	case backfilltype.KindTime:
		t, ok := w.instant(col, v, stored)
		if !ok {
			return false, fmt.Sprintf("outside chunk: value %s of %s is not a time", pgstore.DisplayValue(v), col.Name)
		}
		if t.Before(c.Start) || !t.Before(c.End) {
			return outside(t.In(c.Start.Location()).Format(time.RFC3339Nano))
		}
		return true, ""
	case backfilltype.KindInt:
		n, reason := pgconv.ToInt(v, math.MinInt64, math.MaxInt64, "bigint")
		if reason != "" {
			return false, "outside chunk: " + reason
		}
		if x := n.(int64); x < c.Lo || x >= c.Hi {
			return outside(fmt.Sprint(x))
		}
		return true, ""
	default:
		s, ok := v.(string)
		if !ok || s != c.Item {
			return outside(pgstore.DisplayValue(v))
		}
		return true, ""
	}
}

// instant returns the instant a time value denotes, in the rules of
// inChunk.
func (w *rowWriter) instant(col Column, v, stored any) (time.Time, bool) {
	if x, ok := v.(time.Time); ok {
		if col.BaseType == "date" {
			// A date is the civil date of the value, as stored.
			x = time.Date(x.Year(), x.Month(), x.Day(), 0, 0, 0, 0, w.zone)
		}
		return x.Truncate(time.Microsecond), true
	}
	s, ok := stored.(string)
	if !ok {
		return time.Time{}, false
	}
	switch col.BaseType {
	case "date", "timestamp", "timestamptz":
	default:
		// A column of unknown type (a fake merger's) or not a time type:
		// RFC 3339 is an instant, other ISO forms a wall clock in
		// Job.Zone.
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t.Truncate(time.Microsecond), true
		}
		for _, layout := range []string{"2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999", "2006-01-02"} {
			if t, err := time.ParseInLocation(layout, s, w.zone); err == nil {
				return t.Truncate(time.Microsecond), true
			}
		}
		return time.Time{}, false
	}
	// The canonical text pgstore.ConvertValue stored: read back exactly.
	c, zoned, ok := pgconv.ReadTime(s)
	switch {
	case !ok:
		return time.Time{}, false
	case zoned:
		return c, true
	}
	return time.Date(c.Year(), c.Month(), c.Day(), c.Hour(), c.Minute(), c.Second(), c.Nanosecond(), w.zone), true
}

// extractSafely calls the extractor, turning a panic into an error
// wrapping [ErrExtractorPanic] (with the panic value and stack) so that
// the chunk rolls back and the process lives on.
func extractSafely(ctx context.Context, x Extractor, c Chunk, w RowWriter) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w (%w): %v\n%s", ErrExtractorPanic, backfilltype.ErrNotRetryable, p, debug.Stack())
		}
	}()
	return x.Extract(ctx, c, w)
}
