package backfill

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Replays that skip unchanged chunks, wired into a run ([Job.SkipUnchanged];
// the design note docs/design/skip-unchanged.md explains it).

// skipMode returns job as it runs, whose target is prepared as info:
// with SkipUnchanged set when it skips unchanged chunks. A job that sets
// SkipUnchanged must be eligible (skipEligible's error); one that sets
// MergeEveryChunk never skips; any other skips when it is eligible and
// has a ChunkColumn, and otherwise runs without it, logging why once per
// Runner and job.
func (r *Runner) skipMode(job Job, info TableInfo) (Job, error) {
	switch {
	case job.SkipUnchanged && job.MergeEveryChunk:
		return job, fmt.Errorf("backfill: job %q: %w: SkipUnchanged requires skipping unchanged chunks and MergeEveryChunk turns it off: set one", job.Name, ErrInvalidConfig)
	case job.MergeEveryChunk:
		return job, nil
	case job.SkipUnchanged:
		return job, r.skipEligible(job, info)
	}
	auto := job
	auto.SkipUnchanged = true
	err := r.skipEligible(auto, info)
	if err == nil && job.ChunkColumn == "" {
		// Its target rows would be found by their identities, one index
		// probe per row: about what a merge that finds them unchanged
		// costs, so skipping would not pay.
		err = errors.New("the job has no ChunkColumn: a skip would find the chunk's target rows by their keys, one index probe per row, as its merge does (set Job.SkipUnchanged to skip all the same)")
	}
	if err != nil {
		if _, logged := r.noSkipLogged.LoadOrStore(job.Name, true); !logged {
			r.cfg.Logger.Info("backfill: unchanged chunks of this job are merged, not skipped (set Job.MergeEveryChunk to say so, Job.SkipUnchanged to require skipping)", "job", job.Name, "reason", err)
		}
		return job, nil
	}
	return auto, nil
}

// skipEligible returns why job, whose target is prepared as info, cannot
// skip unchanged chunks: an error wrapping [ErrInvalidConfig] naming the
// reason, or [ErrUnsupported] naming the capability the Runner lacks; nil
// when it can or does not ask to.
func (r *Runner) skipEligible(job Job, info TableInfo) error {
	if !job.SkipUnchanged {
		return nil
	}
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("backfill: job %q: %w: SkipUnchanged: "+format, append([]any{job.Name, ErrInvalidConfig}, args...)...)
	}
	if _, ok := r.cfg.Merger.(*pgstore.Merger); !ok || r.caps.skips == nil {
		return fmt.Errorf("backfill: job %q: SkipUnchanged: %w", job.Name,
			need(false, "ManifestSkips and PGMerger", fmt.Sprintf("the manifest (%T) records the fingerprints and PGMerger (not %T) reads the target's", r.cfg.Manifest, r.cfg.Merger)))
	}
	t := info.Target
	switch {
	case t.Mode != "" && t.Mode != Upsert && t.Mode != AppendOnly:
		return refuse("mode %s: only Upsert and AppendOnly merges are determined by the rows' equality", t.Mode)
	case t.Conflict != "" && t.Conflict != SourceWins:
		return refuse("conflict policy %s: only SourceWins leaves the target rows equal to the staged rows", t.Conflict)
	case t.Version != "":
		return refuse("Target.Version %q: only SourceWins without a version leaves the target rows equal to the staged rows", t.Version)
	case job.Publish.Mode != PublishPerChunk:
		return refuse("publish mode %s: only chunks published as they commit (PublishPerChunk) are skipped", job.Publish.Mode)
	}
	for i, col := range info.Columns {
		if pgstore.HashKind(col) == "" {
			return refuse("column %q of type %s has no fingerprint", col.Name, cmp.Or(col.Type, col.BaseType))
		}
		if i < info.Written && pgstore.CatalogLookup(col) {
			// 'foo' read in as a regclass is the OID foo has then: the
			// same source rows mean other values once foo is created
			// again, and neither fingerprint would change.
			return refuse("column %q of type %s: its values are OIDs looked up by name when read in, so unchanged source rows may stand for other values", col.Name, cmp.Or(col.Type, col.BaseType))
		}
	}
	for i, v := range job.Validators {
		if _, ok := provenValidator(v); !ok {
			if _, ok := v.(CheckExceptionRate); !ok {
				return refuse("validator %d (%T) is not proven by the fingerprints for a skipped chunk (Completeness, Aggregates, ReplayChangesNothing, Sample, DuplicateKeys without AcrossTarget, CheckExceptionRate are)", i+1, v)
			}
		}
	}
	return nil
}

