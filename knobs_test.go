package backfill

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
