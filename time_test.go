package backfill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// dstSource returns, for the days around both DST changes of 2024 in loc,
// rows at 00:00, 01:30, 02:30 and 23:59:59.999999 local time (as Go
// normalises them: 02:30 on a spring-forward day is 03:30).
func dstSource(loc *time.Location, days ...time.Time) []time.Time {
	var out []time.Time
	seen := map[time.Time]bool{}
	for _, d := range days {
		for delta := -1; delta <= 1; delta++ {
			y, m, dd := d.AddDate(0, 0, delta).Date()
			for _, hms := range [][4]int{{0, 0, 0, 0}, {1, 30, 0, 0}, {2, 30, 0, 0}, {23, 59, 59, 999999000}} {
				ts := time.Date(y, m, dd, hms[0], hms[1], hms[2], hms[3], loc)
				if !seen[ts] {
					seen[ts] = true
					out = append(out, ts)
				}
			}
		}
	}
	return out
}

// timeExtractor emits the source rows whose instant is in the chunk.
// inclusiveEnd simulates the classic bug: "ts <= end".
func timeExtractor(src []time.Time, inclusiveEnd bool) backfill.Extractor {
	return backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		for _, ts := range src {
			if ts.Before(c.Start) || ts.After(c.End) || (!inclusiveEnd && ts.Equal(c.End)) {
				continue
			}
			if err := w.Write(ctx, ts, ts, ts.Format(time.RFC3339Nano)); err != nil {
				return err
			}
		}
		return nil
	})
}

func createTimed(t *testing.T, db *sqlx.DB) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE timed (at timestamptz PRIMARY KEY, local_at timestamp NOT NULL, label text NOT NULL)`)
	require.NoError(t, err)
}

func timedJob(loc *time.Location, src []time.Time, inclusiveEnd bool, chunkColumn string) backfill.Job {
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, loc)
	end := time.Date(2024, 11, 15, 0, 0, 0, 0, loc)
	return backfill.Job{Name: "timed-" + loc.String(), Chunker: backfill.Days(start, end, loc), Zone: loc,
		Extractor:   timeExtractor(src, inclusiveEnd),
		ChunkColumn: chunkColumn,
		DateMeaning: backfill.DateLocalCalendarDay,
		Rollback:    backfill.RollbackNone,
		Target:      backfill.Target{Table: "timed", Key: []string{"at"}, Columns: []string{"at", "local_at", "label"}, EventTime: "at"}}
}

func TestDayChunksAcrossDST(t *testing.T) {
	t.Parallel()
	cases := []struct {
		zone           string
		spring, fall   time.Time
		springH, fallH time.Duration
	}{
		{"America/New_York", time.Date(2024, 3, 10, 0, 0, 0, 0, time.UTC), time.Date(2024, 11, 3, 0, 0, 0, 0, time.UTC), 23 * time.Hour, 25 * time.Hour},
		{"Europe/Berlin", time.Date(2024, 3, 31, 0, 0, 0, 0, time.UTC), time.Date(2024, 10, 27, 0, 0, 0, 0, time.UTC), 23 * time.Hour, 25 * time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.zone, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			loc, err := time.LoadLocation(tc.zone)
			require.NoError(t, err)
			src := dstSource(loc, tc.spring, tc.fall)
			for _, column := range []string{"at", "local_at"} {
				db := pgtest.New(t)
				createTimed(t, db)
				r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
				require.NoError(t, err)
				rep, err := r.Run(ctx, timedJob(loc, src, false, column))
				require.NoError(t, err)
				require.Equal(t, backfill.Counts{Read: int64(len(src)), Inserted: int64(len(src))}, rep.Counts, "no row lost or duplicated (check on %s)", column)
				chunks := manifestChunks(t, db, rep.BatchID)
				durations := map[string]time.Duration{}
				for _, c := range chunks {
					durations[c.Chunk.Start.In(loc).Format(time.DateOnly)] = c.Chunk.End.Sub(c.Chunk.Start)
				}
				require.Equal(t, tc.springH, durations[tc.spring.Format(time.DateOnly)])
				require.Equal(t, tc.fallH, durations[tc.fall.Format(time.DateOnly)])
				for _, c := range chunks {
					want := 0
					for _, ts := range src {
						if !ts.Before(c.Chunk.Start) && ts.Before(c.Chunk.End) {
							want++
						}
					}
					require.Equal(t, int64(want), c.Inserted, "chunk %s", c.Chunk.ID)
				}
				var n int
				require.NoError(t, db.Get(&n, `SELECT count(DISTINCT label) FROM timed`))
				require.Equal(t, len(src), n)
			}
		})
	}
}

func TestInclusiveEndExtractorIsCaught(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	loc, _ := time.LoadLocation("America/New_York")
	src := dstSource(loc, time.Date(2024, 3, 10, 0, 0, 0, 0, time.UTC))
	db := pgtest.New(t)
	createTimed(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := timedJob(loc, src, true, "at")
	job.MaxRunRejectRate = -1 // the rejects are what the test is about
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	// Every local midnight in the source is read twice: by its own day and,
	// through "<= end", by the day before, which rejects it.
	midnights := 0
	for _, ts := range src {
		if ts.Hour() == 0 && ts.Minute() == 0 {
			midnights++
		}
	}
	require.Equal(t, backfill.Counts{Read: int64(len(src) + midnights), Inserted: int64(len(src)), Rejected: int64(midnights)}, rep.Counts)
	for _, c := range manifestChunks(t, db, rep.BatchID) {
		require.True(t, c.Balanced())
	}
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, midnights)
	for _, e := range ex {
		require.Equal(t, "at", e.Column)
		require.True(t, strings.HasPrefix(e.Reason, "outside chunk ["), e.Reason)
		require.Contains(t, e.Reason, "T00:00:00")
	}
}

// TestSessionTimeZoneDoesNotMatter runs the same backfill in a database
// whose TimeZone is UTC and one whose TimeZone is Pacific/Auckland.
func TestSessionTimeZoneDoesNotMatter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	loc, _ := time.LoadLocation("Europe/Berlin")
	src := dstSource(loc, time.Date(2024, 3, 31, 0, 0, 0, 0, time.UTC), time.Date(2024, 10, 27, 0, 0, 0, 0, time.UTC))
	load := func(tz string) []string {
		url := pgtest.NewURL(t)
		admin := sqlx.MustOpen("postgres", url)
		var name string
		require.NoError(t, admin.Get(&name, `SELECT current_database()`))
		_, err := admin.Exec(fmt.Sprintf(`ALTER DATABASE %q SET timezone = %s`, name, "'"+tz+"'"))
		require.NoError(t, err)
		admin.Close()
		db := sqlx.MustOpen("postgres", url)
		t.Cleanup(func() { db.Close() })
		var got string
		require.NoError(t, db.Get(&got, `SHOW timezone`))
		require.Equal(t, tz, got)
		createTimed(t, db)
		r, err := backfill.New(db, nil)
		require.NoError(t, err)
		_, err = r.Run(ctx, timedJob(loc, src, false, "local_at"))
		require.NoError(t, err)
		var rows []string
		require.NoError(t, db.Select(&rows, `SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || ' ' || local_at::text || ' ' || label
			FROM timed ORDER BY at`))
		var bounds []string
		require.NoError(t, db.Select(&bounds, `SELECT to_char(start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') FROM backfill.chunks ORDER BY seq`))
		return append(rows, bounds...)
	}
	utc := load("UTC")
	require.Equal(t, utc, load("Pacific/Auckland"))
	require.Contains(t, utc, "2024-03-31 01:30:00.000000 2024-03-31 03:30:00 2024-03-31T03:30:00+02:00", "a wall clock stored as Berlin time")
}

