package backfill_test

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
)

// skipSource is a source of items rows (tenant "acme", ids 0..999) whose
// rows tests edit between replays; rows with a bad amount are rejected
// by the row writer.
type skipSource struct {
	mu   sync.Mutex
	rows map[int64][2]string // id -> name, amount
}

func newSkipSource() *skipSource {
	s := &skipSource{rows: map[int64][2]string{}}
	for id := range int64(1000) {
		s.rows[id] = [2]string{fmt.Sprintf("item-%d", id), fmt.Sprintf("%d.%02d", id, id%100)}
	}
	return s
}

func (s *skipSource) set(id int64, name, amount string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rows[id] = [2]string{name, amount}
}

func (s *skipSource) extractor() backfill.Extractor {
	return backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		s.mu.Lock()
		ids := slices.Sorted(maps.Keys(s.rows))
		rows := maps.Clone(s.rows)
		s.mu.Unlock()
		for _, id := range ids {
			if id < c.Lo || id >= c.Hi {
				continue
			}
			if err := w.Write(ctx, "acme", id, rows[id][0], rows[id][1], nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// skipJob is the items job chunked by id (ChunkColumn), with
// SkipUnchanged, a new run each call.
func skipJob(src *skipSource) backfill.Job {
	return backfill.Job{
		Name: "items", Source: "test", CodeVersion: "v1",
		Chunker:   backfill.IntRange(0, 1000, 100),
		Extractor: src.extractor(),
		Target: backfill.Target{Table: "items", Key: []string{"tenant", "id"},
			Columns: []string{"tenant", "id", "name", "amount", "seen_at"}},
		ChunkColumn:   "id",
		SkipUnchanged: true,
		NewRun:        true,
	}
}

// skipHooks records each chunk's result by ID.
type skipHooks struct {
	mu  sync.Mutex
	res map[string]backfill.ChunkResult
}

func (h *skipHooks) ChunkDone(_ context.Context, _ int64, r backfill.ChunkResult) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.res == nil {
		h.res = map[string]backfill.ChunkResult{}
	}
	h.res[r.Chunk.ID] = r
}

func (h *skipHooks) ChunkFailed(context.Context, int64, backfill.ChunkError) {}

// merged returns the chunks merged (not skipped) since the last call, in
// order, and forgets them all.
func (h *skipHooks) merged() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []string
	for id, r := range h.res {
		if !r.Skipped {
			ids = append(ids, id)
		}
	}
	h.res = nil
	slices.Sort(ids)
	return ids
}

// sourceRows are the target rows the source says, as snapshot shows them.
func (s *skipSource) image() []rowImage {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []rowImage
	for _, id := range slices.Sorted(maps.Keys(s.rows)) {
		out = append(out, rowImage{Tenant: "acme", ID: id, Name: s.rows[id][0], Amount: s.rows[id][1]})
	}
	return out
}

func contentOf(rows []rowImage) []rowImage {
	out := make([]rowImage, len(rows))
	for i, r := range rows {
		out[i] = rowImage{Tenant: r.Tenant, ID: r.ID, Name: r.Name, Amount: r.Amount}
	}
	return out
}

// requireBalanced checks every chunk of batch balances.
func requireBalanced(t *testing.T, db *sqlx.DB, batch int64) {
	t.Helper()
	for _, c := range manifestChunks(t, db, batch) {
		require.True(t, c.Balanced(), "%s: %+v", c.Chunk.ID, c.Counts)
	}
}

func TestSkipUnchangedReplaySkipsEveryChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, path := range []string{"leased", "leased, extract ahead"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			s := newItems(t)
			src := newSkipSource()
			cfg := &backfill.Config{Concurrency: 2, ExtractAhead: path == "leased, extract ahead"}
			job := skipJob(src)
			r, err := backfill.New(s.db, cfg)
			require.NoError(t, err)
			rep1, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep1.Counts)
			require.Zero(t, rep1.ChunksSkipped)
			// Settled: no autovacuum nor hint bits write the target's
			// pages during the replay.
			_, err = s.db.Exec(`ALTER TABLE items SET (autovacuum_enabled = off)`)
			require.NoError(t, err)
			_, err = s.db.Exec(`VACUUM (FREEZE) items`)
			require.NoError(t, err)
			first := snapshot(t, s.db)

			walBefore := walMark(t, s.db)
			rep2, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, 10, rep2.ChunksSkipped)
			require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep2.Counts)
			requireBalanced(t, s.db, rep2.BatchID)
			// No target row was written: same versions (xmin) in the same
			// places (ctid).
			if d := cmp.Diff(first, snapshot(t, s.db)); d != "" {
				t.Fatalf("a skipped replay rewrote rows (-want +got):\n%s", d)
			}
			// Nor any page of the target or its index: no WAL record
			// since the replay began names their files (pg_walinspect).
			require.Zero(t, targetWAL(t, s.db, walBefore), "WAL records of the target written by the skipped replay")

			// A third replay skips again: the skipped chunks recorded the
			// fingerprints anew.
			rep3, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, 10, rep3.ChunksSkipped)
		})
	}
}

