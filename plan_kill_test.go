package backfill_test

import (
	"context"
	"errors"
	"iter"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// planKillChunks is the number of chunks of the plan TestKillDashNineWhilePlanning
// kills the planning of.
const planKillChunks = 50_000

// stallingStream is IntRange(0, planKillChunks, 1) whose chunks stop
// coming, for a minute, after stallAt chunks of its stallOn-th ChunkSeq
// (0: never).
type stallingStream struct {
	backfill.ChunkStreamer
	stallOn, stallAt int32
	calls            atomic.Int32
}

func newStallingStream(stallOn, stallAt int32) *stallingStream {
	return &stallingStream{ChunkStreamer: backfill.IntRange(0, planKillChunks, 1).(backfill.ChunkStreamer), stallOn: stallOn, stallAt: stallAt}
}

func (s *stallingStream) ChunkSeq(ctx context.Context) iter.Seq2[backfill.Chunk, error] {
	call := s.calls.Add(1)
	return func(yield func(backfill.Chunk, error) bool) {
		for c, err := range s.ChunkStreamer.ChunkSeq(ctx) {
			if call == s.stallOn && int32(c.Seq) == s.stallAt {
				time.Sleep(time.Minute)
			}
			if !yield(c, err) {
				return
			}
		}
	}
}

func planKillJob(ch backfill.Chunker, ex backfill.Extractor) backfill.Job {
	return backfill.Job{Name: "plan_kill", Chunker: ch, Rollback: backfill.RollbackNone, Extractor: ex,
		Target: backfill.Target{Table: "plan_kill", Key: []string{"id"}}}
}

func init() {
	// The child process of TestKillDashNineWhilePlanning: plan the job;
	// the chunks stop coming part way through the insert of its chunk
	// rows (the Runner's third pass: checks, fingerprint, insert), and
	// the parent kills it.
	childProcess("BACKFILL_PLAN_KILL_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, nil)
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), planKillJob(newStallingStream(3, 30_000),
			backfill.ExtractorFunc(func(context.Context, backfill.Chunk, backfill.RowWriter) error { return nil })))
		return err
	})
}

// TestKillDashNineWhilePlanning: a process killed (SIGKILL) while it
// inserts a long plan's chunk rows, 30,000 of 50,000 sent, leaves no run
// and no chunk row: the chunks are inserted in the transaction that
// creates the run. The same job then plans whole.
func TestKillDashNineWhilePlanning(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE plan_kill (id bigint PRIMARY KEY)`)
	require.NoError(t, backfill.NewPGManifest("").Migrate(ctx, db))
	// The child's COPY of the chunk rows has processed 20,000 rows (it
	// stalls at 30,000; lib/pq sends rows in 64 KiB messages).
	killChildWhen(t, db, "BACKFILL_PLAN_KILL_CHILD", url,
		`SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy WHERE relid = 'backfill.chunks'::regclass`, 20_000)
	var runs, chunks int
	require.NoError(t, db.QueryRow(`SELECT (SELECT count(*) FROM backfill.runs), (SELECT count(*) FROM backfill.chunks)`).Scan(&runs, &chunks))
	require.Equal(t, [2]int{0, 0}, [2]int{runs, chunks}, "runs and chunks after the kill")

	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err = r.Run(rctx, planKillJob(newStallingStream(0, 0), backfill.ExtractorFunc(func(context.Context, backfill.Chunk, backfill.RowWriter) error {
		cancel() // planned: one chunk is enough
		return nil
	})))
	require.True(t, errors.Is(err, context.Canceled), "run: %v", err)
	require.NoError(t, db.QueryRow(`SELECT (SELECT count(*) FROM backfill.runs), (SELECT count(*) FROM backfill.chunks)`).Scan(&runs, &chunks))
	require.Equal(t, [2]int{1, planKillChunks}, [2]int{runs, chunks}, "runs and chunks of the plan made again")
}
