package backfill_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// scd2 creates a History target with the single-open-version index that
// SCD2 tables commonly have, and returns its Target.
func scd2(t *testing.T, db *sqlx.DB) backfill.Target {
	t.Helper()
	db.MustExec(`CREATE TABLE scd (customer text NOT NULL, valid_from date NOT NULL, valid_to date, city text,
		UNIQUE (customer, valid_from))`)
	db.MustExec(`CREATE UNIQUE INDEX scd_one_open ON scd (customer) WHERE valid_to IS NULL`)
	return backfill.Target{Table: "scd", Key: []string{"customer"}, Mode: backfill.History, Columns: []string{"customer", "valid_from", "city"}}
}

func ymd(month, day int) time.Time {
	return time.Date(2024, time.Month(month), day, 0, 0, 0, 0, time.UTC)
}

// scdRows returns the table as "customer from-to city" lines, in order.
func scdRows(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var out []string
	require.NoError(t, db.Select(&out, `SELECT customer || ' ' || to_char(valid_from, 'MM-DD') || '-' || coalesce(to_char(valid_to, 'MM-DD'), 'open') || ' ' || coalesce(city, '-')
		FROM scd ORDER BY customer, valid_from`))
	return out
}

// mergeInTx stages rows into a new transaction and merges them; the
// caller commits or rolls back.
func mergeInTx(t *testing.T, db *sqlx.DB, m backfill.Merger, info backfill.TableInfo, rows ...[]any) (*sqlx.Tx, backfilltype.MergeResult, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	st, err := m.Stage(ctx, tx, info)
	require.NoError(t, err)
	defer st.Close()
	for i, r := range rows {
		require.NoError(t, st.Add(ctx, int64(i+1), r))
	}
	res, err := st.Merge(ctx)
	return tx, res, err
}

// TestHistoryWithOneOpenVersionIndex: History mode works on a target with
// UNIQUE (key) WHERE valid_to IS NULL, in every case that changes
// intervals: a version after the open one, a late version in the middle,
// one before the first, several versions of a key in one chunk, and a
// replay or correction of an existing valid_from. Every merge keeps one
// open version per key (the index would refuse a second).
func TestHistoryWithOneOpenVersionIndex(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, scd2(t, db))
	require.NoError(t, err)
	merge := func(rows ...[]any) backfilltype.MergeResult {
		t.Helper()
		tx, res, err := mergeInTx(t, db, m, info, rows...)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		return res
	}
	merge([]any{"a", ymd(1, 1), "Oslo"}, []any{"b", ymd(1, 1), "Rome"})
	res := merge([]any{"a", ymd(4, 1), "Bergen"})
	require.Equal(t, int64(1), res.Inserted, "a version after the open one")
	require.Equal(t, int64(1), res.Closed)
	require.Equal(t, []string{"a 01-01-04-01 Oslo", "a 04-01-open Bergen", "b 01-01-open Rome"}, scdRows(t, db))

	res = merge([]any{"a", ymd(2, 1), "Lima"})
	require.Equal(t, int64(1), res.Inserted, "a late version in the middle")
	require.Equal(t, []string{"a 01-01-02-01 Oslo", "a 02-01-04-01 Lima", "a 04-01-open Bergen", "b 01-01-open Rome"}, scdRows(t, db))

	merge([]any{"a", ymd(1, 1), "Oslo"}, []any{"a", ymd(2, 1), "Lima"})
	require.Equal(t, []string{"a 01-01-02-01 Oslo", "a 02-01-04-01 Lima", "a 04-01-open Bergen", "b 01-01-open Rome"}, scdRows(t, db),
		"a replay changes nothing")
	res = merge([]any{"a", ymd(4, 1), "Bergen!"})
	require.Equal(t, [2]int64{0, 1}, [2]int64{res.Inserted, res.Updated}, "same valid_from, other content: a correction")

	// Before the first version, and several versions of two keys at once
	// (the open one of b moves twice, a new key gets three).
	merge([]any{"a", ymd(0, 1), "Kyiv"}, []any{"b", ymd(3, 1), "Nice"}, []any{"b", ymd(6, 1), "Pisa"},
		[]any{"c", ymd(2, 1), "X"}, []any{"c", ymd(1, 1), "Y"}, []any{"c", ymd(3, 1), "Z"})
	require.Equal(t, []string{
		"a 12-01-01-01 Kyiv", "a 01-01-02-01 Oslo", "a 02-01-04-01 Lima", "a 04-01-open Bergen!",
		"b 01-01-03-01 Rome", "b 03-01-06-01 Nice", "b 06-01-open Pisa",
		"c 01-01-02-01 Y", "c 02-01-03-01 X", "c 03-01-open Z",
	}, scdRows(t, db))
}

