package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// itemsSetup is a target of items keyed by (tenant, id) and an extractor
// that produces, for ids in [Lo, Hi), rows from a deterministic generator.
type itemsSetup struct {
	db    *sqlx.DB
	calls sync.Map // chunk ID -> *atomic.Int64: Extract calls per chunk
}

func newItems(t *testing.T) *itemsSetup {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE items (
		tenant text NOT NULL,
		id bigint NOT NULL,
		name varchar(12),
		amount numeric(10,2),
		seen_at timestamptz,
		backfill_inserted_by bigint,
		backfill_updated_by bigint,
		PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	return &itemsSetup{db: db}
}

func (s *itemsSetup) count(id string) int64 {
	v, _ := s.calls.LoadOrStore(id, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func (s *itemsSetup) extractor(version int) backfill.Extractor {
	return backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		v, _ := s.calls.LoadOrStore(c.ID, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		for id := c.Lo; id < c.Hi; id++ {
			name := fmt.Sprintf("item-%d", id)
			if version > 1 && id%10 == 0 {
				name = fmt.Sprintf("v%d-%d", version, id)
			}
			if err := w.Write(ctx, "acme", id, name, fmt.Sprintf("%d.%02d", id, id%100), nil); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *itemsSetup) job(version int) backfill.Job {
	return backfill.Job{
		Name:        "items",
		Source:      "test",
		CodeVersion: "v1",
		Chunker:     backfill.IntRange(0, 1000, 100),
		Extractor:   s.extractor(version),
		Target: backfill.Target{
			Table:   "items",
			Key:     []string{"tenant", "id"},
			Columns: []string{"tenant", "id", "name", "amount", "seen_at"},
		},
	}
}

type rowImage struct {
	Tenant string `db:"tenant"`
	ID     int64  `db:"id"`
	Name   string `db:"name"`
	Amount string `db:"amount"`
	Ctid   string `db:"ctid"`
	Xmin   string `db:"xmin"`
}

func snapshot(t *testing.T, db *sqlx.DB) []rowImage {
	t.Helper()
	var rows []rowImage
	require.NoError(t, db.Select(&rows, `SELECT tenant, id, coalesce(name, '') AS name, coalesce(amount::text, '') AS amount,
		ctid::text AS ctid, xmin::text AS xmin FROM items ORDER BY tenant, id`))
	return rows
}

func manifestChunks(t *testing.T, db *sqlx.DB, batch int64) []backfilltype.ChunkState {
	t.Helper()
	cs, err := backfill.NewPGManifest("").Chunks(context.Background(), db, batch)
	require.NoError(t, err)
	return cs
}

func TestRunLoadsResumesAndReplaysWithoutWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 3})
	require.NoError(t, err)

	rep, err := r.Run(ctx, s.job(1))
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 10, rep.ChunksTotal)
	require.Equal(t, 10, rep.ChunksRun)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts)
	for _, c := range manifestChunks(t, s.db, rep.BatchID) {
		require.Equal(t, backfill.ChunkDone, c.Status, c.Chunk.ID)
		require.True(t, c.Balanced(), "%s: %+v", c.Chunk.ID, c.Counts)
		require.Equal(t, int64(100), c.Read)
	}
	first := snapshot(t, s.db)
	require.Len(t, first, 1000)
	require.Equal(t, rowImage{Tenant: "acme", ID: 42, Name: "item-42", Amount: "42.42"}, rowImage{Tenant: first[42].Tenant, ID: first[42].ID, Name: first[42].Name, Amount: first[42].Amount})

	// Same job again: the completed plan is not extracted again.
	rep2, err := r.Run(ctx, s.job(1))
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted)
	require.False(t, rep2.Resumed)
	require.Equal(t, rep.BatchID, rep2.BatchID)
	require.Equal(t, 0, rep2.ChunksRun)
	require.Equal(t, int64(1), s.count("int:0/100"))

	// An explicit new run replays everything and writes nothing.
	job := s.job(1)
	job.NewRun = true
	rep3, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.NotEqual(t, rep.BatchID, rep3.BatchID)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep3.Counts)
	if d := cmp.Diff(first, snapshot(t, s.db)); d != "" {
		t.Fatalf("replay rewrote rows (ctid/xmin changed) (-want +got):\n%s", d)
	}

	// A changed source updates exactly the changed rows.
	job = s.job(2)
	job.NewRun = true
	rep4, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1000, Updated: 100, Unchanged: 900}, rep4.Counts)
}

func TestPlanChangeIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, s.job(1))
	require.NoError(t, err)

	job := s.job(1)
	job.CodeVersion = "v2"
	job.Chunker = backfill.IntRange(0, 2000, 100)
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrPlanChanged)
	require.Contains(t, err.Error(), `code_version: "v1" -> "v2"`)
	require.Contains(t, err.Error(), "chunks: 10 -> 20")

	job.NewRun = true
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2000, Inserted: 1000, Unchanged: 1000}, rep.Counts)
}

func TestResumeSkipsCompletedChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 1})
	require.NoError(t, err)
	boom := errors.New("source unavailable")
	var fail atomic.Bool
	fail.Store(true)
	job := s.job(1)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo == 500 && fail.Load() {
			// Write some rows first: they must roll back with the chunk.
			_ = w.Write(ctx, "acme", int64(500), "partial", "1.00", nil)
			return boom
		}
		return inner.Extract(ctx, c, w)
	})
	rep, err := r.Run(ctx, job)
	var pe *backfill.PartialError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, boom)
	require.Equal(t, backfill.RunFailed, rep.Status)
	require.Equal(t, 5, rep.ChunksDone)
	require.Equal(t, "int:500/600", pe.Failed.Chunk.ID)
	var n int
	require.NoError(t, s.db.Get(&n, `SELECT count(*) FROM items`))
	require.Equal(t, 500, n, "the failed chunk's rows rolled back")
	cs := manifestChunks(t, s.db, rep.BatchID)
	require.Equal(t, backfill.ChunkFailed, cs[5].Status)
	require.Contains(t, cs[5].LastError, "source unavailable")
	require.Equal(t, 1, cs[5].Attempts)

	fail.Store(false)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, 5, rep.ChunksRun)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts)
	for i := range 10 {
		// The failing attempt of chunk 5 never reached the inner extractor.
		require.Equal(t, int64(1), s.count(fmt.Sprintf("int:%d/%d", i*100, i*100+100)), "chunk %d extracted once", i)
	}
}

func TestBadRowsGoToTheExceptionQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	job := s.job(1)
	job.Chunker = backfill.IntRange(0, 1, 1)
	job.MaxRunRejectRate = -1 // the rejects are what the test is about
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		rows := [][]any{
			{"acme", int64(1), "ok", "1.00", nil},
			{"acme", "x", "wrong type", "1.00", nil},
			{nil, int64(2), "no tenant", "1.00", nil},
			{"acme", int64(3), "nul\x00byte", "1.00", nil},
			{"acme", int64(4), "bad\xffutf8", "1.00", nil},
			{"acme", int64(5), "much too long for twelve", "1.00", nil},
			{"acme", int64(6), "overflow", "123456789.00", nil},
			{"acme", int64(7), "no zone", "1.00", "2024-01-01 00:00:00"},
			{"acme", int64(9), "ok too", nil, nil},
		}
		for _, row := range rows {
			if err := w.Write(ctx, row...); err != nil {
				return err
			}
		}
		return w.Reject(ctx, map[string]any{"line": "garbage"}, "", "unparseable line")
	})
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 10, Inserted: 2, Rejected: 8}, rep.Counts)
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	type got struct {
		Row                   int64
		Column, Value, Reason string
	}
	var gots []got
	for _, e := range ex {
		require.Equal(t, "int:0/1", e.ChunkID)
		gots = append(gots, got{e.Row, e.Column, e.Value, e.Reason})
	}
	want := []got{
		{2, "id", "x", "invalid input syntax for type bigint"},
		{3, "tenant", "NULL", "missing key column: NULL business key value"},
		{4, "name", `"nul\x00byte"`, "text contains a NUL byte"},
		{5, "name", `"bad\xffutf8"`, "text is not valid UTF-8"},
		{6, "name", "much too long for twelve", `value too long: character varying(12) column "name" holds at most 12 characters, got 24`},
		{7, "amount", "123456789.00", `numeric field overflow: numeric(10,2) column "amount" holds at most 99999999.99 in absolute value`},
		{8, "seen_at", "2024-01-01 00:00:00", "invalid timestamptz: accepted forms are YYYY-MM-DD[ |T]HH:MM[:SS[.ffffff]] (four or more year digits, optional AD/BC) followed by a zone: " +
			"Z, an offset ±HH[:MM[:SS]], or an IANA name (America/New_York); and infinity, -infinity, epoch. Without a zone the text would be read in the session's TimeZone; " +
			"abbreviations (PST) depend on timezone_abbreviations and are refused"},
		{10, "", "", "unparseable line"},
	}
	if d := cmp.Diff(want, gots); d != "" {
		t.Fatalf("exceptions (-want +got):\n%s", d)
	}
	require.JSONEq(t, `{"line":"garbage"}`, string(ex[len(ex)-1].Raw))
	require.JSONEq(t, `{"tenant":"acme","id":"x","name":"wrong type","amount":"1.00","seen_at":null}`, string(ex[0].Raw))
}

func TestDuplicateKeysInAChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, policy := range []backfill.DuplicatePolicy{backfill.KeepLast, backfill.KeepFirst} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			s := newItems(t)
			r, err := backfill.New(s.db, nil)
			require.NoError(t, err)
			job := s.job(1)
			job.Target.Duplicates = policy
			job.Chunker = backfill.IntRange(0, 1, 1)
			job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for _, name := range []string{"first", "second", "third"} {
					if err := w.Write(ctx, "acme", int64(1), name, "1.00", nil); err != nil {
						return err
					}
				}
				return w.Write(ctx, "acme", int64(2), "alone", "1.00", nil)
			})
			rep, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 4, Inserted: 2, Deduplicated: 2}, rep.Counts)
			var name string
			require.NoError(t, s.db.Get(&name, `SELECT name FROM items WHERE id = 1`))
			want := map[backfill.DuplicatePolicy]string{backfill.KeepLast: "third", backfill.KeepFirst: "first"}[policy]
			require.Equal(t, want, name)
		})
	}
}

func TestTargetWithoutUniqueKeyIsRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE SCHEMA sales; CREATE TABLE sales.order_lines (source_system text, order_no text, line_no int, qty int)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(context.Background(), backfill.Job{
		Name: "ol", Chunker: backfill.IntRange(0, 10, 5),
		Extractor: backfill.ExtractorFunc(func(context.Context, backfill.Chunk, backfill.RowWriter) error { return nil }),
		Target:    backfill.Target{Table: "sales.order_lines", Key: []string{"source_system", "order_no", "line_no"}},
	})
	require.ErrorIs(t, err, backfill.ErrNoUniqueKey)
	require.Contains(t, err.Error(), `table "sales.order_lines" key (source_system, order_no, line_no)`)
}

func TestConcurrentRunnersClaimEachChunkOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	var wg sync.WaitGroup
	reps := make([]backfill.Report, 3)
	errs := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := backfill.New(s.db, &backfill.Config{Concurrency: 2, WorkerID: fmt.Sprintf("w%d", i)})
			if err != nil {
				errs[i] = err
				return
			}
			reps[i], errs[i] = r.Run(ctx, s.job(1))
		}()
	}
	wg.Wait()
	total := 0
	for i := range 3 {
		if errs[i] != nil {
			// A runner that started after the others completed the run
			// did nothing, and says so.
			require.ErrorIs(t, errs[i], backfill.ErrAlreadyCompleted)
			require.Zero(t, reps[i].ChunksRun)
		}
		total += reps[i].ChunksRun
		require.Equal(t, reps[0].BatchID, reps[i].BatchID)
	}
	require.Equal(t, 10, total)
	var ids []string
	s.calls.Range(func(k, v any) bool {
		require.Equal(t, int64(1), v.(*atomic.Int64).Load(), k)
		ids = append(ids, k.(string))
		return true
	})
	sort.Strings(ids)
	require.Len(t, ids, 10)
	var status string
	require.NoError(t, s.db.Get(&status, `SELECT status FROM backfill.runs WHERE batch_id = $1`, reps[0].BatchID))
	require.Equal(t, "completed", status)
	require.True(t, strings.HasPrefix(ids[0], "int:"))
}
