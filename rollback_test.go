package backfill_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// rbSetup has two targets with lineage: items (Upsert) and addr (History).
func rbSetup(t *testing.T, db *sqlx.DB) {
	t.Helper()
	_, err := db.Exec(`
		CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int,
			backfill_inserted_by bigint, backfill_updated_by bigint);
		CREATE TABLE addr (customer text, valid_from timestamptz, valid_to timestamptz, city text,
			backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (customer, valid_from));`)
	require.NoError(t, err)
}

func itemsJob(name string, rows [][]any) backfill.Job {
	return backfill.Job{Name: name, NewRun: true, Chunker: backfill.IntRange(0, 100, 10), ChunkColumn: "id",
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range rows {
				if id := r[0].(int64); id >= c.Lo && id < c.Hi {
					if err := w.Write(ctx, r...); err != nil {
						return err
					}
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name", "qty"}}}
}

func addrJob(name string, rows [][]any) backfill.Job {
	return backfill.Job{Name: name, NewRun: true, Chunker: backfill.List("a1", "b1", "b2"), ChunkColumn: "customer",
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range rows {
				if r[0].(string) == c.Item {
					if err := w.Write(ctx, r...); err != nil {
						return err
					}
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "addr", Key: []string{"customer"}, Mode: backfill.History, Columns: []string{"customer", "valid_from", "city"}}}
}

func tableState(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT 'items ' || row(i.*)::text FROM items i UNION ALL SELECT 'addr ' || row(a.*)::text FROM addr a ORDER BY 1`))
	return rows
}

func d(n int) time.Time { return time.Date(2024, 1, n, 0, 0, 0, 0, time.UTC) }

func TestRollbackRestoresEachBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	empty := tableState(t, db)

	// Batch 1 (items) and batch 2 (addresses).
	var b1 [][]any
	for i := range int64(50) {
		b1 = append(b1, []any{i, fmt.Sprintf("v1-%d", i), int64(i)})
	}
	rep1, err := r.Run(ctx, itemsJob("items", b1))
	require.NoError(t, err)
	a1 := [][]any{{"a1", d(1), "Oslo"}, {"a1", d(10), "Rome"}, {"b1", d(5), "Lima"}}
	repA1, err := r.Run(ctx, addrJob("addr", a1))
	require.NoError(t, err)
	after1 := tableState(t, db)

	// Batch 3 and 4: overlapping keys: updates, inserts, a late SCD2 version and a correction.
	var b2 [][]any
	for i := int64(25); i < 75; i++ {
		b2 = append(b2, []any{i, fmt.Sprintf("v2-%d", i), int64(i * 2)})
	}
	rep2, err := r.Run(ctx, itemsJob("items", b2))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 50, Inserted: 25, Updated: 25}, rep2.Counts)
	a2 := [][]any{{"a1", d(5), "Bergen"}, {"a1", d(10), "Roma"}, {"b1", d(2), "Quito"}, {"b2", d(3), "Cusco"}}
	repA2, err := r.Run(ctx, addrJob("addr", a2))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 4, Inserted: 3, Updated: 1}, repA2.Counts)

	// Batch 1 cannot go first: batch 3 changed its rows.
	before := tableState(t, db)
	_, err = r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "test"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), `{"id": 25}`)
	require.Equal(t, before, tableState(t, db), "a refused rollback changes nothing")

	pv, err := r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep2.BatchID, Preview: true})
	require.NoError(t, err)
	require.Equal(t, backfill.RollbackReport{BatchID: rep2.BatchID, Chunks: 10, Deleted: 25, Restored: 25, Preview: true,
		Status: backfill.RunCompleted, Elapsed: pv.Elapsed}, pv)
	require.Equal(t, before, tableState(t, db), "a preview writes nothing")

	// Roll back the later batches: back to the state after batch 1.
	rb2, err := r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "ann", Why: "bad v2 data"})
	require.NoError(t, err)
	require.Equal(t, int64(25), rb2.Deleted)
	require.Equal(t, int64(25), rb2.Restored)
	require.Equal(t, backfill.RunRolledBack, rb2.Status)
	_, err = r.Rollback(ctx, addrJob("addr", nil), backfill.RollbackOptions{BatchID: repA2.BatchID, Actor: "ann", Why: "bad v2 data"})
	require.NoError(t, err)
	if d := cmp.Diff(after1, tableState(t, db)); d != "" {
		t.Fatalf("after rolling back the second batches (-want +got):\n%s", d)
	}
	again, err := r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "ann", Why: "twice"})
	require.NoError(t, err)
	require.Zero(t, again.Chunks+int(again.Deleted+again.Restored), "rolling back twice changes nothing")

	// Now batch 1 and the first address batch: back to empty.
	_, err = r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "all of it"})
	require.NoError(t, err)
	_, err = r.Rollback(ctx, addrJob("addr", nil), backfill.RollbackOptions{BatchID: repA1.BatchID, Actor: "ann", Why: "all of it"})
	require.NoError(t, err)
	require.Equal(t, empty, tableState(t, db))

	events, err := backfill.NewPGManifest("").Events(ctx, db, rep2.BatchID)
	require.NoError(t, err)
	last := events[len(events)-1]
	require.Equal(t, "rollback", last.Kind)
	require.Equal(t, "ann", last.Actor)
	require.Contains(t, string(last.Detail), `"why": "bad v2 data"`)
	require.Contains(t, string(last.Detail), `"deleted": 25`)
}

func TestRollbackForceAndChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep1, err := r.Run(ctx, itemsJob("items", [][]any{{int64(1), "a", int64(1)}, {int64(15), "b", int64(2)}}))
	require.NoError(t, err)
	_, err = r.Run(ctx, itemsJob("items", [][]any{{int64(1), "a2", int64(1)}}))
	require.NoError(t, err)

	// One chunk of batch 1 alone: [10, 20) holds id 15.
	rb, err := r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep1.BatchID, ChunkID: "int:10/20", Actor: "bob", Why: "one chunk"})
	require.NoError(t, err)
	require.Equal(t, 1, rb.Chunks)
	require.Equal(t, int64(1), rb.Deleted)
	// The rest of batch 1 conflicts with batch 2; forcing overrides it.
	_, err = r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "bob", Why: "no force"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	rb, err = r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Force: true, Actor: "bob", Why: "forced"})
	require.NoError(t, err)
	require.Equal(t, int64(1), rb.Conflicts)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM items`))
	require.Zero(t, n)
	events, err := backfill.NewPGManifest("").Events(ctx, db, rep1.BatchID)
	require.NoError(t, err)
	require.Contains(t, string(events[len(events)-1].Detail), `"force": true`)
}

func init() {
	// The child process of TestKillDashNineDuringRollback.
	childProcess("BACKFILL_ROLLBACK_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, nil)
		if err != nil {
			return err
		}
		_, err = r.Rollback(context.Background(), itemsJob("items", nil), backfill.RollbackOptions{BatchID: 2, Actor: "child", Why: "crash test"})
		return err
	})
}

func TestKillDashNineDuringRollback(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns a process")
	}
	ctx := context.Background()
	var b1, b2 [][]any
	for i := range int64(100) {
		b1 = append(b1, []any{i, fmt.Sprintf("v1-%d", i), i})
		if i%2 == 0 {
			b2 = append(b2, []any{i, fmt.Sprintf("v2-%d", i), i})
		}
	}
	load := func(db *sqlx.DB) {
		rbSetup(t, db)
		r, err := backfill.New(db, nil)
		require.NoError(t, err)
		_, err = r.Run(ctx, itemsJob("items", b1))
		require.NoError(t, err)
		_, err = r.Run(ctx, itemsJob("items", b2))
		require.NoError(t, err)
	}
	ref := pgtest.New(t)
	load(ref)
	r, err := backfill.New(ref, nil)
	require.NoError(t, err)
	_, err = r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: 2, Actor: "ref", Why: "reference"})
	require.NoError(t, err)
	want := tableState(t, ref)

	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	load(db)
	// Slow the rollback down: every restored row takes 20ms.
	_, err = db.Exec(`CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.02); RETURN NEW; END $$;
		CREATE TRIGGER slow BEFORE UPDATE ON items FOR EACH ROW EXECUTE FUNCTION slow();`)
	require.NoError(t, err)
	killChildWhen(t, db, "BACKFILL_ROLLBACK_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE batch_id = 2 AND status = 'rolled_back'`, 3)
	var rolled int
	require.NoError(t, db.Get(&rolled, `SELECT count(*) FROM backfill.chunks WHERE batch_id = 2 AND status = 'rolled_back'`))
	require.Less(t, rolled, 10, "killed mid-rollback")
	_, err = db.Exec(`DROP TRIGGER slow ON items`)
	require.NoError(t, err)

	r, err = backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: 2, Actor: "ops", Why: "finish"})
	require.NoError(t, err)
	require.Equal(t, 10-rolled, rep.Chunks)
	if d := cmp.Diff(want, tableState(t, db)); d != "" {
		t.Fatalf("rollback resumed after kill -9 differs from an uninterrupted one (-want +got):\n%s", d)
	}
}

func TestRollbackOfOneHistoryChunkRetiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, addrJob("addr", [][]any{{"a1", d(1), "Oslo"}, {"a1", d(20), "Rome"}}))
	require.NoError(t, err)
	// Chunk "a1" of batch 2 holds both late versions of a1.
	rep, err := r.Run(ctx, addrJob("addr", [][]any{{"a1", d(10), "Bergen"}, {"a1", d(15), "Bergen2"}}))
	require.NoError(t, err)
	_, err = r.Rollback(ctx, addrJob("addr", nil), backfill.RollbackOptions{BatchID: rep.BatchID, ChunkID: "list:a1", Actor: "t", Why: "t"})
	require.NoError(t, err)
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT city || ' ' || to_char(valid_from, 'MM-DD') || ' ' || coalesce(to_char(valid_to, 'MM-DD'), 'open') FROM addr ORDER BY valid_from`))
	require.Equal(t, []string{"Oslo 01-01 01-20", "Rome 01-20 open"}, rows)

	// After a rollback the run stays rolled back; a new run does not mark it abandoned.
	_, err = r.Run(ctx, addrJob("addr", [][]any{{"a1", d(10), "Bergen"}}))
	require.NoError(t, err)
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.Equal(t, "completed", status, "a single-chunk rollback leaves the run completed")
}

func TestRollbackRetilesAroundLaterVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, addrJob("addr", [][]any{{"a1", d(1), "Oslo"}, {"a1", d(20), "Rome"}}))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, addrJob("addr", [][]any{{"a1", d(10), "Bergen"}}))
	require.NoError(t, err)
	_, err = r.Run(ctx, addrJob("addr", [][]any{{"a1", d(15), "Bergen2"}}))
	require.NoError(t, err)
	// Batch 2 inserted Jan 10; batch 3 later closed it at Jan 15: forcing
	// the rollback of batch 2 must leave tiled intervals.
	_, err = r.Rollback(ctx, addrJob("addr", nil), backfill.RollbackOptions{BatchID: rep2.BatchID, Force: true, Actor: "t", Why: "t"})
	require.NoError(t, err)
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT city || ' ' || to_char(valid_from, 'MM-DD') || ' ' || coalesce(to_char(valid_to, 'MM-DD'), 'open') FROM addr ORDER BY valid_from`))
	require.Equal(t, []string{"Oslo 01-01 01-15", "Bergen2 01-15 01-20", "Rome 01-20 open"}, rows)
}

// TestRollbackDoesNotDeleteRowALaterBatchDelivered is the scenario of
// issue 10 item 6, exactly: batch 1 writes {1: same, 2: old}, batch 2 (a
// restatement, NewRun) writes {1: same, 3: new}. Rolling back batch 1 must
// not delete key 1, which batch 2 delivered unchanged: it refuses, naming
// key 1 and batch 2, and changes nothing.
func TestRollbackDoesNotDeleteRowALaterBatchDelivered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep1, err := r.Run(ctx, itemsJob("items", [][]any{{int64(1), "same", int64(0)}, {int64(2), "old", int64(0)}}))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, itemsJob("items", [][]any{{int64(1), "same", int64(0)}, {int64(3), "new", int64(0)}}))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2, Inserted: 1, Unchanged: 1}, rep2.Counts)
	before := tableState(t, db)
	_, err = r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "bad batch 1"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), fmt.Sprintf(`{"id": 1} (delivered unchanged by batch %d)`, rep2.BatchID))
	require.NotContains(t, err.Error(), `{"id": 2}`, "batch 2 did not deliver key 2")
	require.Equal(t, before, tableState(t, db), "a refused rollback changes nothing")
}