// provenValidator returns the name and severity of a validator whose
// check compares the chunk's staged rows with its target rows, and so
// passes by construction for a skipped chunk: its target rows are the
// ones a merge of the same staged rows left, proven by the fingerprints.
func provenValidator(v Validator) (CheckResult, bool) {
	switch v := v.(type) {
	case Completeness:
		return CheckResult{Check: cmp.Or(v.Name, "completeness"), Severity: pgstore.SeverityOr(v.Severity)}, true
	case Aggregates:
		return CheckResult{Check: cmp.Or(v.Name, "aggregates"), Severity: pgstore.SeverityOr(v.Severity)}, true
	case ReplayChangesNothing:
		return CheckResult{Check: cmp.Or(v.Name, "replay_changes_nothing"), Severity: pgstore.SeverityOr(v.Severity)}, true
	case Sample:
		return CheckResult{Check: cmp.Or(v.Name, "sample"), Severity: pgstore.SeverityOr(v.Severity)}, true
	case DuplicateKeys:
		return CheckResult{Check: cmp.Or(v.Name, "duplicate_keys"), Severity: pgstore.SeverityOr(v.Severity)}, !v.AcrossTarget
	}
	return CheckResult{}, false
}

// skipValidators are job's validators for a chunk skipped on base's
// fingerprints: those proven by them record a passed result saying so;
// the others (CheckExceptionRate) run.
func skipValidators(vs []Validator, base backfilldriver.ChunkFingerprints) []Validator {
	out := make([]Validator, len(vs))
	for i, v := range vs {
		cr, ok := provenValidator(v)
		if !ok {
			out[i] = v
			continue
		}
		detail, _ := json.Marshal(map[string]any{"skipped": true, "base_batch": base.BatchID,
			"source_fingerprint": base.Source, "target_fingerprint": base.Target})
		cr.Passed = true
		cr.Expected = "the chunk's rows as merged by batch " + fmt.Sprint(base.BatchID)
		cr.Actual = "unchanged: source and target fingerprints equal (chunk skipped)"
		cr.Detail = detail
		out[i] = ValidatorFunc(func(context.Context, sqlx.ExtContext, ValidationScope) (CheckResult, error) { return cr, nil })
	}
	return out
}

// logMerges logs, for an operator, why chunk c of a job with
// SkipUnchanged merges although an earlier load of it was found.
func (ex *execution) logMerges(c Chunk, why string) {
	ex.log.Info("backfill: skip: chunk merges: "+why, "seq", c.Seq, "chunk", c.ID)
}

// fingerprintText is a target fingerprint of info's target as the
// manifest records it: "rows:sum" over the rows' values, or
// "tuples:shape:rows:sum" over their tuple identities (tupleHashSQL;
// shape: tupleShapeSQL, read by the same statement), so that one
// recorded in one form never matches the other, nor one recorded under
// another shape.
func fingerprintText(info TableInfo, fp pgstore.Fingerprint) string {
	if info.TupleIdentity {
		return fmt.Sprintf("tuples:%s:%d:%s", fp.Shape, fp.Rows, fp.Sum)
	}
	return fmt.Sprintf("%d:%s", fp.Rows, fp.Sum)
}

// insertedText is a target fingerprint of the rows one transaction
// inserted (pgstore.TargetInserted), as the manifest records it:
// "inserts:shape:rows:matched:xid", rows the count of the chunk's target
// rows, matched those of them whose xmin is xid. Recorded with rows and
// matched both the count the merge inserted; a replay's
// (pgstore.TargetInsertedCount) equals it only when its rows are those.
func insertedText(shape string, rows, matched int64, xid string) string {
	return fmt.Sprintf("inserts:%s:%d:%d:%s", shape, rows, matched, xid)
}

// insertedXid returns the transaction ID of a base's target fingerprint
// recorded by insertedText, or "" for one of another form (or a
// malformed one, which then never matches).
func insertedXid(target string) string {
	if !strings.HasPrefix(target, "inserts:") {
		return ""
	}
	xid := target[strings.LastIndexByte(target, ':')+1:]
	if xid == "" || strings.Trim(xid, "0123456789") != "" || len(xid) > 10 {
		return ""
	}
	return xid
}