// waitForLockWait waits until the backend pid waits for a lock.
func waitForLockWait(t *testing.T, db *sqlx.DB, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`, pid))
		if waiting {
			return
		}
		require.True(t, time.Now().Before(deadline), "backend %d never waited for a lock", pid)
		time.Sleep(time.Millisecond)
	}
}

// TestHistoryConcurrentMergesOfOneKey: two transactions adding different
// versions of one key at the same time, on a target with one open version
// per key. The second merge waits for the first (the key's lock), then
// sees its version: both commit, and the versions tile.
func TestHistoryConcurrentMergesOfOneKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, scd2(t, db))
	require.NoError(t, err)
	tx, _, err := mergeInTx(t, db, m, info, []any{"a", ymd(1, 1), "Oslo"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	for _, second := range []time.Time{ymd(6, 1), ymd(2, 1)} { // after and before the first one's version
		first, _, err := mergeInTx(t, db, m, info, []any{"a", ymd(4, 1), "Bergen"})
		require.NoError(t, err)
		tx2, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		var pid int
		require.NoError(t, tx2.Get(&pid, `SELECT pg_backend_pid()`))
		done := make(chan error, 1)
		go func() {
			st, err := m.Stage(ctx, tx2, info)
			if err == nil {
				defer st.Close()
				err = st.Add(ctx, 1, []any{"a", second, "Pisa"})
			}
			if err == nil {
				_, err = st.Merge(ctx)
			}
			done <- err
		}()
		waitForLockWait(t, db, pid)
		require.NoError(t, first.Commit())
		require.NoError(t, <-done)
		require.NoError(t, tx2.Commit())
		want := []string{"a 01-01-04-01 Oslo", "a 04-01-06-01 Bergen", "a 06-01-open Pisa"}
		if second.Before(ymd(4, 1)) {
			want = []string{"a 01-01-02-01 Oslo", "a 02-01-04-01 Pisa", "a 04-01-open Bergen"}
		}
		require.Equal(t, want, scdRows(t, db), "second version %s", second.Format(time.DateOnly))
		db.MustExec(`DELETE FROM scd WHERE valid_from > '2024-01-01'`)
		db.MustExec(`UPDATE scd SET valid_to = NULL`)
	}
}

// TestHistoryConcurrentRuns: two runs of two jobs, at once, add other
// versions of the same keys to one SCD2 target: both complete, and every
// key's versions tile with one open version.
func TestHistoryConcurrentRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tg := scd2(t, db)
	const keys = 5
	job := func(name string, month int) backfill.Job {
		items := make([]string, keys)
		for i := range items {
			items[i] = fmt.Sprint(i)
		}
		return backfill.Job{Name: name, Chunker: backfill.List(items...), Target: tg, Rollback: backfill.RollbackNone,
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				// Chunk i: versions of keys i and i+1 (so chunks of one run
				// share keys too).
				for _, k := range []int{c.Seq, (c.Seq + 1) % keys} {
					if err := w.Write(ctx, fmt.Sprintf("k%d", k), ymd(month, 1+c.Seq), name); err != nil {
						return err
					}
				}
				return nil
			})}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, month := range []int{3, 7} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := backfill.New(db, &backfill.Config{Concurrency: 3, RetryBackoff: time.Millisecond})
			if err == nil {
				_, err = r.Run(context.Background(), job(fmt.Sprintf("run%d", i), month))
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	var bad []string
	require.NoError(t, db.Select(&bad, `SELECT customer FROM (
			SELECT customer, valid_to, lead(valid_from) OVER (PARTITION BY customer ORDER BY valid_from) AS next FROM scd) x
		WHERE valid_to IS DISTINCT FROM next`))
	require.Empty(t, bad, "keys whose versions do not tile")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM scd`))
	require.Equal(t, 2*2*keys, n, "every version of both runs")
}

