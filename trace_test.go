package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltrace"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

// recorder is a tracer that records every call, with the span each one
// belongs to: Start returns a context carrying a new span whose parent is
// the span of the context it was given.
type recorder struct {
	mu     sync.Mutex
	nextID int
	spans  map[int]*recSpan
	events []recEvent
	// onThrottle is called (outside the lock) on each throttle event.
	onThrottle func(backfilltrace.ThrottleData)
}

type recSpan struct {
	id, parent int
	kind       string // run, chunk, phase
	phase      backfilltrace.Phase
	chunk      backfill.Chunk
	attempt    int
	seq        int // order of the start among all calls
	endSeq     int // 0 while open
	chunkEnd   backfilltrace.ChunkEndData
	phaseEnd   backfilltrace.PhaseEndData
	runEnd     backfilltrace.RunEndData
	endCtxSpan int // the span of the context End was given
}

type recEvent struct {
	span     int // the span of the event's context
	throttle *backfilltrace.ThrottleData
	pause    *backfilltrace.PauseData
	retry    *backfilltrace.RetryData
}

type spanKey struct{}

func spanOf(ctx context.Context) int { id, _ := ctx.Value(spanKey{}).(int); return id }

func newRecorder() *recorder { return &recorder{spans: map[int]*recSpan{}} }

func (r *recorder) start(ctx context.Context, s *recSpan) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	s.id, s.parent, s.seq = r.nextID, spanOf(ctx), r.nextID
	r.spans[s.id] = s
	return context.WithValue(ctx, spanKey{}, s.id)
}

func (r *recorder) end(ctx context.Context, f func(s *recSpan)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	s := r.spans[spanOf(ctx)]
	if s == nil {
		panic("end of an unknown span")
	}
	if s.endSeq != 0 {
		panic(fmt.Sprintf("span %d (%s %s) ended twice", s.id, s.kind, s.phase))
	}
	s.endSeq, s.endCtxSpan = r.nextID, spanOf(ctx)
	f(s)
}

func (r *recorder) TraceRunStart(ctx context.Context, d backfilltrace.RunStartData) context.Context {
	return r.start(ctx, &recSpan{kind: "run"})
}
func (r *recorder) TraceRunEnd(ctx context.Context, d backfilltrace.RunEndData) {
	r.end(ctx, func(s *recSpan) { s.runEnd = d })
}
func (r *recorder) TraceChunkStart(ctx context.Context, d backfilltrace.ChunkStartData) context.Context {
	return r.start(ctx, &recSpan{kind: "chunk", chunk: d.Chunk, attempt: d.Attempt})
}
func (r *recorder) TraceChunkEnd(ctx context.Context, d backfilltrace.ChunkEndData) {
	r.end(ctx, func(s *recSpan) { s.chunkEnd = d })
}
func (r *recorder) TracePhaseStart(ctx context.Context, d backfilltrace.PhaseStartData) context.Context {
	return r.start(ctx, &recSpan{kind: "phase", phase: d.Phase, chunk: d.Chunk, attempt: d.Attempt})
}
func (r *recorder) TracePhaseEnd(ctx context.Context, d backfilltrace.PhaseEndData) {
	r.end(ctx, func(s *recSpan) { s.phaseEnd = d })
}
func (r *recorder) TraceThrottle(ctx context.Context, d backfilltrace.ThrottleData) {
	r.mu.Lock()
	r.events = append(r.events, recEvent{span: spanOf(ctx), throttle: &d})
	f := r.onThrottle
	r.mu.Unlock()
	if f != nil {
		f(d)
	}
}
func (r *recorder) TracePause(ctx context.Context, d backfilltrace.PauseData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recEvent{span: spanOf(ctx), pause: &d})
}
func (r *recorder) TraceRetry(ctx context.Context, d backfilltrace.RetryData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recEvent{span: spanOf(ctx), retry: &d})
}

var _ interface {
	backfilltrace.Tracer
	backfilltrace.PhaseTracer
	backfilltrace.RunTracer
	backfilltrace.ThrottleTracer
	backfilltrace.PauseTracer
	backfilltrace.RetryTracer
} = (*recorder)(nil)

