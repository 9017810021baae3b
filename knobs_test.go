package backfill

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/internal/hysteresis"
)

// TestControlJobConcurrencyKnobLimitsExtractions: a run whose
// job_concurrency knob is 1 extracts one chunk at a time, although
// Config.Concurrency is 4, whether or not the process was started with a
// Config.JobConcurrency (the knob replaces it).
func TestControlJobConcurrencyKnobLimitsExtractions(t *testing.T) {
	t.Parallel()
	for _, jc := range []int{0, 4} {
		t.Run(fmt.Sprint("config_job_concurrency_", jc), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := liveDB(t)
			r := liveRunner(t, db, "w1", nil)
			var batch int64
			_, err := r.Run(ctx, liveJob(func(c Chunk) {
				if c.Seq == 0 {
					require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
					require.NoError(t, r.Pause(ctx, batch, "ann", "tune first"))
				}
			}))
			require.ErrorIs(t, err, ErrRunPaused)
			require.NoError(t, r.SetKnob(ctx, batch, "job_concurrency", "1", "ann", "one at a time"))
			r.cfg.Concurrency, r.cfg.JobConcurrency = 4, jc
			var inFlight, most, calls atomic.Int32
			rep, err := r.Resume(ctx, liveJob(func(Chunk) {
				calls.Add(1)
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(20 * time.Millisecond) // the extraction's work
				inFlight.Add(-1)
			}), "ann", "go")
			require.NoError(t, err)
			require.Equal(t, RunCompleted, rep.Status)
			require.Greater(t, calls.Load(), int32(1))
			require.Equal(t, int32(1), most.Load(), "extractions at once with job_concurrency 1")
		})
	}
}

// TestSetKnobRefusesThrottlePairsTheWorkersWouldIgnore: set_knob, through
// SQL or the Runner, refuses a throttle watermark knob that would leave
// the throttle's low watermark above its high one, or both zero, whether
// the other side is a knob or the High and Low a worker of the run was
// configured with; the error names both knobs and both values, and the
// knobs stay as they were.
func TestSetKnobRefusesThrottlePairsTheWorkersWouldIgnore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.Throttles = []backfillthrottle.Throttle{{Signal: constSignal{"lag"}, High: 10, Low: 5}}
	var batch int64
	_, err := r.Run(ctx, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
			require.NoError(t, r.Pause(ctx, batch, "ann", "tune"))
		}
	}))
	require.ErrorIs(t, err, ErrRunPaused)
	knobs := func() map[string]float64 {
		st, err := r.caps.control.Control(ctx, r.db, batch)
		require.NoError(t, err)
		return st.Knobs
	}
	refused := func(key, value string, mention ...string) {
		t.Helper()
		before := knobs()
		err := r.SetKnob(ctx, batch, key, value, "ann", "tune")
		require.ErrorIs(t, err, ErrInvalidConfig, "%s=%s", key, value)
		for _, m := range mention {
			require.Contains(t, err.Error(), m)
		}
		_, err = db.Exec(`SELECT backfill.set_knob($1::bigint, $2, $3, 'ann', 'tune')`, batch, key, value)
		var pe *pq.Error
		require.ErrorAs(t, err, &pe, "%s=%s through SQL", key, value)
		require.Equal(t, "22023", string(pe.Code))
		for _, m := range mention {
			require.Contains(t, pe.Message, m)
		}
		require.Equal(t, before, knobs(), "a refused knob changes nothing")
	}
	set := func(key, value string) {
		t.Helper()
		require.NoError(t, r.SetKnob(ctx, batch, key, value, "ann", "tune"), "%s=%s", key, value)
	}

	// Against the configured watermarks (High 10, Low 5).
	refused("throttle.lag.low", "20", "throttle.lag.low 20 (this knob)", "throttle.lag.high 10 (the High configured by worker 'w1')")
	refused("throttle.lag.high", "3", "throttle.lag.low 5 (the Low configured by worker 'w1')", "throttle.lag.high 3 (this knob)")
	// Against the other knob.
	set("throttle.lag.high", "30")
	set("throttle.lag.low", "20")
	refused("throttle.lag.high", "15", "throttle.lag.low 20 (its knob)", "throttle.lag.high 15 (this knob)")
	// Dropping a knob: back to the configured High 10, below the low knob.
	refused("throttle.lag.high", "default", "throttle.lag.low 20 (its knob)", "throttle.lag.high 10 (the High configured by worker 'w1')")
	set("throttle.lag.low", "default")
	set("throttle.lag.high", "default")
	// Both zero.
	set("throttle.lag.low", "0")
	refused("throttle.lag.high", "0", "throttle.lag.high 0 (this knob)", "throttle.lag.low 0 (its knob)")
	// A signal no worker configured: the knobs alone.
	set("throttle.other.low", "5")
	refused("throttle.other.high", "4", "throttle.other.low 5 (its knob)", "throttle.other.high 4 (this knob)")
	set("throttle.other.high", "5")
	require.Equal(t, map[string]float64{"throttle.lag.low": 0, "throttle.other.low": 5, "throttle.other.high": 5}, knobs())
}

