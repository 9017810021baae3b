package backfill_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

func init() {
	// Child: ExtractAhead, Concurrency 1; chunk 2's transaction hangs in
	// its validator (after merge), so chunk 3 is leased and extracted
	// ahead while it waits.
	childProcess("BACKFILL_AHEAD_KILL_CHILD", func(db *sqlx.DB) error {
		cfg := leaseConfig()
		cfg.Concurrency, cfg.ExtractAhead = 1, true
		r, err := backfill.New(db, cfg)
		if err != nil {
			return err
		}
		job := leaseJob(nil)
		job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
			if s.Chunk.Seq == 2 {
				select {}
			}
			return backfill.CheckResult{Check: "ok", Severity: backfill.SeverityError, Passed: true}, nil
		})}
		_, err = r.Run(context.Background(), job)
		return err
	})
}

// TestAheadKillDashNineWithAChunkAhead: kill -9 of a worker whose chunk 2
// is in its transaction and chunk 3 leased ahead; a second worker (with
// ExtractAhead too) takes both over after StaleAfter, every row once.
func TestAheadKillDashNineWithAChunkAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE kx (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, db))
	killChildWhen(t, db, "BACKFILL_AHEAD_KILL_CHILD", url,
		`SELECT count(*) FROM backfill.chunks WHERE seq IN (2, 3) AND status = 'pending' AND lease_key IS NOT NULL`, 2)
	cfg := leaseConfig()
	cfg.ExtractAhead = true
	r, err := backfill.New(db, cfg)
	require.NoError(t, err)
	start := time.Now()
	rep, err := r.Run(ctx, leaseJob(nil))
	require.NoError(t, err)
	t.Logf("took %v", time.Since(start))
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, backfill.Counts{Read: 60, Inserted: 60}, rep.Counts)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM kx`))
	require.Equal(t, 60, n)
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
	require.Zero(t, n)
}
