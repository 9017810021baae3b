package backfill_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
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
	// A chunk's rollback leaves its batch as it is, finished: nothing
	// waits.
	st, err := r.StatusOf(ctx, rep1.BatchID)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, st.Status)
	require.Equal(t, 1, st.Chunks.RolledBack)
	require.Empty(t, st.Waiting)
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
		// Two chunks per transaction: the kill lands between slices.
		backfill.SetRollbackSlices(1_000, 2)
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
	// An operator sees the batch partly rolled back, not simply completed.
	st, err := r.StatusOf(ctx, 2)
	require.NoError(t, err)
	require.Contains(t, st.Waiting, fmt.Sprintf("did not finish: %d of 10 chunks marked rolled back", rolled))
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
// exactly this: batch 1 writes {1: same, 2: old}, batch 2 (a
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

// BenchmarkRollback answers: what does withdrawing a large batch with
// Runner.Rollback cost, next to the batch's own merge, and how big is the
// undo log the batch wrote?
//
// The target is an order-line table with a composite key (region,
// order_no), six content columns (text, numeric(12,2), int, timestamptz,
// bool, varchar(20)) and the lineage columns, so jobs get the undo log by
// default. Batch 1 loads 500,000 rows (order_no 0..499,999); batch 2
// (NewRun) writes 1,000,000 rows over order_no 0..999,999: the first
// 500,000 with other content (updates, whose prior images go to the undo
// log), the rest new (inserts, whose keys go to the undo log). Both use
// IntRange chunks of 10,000 rows, one at a time. Then batch 2 is rolled
// back and the table must equal the state after batch 1, lineage columns
// included (md5 of the ordered rows).
//
// The same batch 2 runs with RollbackNone on a fresh copy (another
// database loaded the same way), for the undo log's overhead on the load.
// Each kind runs twice on fresh copies, alternating (none, undo log, none,
// undo log), and the faster run counts: the server may be shared. The
// last run is the one measured and rolled back.
//
// Metrics: load1-s (batch 1), merge-s (batch 2, wall time of Runner.Run),
// merge-noundo-s (the same with RollbackNone), undo-overhead (merge-s / merge-noundo-s), rollback-s
// (wall time of Runner.Rollback), rollback/merge (goal: at most 2),
// undo-bytes (growth of pg_total_relation_size('backfill.undo') during
// batch 2), undo-rows, undo-B/changed-row (undo bytes per row batch 2
// inserted or updated), undo/target-growth (undo bytes / growth of the
// target's total size during batch 2) and undo/changed-row-bytes (undo
// bytes / pg_column_size of the rows batch 2 wrote). Run it once (a few
// minutes on 2 cores):
//
//	go test -run '^$' -bench Rollback -benchtime 1x .
func BenchmarkRollback(b *testing.B) {
	var res rbbResult
	for b.Loop() {
		res = rbbRun(b)
	}
	b.ReportMetric(res.load1.Seconds(), "load1-s")
	b.ReportMetric(res.merge.Seconds(), "merge-s")
	b.ReportMetric(res.mergeNone.Seconds(), "merge-noundo-s")
	b.ReportMetric(res.merge.Seconds()/res.mergeNone.Seconds(), "undo-overhead")
	b.ReportMetric(res.rollback.Seconds(), "rollback-s")
	b.ReportMetric(res.rollback.Seconds()/res.merge.Seconds(), "rollback/merge")
	b.ReportMetric(float64(res.undoBytes), "undo-bytes")
	b.ReportMetric(float64(res.undoRows), "undo-rows")
	b.ReportMetric(float64(res.undoBytes)/float64(res.changed), "undo-B/changed-row")
	b.ReportMetric(float64(res.undoBytes)/float64(res.targetGrowth), "undo/target-growth")
	b.ReportMetric(float64(res.undoBytes)/float64(res.changedRowBytes), "undo/changed-row-bytes")

	mb := func(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
	x := func(a, b time.Duration) float64 { return a.Seconds() / b.Seconds() }
	b.Logf("batch 2: %d inserts + %d updates, chunks of %d; batch 1 load (%d inserts) %.2f s\n"+
		"                      total   update chunks   insert chunks\n"+
		"  merge, undo log     %6.2f s  %6.2f s        %6.2f s\n"+
		"  merge, RollbackNone %6.2f s  %6.2f s        %6.2f s\n"+
		"  undo log overhead   x%5.2f   x%5.2f         x%5.2f\n"+
		"  rollback            %6.2f s  (%d restored, %d deleted): rollback/merge %.2f (goal <= 2)\n"+
		"  undo log of batch 2: %s (heap %s, index %s), %d rows, %d prior images: %.0f B per changed row; key jsonb %s, before jsonb %s\n"+
		"  target: growth during batch 2 %s (undo/growth %.2f); rows written %s of data (undo/data %.2f); total after %s\n"+
		"  every batch 2 run, in order: %s",
		res.inserted, res.updated, rbbStep, rbbBase, res.load1.Seconds(),
		res.merge.Seconds(), res.split.upd.Seconds(), res.split.ins.Seconds(),
		res.mergeNone.Seconds(), res.splitNone.upd.Seconds(), res.splitNone.ins.Seconds(),
		x(res.merge, res.mergeNone), x(res.split.upd, res.splitNone.upd), x(res.split.ins, res.splitNone.ins),
		res.rollback.Seconds(), res.restored, res.deleted, x(res.rollback, res.merge),
		mb(res.undoBytes), mb(res.undoHeap), mb(res.undoIndex), res.undoRows, res.undoUpdates, float64(res.undoBytes)/float64(res.changed), mb(res.keyBytes), mb(res.beforeBytes),
		mb(res.targetGrowth), float64(res.undoBytes)/float64(res.targetGrowth),
		mb(res.changedRowBytes), float64(res.undoBytes)/float64(res.changedRowBytes), mb(res.targetAfter),
		strings.Join(res.runs, ", "))
}

// rbbSplit sums the chunks' durations (from ChunkDone) by kind: chunks
// that updated rows, chunks that only inserted.
type rbbSplit struct {
	mu       sync.Mutex
	upd, ins time.Duration
}

func (s *rbbSplit) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.upd, s.ins = 0, 0
}

