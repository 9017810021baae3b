package backfill

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"
)

// pipelineProbe is an extractor and a validator that see, inside chunk
// i's transaction (the validator), whether chunk i+1's extraction began,
// and how many Extract calls ever ran at once.
type pipelineProbe struct {
	mu        sync.Mutex
	started   map[int64]chan struct{}
	inExtract atomic.Int32
	most      atomic.Int32
	// overlapped lists the chunks (by Lo) whose transaction saw the next
	// chunk's extraction begin; validated lists the chunks in the order
	// their transactions validated them.
	overlapped []int64
	validated  []int64
	wait       time.Duration
}

func (p *pipelineProbe) startedCh(lo int64) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started == nil {
		p.started = map[int64]chan struct{}{}
	}
	ch, ok := p.started[lo]
	if !ok {
		ch = make(chan struct{})
		p.started[lo] = ch
	}
	return ch
}

func (p *pipelineProbe) job(inner Extractor, last int64) Job {
	job := liveJob(nil)
	job.Chunker = IntRange(0, last, 10)
	var once sync.Map
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		n := p.inExtract.Add(1)
		defer p.inExtract.Add(-1)
		for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
		}
		if _, dup := once.LoadOrStore(c.Lo, true); !dup {
			close(p.startedCh(c.Lo))
		}
		return inner.Extract(ctx, c, w)
	})
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		lo := s.Chunk.Lo
		seen := false
		if lo+10 < last {
			select {
			case <-p.startedCh(lo + 10):
				seen = true
			case <-time.After(p.wait):
			}
		}
		p.mu.Lock()
		p.validated = append(p.validated, lo)
		if seen {
			p.overlapped = append(p.overlapped, lo)
		}
		p.mu.Unlock()
		return CheckResult{Check: "pipeline_probe", Severity: SeverityError, Passed: true}, nil
	})}
	return job
}

// TestExtractAheadOverlapsTheWrite: extracting ahead (the default) a worker extracts
// its next chunk while its current chunk's transaction runs; its Extract
// calls never overlap, its chunks are written in plan order, and every
// row is accounted for. Without it (the default) no extraction runs
// during a chunk's transaction.
func TestExtractAheadOverlapsTheWrite(t *testing.T) {
	t.Parallel()
	for _, serial := range []bool{false, true} {
		t.Run(fmt.Sprint("serial_", serial), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := liveDB(t)
			p := &pipelineProbe{wait: 20 * time.Second}
			if serial {
				// Nothing can arrive: the wait only gives a wrong overlap
				// the time to show.
				p.wait = 300 * time.Millisecond
			}
			job := p.job(liveJob(nil).Extractor, 50)
			r := liveRunner(t, db, "w1", nil)
			r.cfg.SerialExtract = serial
			rep, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, int64(50), rep.Counts.Read)
			require.Equal(t, int64(50), rep.Counts.Inserted)
			require.Equal(t, int32(1), p.most.Load(), "Extract calls of one worker overlapped")
			require.Equal(t, []int64{0, 10, 20, 30, 40}, p.validated, "chunks written out of plan order")
			if serial {
				require.Empty(t, p.overlapped, "an extraction ran during a chunk's transaction with SerialExtract")
			} else {
				require.Equal(t, []int64{0, 10, 20, 30}, p.overlapped, "the next chunk was not extracted while a chunk's transaction ran")
			}
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
			require.Equal(t, 50, n)
			require.Equal(t, map[string]int{"done": 5}, chunkStatuses(t, db))
		})
	}
}

// TestExtractAheadAtConcurrencyTwo: two workers, each with a chunk
// ahead: at most two Extract calls at once, every chunk once.
func TestExtractAheadAtConcurrencyTwo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	p := &pipelineProbe{wait: 50 * time.Millisecond}
	job := p.job(liveJob(nil).Extractor, 200)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.Concurrency = 2
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(200), rep.Counts.Read)
	require.Equal(t, int64(200), rep.Counts.Inserted)
	require.LessOrEqual(t, p.most.Load(), int32(2))
	require.Len(t, p.validated, 20)
	require.Equal(t, map[string]int{"done": 20}, chunkStatuses(t, db))
}

