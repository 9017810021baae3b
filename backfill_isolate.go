package backfill

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/internal/pgconv"
)

// Isolating rows that PostgreSQL refuses while staging.
//
// The row writer converts and checks values for the common column types
// (merge_convert.go), but some types it passes as text for PostgreSQL's
// input function to read: enum labels, domains with CHECK constraints,
// inet, ranges, arrays, geometric types and any extension type. A value
// such an input function refuses fails the chunk's COPY, and with it the
// whole chunk, for one bad row. Instead, the chunk's staging runs inside
// a savepoint: a COPY that fails on a data error at line N (PostgreSQL
// reports the line, column and value in the error's context, PostgreSQL
// docs, COPY, "File Formats") is rolled back to the savepoint, and the
// chunk is extracted and staged again with every row that holds the
// refused value in that column queued as an exception naming its column,
// value and PostgreSQL's message. (An input function or a domain
// constraint judges the value alone, so the value is refused wherever it
// occurs: a label missing from an enum costs one restaging, however many
// rows hold it.) Everything else of the chunk loads.
//
// Each refused value costs one more extraction of the chunk, so at most
// [Config.MaxStagingRejects] values are isolated per chunk; then the
// chunk fails with an error naming its chunk, row, column and value.
// Rows are found by value, not position, so an extractor that returns its
// rows in another order on the retry gets the same rows queued. Only when
// PostgreSQL shortened a long value in its message is the row found by
// its position in the extraction and the value's first characters.

// DefaultMaxStagingRejects is the default of [Config.MaxStagingRejects].
const DefaultMaxStagingRejects = 10

// stagingReject is a row PostgreSQL refused while staging.
type stagingReject struct {
	column, value, reason string
	// null: the refused value is NULL (a domain's NOT NULL).
	null bool
	// truncated: PostgreSQL shortened the value in its message; it is a
	// prefix of the refused text.
	truncated bool
}

// copyLine is the start of the context PostgreSQL gives a COPY FROM
// error: "COPY name, line N, column col: "value"" or "..., column col:
// null input" (CopyFromErrorCallback in src/backend/commands/copyfrom.c);
// the column part is absent for errors of a whole line. A value longer
// than the message allows ends in "...".
var copyLine = regexp.MustCompile(`^COPY [^,]+, line (\d+)`)

// stagingDataError reports whether err is PostgreSQL refusing a value of
// a staged row: a data exception (SQLSTATE class 22), or a domain's CHECK
// (23514) or NOT NULL (23502) constraint, raised while reading COPY data.
// It returns the line of the COPY data (1 for the first row staged), the
// column (one of columns, which may contain any character) and value
// when PostgreSQL names them, and the reason.
func stagingDataError(err error, columns []string) (line int64, rej stagingReject, ok bool) {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return 0, rej, false
	}
	if code := string(pe.Code); !strings.HasPrefix(code, "22") && code != "23514" && code != "23502" {
		return 0, rej, false
	}
	m := copyLine.FindStringSubmatchIndex(pe.Where)
	if m == nil {
		return 0, rej, false
	}
	line, perr := strconv.ParseInt(pe.Where[m[2]:m[3]], 10, 64)
	if perr != nil || line < 1 {
		return 0, rej, false
	}
	rej.reason = fmt.Sprintf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	rest := pe.Where[m[1]:]
	for _, c := range columns {
		switch {
		case len(c) < len(rej.column):
		case strings.HasPrefix(rest, ", column "+c+`: "`) && strings.HasSuffix(rest, `"`):
			rej.column, rej.null = c, false
			rej.value = rest[len(", column "+c+`: "`) : len(rest)-1]
		case rest == ", column "+c+": null input":
			rej.column, rej.value, rej.null = c, "", true
		}
	}
	// PostgreSQL shortens a value longer than 100 bytes to its first 100
	// bytes, cut back to a whole character (at most 3 bytes less), and
	// appends "..." (limit_printout_length, MAX_COPY_DATA_DISPLAY); a
	// shorter value that ends in "..." is the value itself.
	if p := len(rej.value) - len("..."); strings.HasSuffix(rej.value, "...") && p >= maxCopyDisplay-3 && p <= maxCopyDisplay {
		rej.value, rej.truncated = rej.value[:p], true
	}
	return line, rej, true
}