func (s *rbbSplit) ChunkDone(ctx context.Context, batchID int64, r backfill.ChunkResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Updated > 0 {
		s.upd += r.FinishedAt.Sub(r.StartedAt)
	} else {
		s.ins += r.FinishedAt.Sub(r.StartedAt)
	}
}

type rbbResult struct {
	load1, merge, mergeNone, rollback time.Duration
	inserted, updated, changed        int64
	deleted, restored                 int64
	undoBytes, undoRows, undoUpdates  int64
	keyBytes, beforeBytes             int64
	undoHeap, undoIndex               int64
	targetGrowth, targetAfter         int64
	changedRowBytes                   int64
	split, splitNone                  *rbbSplit
	runs                              []string // every timed batch 2, in order
}

const (
	rbbBase  = 500_000   // batch 1: order_no 0..499,999
	rbbTotal = 1_000_000 // batch 2: order_no 0..999,999
	rbbStep  = 10_000    // rows per chunk
)

var rbbRegions = []string{"EU", "US", "APAC", "LATAM"}

// rbbJob writes order_no [0, hi) in chunks of rbbStep; version 2 changes
// every content column of the rows version 1 wrote.
func rbbJob(hi int64, version int64, rollback backfill.RollbackMechanism) backfill.Job {
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	return backfill.Job{Name: "orders", NewRun: true, Rollback: rollback,
		Chunker: backfill.IntRange(0, hi, rbbStep),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, rbbRegions[id%4], id,
					fmt.Sprintf("v%d order line %d: a description of the product", version, id),
					fmt.Sprintf("%d.%02d", (id*7+version)%100_000, id%100),
					(id+version)%50,
					start.Add(time.Duration(id)*time.Second+time.Duration(version)*time.Hour),
					(id+version)%10 == 0,
					fmt.Sprintf("SKU-%06d-%d", id%100_000, version),
				); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "orders", Key: []string{"region", "order_no"},
			Columns: []string{"region", "order_no", "description", "unit_price", "quantity", "ordered_at", "is_returned", "product_code"}}}
}

// rbbLoad creates the target in a new database and runs batch 1 on it.
func rbbLoad(b *testing.B, ctx context.Context, split *rbbSplit) (*sqlx.DB, *backfill.Runner, time.Duration) {
	b.Helper()
	db := pgtest.New(b)
	rbbExec(b, db, `CREATE TABLE orders (
		region text NOT NULL, order_no bigint NOT NULL,
		description text, unit_price numeric(12,2), quantity int, ordered_at timestamptz, is_returned bool, product_code varchar(20),
		backfill_inserted_by bigint, backfill_updated_by bigint,
		PRIMARY KEY (region, order_no))`)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, Hooks: split})
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	rep, err := r.Run(ctx, rbbJob(rbbBase, 1, ""))
	if err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	if rep.Counts.Inserted != rbbBase || rep.Status != backfill.RunCompleted {
		b.Fatalf("batch 1: %+v", rep)
	}
	// As autovacuum would soon after a load: hint bits, visibility map,
	// statistics; both copies start batch 2 from the same state.
	rbbExec(b, db, `VACUUM ANALYZE orders`)
	rbbExec(b, db, `VACUUM ANALYZE backfill.undo`)
	return db, r, d
}

func rbbExec(b *testing.B, db *sqlx.DB, q string) {
	b.Helper()
	if _, err := db.Exec(q); err != nil {
		b.Fatalf("%s: %v", q, err)
	}
}

