package backfill_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// Date/time text with more than six fractional digits is stored as
// PostgreSQL stores it: rounded to the microsecond (half to even on the
// double PostgreSQL reads, carried into the next second, minute, day,
// year), never truncated. Property: for random timestamps with 1 to 12
// fractional digits (biased to 9s, 5s and 0s, where rounding carries or
// ties), Write stores in timestamp, timestamptz and date columns what a
// cast of the same text stores.
func TestTimeTextRoundsAsPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const table = "tround"
	_, err := db.Exec(`CREATE TABLE ` + table + ` (id bigint PRIMARY KEY, ts timestamp, tz timestamptz, d date)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rapid.Check(t, func(rt *rapid.T) {
		frac := rapid.StringOfN(rapid.SampledFrom([]rune("0123455999999")), 1, 12, -1)
		texts := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) string {
			s := fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%s",
				rapid.SampledFrom([]int{1, 1999, 2024, 9999}).Draw(rt, "year"), rapid.SampledFrom([]int{1, 2, 12}).Draw(rt, "month"),
				rapid.SampledFrom([]int{1, 28, 31}).Draw(rt, "day"), rapid.SampledFrom([]int{0, 12, 23}).Draw(rt, "hour"),
				rapid.SampledFrom([]int{0, 59}).Draw(rt, "minute"), rapid.SampledFrom([]int{0, 30, 59}).Draw(rt, "second"), frac.Draw(rt, "frac"))
			if strings.HasPrefix(s, "0001-01-01 00:00:00.") && rapid.Bool().Draw(rt, "bc") {
				s += " BC"
			}
			return s
		}), 1, 40).Draw(rt, "texts")
		// Keep the calendar valid: February 31st is no test of rounding.
		for i, s := range texts {
			texts[i] = strings.Replace(strings.Replace(s, "-02-31", "-02-28", 1), "-12-28", "-12-31", 1)
		}
		_, err := db.Exec(`TRUNCATE ` + table)
		require.NoError(rt, err)
		job := backfill.Job{Name: table, NewRun: true, Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "ts", "tz", "d"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
				for i, s := range texts {
					if err := w.Write(ctx, int64(i), s, withOffset(s), s); err != nil {
						return err
					}
				}
				return nil
			})}
		_, err = r.Run(ctx, job)
		require.NoError(rt, err)
		tzs := make([]string, len(texts))
		for i, s := range texts {
			tzs[i] = withOffset(s)
		}
		var got, want []string
		require.NoError(rt, db.Select(&got, `SELECT concat_ws(' | ', ts, tz, d) FROM `+table+` ORDER BY id`))
		require.NoError(rt, db.Select(&want, `SELECT concat_ws(' | ', s::timestamp, tz::timestamptz, s::date)
			FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(s, tz, i) ORDER BY i`, pq.Array(texts), pq.Array(tzs)))
		require.Equal(rt, want, got, "texts %q", texts)
	})
}

// withOffset is s with the zone offset +00 after its time, before an era.
func withOffset(s string) string {
	if t, ok := strings.CutSuffix(s, " BC"); ok {
		return t + "+00 BC"
	}
	return s + "+00"
}
