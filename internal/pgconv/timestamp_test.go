package pgconv

import (
	"context"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestConvertTimestamptzText: text with an explicit offset in the forms
// PostgreSQL prints (and RFC 3339) is read as PostgreSQL reads it;
// without an offset it is refused.
func TestConvertTimestamptzText(t *testing.T) {
	t.Parallel()
	tz := col("timestamptz")
	for in, want := range map[string]string{
		"2024-03-10 12:00:00+00":           "2024-03-10T12:00:00Z",
		"2024-03-10 12:00:00.123456+05:30": "2024-03-10T06:30:00.123456Z",
		"2024-03-10T12:00:00+0100":         "2024-03-10T11:00:00Z",
		"2024-03-10T12:00:00-01":           "2024-03-10T13:00:00Z",
		"2024-03-10 12:00:00 -01:00":       "2024-03-10T13:00:00Z",
		"2024-03-10 12:00+00:19:32":        "2024-03-10T11:40:28Z",
		"2024-03-10t12:00:00z":             "2024-03-10T12:00:00Z",
		"2024-03-10T12:00:00.1234567Z":     "2024-03-10T12:00:00.123456Z",
		"2024-03-10T12:00:00.9999999999Z":  "2024-03-10T12:00:00.999999Z",
		"2024-03-10T12:00:00.5+15:59:59":   "2024-03-09T20:00:01.5Z",
		"0001-01-01T05:00:00+05":           "0001-01-01T00:00:00Z",
		"2024-03-10 24:00:00Z":             "2024-03-11T00:00:00Z",
		" 2024-03-10 23:59:60+00 AD\n":     "2024-03-11T00:00:00Z",
		"0001-01-01T00:00:00+05:00":        "0001-12-31T19:00:00Z BC",
		"9999-12-31T23:00:00-05:00":        "10000-01-01T04:00:00Z",
		"4714-11-24 00:00:00+00 BC":        "4714-11-24T00:00:00Z BC",
		"294276-12-31 23:59:59.999999+00":  "294276-12-31T23:59:59.999999Z",
		"INFINITY":                         "infinity",
		" -infinity":                       "-infinity",
		"epoch":                            "1970-01-01T00:00:00Z",
	} {
		got, reason := Convert(tz, in)
		require.Empty(t, reason, in)
		require.Equal(t, want, got, in)
	}
	const noOffset = "invalid timestamptz, want RFC 3339 with a zone offset (a value without offset would be read in the session's TimeZone)"
	for _, in := range []string{"2024-03-10 12:00:00", "2024-03-10T12:00:00.123", "2024-03-10", "2024-03-10 12:00:00 ", "2024-03-10 12:00:00+16",
		"2024-03-10 12:00:00+0530:00", "2024-03-10 12:00:00+05:3", "2024-03-10 12:00:00.Z",
		"2024-03-10 12:00:00 UTC", "24-03-10 12:00:00Z", "2024-03-10  12:00:00Z", "", "now", "today"} {
		_, reason := Convert(tz, in)
		require.Equal(t, noOffset, reason, "%q", in)
	}
	for _, in := range []string{"2024-02-30 12:00:00Z", "2023-02-29 12:00:00Z", "2024-03-10 24:00:01Z", "2024-03-10 23:59:60.5Z", "0000-01-01T00:00:00Z", "2024-13-01T00:00:00Z"} {
		_, reason := Convert(tz, in)
		require.Contains(t, reason, `date/time field value out of range: timestamptz column "c" holds calendar dates`, "%q", in)
	}
	for _, in := range []any{"4714-11-24T00:00:00+01 BC", "294277-01-01T00:00:00Z", "294276-12-31T23:00:00-05:00",
		time.Date(-4713, 11, 23, 23, 0, 0, 0, time.UTC), time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-4713, 11, 24, 0, 0, 0, 0, time.FixedZone("", 3600))} {
		_, reason := Convert(Column{Name: "at", Type: "timestamp with time zone", BaseType: "timestamptz"}, in)
		require.Equal(t, `timestamp out of range: timestamp with time zone column "at" holds 4714-11-24 00:00:00+00 BC to 294276-12-31 23:59:59.999999+00 AD, and ±infinity`, reason, "%v", in)
	}
	for _, c := range []struct {
		col Column
		in  any
	}{{col("date"), "4714-11-23 BC"}, {col("date"), "5874898-01-01"}, {col("timestamp"), "294277-01-01 00:00:00"}, {col("timestamp"), "4714-11-23 BC"},
		{col("date"), time.Date(-4713, 11, 23, 0, 0, 0, 0, time.UTC)}, {col("timestamp"), time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC)}} {
		_, reason := Convert(c.col, c.in)
		require.Contains(t, reason, `out of range: `+c.col.BaseType+` column "c" holds 4714-11-24`, "%s %v", c.col.BaseType, c.in)
	}
}

// TestConvertTimestamptzReadsPostgresOutput: whatever the session's
// TimeZone, the text PostgreSQL prints for a timestamptz converts back
// to the same instant.
func TestConvertTimestamptzReadsPostgresOutput(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	zones := []string{"UTC", "Asia/Kolkata", "America/St_Johns", "Europe/Amsterdam", "Africa/Monrovia", "Asia/Kathmandu", "Pacific/Chatham", "America/Sao_Paulo"}
	lo := time.Date(2, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	hi := time.Date(9998, 12, 31, 0, 0, 0, 0, time.UTC).UnixMicro()
	rapid.Check(t, func(rt *rapid.T) {
		at := time.UnixMicro(rapid.Int64Range(lo, hi).Draw(rt, "at")).UTC()
		zone := rapid.SampledFrom(zones).Draw(rt, "zone")
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(rt, err)
		defer func() { _ = tx.Rollback() }()
		_, err = tx.Exec("SET LOCAL TimeZone = '" + zone + "'")
		require.NoError(rt, err)
		var text string
		require.NoError(rt, tx.Get(&text, "SELECT $1::timestamptz::text", at.Format(time.RFC3339Nano)))
		got, reason := Convert(col("timestamptz"), text)
		require.Empty(rt, reason, "PostgreSQL's %q in %s", text, zone)
		require.Equal(rt, at.Format(time.RFC3339Nano), got, "PostgreSQL's %q in %s", text, zone)
	})
}
