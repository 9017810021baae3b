package backfill

// Adaptive chunks (Config.ChunkTarget): a plan chunk whose transaction
// would run longer than the target is worked through in sub-chunks, each
// its own transaction and checkpoint, sized from what the call observed.
//
// The plan stays frozen. A sub-chunk is a refinement of its plan chunk,
// never a chunk of the plan: the plan's chunk list and fingerprint do not
// change, and the manifest's chunks row of the plan chunk stays pending
// until its last sub-chunk commits. Each sub-chunk commits a row of
// subchunks (batch_id, seq, pos, lo, hi, counts) in its own transaction,
// under the plan chunk's fence; the last one's transaction also completes
// the plan chunk with the sums of every sub-chunk's counts, so the
// chunk's accounting (read = inserted + updated + unchanged + rejected +
// deduplicated) is the sum of balanced parts. Sub-chunks tile the plan
// chunk from its lower bound in order: [lo, m1), [m1, m2), ... [mk, hi),
// so the sub-ranges committed are always a prefix, and the remaining
// work is one half-open interval [cursor, hi).
//
// Leasing is the plan chunk's, as without adaptation: the holder of its
// lease extracts and commits one sub-chunk after another without giving
// the lease back, each transaction fenced by the same lease epoch. A
// holder that dies (kill -9) between two sub-chunks leaves the committed
// ones recorded and the chunk pending; whoever leases it next reads its
// sub-chunks and starts at the cursor, so each row is merged once. A
// stale holder's sub-chunk transaction fails its fence like a chunk's.
//
// Rows stay the plan chunk's: a sub-chunk has the plan chunk's Seq and
// ID in every manifest record (the undo log and delivered summary, which
// key on batch_id and seq; exceptions and validations, which key on the
// chunk's ID), so a rollback of the chunk or of the batch finds the rows
// of all its sub-chunks, and the status and report read the plan chunk.
// A plan chunk left pending or failed with sub-chunks committed (its run
// failed or was stopped midway) is rolled back as a done one
// ([splitChunks]). Until its last sub-chunk commits, a plan chunk's rows
// are not in its counts (the report counts chunks done); the status adds
// the committed sub-chunks of the plan chunks not done to its rows and
// rates, so that a long chunk shows its progress.
// Only the user's Extractor sees the sub-chunk's own ID, derived from its
// bounds as a chunker's would be ([subchunkID]).
//
// Sizing. A call keeps two estimates, carried from one plan chunk to
// the next: the rate of a chunk transaction in rows per second (rows
// actually merged over the transaction's duration, from its begin to its
// commit, so the cost of a transaction whatever its rows is in it) and
// the rows per unit of the chunking dimension (one integer, one
// nanosecond). The next sub-chunk's rows are rate × target, within
// [ChunkMinRows, ChunkMaxRows], and its span those rows over the
// density. The rate is a moving average of the logarithm of the readings
// that comes down fast and goes up slowly (a reading under it weighs
// rateDown, over it rateUp): it sits below most readings, so that the
// noise of a loaded server leaves most transactions under the target,
// and follows a slowdown (a checkpoint's full-page writes, a larger
// table) within a few transactions. The first transaction of a call,
// with no rate yet, is held to adaptBootstrapRows rows; until one runs
// half the target, the rate is the last reading (each transaction
// sizing the next, at most adaptGrowth times larger). The density is
// the last sub-chunk's, so a dense stretch shrinks the next sub-chunk at
// once. A sub-chunk's rows are known once it is extracted, before its
// transaction begins: one with more than adaptOversize (1.2) × the rows
// wanted is given back and a shorter sub-range extracted instead, so a
// chunk 50× denser than the rest costs one extraction more, not a long
// transaction; one with less than 1/adaptUndersize of them is given back
// once for a longer one, at the density found (the first sub-chunk of a
// plan chunk after a dense one, a sparse stretch). A plan chunk of at
// most 1.2 × the rows wanted runs whole; a larger one is divided into
// the fewest equal sub-chunks of at most 1.2 × those rows ([spanFor]).
//
// Timeouts. A sub-chunk whose transaction fails with statement_timeout
// (57014) or a lock wait beyond its lock_timeout (55P03) while the call
// goes on is rolled back and retried at once on half its span (and the
// rate lowered to what the timeout implies), without counting an
// attempt, down to a span of one unit; then the error goes to the
// chunk's usual retries.
//
// Scope. Only chunks of the built-in IntRange and time chunkers (Hours,
// Days, Months, Every) are divisible; a job with another chunker (List,
// a custom Chunker), SkipUnchanged (its fingerprints are per plan
// chunk), a publish mode other than PublishPerChunk, or a Manifest
// without [backfilldriver.ManifestSubchunks], runs its chunks whole, and
// the call says so in its log once. A chunk read again while open (it
// ends after the horizon) runs whole too. The knobs chunk_target_ms (0:
// off) and chunk_max_rows replace ChunkTarget and ChunkMaxRows live.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/chunkers"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// DefaultChunkMinRows is the default of [Config.ChunkMinRows].
const DefaultChunkMinRows = 100