// walMark returns the current WAL insert position and keeps the WAL from
// before it until the test ends (a physical replication slot reserving it,
// dropped at cleanup): on the shared test server, parallel tests write
// enough WAL for a checkpoint to remove the segments targetWAL reads
// ("requested WAL segment ... has already been removed").
func walMark(t *testing.T, db *sqlx.DB) string {
	t.Helper()
	name := fmt.Sprintf("walmark_%d", rand.Int64())
	// The slot keeps the WAL from the last checkpoint's redo pointer on;
	// the mark is the insert position after it.
	_, err := db.Exec(`SELECT pg_create_physical_replication_slot($1, true)`, name)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`SELECT pg_drop_replication_slot($1)`, name) })
	var lsn string
	require.NoError(t, db.Get(&lsn, `SELECT pg_current_wal_lsn()::text`))
	return lsn
}

// targetWAL counts the WAL records since lsn that name a block of items
// or of its primary key's index and change rows: inserts, updates,
// deletes and locks, not a vacuum's freezing or pruning (a vacuum of
// another test's may freeze pages whose rows it could not freeze before),
// nor a hint bit's page image.
func targetWAL(t *testing.T, db *sqlx.DB, lsn string) int {
	t.Helper()
	_, err := db.Exec(`CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	require.NoError(t, err)
	// Up to the WAL written so far, once flushed (the WAL writer flushes
	// asynchronous commits within wal_writer_delay).
	var end string
	require.NoError(t, db.Get(&end, `SELECT pg_current_wal_lsn()::text`))
	require.Eventually(t, func() bool {
		var ok bool
		return db.Get(&ok, `SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn`, end) == nil && ok
	}, 30*time.Second, 10*time.Millisecond)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) w
		WHERE EXISTS (SELECT 1 FROM unnest(ARRAY[pg_relation_filenode('items'), pg_relation_filenode('items_pkey')]) f
			WHERE w.block_ref LIKE '%rel %/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/' || f || ' %')
		AND NOT (w.resource_manager = 'Heap2' AND w.record_type IN ('FREEZE_PAGE', 'PRUNE', 'VACUUM', 'VISIBLE'))
		AND w.resource_manager <> 'XLOG'`, lsn, end))
	if n > 0 {
		// Which transactions wrote them, and did they commit: enough to
		// tell a skipped chunk's write from another's.
		var recs []string
		_ = db.Select(&recs, `SELECT start_lsn || ' xid ' || w.xid || ' (' || coalesce(pg_xact_status(w.xid::text::xid8), '?') || ') ' || resource_manager || ' ' || record_type || ' ' || coalesce(description, '') || ' ' || coalesce(block_ref, '')
			FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) w
			WHERE block_ref LIKE '%rel %/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/' || pg_relation_filenode('items') || ' %' LIMIT 10`, lsn, end)
		var xacts []string
		_ = db.Select(&xacts, `SELECT DISTINCT w.xid || ' ' || coalesce(pg_xact_status(w.xid::text::xid8), '?') FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) w
			WHERE block_ref LIKE '%rel %/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/' || pg_relation_filenode('items') || ' %'`, lsn, end)
		t.Logf("target WAL records since %s: %q; their transactions: %q", lsn, recs, xacts)
	}
	return n
}

