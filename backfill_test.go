package backfill_test

import (
	"bytes"
	stdcmp "cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
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
		{2, "id", "x", "invalid input syntax for type bigint: value x"},
		{3, "tenant", "NULL", "missing key column: NULL business key value"},
		{4, "name", `"nul\x00byte"`, `text contains a NUL byte: value "nul\x00byte"`},
		{5, "name", `"bad\xffutf8"`, `text is not valid UTF-8: value "bad\xffutf8"`},
		{6, "name", "much too long for twelve", `value too long: character varying(12) column "name" holds at most 12 characters, got 24: value much too long for twelve`},
		{7, "amount", "123456789.00", `numeric field overflow: numeric(10,2) column "amount" holds at most 99999999.99 in absolute value: value 123456789.00`},
		{8, "seen_at", "2024-01-01 00:00:00", "invalid timestamptz: accepted forms are YYYY-MM-DD[ |T]HH:MM[:SS[.ffffff]] (four or more year digits, optional AD/BC) followed by a zone: " +
			"Z, an offset ±HH[:MM[:SS]], or an IANA name (America/New_York); and infinity, -infinity, epoch. Without a zone the text would be read in the session's TimeZone; " +
			"abbreviations (PST) depend on timezone_abbreviations and are refused: value 2024-01-01 00:00:00"},
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
	var logs lockedBuffer
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := backfill.New(s.db, &backfill.Config{Concurrency: 2, WorkerID: fmt.Sprintf("w%d", i),
				Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
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
		requireExtractedOnce(t, k.(string), v.(*atomic.Int64).Load(), &logs)
		ids = append(ids, k.(string))
		return true
	})
	sort.Strings(ids)
	require.Len(t, ids, 10)
	// Merged once each: the target holds each chunk's rows once, every
	// chunk done on its first attempt or after retries that rolled back.
	var done int
	require.NoError(t, s.db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND status = 'done'`, reps[0].BatchID))
	require.Equal(t, 10, done)
	var status string
	require.NoError(t, s.db.Get(&status, `SELECT status FROM backfill.runs WHERE batch_id = $1`, reps[0].BatchID))
	require.Equal(t, "completed", status)
	require.True(t, strings.HasPrefix(ids[0], "int:"))
}

// TestRunCompletedJobAgainIsNotSuccess: running a completed plan again
// does nothing and says so (a sentinel error and a log record), and the
// report does not claim a resume; the same holds after a rollback.
func TestRunCompletedJobAgainIsNotSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	var logs bytes.Buffer
	r, err := backfill.New(s.db, &backfill.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	rep, err := r.Run(ctx, s.job(1))
	require.NoError(t, err)
	require.False(t, rep.Resumed, "a new run is not a resume")

	rep2, err := r.Run(ctx, s.job(1))
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted)
	require.Contains(t, err.Error(), "already completed; nothing done; use Job.NewRun to restate")
	require.False(t, rep2.Resumed, "nothing was resumed")
	require.Equal(t, backfill.RunCompleted, rep2.Status)
	require.Equal(t, rep.BatchID, rep2.BatchID)
	require.Zero(t, rep2.ChunksRun)
	require.Equal(t, int64(1), s.count("int:0/100"), "nothing extracted again")
	require.Contains(t, logs.String(), "nothing done")

	rb, err := r.Rollback(ctx, s.job(1), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	require.Equal(t, backfill.RunRolledBack, rb.Status)
	rep3, err := r.Run(ctx, s.job(1))
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted, "a rolled back plan is not run again silently either")
	require.False(t, rep3.Resumed)

	job := s.job(1)
	job.NewRun = true
	rep4, err := r.Run(ctx, job)
	require.NoError(t, err, "NewRun restates")
	require.NotEqual(t, rep.BatchID, rep4.BatchID)
	require.False(t, rep4.Resumed)
}

// TestPublishVersionWaitsBoundedBehindReader: a reader holding a
// transaction open on the view does not block the switch forever, nor the
// new readers: each try of the switch gives up after lock_timeout, new
// readers read the old version meanwhile, and after the last try the run
// fails with an error naming the blocking session; once the reader is gone,
// running the job again publishes.
func TestPublishVersionWaitsBoundedBehindReader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := viewJob(false)
	job.Publish.LockTimeout = "50ms"
	job.Publish.LockRetries = 2
	_, err = r.Run(ctx, job)
	require.NoError(t, err)

	// A long reader of version 1.
	reader, err := db.Connx(ctx)
	require.NoError(t, err)
	defer reader.Close()
	_, err = reader.ExecContext(ctx, `SET application_name = 'long_report'`)
	require.NoError(t, err)
	rtx, err := reader.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer rtx.Rollback()
	var n int
	require.NoError(t, rtx.Get(&n, `SELECT count(*) FROM orders_current`))
	require.Equal(t, 400, n)

	job2 := viewJob(false)
	job2.NewRun = true
	job2.Publish = job.Publish
	job2.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		for id := c.Lo; id < c.Hi; id++ {
			if err := w.Write(ctx, id, id*5); err != nil {
				return err
			}
		}
		return nil
	})
	rep, err := r.Run(ctx, job2)
	require.ErrorIs(t, err, backfill.ErrPublishBlocked)
	t.Log(err)
	require.Contains(t, err.Error(), "long_report", "the error names the blocking session")
	require.Contains(t, err.Error(), "SELECT count(*) FROM orders_current")
	require.Contains(t, err.Error(), "after 2 tries")
	require.Equal(t, backfill.RunCompleted, rep.Status)

	// New readers were not queued behind the switch: they read version 1.
	var sum int64
	require.NoError(t, db.Get(&sum, `SELECT sum(amount) FROM orders_current`))
	require.Equal(t, int64(3*399*400/2), sum)

	require.NoError(t, rtx.Rollback())
	job2.NewRun = false
	rep2, err := r.Run(ctx, job2)
	require.NoError(t, err, "the next call publishes the completed run")
	require.Equal(t, rep.BatchID, rep2.BatchID)
	require.NoError(t, db.Get(&sum, `SELECT sum(amount) FROM orders_current`))
	require.Equal(t, int64(5*399*400/2), sum)
	_, err = r.Run(ctx, job2)
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted, "published and complete: nothing left to do")
}

// eventSource is a source of timestamped events that tests add to while a
// job runs; the extractor reads exactly a chunk's interval.
type eventSource struct {
	mu   sync.Mutex
	rows map[int64]time.Time
}

func (s *eventSource) add(id int64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rows == nil {
		s.rows = map[int64]time.Time{}
	}
	s.rows[id] = at
}

func (s *eventSource) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	s.mu.Lock()
	var ids []int64
	for id, at := range s.rows {
		if c.Contains(at) {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		if err := w.Write(ctx, id, s.rows[id]); err != nil {
			return err
		}
	}
	return nil
}

func eventIDs(t *testing.T, db *sqlx.DB) []int64 {
	t.Helper()
	var ids []int64
	require.NoError(t, db.Select(&ids, `SELECT id FROM events ORDER BY id`))
	return ids
}

// TestOpenDayIsNotClosedForGood: Days(yesterday, tomorrow) loads today's
// chunk but leaves it open, not final; a row added later today is loaded by
// the next call; the run is never reported complete meanwhile, and the
// scope reaching into the future is a warning.
func TestOpenDayIsNotClosedForGood(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE events (id bigint PRIMARY KEY, at timestamptz NOT NULL)`)
	require.NoError(t, err)
	today := time.Now().UTC().Truncate(24 * time.Hour)
	src := &eventSource{}
	src.add(1, today.Add(-12*time.Hour))
	src.add(2, today)
	job := backfill.Job{Name: "events", Chunker: backfill.Days(today.Add(-24*time.Hour), today.Add(24*time.Hour), time.UTC),
		ChunkColumn: "at", Extractor: src, Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "events", Key: []string{"id"}}}
	var logs bytes.Buffer
	r, err := backfill.New(db, &backfill.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrChunksOpen, "an open chunk is not a success")
	todayID := "time:" + today.Format(time.RFC3339Nano) + "/" + today.Add(24*time.Hour).Format(time.RFC3339Nano)
	require.Equal(t, backfill.RunRunning, rep.Status, "a run with an open chunk is not completed")
	require.Equal(t, 1, rep.ChunksDone)
	require.Equal(t, 1, rep.ChunksOpen)
	require.Equal(t, []string{todayID}, rep.OpenChunks)
	require.Equal(t, []int64{1, 2}, eventIDs(t, db), "the open chunk's rows are loaded")
	require.Len(t, rep.Warnings, 1)
	require.Contains(t, rep.Warnings[0], "reaches into the future")
	require.Contains(t, logs.String(), "reaches into the future")
	require.Contains(t, logs.String(), "chunk open")

	src.add(3, today.Add(time.Microsecond)) // added later today
	rep, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrChunksOpen)
	if !time.Now().UTC().Truncate(24 * time.Hour).Equal(today) {
		t.Skip("the test ran across midnight UTC: today's chunk has closed")
	}
	require.True(t, rep.Resumed)
	require.Equal(t, 1, rep.ChunksRun, "only the open chunk is read again")
	require.Equal(t, []int64{1, 2, 3}, eventIDs(t, db), "the row added later today is loaded")
	require.Equal(t, backfill.RunRunning, rep.Status)
	cs := manifestChunks(t, db, rep.BatchID)
	require.Equal(t, backfill.ChunkDone, cs[0].Status)
	require.Equal(t, backfill.ChunkOpen, cs[1].Status)
	require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, cs[1].Counts, "the open chunk as it stands: its 2 rows, both inserted by a read")
}

