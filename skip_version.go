package backfill

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Replays that skip unchanged chunks without extracting them
// ([Job.SkipUnchanged] with a [ChunkVersioner]). The version is read
// before the extraction and again after it ([execution.confirmVersion]),
// and recorded with the fingerprints by the checkpoint statement. A
// replay skips the extraction when its version is not "" and equals its
// base's, the base rejected no row, the job has a ChunkColumn, the chunk
// is not open, and, in the chunk's transaction, the target fingerprint
// equals the base's ([execution.skipByVersion]). Otherwise the chunk is
// extracted as without a version; a chunk found to need its extraction
// only in its transaction is rolled back and its lease released
// ([errVersionMissed]), so that Extract never runs while the slot holds
// its write stage. The design note docs/design/skip-unchanged.md
// explains the alternatives.

// ChunkVersioner is implemented by an [Extractor] that can tell, without
// extracting a chunk, whether the chunk's source rows changed: a replay
// with [Job.SkipUnchanged] then skips the extraction of a chunk whose
// version equals the one recorded by its last load (see [Job.SkipUnchanged]
// for when).
//
// ChunkVersion returns a token of the rows Extract would write for c: it
// must change whenever a committed change alters those rows (their
// values, their number, or which rows they are, and the source's schema
// as Extract reads it), and never return to an earlier token for other
// rows. A token that changes without the rows changing only costs an
// extraction. It describes the source, not Extract's code: change
// [Job.CodeVersion] with that code. It is called before the chunk's
// extraction, outside the chunk's transaction, and again after it; the
// token is recorded only when both agree. It must be UTF-8 text without
// NUL, at most 1,024 bytes (else the chunk fails, not retried); "" means
// unknown: the chunk is extracted. An error fails the chunk's attempt as
// an extraction error does; a panic is [ErrExtractorPanic]. The README
// ("Replays that skip unchanged chunks") shows a version for a PostgreSQL
// table and tokens that are not versions.
type ChunkVersioner interface {
	ChunkVersion(ctx context.Context, c Chunk) (string, error)
}

// errVersionMissed is loadChunk's answer for a chunk not extracted on its
// version whose transaction found it must be extracted after all:
// runChunk rolls the transaction back and
// releases the lease (see the top of this file).
var errVersionMissed = errors.New("backfill: the chunk's version check found it must be extracted")

// chunkVersion returns chunk c's source version (the job's Extractor as
// a ChunkVersioner), read before its extraction, or "" when the chunk can
// never skip its extraction: without the option or a versioner, without
// ChunkColumn, read again while open (reread) or open now. Its error
// names the chunk's version; a panic is ErrExtractorPanic.
func (ex *execution) chunkVersion(ctx context.Context, c Chunk, reread bool, started time.Time) (v string, err error) {
	cv, ok := ex.job.Extractor.(ChunkVersioner)
	if !ok || !ex.job.SkipUnchanged || ex.job.ChunkColumn == "" || reread || ex.open(c, started) {
		return "", nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("chunk version: %w (%w): %v\n%s", ErrExtractorPanic, backfilltype.ErrNotRetryable, p, debug.Stack())
		}
	}()
	if v, err = cv.ChunkVersion(ctx, c); err != nil {
		return "", fmt.Errorf("chunk version: %w", err)
	}
	// Recorded as text on the chunk's manifest row: a token PostgreSQL
	// cannot store would fail the checkpoint after the merge.
	switch {
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		return "", fmt.Errorf("chunk version: %w: ChunkVersion returned %q, not UTF-8 text without NUL (return a hex digest of bytes)", backfilltype.ErrNotRetryable, v)
	case len(v) > maxVersionLen:
		return "", fmt.Errorf("chunk version: %w: ChunkVersion returned %d bytes, more than %d (return a digest)", backfilltype.ErrNotRetryable, len(v), maxVersionLen)
	}
	return v, nil
}