// adaptBootstrapRows caps the rows of a call's first adapted
// transaction, before any rate is known.
const adaptBootstrapRows = 1000

// adaptOversize is how far over the rows wanted a sub-chunk may be:
// one extracted with more is given back for a shorter one, and the rest
// of a plan chunk is divided into sub-chunks of at most this many times
// the rows wanted. adaptUndersize: one extracted with fewer than the rows
// wanted over this is given back once for a longer one.
const (
	adaptOversize  = 1.2
	adaptUndersize = 1.5
)

// adaptGrowth bounds how much a sub-chunk's span changes from one
// extraction to the next (grown at most this many times, shrunk to at
// least this fraction): the density of a stretch says little of the next
// one, and a span sized from a sparse stretch that reaches a dense burst,
// then from the burst's average, would go back and forth between them.
const adaptGrowth = 4

// Weights of a reading in the rate estimate, a moving average of the
// logarithm of the readings: a reading under the estimate weighs
// rateDown, one over it rateUp (down fast, up slowly).
const (
	rateDown = 0.5
	rateUp   = 0.2
)

// adaptState is a call's estimates for sizing sub-chunks, shared by its
// worker slots.
type adaptState struct {
	mu      sync.Mutex
	rate    float64 // rows per second of a chunk transaction; 0: unknown
	density float64 // rows per unit of the chunking dimension; 0: unknown
	// warm: a transaction observed ran at least half the target (until
	// then, the rate is the last reading).
	warm bool
	// ceiling caps the rows of a sub-chunk after a timeout: half the
	// rows that timed out, raised by a quarter by each transaction that
	// commits near it, up to 0.8 × the fewest rows that timed out,
	// timedOutRows (0: none).
	ceiling, timedOutRows float64

	once sync.Once
	why  string // why the call runs chunks whole ("" : it adapts)
	sub  backfilldriver.ManifestSubchunks
}

// observe folds a committed transaction of rows rows that took d, under
// target, into the rate, and its density (rows per unit over span units)
// in as the density of the next chunk's start.
func (a *adaptState) observe(rows int64, span uint64, d, target time.Duration) {
	if rows <= 0 || d <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := float64(rows) / d.Seconds()
	switch {
	case a.rate == 0 || !a.warm:
		// Warming up: the transactions so far were short (the first is
		// adaptBootstrapRows), their rates understated by the cost of a
		// transaction whatever its rows; each sizes the next, at most
		// adaptGrowth times larger.
		if a.rate > 0 {
			r = min(r, adaptGrowth*a.rate)
		}
		a.rate = r
		a.warm = d >= target/2
	default:
		// A moving average of the logarithm (a reading twice the
		// estimate and one half of it move it as far), down fast, up
		// slowly: at rest the estimate sits below most readings, so a
		// transaction ends under the target more often than over it,
		// and a slowdown lasting a few transactions (a checkpoint, a
		// larger table) brings it down within a few.
		w := rateUp
		if r < a.rate {
			w = rateDown
		}
		a.rate *= math.Pow(r/a.rate, w)
	}
	if span > 0 {
		a.density = float64(rows) / float64(span)
	}
	if a.ceiling > 0 && float64(rows) >= 0.9*a.ceiling {
		a.ceiling = min(a.ceiling*1.25, 0.8*a.timedOutRows)
	}
}