// errSignal reads value, or fails while broken.
type errSignal struct {
	broken bool
	value  float64
}

func (s *errSignal) Name() string { return "flaky" }
func (s *errSignal) Read(context.Context, sqlx.ExtContext, backfillthrottle.SignalScope) (float64, error) {
	if s.broken {
		return 0, errors.New("permission denied for view pg_stat_replication")
	}
	return s.value, nil
}

// TestSignalReadFailuresAsDocumented: what backfillthrottle.Signal.Read's
// documentation says of failed readings after the first: the first
// failures in a row below hysteresis.UnreadableAfter are skipped (the
// throttle keeps its state, held or not), from the UnreadableAfter-th on
// the throttle holds (fails closed, not critical), and the first
// successful reading below Low releases it.
func TestSignalReadFailuresAsDocumented(t *testing.T) {
	t.Parallel()
	require.Equal(t, 3, hysteresis.UnreadableAfter, "Signal.Read's documentation names the third failed reading in a row")
	ctx := context.Background()
	sig := &errSignal{}
	r := &Runner{cfg: Config{Throttles: []backfillthrottle.Throttle{{Signal: sig, High: 10, Low: 5, Critical: 20}}}}
	ex := &execution{r: r, log: discardLogger(), job: Job{Name: "j"}}
	th := newThrottler(ex)
	ex.throttle = th
	th.check(ctx)
	require.False(t, th.holding())

	// Not held: two failures keep it released, the third holds.
	sig.broken = true
	for i := 1; i < hysteresis.UnreadableAfter; i++ {
		th.check(ctx)
		require.False(t, th.holding(), "failed reading %d in a row", i)
	}
	th.check(ctx)
	require.True(t, th.holding(), "failed reading %d in a row", hysteresis.UnreadableAfter)
	require.False(t, ex.stopped(), "an unreadable signal is never critical")
	th.check(ctx)
	require.True(t, th.holding(), "held while it cannot be read")
	sig.broken, sig.value = false, 1
	th.check(ctx)
	require.False(t, th.holding(), "the first reading below Low releases it")

	// Held by a high reading: two failures keep it held, and a success
	// between failures starts the count again.
	sig.value = 12
	th.check(ctx)
	require.True(t, th.holding())
	sig.broken = true
	for i := 1; i < hysteresis.UnreadableAfter; i++ {
		th.check(ctx)
		require.True(t, th.holding(), "held, failed reading %d in a row", i)
	}
	sig.broken, sig.value = false, 1
	th.check(ctx)
	require.False(t, th.holding())
	sig.broken = true
	for i := 1; i < hysteresis.UnreadableAfter; i++ {
		th.check(ctx)
		require.False(t, th.holding(), "failed reading %d in a row after a success", i)
	}
}