// check verifies the recorded spans: every span ended once with the
// context its Start returned; chunks are children of a run, phases of a
// chunk; a chunk's phases follow one another (each ends before the next
// starts) in the order of want (a prefix of it when the chunk failed,
// then ending in the phase that failed), inside their chunk. It returns
// the chunk spans in start order.
func (r *recorder) check(t *testing.T, want []backfilltrace.Phase) []*recSpan {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	phases := map[int][]*recSpan{}
	var chunks []*recSpan
	for _, s := range r.spans {
		require.NotZero(t, s.endSeq, "span %d (%s %s of %s) never ended", s.id, s.kind, s.phase, s.chunk.ID)
		require.Equal(t, s.id, s.endCtxSpan, "span %d ended with another span's context", s.id)
		require.Greater(t, s.endSeq, s.seq)
		switch s.kind {
		case "run":
			require.Zero(t, s.parent, "a run span has no parent here")
		case "chunk":
			p := r.spans[s.parent]
			require.NotNil(t, p, "chunk %s has no parent span", s.chunk.ID)
			require.Equal(t, "run", p.kind, "chunk %s: parent", s.chunk.ID)
			require.Greater(t, s.seq, p.seq)
			require.Less(t, s.endSeq, p.endSeq, "chunk %s ends after its run", s.chunk.ID)
			chunks = append(chunks, s)
		case "phase":
			p := r.spans[s.parent]
			require.NotNil(t, p)
			require.Equal(t, "chunk", p.kind, "phase %s: parent", s.phase)
			require.Equal(t, p.chunk.ID, s.chunk.ID)
			require.Equal(t, p.attempt, s.attempt)
			phases[p.id] = append(phases[p.id], s)
		}
	}
	slices.SortFunc(chunks, func(a, b *recSpan) int { return a.seq - b.seq })
	for _, c := range chunks {
		ps := phases[c.id]
		slices.SortFunc(ps, func(a, b *recSpan) int { return a.seq - b.seq })
		require.NotEmpty(t, ps, "chunk %s has no phases", c.chunk.ID)
		var got []backfilltrace.Phase
		for i, p := range ps {
			// A chunk extracted ahead (the default) that waited for its
			// worker's previous chunk has a queued phase after extract:
			// whether it waited depends on timing.
			if p.phase != backfilltrace.PhaseQueued || slices.Contains(want, backfilltrace.PhaseQueued) {
				got = append(got, p.phase)
			} else {
				require.Equal(t, backfilltrace.PhaseExtract, ps[i-1].phase, "queued after %s", ps[i-1].phase)
			}
			require.Greater(t, p.seq, c.seq)
			require.Less(t, p.endSeq, c.endSeq, "phase %s of %s ends after its chunk", p.phase, c.chunk.ID)
			if i > 0 {
				require.Less(t, ps[i-1].endSeq, p.seq, "phases %s and %s of %s overlap", ps[i-1].phase, p.phase, c.chunk.ID)
			}
			if i < len(ps)-1 {
				require.NoError(t, p.phaseEnd.Err, "phase %s of %s", p.phase, c.chunk.ID)
			}
		}
		switch c.chunkEnd.Outcome {
		case backfilltrace.OutcomeDone, backfilltrace.OutcomeOpen:
			require.Equal(t, want, got, "phases of %s", c.chunk.ID)
			require.NoError(t, c.chunkEnd.Err)
			require.True(t, c.chunkEnd.Counts.Balanced(), "%s: %+v", c.chunk.ID, c.chunkEnd.Counts)
		case backfilltrace.OutcomeFailed:
			require.Error(t, c.chunkEnd.Err)
			require.Equal(t, want[:len(got)], got, "phases of failed %s", c.chunk.ID)
			require.ErrorIs(t, ps[len(ps)-1].phaseEnd.Err, c.chunkEnd.Err, "the last phase of %s ends with the chunk's error", c.chunk.ID)
		default:
			require.Equal(t, want[:len(got)], got, "phases of %s (%s)", c.chunk.ID, c.chunkEnd.Outcome)
		}
	}
	return chunks
}

func (r *recorder) runs() []*recSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*recSpan
	for _, s := range r.spans {
		if s.kind == "run" {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *recSpan) int { return a.seq - b.seq })
	return out
}

func (r *recorder) allEvents() []recEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

var leasedPhases = []backfilltrace.Phase{backfilltrace.PhaseClaim, backfilltrace.PhaseExtract, backfilltrace.PhaseStage, backfilltrace.PhaseMerge,
	backfilltrace.PhaseValidate, backfilltrace.PhaseCheckpoint, backfilltrace.PhaseCommit}