// timedOut lowers the rate after a transaction of rows rows that ran d
// and timed out: the transaction would have needed more than d.
func (a *adaptState) timedOut(rows int64, d time.Duration) {
	if rows <= 0 || d <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := float64(rows) / d.Seconds() / 2
	if a.rate == 0 || r < a.rate {
		a.rate = r
	}
	if c := float64(rows) / 2; a.ceiling == 0 || c < a.ceiling {
		a.ceiling = c
	}
	if a.timedOutRows == 0 || float64(rows) < a.timedOutRows {
		a.timedOutRows = float64(rows)
	}
}

// adaptLimits are the sizing parameters of one sub-chunk, read when it
// is sized (the knobs change them live).
type adaptLimits struct {
	target           time.Duration
	minRows, maxRows int64
}

// wantRows is the rows a sub-chunk should have under lim: rate × target
// within the bounds, adaptBootstrapRows while the rate is unknown; with
// a maxRows, at most maxRows / adaptOversize, so that no sub-chunk
// (at most adaptOversize × the rows wanted) has more than maxRows.
func (a *adaptState) wantRows(lim adaptLimits) float64 {
	a.mu.Lock()
	rate, ceiling := a.rate, a.ceiling
	a.mu.Unlock()
	want := float64(adaptBootstrapRows)
	if rate > 0 {
		want = rate * lim.target.Seconds()
	}
	if ceiling > 0 {
		want = min(want, ceiling)
	}
	want = max(want, float64(lim.minRows))
	if lim.maxRows > 0 {
		// A cap: a sub-chunk may have adaptOversize × the rows wanted
		// before it is given back, so that many stay within maxRows.
		want = min(want, float64(lim.maxRows)/adaptOversize)
	}
	return want
}

// spanFor is the span (units) of a sub-chunk of want rows at density
// rows per unit, at least minSpan, and at most rest, divided evenly: the
// rest in the fewest equal sub-chunks of at most adaptOversize × the
// span (so the last is no remainder; each is within 0.6× and 1.2× of the
// span: 1.21 spans make two of 0.605, 1.2 one). 0 density: the rest.
func spanFor(want, density float64, minSpan, rest uint64) uint64 {
	if density <= 0 || rest == 0 {
		return rest
	}
	s := want / density
	if s*adaptOversize >= float64(rest) {
		return rest
	}
	most := max(adaptOversize*s, float64(minSpan))
	k := max(math.Ceil(float64(rest)/most), 1)
	// Whole units: never over the most either (a span of a few units).
	return max(min(uint64(math.Ceil(float64(rest)/k)), uint64(most)), minSpan)
}

// subTry is the plan chunk a try's sub-chunk refines, and where the
// sub-chunk lies in it.
type subTry struct {
	plan  Chunk
	pos   int
	off   uint64 // the sub-chunk's lower bound, in units from the plan chunk's
	span  uint64
	last  bool   // the sub-chunk ends at the plan chunk's upper bound
	prior Counts // the sums of the sub-chunks committed before
	split bool   // cut after a timeout of a larger one
	rows  int64  // rows extracted
	// began is when the sub-chunk's transaction began.
	began time.Time
	// density is the rows per unit the chunk's last sub-chunk (committed
	// or extracted) had; 0: none yet (the call's).
	density float64
}

// adaptive reports whether the call adapts its chunks, saying once in
// the log why not when it cannot.
func (ex *execution) adaptive() *adaptState {
	a := &ex.adapt
	a.once.Do(func() {
		if ex.r.cfg.ChunkTarget <= 0 && ex.ctl == nil {
			a.why = "off"
			return
		}
		switch {
		case !splittable(ex.job.Chunker):
			a.why = "its chunker's chunks cannot be split (only IntRange and the time chunkers' can)"
		case ex.job.SkipUnchanged:
			a.why = "skipping unchanged chunks (Job.SkipUnchanged, on by default for a job with a ChunkColumn unless MergeEveryChunk) fingerprints whole chunks"
		default:
			if _, ok := ex.pub.(publishChunk); !ok {
				a.why = "only PublishPerChunk splits chunks"
			}
		}
		if a.why == "" {
			if a.sub, _ = ex.r.cfg.Manifest.(backfilldriver.ManifestSubchunks); a.sub == nil {
				a.why = "its Manifest does not record sub-chunks (backfilldriver.ManifestSubchunks)"
			}
		}
		if a.why != "" && ex.r.cfg.ChunkTarget > 0 {
			ex.log.Info("backfill: chunks run whole in this call despite Config.ChunkTarget: "+a.why, "chunk_target", ex.r.cfg.ChunkTarget)
		}
	})
	if a.why != "" {
		return nil
	}
	return a
}

