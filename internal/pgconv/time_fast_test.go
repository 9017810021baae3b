package pgconv

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestConvertTimeFormats: a time.Time of years 1 to 9999 is written in
// exactly the text time.Format's layouts give (date, timestamp,
// timestamptz in UTC), and TruncMicro is time.Truncate to microseconds,
// in any location and for any instant, monotonic reading included.
func TestConvertTimeFormats(t *testing.T) {
	zones := []*time.Location{time.UTC, time.FixedZone("x", -(3*3600 + 30*60)), time.FixedZone("y", 14*3600)}
	rapid.Check(t, func(rt *rapid.T) {
		sec := rapid.Int64Range(-62135596800+86400, 253402300799-86400).Draw(rt, "sec")
		ns := rapid.OneOf(rapid.Just(0), rapid.IntRange(0, 999_999_999), rapid.Map(rapid.IntRange(0, 999_999), func(us int) int { return us * 1000 })).Draw(rt, "ns")
		x := time.Unix(sec, int64(ns)).In(zones[rapid.IntRange(0, len(zones)-1).Draw(rt, "zone")])
		if got, want := TruncMicro(x), x.Truncate(time.Microsecond); !got.Equal(want) || got.Location() != want.Location() || got.String() != want.String() {
			rt.Fatalf("TruncMicro(%v) = %v, want %v", x, got, want)
		}
		tr := x.Truncate(time.Microsecond)
		for _, c := range []struct{ base, layout string }{
			{"date", "2006-01-02"},
			{"timestamp", "2006-01-02 15:04:05.999999"},
			{"timestamptz", time.RFC3339Nano},
		} {
			want := tr
			if c.base == "timestamptz" {
				want = tr.UTC()
			}
			if want.Year() < 1 || want.Year() > 9999 {
				continue
			}
			got, reason := Convert(Column{Name: "c", BaseType: c.base}, x)
			if reason != "" || got != want.Format(c.layout) {
				rt.Fatalf("Convert(%s, %v) = %v %q, want %q", c.base, x, got, reason, want.Format(c.layout))
			}
		}
	})
	// The monotonic reading is dropped, as Truncate drops it.
	now := time.Now()
	if got := TruncMicro(now).String(); got != now.Truncate(time.Microsecond).String() {
		t.Fatalf("TruncMicro(now) = %s, want %s", got, now.Truncate(time.Microsecond))
	}
}

// TestConvertAllocs: converting the common values allocates no more than
// the value's boxing needs: an int64 is returned as it came (no
// allocation) and a time.Time becomes its text in one allocation besides
// the boxing (the per-row cost). Allocation counts, not times.
func TestConvertAllocs(t *testing.T) {
	at := time.Date(2024, 1, 2, 3, 4, 5, 123456789, time.UTC)
	for _, c := range []struct {
		col  Column
		v    any
		max  float64
		want any
	}{
		{Column{Name: "n", BaseType: "int8"}, any(int64(123456789)), 0, int64(123456789)},
		{Column{Name: "ts", BaseType: "timestamptz"}, any(at), 2, "2024-01-02T03:04:05.123456Z"},
		{Column{Name: "ts", BaseType: "timestamp"}, any(at), 2, "2024-01-02 03:04:05.123456"},
		{Column{Name: "d", BaseType: "date"}, any(at), 2, "2024-01-02"},
	} {
		conv := For(c.col)
		if got, reason := conv.Convert(c.v); reason != "" || got != c.want {
			t.Fatalf("%s: Convert(%v) = %v %q, want %v", c.col.BaseType, c.v, got, reason, c.want)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = conv.Convert(c.v) }); n > c.max {
			t.Errorf("%s: Convert(%v) allocates %v times, want at most %v", c.col.BaseType, c.v, n, c.max)
		}
	}
}
