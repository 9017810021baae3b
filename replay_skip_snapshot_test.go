package backfill_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/pgbackfill/backfill/backfilldriver"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// beforeFingerprintDB is a DB whose chunk transactions run hook, once,
// just before the first target fingerprint statement (the one whose
// result columns include hash_sum) of a chunk's transaction: after the
// chunk's merge, before the fingerprint it records.
type beforeFingerprintDB struct {
	backfill.DB
	once sync.Once
	hook func()
	ran  bool
}

func (d *beforeFingerprintDB) Begin(ctx context.Context) (backfilldriver.Tx, error) {
	tx, err := d.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &beforeFingerprintTx{Tx: tx, d: d}, nil
}

type beforeFingerprintTx struct {
	backfilldriver.Tx
	d *beforeFingerprintDB
}

func (t *beforeFingerprintTx) before(q string) {
	if t.d.hook != nil && strings.Contains(q, "hash_sum") {
		t.d.once.Do(func() { t.d.hook(); t.d.ran = true })
	}
}

func (t *beforeFingerprintTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	t.before(q)
	return t.Tx.QueryContext(ctx, q, args...)
}

func (t *beforeFingerprintTx) QueryxContext(ctx context.Context, q string, args ...any) (*sqlx.Rows, error) {
	t.before(q)
	return t.Tx.QueryxContext(ctx, q, args...)
}

func (t *beforeFingerprintTx) QueryRowxContext(ctx context.Context, q string, args ...any) *sqlx.Row {
	t.before(q)
	return t.Tx.QueryRowxContext(ctx, q, args...)
}

func (t *beforeFingerprintTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return t.Tx.(interface {
		PrepareContext(context.Context, string) (*sql.Stmt, error)
	}).PrepareContext(ctx, q)
}

// TestSkipUnchangedRecordsOnlyWhatAMergeLeaves: a target row the merge
// leaves unchanged is not locked by it, so another session may change it
// and commit between the merge and the statement that takes the target
// fingerprint the chunk records (each statement of READ COMMITTED takes a
// new snapshot). The recorded fingerprint must then not describe that
// state: a replay of the same source would find both fingerprints equal
// and skip, leaving the other session's row where a merge (SourceWins)
// restores the source's. Here the change is made, deterministically, just
// before the fingerprint statement; the replay must merge the chunk and
// leave the target equal to the source.
func TestSkipUnchangedRecordsOnlyWhatAMergeLeaves(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		chunkColumn string
		concurrent  string
		counts      backfill.Counts
	}{
		"row updated": {"id", `UPDATE items SET name = 'tampered' WHERE tenant = 'acme' AND id = 55`,
			backfill.Counts{Read: 100, Updated: 1, Unchanged: 99}},
		"row replaced by another key": {"id", `DELETE FROM items WHERE tenant = 'acme' AND id = 55;
			INSERT INTO items (tenant, id, name) VALUES ('zz', 55, 'intruder')`,
			backfill.Counts{Read: 100, Inserted: 1, Unchanged: 99}},
		"row updated, no ChunkColumn": {"", `UPDATE items SET amount = 9.99 WHERE tenant = 'acme' AND id = 55`,
			backfill.Counts{Read: 100, Updated: 1, Unchanged: 99}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := newItems(t)
			src := newSkipSource()
			for id := int64(100); id < 1000; id++ {
				delete(src.rows, id)
			}
			job := skipJob(src)
			job.Chunker = backfill.IntRange(0, 100, 100)
			job.ChunkColumn = c.chunkColumn

			// The target already holds the source's rows: the merge of
			// the recording load leaves every row unchanged.
			plain := job
			plain.SkipUnchanged = false
			r, err := backfill.New(s.db, nil)
			require.NoError(t, err)
			_, err = r.Run(ctx, plain)
			require.NoError(t, err)

			db := &beforeFingerprintDB{DB: backfill.Postgres(s.db), hook: func() {
				_, err := s.db.Exec(c.concurrent) // another session, committed at once
				require.NoError(t, err)
			}}
			rw, err := backfill.NewWithDB(db, nil)
			require.NoError(t, err)
			rep, err := rw.Run(ctx, job)
			require.NoError(t, err)
			require.True(t, db.ran, "the concurrent change ran before the recorded fingerprint")
			require.Equal(t, backfill.Counts{Read: 100, Unchanged: 100}, rep.Counts)

			// The same source again: the chunk must merge, restoring the
			// source's row.
			rep, err = r.Run(ctx, job)
			require.NoError(t, err)
			require.Zero(t, rep.ChunksSkipped, "a chunk skipped on a fingerprint of rows its merge did not leave")
			require.Equal(t, c.counts, rep.Counts)
			var acme []rowImage
			for _, row := range contentOf(snapshot(t, s.db)) {
				if row.Tenant == "acme" {
					acme = append(acme, row)
				}
			}
			if d := cmp.Diff(src.image(), acme); d != "" {
				t.Fatalf("target after the replay (-want +got):\n%s", d)
			}

			// Its merge recorded the fingerprints anew: the next replay
			// skips it when nothing else holds its bounds.
			rep, err = r.Run(ctx, job)
			require.NoError(t, err)
			if strings.HasPrefix(name, "row replaced") {
				require.Zero(t, rep.ChunksSkipped, "the other key's row stays in the bounds")
			} else {
				require.Equal(t, 1, rep.ChunksSkipped)
			}
		})
	}
}
