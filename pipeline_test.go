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

// TestExtractAheadOverlapsTheWrite: with ExtractAhead a worker extracts
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
			r.cfg.ExtractAhead = !serial
			rep, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, int64(50), rep.Counts.Read)
			require.Equal(t, int64(50), rep.Counts.Inserted)
			require.Equal(t, int32(1), p.most.Load(), "Extract calls of one worker overlapped")
			require.Equal(t, []int64{0, 10, 20, 30, 40}, p.validated, "chunks written out of plan order")
			if serial {
				require.Empty(t, p.overlapped, "an extraction ran during a chunk's transaction without ExtractAhead")
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
	r.cfg.ExtractAhead = true
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
	r.cfg.ExtractAhead = true
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
	// BACKFILL_TEST_EXTRACT_AHEAD=1 go test .: every test's runs extract
	// ahead (tests that count extractions or in-flight chunks at
	// Concurrency 1 then see the pipeline's extra chunk).
	testExtractAhead = os.Getenv("BACKFILL_TEST_EXTRACT_AHEAD") != ""
}
