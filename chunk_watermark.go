package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// Watermarker tells a source's high-water mark: an instant of the source
// modification time (the extraction cursor) such that every row modified
// before it is committed and visible. A backfill's run records it at
// start; [Runner.Handoff] rescans from it (minus a lookback) before live
// ingestion takes over, so that rows committed by transactions that were
// still in flight are not lost.
type Watermarker interface {
	// Watermark returns the high-water mark now. [Runner.Run] calls it
	// once per call, before any chunk: a new run records it, and every
	// call uses it as the horizon after which a time chunk is left open
	// ([ChunkOpen]) rather than final.
	Watermark(ctx context.Context) (time.Time, error)
}

// WatermarkFunc adapts a function to [Watermarker].
type WatermarkFunc func(ctx context.Context) (time.Time, error)

// Watermark calls f.
func (f WatermarkFunc) Watermark(ctx context.Context) (time.Time, error) { return f(ctx) }

// SafetyLag returns a Watermarker for sources whose commit delay is
// bounded but unknown: the current time minus lag (e.g. 5 minutes: no
// transaction of the source commits rows stamped more than 5 minutes
// earlier). now is the clock (nil means time.Now). The result is truncated
// to microseconds.
func SafetyLag(lag time.Duration, now func() time.Time) Watermarker {
	if now == nil {
		now = time.Now
	}
	return WatermarkFunc(func(ctx context.Context) (time.Time, error) {
		return now().Add(-lag).Truncate(time.Microsecond), ctx.Err()
	})
}

// PGSourceWatermark returns a Watermarker for a PostgreSQL source whose
// modification times are set from now() (or clock_timestamp()) by the
// writing transaction. It is the earlier of the source's now() and the
// start of the oldest transaction that holds a transaction ID (it has
// written or will write) as pg_stat_activity shows it (PostgreSQL docs,
// 28.2.3 "pg_stat_activity"): a transaction still in flight stamps its rows
// no earlier than its own start, so every row it commits later falls at or
// above the watermark. The role must see other sessions' activity
// (pg_read_all_stats or superuser); otherwise the error says so.
func PGSourceWatermark(src sqlx.QueryerContext) Watermarker {
	return WatermarkFunc(func(ctx context.Context) (time.Time, error) {
		var out struct {
			Now    time.Time  `db:"now"`
			Oldest *time.Time `db:"oldest"`
			Hidden int        `db:"hidden"`
		}
		err := sqlx.GetContext(ctx, src, &out, `
			SELECT now() AS now,
				min(xact_start) FILTER (WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()) AS oldest,
				count(*) FILTER (WHERE backend_type = 'client backend' AND xact_start IS NULL AND state IS NULL) AS hidden
			FROM pg_stat_activity WHERE datname = current_database()`)
		if err != nil {
			return time.Time{}, fmt.Errorf("backfill: source watermark: %w", err)
		}
		if out.Hidden > 0 {
			return time.Time{}, fmt.Errorf("backfill: source watermark: %d sessions are hidden from this role; grant pg_read_all_stats", out.Hidden)
		}
		w := out.Now
		if out.Oldest != nil && out.Oldest.Before(w) {
			w = *out.Oldest
		}
		return w.Truncate(time.Microsecond), nil
	})
}
