package backfill_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

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

// TestRollbackKeepsRowsALaterBatchDelivered is issue 10 item 6: batch 1
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

// TestRollbackModuleAndDeliveredRows: a module's own later job that
// delivered a parent's rows is rolled back first and does not block it;
// a job outside the module does.
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

	_, err = r.RollbackModule(ctx, "half", []backfill.Job{parent}, backfill.RollbackOptions{Actor: "a", Why: "t"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), fmt.Sprintf(`{"id": 1} (delivered unchanged by batch %d)`, repC.BatchID))
	require.Len(t, dlvState(t, db), 2)

	reps, err := r.RollbackModule(ctx, "whole", []backfill.Job{parent, child}, backfill.RollbackOptions{Actor: "a", Why: "t"})
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
