package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestPGManifestConformance(t *testing.T) {
	t.Parallel()
	backfilltest.TestManifest(t, func(t *testing.T) (backfill.Manifest, backfill.DB) {
		return backfill.NewPGManifest("ledger"), backfill.Postgres(pgtest.New(t))
	})
}

func TestPGMergerConformance(t *testing.T) {
	t.Parallel()
	backfilltest.TestMerger(t, func(t *testing.T) backfilltest.MergerHarness {
		db := pgtest.New(t)
		return backfilltest.MergerHarness{
			Merger:   pgstore.NewMerger(),
			DB:       backfill.Postgres(db),
			Manifest: backfill.NewPGManifest("ledger"),
			CreateTable: func(t *testing.T, table string, columns []backfilltest.ColumnDef, unique []string) {
				defs := make([]string, len(columns))
				for i, c := range columns {
					defs[i] = pq.QuoteIdentifier(c.Name) + " " + c.Type
				}
				quoted := make([]string, len(unique))
				for i, u := range unique {
					quoted[i] = pq.QuoteIdentifier(u)
				}
				_, err := db.Exec(fmt.Sprintf("CREATE TABLE %s (%s, UNIQUE (%s))", pq.QuoteIdentifier(table), strings.Join(defs, ", "), strings.Join(quoted, ", ")))
				require.NoError(t, err)
			},
			Truncate: func(t *testing.T, table string) {
				_, err := db.Exec("TRUNCATE " + pq.QuoteIdentifier(table))
				require.NoError(t, err)
			},
			Rows: func(t *testing.T, table string) [][]any {
				rows, err := db.Queryx("SELECT * FROM " + pq.QuoteIdentifier(table))
				require.NoError(t, err)
				defer rows.Close()
				var out [][]any
				for rows.Next() {
					vals, err := rows.SliceScan()
					require.NoError(t, err)
					for i, v := range vals {
						switch x := v.(type) {
						case []byte:
							vals[i] = string(x)
						case time.Time:
							vals[i] = x.UTC()
						}
					}
					out = append(out, vals)
				}
				require.NoError(t, rows.Err())
				return out
			},
			AddUnique: func(t *testing.T, table, name string, columns []string) {
				quoted := make([]string, len(columns))
				for i, c := range columns {
					quoted[i] = pq.QuoteIdentifier(c)
				}
				_, err := db.Exec(fmt.Sprintf("CREATE UNIQUE INDEX %s ON %s (%s)", pq.QuoteIdentifier(name), pq.QuoteIdentifier(table), strings.Join(quoted, ", ")))
				require.NoError(t, err)
			},
			AddCheck: func(t *testing.T, table, name, column string, min int64) {
				_, err := db.Exec(fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s CHECK (%s >= %d)", pq.QuoteIdentifier(table), pq.QuoteIdentifier(name), pq.QuoteIdentifier(column), min))
				require.NoError(t, err)
			},
		}
	})
}

func TestFakesRunAJob(t *testing.T) {
	t.Parallel()
	m := backfilltest.NewMerger()
	m.AddTable("items", []string{"tenant", "id"}, "tenant", "id", "name", "amount", "seen_at")
	man := backfilltest.NewManifest()
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: man, Merger: m, Concurrency: 2})
	require.NoError(t, err)
	s := &itemsSetup{}
	job := s.job(1)
	job.Rollback = backfill.RollbackNone // the fake keeps no undo log
	rep, err := r.Run(t.Context(), job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts)
	require.Len(t, m.Rows("items"), 1000)
	job.NewRun = true
	rep, err = r.Run(t.Context(), job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)
}

// Free text the library does not control reaches the manifest: a Reject's
// column and reason, an extractor's error (a source driver's message).
// Invalid UTF-8 and NUL must neither fail the chunk that queues them nor
// leave a failed run "running" with its chunk pending and no error
// recorded; they are stored as pgstore.ManifestText gives them.
func TestManifestFreeTextFromARun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE mt (id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	const bad = "\xff\x00"
	want := pgstore.ManifestText(bad)
	job := backfill.Job{Name: "mt", Chunker: backfill.IntRange(0, 2, 1), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "mt", Key: []string{"id"}, Columns: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			if ch.Lo == 1 {
				return errors.New("source said " + bad)
			}
			if err := w.Reject(ctx, map[string]any{"k" + bad: bad}, "c"+bad, "reason"+bad); err != nil {
				return err
			}
			return w.Write(ctx, int64(0))
		})}
	r, err := backfill.New(db, &backfill.Config{RetryBackoff: 1, MaxAttempts: 1, Concurrency: 1, WorkerID: "w" + bad})
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "invalid byte sequence", "a failure could not be recorded")
	require.Contains(t, err.Error(), "source said")

	run, err := backfill.NewPGManifest("").LatestRun(ctx, db, "mt")
	require.NoError(t, err)
	require.Equal(t, backfill.RunFailed, run.Status)
	require.Contains(t, run.LastError, "source said "+want)
	chunks, err := backfill.NewPGManifest("").Chunks(ctx, db, run.BatchID)
	require.NoError(t, err)
	require.Equal(t, backfill.ChunkDone, chunks[0].Status)
	require.Equal(t, "w"+want, chunks[0].Worker)
	require.Equal(t, backfill.ChunkFailed, chunks[1].Status)
	require.Contains(t, chunks[1].LastError, "source said "+want)
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, run.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, 1)
	require.Equal(t, "c"+want, ex[0].Column)
	require.Equal(t, "reason"+want, ex[0].Reason)
}

// TestRunExplainsAMistypedURLScheme: a database opened with a mistyped URL
// scheme fails the first use of the manifest with the scheme named and
// what to use, without the password lib/pq's message repeats.
func TestRunExplainsAMistypedURLScheme(t *testing.T) {
	db := sqlx.MustOpen("postgres", "postgress://ann:s3cret@localhost/shop?x")
	defer db.Close()
	r, err := backfill.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := backfill.Job{Name: "j", Chunker: backfill.IntRange(0, 1, 1),
		Target: backfill.Target{Table: "t", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, c.Lo)
		})}
	_, err = r.Run(context.Background(), job)
	if err == nil || !strings.Contains(err.Error(), `scheme "postgress" (a typo?): use postgres:// or postgresql://`) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Run = %v", err)
	}
}