// TestExtractAheadPausedWhileAChunkWaits: a pause committed while a chunk
// extracted ahead waits for its worker's transaction. A pause lets the
// chunks in flight (leased) finish, the chunk ahead with them: it is
// written once, no lease is left, and a resume loads the rest.
func TestExtractAheadPausedWhileAChunkWaits(t *testing.T) {
	t.Parallel()
	testExtractAheadStopped(t, false)
}

// TestExtractAheadGateFailsWhileAChunkWaits: a chunk's quality gate fails
// (the run pauses) while the next chunk, extracted ahead, waits: the chunk
// ahead is not written, its lease is released, and a resume loads every
// row once.
func TestExtractAheadGateFailsWhileAChunkWaits(t *testing.T) {
	t.Parallel()
	testExtractAheadStopped(t, true)
}

func testExtractAheadStopped(t *testing.T, gate bool) {
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ReturnOnPause = true
	extracted1 := make(chan struct{})
	var once sync.Once
	job := liveJob(nil)
	job.Chunker = IntRange(0, 40, 10)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		err := inner.Extract(ctx, c, w)
		if c.Lo == 10 {
			once.Do(func() { close(extracted1) })
		}
		return err
	})
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		if s.Chunk.Lo != 0 {
			return CheckResult{Check: "probe", Severity: SeverityError, Passed: true}, nil
		}
		// Chunk 10 is extracted and waits for this transaction.
		select {
		case <-extracted1:
		case <-time.After(20 * time.Second):
			return CheckResult{}, fmt.Errorf("chunk 10 was not extracted ahead")
		}
		if gate {
			return CheckResult{Check: "probe", Severity: SeverityError, Passed: false, Expected: "pass", Actual: "fail"}, nil
		}
		var batch int64
		if err := db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`); err != nil {
			return CheckResult{}, err
		}
		if err := r.Pause(ctx, batch, "ann", "while a chunk waits"); err != nil {
			return CheckResult{}, err
		}
		return CheckResult{Check: "probe", Severity: SeverityError, Passed: true}, nil
	})}
	_, err := r.Run(ctx, job)
	if gate {
		require.ErrorIs(t, err, ErrGateFailed)
		require.Equal(t, map[string]int{"pending": 4}, chunkStatuses(t, db))
	} else {
		require.ErrorIs(t, err, ErrRunPaused)
		require.Equal(t, map[string]int{"done": 2, "pending": 2}, chunkStatuses(t, db))
	}
	var leased int
	require.NoError(t, db.Get(&leased, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
	require.Zero(t, leased, "a chunk extracted ahead kept its lease")

	job.Validators = nil
	rep, err := r.Resume(ctx, job, "ann", "go on")
	require.NoError(t, err)
	require.Equal(t, int64(40), rep.Counts.Read)
	require.Equal(t, int64(40), rep.Counts.Inserted)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 40, n)
	require.Equal(t, map[string]int{"done": 4}, chunkStatuses(t, db))
}

func init() {
	// BACKFILL_TEST_SERIAL_EXTRACT=1 go test .: every test's runs extract
	// serially (tests of the pipeline itself then fail).
	testSerialExtract = os.Getenv("BACKFILL_TEST_SERIAL_EXTRACT") != ""
}

// TestAheadRetryBackoffHonoured: chunk 0's first attempt fails with a
// retryable error (40001) inside its transaction; RetryBackoff is 2 s.
// The second attempt starts >= 2 s after the first failed, with and
// with SerialExtract and without (extracting ahead, the slot's other goroutine once leased
// chunk 0 again at once).
func TestAheadRetryBackoffHonoured(t *testing.T) {
	t.Parallel()
	for _, ahead := range []bool{false, true} {
		t.Run(fmt.Sprint("ahead_", ahead), func(t *testing.T) {
			t.Parallel()
			db := liveDB(t)
			r := liveRunner(t, db, "w1", nil)
			r.cfg.SerialExtract = !ahead
			r.cfg.RetryBackoff = 2 * time.Second
			var mu sync.Mutex
			var failedAt time.Time
			var extracts []time.Time // of chunk 0
			job := liveJob(nil)
			job.Chunker = IntRange(0, 40, 10)
			inner := job.Extractor
			job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
				if c.Lo == 0 {
					mu.Lock()
					extracts = append(extracts, time.Now())
					mu.Unlock()
				}
				return inner.Extract(ctx, c, w)
			})
			job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
				mu.Lock()
				defer mu.Unlock()
				if s.Chunk.Lo == 0 && failedAt.IsZero() {
					failedAt = time.Now()
					return CheckResult{}, &pq.Error{Code: "23505", Message: "simulated unique violation"}
				}
				return CheckResult{Check: "ok", Severity: SeverityError, Passed: true}, nil
			})}
			rep, err := r.Run(context.Background(), job)
			require.NoError(t, err)
			require.Equal(t, int64(40), rep.Counts.Read)
			require.Len(t, extracts, 2)
			gap := extracts[1].Sub(failedAt)
			t.Logf("ahead=%v: retry began %v after the failure", ahead, gap)
			require.GreaterOrEqual(t, gap, 1900*time.Millisecond, "RetryBackoff not honoured")
		})
	}
}

// phaseRec records phase durations per chunk Lo.
type phaseRec struct {
	mu  sync.Mutex
	d   map[string]time.Duration
	out []string
}

func (p *phaseRec) TraceChunkStart(ctx context.Context, d backfilltrace.ChunkStartData) context.Context {
	return ctx
}
func (p *phaseRec) TraceChunkEnd(ctx context.Context, d backfilltrace.ChunkEndData) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out = append(p.out, fmt.Sprintf("%d:%s", d.Chunk.Lo, d.Outcome))
}
func (p *phaseRec) TracePhaseStart(ctx context.Context, d backfilltrace.PhaseStartData) context.Context {
	return ctx
}
func (p *phaseRec) TracePhaseEnd(ctx context.Context, d backfilltrace.PhaseEndData) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.d == nil {
		p.d = map[string]time.Duration{}
	}
	p.d[fmt.Sprintf("%d/%s", d.Chunk.Lo, d.Phase)] += d.Duration
}

// TestAheadTraceExtractPhaseExcludesTheWait: chunk 0's validator takes
// 1.5 s; chunk 1 is extracted ahead in a few ms and then waits for the
// write stage. Its PhaseExtract span should be its extraction only, the
// wait its PhaseQueued span.
func TestAheadTraceExtractPhaseExcludesTheWait(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	tr := &phaseRec{}
	r := liveRunner(t, db, "w1", nil)
	r.cfg.Tracer = tr
	r.tracers = resolveTracers(tr)
	job := liveJob(nil)
	job.Chunker = IntRange(0, 20, 10)
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		if s.Chunk.Lo == 0 {
			time.Sleep(1500 * time.Millisecond)
		}
		return CheckResult{Check: "ok", Severity: SeverityError, Passed: true}, nil
	})}
	_, err := r.Run(context.Background(), job)
	require.NoError(t, err)
	t.Logf("phases: %v", tr.d)
	// Relative, not a bound in ms (a loaded machine slows the extraction
	// too): chunk 1's wait behind chunk 0's 1.5 s validator is its queued
	// phase, longer than its extraction of 10 rows; counted as extraction,
	// it would leave the queued phase near zero.
	require.Less(t, tr.d["10/extract"], tr.d["10/queued"], "the wait for the write stage is reported as extraction")
}

// TestAheadThrottleHoldsWhileAChunkWaits: chunk 0's transaction raises a
// throttle signal and lasts long enough for the monitor to see it; chunk
// 1, extracted ahead, must not be written while the throttle holds; its
// lease is released and it is extracted again later, every row once.
func TestAheadThrottleHoldsWhileAChunkWaits(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	db.MustExec(`CREATE TABLE pressure (v int NOT NULL); INSERT INTO pressure VALUES (0)`)
	tr := &phaseRec{}
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ThrottleInterval = 50 * time.Millisecond
	r.cfg.Throttles = []backfillthrottle.Throttle{{Signal: backfillthrottle.SQLSignal("pressure", `SELECT v FROM pressure`), High: 80, Low: 50}}
	r.cfg.Tracer = tr
	r.tracers = resolveTracers(tr)
	var mu sync.Mutex
	extracts := map[int64]int{}
	var wroteWhileHeld []int64
	job := liveJob(nil)
	job.Chunker = IntRange(0, 40, 10)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		mu.Lock()
		extracts[c.Lo]++
		mu.Unlock()
		return inner.Extract(ctx, c, w)
	})
	var lowered time.Time
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		if s.Chunk.Lo == 0 {
			db.MustExec(`UPDATE pressure SET v = 200`)
			time.Sleep(400 * time.Millisecond)
			go func() {
				time.Sleep(time.Second)
				mu.Lock()
				lowered = time.Now()
				mu.Unlock()
				db.MustExec(`UPDATE pressure SET v = 0`)
			}()
		} else {
			mu.Lock()
			if lowered.IsZero() {
				wroteWhileHeld = append(wroteWhileHeld, s.Chunk.Lo)
			}
			mu.Unlock()
		}
		return CheckResult{Check: "ok", Severity: SeverityError, Passed: true}, nil
	})}
	rep, err := r.Run(context.Background(), job)
	require.NoError(t, err)
	t.Logf("extracts %v outcomes %v", extracts, tr.out)
	require.Equal(t, Counts{Read: 40, Inserted: 40}, rep.Counts)
	require.Empty(t, wroteWhileHeld, "chunk written while the throttle held")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
	require.Zero(t, n)
}

// TestShutdownDuringRejectRateCheckLeavesTheRunRunning: the caller's
// context ends (a graceful shutdown) while the run reject-rate check
// after chunk 0 waits (here on a lock of the manifest's chunks table,
// as a slow or unreachable server would make it wait). The call should
// stop as any cancelled call does, leaving the run running (resumable
// by Run); the check's error was once taken for the run gate and the run
// recorded as failed.
func TestShutdownDuringRejectRateCheckLeavesTheRunRunning(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	locker, err := db.Beginx()
	require.NoError(t, err)
	defer locker.Rollback()
	r.cfg.Hooks = HooksFunc(func(_ context.Context, batchID int64, res ChunkResult) {
		if res.Chunk.Lo != 0 {
			return
		}
		_, err := locker.Exec(`LOCK TABLE backfill.chunks IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		// waiting polls (for at most testwait.Timeout) until whether a
		// session waits for a lock on the manifest's chunks is want.
		waiting := func(want bool) {
			for deadline := time.Now().Add(testwait.Timeout); time.Now().Before(deadline); time.Sleep(testwait.Poll) {
				var w bool
				if db.Get(&w, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND relation = 'backfill.chunks'::regclass
					AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`) == nil && w == want {
					return
				}
			}
		}
		go func() {
			waiting(true) // the check waits behind the locker
			cancel()      // SIGTERM: the service shuts down
			waiting(false)
			_ = locker.Rollback()
		}()
	})
	job := liveJob(nil)
	job.Chunker = IntRange(0, 40, 10)
	_, err = r.Run(ctx, job)
	t.Logf("err: %v", err)
	var st, msg string
	require.NoError(t, db.QueryRow(`SELECT status, coalesce(last_error, '') FROM backfill.runs WHERE job_name = 'live'`).Scan(&st, &msg))
	t.Logf("run %s: %s", st, msg)
	rep, err := r.Run(context.Background(), job)
	t.Logf("next Run: status %s, chunks run %d, err %v", rep.Status, rep.ChunksRun, err)
	require.Equal(t, "running", st, "a shutdown during the reject-rate check failed the run")
}

// TestAheadRunRejectRatePausesBeforeTheChunkAhead: chunk 0 rejects half
// its rows (run gate 10%); chunk 1 is extracted ahead meanwhile. The gate
// pauses the run after chunk 0: chunk 1 not written, lease released;
// a resume (operator accepts) loads the rest, each row once.
func TestAheadRunRejectRatePausesBeforeTheChunkAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ReturnOnPause = true
	r.cfg.Concurrency = 1
	ahead := make(chan struct{})
	var once sync.Once
	job := liveJob(nil)
	job.Chunker = IntRange(0, 40, 10)
	job.MaxRunRejectRate = 0.1
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		for id := c.Lo; id < c.Hi; id++ {
			var err error
			if c.Lo == 0 && id%2 == 0 {
				err = w.Reject(ctx, map[string]any{"id": id}, "v", "bad")
			} else {
				err = w.Write(ctx, id, fmt.Sprint("v", id))
			}
			if err != nil {
				return err
			}
		}
		if c.Lo == 10 {
			once.Do(func() { close(ahead) })
		}
		return nil
	})
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		if s.Chunk.Lo == 0 {
			select {
			case <-ahead:
			case <-time.After(10 * time.Second):
			}
		}
		return CheckResult{Check: "ok", Severity: SeverityError, Passed: true}, nil
	})}
	_, err := r.Run(ctx, job)
	require.ErrorIs(t, err, ErrGateFailed)
	require.Equal(t, map[string]int{"done": 1, "pending": 3}, chunkStatuses(t, db))
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
	require.Zero(t, n)
	rep, err := r.Resume(ctx, job, "ann", "rejects are fine")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, Counts{Read: 40, Inserted: 35, Rejected: 5}, rep.Counts)
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 35, n)
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated`))
	require.Zero(t, n)
}