// TestTraceSpansOfARun: a run traced by a recording tracer: one span per
// chunk, under the run's, with every phase in order, ended once; the
// chunk spans' counts add up to the run's.
func TestTraceSpansOfARun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cfg    backfill.Config
		phases []backfilltrace.Phase
	}{
		{"leased", backfill.Config{Concurrency: 2}, leasedPhases},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := newItems(t)
			rec := newRecorder()
			cfg := tc.cfg
			cfg.Tracer = rec
			r, err := backfill.New(s.db, &cfg)
			require.NoError(t, err)
			// The extractor sees the extract phase's context.
			job := s.job(1)
			inner := job.Extractor
			var extractSpans sync.Map
			job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				extractSpans.Store(c.ID, spanOf(ctx))
				return inner.Extract(ctx, c, w)
			})
			rep, err := r.Run(ctx, job)
			require.NoError(t, err)

			chunks := rec.check(t, tc.phases)
			require.Len(t, chunks, 10)
			var sum backfill.Counts
			seen := map[string]bool{}
			for _, c := range chunks {
				require.Equal(t, backfilltrace.OutcomeDone, c.chunkEnd.Outcome, c.chunk.ID)
				require.Equal(t, rep.BatchID, c.chunkEnd.BatchID)
				require.Equal(t, "items", c.chunkEnd.Job)
				require.Equal(t, 1, c.attempt)
				require.False(t, seen[c.chunk.ID], "chunk %s traced twice", c.chunk.ID)
				seen[c.chunk.ID] = true
				sum = sum.Add(c.chunkEnd.Counts)
				id, _ := extractSpans.Load(c.chunk.ID)
				rec.mu.Lock()
				xs := rec.spans[id.(int)]
				rec.mu.Unlock()
				require.Equal(t, backfilltrace.PhaseExtract, xs.phase, "the extractor's context is its phase's")
				require.Equal(t, c.id, xs.parent)
				require.Equal(t, int64(100), xs.phaseEnd.Rows, "rows read in the extract phase of %s", c.chunk.ID)
			}
			require.Equal(t, rep.Counts, sum)
			runs := rec.runs()
			require.Len(t, runs, 1)
			require.Equal(t, rep.BatchID, runs[0].runEnd.BatchID)
			require.Equal(t, backfill.RunCompleted, runs[0].runEnd.Status)
			require.Equal(t, rep.Counts, runs[0].runEnd.Counts)
			require.NoError(t, runs[0].runEnd.Err)
		})
	}
}

// TestTraceFailuresEndEverySpan: an extractor that panics, one that fails
// with a retryable error, one whose try waits (40001), and a cancelled
// context: every span still ends once, the failed attempt with its error
// in the phase that failed, and the retries come as events with their
// SQLSTATE, under the run's span.
func TestTraceFailuresEndEverySpan(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cfg    backfill.Config
		phases []backfilltrace.Phase
	}{
		{"leased", backfill.Config{Concurrency: 2, RetryBackoff: time.Millisecond}, leasedPhases},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := newItems(t)
			rec := newRecorder()
			cfg := tc.cfg
			cfg.Tracer = rec
			cfg.LockRetries = []backfill.LockRetry{{Timeout: time.Second, Sleep: time.Millisecond}, {Timeout: time.Second}}
			r, err := backfill.New(s.db, &cfg)
			require.NoError(t, err)

			// A retryable failure (23505) on chunk 1's first attempt, a
			// wait (40001) on chunk 2's first try, then a panic on chunk 5.
			var tries sync.Map
			job := s.job(1)
			inner := job.Extractor
			job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				v, _ := tries.LoadOrStore(c.Seq, new(atomic.Int64))
				n := v.(*atomic.Int64).Add(1)
				switch {
				case c.Seq == 1 && n == 1:
					return &pq.Error{Code: "23505", Message: "duplicate key value"}
				case c.Seq == 2 && n == 1:
					if err := w.Write(ctx, "acme", c.Lo, "x", "1.00", nil); err != nil {
						return err
					}
					return &pq.Error{Code: "40001", Message: "could not serialize access"}
				case c.Seq == 5:
					panic("extractor bug")
				}
				return inner.Extract(ctx, c, w)
			})
			rep, err := r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrExtractorPanic)

			chunks := rec.check(t, tc.phases)
			var failed []string
			for _, c := range chunks {
				if c.chunkEnd.Outcome == backfilltrace.OutcomeFailed {
					failed = append(failed, fmt.Sprintf("%d/%d", c.chunk.Seq, c.attempt))
				}
			}
			require.Contains(t, failed, "1/1")
			require.Contains(t, failed, "2/1")
			require.Contains(t, failed, "5/1")
			for _, c := range chunks {
				if c.chunk.Seq == 5 {
					require.ErrorIs(t, c.chunkEnd.Err, backfill.ErrExtractorPanic)
				}
			}

			runs := rec.runs()
			require.Len(t, runs, 1)
			require.Equal(t, rep.BatchID, runs[0].runEnd.BatchID)
			require.ErrorIs(t, runs[0].runEnd.Err, backfill.ErrExtractorPanic)
			var got []string
			for _, e := range rec.allEvents() {
				if e.retry == nil {
					continue
				}
				require.Equal(t, runs[0].id, e.span, "a retry is an event of the run's span")
				got = append(got, fmt.Sprintf("%s %d %s final=%v", e.retry.Kind, e.retry.Chunk.Seq, e.retry.SQLState, e.retry.Final))
			}
			require.Contains(t, got, "attempt 1 23505 final=false")
			require.Contains(t, got, "wait 2 40001 final=false")
			require.Contains(t, got, "attempt 5  final=true")
		})
	}
}