func rbbInt(b *testing.B, db *sqlx.DB, q string, args ...any) int64 {
	b.Helper()
	var n int64
	if err := db.Get(&n, q, args...); err != nil {
		b.Fatalf("%s: %v", q, err)
	}
	return n
}

// rbbState is the md5 of every row, every column, in key order.
func rbbState(b *testing.B, db *sqlx.DB) string {
	b.Helper()
	var s string
	if err := db.Get(&s, `SELECT count(*) || ' ' || md5(string_agg(o::text, E'\n' ORDER BY region, order_no)) FROM orders o`); err != nil {
		b.Fatal(err)
	}
	return s
}

// rbbBatch2 is one copy: batch 1 on a new database, then batch 2 with
// the rollback mechanism given, timed.
type rbbBatch2 struct {
	db          *sqlx.DB
	r           *backfill.Runner
	job         backfill.Job
	rep         backfill.Report
	load1, took time.Duration
	split       *rbbSplit
	after1      string // state after batch 1 (with keep)
	// Sizes before batch 2.
	undo0, undoHeap0, undoIndex0, target0 int64
}

func rbbCopy(b *testing.B, ctx context.Context, mech backfill.RollbackMechanism, keep bool) rbbBatch2 {
	b.Helper()
	c := rbbBatch2{split: &rbbSplit{}, job: rbbJob(rbbTotal, 2, mech)}
	c.db, c.r, c.load1 = rbbLoad(b, ctx, c.split)
	c.split.reset() // batch 2 only
	if keep {
		c.after1 = rbbState(b, c.db)
		c.undo0 = rbbInt(b, c.db, `SELECT pg_total_relation_size('backfill.undo')`)
		c.undoHeap0 = rbbInt(b, c.db, `SELECT pg_relation_size('backfill.undo')`)
		c.undoIndex0 = rbbInt(b, c.db, `SELECT pg_indexes_size('backfill.undo')`)
		c.target0 = rbbInt(b, c.db, `SELECT pg_total_relation_size('orders')`)
	}
	t0 := time.Now()
	rep, err := c.r.Run(ctx, c.job)
	if err != nil {
		b.Fatal(err)
	}
	c.took, c.rep = time.Since(t0), rep
	if rep.Counts.Inserted != rbbTotal-rbbBase || rep.Counts.Updated != rbbBase || rep.Status != backfill.RunCompleted {
		b.Fatalf("batch 2 (rollback %q): %+v", mech, rep)
	}
	if !keep {
		// Free the server of it before the next copy.
		rbbExec(b, c.db, `DROP TABLE orders; DROP SCHEMA backfill CASCADE`)
	}
	return c
}

func rbbRun(b *testing.B) rbbResult {
	ctx := context.Background()
	var res rbbResult

	// Batch 2 runs four times, each on a fresh copy, alternating without
	// and with the undo log; the faster run of each kind counts (the
	// machine may be shared). The last one is measured and rolled back.
	var c rbbBatch2
	for i := range 2 {
		none := rbbCopy(b, ctx, backfill.RollbackNone, false)
		res.runs = append(res.runs, fmt.Sprintf("none %.2f s", none.took.Seconds()))
		if i == 0 || none.took < res.mergeNone {
			res.mergeNone, res.splitNone = none.took, none.split
		}
		c = rbbCopy(b, ctx, "", i == 1)
		res.runs = append(res.runs, fmt.Sprintf("undo log %.2f s", c.took.Seconds()))
		if i == 0 || c.took < res.merge {
			res.merge, res.split = c.took, c.split
		}
		if i == 0 || c.load1 < res.load1 {
			res.load1 = c.load1
		}
	}
	db, rep := c.db, c.rep
	res.inserted, res.updated = rep.Counts.Inserted, rep.Counts.Updated
	res.changed = res.inserted + res.updated
	res.undoBytes = rbbInt(b, db, `SELECT pg_total_relation_size('backfill.undo')`) - c.undo0
	res.undoHeap = rbbInt(b, db, `SELECT pg_relation_size('backfill.undo')`) - c.undoHeap0
	res.undoIndex = rbbInt(b, db, `SELECT pg_indexes_size('backfill.undo')`) - c.undoIndex0
	res.targetAfter = rbbInt(b, db, `SELECT pg_total_relation_size('orders')`)
	res.targetGrowth = res.targetAfter - c.target0
	var u struct {
		Rows    int64 `db:"n"`
		Updates int64 `db:"updates"`
		Key     int64 `db:"key"`
		Before  int64 `db:"before"`
	}
	if err := db.Get(&u, `SELECT count(*) AS n, count(*) FILTER (WHERE op = 'update') AS updates,
			coalesce(sum(pg_column_size(key)), 0) AS key, coalesce(sum(pg_column_size(before)), 0) AS before
		FROM backfill.undo WHERE batch_id = $1`, rep.BatchID); err != nil {
		b.Fatal(err)
	}
	res.undoRows, res.undoUpdates, res.keyBytes, res.beforeBytes = u.Rows, u.Updates, u.Key, u.Before
	// Only updates are logged (prior images); inserts are found by lineage.
	if u.Rows != res.updated || u.Updates != res.updated {
		b.Fatalf("undo log of batch 2: %+v, want %d rows, all updates", u, res.updated)
	}
	res.changedRowBytes = rbbInt(b, db, `SELECT sum(pg_column_size(o.*)) FROM orders o WHERE backfill_updated_by = $1`, rep.BatchID)

	// As autovacuum would within a minute of the batch: statistics of
	// the target and of the undo log, which grew by 1,000,000 rows.
	rbbExec(b, db, `ANALYZE orders`)
	rbbExec(b, db, `ANALYZE backfill.undo`)

	t0 := time.Now()
	rb, err := c.r.Rollback(ctx, c.job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "bench", Why: "benchmark: withdraw batch 2"})
	if err != nil {
		b.Fatal(err)
	}
	res.rollback = time.Since(t0)
	res.deleted, res.restored = rb.Deleted, rb.Restored
	if rb.Deleted != res.inserted || rb.Restored != res.updated || rb.Status != backfill.RunRolledBack {
		b.Fatalf("rollback: %+v", rb)
	}
	if got := rbbState(b, db); got != c.after1 {
		b.Fatalf("after the rollback the table is %s, want the state after batch 1, %s", got, c.after1)
	}
	return res
}