// TestAheadPauseCancelResumeStorm: Concurrency 2, extracting ahead; an
// operator pauses or cancels (SQL) at random moments and resumes, until
// the run completes: every row written once (audit trigger), no lease
// left, every chunk balanced.
func TestAheadPauseCancelResumeStorm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	db.MustExec(`CREATE TABLE audit (id bigint, op text);
		CREATE FUNCTION audit_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO audit VALUES (NEW.id, TG_OP); RETURN NULL; END $$;
		CREATE TRIGGER audit_t AFTER INSERT OR UPDATE ON live FOR EACH ROW EXECUTE FUNCTION audit_f();`)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.Concurrency = 2
	r.cfg.ThrottleInterval = 10 * time.Millisecond
	r.cfg.ReturnOnPause = true // each call ends on the storm's pause
	job := liveJob(nil)
	job.Chunker = IntRange(0, 600, 10)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		time.Sleep(time.Duration(c.Lo%7) * 3 * time.Millisecond)
		return inner.Extract(ctx, c, w)
	})
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		time.Sleep(time.Duration(s.Chunk.Lo%5) * 4 * time.Millisecond)
		return CheckResult{Check: "ok", Severity: SeverityError, Passed: true}, nil
	})}
	var rep Report
	var err error
	for round := 0; ; round++ {
		// The storm lasts stormRounds calls; the call after it has no
		// pause to meet and must complete. (On a loaded machine a call
		// may end by its pause before any chunk commits, so the rounds
		// are not a measure of progress.)
		const stormRounds = 40
		require.LessOrEqual(t, round, stormRounds)
		stop := make(chan struct{})
		go func(round int) {
			if round == stormRounds {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+(round*37)%90) * time.Millisecond):
			}
			fn := "pause"
			if round%3 == 2 {
				fn = "cancel"
			}
			for {
				_, err := db.Exec(`SELECT backfill.` + fn + `('live', 'ann', 'storm')`)
				if err == nil {
					return
				}
				select {
				case <-stop:
					t.Logf("round %d %s: %v", round, fn, err)
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}(round)
		if round == 0 {
			rep, err = r.Run(ctx, job)
		} else {
			rep, err = r.Resume(ctx, job, "ann", "go on")
		}
		close(stop)
		if err == nil && rep.Status == RunCompleted {
			t.Logf("completed after %d rounds", round+1)
			break
		}
		var st string
		require.NoError(t, db.Get(&st, `SELECT status FROM backfill.runs WHERE job_name = 'live'`))
		var leased int
		require.NoError(t, db.Get(&leased, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
		require.Zero(t, leased, "round %d (%s, err %v): leases left", round, st, err)
		if st == "running" && err != nil {
			t.Logf("round %d: running, err %v", round, err)
		}
		// A pause that landed after the call ended: the next Resume
		// finds it paused, or running; both are fine.
	}
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 600, n)
	var dup int
	require.NoError(t, db.Get(&dup, `SELECT count(*) FROM (SELECT id FROM audit GROUP BY id HAVING count(*) > 1) d`))
	require.Zero(t, dup, "a row written twice")
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM audit WHERE op <> 'INSERT'`))
	require.Zero(t, n)
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE rows_read <> 10 OR rows_inserted <> 10 OR status <> 'done'`))
	require.Zero(t, n)
}