// targetText returns the target fingerprint of try t's chunk (t.info's
// rows within its bounds, read in t.tx) in the form of baseTarget, the
// fingerprint its base recorded: the count of the rows the base's merge
// inserted (insertedText) when the base recorded those, else the rows'
// fingerprint (fingerprintText).
func (ex *execution) targetText(ctx context.Context, t *chunkTry, baseTarget string) (string, error) {
	if xid := insertedXid(baseTarget); xid != "" && t.info.TupleIdentity {
		fp, err := pgstore.TargetInsertedCount(ctx, t.tx, t.info, ex.job.ChunkColumn, ex.job.Zone, t.c, xid)
		if err != nil {
			return "", err
		}
		return insertedText(fp.Shape, fp.Rows, parseCount(fp.Sum), xid), nil
	}
	fp, err := pgstore.TargetFingerprint(ctx, t.tx, t.info, ex.job.ChunkColumn, ex.job.Zone, t.c)
	if err != nil {
		return "", err
	}
	return fingerprintText(t.info, fp), nil
}

// tupleRows returns the count of rows of a target fingerprint of their
// tuple identities (fingerprintText with TupleIdentity, or
// insertedText), read from its end; false for one of another form.
func tupleRows(target string) (int64, bool) {
	parts := strings.Split(target, ":")
	var rows string
	switch {
	case strings.HasPrefix(target, "tuples:") && len(parts) >= 4:
		rows = parts[len(parts)-2]
	case strings.HasPrefix(target, "inserts:") && len(parts) >= 5:
		rows = parts[len(parts)-3]
	default:
		return 0, false
	}
	n, err := strconv.ParseInt(rows, 10, 64)
	return n, err == nil && n >= 0
}