// warnVersioner logs what keeps a job's ChunkVersioner from being used
// as the user may expect: it is ignored without SkipUnchanged or without
// a ChunkColumn, and with an empty CodeVersion a change of Extract's code
// is not seen by a replay that skips on versions.
func (r *Runner) warnVersioner(job Job) {
	if _, ok := job.Extractor.(ChunkVersioner); !ok {
		return
	}
	log := r.cfg.Logger.With("job", job.Name)
	switch {
	case !job.SkipUnchanged:
		log.Warn("backfill: the Extractor is a ChunkVersioner but the job does not skip unchanged chunks (Job.MergeEveryChunk, or not eligible: see Job.SkipUnchanged): its versions are not used")
	case job.ChunkColumn == "":
		log.Warn("backfill: the Extractor is a ChunkVersioner but the job has no ChunkColumn: every chunk is extracted (versions need a bounds-based target fingerprint)")
	case job.CodeVersion == "":
		log.Warn("backfill: a ChunkVersioner with an empty Job.CodeVersion: a replay skips a chunk whose source version is unchanged even if Extract's code changed; set CodeVersion and change it with that code")
	}
}

// maxVersionLen bounds a ChunkVersion token, in bytes.
const maxVersionLen = 1024

// confirmVersion reads chunk c's version again after its extraction: the
// version read before (sk.version) is recorded with the extracted rows'
// fingerprints only if it is still the chunk's version, so no change of
// the source during the extraction was missed (tokens never recur: see
// ChunkVersioner). Otherwise none is recorded (the next replay extracts).
func (ex *execution) confirmVersion(ctx context.Context, c Chunk, sk *chunkSkip, reread bool, started time.Time) error {
	if sk == nil || sk.version == "" {
		return nil
	}
	v, err := ex.chunkVersion(ctx, c, reread, started)
	if err != nil {
		return err
	}
	if v != sk.version {
		ex.log.Info("chunk version changed during its extraction: none recorded", "seq", c.Seq, "chunk", c.ID)
		sk.version = ""
	}
	return nil
}

// versionBase reports whether base (ok: found) lets a chunk of version v
// skip its extraction: recorded fingerprints (BaseFingerprints' ok), the
// same version, no rejected row.
func versionBase(base backfilldriver.ChunkFingerprints, ok bool, v string) bool {
	return ok && v != "" && base.Version == v && base.Counts.Rejected == 0
}

// versionCandidate reports, in a read transaction of its own, whether
// chunk c of version v has a base that lets it skip its extraction
// (runChunk's extract stage, before the chunk's transaction, which
// checks again). A chunk this call found must be extracted after all is
// none (versionMissed).
func (ex *execution) versionCandidate(ctx context.Context, c Chunk, v string) (bool, error) {
	ctx = pgstore.WithPurpose(ctx, "read the chunk's version", ex.batchID)
	if v == "" || ex.versionMissed(c.Seq, false) {
		return false, nil
	}
	var base backfilldriver.ChunkFingerprints
	var ok bool
	err := pgstore.ReadTx(ctx, ex.r.db, func(tx sqlx.ExtContext) (err error) {
		base, ok, err = ex.r.caps.skips.BaseFingerprints(ctx, tx, ex.job.Name, ex.skipKey, ex.batchID, c.ID)
		return err
	})
	return versionBase(base, ok, v), err
}

// versionMissed reports whether chunk seq was found, by a transaction of
// this call, to need its extraction although its version was its base's;
// set records that it was.
func (ex *execution) versionMissed(seq int, set bool) bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if set {
		if ex.versionMisses == nil {
			ex.versionMisses = map[int]bool{}
		}
		ex.versionMisses[seq] = true
	}
	return ex.versionMisses[seq]
}

// skipByVersion skips try t's chunk, fenced in t.tx and not extracted,
// whose version t.x.skip.version was read before: when its base (looked
// up in t.tx) lets it (versionBase) and its target rows (t.info's)
// within its bounds hash as the base's, it checkpoints and commits the
// chunk and returns true. Otherwise it returns false, and the chunk is
// to be extracted.
func (ex *execution) skipByVersion(ctx context.Context, t *chunkTry) (bool, error) {
	c, tx, sk := t.c, t.tx, t.x.skip
	chunkErr := t.chunkErr
	base, ok, err := ex.r.caps.skips.BaseFingerprints(ctx, tx, ex.job.Name, ex.skipKey, ex.batchID, c.ID)
	if err != nil {
		return false, chunkErr(err)
	}
	if !versionBase(base, ok, sk.version) {
		return false, nil
	}
	tt, err := ex.targetText(ctx, t, base.Target)
	if err != nil {
		return false, chunkErr(err)
	}
	if tt != base.Target {
		return false, nil
	}
	// The base rejected none (versionBase): its rows read were all
	// staged, and are the rows Extract would write again.
	return ex.checkpointSkipped(ctx, t, skippedChunk{base: base, read: base.Counts.Read, version: sk.version})
}