// TestExtractByModificationTime follows the practical design: extract by
// source modification time, assign the reporting period from event time.
// An old event entered later lands in its own period and is not missed.
func TestExtractByModificationTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`
		CREATE TABLE src (id int PRIMARY KEY, event_at timestamptz NOT NULL, modified_at timestamptz NOT NULL, amount int);
		INSERT INTO src VALUES
			(1, '2024-01-05 10:00Z', '2024-01-05 10:01Z', 10),
			(2, '2024-01-20 09:00Z', '2024-01-20 09:00Z', 20),
			(3, '2024-01-06 12:00Z', '2024-03-03 08:00Z', 30); -- an old event entered late
		CREATE TABLE sales (id int PRIMARY KEY, event_at timestamptz NOT NULL, modified_at timestamptz NOT NULL,
			amount int, ingested_at timestamptz);`)
	require.NoError(t, err)
	extract := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		rows, err := db.QueryContext(ctx, `SELECT id, event_at, modified_at, amount FROM src
			WHERE modified_at >= $1 AND modified_at < $2 ORDER BY id`, c.Start, c.End)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, amount int64
			var ev, mod time.Time
			if err := rows.Scan(&id, &ev, &mod, &amount); err != nil {
				return err
			}
			if err := w.Write(ctx, id, ev, mod, amount); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	job := backfill.Job{Name: "sales", Extractor: extract, ChunkColumn: "modified_at",
		Chunker:  backfill.Months(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 4, 1, 0, 0, 0, 0, time.UTC), time.UTC),
		Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "sales", Key: []string{"id"}, Columns: []string{"id", "event_at", "modified_at", "amount"},
			EventTime: "event_at", ModifiedAt: "modified_at", IngestedAt: "ingested_at"}}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(3), rep.Counts.Inserted)
	var marchChunkRows int64
	require.NoError(t, db.Get(&marchChunkRows, `SELECT rows_inserted FROM backfill.chunks WHERE batch_id = $1 AND seq = 2`, rep.BatchID))
	require.Equal(t, int64(1), marchChunkRows, "extracted in March, by modification time")
	var janTotal int
	require.NoError(t, db.Get(&janTotal, `SELECT sum(amount) FROM sales WHERE event_at >= '2024-01-01Z' AND event_at < '2024-02-01Z'`))
	require.Equal(t, 60, janTotal, "reported in January, by event time")
	var ingested []time.Time
	require.NoError(t, db.Select(&ingested, `SELECT ingested_at FROM sales ORDER BY id`))
	require.Len(t, ingested, 3)

	var plan string
	require.NoError(t, db.Get(&plan, `SELECT plan::text FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	var p struct {
		Time backfilltype.PlanTime `json:"time"`
	}
	require.NoError(t, json.Unmarshal([]byte(plan), &p))
	require.Equal(t, backfilltype.PlanTime{ChunkColumn: "modified_at", EventTime: "event_at", ModifiedAt: "modified_at", IngestedAt: "ingested_at"}, p.Time)

	job.NewRun = true
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 3, Unchanged: 3}, rep.Counts, "the ingestion time is not compared")
	var again []time.Time
	require.NoError(t, db.Select(&again, `SELECT ingested_at FROM sales ORDER BY id`))
	require.Equal(t, ingested, again, "a replay does not touch the ingestion time")
}

// TestHandoffPicksUpRowsCommittedLate: a row committed during the run,
// with a source modification time below the high-water mark, is picked up
// by the handoff rescan; rows already loaded add nothing.
func TestHandoffPicksUpRowsCommittedLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`
		CREATE TABLE src (id int PRIMARY KEY, v text, modified_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE dst (id int PRIMARY KEY, v text, modified_at timestamptz NOT NULL);
		INSERT INTO src (id, v, modified_at) VALUES (1, 'old', now() - interval '2 hours'), (2, 'recent', now() - interval '10 seconds');`)
	require.NoError(t, err)

	// A writer whose transaction is in flight while the backfill runs: its
	// row is stamped with its start time, and invisible until it commits.
	writer, err := db.Beginx()
	require.NoError(t, err)
	_, err = writer.Exec(`INSERT INTO src (id, v) VALUES (3, 'in flight')`)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)

	extract := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		rows, err := db.QueryContext(ctx, `SELECT id, v, modified_at FROM src WHERE modified_at >= $1 AND modified_at < $2 ORDER BY id`, c.Start, c.End)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			var v string
			var mod time.Time
			if err := rows.Scan(&id, &v, &mod); err != nil {
				return err
			}
			if err := w.Write(ctx, id, v, mod); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	now := time.Now()
	job := backfill.Job{Name: "copy", Extractor: extract, ChunkColumn: "modified_at",
		Chunker:   backfill.Every(now.Add(-3*time.Hour).Truncate(time.Hour), now.Truncate(time.Microsecond), time.Hour, time.UTC),
		Watermark: backfill.PGSourceWatermark(db),
		Rollback:  backfill.RollbackNone,
		Target:    backfill.Target{Table: "dst", Key: []string{"id"}, ModifiedAt: "modified_at"}}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrChunksOpen, "the last hour ends after the watermark")
	require.Equal(t, int64(2), rep.Counts.Inserted, "the in-flight row is invisible to the backfill")
	run, err := backfill.NewPGManifest("").Run(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.NotNil(t, run.Watermark)
	var inflight time.Time
	require.NoError(t, writer.Get(&inflight, `SELECT modified_at FROM src WHERE id = 3`))
	require.False(t, run.Watermark.After(inflight), "watermark %s must not pass the in-flight row's time %s", run.Watermark, inflight)
	require.NoError(t, writer.Commit())

	hrep, err := r.Handoff(ctx, job, backfill.HandoffOptions{Lookback: time.Minute, Actor: "test"})
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2, Inserted: 1, Unchanged: 1}, hrep.Counts, "row 3 is new, row 2 a duplicate")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM dst`))
	require.Equal(t, 3, n)
	events, err := backfill.NewPGManifest("").Events(ctx, db, rep.BatchID)
	require.NoError(t, err)
	last := events[len(events)-1]
	require.Equal(t, "handoff", last.Kind)
	require.Equal(t, "test", last.Actor)
	require.Contains(t, string(last.Detail), fmt.Sprintf(`"rescan_batch_id": %d`, hrep.BatchID))
}

// TestTimestampColumnStoresWallClockInZone: a time.Time is an instant; its
// wall clock in Job.Zone is stored, whatever location it came in.
func TestTimestampColumnStoresWallClockInZone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	createTimed(t, db)
	ny, _ := time.LoadLocation("America/New_York")
	noon := time.Date(2024, 7, 1, 12, 0, 0, 0, ny)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(context.Background(), backfill.Job{Name: "wall", Zone: ny, ChunkColumn: "local_at", Rollback: backfill.RollbackNone,
		Chunker:   backfill.Days(time.Date(2024, 7, 1, 0, 0, 0, 0, ny), time.Date(2024, 7, 2, 0, 0, 0, 0, ny), ny),
		Extractor: rowsFunc([]any{noon.UTC(), noon.UTC(), "from a UTC session"}),
		Target:    backfill.Target{Table: "timed", Key: []string{"at"}, Columns: []string{"at", "local_at", "label"}}})
	require.NoError(t, err)
	var local string
	require.NoError(t, db.Get(&local, `SELECT local_at::text FROM timed`))
	require.Equal(t, "2024-07-01 12:00:00", local)
}