// dlvMode is one merge mode's target for the delivered-unchanged
// rollback tests: rows are id -> name.
type dlvMode struct {
	name string
	ddl  string
	// job builds a job writing rows; atEnd publishes at the end.
	job func(name string, rows map[int64]string, atEnd bool) backfill.Job
	// key is the rollback's JSON key of id.
	key func(id int64) string
}

func dlvExtractor(rows map[int64]string, write func(ctx context.Context, w backfill.RowWriter, id int64, name string) error) backfill.Extractor {
	return backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		ids := make([]int64, 0, len(rows))
		for id := range rows {
			if c.Kind != backfilltype.KindInt || (id >= c.Lo && id < c.Hi) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			if err := write(ctx, w, id, rows[id]); err != nil {
				return err
			}
		}
		return nil
	})
}

func dlvPublish(atEnd bool) backfill.Publish {
	if atEnd {
		return backfill.Publish{Mode: backfill.PublishAtEnd}
	}
	return backfill.Publish{}
}

var dlvModes = []dlvMode{
	{name: "Upsert", ddl: `CREATE TABLE t (id bigint PRIMARY KEY, name text, backfill_inserted_by bigint, backfill_updated_by bigint)`,
		job: func(name string, rows map[int64]string, atEnd bool) backfill.Job {
			return backfill.Job{Name: name, NewRun: true, Chunker: backfill.IntRange(0, 10, 5), ChunkColumn: "id", Publish: dlvPublish(atEnd),
				Extractor: dlvExtractor(rows, func(ctx context.Context, w backfill.RowWriter, id int64, n string) error { return w.Write(ctx, id, n) }),
				Target:    backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "name"}}}
		},
		key: func(id int64) string { return fmt.Sprintf(`{"id": %d}`, id) }},
	{name: "AppendOnly", ddl: `CREATE TABLE t (id bigint PRIMARY KEY, name text, backfill_inserted_by bigint, backfill_updated_by bigint)`,
		job: func(name string, rows map[int64]string, atEnd bool) backfill.Job {
			// No ChunkColumn: one list chunk.
			return backfill.Job{Name: name, NewRun: true, Chunker: backfill.List("all"), Publish: dlvPublish(atEnd),
				Extractor: dlvExtractor(rows, func(ctx context.Context, w backfill.RowWriter, id int64, n string) error { return w.Write(ctx, id, n) }),
				Target:    backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.AppendOnly, Columns: []string{"id", "name"}}}
		},
		key: func(id int64) string { return fmt.Sprintf(`{"id": %d}`, id) }},
	{name: "History", ddl: `CREATE TABLE t (id bigint, valid_from date, valid_to date, name text,
			backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (id, valid_from))`,
		job: func(name string, rows map[int64]string, atEnd bool) backfill.Job {
			return backfill.Job{Name: name, NewRun: true, Chunker: backfill.IntRange(0, 10, 5), ChunkColumn: "id", Publish: dlvPublish(atEnd),
				Extractor: dlvExtractor(rows, func(ctx context.Context, w backfill.RowWriter, id int64, n string) error {
					return w.Write(ctx, id, time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), n)
				}),
				Target: backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, Columns: []string{"id", "valid_from", "name"}}}
		},
		key: func(id int64) string { return fmt.Sprintf(`{"id": %d, "valid_from": "2024-01-01"}`, id) }},
	{name: "Keyless", ddl: `CREATE TABLE t (k text PRIMARY KEY, src text, name text, backfill_inserted_by bigint, backfill_updated_by bigint)`,
		job: func(name string, rows map[int64]string, atEnd bool) backfill.Job {
			return backfill.Job{Name: name, NewRun: true, Chunker: backfill.List("all"), Publish: dlvPublish(atEnd),
				Extractor: dlvExtractor(rows, func(ctx context.Context, w backfill.RowWriter, id int64, n string) error {
					return w.Write(ctx, fmt.Sprintf(" %d ", id), n)
				}),
				Target: backfill.Target{Table: "t", Key: []string{"k"}, Mode: backfill.Keyless, Columns: []string{"src", "name"},
					Derive: []backfill.KeyRule{{Column: "k", From: "src", Rules: []backfill.Normalizer{backfill.Trim}}}}}
		},
		key: func(id int64) string { return fmt.Sprintf(`{"k": "%d"}`, id) }},
}

