package backfill_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// leaseJob loads ids [0, 60) into table kx in chunks of 10; block, if
// not nil, is called by the extractor after a chunk's rows.
func leaseJob(block func(c backfill.Chunk)) backfill.Job {
	return backfill.Job{
		Name:    "kx",
		Chunker: backfill.IntRange(0, 60, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
					return err
				}
			}
			if block != nil {
				block(c)
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "kx", Key: []string{"id"}},
	}
}

func leaseConfig() *backfill.Config {
	return &backfill.Config{Concurrency: 2, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second}
}

func init() {
	// The child of TestKillDashNineWhileExtracting: chunk 2's extraction
	// never ends.
	childProcess("BACKFILL_LEASE_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, leaseConfig())
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), leaseJob(func(c backfill.Chunk) {
			if c.Seq == 2 {
				select {}
			}
		}))
		return err
	})
}

// TestKillDashNineWhileExtracting kills a worker with SIGKILL while it
// extracts a chunk it leased (outside any transaction): another worker
// takes the lease over once the killed worker's heartbeat is stale, and
// every chunk is merged exactly once, its rows balanced.
func TestKillDashNineWhileExtracting(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE kx (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, db))
	killChildWhen(t, db, "BACKFILL_LEASE_CHILD", url,
		`SELECT count(*) FROM backfill.chunks WHERE seq = 2 AND status = 'pending' AND lease_key IS NOT NULL`, 1)
	var before struct {
		Key   string `db:"lease_key"`
		Epoch int64  `db:"lease_epoch"`
	}
	require.NoError(t, db.Get(&before, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))

	r, err := backfill.New(db, leaseConfig())
	require.NoError(t, err)
	rep, err := r.Run(ctx, leaseJob(nil))
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 6, rep.ChunksDone)
	require.Equal(t, backfill.Counts{Read: 60, Inserted: 60}, rep.Counts, "every chunk merged once")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM kx`))
	require.Equal(t, 60, n)
	var after struct {
		Key   *string `db:"lease_key"`
		Epoch int64   `db:"lease_epoch"`
	}
	require.NoError(t, db.Get(&after, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))
	require.Nil(t, after.Key, "the checkpoint cleared the lease")
	require.Equal(t, before.Epoch+1, after.Epoch, "taken over from the killed worker %s", before.Key)
}
