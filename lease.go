package backfill

import (
	"context"
	"fmt"
	"slices"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/spool"
)

// Short transactions (see the package documentation, "Many workers and
// hosts"). Every chunk runs on one path ([execution.runChunk]) with the
// Manifest's leases ([backfilldriver.ManifestLeases], which a Runner
// requires), so no transaction of the library is open while the
// extractor runs: a short transaction leases the chunk and commits; the
// extractor fills a [spool] outside any transaction; then the chunk's
// transaction sets the lease's settings, fences the lease (still the
// worker's at its epoch, under the row lock), stages from the spool,
// merges, validates and checkpoints. A chunk whose fence finds no row was
// taken over: it rolls back and records nothing. Any other end without a
// commit releases the lease before the failure is recorded. A retried try
// leases and extracts the chunk again; [Config.JobConcurrency] caps the
// batch's live leases across processes. The design note
// docs/design/short-transactions.md explains the alternatives.

// spooled is a chunk extracted into a spool, with the row writer that
// counted its rows and queued its rejects.
type spooled struct {
	sp *spool.Spool
	w  *rowWriter
	// skip carries the spooled rows' fingerprint (Job.SkipUnchanged; nil
	// without it).
	skip *chunkSkip
}

// close closes the spool, if the chunk was extracted (a chunk not
// extracted on its version has none).
func (s *spooled) close() {
	if s != nil && s.sp != nil {
		_ = s.sp.Close()
	}
	if s != nil && s.w != nil {
		s.w.releaseMem()
	}
}

// replay stages the spooled rows with w, a fresh row writer of a staging
// attempt: w starts from the extraction's counts and exceptions.
func (s *spooled) replay(ctx context.Context, w *rowWriter) error {
	w.row, w.read, w.rejected, w.priorRejected = s.w.row, s.w.read, s.w.rejected, s.w.priorRejected
	w.exceptions = slices.Clone(s.w.exceptions)
	if !slices.Equal(w.names, s.w.names) {
		return fmt.Errorf("%w: the publish target's columns [%v] differ from the columns the chunk was extracted for [%v]", backfilltype.ErrNotRetryable, w.names, s.w.names)
	}
	last := w.row
	err := s.sp.Replay(ctx, func(row int64, values []any) error {
		w.row = row
		return w.stageRow(ctx, values, values)
	})
	w.row = last
	if err != nil && w.err != nil {
		// The staging's error: reported as such (chunkStaging.attempt).
		return nil
	}
	return err
}
