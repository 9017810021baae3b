package backfill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/internal/copyerr"
	"github.com/pgbackfill/backfill/internal/pgconv"
	"github.com/pgbackfill/backfill/internal/pgstore"
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
// chunk's spool is staged again with every row that holds the
// refused value in that column queued as an exception naming its column,
// value and PostgreSQL's message. (An input function or a domain
// constraint judges the value alone, so the value is refused wherever it
// occurs: a label missing from an enum costs one restaging, however many
// rows hold it.) Everything else of the chunk loads.
//
// Each refused value costs one more staging of the chunk (a replay of its
// spool, [execution.runChunk]), so at most [Config.MaxStagingRejects]
// values are isolated per chunk; then the chunk fails with an error
// naming its chunk, row, column and value. Rows are found by value, not
// position; only when PostgreSQL shortened a long value in its message is
// the row found by its position in the spool and the value's first
// characters.

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

// copyEnder is implemented by stagers that stage with COPY: EndStaging
// ends the COPY, so that a refused value shows before the merge.
// rowCopier is a stager that Adds a chunk's rows best in one call of
// f ([pgstore.PGStager.CopyRows]).
type rowCopier interface {
	CopyRows(ctx context.Context, f func() error) error
}

type copyEnder interface {
	EndStaging(ctx context.Context) error
}

// stageParams are the inputs of execution.stage besides its transaction.
type stageParams struct {
	// chunk is the chunk to stage.
	chunk Chunk
	// info is the staged table's columns.
	info TableInfo
	// started is when the chunk's attempt started, for its exceptions.
	started time.Time
	// savepoints isolates rows PostgreSQL refuses, each staging attempt
	// in a savepoint; the transaction must then be one, and newStager's
	// stagers must stage with COPY.
	savepoints bool
	// newStager makes the stager of one staging attempt.
	newStager func() (backfilldriver.Stager, error)
	// spooled is the chunk as extracted: each staging attempt replays
	// its spool.
	spooled *spooled
}

// stage replays chunk p.chunk's spool into a stager made by p.newStager and
// ends the staging, isolating rows PostgreSQL refuses (see the top of
// this file) when p.savepoints is true. It returns the stager, to merge
// and close, and the row writer with the chunk's counts and exceptions.
func (ex *execution) stage(ctx context.Context, tx backfilldriver.Tx, p stageParams) (backfilldriver.Stager, *rowWriter, error) {
	s := &chunkStaging{ex: ex, tx: tx, stageParams: p}
	for {
		st, w, ref, err := s.attempt(ctx)
		if err != nil {
			return nil, nil, err
		}
		if !p.savepoints || !ref.isData || ctx.Err() != nil {
			return s.finish(ctx, st, w, ref)
		}
		if err := s.requeue(ctx, st, w, ref); err != nil {
			return nil, nil, err
		}
	}
}

// chunkStaging is one call of execution.stage: its inputs, and the
// values PostgreSQL refused in its earlier attempts.
type chunkStaging struct {
	ex *execution
	tx backfilldriver.Tx
	stageParams
	rejects stagingRejects
}

// stagingRefusal is how a staging attempt ended: the spool replay's error,
// the staging's error and, when that is PostgreSQL refusing a value
// (isData), the staged line and the value.
type stagingRefusal struct {
	xerr, serr error
	line       int64
	rej        stagingReject
	isData     bool
}

