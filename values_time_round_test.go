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

// Date/time text PostgreSQL reads the same whatever the session's
// settings is taken and stored as a cast stores it: IANA zone names
// (including times in a DST gap or overlap, resolved as PostgreSQL
// resolves them), YYYYMMDD, Julian days. Forms that depend on DateStyle,
// timezone_abbreviations or the clock are queued with a reason listing
// the accepted forms.
func TestTimeTextFormsAsPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	tz := []string{"2024-01-01 12:00:00 America/New_York", "2024-03-10 02:30:00 America/New_York", "2024-11-03 01:30:00 America/New_York",
		"2024-10-06 02:15:00 Australia/Lord_Howe", "2024-04-07 01:45:00 Australia/Lord_Howe", "2024-03-31 01:30:00 Europe/London",
		"2024-10-27 01:30:00.9999995 Europe/London", "1999-12-31T23:59:59 Asia/Kolkata", "2024-06-01 12:00 Europe/Amsterdam"}
	dates := []string{"20240101", "J2451187", "J0", "20240229", "0001-01-01 BC"}
	refused := []string{"January 8, 99 BC", "01/02/2024", "today", "20230229", "2024-01-01 12:00:00 PST", "2024-01-01 12:00:00 Nowhere/Land"}
	_, err := db.Exec(`CREATE TABLE tforms (id bigint PRIMARY KEY, tz timestamptz, d date, ts timestamp)`)
	require.NoError(t, err)
	var rows [][]any
	for _, s := range tz {
		rows = append(rows, []any{int64(len(rows)), s, nil, nil})
	}
	for _, s := range dates {
		rows = append(rows, []any{int64(len(rows)), nil, s, s})
	}
	firstRefused := len(rows)
	for _, s := range refused {
		rows = append(rows, []any{int64(len(rows)), s, s, nil})
	}
	job := backfill.Job{Name: "tforms", Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "tforms", Key: []string{"id"}, Columns: []string{"id", "tz", "d", "ts"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range rows {
				if err := w.Write(ctx, r...); err != nil {
					return err
				}
			}
			return nil
		})}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	for i, row := range rows[:firstRefused] {
		var got, want string
		require.NoError(t, db.Get(&got, `SELECT concat_ws(' | ', tz, d, ts) FROM tforms WHERE id = $1`, i))
		require.NoError(t, db.Get(&want, `SELECT concat_ws(' | ', $1::timestamptz, $2::date, $3::timestamp)`, row[1], row[2], row[3]))
		require.Equal(t, want, got, "%q", row[1:])
	}
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, len(refused))
	for _, e := range ex[:len(refused)-1] {
		require.Regexp(t, "accepted forms are|out of range", e.Reason, "%q", e.Value)
	}
	require.Contains(t, ex[len(refused)-1].Reason, `unknown time zone "Nowhere/Land"`)
}