func TestSkipUnchangedMergesExactlyTheChangedChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	hooks := &skipHooks{}
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 2, Hooks: hooks})
	require.NoError(t, err)
	job := skipJob(src)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	hooks.merged()

	// A changed source row (chunk 300), a target row updated (chunk 500),
	// deleted (chunk 600) and inserted (chunk 700, a key the source does
	// not have) by another session inside the chunks' bounds.
	src.set(321, "changed", "1.00")
	_, err = s.db.Exec(`UPDATE items SET name = 'tampered' WHERE id = 555;
		DELETE FROM items WHERE id = 666;
		INSERT INTO items (tenant, id, name) VALUES ('other', 777, 'extra')`)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, []string{"int:300/400", "int:500/600", "int:600/700", "int:700/800"}, hooks.merged())
	require.Equal(t, 6, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1, Updated: 2, Unchanged: 997}, rep.Counts)
	requireBalanced(t, s.db, rep.BatchID)
	got := snapshot(t, s.db)
	want := append([]rowImage{{Tenant: "other", ID: 777, Name: "extra"}}, src.image()...)
	slices.SortStableFunc(want, func(a, b rowImage) int { return strings.Compare(a.Tenant, b.Tenant) })
	if d := cmp.Diff(want, contentOf(got)); d != "" {
		t.Fatalf("target after the replay (-want +got):\n%s", d)
	}

	// The merged chunks recorded their fingerprints anew: the next replay
	// skips them, but chunk 700 holds a row the source does not have (it
	// recorded none) and merges again.
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, []string{"int:700/800"}, hooks.merged())
	require.Equal(t, 9, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)
}

func TestSkipUnchangedRollbacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	job := skipJob(src)
	rep1, err := r.Run(ctx, job)
	require.NoError(t, err)
	first := snapshot(t, s.db)
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep2.ChunksSkipped)

	// The skipped chunks delivered batch 1's rows unchanged: a rollback
	// of batch 1 reports them, as it would after a merge.
	pv, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep1.BatchID, Preview: true})
	require.NoError(t, err)
	require.Equal(t, int64(1000), pv.ConflictsDelivered)

	// A rollback of the skipped replay deletes nothing batch 1 wrote.
	rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	require.Zero(t, rb.Deleted)
	require.Zero(t, rb.Restored)
	if d := cmp.Diff(first, snapshot(t, s.db)); d != "" {
		t.Fatalf("rolling back a skipped replay changed the target (-want +got):\n%s", d)
	}

	// Now batch 1 rolls back (its rows are gone): a replay merges every
	// chunk, nothing skips on a rolled back base.
	rb, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	require.Equal(t, int64(1000), rb.Deleted)
	rep3, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Zero(t, rep3.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep3.Counts)

	// A base whose rows were restored as they were by a rollback of a
	// later batch: batch 4 changes a row, its rollback restores it. The
	// restored row is a new row version, so its chunk merges once (it
	// writes nothing: the values are the source's) and records it; the
	// other chunks skip on batch 3's fingerprints.
	src.set(5, "v4", "5.05")
	rep4, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 9, rep4.ChunksSkipped)
	_, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep4.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	src.set(5, "item-5", "5.05")
	rep5, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 9, rep5.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep5.Counts)
	rep6, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep6.ChunksSkipped)
	if d := cmp.Diff(src.image(), contentOf(snapshot(t, s.db))); d != "" {
		t.Fatalf("target (-want +got):\n%s", d)
	}
}

func TestSkipUnchangedQueuesASkippedChunksRejects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	src.set(42, "bad", "not a number")
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	job := skipJob(src)
	job.Validators = []backfill.Validator{backfill.Completeness{CompareContent: true}, backfill.CheckExceptionRate{MaxRate: 0.5}}
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped)
	// Completeness is proven by the fingerprints, CheckExceptionRate ran.
	require.Equal(t, 20, rep.ChecksPassed)
	vs, err := backfill.NewPGManifest("").Validations(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	for _, v := range vs {
		if v.Check == "completeness" {
			require.Contains(t, string(v.Detail), `"skipped": true`)
		} else {
			require.Contains(t, v.Actual, "of 100 rows rejected")
		}
	}
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 999, Rejected: 1}, rep.Counts)
	requireBalanced(t, s.db, rep.BatchID)
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, 1)
	require.Equal(t, "int:0/100", ex[0].ChunkID)
	require.Equal(t, int64(43), ex[0].Row)
	require.Equal(t, "amount", ex[0].Column)

	// CheckExceptionRate judges a skipped chunk: its gate fails.
	job.Validators[1] = backfill.CheckExceptionRate{MaxRate: 0.001}
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.ErrorContains(t, err, "1 of 100 rows rejected")
}

func TestSkipUnchangedOffChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	job := skipJob(src)
	job.SkipUnchanged = false
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Zero(t, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)
	// Nothing recorded: turning the option on later merges once.
	var n int
	require.NoError(t, s.db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE source_fingerprint IS NOT NULL OR target_fingerprint IS NOT NULL`))
	require.Zero(t, n)
	job.SkipUnchanged = true
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Zero(t, rep.ChunksSkipped)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped)
}

func TestSkipUnchangedRefusesAnIneligibleJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	for name, c := range map[string]struct {
		edit func(*backfill.Job)
		want error
		says string
	}{
		"TargetWins":   {func(j *backfill.Job) { j.Target.Conflict = backfill.TargetWins }, backfill.ErrInvalidConfig, "target_wins"},
		"PublishAtEnd": {func(j *backfill.Job) { j.Publish.Mode = backfill.PublishAtEnd }, backfill.ErrInvalidConfig, "at_end"},
		"referential": {func(j *backfill.Job) {
			j.Validators = []backfill.Validator{backfill.ReferentialIntegrity{Columns: []string{"id"}, ParentTable: "items"}}
		}, backfill.ErrInvalidConfig, "ReferentialIntegrity"},
		"a validatorfunc": {func(j *backfill.Job) { j.Validators = []backfill.Validator{backfill.ValidatorFunc(nil)} }, backfill.ErrInvalidConfig, "ValidatorFunc"},
	} {
		job := skipJob(src)
		job.Name = "ineligible"
		c.edit(&job)
		_, err := r.Run(ctx, job)
		require.ErrorIs(t, err, c.want, name)
		require.ErrorContains(t, err, c.says, name)
		require.ErrorContains(t, err, "SkipUnchanged", name)
	}
	// Nothing ran.
	var n int
	require.NoError(t, s.db.Get(&n, `SELECT count(*) FROM backfill.runs WHERE job_name = 'ineligible'`))
	require.Zero(t, n)
	// A manifest without ManifestSkips: unsupported.
	pm := backfill.NewPGManifest("")
	r, err = backfill.New(s.db, &backfill.Config{Manifest: manifestOnly{pm, pm}})
	require.NoError(t, err)
	job := skipJob(src)
	job.Rollback = backfill.RollbackNone
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrUnsupported)
	require.ErrorContains(t, err, "ManifestSkips")
}

// TestSkipUnchangedProperty edits the source and the target at random
// between replays with SkipUnchanged: after each replay the target's rows
// are the source's (rows another session inserted under another tenant
// stay), every chunk balances, and a chunk is skipped exactly when
// neither its source rows nor its target rows changed since the last
// replay and its bounds hold only its own rows.
func TestSkipUnchangedProperty(t *testing.T) {
	t.Parallel()
	s := newItems(t)
	ctx := context.Background()
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		_, err := s.db.Exec(`TRUNCATE items`)
		require.NoError(rt, err)
		src := &skipSource{rows: map[int64][2]string{}}
		for id := range int64(20) {
			src.rows[id] = [2]string{"a", "1.00"}
		}
		job := skipJob(src)
		// With a ChunkVersioner (replay_skip_version.go) or without: the
		// same chunks merge; with one, a chunk is extracted only when
		// merged or its version changed (its source edited, even to the
		// same value).
		vsrc := &versionedSource{skipSource: src, size: 10, gen: map[int64]int{}}
		versioned := rapid.Bool().Draw(rt, "versioned")
		if versioned {
			job.Extractor = vsrc
		}
		job.Name = fmt.Sprintf("prop-%d", iteration)
		job.Chunker = backfill.IntRange(0, 20, 10)
		hooks := &skipHooks{}
		// Without the undo log: fewer statements per run.
		job.Rollback = backfill.RollbackNone
		r, err := backfill.New(s.db, &backfill.Config{Hooks: hooks})
		require.NoError(rt, err)
		chunkOf := func(id int64) string { return fmt.Sprintf("int:%d/%d", id/10*10, id/10*10+10) }
		// content per chunk of the source and the target, as text.
		images := func() (map[string]string, map[string]string) {
			si, ti := map[string]string{}, map[string]string{}
			for _, row := range src.image() {
				si[chunkOf(row.ID)] += fmt.Sprintf("%d=%s/%s;", row.ID, row.Name, row.Amount)
			}
			for _, row := range contentOf(snapshot(t, s.db)) {
				ti[chunkOf(row.ID)] += fmt.Sprintf("%s.%d=%s/%s;", row.Tenant, row.ID, row.Name, row.Amount)
			}
			return si, ti
		}
		foreign := map[string]bool{} // chunks whose bounds hold another tenant's row
		var written map[string]bool  // chunks whose target rows a round's edits wrote
		var lastSrc, lastTgt map[string]string
		var lastGen map[int64]int
		for round := range rapid.IntRange(1, 3).Draw(rt, "rounds") {
			written = map[string]bool{}
			for range rapid.IntRange(0, 3).Draw(rt, "edits") {
				id := rapid.Int64Range(0, 19).Draw(rt, "id")
				v := rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "value")
				var res sql.Result
				switch rapid.IntRange(0, 3).Draw(rt, "edit") {
				case 0:
					vsrc.set(id, v, "1.00")
				case 1:
					res, err = s.db.Exec(`UPDATE items SET name = $1 WHERE tenant = 'acme' AND id = $2`, v, id)
				case 2:
					res, err = s.db.Exec(`DELETE FROM items WHERE tenant = 'acme' AND id = $1`, id)
				case 3:
					res, err = s.db.Exec(`INSERT INTO items (tenant, id, name) VALUES ('zz', $1, $2) ON CONFLICT DO NOTHING`, id, v)
					foreign[chunkOf(id)] = true
				}
				require.NoError(rt, err)
				if res != nil {
					// A row written, even with its own values: a new row
					// version (the target fingerprint of a heap table).
					if n, err := res.RowsAffected(); err == nil && n > 0 {
						written[chunkOf(id)] = true
					}
				}
			}
			si, ti := images()
			vsrc.mu.Lock()
			gens := maps.Clone(vsrc.gen)
			vsrc.mu.Unlock()
			rep, err := r.Run(ctx, job)
			require.NoError(rt, err)
			requireBalanced(t, s.db, rep.BatchID)
			require.Equal(rt, int64(20), rep.Counts.Read)
			merged := hooks.merged()
			for _, c := range []string{"int:0/10", "int:10/20"} {
				skip := round > 0 && si[c] == lastSrc[c] && ti[c] == lastTgt[c] && !foreign[c] && !written[c]
				require.Equal(rt, !skip, slices.Contains(merged, c), "round %d chunk %s merged %v", round, c, merged)
			}
			if versioned {
				extracted, _ := vsrc.calls()
				for i, c := range []string{"int:0/10", "int:10/20"} {
					changed := round == 0 || gens[int64(i)] != lastGen[int64(i)]
					want := slices.Contains(merged, c) || changed
					require.Equal(rt, want, slices.Contains(extracted, c), "round %d chunk %s extracted %v merged %v", round, c, extracted, merged)
				}
			}
			lastGen = gens
			var acme []rowImage
			for _, row := range contentOf(snapshot(t, s.db)) {
				if row.Tenant == "acme" {
					acme = append(acme, row)
				}
			}
			require.Equal(rt, src.image(), acme)
			lastSrc, lastTgt = images()
		}
	})
}

// Without ChunkColumn the target side is the target rows of the chunk's
// identities (the spooled rows' keys): a row of another key inserted
// among them does not concern the chunk, whose merge would not touch it.
func TestSkipUnchangedWithoutChunkColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	hooks := &skipHooks{}
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 2, Hooks: hooks})
	require.NoError(t, err)
	job := skipJob(src)
	job.ChunkColumn = ""
	rep1, err := r.Run(ctx, job)
	require.NoError(t, err)
	hooks.merged()
	first := snapshot(t, s.db)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)
	require.Empty(t, hooks.merged())
	if d := cmp.Diff(first, snapshot(t, s.db)); d != "" {
		t.Fatalf("a skipped replay rewrote rows (-want +got):\n%s", d)
	}
	pv, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep1.BatchID, Preview: true})
	require.NoError(t, err)
	require.Equal(t, int64(1000), pv.ConflictsDelivered, "the skipped chunks summarised their deliveries")

	src.set(321, "changed", "1.00")
	_, err = s.db.Exec(`UPDATE items SET name = 'tampered' WHERE id = 555;
		DELETE FROM items WHERE id = 666;
		INSERT INTO items (tenant, id, name) VALUES ('other', 777, 'extra')`)
	require.NoError(t, err)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, []string{"int:300/400", "int:500/600", "int:600/700"}, hooks.merged())
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1, Updated: 2, Unchanged: 997}, rep.Counts)
	requireBalanced(t, s.db, rep.BatchID)
	want := append(src.image(), rowImage{Tenant: "other", ID: 777, Name: "extra"})
	if d := cmp.Diff(want, contentOf(snapshot(t, s.db))); d != "" {
		t.Fatalf("target after the replay (-want +got):\n%s", d)
	}
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped)
}

// TestSkipUnchangedAcrossScopes: a chunk's base is looked up by job,
// chunk ID and the plan's skip key, not the plan fingerprint (which
// covers the scope and every chunk ID): a replay of part of the loaded
// range, or of the range extended by new chunks, skips the loaded
// chunks and merges the new one; a run planned otherwise (another code
// version, column list or target column type) skips nothing.
func TestSkipUnchangedAcrossScopes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	hooks := &skipHooks{}
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 2, Hooks: hooks})
	require.NoError(t, err)
	job := skipJob(src)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	hooks.merged()

	half := job
	half.Chunker = backfill.IntRange(0, 500, 100)
	rep, err := r.Run(ctx, half)
	require.NoError(t, err)
	require.Equal(t, 5, rep.ChunksSkipped, "the loaded chunks of the first half")
	require.Empty(t, hooks.merged())

	for id := int64(1000); id < 1100; id++ {
		src.set(id, fmt.Sprintf("item-%d", id), "1.00")
	}
	more := job
	more.Chunker = backfill.IntRange(0, 1100, 100)
	rep, err = r.Run(ctx, more)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped, "the loaded chunks")
	require.Equal(t, []string{"int:1000/1100"}, hooks.merged(), "the new chunk")
	require.Equal(t, backfill.Counts{Read: 1100, Inserted: 100, Unchanged: 1000}, rep.Counts)
	require.Equal(t, src.image(), contentOf(snapshot(t, s.db)))

	// Planned otherwise: no base. (Item 5's amount has more decimals
	// than the target's column keeps.)
	src.set(5, "item-5", "5.005")
	code := more
	code.CodeVersion = "v2"
	cols := more
	cols.Target.Columns = []string{"tenant", "id", "name", "amount"}
	cols.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return more.Extractor.Extract(ctx, c, dropLast{w})
	})
	for name, j := range map[string]backfill.Job{"code version": code, "columns": cols} {
		rep, err = r.Run(ctx, j)
		require.NoError(t, err, name)
		require.Zero(t, rep.ChunksSkipped, name)
		require.Len(t, hooks.merged(), 11, name)
	}
	// The target's column type changed since the last load (the same
	// source value may land otherwise): no base either.
	rep, err = r.Run(ctx, cols)
	require.NoError(t, err)
	require.Equal(t, 11, rep.ChunksSkipped, "the same plan skips")
	hooks.merged()
	_, err = s.db.Exec(`ALTER TABLE items ALTER COLUMN amount TYPE numeric(10,3)`)
	require.NoError(t, err)
	rep, err = r.Run(ctx, cols)
	require.NoError(t, err)
	require.Zero(t, rep.ChunksSkipped, "another target column type")
	var amount string
	require.NoError(t, s.db.Get(&amount, `SELECT amount::text FROM items WHERE id = 5`))
	require.Equal(t, "5.005", amount)
}

// dropLast is a RowWriter that writes each row without its last value.
type dropLast struct{ backfill.RowWriter }

func (d dropLast) Write(ctx context.Context, values ...any) error {
	return d.RowWriter.Write(ctx, values[:len(values)-1]...)
}