// attempt stages the chunk once, inside a savepoint when savepoints is
// true, queueing the values refused in earlier attempts.
func (s *chunkStaging) attempt(ctx context.Context) (backfilldriver.Stager, *rowWriter, stagingRefusal, error) {
	var ref stagingRefusal
	if s.savepoints {
		if err := pgstore.Later(ctx, s.tx, `SAVEPOINT backfill_stage`); err != nil {
			return nil, nil, ref, fmt.Errorf("savepoint: %w", err)
		}
	}
	st, err := s.newStager()
	if err != nil {
		return nil, nil, ref, err
	}
	w := newRowWriter(s.chunk, s.ex.job, s.info, st, s.ex.r.cfg.MaxRejectsPerChunk, s.started)
	w.stagingRejects = &s.rejects
	if rc, ok := st.(rowCopier); ok {
		ref.xerr = rc.CopyRows(ctx, func() error { return s.spooled.replay(ctx, w) })
	} else {
		ref.xerr = s.spooled.replay(ctx, w)
	}
	w.closed = true
	ref.serr = w.err
	if ref.serr == nil && ref.xerr == nil {
		if ce, ok := st.(copyEnder); ok {
			ref.serr = ce.EndStaging(ctx)
		}
	}
	ref.line, ref.rej, ref.isData = copyerr.Parse(ref.serr, w.names)
	if i := slices.Index(w.names, ref.rej.Column); ref.isData && i >= 0 {
		ref.rej.Reason = pgconv.LimitNote(s.info.Columns[i].Conv(), ref.rej.Reason) // the column's real limit
	}
	return st, w, ref, nil
}

// where names the refused row of ref; the chunk's error names the chunk.
func (s *chunkStaging) where(w *rowWriter, ref stagingRefusal) string {
	row := w.lines.Row(ref.line)
	msg := fmt.Sprintf("backfill: stage %s: row %d", s.info.Target.Table, row)
	if row == 0 {
		msg = fmt.Sprintf("backfill: stage %s: staging line %d", s.info.Target.Table, ref.line)
	}
	if ref.rej.Column != "" {
		msg += fmt.Sprintf(" column %q value %q", ref.rej.Column, ref.rej.Value)
	}
	return msg
}

// finish ends an attempt that is not restaged: its error, or its stager
// and row writer with the savepoint released.
func (s *chunkStaging) finish(ctx context.Context, st backfilldriver.Stager, w *rowWriter, ref stagingRefusal) (backfilldriver.Stager, *rowWriter, error) {
	if ref.serr != nil || ref.xerr != nil {
		_ = st.Close()
	}
	switch {
	case ref.isData:
		return nil, nil, &stagingRowError{msg: s.where(w, ref) + " refused: " + ref.rej.Reason, err: ref.serr}
	case ref.serr != nil:
		return nil, nil, ref.serr
	case ref.xerr != nil:
		return nil, nil, fmt.Errorf("extract: %w", ref.xerr)
	}
	if s.savepoints {
		if err := pgstore.Later(ctx, s.tx, `RELEASE SAVEPOINT backfill_stage`); err != nil {
			_ = st.Close()
			return nil, nil, fmt.Errorf("release savepoint: %w", err)
		}
	}
	return st, w, nil
}

// requeue rolls an attempt refused on a value back to its savepoint and
// queues the refused row's value for the next attempt, or says why the
// chunk cannot be staged.
func (s *chunkStaging) requeue(ctx context.Context, st backfilldriver.Stager, w *rowWriter, ref stagingRefusal) error {
	_ = st.Close()
	if _, err := s.tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_stage; RELEASE SAVEPOINT backfill_stage`); err != nil {
		return errors.Join(ref.serr, fmt.Errorf("rollback to savepoint: %w", err))
	}
	row := w.lines.Row(ref.line)
	switch {
	case row == 0:
		return &stagingRowError{msg: s.where(w, ref) + " refused: " + ref.rej.Reason, err: ref.serr}
	case s.rejects.has(row, ref.rej):
		// Refused again although queued: the row writer did not know the
		// value again (its text differs from what PostgreSQL reported),
		// or, for a row found by position, the extractor wrote another
		// row there this time.
		return &stagingRowError{msg: s.where(w, ref) + " refused again although queued: " + ref.rej.Reason, err: ref.serr}
	case s.rejects.len() >= s.ex.r.cfg.MaxStagingRejects:
		return fmt.Errorf("%w: %s refused: %s; %d values of this chunk were refused already (Config.MaxStagingRejects): convert or Reject such values in the extractor",
			ErrTooManyRejects, s.where(w, ref), ref.rej.Reason, s.rejects.len())
	}
	s.rejects.add(row, ref.rej)
	s.ex.log.Warn("value refused while staging; restaging the chunk without its rows", "chunk", s.chunk.ID, "row", row, "column", ref.rej.Column, "reason", ref.rej.Reason)
	return nil
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