// splittable reports whether ch's chunks are half-open intervals the
// library may divide.
func splittable(ch Chunker) bool {
	switch ch.(type) {
	case *chunkers.IntRange, *chunkers.Time:
		return true
	}
	return false
}

// adaptLimits are the call's sizing parameters now: the knobs, else the
// Config. target 0: adaptation off.
func (ex *execution) adaptLimits() adaptLimits {
	c := ex.r.cfg
	ms := ex.ctl.knob(pgstore.KnobChunkTarget, float64(c.ChunkTarget)/float64(time.Millisecond))
	lim := adaptLimits{target: time.Duration(ms * float64(time.Millisecond)), minRows: c.ChunkMinRows,
		maxRows: int64(ex.ctl.knob(pgstore.KnobChunkMaxRows, float64(c.ChunkMaxRows)))}
	if lim.minRows <= 0 {
		lim.minRows = DefaultChunkMinRows
	}
	return lim
}

// chunkWidth is c's width in units (integers, nanoseconds) and the
// least span of a sub-chunk of it.
func chunkWidth(c Chunk) (width, minSpan uint64) {
	if c.Kind == backfilltype.KindTime {
		return uint64(c.End.Sub(c.Start)), uint64(time.Millisecond)
	}
	return uint64(c.Hi - c.Lo), 1
}

// alignSpan is span, short of rest, cut to whole microseconds in a time
// chunk (at least one): PostgreSQL keeps timestamps to the microsecond,
// so a bound between two would be rounded by the server (the extractor's
// query) but not by the row writer's check of the sub-chunk's bounds.
// Every sub-chunk's offset is then a whole number of microseconds too.
func alignSpan(c Chunk, span, rest uint64) uint64 {
	if c.Kind != backfilltype.KindTime || span >= rest {
		return span
	}
	const us = uint64(time.Microsecond)
	return min(max(span-span%us, us), rest)
}

// subchunkOf is the sub-chunk [off, off+span) of plan chunk c (clipped to
// c), with c's Seq and ID.
func subchunkOf(c Chunk, off, span uint64) Chunk {
	w, _ := chunkWidth(c)
	end := off + span
	if end > w || end < off {
		end = w
	}
	s := c
	if c.Kind == backfilltype.KindTime {
		s.Start, s.End = c.Start.Add(time.Duration(off)), c.Start.Add(time.Duration(end))
		if end == w {
			s.End = c.End
		}
		return s
	}
	s.Lo, s.Hi = c.Lo+int64(off), c.Lo+int64(end)
	return s
}

// subchunkID is the ID of a chunk as the built-in chunkers derive it from
// its bounds: what the Extractor sees of a sub-chunk.
func subchunkID(c Chunk) string {
	if c.Kind == backfilltype.KindTime {
		return "time:" + c.Start.Format(time.RFC3339Nano) + "/" + c.End.Format(time.RFC3339Nano)
	}
	return "int:" + strconv.FormatInt(c.Lo, 10) + "/" + strconv.FormatInt(c.Hi, 10)
}

// extractorChunk is c as the job's Extractor sees it: a sub-chunk with
// its own ID.
func (ex *execution) extractorChunk(c Chunk) Chunk {
	if (c.Kind == backfilltype.KindInt || c.Kind == backfilltype.KindTime) && ex.adaptive() != nil {
		c.ID = subchunkID(c)
	}
	return c
}

// subOffset is the offset from plan chunk c's lower bound of bound b, as
// the manifest records it (Chunk.Bounds).
func subOffset(c Chunk, b string) (uint64, error) {
	w, _ := chunkWidth(c)
	var off uint64
	if c.Kind == backfilltype.KindTime {
		t, err := time.Parse(time.RFC3339Nano, b)
		if err != nil || t.Before(c.Start) || t.After(c.End) {
			return 0, fmt.Errorf("sub-chunk bound %q is not a time in chunk %s", b, c)
		}
		off = uint64(t.Sub(c.Start))
	} else {
		v, err := strconv.ParseInt(b, 10, 64)
		if err != nil || v < c.Lo || v > c.Hi {
			return 0, fmt.Errorf("sub-chunk bound %q is not an integer in chunk %s", b, c)
		}
		off = uint64(v - c.Lo)
	}
	if off > w {
		return 0, fmt.Errorf("sub-chunk bound %q is outside chunk %s", b, c)
	}
	return off, nil
}