func dlvState(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT row(x.*)::text FROM t x ORDER BY 1`))
	return rows
}

// TestRollbackKeepsRowsALaterBatchDelivered: batch 1
// writes {1: same, 2: old}, batch 2 (a restatement) writes {1: same, 3:
// new}. Key 1 is unchanged, so its lineage still names batch 1, yet batch
// 2 delivered it: rolling back batch 1 must not delete it. Every mode,
// with batch 2 merged per chunk or published at the end; the preview says
// so too, the refusal names key 1 (and not key 2, which only batch 1
// delivered) and batch 2, and rolling back batch 2 first, then batch 1,
// works.
func TestRollbackKeepsRowsALaterBatchDelivered(t *testing.T) {
	t.Parallel()
	for _, m := range dlvModes {
		for _, atEnd := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/atEnd=%t", m.name, atEnd), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := pgtest.New(t)
				_, err := db.Exec(m.ddl)
				require.NoError(t, err)
				r, err := backfill.New(db, nil)
				require.NoError(t, err)
				rep1, err := r.Run(ctx, m.job("j", map[int64]string{1: "same", 2: "old"}, false))
				require.NoError(t, err)
				rep2, err := r.Run(ctx, m.job("j", map[int64]string{1: "same", 3: "new"}, atEnd))
				require.NoError(t, err)
				require.Equal(t, int64(1), rep2.Counts.Inserted)
				require.Equal(t, int64(1), rep2.Counts.Unchanged)
				before := dlvState(t, db)

				want := []backfill.RollbackConflict{{Key: m.key(1), Batch: rep2.BatchID, Delivered: true}}
				pv, err := r.Rollback(ctx, m.job("j", nil, false), backfill.RollbackOptions{BatchID: rep1.BatchID, Preview: true})
				require.NoError(t, err)
				require.Equal(t, int64(1), pv.Conflicts)
				require.Equal(t, int64(1), pv.ConflictsDelivered)
				require.Equal(t, want, pv.ConflictRows)
				require.Equal(t, int64(1), pv.Deleted, "without Force only key 2 would go")

				rb, err := r.Rollback(ctx, m.job("j", nil, false), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "t"})
				require.ErrorIs(t, err, backfill.ErrRollbackConflict)
				require.Contains(t, err.Error(), fmt.Sprintf("%s (delivered unchanged by batch %d)", m.key(1), rep2.BatchID))
				require.NotContains(t, err.Error(), m.key(2))
				require.Equal(t, want, rb.ConflictRows)
				require.Equal(t, before, dlvState(t, db), "a refused rollback changes nothing")

				// The other order: batch 2, then batch 1.
				rb, err = r.Rollback(ctx, m.job("j", nil, false), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "ann", Why: "t"})
				require.NoError(t, err)
				require.Equal(t, int64(1), rb.Deleted)
				require.Zero(t, rb.Conflicts)
				rb, err = r.Rollback(ctx, m.job("j", nil, false), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "t"})
				require.NoError(t, err)
				require.Equal(t, int64(2), rb.Deleted)
				require.Empty(t, dlvState(t, db))
			})
		}
	}
}

// TestRollbackForcedOverDeliveredRowsReports: Force removes the row a
// later batch delivered and says so, in the report and the audit log.
func TestRollbackForcedOverDeliveredRowsReports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m := dlvModes[0]
	_, err := db.Exec(m.ddl)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep1, err := r.Run(ctx, m.job("j", map[int64]string{1: "same", 2: "old"}, false))
	require.NoError(t, err)
	// Another job on the same target delivers key 1 unchanged.
	rep2, err := r.Run(ctx, m.job("other", map[int64]string{1: "same", 3: "new"}, false))
	require.NoError(t, err)
	rb, err := r.Rollback(ctx, m.job("j", nil, false), backfill.RollbackOptions{BatchID: rep1.BatchID, Force: true, Actor: "ann", Why: "forced"})
	require.NoError(t, err)
	require.Equal(t, int64(2), rb.Deleted)
	require.Equal(t, int64(1), rb.Conflicts)
	require.Equal(t, int64(1), rb.ConflictsDelivered)
	require.Equal(t, []backfill.RollbackConflict{{Key: `{"id": 1}`, Batch: rep2.BatchID, Delivered: true}}, rb.ConflictRows)
	require.Equal(t, []string{`(3,new,2,2)`}, dlvState(t, db))
	events, err := backfill.NewPGManifest("").Events(ctx, db, rep1.BatchID)
	require.NoError(t, err)
	last := events[len(events)-1]
	require.Equal(t, "rollback", last.Kind)
	require.Contains(t, string(last.Detail), `"delivered_overridden": 1`)
	require.Contains(t, string(last.Detail), fmt.Sprintf(`{\"id\": 1} (delivered unchanged by batch %d)`, rep2.BatchID))
}

// TestRollbackKeepsPriorImageALaterBatchDelivered: batch 2 updated key 1
// to 'same', batch 3 delivered 'same' unchanged. Rolling back batch 2 must
// not restore batch 1's 'x' over it; after batch 3 it does.
func TestRollbackKeepsPriorImageALaterBatchDelivered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, m := range []dlvMode{dlvModes[0], dlvModes[2]} { // Upsert, History: the modes that update
		t.Run(m.name, func(t *testing.T) {
			_, err := db.Exec(`DROP TABLE IF EXISTS t; ` + m.ddl)
			require.NoError(t, err)
			r, err := backfill.New(db, nil)
			require.NoError(t, err)
			rep1, err := r.Run(ctx, m.job("j"+m.name, map[int64]string{1: "x"}, false))
			require.NoError(t, err)
			rep2, err := r.Run(ctx, m.job("j"+m.name, map[int64]string{1: "same"}, false))
			require.NoError(t, err)
			require.Equal(t, int64(1), rep2.Counts.Updated)
			rep3, err := r.Run(ctx, m.job("j"+m.name, map[int64]string{1: "same"}, false))
			require.NoError(t, err)
			require.Equal(t, int64(1), rep3.Counts.Unchanged)
			before := dlvState(t, db)

			pv, err := r.Rollback(ctx, m.job("j"+m.name, nil, false), backfill.RollbackOptions{BatchID: rep2.BatchID, Preview: true})
			require.NoError(t, err)
			require.Equal(t, []backfill.RollbackConflict{{Key: m.key(1), Batch: rep3.BatchID, Delivered: true}}, pv.ConflictRows)
			require.Zero(t, pv.Restored, "without Force nothing would be restored")
			_, err = r.Rollback(ctx, m.job("j"+m.name, nil, false), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "a", Why: "t"})
			require.ErrorIs(t, err, backfill.ErrRollbackConflict)
			require.Contains(t, err.Error(), fmt.Sprintf("delivered unchanged by batch %d", rep3.BatchID))
			require.Equal(t, before, dlvState(t, db))

			for _, b := range []int64{rep3.BatchID, rep2.BatchID} {
				_, err = r.Rollback(ctx, m.job("j"+m.name, nil, false), backfill.RollbackOptions{BatchID: b, Actor: "a", Why: "t"})
				require.NoError(t, err)
			}
			var name string
			require.NoError(t, db.Get(&name, `SELECT name FROM t`))
			require.Equal(t, "x", name, "batch 1's image is back")
			_, err = r.Rollback(ctx, m.job("j"+m.name, nil, false), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "a", Why: "t"})
			require.NoError(t, err)
			require.Empty(t, dlvState(t, db))
		})
	}
}

