package pgconv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFracMicrosRoundsAsPostgreSQL pins fracMicros on the cases its doc
// names: exact up to six digits, half to even on the double beyond
// (.1234575 up, .1234565 down, its double below the half), and a carry
// into the next second.
func TestFracMicrosRoundsAsPostgreSQL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{".5": 500000, ".000001": 1, ".123456": 123456, ".1234567": 123457,
		".1234575": 123458, ".1234565": 123456, ".9999995": 1000000, ".9999994999": 999999, ".0000005": 0, ".0000015": 2} {
		require.Equal(t, want, fracMicros(in), in)
	}
}

// TestTimeTextForms: the compact dates (YYYYMMDD, Julian days), IANA zone
// names (at a gap and an overlap, as PostgreSQL resolves them) and the
// era after a zone, read by Convert; a date ignores a zone name as it
// ignores an offset.
func TestTimeTextForms(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ base, in, want string }{
		{"date", "20240229", "2024-02-29"},
		{"date", "J2451187", "1999-01-08"},
		{"date", "J0", "4714-11-24 BC"},
		{"timestamp", "20240101", "2024-01-01 00:00:00"},
		{"timestamptz", "2024-01-01 12:00:00 America/New_York", "2024-01-01T17:00:00Z"},
		{"timestamptz", "2024-03-10 02:30:00 America/New_York", "2024-03-10T07:30:00Z"}, // gap: the offset before
		{"timestamptz", "2024-11-03 01:30:00 America/New_York", "2024-11-03T06:30:00Z"}, // overlap: the offset after
		{"timestamptz", "2024-03-10 12:00:00.9999995Z", "2024-03-10T12:00:01Z"},
		{"timestamptz", "0001-01-01 00:00:00Z BC", "0001-01-01T00:00:00Z BC"},
		{"date", "2024-03-10 00:30 Asia/Tokyo", "2024-03-10"},
		{"date", "2024-03-10 23:30 America/Los_Angeles", "2024-03-10"},
	} {
		got, reason := Convert(col(c.base), c.in)
		require.Empty(t, reason, "%s %q", c.base, c.in)
		require.Equal(t, c.want, got, "%s %q", c.base, c.in)
	}
	for _, c := range []struct{ base, in, reason string }{
		{"timestamptz", "2024-01-01 12:00:00 PST", reasonTimestamptzText},
		{"timestamptz", "2024-01-01 12:00:00ZBC", reasonTimestamptzText},
		{"timestamp", "2024-01-01 12:00:00 Europe/Paris", reasonTimestampText},
		{"date", "01/02/2024", reasonDateText},
		{"date", "20230229", "date/time field value out of range"},
		{"timestamptz", "2024-01-01 12:00:00 Nowhere/Land", `unknown time zone "Nowhere/Land"`},
	} {
		_, reason := Convert(col(c.base), c.in)
		require.Contains(t, reason, c.reason, "%s %q", c.base, c.in)
	}
}

// TestReadTime: text Convert returns for a time column reads back as the
// instant (zoned) or wall clock it stores.
func TestReadTime(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in    string
		want  time.Time
		zoned bool
	}{
		{"2024-03-10T12:00:00.123457Z", time.Date(2024, 3, 10, 12, 0, 0, 123457000, time.UTC), true},
		{"2024-03-10 12:00:00.9999999", time.Date(2024, 3, 10, 12, 0, 1, 0, time.UTC), false},
		{"2024-01-01 12:00 America/New_York", time.Date(2024, 1, 1, 17, 0, 0, 0, time.UTC), true},
		{"0001-01-01 BC", time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{"infinity", Infinity, true},
		{"-infinity", NegInfinity, true},
	} {
		got, zoned, ok := ReadTime(c.in)
		require.True(t, ok, c.in)
		require.Equal(t, c.zoned, zoned, c.in)
		require.True(t, c.want.Equal(got), "%q: %v", c.in, got)
	}
	for _, in := range []string{"now", "01/02/2024", "2024-01-01 12:00 Nowhere/Land"} {
		_, _, ok := ReadTime(in)
		require.False(t, ok, in)
	}
}