// resumeSub reads the sub-chunks of plan chunk c committed so far: the
// cursor (offset where the rest begins), the next position and the sums
// of their counts. They must tile a prefix of c.
func (ex *execution) resumeSub(ctx context.Context, a *adaptState, c Chunk) (st subTry, err error) {
	st.plan = c
	subs, err := a.sub.Subchunks(ctx, ex.r.db, ex.batchID, c.Seq)
	if err != nil {
		return st, err
	}
	var end uint64
	for i, s := range subs {
		lo, err := subOffset(c, s.Lo)
		var hi uint64
		if err == nil {
			hi, err = subOffset(c, s.Hi)
		}
		if err == nil && (s.Pos != i || lo != end || hi <= lo) {
			err = fmt.Errorf("sub-chunk %d [%s, %s) does not continue the sub-chunks before it", s.Pos, s.Lo, s.Hi)
		}
		if err != nil {
			return st, fmt.Errorf("%w: chunk %d %s: %w", backfilltype.ErrNotRetryable, c.Seq, c.ID, err)
		}
		end = hi
		st.pos = i + 1
		st.prior = addCounts(st.prior, s.Counts)
		st.span = hi - lo
		st.density = float64(s.Read) / float64(hi-lo)
	}
	st.off = end
	return st, nil
}

// addCounts is a + b.
func addCounts(a, b Counts) Counts {
	return Counts{Read: a.Read + b.Read, Inserted: a.Inserted + b.Inserted, Updated: a.Updated + b.Updated,
		Unchanged: a.Unchanged + b.Unchanged, Rejected: a.Rejected + b.Rejected, Deduplicated: a.Deduplicated + b.Deduplicated}
}

// adaptExtract is extract's step for an adaptive call: when plan chunk
// t.c is to be worked in sub-chunks, it extracts the next one into t (t.c
// the sub-chunk, t.sub where it lies) and reports true. false: the chunk
// runs whole (adaptation off, or it fits), and nothing was extracted.
func (ex *execution) adaptExtract(ctx context.Context, t *chunkTry) (bool, error) {
	a := ex.adaptive()
	if a == nil || t.cr.reread || ex.open(t.c, t.started) {
		return false, nil
	}
	lim := ex.adaptLimits()
	if lim.target <= 0 {
		return false, nil
	}
	st, err := ex.resumeSub(ctx, a, t.c)
	if err != nil {
		return false, err
	}
	return true, ex.extractSub(ctx, a, t, st, lim, 0)
}