// TestHistoryOpenVersionRaceWithAnotherWriter: a writer that does not take
// the merge's key locks adds an open version of a key while a chunk merges
// another version of it. The chunk's insert then violates the one-open-
// version index: the error says so plainly, the chunk is retried, and the
// retry merges after that writer's version. (Since the merge locks the
// versions it closes first, it waits for that writer and merges after its
// version on the first attempt.)
func TestHistoryOpenVersionRaceWithAnotherWriter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tg := scd2(t, db)
	db.MustExec(`INSERT INTO scd VALUES ('a', '2024-01-01', NULL, 'Oslo')`)
	other, err := db.Beginx()
	require.NoError(t, err)
	other.MustExec(`UPDATE scd SET valid_to = '2024-07-01' WHERE customer = 'a' AND valid_to IS NULL`)
	other.MustExec(`INSERT INTO scd VALUES ('a', '2024-07-01', NULL, 'Other')`)

	var log bytes.Buffer
	var logMu sync.Mutex
	r, err := backfill.New(db, &backfill.Config{RetryBackoff: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(syncWriter{&log, &logMu}, nil))})
	require.NoError(t, err)
	pid := make(chan int, 1)
	job := backfill.Job{Name: "late", Chunker: backfill.List("x"), Target: tg, Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, "a", ymd(9, 1), "Late")
		})}
	// The merge's first statement that waits is the close of a's open
	// version, which the other writer holds.
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var p int
			if db.Get(&p, `SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE NOT l.granted AND l.locktype = 'transactionid' AND a.datname = current_database() LIMIT 1`) == nil {
				pid <- p
				return
			}
			time.Sleep(time.Millisecond)
		}
		pid <- 0
	}()
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), job)
		done <- err
	}()
	require.NotZero(t, <-pid, "the merge never waited for the other writer")
	require.NoError(t, other.Commit())
	require.NoError(t, <-done)
	require.Equal(t, []string{"a 01-01-07-01 Oslo", "a 07-01-09-01 Other", "a 09-01-open Late"}, scdRows(t, db))
	logMu.Lock()
	defer logMu.Unlock()
	// The merge locks the versions it closes before it reads them
	// (lockClosing), so it waits for the other writer and merges after its
	// version on the first attempt; a failed attempt (the other writer
	// acting after that lock) must say plainly what happened.
	if strings.Contains(log.String(), "level=WARN") || strings.Contains(log.String(), "level=ERROR") {
		require.Contains(t, log.String(), `allows one version per key WHERE (valid_to IS NULL)`, "the first attempt's error says what happened")
	}
	require.NotContains(t, log.String(), "do not tile")
}

// TestHistoryRaceWithAnotherWriterWithoutOpenIndex: as above, on a target
// without the one-open-version index: the merge leaves the key's versions
// overlapping, and the error says that another writer changed them (not
// only that intervals do not tile) and is retried.
func TestHistoryRaceWithAnotherWriterWithoutOpenIndex(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tg := scd2(t, db)
	db.MustExec(`DROP INDEX scd_one_open`)
	db.MustExec(`INSERT INTO scd VALUES ('a', '2024-01-01', NULL, 'Oslo')`)
	other, err := db.Beginx()
	require.NoError(t, err)
	other.MustExec(`UPDATE scd SET valid_to = '2024-07-01' WHERE customer = 'a' AND valid_to IS NULL`)
	other.MustExec(`INSERT INTO scd VALUES ('a', '2024-07-01', NULL, 'Other')`)
	var log bytes.Buffer
	var logMu sync.Mutex
	r, err := backfill.New(db, &backfill.Config{RetryBackoff: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(syncWriter{&log, &logMu}, nil))})
	require.NoError(t, err)
	job := backfill.Job{Name: "late", Chunker: backfill.List("x"), Target: tg, Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, "a", ymd(9, 1), "Late")
		})}
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), job)
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND l.locktype = 'transactionid' AND a.datname = current_database())`))
		if waiting {
			break
		}
		require.True(t, time.Now().Before(deadline), "the merge never waited for the other writer")
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, other.Commit())
	require.NoError(t, <-done)
	require.Equal(t, []string{"a 01-01-07-01 Oslo", "a 07-01-09-01 Other", "a 09-01-open Late"}, scdRows(t, db))
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(log.String(), "level=WARN") || strings.Contains(log.String(), "level=ERROR") {
		require.Contains(t, log.String(), "another transaction, not a merge of this library, added or changed versions of these keys during the merge")
	}
}

type syncWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