// TestRollbackOfOneChunkKeepsDeliveredRows: chunk-level rollbacks see
// deliveries of the chunk's rows only, and a rolled back delivering chunk
// no longer counts.
func TestRollbackOfOneChunkKeepsDeliveredRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m := dlvModes[0]
	_, err := db.Exec(m.ddl)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep1, err := r.Run(ctx, m.job("j", map[int64]string{1: "a", 6: "b"}, false))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, m.job("j", map[int64]string{6: "b"}, false))
	require.NoError(t, err)
	opts := func(batch int64, chunk string) backfill.RollbackOptions {
		return backfill.RollbackOptions{BatchID: batch, ChunkID: chunk, Actor: "a", Why: "t"}
	}
	rb, err := r.Rollback(ctx, m.job("j", nil, false), opts(rep1.BatchID, "int:0/5"))
	require.NoError(t, err, "batch 2 delivered nothing of chunk [0, 5)")
	require.Equal(t, int64(1), rb.Deleted)
	_, err = r.Rollback(ctx, m.job("j", nil, false), opts(rep1.BatchID, "int:5/10"))
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), fmt.Sprintf(`{"id": 6} (delivered unchanged by batch %d)`, rep2.BatchID))
	require.Equal(t, []string{`(6,b,1,1)`}, dlvState(t, db))
	_, err = r.Rollback(ctx, m.job("j", nil, false), opts(rep2.BatchID, "int:5/10"))
	require.NoError(t, err)
	rb, err = r.Rollback(ctx, m.job("j", nil, false), opts(rep1.BatchID, "int:5/10"))
	require.NoError(t, err)
	require.Equal(t, int64(1), rb.Deleted)
	require.Empty(t, dlvState(t, db))
}