// TestAheadTwoRunnersRandomFailures: two Runners (worker IDs w1, w2),
// Concurrency 3 each, extracting ahead, random retryable failures in the
// extraction and in the transaction; every row inserted once.
func TestAheadTwoRunnersRandomFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	db.SetMaxOpenConns(40)
	db.MustExec(`CREATE TABLE audit (id bigint, op text);
		CREATE FUNCTION audit_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO audit VALUES (NEW.id, TG_OP); RETURN NULL; END $$;
		CREATE TRIGGER audit_t AFTER INSERT OR UPDATE ON live FOR EACH ROW EXECUTE FUNCTION audit_f();`)
	var mu sync.Mutex
	seed := uint64(12345)
	rnd := func(n uint64) uint64 {
		mu.Lock()
		defer mu.Unlock()
		seed = seed*6364136223846793005 + 1442695040888963407
		return (seed >> 33) % n
	}
	job := liveJob(nil)
	job.Chunker = IntRange(0, 1000, 10)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		time.Sleep(time.Duration(rnd(5)) * time.Millisecond)
		if rnd(10) == 0 {
			return &pq.Error{Code: "23505", Message: "flaky source"}
		}
		return inner.Extract(ctx, c, w)
	})
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		time.Sleep(time.Duration(rnd(5)) * time.Millisecond)
		if rnd(10) == 0 {
			return CheckResult{}, &pq.Error{Code: "23505", Message: "flaky target"}
		}
		return CheckResult{Check: "ok", Severity: SeverityError, Passed: true}, nil
	})}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := liveRunner(t, db, fmt.Sprint("w", i+1), nil)
			r.cfg.Concurrency, r.cfg.MaxAttempts, r.cfg.RetryBackoff = 3, 20, time.Millisecond
			_, errs[i] = r.Run(ctx, job)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, ErrAlreadyCompleted, "runner %d", i)
		}
	}
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 1000, n)
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM audit`))
	require.Equal(t, 1000, n, "rows written more than once")
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE rows_read <> 10 OR rows_inserted <> 10 OR status <> 'done' OR lease_key IS NOT NULL`))
	require.Zero(t, n)
}