// maxCopyDisplay is PostgreSQL's MAX_COPY_DATA_DISPLAY
// (src/backend/commands/copyfrom.c): the bytes of a value an error's
// context shows.
const maxCopyDisplay = 100

// stagingLines maps the lines of a chunk's COPY data to the rows the
// extractor wrote: runs of consecutive rows, a new run after each row the
// writer rejected before staging.
type stagingLines struct {
	runs    []struct{ line, row int64 }
	line    int64
	lastRow int64
}

// add records that row was staged as the next line.
func (l *stagingLines) add(row int64) {
	l.line++
	if len(l.runs) == 0 || row != l.lastRow+1 {
		l.runs = append(l.runs, struct{ line, row int64 }{l.line, row})
	}
	l.lastRow = row
}

// row returns the row staged as line, or 0 when no such line was staged.
func (l *stagingLines) row(line int64) int64 {
	if line < 1 || line > l.line {
		return 0
	}
	for i := len(l.runs) - 1; i >= 0; i-- {
		if r := l.runs[i]; r.line <= line {
			return r.row + (line - r.line)
		}
	}
	return 0
}

// matches reports whether v, the value a row's column would be staged
// as, is the value PostgreSQL refused: its text as lib/pq sends it in COPY
// data (or NULL), equal to the value PostgreSQL named, or starting with it
// when PostgreSQL shortened it.
func (r stagingReject) matches(v any) bool {
	if v == nil || r.null {
		return v == nil && r.null
	}
	text, ok := copyText(v)
	if !ok {
		return false
	}
	if r.truncated {
		return strings.HasPrefix(text, r.value)
	}
	return text == r.value
}

// copyText returns the text lib/pq's COPY encoding sends for v, a value
// of the row writer (encode.go, appendEncodedText), before COPY's escapes.
func copyText(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case int64:
		return strconv.FormatInt(v, 10), true
	case int:
		return strconv.Itoa(v), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case float32:
		return strconv.FormatFloat(float64(v), 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(v), true
	case []byte:
		return `\x` + hex.EncodeToString(v), true
	case time.Time:
		return string(pq.FormatTimestamp(v)), true
	}
	return "", false
}

// stagingRowError is a row PostgreSQL refused while staging, named by
// row, column and value; it wraps the *pq.Error.
type stagingRowError struct {
	msg string
	err error
}

func (e *stagingRowError) Error() string { return e.msg }
func (e *stagingRowError) Unwrap() error { return e.err }

// copyEnder is implemented by stagers that stage with COPY: endStaging
// ends the COPY, so that a refused value shows before the merge.
type copyEnder interface {
	endStaging(ctx context.Context) error
}

func (s *pgStager) endStaging(ctx context.Context) error {
	if err := s.endCopy(ctx); err != nil {
		return fmt.Errorf("backfill: stage %s: end copy: %w", s.info.Target.Table, err)
	}
	return nil
}

func (s *persistStager) endStaging(ctx context.Context) error {
	s.ended = true
	return finishCopy(ctx, &s.copy)
}