// TestTraceCancelEndsSpans: a context cancelled while a chunk extracts
// ends the chunk's span (with the error) and the run's.
func TestTraceCancelEndsSpans(t *testing.T) {
	t.Parallel()
	s := newItems(t)
	rec := newRecorder()
	// Serial: the counts below are those of a worker with one chunk in
	// flight (extracting ahead, chunk 2 may still be in its transaction
	// while chunk 3 is extracted).
	r, err := backfill.New(s.db, &backfill.Config{Tracer: rec, SerialExtract: true})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job := s.job(1)
	var inFlight map[backfill.ChunkStatus]int64
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Seq == 3 {
			// In flight: leased, as any process reads the manifest.
			jcs, err := backfill.NewPGManifest("").JobChunks(ctx, s.db, 0)
			if err != nil {
				return err
			}
			inFlight = jcs[0].Chunks
			cancel()
			<-ctx.Done()
			return ctx.Err()
		}
		return s.extractor(1).Extract(ctx, c, w)
	})
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, context.Canceled)
	chunks := rec.check(t, leasedPhases)
	last := chunks[len(chunks)-1]
	require.Equal(t, 3, last.chunk.Seq)
	require.Equal(t, backfilltrace.OutcomeFailed, last.chunkEnd.Outcome)
	require.ErrorIs(t, last.chunkEnd.Err, context.Canceled)
	require.Len(t, rec.runs(), 1)

	require.Equal(t, map[backfill.ChunkStatus]int64{backfill.ChunkDone: 3, backfilltype.ChunkLeased: 1, backfill.ChunkPending: 6}, inFlight)
	// The manifest's view of the run, as metrics read it: the cancelled
	// chunk pending again (its lease released), three done.
	jcs, err := backfill.NewPGManifest("").JobChunks(context.Background(), s.db, 0, "items", "nosuchjob")
	require.NoError(t, err)
	require.Len(t, jcs, 1)
	require.Equal(t, "items", jcs[0].Job)
	require.Equal(t, map[backfill.ChunkStatus]int64{backfill.ChunkDone: 3, backfill.ChunkPending: 7}, jcs[0].Chunks)
	require.Equal(t, backfill.Counts{Read: 300, Inserted: 300}, jcs[0].Counts)
	require.False(t, jcs[0].LastDone.IsZero())
	require.GreaterOrEqual(t, jcs[0].SinceLastDone, time.Duration(0))
}

// levelSignal is a throttle signal whose value a test sets.
type levelSignal struct{ v atomic.Int64 }

func (s *levelSignal) Name() string { return "level" }
func (s *levelSignal) Read(context.Context, sqlx.ExtContext, backfillthrottle.SignalScope) (float64, error) {
	return float64(s.v.Load()), nil
}