// TestChunkAfterWatermarkIsReadAgain: a chunk ending after the watermark is
// open until a later call's watermark passes its end; then it is read a
// last time, and the run completes.
func TestChunkAfterWatermarkIsReadAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE events (id bigint PRIMARY KEY, at timestamptz NOT NULL)`)
	require.NoError(t, err)
	day := func(d int) time.Time { return time.Date(2024, 1, d, 0, 0, 0, 0, time.UTC) }
	src := &eventSource{}
	src.add(1, day(1).Add(time.Hour))
	src.add(2, day(3).Add(time.Hour))
	var wm atomic.Int64
	wm.Store(day(3).Add(12 * time.Hour).UnixMicro())
	job := backfill.Job{Name: "events", Chunker: backfill.Days(day(1), day(4), time.UTC), ChunkColumn: "at", Extractor: src,
		Rollback: backfill.RollbackNone, Target: backfill.Target{Table: "events", Key: []string{"id"}},
		Watermark: backfill.WatermarkFunc(func(ctx context.Context) (time.Time, error) { return time.UnixMicro(wm.Load()), nil })}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrChunksOpen)
	require.Equal(t, backfill.RunRunning, rep.Status)
	require.Equal(t, 2, rep.ChunksDone)
	require.Equal(t, 1, rep.ChunksOpen, "the last day ends after the watermark")
	require.Len(t, rep.Warnings, 1)
	require.Contains(t, rep.Warnings[0], "after the source watermark")

	src.add(3, day(3).Add(15*time.Hour)) // committed after the first call
	rep, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrChunksOpen)
	require.Equal(t, 1, rep.ChunksOpen, "the watermark has not moved: still open")
	require.Equal(t, []int64{1, 2, 3}, eventIDs(t, db))

	wm.Store(day(5).UnixMicro())
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 3, rep.ChunksDone)
	require.Zero(t, rep.ChunksOpen)
	require.Empty(t, rep.Warnings)
	// Day 1 once, day 3 three times: {2}, {2, 3}, {2, 3}; each chunk
	// counts as it stands, its rows once.
	require.Equal(t, backfill.Counts{Read: 1 + 2, Inserted: 3}, rep.Counts)
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted)
}

// TestDateChunkColumnWithWatermarkWarns: a date cannot tell when on its day
// a row was added, so a date ChunkColumn under a watermark is a warning;
// modes that cannot read a chunk twice refuse a scope past the horizon.
func TestDateChunkColumnWithWatermarkWarns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE days (id bigint PRIMARY KEY, d date NOT NULL)`)
	require.NoError(t, err)
	day := func(d int) time.Time { return time.Date(2024, 1, d, 0, 0, 0, 0, time.UTC) }
	job := backfill.Job{Name: "days", Chunker: backfill.Days(day(1), day(3), time.UTC), ChunkColumn: "d",
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error { return nil }),
		Rollback:  backfill.RollbackNone, Target: backfill.Target{Table: "days", Key: []string{"id"}},
		Watermark: backfill.SafetyLag(time.Minute, nil)}
	var logs bytes.Buffer
	r, err := backfill.New(db, &backfill.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Len(t, rep.Warnings, 1)
	require.Contains(t, rep.Warnings[0], `ChunkColumn "d" is a date`)
	require.Contains(t, rep.Warnings[0], "can be missed")
	require.Contains(t, logs.String(), "can be missed")

	job.Name, job.NewRun = "days-at-end", true
	job.Chunker = backfill.Days(day(1), time.Now().UTC().Truncate(24*time.Hour).Add(48*time.Hour), time.UTC)
	job.Publish = backfill.Publish{Mode: backfill.PublishAtEnd}
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrInvalidScope)
	require.Contains(t, err.Error(), "cannot read a chunk twice")
}