// extractSub extracts into t the sub-chunk of st.plan from st.off: span
// units long (0: sized from the estimates), shortened and extracted again
// while it has more rows than wanted.
func (ex *execution) extractSub(ctx context.Context, a *adaptState, t *chunkTry, st subTry, lim adaptLimits, span uint64) error {
	width, minSpan := chunkWidth(st.plan)
	rest := width - st.off
	want := a.wantRows(lim)
	// A span given (a split after a timeout) is never grown.
	grown := span != 0
	if span == 0 {
		d := st.density
		if d <= 0 && st.span == 0 {
			// The call's density, for the first sub-chunk of a plan
			// chunk; after an empty one, its span grows (below).
			a.mu.Lock()
			d = a.density
			a.mu.Unlock()
		}
		span = spanFor(want, d, minSpan, rest)
		if st.span > 0 {
			// After the sub-chunk before it: at most adaptGrowth times
			// its span, whatever the density says (a sparse stretch
			// does not say how far it goes).
			span = min(span, st.span*adaptGrowth)
		}
	}
	for {
		span = alignSpan(st.plan, min(span, rest), rest)
		st.span = span
		st.last = span >= rest
		c := subchunkOf(st.plan, st.off, span)
		if st.pos == 0 && st.last {
			c = st.plan
		}
		t.c, t.started = c, time.Now()
		x, err := ex.extractSpooled(t.cr.span.next(ctx, backfilltrace.PhaseExtract), c, t.started, "", st.prior)
		var re *rejectsError
		if errors.As(err, &re) && float64(re.read) > adaptOversize*want && span > minSpan {
			// Too many rejects, but in more rows than the sub-chunk would
			// have kept: a shorter sub-range, which the limit (the plan
			// chunk's) may allow.
			span = max(span/adaptGrowth, minSpan)
			grown = true
			continue
		}
		if err != nil {
			return err
		}
		n := x.w.read
		st.density = float64(n) / float64(span)
		if float64(n) > adaptOversize*want && span > minSpan {
			// Too many rows for one transaction: a shorter sub-range,
			// at the density this extraction found.
			// At most an adaptGrowth-th at a time: the rows may be
			// bunched at its end (a dense burst after a sparse
			// stretch), which the average density does not say.
			x.close()
			span = max(min(spanFor(want, st.density, minSpan, rest), span/2), span/adaptGrowth, minSpan)
			grown = true
			continue
		}
		if !grown && float64(n)*adaptUndersize < want && span < rest {
			// Far fewer rows than wanted (a sparser stretch than the
			// estimate): once, a longer sub-range at the density found.
			x.close()
			grown = true
			g := spanFor(want, st.density, minSpan, rest)
			if st.pos > 0 {
				// Within a plan chunk whose stretches before differ.
				g = min(g, span*adaptGrowth)
			}
			span = g
			continue
		}
		st.rows = n
		t.x, t.sub = x, &st
		t.cr.span.setRows(n)
		return nil
	}
}

// splitCode reports whether err ended a sub-chunk's transaction with a
// statement timeout or a lock wait beyond its lock_timeout while ctx goes
// on: the sub-chunk is retried on half its span.
func splitCode(ctx context.Context, err error) bool {
	code, _, ok := pgstore.WaitCode(ctx, err)
	return ok && (code == "57014" || code == "55P03")
}

// writeSubchunks is runChunk's write step for a try t of lease h that
// extracted a sub-chunk: it writes it, then the next ones, until the
// last commits (committed), one fails, or the call stops between two (the
// chunk stays pending with the sub-chunks committed so far recorded).
func (ex *execution) writeSubchunks(ctx context.Context, t *chunkTry, h *heldLease) (committed bool, err error) {
	a, cr := &ex.adapt, t.cr
	for {
		t.sub.began = time.Now()
		committed, err = ex.write(ctx, t, h)
		d := time.Since(t.sub.began)
		ex.recordLockWaits(ctx, t.lockWaits)
		st := *t.sub
		t.x.close()
		if !committed {
			if err == nil || !splitCode(ctx, err) || st.span <= minSpanOf(st.plan) || ex.stopped() {
				return false, err
			}
			// Timed out: the same sub-range's first half, at once.
			a.timedOut(st.rows, d)
			ex.log.Info("backfill: chunk transaction timed out; splitting it", "seq", st.plan.Seq, "chunk", st.plan.ID,
				"sub_chunk", t.c.String(), "rows", st.rows, "duration", d, "error", err)
			st.split = true
			cr.outcome = tryClaimed
			if err := ex.extractSub(ctx, a, t, st, ex.adaptLimits(), max(st.span/2, minSpanOf(st.plan))); err != nil {
				return false, t.chunkErr(err)
			}
			continue
		}
		a.observe(st.counts(t.cr.res).Read, st.span, d, ex.adaptLimits().target)
		if st.last {
			return true, nil
		}
		// The next sub-chunk, under the same lease, unless the call
		// stopped (paused, cancelled, draining) or the knob turned
		// adaptation off meanwhile (then the rest runs as one). Between
		// two sub-chunks as between two chunks: the run's control state
		// is read (a pause, a cancel, the knobs: between two chunks the
		// lease reads it), and the throttles hold and the rate cap paces
		// the worker, which keeps the plan chunk's lease meanwhile.
		if ctx.Err() != nil {
			cr.outcome = tryNone
			return false, ctx.Err()
		}
		if ex.ctl != nil {
			ex.pollControl(ctx)
		}
		if th := ex.throttle; th != nil && !ex.stopped() {
			if cr.admitted {
				n := st.counts(t.cr.res).Read
				th.settle(n)
				cr.settled += n
			}
			cr.admitted = false
			if err := th.wait(ctx); err != nil {
				cr.outcome = tryNone
				return false, err
			}
			cr.admitted = true
		}
		if ex.stopped() || ex.r.draining.Load() {
			cr.outcome = tryThrottled
			return false, nil
		}
		lim := ex.adaptLimits()
		if lim.target <= 0 {
			lim.target = time.Duration(math.MaxInt64)
		}
		next := subTry{plan: st.plan, pos: st.pos + 1, off: st.off + st.span, span: st.span, density: st.density,
			prior: addCounts(st.prior, st.counts(t.cr.res))}
		cr.outcome, cr.res = tryClaimed, ChunkResult{}
		if err := ex.extractSub(ctx, a, t, next, lim, 0); err != nil {
			return false, t.chunkErr(err)
		}
	}
}

