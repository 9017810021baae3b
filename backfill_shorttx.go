package backfill

import (
	"context"
	"fmt"
	"slices"

	"github.com/pgbackfill/backfill/backfilltype"
)

// Short transactions (see doc.go, "Many workers and hosts").
//
// Every chunk runs on one path (runChunk, backfill_run.go), with the
// Manifest's leases ([backfilldriver.ManifestLeases], which a Runner
// requires) under the call's worker key; no transaction of the library
// is open while the extractor runs:
//
//  1. lease: a short transaction of its own leases the next claimable
//     chunk (LeaseChunk) and commits;
//  2. extract: the extractor runs outside any transaction; the row writer
//     converts and checks its rows as always, queues its rejects, and
//     keeps the converted rows in a spool (backfill_spool.go: memory up
//     to a bound, then a temporary file);
//  3. the chunk's transaction: the lease's session settings and the fence
//     (FenceLease: the lease still the worker's at its epoch, under the
//     row lock), then the publish mode's target, staging (the spool
//     replayed into COPY, with the isolation of refused values, which
//     replays it again), merge, validation, checkpoint, commit
//     (loadChunk).
//
// A chunk whose fence finds no row was taken over by another worker (this
// one stopped heartbeating for longer than its stale bound): its
// transaction rolls back and nothing of it is recorded; the worker claims
// again. Any other end without a commit releases the lease (if it is
// still the worker's) before the failure is recorded.
//
// A retried try (a wait, [Config.LockRetries]) leases and extracts the
// chunk again. With [Config.JobConcurrency] a lease is taken only while
// fewer than that many chunks of the batch hold a live lease: the cap
// counts the chunks from their lease to their commit, across processes.

// spooled is a chunk extracted into a spool, with the row writer that
// counted its rows and queued its rejects.
type spooled struct {
	sp *spool
	w  *rowWriter
	// skip carries the spooled rows' fingerprint (Job.SkipUnchanged; nil
	// without it).
	skip *chunkSkip
}

// close closes the spool, if the chunk was extracted (a chunk not
// extracted on its version has none, replay_skip_version.go).
func (s *spooled) close() {
	if s != nil && s.sp != nil {
		_ = s.sp.Close()
	}
}

// replay stages the spooled rows with w, a fresh row writer of a staging
// attempt: w starts from the extraction's counts and exceptions.
func (s *spooled) replay(ctx context.Context, w *rowWriter) error {
	w.row, w.read, w.rejected = s.w.row, s.w.read, s.w.rejected
	w.exceptions = slices.Clone(s.w.exceptions)
	if !slices.Equal(w.names, s.w.names) {
		return fmt.Errorf("%w: the publish target's columns [%v] differ from the columns the chunk was extracted for [%v]", backfilltype.ErrNotRetryable, w.names, s.w.names)
	}
	last := w.row
	err := s.sp.replay(ctx, func(row int64, values []any) error {
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