// A first job names five things: Name, Chunker, Extractor, Target.Table
// and Target.Key. Every other field of Job and Target, and of Config, is
// left at its zero value and defaulted: the columns are the table's, the
// mode Upsert, the rollback the undo log when the target has the lineage
// columns. One thing is not defaulted, on purpose: a target without
// lineage columns has no undo log, and the job must then accept
// Rollback: RollbackNone (no backfill runs without a decided way back).
// These tests run such a job against the fakes of backfilltest and
// against PostgreSQL.

// firstJobRows is how many rows firstJob loads, in chunks of 10.
const firstJobRows = 30

// firstJob sets the five fields and nothing else.
func firstJob() backfill.Job {
	return backfill.Job{
		Name:    "first-job",
		Chunker: backfill.IntRange(0, firstJobRows, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "first_job", Key: []string{"id"}},
	}
}

// requireOnlyFirstJobFields fails unless job sets Name, Chunker,
// Extractor, Target.Table and Target.Key and nothing else (and, when
// extra is given, those fields of Job too).
func requireOnlyFirstJobFields(t *testing.T, job backfill.Job, extra ...string) {
	t.Helper()
	allowed := append([]string{"Name", "Chunker", "Extractor", "Target"}, extra...)
	v := reflect.ValueOf(job)
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		set := !v.Field(i).IsZero()
		require.Equal(t, slices.Contains(allowed, name), set, "Job.%s set: %v", name, set)
	}
	tv := reflect.ValueOf(job.Target)
	for i := range tv.NumField() {
		name := tv.Type().Field(i).Name
		set := !tv.Field(i).IsZero()
		require.Equal(t, name == "Table" || name == "Key", set, "Target.%s set: %v", name, set)
	}
}