// parseCount reads a count the server sent as text (-1 if it is none).
func parseCount(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// chunkSkip is what a chunk of a job with SkipUnchanged carries from
// its extraction to its checkpoint.
type chunkSkip struct {
	// source is the fingerprint of the rows the extraction spooled, as
	// written (skip_probe.go).
	source *rawFingerprint
	// probed is the fingerprint of a chunk probed as unchanged, not
	// spooled ([execution.probe]), of probedRows rows ("" for none).
	probed     string
	probedRows int64
	// record is what the checkpoint records (zero: nothing).
	record backfilldriver.ChunkFingerprints
	// version is the chunk's source version ([ChunkVersioner]), read
	// before its extraction ("" for none); recorded with the
	// fingerprints ([execution.confirmVersion]).
	version string
}

// skipFingerprint returns, for a row writer of chunk c of a job with
// SkipUnchanged, the source fingerprint it sums (of the values written,
// before their conversion) and the chunkSkip that carries it; nil
// without the option.
func (ex *execution) skipFingerprint(info TableInfo) (*rawFingerprint, *chunkSkip) {
	if !ex.job.SkipUnchanged {
		return nil, nil
	}
	fp := &rawFingerprint{context: rawContext(ex.job, info)}
	return fp, &chunkSkip{source: fp}
}

// extractSpooled extracts chunk c into a spool, outside any transaction
// (runChunk). A job with SkipUnchanged decides after the extraction
// whether to stage. The caller closes the spool (spooled.close); on an
// error it is closed already.
//
// version is the chunk's version read before (chunkVersion), recorded
// with its fingerprints. rowBase is the number of the row before the
// chunk's first: 0, or for a sub-chunk the rows its plan chunk read in
// the sub-chunks before it, so that row numbers name a row of the plan
// chunk.
func (ex *execution) extractSpooled(ctx context.Context, c Chunk, started time.Time, version string, prior Counts) (*spooled, error) {
	sp := ex.r.newSpool()
	info := ex.chunkInfo(ex.info, c)
	fp, sk := ex.skipFingerprint(info)
	if sk != nil {
		sk.version = version
	}
	w := newRowWriter(c, ex.job, info, sp, ex.r.cfg.MaxRejectsPerChunk, started)
	w.fp = fp
	w.mem = ex.r.mem.rejects
	// A sub-chunk's rows are numbered on from its plan chunk's rows
	// before it, and its rejects count toward the plan chunk's limit.
	w.row, w.priorRejected = prior.Read, prior.Rejected
	xerr := extractSafely(ctx, ex.job.Extractor, ex.extractorChunk(c), w)
	w.closed = true
	switch {
	case w.err != nil:
		_ = sp.Close()
		w.releaseMem()
		if errors.Is(w.err, ErrTooManyRejects) {
			return nil, &rejectsError{read: w.read, err: w.err}
		}
		return nil, w.err
	case xerr != nil:
		_ = sp.Close()
		w.releaseMem()
		return nil, fmt.Errorf("extract: %w", xerr)
	}
	// A version was read only for a chunk neither re-read nor open.
	if err := ex.confirmVersion(ctx, c, sk, false, started); err != nil {
		_ = sp.Close()
		w.releaseMem()
		return nil, err
	}
	return &spooled{sp: sp, w: w, skip: sk}, nil
}

// rejectsError is an extraction stopped by too many rejected rows, after
// read rows: an adaptive call gives back a sub-range that had more rows
// than it wanted by then, rather than fail it (a shorter one may hold
// fewer rejects).
type rejectsError struct {
	read int64
	err  error
}

func (e *rejectsError) Error() string { return e.err.Error() }
func (e *rejectsError) Unwrap() error { return e.err }

// skipUnchanged skips try t's chunk, extracted into t.x and fenced in
// t.tx, when its source rows and its target rows (t.info's, within its
// bounds) are those the base load recorded: it checkpoints and commits
// the chunk and returns true. It returns false when the chunk must be
// merged.
func (ex *execution) skipUnchanged(ctx context.Context, t *chunkTry) (bool, error) {
	cr, c, tx, info, x := t.cr, t.c, t.tx, t.info, t.x
	chunkErr := t.chunkErr
	if cr.reread || ex.open(c, t.started) {
		// Read again while open, or open now: its counts combine with
		// the earlier reads' (Counts.Reread), never skipped.
		return false, nil
	}
	base, ok, err := ex.r.caps.skips.BaseFingerprints(ctx, tx, ex.job.Name, ex.skipKey, ex.batchID, c.ID)
	if err != nil {
		return false, chunkErr(err)
	}
	switch {
	case !ok:
		ex.log.Debug("backfill: skip: chunk merges: no earlier load of it under this skip key", "seq", c.Seq, "chunk", c.ID)
		return false, nil
	case base.Source == "" || base.Target == "":
		ex.logMerges(c, "its last load recorded no fingerprints (its merge rejected or deduplicated rows, or the target held rows it did not stage)")
		return false, nil
	case base.Source != x.skip.source.String():
		ex.logMerges(c, "its source rows changed since its last load")
		return false, nil
	}
	// The chunk's target rows: within its bounds, or, without
	// ChunkColumn, those of the spooled rows' identities.
	var keys [][]string
	var tfp pgstore.Fingerprint
	var tt string
	if ex.job.ChunkColumn == "" {
		xid := insertedXid(base.Target)
		if !info.TupleIdentity {
			xid = ""
		}
		if keys, err = spoolKeys(ctx, x.sp, info); err == nil {
			tfp, err = pgstore.TargetInsertedCountKeys(ctx, tx, info, keys, c, xid)
		}
		switch {
		case err != nil:
		case xid != "":
			tt = insertedText(tfp.Shape, tfp.Rows, parseCount(tfp.Sum), xid)
		default:
			tt = fingerprintText(info, tfp)
		}
	} else {
		tt, err = ex.targetText(ctx, t, base.Target)
	}
	if err != nil {
		return false, chunkErr(err)
	}
	if tt != base.Target {
		ex.logMerges(c, "its target rows changed since its last load (or the target's shape)")
		return false, nil
	}
	// The version read before this extraction stands for its rows, which
	// are the base's: recorded, the next replay need not extract them.
	return ex.checkpointSkipped(ctx, t, skippedChunk{base: base, read: x.w.read, rejected: x.w.rejected, exceptions: x.w.exceptions, keys: keys, version: x.skip.version})
}

// skippedChunk is what checkpointSkipped records of a chunk skipped on
// base's fingerprints: read rows, rejected of them (queued as
// exceptions), the identities keys of its target rows without
// ChunkColumn, and the version recorded with base's fingerprints.
type skippedChunk struct {
	base           backfilldriver.ChunkFingerprints
	read, rejected int64
	exceptions     []Exception
	keys           [][]string
	version        string
}

// checkpointSkipped checkpoints try t's chunk, claimed in t.tx, as
// skipped (sc) on sc.base's fingerprints, and commits: sc.read rows,
// sc.rejected of them (queued as exceptions), the rest unchanged; the
// delivered summary of the target rows in its bounds (of the identities
// sc.keys without ChunkColumn); the validators of skipValidators; and
// the base's fingerprints recorded again, with sc.version.
func (ex *execution) checkpointSkipped(ctx context.Context, t *chunkTry, sc skippedChunk) (bool, error) {
	cr, c, tx, info := t.cr, t.c, t.tx, t.info
	base, read, rejected, exceptions, keys, version := sc.base, sc.read, sc.rejected, sc.exceptions, sc.keys, sc.version
	chunkErr := t.chunkErr
	cr.res = ChunkResult{Chunk: c, Attempt: cr.attempt, StartedAt: t.started, Worker: ex.r.cfg.WorkerID, Skipped: true,
		Counts: Counts{Read: read, Unchanged: read - rejected, Rejected: rejected}}
	cr.span.setRows(read)
	// What a merge of the chunk would have summarised: the rows it
	// delivered unchanged that other batches last wrote.
	if err := ex.recordSkippedDelivered(ctx, tx, info, c, keys, base); err != nil {
		return false, chunkErr(err)
	}
	cr.span.next(ctx, backfilltrace.PhaseValidate)
	if err := ex.validateChunkWith(ctx, t, nil, exceptions, skipValidators(ex.job.Validators, base)); err != nil {
		return false, err
	}
	cr.span.next(ctx, backfilltrace.PhaseCheckpoint)
	cr.res.FinishedAt = time.Now()
	for i := range exceptions {
		exceptions[i].BatchID = ex.batchID
	}
	// The base's fingerprints, recorded again: this chunk is the newest
	// base of the next replay.
	rec := backfilldriver.ChunkFingerprints{SkipKey: ex.skipKey, Source: base.Source, Target: base.Target, Version: version}
	if err := ex.r.caps.skips.CompleteChunkFingerprinted(ctx, tx, ex.batchID, cr.res, exceptions, rec); err != nil {
		return false, chunkErr(err)
	}
	cr.span.next(ctx, backfilltrace.PhaseCommit)
	if err := tx.Commit(); err != nil {
		return false, chunkErr(fmt.Errorf("commit: %w", err))
	}
	return true, nil
}

// recordAfterMerge sets sk.record when the merge of try t's chunk took
// every row it staged (mr, of the staged rows w counted) and, in one
// statement in t.tx after the merge (pgstore.TargetFingerprintMerged),
// the target rows of t.info within its bounds (without ChunkColumn: of
// the identities in stager's staging table) are exactly as many and
// each equals the staged row of its identity: their fingerprints.
// Otherwise, or when stager has no staging table
// ([backfilldriver.StagingTabler]) to compare with, nothing is recorded.
//
// The merge's result alone does not prove the recorded state: it does
// not lock the rows it leaves unchanged, and under READ COMMITTED
// another session may change one and commit before the fingerprint's
// statement, whose snapshot then holds the change. Recording that state
// would let a replay of the same source skip the chunk and keep the
// change, where its merge would restore the source's row. A change
// after the statement is harmless: the next replay's fingerprint then
// differs from the recorded one and the chunk merges.
func (ex *execution) recordAfterMerge(ctx context.Context, t *chunkTry, sk *chunkSkip, w *rowWriter, stager backfilldriver.Stager, mr backfilltype.MergeResult) error {
	tx, info, c := t.tx, t.info, t.c
	staged := w.read - w.rejected
	// The source fingerprint stands for every row the extraction read
	// (t.x.w), the rows it rejected included; a row refused by the
	// staging (w's rejects beyond the extraction's) is not decided by
	// the values written alone, so the chunk records none.
	x := t.x.w
	if len(mr.Rejected) > 0 || mr.Deduplicated > 0 || mr.Inserted+mr.Updated+mr.Unchanged != staged ||
		sk.source == nil || sk.source.rows != x.read || w.rejected != x.rejected || sk.source.String() == "" {
		return nil
	}
	st, ok := stager.(backfilldriver.StagingTabler)
	if !ok {
		return nil
	}
	params := pgstore.TargetFingerprintMergedParams{Info: info, ChunkColumn: ex.job.ChunkColumn, Zone: ex.job.Zone, Staging: st.StagingTable(), Chunk: c}
	if mr.Inserted == staged && staged > 0 && info.TupleIdentity {
		// New ground: every staged row is a row version this transaction
		// inserted. The transaction that inserted them stands for them
		// (pgstore.TargetInserted), without a scan of the chunk's rows.
		p, err := pgstore.TargetInserted(ctx, tx, params)
		if err != nil {
			return err
		}
		if p.Xid != "" && !p.Rewrites {
			sk.record = backfilldriver.ChunkFingerprints{Source: sk.source.String(), Target: insertedText(p.Shape, staged, staged, p.Xid), Version: sk.version}
			return nil
		}
	}
	tfp, err := pgstore.TargetFingerprintMerged(ctx, tx, params)
	if err != nil {
		return err
	}
	if tfp.Rows != staged || tfp.Stray != 0 {
		// Rows of the bounds the chunk did not stage (written by others,
		// or rows the source no longer has), or rows changed since the
		// merge: the next replay merges.
		return nil
	}
	// The version read before the extraction, with the fingerprints of
	// its rows.
	sk.record = backfilldriver.ChunkFingerprints{Source: sk.source.String(), Target: fingerprintText(info, tfp.Fingerprint), Version: sk.version}
	return nil
}

// recordSkippedDelivered records, for a chunk skipped in tx on base's
// fingerprints, the delivered summary (see [RollbackConflict]) of the
// target rows within its bounds (without ChunkColumn: of the identities
// keys): one row per owner batch (lineage UpdatedBy) other than this
// one, with how many and the least and greatest identity. It does
// nothing without lineage or a delivered table.
//
// When base was skipped too and its target fingerprint is of the rows'
// tuple identities (equal to this chunk's, checked by the caller: the
// rows are the row versions the base saw, their lineage too), the
// base's summary is copied (pgstore.CopyDelivered) when it accounts for
// every one of those rows; otherwise, or without rows, the rows are
// read.
func (ex *execution) recordSkippedDelivered(ctx context.Context, tx backfilldriver.Tx, info TableInfo, c Chunk, keys [][]string, base backfilldriver.ChunkFingerprints) error {
	t := info.Target
	if ex.deliveredTable == "" || t.Lineage.UpdatedBy == "" {
		return nil
	}
	identity := info.Identity()
	if rows, ok := tupleRows(base.Target); ok && base.Skipped && info.TupleIdentity {
		if rows == 0 {
			return nil // no target row: no summary
		}
		copied, err := pgstore.CopyDelivered(ctx, tx, ex.deliveredTable, ex.batchID, c.Seq, base.BatchID, base.Seq, identity, rows)
		if err != nil || copied {
			return err
		}
	}
	pc, err := pgstore.NewPGCheck("delivered", SeverityError, ValidationScope{Chunk: c, Info: info, ChunkColumn: ex.job.ChunkColumn, Zone: ex.job.Zone, Staging: "-"})
	if err != nil {
		return err
	}
	a := pgstore.SQLArgs{ex.batchID, c.Seq, pq.Array(identity)}
	from := pgstore.SQLf("{target} t", "target", sqlgen.Table(t.Table))
	bounds := "true"
	if ex.job.ChunkColumn == "" {
		from = pgstore.KeysJoin(pc, keys, &a)
	} else if bounds, err = pc.InChunk("t", &a); err != nil {
		return err
	}
	rows := pgstore.SQLf(`SELECT {tid}, t.{ub} AS _backfill_owner FROM {from} WHERE {bounds} AND t.{ub} <> $1::bigint`,
		"from", from, "tid", sqlgen.List("t.", identity), "ub", sqlgen.Ident(t.Lineage.UpdatedBy), "bounds", bounds)
	q := pgstore.DeliveredSummarySQL(ex.deliveredTable, identity, rows)
	if _, err := tx.ExecContext(ctx, q, a...); err != nil {
		return fmt.Errorf("backfill: skip chunk %s: record unchanged deliveries: %w", c.ID, err)
	}
	return nil
}

// readCommitted reports whether the chunk transactions r's DB begins
// are READ COMMITTED, by beginning one and reading its isolation
// (rolled back: it writes nothing).
func (r *Runner) readCommitted(ctx context.Context) (bool, error) {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("backfill: chunk transactions' isolation: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var iso string
	if err := sqlx.GetContext(ctx, tx, &iso, `SELECT current_setting('transaction_isolation')`); err != nil {
		return false, fmt.Errorf("backfill: chunk transactions' isolation: %w", err)
	}
	return iso == "read committed", nil
}
