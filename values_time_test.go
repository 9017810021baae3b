package backfill_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

type namedTime time.Time

// timeValuer is a driver.Valuer that returns a time.Time.
type timeValuer struct{ t time.Time }

func (v timeValuer) Value() (driver.Value, error) { return v.t, nil }

// Job.Zone applies to a time.Time written to a timestamp column whatever
// wrapper delivers it, and the ChunkColumn check sees the instant stored:
// noon in New York, Zone UTC, is stored as 17:00 and lies in the chunk
// [16:00, 18:00) UTC, not in [12:00, 13:00).
func TestTimestampZoneThroughWrappers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	noon := time.Date(2024, 1, 1, 12, 0, 0, 0, ny)
	wrapped := []any{noon, &noon, sql.NullTime{Time: noon, Valid: true}, sql.Null[time.Time]{V: noon, Valid: true},
		namedTime(noon), (*namedTime)(&noon), timeValuer{noon}, &sql.NullTime{Time: noon, Valid: true}}
	utc := func(h int) time.Time { return time.Date(2024, 1, 1, h, 0, 0, 0, time.UTC) }
	for _, tc := range []struct {
		name    string
		lo, hi  time.Time
		inChunk bool
	}{{"in", utc(16), utc(18), true}, {"out", utc(12), utc(13), false}} {
		name := "tz_" + tc.name
		_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, ts timestamp)`, name))
		require.NoError(t, err)
		job := backfill.Job{Name: name, Chunker: backfill.Every(tc.lo, tc.hi, tc.hi.Sub(tc.lo), time.UTC), ChunkColumn: "ts",
			Zone: time.UTC, Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
			Target: backfill.Target{Table: name, Key: []string{"id"}, Columns: []string{"id", "ts"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
				for i, v := range wrapped {
					if err := w.Write(ctx, int64(i), v); err != nil {
						return err
					}
				}
				return nil
			})}
		r, err := backfill.New(db, &backfill.Config{MaxStagingRejects: 100})
		require.NoError(t, err)
		rep, err := r.Run(ctx, job)
		if !tc.inChunk {
			require.Equal(t, int64(len(wrapped)), rep.Counts.Rejected, "every wrapper is outside [12:00, 13:00): %v", err)
			ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
			require.NoError(t, err)
			for _, e := range ex {
				require.Contains(t, e.Reason, "outside chunk", "row %d (%T)", e.Row, wrapped[e.Row-1])
			}
			continue
		}
		require.NoError(t, err)
		var got []string
		require.NoError(t, db.Select(&got, fmt.Sprintf(`SELECT ts::text FROM %s ORDER BY id`, name)))
		want := make([]string, len(wrapped))
		for i := range want {
			want[i] = "2024-01-01 17:00:00"
		}
		require.Equal(t, want, got, "wrappers: %T", wrapped)
	}
}