// firstJobStore is a store to run firstJob on: a runner with every
// Config field the store allows at zero, over a table first_job (id
// bigint key, v text, and with lineage the bigint backfill_inserted_by
// and backfill_updated_by), and the table's rows, each as its values
// separated by spaces, ordered by id.
type firstJobStore struct {
	name string
	open func(t *testing.T, lineage bool) (r *backfill.Runner, rows func() []string)
}

var firstJobStores = []firstJobStore{
	{"fakes", func(t *testing.T, lineage bool) (*backfill.Runner, func() []string) {
		cols := []backfill.Column{
			{Name: "id", Type: "bigint", BaseType: "int8", NotNull: true},
			{Name: "v", Type: "text", BaseType: "text"},
		}
		if lineage {
			cols = append(cols,
				backfill.Column{Name: "backfill_inserted_by", Type: "bigint", BaseType: "int8"},
				backfill.Column{Name: "backfill_updated_by", Type: "bigint", BaseType: "int8"})
		}
		m := backfilltest.NewMerger()
		m.AddTableColumns("first_job", []string{"id"}, cols...)
		// The fakes are given as the Config's store; nothing else is set.
		r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: backfilltest.NewManifest(), Merger: m})
		require.NoError(t, err)
		return r, func() []string {
			got := m.Rows("first_job")
			slices.SortFunc(got, func(a, b []any) int { return stdcmp.Compare(a[0].(int64), b[0].(int64)) })
			var out []string
			for _, row := range got {
				out = append(out, strings.TrimSuffix(fmt.Sprintln(row...), "\n"))
			}
			return out
		}
	}},
	{"postgres", func(t *testing.T, lineage bool) (*backfill.Runner, func() []string) {
		db := pgtest.New(t)
		ddl := `CREATE TABLE first_job (id bigint PRIMARY KEY, v text)`
		cols := `id, v`
		if lineage {
			ddl = `CREATE TABLE first_job (id bigint PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint)`
			cols = `id, v, backfill_inserted_by, backfill_updated_by`
		}
		_, err := db.Exec(ddl)
		require.NoError(t, err)
		r, err := backfill.New(db, nil) // no Config at all
		require.NoError(t, err)
		return r, func() []string {
			var out []string
			require.NoError(t, db.Select(&out, `SELECT concat_ws(' ', `+cols+`) FROM first_job ORDER BY id`))
			return out
		}
	}},
}

