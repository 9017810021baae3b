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
// ([Job.SkipUnchanged] with a [ChunkVersioner]; the fingerprints' design
// is at the top of replay_skip.go).
//
// A chunk skipped on its fingerprints was still extracted and converted
// in full, which is most of its cost. An extractor that can tell cheaply
// whether a chunk's source changed (a count(*) and a sum of hashes of
// each source row's key and xmin, a partition's or file's generation
// number) implements ChunkVersioner; the version is read before the
// extraction, again after it (confirmVersion: recorded only when both
// reads agree), and recorded with the fingerprints (migration 20,
// chunks.source_version, by the checkpoint statement: a kill -9 loses it
// with the checkpoint, never apart from it). A replay whose version is
// the base's skips the extraction too, when:
//
//   - the version is not "" and equals the one the base recorded with its
//     fingerprints (the base is [ManifestSkips.BaseFingerprints]': the
//     newest done chunk of the job, chunk ID and skip key, not rolled
//     back);
//   - the base rejected no row: a replay re-queues the rows it rejects
//     into its own batch's exception queue, which needs the rows;
//   - the job has a ChunkColumn: the target fingerprint is then taken
//     within the chunk's bounds, without the extracted rows' keys;
//   - the chunk is not read again while open, nor open now;
//   - and, in the chunk's transaction (after the lease's fence), the
//     target fingerprint equals the base's.
//
// Then the chunk is checkpointed as skipUnchanged checkpoints a skipped
// chunk (checkpointSkipped), with the base's Read as read and unchanged,
// no rejects, and the base's fingerprints and version recorded again,
// without calling Extract. Otherwise the chunk is extracted and merged as
// without a version. The decision that the chunk need not be extracted
// is taken in the extract stage (runChunk), in a read transaction of its
// own (versionCandidate: the base's version and rejects); the target
// fingerprint is taken in the chunk's transaction. When that transaction
// finds the chunk must be extracted after all (its target rows changed,
// or its base since rolled back), it rolls back and releases the lease as
// a fence that failed does: the chunk stays claimable, and this call's
// next lease of it extracts it (execution.versionMissed), outside any
// transaction, as usual. Extracting it right there, with the lease
//     kept, would run Extract while the slot holds its write stage, which
//     the pipeline of Config.ExtractAhead forbids (a slot's Extract calls
//     never overlap, its chunks are written in lease order;
//     backfill_pipeline.go): the release costs one more lease, only for a
//     chunk whose target another session changed.
//
// The version is recorded with the fingerprints of the extraction that
// followed it: by a merged chunk whose merge records them, and by a chunk
// skipped on its fingerprints (its extracted rows are the base's, so the
// version read before them stands for them: the next replay skips the
// extraction). A chunk skipped on its version records it again. A
// change of the source during the extraction leaves the older version
// recorded (it was read before): the next replay's version differs, and
// the chunk is extracted, which is conservative.

// ChunkVersioner is implemented by an [Extractor] that can tell, without
// extracting a chunk, whether the chunk's source rows changed: a replay
// with [Job.SkipUnchanged] then skips the extraction of a chunk whose
// version equals the one recorded by its last load (see [Job.SkipUnchanged]
// for when).
//
// ChunkVersion returns a token of the rows Extract would write for c: it
// must change whenever a committed change alters those rows (their
// values, their number, or which rows they are), and never return to an
// earlier token for other rows. Equal tokens at two times promise equal
// rows; a token that changes without the rows changing only costs an
// extraction. The version is read before the chunk's extraction and
// again after it, and recorded only when both reads agree. For a table in
// PostgreSQL, a sum of hashes of each row's key and xmin (the transaction
// that last wrote it) with count(*) is such a token (see [Job.SkipUnchanged]);
// a max(updated_at) is not, when updated_at is set by the writer's
// now(): a transaction that began earlier and commits later leaves the
// max alone. A file's or object's generation number or modification
// stamp is; a content hash (ETag) is too, unless the content may change
// and change back while a chunk is extracted. The token describes the
// source, not Extract's code: change [Job.CodeVersion] when that code
// changes, or a replay skips chunks whose rows the new code would write
// otherwise. It describes the rows as Extract reads them: a change of the
// source's schema that leaves the rows' xmin alone (a column dropped and
// added again or renamed, a default, a view or join behind Extract
// redefined) must change it too, through a term for that shape or a new
// CodeVersion. It is called before the chunk's
// extraction, outside the chunk's transaction, and
// its result is recorded on the chunk's manifest row: UTF-8 text without
// NUL, at most 1,024 bytes (else the chunk fails, not retried). "" means
// unknown: the chunk is extracted. An
// error fails the chunk's attempt as an extraction error does (retried
// like one; the error names the chunk); a panic is
// [ErrExtractorPanic].
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
		log.Warn("backfill: the Extractor is a ChunkVersioner but Job.SkipUnchanged is off: its versions are not used")
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

// skipByVersion skips chunk c, fenced in tx and not extracted, whose
// version sk.version was read before: when its base (looked up in tx)
// lets it (versionBase) and its target rows within its bounds hash as
// the base's, it checkpoints and commits the chunk and returns true.
// Otherwise it returns false, and the chunk is to be extracted.
func (ex *execution) skipByVersion(ctx context.Context, tx backfilldriver.Tx, cr *chunkRun, c Chunk, info TableInfo, started time.Time, sk *chunkSkip) (bool, error) {
	chunkErr := func(err error) error { return &ChunkError{Chunk: c, Attempt: cr.attempt, Err: err} }
	base, ok, err := ex.r.caps.skips.BaseFingerprints(ctx, tx, ex.job.Name, ex.skipKey, ex.batchID, c.ID)
	if err != nil {
		return false, chunkErr(err)
	}
	if !versionBase(base, ok, sk.version) {
		return false, nil
	}
	tfp, err := pgstore.TargetFingerprint(ctx, tx, info, ex.job.ChunkColumn, ex.job.Zone, c)
	if err != nil {
		return false, chunkErr(err)
	}
	if fingerprintText(info, tfp) != base.Target {
		return false, nil
	}
	// The base rejected none (versionBase): its rows read were all
	// staged, and are the rows Extract would write again.
	return ex.checkpointSkipped(ctx, tx, cr, c, info, started, base, base.Counts.Read, 0, nil, nil, sk.version)
}
