package backfill

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNoTransactionWhileExtracting: while every extractor of a run
// (Concurrency 2) sleeps, no session of the library is in a transaction
// (pg_stat_activity.xact_start), heartbeats and the monitor's momentary
// reads aside (the run's control state and live workers, read every
// ThrottleInterval in a transaction of one statement): the chunk's
// transaction begins after its extraction (short transactions,
// backfill_shorttx.go). It also logs the oldest transaction age of the
// library's sessions seen in any sample, against the extractor's sleep
// (BACKFILL_SHORTTX_SLEEP, e.g. 10s, for the measurement of issue 13).
// The same holds with a job-wide concurrency cap (Config.JobConcurrency),
// which counts leases rather than holding a slot row lock.
func TestNoTransactionWhileExtracting(t *testing.T) {
	t.Parallel()
	for _, jc := range []int{0, 2} {
		t.Run(fmt.Sprint("job_concurrency_", jc), func(t *testing.T) {
			t.Parallel()
			testNoTransactionWhileExtracting(t, jc)
		})
	}
}

func testNoTransactionWhileExtracting(t *testing.T, jobConcurrency int) {
	ctx := context.Background()
	db := liveDB(t)
	sleep := 500 * time.Millisecond
	if s := os.Getenv("BACKFILL_SHORTTX_SLEEP"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err)
		sleep = d
	}
	var sleeping, starts atomic.Int64
	job := liveJob(nil)
	job.Chunker = IntRange(0, 40, 10)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		starts.Add(1)
		sleeping.Add(1)
		time.Sleep(sleep)
		sleeping.Add(-1)
		return inner.Extract(ctx, c, w)
	})
	r := liveRunner(t, db, "sleeper", nil)
	r.cfg.Concurrency = 2
	r.cfg.JobConcurrency = jobConcurrency
	r.cfg.HeartbeatInterval, r.cfg.StaleAfter = 10*time.Second, time.Minute

	poll, err := db.Connx(ctx)
	require.NoError(t, err)
	defer poll.Close()
	done := goRun(ctx, r, job)
	var res runResult
	samples, inTx := 0, 0
	var oldest time.Duration
	var seen []string
	for finished := false; !finished; {
		select {
		case res = <-done:
			finished = true
			continue
		case <-time.After(20 * time.Millisecond):
		}
		before, gen := sleeping.Load(), starts.Load()
		var rows []struct {
			Query string  `db:"query"`
			Age   float64 `db:"age"`
		}
		require.NoError(t, poll.SelectContext(ctx, &rows, `SELECT query, extract(epoch FROM now() - xact_start)::float8 AS age FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
				AND xact_start IS NOT NULL AND query NOT LIKE '%heartbeat_at = now()%'
				AND query NOT LIKE '%.knobs k WHERE k.batch_id = r.batch_id%' AND query NOT LIKE 'SELECT worker_key FROM %.workers%'`))
		for _, row := range rows {
			oldest = max(oldest, time.Duration(row.Age*float64(time.Second)))
		}
		// The monitor's momentary reads (control state, live workers,
		// heartbeats) are set aside by their text above, and, caught at
		// their BEGIN, by their age: a transaction held across an
		// extractor's sleep is seen older than that by the next samples.
		rows = slices.DeleteFunc(rows, func(r struct {
			Query string  `db:"query"`
			Age   float64 `db:"age"`
		}) bool {
			return r.Age < 0.1
		})
		if before == 2 && sleeping.Load() == 2 && starts.Load() == gen {
			// Both extractors slept through the sample.
			samples++
			if len(rows) > 0 {
				if inTx < 3 {
					seen = append(seen, fmt.Sprintf("%q (%.3fs)", rows[0].Query, rows[0].Age))
				}
				inTx++
			}
		}
	}
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
	require.Equal(t, int64(40), res.rep.Counts.Inserted)
	require.Positive(t, samples, "no sample was taken while both extractors slept")
	require.Zero(t, inTx, "sessions of the library in a transaction while every extractor slept, e.g. %v", seen)
	t.Logf("extractor sleep %v per chunk: oldest xact_start age of the library's sessions in any sample: %v (%d samples while both slept)", sleep, oldest, samples)
}