// TestAheadThrottleDuringAnExtractionThatWaitedForNothing: a throttle
// begins to hold while chunk 0 is extracted (nothing written before it:
// it never waits for the write stage). The chunk is written once
// extracted, with and with SerialExtract and without (extracting ahead, the extraction was
// once thrown away and the chunk read again from the source).
func TestAheadThrottleDuringAnExtractionThatWaitedForNothing(t *testing.T) {
	t.Parallel()
	for _, ahead := range []bool{false, true} {
		t.Run(fmt.Sprint("ahead_", ahead), func(t *testing.T) {
			t.Parallel()
			db := liveDB(t)
			db.MustExec(`CREATE TABLE pressure (v int NOT NULL); INSERT INTO pressure VALUES (0)`)
			r := liveRunner(t, db, "w1", nil)
			r.cfg.SerialExtract = !ahead
			r.cfg.ThrottleInterval = 50 * time.Millisecond
			r.cfg.Throttles = []backfillthrottle.Throttle{{Signal: backfillthrottle.SQLSignal("pressure", `SELECT v FROM pressure`), High: 80, Low: 50}}
			var mu sync.Mutex
			extracts := map[int64]int{}
			job := liveJob(nil)
			job.Chunker = IntRange(0, 20, 10)
			inner := job.Extractor
			job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
				mu.Lock()
				extracts[c.Lo]++
				first := c.Lo == 0 && extracts[c.Lo] == 1
				mu.Unlock()
				if first {
					db.MustExec(`UPDATE pressure SET v = 200`)
					time.Sleep(400 * time.Millisecond) // a long read of the source
					go func() { time.Sleep(500 * time.Millisecond); db.MustExec(`UPDATE pressure SET v = 0`) }()
				}
				return inner.Extract(ctx, c, w)
			})
			rep, err := r.Run(context.Background(), job)
			require.NoError(t, err)
			require.Equal(t, Counts{Read: 20, Inserted: 20}, rep.Counts)
			require.Equal(t, 1, extracts[0], "chunk 0 extracted again: its first extraction was thrown away")
		})
	}
}

// Baseline for TestShutdownDuringRejectRateCheckLeavesTheRunRunning: the
// same shutdown during an extraction leaves the run running.
func TestAheadShutdownDuringExtractionLeavesTheRunRunning(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job := liveJob(func(c Chunk) {
		if c.Lo == 10 {
			cancel()
		}
	})
	job.Chunker = IntRange(0, 40, 10)
	_, err := r.Run(ctx, job)
	t.Logf("err: %v", err)
	var st string
	require.NoError(t, db.Get(&st, `SELECT status FROM backfill.runs WHERE job_name = 'live'`))
	require.Equal(t, "running", st)
}