// firstJobWant is what firstJob loads, with the lineage of batch when
// batch is not 0.
func firstJobWant(batch int64) []string {
	var out []string
	for id := range firstJobRows {
		row := fmt.Sprint(id, " v", id)
		if batch != 0 {
			row += fmt.Sprint(" ", batch, " ", batch)
		}
		out = append(out, row)
	}
	return out
}

// TestFirstJobFiveFields: with the lineage columns on the target, the
// five fields load every row, a second Run does nothing, and the
// defaulted rollback (the undo log) takes the batch back out.
func TestFirstJobFiveFields(t *testing.T) {
	for _, s := range firstJobStores {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			job := firstJob()
			requireOnlyFirstJobFields(t, job)
			r, rows := s.open(t, true)

			report, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, backfill.RunCompleted, report.Status)
			require.Equal(t, 3, report.ChunksTotal)
			require.Equal(t, 3, report.ChunksDone)
			require.Equal(t, backfill.Counts{Read: firstJobRows, Inserted: firstJobRows}, report.Counts)
			require.Empty(t, report.Warnings)
			require.Equal(t, firstJobWant(report.BatchID), rows())

			_, err = r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrAlreadyCompleted)

			rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: report.BatchID, Actor: "test", Why: "first job"})
			require.NoError(t, err)
			require.Equal(t, firstJobRows, int(rb.Deleted))
			require.Empty(t, rows())
		})
	}
}

// TestFirstJobWithoutLineageNeedsRollback: without the lineage columns
// the five fields are refused before any batch is created, naming the
// field to set; with Rollback: RollbackNone the job loads.
func TestFirstJobWithoutLineageNeedsRollback(t *testing.T) {
	for _, s := range firstJobStores {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			job := firstJob()
			r, rows := s.open(t, false)

			report, err := r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrInvalidConfig)
			require.ErrorContains(t, err, "Job.Rollback = RollbackNone")
			require.ErrorContains(t, err, "backfill_inserted_by, backfill_updated_by")
			require.Zero(t, report.BatchID, "no batch is created")
			require.Empty(t, rows())

			job.Rollback = backfill.RollbackNone
			requireOnlyFirstJobFields(t, job, "Rollback")
			report, err = r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, backfill.RunCompleted, report.Status)
			require.Equal(t, backfill.Counts{Read: firstJobRows, Inserted: firstJobRows}, report.Counts)
			require.Equal(t, firstJobWant(0), rows())
		})
	}
}

// requireExtractedOnce checks that chunk id was extracted n = 1 times,
// unless a try of it rolled back and was tried again (a lock wait past its
// timeout, a lost connection, a lease taken over on a loaded machine): the
// retry extracts it again, and the workers' log (JSON) says so.
func requireExtractedOnce(t *testing.T, id string, n int64, logs *lockedBuffer) {
	t.Helper()
	if n == 1 {
		return
	}
	q := `"chunk":"` + regexp.QuoteMeta(id) + `"`
	retried := regexp.MustCompile(q + `[^\n]*(retrying|rolls back)|(retrying|rolls back)[^\n]*` + q)
	require.True(t, n > 1 && retried.MatchString(logs.String()), "chunk %s extracted %d times with no retry logged:\n%s", id, n, logs.String())
}