// TestTraceThrottleAndPause: a throttle that holds, then releases, comes
// as hold and release events of the run's span with the signal's name and
// the time held; a critical level pauses the run (critical and pause
// events), and the spans of the chunks in flight end.
func TestTraceThrottleAndPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	rec := newRecorder()
	sig := &levelSignal{}
	var released, critical atomic.Bool
	rec.onThrottle = func(d backfilltrace.ThrottleData) {
		if d.Event == backfilltrace.ThrottleCritical {
			critical.Store(true)
		}
		if d.Event == backfilltrace.ThrottleHold {
			go func() {
				time.Sleep(30 * time.Millisecond)
				sig.v.Store(0)
			}()
		}
		if d.Event == backfilltrace.ThrottleRelease {
			released.Store(true)
		}
	}
	r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true, Tracer: rec, ThrottleInterval: 10 * time.Millisecond,
		Throttles: []backfillthrottle.Throttle{{Signal: sig, High: 10, Critical: 100}}})
	require.NoError(t, err)
	job := s.job(1)
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		switch c.Seq {
		case 2:
			// Hold the next claims until a release.
			sig.v.Store(50)
			for !released.Load() && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
		case 6:
			// Critical: the run pauses; this chunk finishes or rolls back.
			sig.v.Store(500)
			for !critical.Load() && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
		}
		return s.extractor(1).Extract(ctx, c, w)
	})
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrRunPaused)
	rec.check(t, leasedPhases)
	runs := rec.runs()
	require.Len(t, runs, 1)
	require.ErrorIs(t, runs[0].runEnd.Err, backfill.ErrRunPaused)
	var got []string
	var held time.Duration
	for _, e := range rec.allEvents() {
		switch {
		case e.throttle != nil:
			require.Equal(t, runs[0].id, e.span, "a throttle event is an event of the run's span")
			require.Equal(t, "level", e.throttle.Signal)
			got = append(got, e.throttle.Event)
			if e.throttle.Event == backfilltrace.ThrottleRelease && held == 0 {
				held = e.throttle.Held
			}
		case e.pause != nil:
			require.Equal(t, runs[0].id, e.span)
			require.Contains(t, e.pause.Reason, "critical")
			got = append(got, "pause:"+e.pause.Source)
		}
	}
	require.Equal(t, []string{backfilltrace.ThrottleHold, backfilltrace.ThrottleRelease, backfilltrace.ThrottleCritical, "pause:" + backfilltrace.PauseThrottle}, got)
	require.Positive(t, held)
}

// TestTraceChunkTracerOnly: a tracer without any of the optional
// interfaces gets one start and one end per chunk.
func TestTraceChunkTracerOnly(t *testing.T) {
	t.Parallel()
	s := newItems(t)
	var started, ended atomic.Int64
	r, err := backfill.New(s.db, &backfill.Config{Tracer: chunkOnly{&started, &ended}})
	require.NoError(t, err)
	_, err = r.Run(context.Background(), s.job(1))
	require.NoError(t, err)
	require.Equal(t, int64(10), started.Load())
	require.Equal(t, int64(10), ended.Load())
}

type chunkOnly struct{ started, ended *atomic.Int64 }

func (c chunkOnly) TraceChunkStart(ctx context.Context, _ backfilltrace.ChunkStartData) context.Context {
	c.started.Add(1)
	return ctx
}
func (c chunkOnly) TraceChunkEnd(_ context.Context, d backfilltrace.ChunkEndData) {
	if d.Err != nil || d.Outcome != backfilltrace.OutcomeDone {
		panic(errors.New("unexpected chunk end"))
	}
	c.ended.Add(1)
}

// TestTraceFakesLeasedPath: on backfilltest's fakes each chunk is leased,
// extracted outside any transaction, then staged, merged and checkpointed
// in one transaction, as on PostgreSQL, and traced with the leased
// path's phases in order.
func TestTraceFakesLeasedPath(t *testing.T) {
	t.Parallel()
	s := newFakeSetup(t)
	rec := newRecorder()
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: s.manifest, Merger: s.merger, Tracer: rec})
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), readingsJob("", nil))
	require.NoError(t, err)
	chunks := rec.check(t, leasedPhases)
	require.Len(t, chunks, 4)
	var sum backfill.Counts
	for _, c := range chunks {
		require.Equal(t, backfilltrace.OutcomeDone, c.chunkEnd.Outcome, c.chunk.ID)
		sum = sum.Add(c.chunkEnd.Counts)
	}
	require.Equal(t, rep.Counts, sum)
}