// stage extracts chunk c into a stager made by newStager and ends the
// staging, isolating rows PostgreSQL refuses (see the top of this file)
// when savepoints is true: tx must then be a transaction, and newStager's
// stagers must stage with COPY. It returns the stager, to merge and
// close, and the row writer with the chunk's counts and exceptions.
func (ex *execution) stage(ctx context.Context, tx Tx, c Chunk, info TableInfo, started time.Time, savepoints bool, newStager func() (Stager, error)) (Stager, *rowWriter, error) {
	rejects := &stagingRejects{}
	for {
		if savepoints {
			if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_stage`); err != nil {
				return nil, nil, fmt.Errorf("savepoint: %w", err)
			}
		}
		st, err := newStager()
		if err != nil {
			return nil, nil, err
		}
		w := newRowWriter(c, ex.job, info, st, ex.r.cfg.MaxRejectsPerChunk, started)
		w.stagingRejects = rejects
		xerr := extractSafely(ctx, ex.job.Extractor, c, w)
		w.closed = true
		serr := w.err
		if serr == nil && xerr == nil {
			if ce, ok := st.(copyEnder); ok {
				serr = ce.endStaging(ctx)
			}
		}
		line, rej, isData := stagingDataError(serr, w.names)
		if i := slices.Index(w.names, rej.column); isData && i >= 0 {
			rej.reason = pgconv.LimitNote(info.Columns[i].conv(), rej.reason) // the column's real limit
		}
		// where names the refused row; the chunk's error names the chunk.
		where := func() string {
			row := w.lines.row(line)
			s := fmt.Sprintf("backfill: stage %s: row %d", info.Target.Table, row)
			if row == 0 {
				s = fmt.Sprintf("backfill: stage %s: staging line %d", info.Target.Table, line)
			}
			if rej.column != "" {
				s += fmt.Sprintf(" column %q value %q", rej.column, rej.value)
			}
			return s
		}
		if !savepoints || !isData || ctx.Err() != nil {
			if serr != nil || xerr != nil {
				_ = st.Close()
			}
			switch {
			case isData:
				return nil, nil, &stagingRowError{msg: where() + " refused: " + rej.reason, err: serr}
			case serr != nil:
				return nil, nil, serr
			case xerr != nil:
				return nil, nil, fmt.Errorf("extract: %w", xerr)
			}
			if savepoints {
				if _, err := tx.ExecContext(ctx, `RELEASE SAVEPOINT backfill_stage`); err != nil {
					_ = st.Close()
					return nil, nil, fmt.Errorf("release savepoint: %w", err)
				}
			}
			return st, w, nil
		}
		_ = st.Close()
		if _, err := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_stage; RELEASE SAVEPOINT backfill_stage`); err != nil {
			return nil, nil, errors.Join(serr, fmt.Errorf("rollback to savepoint: %w", err))
		}
		row := w.lines.row(line)
		switch {
		case row == 0:
			return nil, nil, &stagingRowError{msg: where() + " refused: " + rej.reason, err: serr}
		case rejects.has(row, rej):
			// Refused again although queued: the row writer did not know
			// the value again (its text differs from what PostgreSQL
			// reported), or, for a row found by position, the extractor
			// wrote another row there this time.
			return nil, nil, &stagingRowError{msg: where() + " refused again although queued: " + rej.reason, err: serr}
		case rejects.len() >= ex.r.cfg.MaxStagingRejects:
			return nil, nil, fmt.Errorf("%w: %s refused: %s; %d values of this chunk were refused already (Config.MaxStagingRejects): convert or Reject such values in the extractor",
				ErrTooManyRejects, where(), rej.reason, rejects.len())
		}
		rejects.add(row, rej)
		ex.log.Warn("value refused while staging; restaging the chunk without its rows", "chunk", c.ID, "row", row, "column", rej.column, "reason", rej.reason)
	}
}

// stagingRejects are the values PostgreSQL refused in earlier stagings of
// a chunk. A value it named in full (or a NULL) is refused wherever it
// occurs in its column, as input functions and domain constraints judge
// the value alone: every row holding it is queued, found by value, in one
// restaging. A value it shortened, or a line refused without a column,
// identifies its row by position (and the value's start).
type stagingRejects struct {
	byValue []stagingReject
	byRow   map[int64]stagingReject
}

func (r *stagingRejects) len() int { return len(r.byValue) + len(r.byRow) }

func (r *stagingRejects) add(row int64, rej stagingReject) {
	if rej.column != "" && !rej.truncated {
		r.byValue = append(r.byValue, rej)
		return
	}
	if r.byRow == nil {
		r.byRow = map[int64]stagingReject{}
	}
	r.byRow[row] = rej
}

// has reports whether rej (refused at row) was queued already.
func (r *stagingRejects) has(row int64, rej stagingReject) bool {
	if rej.column != "" && !rej.truncated {
		return slices.Contains(r.byValue, rej)
	}
	_, ok := r.byRow[row]
	return ok
}

// match returns the refused value that row, whose staged values are buf
// (columns names), holds, if any.
func (r *stagingRejects) match(row int64, names []string, buf []any) (stagingReject, int, bool) {
	if rej, ok := r.byRow[row]; ok {
		i := slices.Index(names, rej.column)
		if i < 0 || rej.matches(buf[i]) {
			return rej, i, true
		}
	}
	for _, rej := range r.byValue {
		if i := slices.Index(names, rej.column); i >= 0 && rej.matches(buf[i]) {
			return rej, i, true
		}
	}
	return stagingReject{}, -1, false
}
