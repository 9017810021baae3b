package backfill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pgbackfill/backfill/internal/copyerr"
	"github.com/pgbackfill/backfill/internal/pgconv"
)

// Isolating rows that PostgreSQL refuses while staging.
//
// The row writer converts and checks values for the common column types
// (internal/pgconv), but some types it passes as text for PostgreSQL's
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

// stagingReject is a row PostgreSQL refused while staging; stagingLines
// maps the lines of a chunk's COPY data to the rows the extractor wrote.
type (
	stagingReject = copyerr.Reject
	stagingLines  = copyerr.Lines
)

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
		line, rej, isData := copyerr.Parse(serr, w.names)
		if i := slices.Index(w.names, rej.Column); isData && i >= 0 {
			rej.Reason = pgconv.LimitNote(info.Columns[i].conv(), rej.Reason) // the column's real limit
		}
		// where names the refused row; the chunk's error names the chunk.
		where := func() string {
			row := w.lines.Row(line)
			s := fmt.Sprintf("backfill: stage %s: row %d", info.Target.Table, row)
			if row == 0 {
				s = fmt.Sprintf("backfill: stage %s: staging line %d", info.Target.Table, line)
			}
			if rej.Column != "" {
				s += fmt.Sprintf(" column %q value %q", rej.Column, rej.Value)
			}
			return s
		}
		if !savepoints || !isData || ctx.Err() != nil {
			if serr != nil || xerr != nil {
				_ = st.Close()
			}
			switch {
			case isData:
				return nil, nil, &stagingRowError{msg: where() + " refused: " + rej.Reason, err: serr}
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
		row := w.lines.Row(line)
		switch {
		case row == 0:
			return nil, nil, &stagingRowError{msg: where() + " refused: " + rej.Reason, err: serr}
		case rejects.has(row, rej):
			// Refused again although queued: the row writer did not know
			// the value again (its text differs from what PostgreSQL
			// reported), or, for a row found by position, the extractor
			// wrote another row there this time.
			return nil, nil, &stagingRowError{msg: where() + " refused again although queued: " + rej.Reason, err: serr}
		case rejects.len() >= ex.r.cfg.MaxStagingRejects:
			return nil, nil, fmt.Errorf("%w: %s refused: %s; %d values of this chunk were refused already (Config.MaxStagingRejects): convert or Reject such values in the extractor",
				ErrTooManyRejects, where(), rej.Reason, rejects.len())
		}
		rejects.add(row, rej)
		ex.log.Warn("value refused while staging; restaging the chunk without its rows", "chunk", c.ID, "row", row, "column", rej.Column, "reason", rej.Reason)
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
	if rej.Column != "" && !rej.Truncated {
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
	if rej.Column != "" && !rej.Truncated {
		return slices.Contains(r.byValue, rej)
	}
	_, ok := r.byRow[row]
	return ok
}

// match returns the refused value that row, whose staged values are buf
// (columns names), holds, if any.
func (r *stagingRejects) match(row int64, names []string, buf []any) (stagingReject, int, bool) {
	if rej, ok := r.byRow[row]; ok {
		i := slices.Index(names, rej.Column)
		if i < 0 || rej.Matches(buf[i]) {
			return rej, i, true
		}
	}
	for _, rej := range r.byValue {
		if i := slices.Index(names, rej.Column); i >= 0 && rej.Matches(buf[i]) {
			return rej, i, true
		}
	}
	return stagingReject{}, -1, false
}