// TestRollbackModuleAndDeliveredRows: a dependent module's later job
// that delivered a parent's rows is rolled back first (the rollback
// cascades to it) and does not block it; a job outside the set does.
func TestRollbackModuleAndDeliveredRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m := dlvModes[0]
	_, err := db.Exec(m.ddl)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, m.job("parent", map[int64]string{1: "a"}, false))
	require.NoError(t, err)
	repC, err := r.Run(ctx, m.job("child", map[int64]string{1: "a", 2: "c"}, false))
	require.NoError(t, err)
	require.Equal(t, int64(1), repC.Counts.Unchanged)
	parent, child := m.job("parent", nil, false), m.job("child", nil, false)

	half := backfill.Graph{Name: "g", Modules: []backfill.Module{{Name: "half", Jobs: []backfill.Job{parent}}}}
	_, err = r.RollbackModule(ctx, half, "half", backfill.RollbackOptions{Actor: "a", Why: "t"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), fmt.Sprintf(`{"id": 1} (delivered unchanged by batch %d)`, repC.BatchID))
	require.Len(t, dlvState(t, db), 2)

	// Rolling back the parent's module cascades to the child's, which
	// depends on it, child first.
	whole := backfill.Graph{Name: "g", Modules: []backfill.Module{{Name: "p", Jobs: []backfill.Job{parent}}, {Name: "c", Jobs: []backfill.Job{child}, DependsOn: []string{"p"}}}}
	reps, err := r.RollbackModule(ctx, whole, "p", backfill.RollbackOptions{Actor: "a", Why: "t"})
	require.NoError(t, err)
	require.Len(t, reps, 2)
	require.Empty(t, dlvState(t, db))
}

// TestDeliveriesAreSummarisedPerChunk: a replay of an unchanged range
// records one summary row per chunk and owner batch, not one per row, and
// a first load none.
func TestDeliveriesAreSummarisedPerChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	var rows [][]any
	for i := range int64(100) {
		rows = append(rows, []any{i, "v", i})
	}
	rep1, err := r.Run(ctx, itemsJob("items", rows))
	require.NoError(t, err)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.delivered`))
	require.Zero(t, n, "a first load summarises nothing")
	rep2, err := r.Run(ctx, itemsJob("items", rows))
	require.NoError(t, err)
	require.Equal(t, int64(100), rep2.Counts.Unchanged)
	var got []string
	require.NoError(t, db.Select(&got, `SELECT format('%s %s %s %s %s', seq, owner, lo, hi, row_count) FROM backfill.delivered WHERE batch_id = $1 ORDER BY seq`, rep2.BatchID))
	require.Len(t, got, 10)
	require.Equal(t, fmt.Sprintf(`3 %d {"id": 30} {"id": 39} 10`, rep1.BatchID), got[3])
}

// TestRollbackSeesDeliveriesOfJobsWithoutUndoLog: a later job that cannot
// be rolled back itself (RollbackNone) still protects the rows it
// delivered from the rollback of the batch that wrote them.
func TestRollbackSeesDeliveriesOfJobsWithoutUndoLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m := dlvModes[0]
	_, err := db.Exec(m.ddl)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep1, err := r.Run(ctx, m.job("j", map[int64]string{1: "same", 2: "old"}, false))
	require.NoError(t, err)
	other := m.job("other", map[int64]string{1: "same"}, false)
	other.Rollback = backfill.RollbackNone
	rep2, err := r.Run(ctx, other)
	require.NoError(t, err)
	_, err = r.Rollback(ctx, m.job("j", nil, false), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "a", Why: "t"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), fmt.Sprintf(`{"id": 1} (delivered unchanged by batch %d)`, rep2.BatchID))
	require.Len(t, dlvState(t, db), 2)
}

// commitOrder makes the chunks of a run commit in reverse plan order: the
// extractor of chunk seq waits until chunk seq+1 has committed (the Hooks'
// ChunkDone), so that at Concurrency 3 the last chunk commits first.
type commitOrder struct {
	mu   sync.Mutex
	done map[int]chan struct{}
}

func (o *commitOrder) ch(seq int) chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done == nil {
		o.done = map[int]chan struct{}{}
	}
	if o.done[seq] == nil {
		o.done[seq] = make(chan struct{})
	}
	return o.done[seq]
}

// reset forgets the chunks of the previous run.
func (o *commitOrder) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = nil
}

func (o *commitOrder) ChunkDone(ctx context.Context, batchID int64, r backfill.ChunkResult) {
	close(o.ch(r.Chunk.Seq))
}

// lateVersionsJob writes, in chunk seq of IntRange(0, chunks, 1), the
// versions of key "k" that versions[seq] lists (valid_from -> value); the
// extractor of a chunk below the last waits for the next one to commit.
func lateVersionsJob(o *commitOrder, chunks int, versions map[int][]time.Time, value string) backfill.Job {
	return backfill.Job{Name: "late", NewRun: true, Chunker: backfill.IntRange(0, int64(chunks), 1),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Seq < chunks-1 {
				select {
				case <-o.ch(c.Seq + 1):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			for _, vf := range versions[c.Seq] {
				if err := w.Write(ctx, "k", vf, fmt.Sprintf("%s@%s", value, vf.Format("01-02"))); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "late", Key: []string{"k"}, Mode: backfill.History, Columns: []string{"k", "valid_from", "v"}}}
}

func lateState(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT row(l.*)::text FROM late l ORDER BY valid_from`))
	return rows
}