// counts is res's counts less the prior sub-chunks' (res of a last
// sub-chunk carries the plan chunk's sums).
func (s *subTry) counts(res ChunkResult) Counts {
	if s.last && s.pos > 0 {
		return Counts{Read: res.Read - s.prior.Read, Inserted: res.Inserted - s.prior.Inserted, Updated: res.Updated - s.prior.Updated,
			Unchanged: res.Unchanged - s.prior.Unchanged, Rejected: res.Rejected - s.prior.Rejected, Deduplicated: res.Deduplicated - s.prior.Deduplicated}
	}
	return res.Counts
}

// minSpanOf is the least span of a sub-chunk of c.
func minSpanOf(c Chunk) uint64 {
	_, m := chunkWidth(c)
	return m
}

// checkpointSub is checkpoint's step for a try of a sub-chunk: one that
// is not its plan chunk's last records its sub-range and exceptions and
// commits (done); the last records its own and takes the plan chunk's
// sums into t.cr.res, for the checkpoint of the plan chunk (not done).
func (ex *execution) checkpointSub(ctx context.Context, t *chunkTry, exceptions []Exception) (done bool, err error) {
	st := t.sub
	if st.pos == 0 && st.last {
		return false, nil
	}
	res := &t.cr.res
	lo, hi := t.c.Bounds()
	s := backfilltype.Subchunk{Seq: st.plan.Seq, Pos: st.pos, Lo: lo, Hi: hi, Counts: res.Counts, Split: st.split,
		Duration: time.Since(st.began), Worker: ex.r.cfg.WorkerID}
	if st.last {
		// The plan chunk's checkpoint queues the last one's exceptions.
		exceptions = nil
	}
	if err := ex.adapt.sub.CompleteSubchunk(ctx, t.tx, ex.batchID, st.plan.ID, ex.worker.key, s, exceptions); err != nil {
		return true, t.chunkErr(err)
	}
	if st.last {
		res.Chunk, res.Counts = st.plan, addCounts(st.prior, res.Counts)
		return false, nil
	}
	if err := beforeCommit(ctx, t.tx, *res); err != nil {
		return true, t.chunkErr(err)
	}
	t.cr.span.next(ctx, backfilltrace.PhaseCommit)
	if err := t.tx.Commit(); err != nil {
		return true, t.chunkErr(fmt.Errorf("commit: %w", err))
	}
	ex.log.Debug("sub-chunk done", "seq", st.plan.Seq, "chunk", st.plan.ID, "sub_chunk", t.c.String(), "pos", st.pos, "read", res.Read)
	return true, nil
}

// splitChunks returns the plan chunks of batch that have sub-chunks
// committed, with the rows their sub-chunks updated, for a rollback: a
// chunk not done holds the rows of the sub-chunks it committed. nil when
// the manifest cannot tell (none are recorded without
// [backfilldriver.ManifestSubchunks]).
func splitChunks(ctx context.Context, r *Runner, batch int64) (map[int]int64, error) {
	sc, ok := r.cfg.Manifest.(interface {
		SubchunkedChunks(ctx context.Context, db sqlx.ExtContext, batchID int64) (map[int]int64, error)
	})
	if !ok {
		return nil, nil
	}
	return sc.SubchunkedChunks(ctx, r.db, batch)
}
