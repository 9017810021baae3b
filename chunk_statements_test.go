package backfill

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/stretchr/testify/require"
)

// stmtDB is a DB that records the statements of each transaction begun
// through it (the chunks' transactions).
type stmtDB struct {
	DB
	mu  sync.Mutex
	txs []*stmtTx
}

func (d *stmtDB) Begin(ctx context.Context) (backfilldriver.Tx, error) {
	tx, err := d.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	st := &stmtTx{Tx: tx}
	d.mu.Lock()
	d.txs = append(d.txs, st)
	d.mu.Unlock()
	return st, nil
}

type stmtTx struct {
	backfilldriver.Tx
	mu    sync.Mutex
	stmts []string
}

func (t *stmtTx) record(q string) {
	t.mu.Lock()
	t.stmts = append(t.stmts, strings.Join(strings.Fields(q), " "))
	t.mu.Unlock()
}

func (t *stmtTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	t.record(q)
	return t.Tx.ExecContext(ctx, q, args...)
}

func (t *stmtTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	t.record(q)
	return t.Tx.QueryContext(ctx, q, args...)
}

func (t *stmtTx) QueryxContext(ctx context.Context, q string, args ...any) (*sqlx.Rows, error) {
	t.record(q)
	return t.Tx.QueryxContext(ctx, q, args...)
}

func (t *stmtTx) QueryRowxContext(ctx context.Context, q string, args ...any) *sqlx.Row {
	t.record(q)
	return t.Tx.QueryRowxContext(ctx, q, args...)
}

func (t *stmtTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	t.record(q)
	return t.Tx.(pgstore.Preparer).PrepareContext(ctx, q)
}

// TestChunkTransactionStatements counts the statements of a chunk's
// transaction on the short-transaction path (issue 15, per-chunk
// overhead: every statement is a round trip, and a parameterised one
// two with lib/pq): the merge's planner settings are set in one statement
// and put back in one without parameters, and none of them is read back
// to the client.
func TestChunkTransactionStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	sdb := &stmtDB{DB: Postgres(db)}
	r, err := NewWithDB(sdb, &Config{WorkerID: "stmts"})
	require.NoError(t, err)
	job := liveJob(nil)
	job.Chunker = IntRange(0, 30, 10)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)

	chunks := 0
	for _, tx := range sdb.txs {
		copied := false
		settings := 0
		for _, q := range tx.stmts {
			// A chunk's COPY into staging, not the plan's into the
			// manifest's chunks (StartRun).
			copied = copied || strings.HasPrefix(q, "COPY ") && !strings.Contains(q, `"backfill".chunks`)
			if strings.Contains(q, "enable_seqscan") {
				settings++
				require.NotContains(t, q, "$1", "the planner settings are restored without parameters: %s", q)
			}
		}
		if !copied {
			continue
		}
		chunks++
		require.Equal(t, 2, settings, "a chunk's transaction sets and restores the planner settings in one statement each: %q", tx.stmts)
		t.Logf("chunk transaction: %d statements", len(tx.stmts))
	}
	require.Equal(t, 3, chunks, "chunk transactions with a COPY")

	// Nothing reads every chunk's state after each chunk: a job of 9
	// chunks reads the whole chunk list as often as one of 3.
	fullReads := func() (n int) {
		sdb.mu.Lock()
		defer sdb.mu.Unlock()
		for _, tx := range sdb.txs {
			for _, q := range tx.stmts {
				if strings.Contains(q, ".chunks WHERE batch_id = $1 ORDER BY seq") {
					n++
				}
			}
		}
		sdb.txs = nil
		return n
	}
	three := fullReads()
	job9 := liveJob(nil)
	job9.Name = "live9"
	job9.Chunker = IntRange(0, 90, 10)
	_, err = r.Run(ctx, job9)
	require.NoError(t, err)
	require.Equal(t, three, fullReads(), "full reads of the chunk list in a run of 3 chunks and in one of 9")
}