// TestRollbackOfHistoryBatchesInReverseOrder: three History batches whose
// chunks each wrote a late version of the same key, committed in reverse
// plan order (so a later chunk of a batch changed the row an earlier chunk
// of the same batch changes again), are rolled back last batch first: each
// rollback succeeds, and the table is back to its state after batch 1,
// lineage included; rolling back batch 2 first is still refused.
func TestRollbackOfHistoryBatchesInReverseOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE late (k text, valid_from timestamptz, valid_to timestamptz, v text,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (k, valid_from))`)
	require.NoError(t, err)
	o := &commitOrder{}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 3, Hooks: o})
	require.NoError(t, err)

	_, err = r.Run(ctx, lateVersionsJob(o, 3, map[int][]time.Time{0: {d(1)}, 2: {d(28)}}, "b1"))
	require.NoError(t, err)
	after1 := lateState(t, db)
	// Batches 2 and 3: each chunk a late version between Jan 1 and Jan 28,
	// splitting the version of Jan 1 again and again.
	o.reset()
	rep2, err := r.Run(ctx, lateVersionsJob(o, 3, map[int][]time.Time{0: {d(4)}, 1: {d(10)}, 2: {d(16)}}, "b2"))
	require.NoError(t, err)
	after2 := lateState(t, db)
	o.reset()
	rep3, err := r.Run(ctx, lateVersionsJob(o, 3, map[int][]time.Time{0: {d(2)}, 1: {d(7), d(12)}, 2: {d(13), d(20)}}, "b3"))
	require.NoError(t, err)

	// Batch 2 under batch 3 is still refused, naming batch 3, and changes
	// nothing.
	after3 := lateState(t, db)
	_, err = r.Rollback(ctx, lateVersionsJob(o, 3, nil, ""), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "t", Why: "t"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), fmt.Sprintf("(changed by batch %d)", rep3.BatchID))
	require.Contains(t, err.Error(), fmt.Sprintf("later batches still applied (batch %d)", rep3.BatchID))
	require.Contains(t, err.Error(), fmt.Sprintf("roll back batch %d first, then this batch, or use Force", rep3.BatchID))
	require.Equal(t, after3, lateState(t, db))
	// Its preview counts what it would do without those rows, and names
	// the batch to roll back first.
	pv, err := r.Rollback(ctx, lateVersionsJob(o, 3, nil, ""), backfill.RollbackOptions{BatchID: rep2.BatchID, Preview: true})
	require.NoError(t, err)
	require.Positive(t, pv.Conflicts)
	require.Equal(t, []int64{rep3.BatchID}, pv.ConflictBatches)

	rb3, err := r.Rollback(ctx, lateVersionsJob(o, 3, nil, ""), backfill.RollbackOptions{BatchID: rep3.BatchID, Actor: "t", Why: "t"})
	require.NoError(t, err, "rollback of batch 3")
	require.Equal(t, backfill.RunRolledBack, rb3.Status)
	if d := cmp.Diff(after2, lateState(t, db)); d != "" {
		t.Fatalf("after rolling back batch 3 (-want +got):\n%s", d)
	}
	rb2, err := r.Rollback(ctx, lateVersionsJob(o, 3, nil, ""), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "t", Why: "t"})
	require.NoError(t, err, "rollback of batch 2")
	require.Equal(t, backfill.RunRolledBack, rb2.Status)
	if d := cmp.Diff(after1, lateState(t, db)); d != "" {
		t.Fatalf("after rolling back batch 2 (-want +got):\n%s", d)
	}
}
