package backfill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the tests need IANA zones even where the host has none

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// propertyZones are the zones the property tests draw from: whole-hour,
// half-hour and 45-minute offsets, a 30-minute DST (Lord_Howe), DST changes
// at midnight (Santiago), a 45-minute offset with DST (Chatham) and a
// negative DST during Ramadan (Casablanca).
var propertyZones = []string{
	"UTC",
	"America/New_York",
	"Europe/Berlin",
	"Australia/Lord_Howe",
	"Asia/Kolkata",
	"America/Santiago",
	"Pacific/Chatham",
	"Asia/Kathmandu",
	"America/St_Johns",
	"Africa/Casablanca",
	"America/Havana",
	"Asia/Beirut",
}

func mustLoad(tb testing.TB, name string) *time.Location {
	tb.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(tb, err)
	return loc
}

// span is a chunk reduced to comparable text: bounds and duration.
type span struct {
	Start, End string
	Dur        time.Duration
}

func spans(chunks []backfill.Chunk) []span {
	out := make([]span, len(chunks))
	for i, c := range chunks {
		out[i] = span{c.Start.Format(time.RFC3339Nano), c.End.Format(time.RFC3339Nano), c.Duration()}
	}
	return out
}

func mustChunks(tb testing.TB, c backfill.Chunker) []backfill.Chunk {
	tb.Helper()
	chunks, err := c.Chunks(context.Background())
	require.NoError(tb, err, c.Scope())
	return chunks
}

// requireTimeTiling checks the invariants every time chunker promises: the
// chunks tile [start, end) in order, Seq is the position, IDs derive from
// the bounds in loc and are unique.
func requireTimeTiling(t require.TestingT, chunks []backfill.Chunk, start, end time.Time, loc *time.Location) {
	require.NotEmpty(t, chunks)
	require.True(t, chunks[0].Start.Equal(start), "first start %v, want %v", chunks[0].Start, start)
	require.True(t, chunks[len(chunks)-1].End.Equal(end), "last end %v, want %v", chunks[len(chunks)-1].End, end)
	ids := make(map[string]bool, len(chunks))
	for i, c := range chunks {
		require.Equal(t, i, c.Seq)
		require.Equal(t, backfilltype.KindTime, c.Kind)
		require.True(t, c.Start.Before(c.End), "chunk %d %v is empty", i, c)
		require.Equal(t, loc.String(), c.Start.Location().String())
		require.Equal(t, loc.String(), c.End.Location().String())
		require.Equal(t, "time:"+c.Start.Format(time.RFC3339Nano)+"/"+c.End.Format(time.RFC3339Nano), c.ID)
		require.False(t, ids[c.ID], "duplicate ID %s", c.ID)
		ids[c.ID] = true
		require.True(t, c.Contains(c.Start), "chunk %v does not contain its start", c)
		require.False(t, c.Contains(c.End), "chunk %v contains its end", c)
		if i > 0 {
			require.True(t, chunks[i-1].End.Equal(c.Start), "gap or overlap between %v and %v", chunks[i-1], c)
		}
	}
}

// containing returns the indexes of the chunks that contain v.
func containing(chunks []backfill.Chunk, v any) []int {
	var out []int
	for i, c := range chunks {
		if c.Contains(v) {
			out = append(out, i)
		}
	}
	return out
}

func TestDaysDST(t *testing.T) {
	t.Parallel()
	tests := []struct {
		zone       string
		start, end string // local dates, end exclusive
		want       []span
	}{
		{"America/New_York", "2024-03-09", "2024-03-12", []span{
			{"2024-03-09T00:00:00-05:00", "2024-03-10T00:00:00-05:00", 24 * time.Hour},
			{"2024-03-10T00:00:00-05:00", "2024-03-11T00:00:00-04:00", 23 * time.Hour},
			{"2024-03-11T00:00:00-04:00", "2024-03-12T00:00:00-04:00", 24 * time.Hour},
		}},
		{"America/New_York", "2024-11-02", "2024-11-05", []span{
			{"2024-11-02T00:00:00-04:00", "2024-11-03T00:00:00-04:00", 24 * time.Hour},
			{"2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00", 25 * time.Hour},
			{"2024-11-04T00:00:00-05:00", "2024-11-05T00:00:00-05:00", 24 * time.Hour},
		}},
		{"Europe/Berlin", "2024-03-30", "2024-04-02", []span{
			{"2024-03-30T00:00:00+01:00", "2024-03-31T00:00:00+01:00", 24 * time.Hour},
			{"2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 23 * time.Hour},
			{"2024-04-01T00:00:00+02:00", "2024-04-02T00:00:00+02:00", 24 * time.Hour},
		}},
		{"Europe/Berlin", "2024-10-26", "2024-10-29", []span{
			{"2024-10-26T00:00:00+02:00", "2024-10-27T00:00:00+02:00", 24 * time.Hour},
			{"2024-10-27T00:00:00+02:00", "2024-10-28T00:00:00+01:00", 25 * time.Hour},
			{"2024-10-28T00:00:00+01:00", "2024-10-29T00:00:00+01:00", 24 * time.Hour},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.zone+"/"+tt.start, func(t *testing.T) {
			t.Parallel()
			loc := mustLoad(t, tt.zone)
			start, end := localDate(t, tt.start, loc), localDate(t, tt.end, loc)
			chunks := mustChunks(t, backfill.Days(start, end, loc))
			requireTimeTiling(t, chunks, start, end, loc)
			if diff := cmp.Diff(tt.want, spans(chunks)); diff != "" {
				t.Errorf("Days chunks mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// localDate parses "2006-01-02" as midnight in loc.
func localDate(tb testing.TB, s string, loc *time.Location) time.Time {
	tb.Helper()
	d, err := time.ParseInLocation("2006-01-02", s, loc)
	require.NoError(tb, err)
	return d
}

func TestDaysID(t *testing.T) {
	t.Parallel()
	ny := mustLoad(t, "America/New_York")
	// Bounds given in UTC: chunks are still expressed in the chunker's zone.
	start := time.Date(2024, 3, 10, 5, 0, 0, 0, time.UTC)
	end := time.Date(2024, 3, 11, 4, 0, 0, 0, time.UTC)
	chunks := mustChunks(t, backfill.Days(start, end, ny))
	require.Len(t, chunks, 1)
	require.Equal(t, "time:2024-03-10T00:00:00-05:00/2024-03-11T00:00:00-04:00", chunks[0].ID)
	require.Equal(t, "[2024-03-10T00:00:00-05:00, 2024-03-11T00:00:00-04:00) America/New_York 23h0m0s", chunks[0].String())
	lower, upper := chunks[0].Bounds()
	require.Equal(t, "2024-03-10T00:00:00-05:00", lower)
	require.Equal(t, "2024-03-11T00:00:00-04:00", upper)
}

func TestDaysClipped(t *testing.T) {
	t.Parallel()
	berlin := mustLoad(t, "Europe/Berlin")
	start := time.Date(2024, 3, 30, 6, 30, 0, 0, berlin)
	end := time.Date(2024, 4, 1, 12, 0, 0, 0, berlin)
	chunks := mustChunks(t, backfill.Days(start, end, berlin))
	requireTimeTiling(t, chunks, start, end, berlin)
	want := []span{
		{"2024-03-30T06:30:00+01:00", "2024-03-31T00:00:00+01:00", 17*time.Hour + 30*time.Minute},
		{"2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 23 * time.Hour},
		{"2024-04-01T00:00:00+02:00", "2024-04-01T12:00:00+02:00", 12 * time.Hour},
	}
	if diff := cmp.Diff(want, spans(chunks)); diff != "" {
		t.Errorf("clipped Days mismatch (-want +got):\n%s", diff)
	}

	// A scope inside one day is one clipped chunk.
	inner := mustChunks(t, backfill.Days(start, start.Add(time.Hour), berlin))
	if diff := cmp.Diff([]span{{"2024-03-30T06:30:00+01:00", "2024-03-30T07:30:00+01:00", time.Hour}}, spans(inner)); diff != "" {
		t.Errorf("one-hour Days mismatch (-want +got):\n%s", diff)
	}
}

// TestDaysMidnightTransitions covers zones that change the clock at
// midnight. Where midnight does not exist, time.Date returns 23:00 of the
// previous day for some of them (it does not promise a side of the gap), so
// Days must find the first instant of the date itself.
func TestDaysMidnightTransitions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		zone       string
		start, end time.Time // civil dates, converted to midnight in zone (or to the given instant)
		want       []span
	}{
		{"santiago spring forward skips midnight", "America/Santiago",
			time.Date(2024, 9, 7, 0, 0, 0, 0, time.UTC), time.Date(2024, 9, 10, 0, 0, 0, 0, time.UTC), []span{
				{"2024-09-07T00:00:00-04:00", "2024-09-08T01:00:00-03:00", 24 * time.Hour},
				{"2024-09-08T01:00:00-03:00", "2024-09-09T00:00:00-03:00", 23 * time.Hour},
				{"2024-09-09T00:00:00-03:00", "2024-09-10T00:00:00-03:00", 24 * time.Hour},
			}},
		{"santiago fall back repeats the last hour of saturday", "America/Santiago",
			time.Date(2024, 4, 6, 0, 0, 0, 0, time.UTC), time.Date(2024, 4, 8, 0, 0, 0, 0, time.UTC), []span{
				{"2024-04-06T00:00:00-03:00", "2024-04-07T00:00:00-04:00", 25 * time.Hour},
				{"2024-04-07T00:00:00-04:00", "2024-04-08T00:00:00-04:00", 24 * time.Hour},
			}},
		{"havana spring forward skips midnight", "America/Havana",
			time.Date(2024, 3, 9, 0, 0, 0, 0, time.UTC), time.Date(2024, 3, 11, 0, 0, 0, 0, time.UTC), []span{
				{"2024-03-09T00:00:00-05:00", "2024-03-10T01:00:00-04:00", 24 * time.Hour},
				{"2024-03-10T01:00:00-04:00", "2024-03-11T00:00:00-04:00", 23 * time.Hour},
			}},
		{"havana fall back repeats the first hour of sunday", "America/Havana",
			time.Date(2024, 11, 3, 0, 0, 0, 0, time.UTC), time.Date(2024, 11, 4, 0, 0, 0, 0, time.UTC), []span{
				// The first of the two midnights.
				{"2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00", 25 * time.Hour},
			}},
		{"beirut spring forward skips midnight", "Asia/Beirut",
			time.Date(2024, 3, 30, 0, 0, 0, 0, time.UTC), time.Date(2024, 4, 1, 0, 0, 0, 0, time.UTC), []span{
				{"2024-03-30T00:00:00+02:00", "2024-03-31T01:00:00+03:00", 24 * time.Hour},
				{"2024-03-31T01:00:00+03:00", "2024-04-01T00:00:00+03:00", 23 * time.Hour},
			}},
		{"beirut fall back repeats the last hour of saturday", "Asia/Beirut",
			time.Date(2024, 10, 26, 0, 0, 0, 0, time.UTC), time.Date(2024, 10, 28, 0, 0, 0, 0, time.UTC), []span{
				{"2024-10-26T00:00:00+03:00", "2024-10-27T00:00:00+02:00", 25 * time.Hour},
				{"2024-10-27T00:00:00+02:00", "2024-10-28T00:00:00+02:00", 24 * time.Hour},
			}},
		{"apia skipped 2011-12-30 entirely", "Pacific/Apia",
			time.Date(2011, 12, 29, 0, 0, 0, 0, time.UTC), time.Date(2012, 1, 1, 0, 0, 0, 0, time.UTC), []span{
				{"2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00", 24 * time.Hour},
				{"2011-12-31T00:00:00+14:00", "2012-01-01T00:00:00+14:00", 24 * time.Hour},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			loc := mustLoad(t, tt.zone)
			start, err := time.Parse(time.RFC3339, tt.want[0].Start)
			require.NoError(t, err)
			end, err := time.Parse(time.RFC3339, tt.want[len(tt.want)-1].End)
			require.NoError(t, err)
			// The scope is given as the civil dates; its first instant must
			// be what Days calls the start of that date.
			require.Equal(t, tt.start.Format("2006-01-02"), start.In(loc).Format("2006-01-02"))
			require.Equal(t, tt.end.Format("2006-01-02"), end.In(loc).Format("2006-01-02"))

			chunks := mustChunks(t, backfill.Days(start, end, loc))
			requireTimeTiling(t, chunks, start, end, loc)
			if diff := cmp.Diff(tt.want, spans(chunks)); diff != "" {
				t.Errorf("Days mismatch (-want +got):\n%s", diff)
			}
			// Each day starts at the first instant of its date: one
			// nanosecond earlier is an earlier date.
			for _, c := range chunks[1:] {
				require.Less(t, civilDay(c.Start.Add(-time.Nanosecond)), civilDay(c.Start), "chunk %v", c)
			}
		})
	}
}

// TestDaysNonexistentMidnightFromDate starts a Days scope at Go's
// normalisation of a midnight that does not exist and checks that the
// chunk of that date still starts at 01:00.
func TestDaysNonexistentMidnightFromDate(t *testing.T) {
	t.Parallel()
	santiago := mustLoad(t, "America/Santiago")
	start := time.Date(2024, 9, 6, 0, 0, 0, 0, santiago)
	end := time.Date(2024, 9, 10, 0, 0, 0, 0, santiago)
	chunks := mustChunks(t, backfill.Days(start, end, santiago))
	requireTimeTiling(t, chunks, start, end, santiago)
	require.Len(t, chunks, 4)
	require.Equal(t, "time:2024-09-08T01:00:00-03:00/2024-09-09T00:00:00-03:00", chunks[2].ID)
	require.Equal(t, 23*time.Hour, chunks[2].Duration())
	// Just before 01:00 -03 the clock read 23:59:59 on the 7th (-04).
	require.True(t, chunks[1].Contains(time.Date(2024, 9, 8, 3, 59, 59, 0, time.UTC)))
	require.True(t, chunks[2].Contains(time.Date(2024, 9, 8, 4, 0, 0, 0, time.UTC)))
}

func TestMonths(t *testing.T) {
	t.Parallel()
	ny := mustLoad(t, "America/New_York")
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, ny)
	end := time.Date(2025, 1, 1, 0, 0, 0, 0, ny)
	chunks := mustChunks(t, backfill.Months(start, end, ny))
	requireTimeTiling(t, chunks, start, end, ny)

	const day = 24 * time.Hour
	want := []span{
		{"2024-01-01T00:00:00-05:00", "2024-02-01T00:00:00-05:00", 31 * day},
		{"2024-02-01T00:00:00-05:00", "2024-03-01T00:00:00-05:00", 29 * day}, // leap year
		{"2024-03-01T00:00:00-05:00", "2024-04-01T00:00:00-04:00", 31*day - time.Hour},
		{"2024-04-01T00:00:00-04:00", "2024-05-01T00:00:00-04:00", 30 * day},
		{"2024-05-01T00:00:00-04:00", "2024-06-01T00:00:00-04:00", 31 * day},
		{"2024-06-01T00:00:00-04:00", "2024-07-01T00:00:00-04:00", 30 * day},
		{"2024-07-01T00:00:00-04:00", "2024-08-01T00:00:00-04:00", 31 * day},
		{"2024-08-01T00:00:00-04:00", "2024-09-01T00:00:00-04:00", 31 * day},
		{"2024-09-01T00:00:00-04:00", "2024-10-01T00:00:00-04:00", 30 * day},
		{"2024-10-01T00:00:00-04:00", "2024-11-01T00:00:00-04:00", 31 * day},
		{"2024-11-01T00:00:00-04:00", "2024-12-01T00:00:00-05:00", 30*day + time.Hour},
		{"2024-12-01T00:00:00-05:00", "2025-01-01T00:00:00-05:00", 31 * day},
	}
	if diff := cmp.Diff(want, spans(chunks)); diff != "" {
		t.Errorf("Months mismatch (-want +got):\n%s", diff)
	}
	require.Equal(t, "months [2024-01-01T00:00:00-05:00, 2025-01-01T00:00:00-05:00) America/New_York", backfill.Months(start, end, ny).Scope())
}

func TestMonthsClippedAndNonLeap(t *testing.T) {
	t.Parallel()
	// Month ends across a non-leap February, with a scope that starts and
	// ends mid-month, in UTC.
	start := time.Date(2023, 1, 31, 12, 0, 0, 0, time.UTC)
	end := time.Date(2023, 4, 15, 0, 0, 0, 0, time.UTC)
	chunks := mustChunks(t, backfill.Months(start, end, time.UTC))
	requireTimeTiling(t, chunks, start, end, time.UTC)
	want := []span{
		{"2023-01-31T12:00:00Z", "2023-02-01T00:00:00Z", 12 * time.Hour},
		{"2023-02-01T00:00:00Z", "2023-03-01T00:00:00Z", 28 * 24 * time.Hour},
		{"2023-03-01T00:00:00Z", "2023-04-01T00:00:00Z", 31 * 24 * time.Hour},
		{"2023-04-01T00:00:00Z", "2023-04-15T00:00:00Z", 14 * 24 * time.Hour},
	}
	if diff := cmp.Diff(want, spans(chunks)); diff != "" {
		t.Errorf("Months mismatch (-want +got):\n%s", diff)
	}
}

func TestMonthsNonexistentFirst(t *testing.T) {
	t.Parallel()
	// Syria started daylight saving at midnight on April 1 from 1999 to
	// 2006, so 2002-04-01T00:00 never happened in Asia/Damascus, and ended
	// it at midnight on October 1, so 2002-09-30T23:00 happened twice.
	damascus := mustLoad(t, "Asia/Damascus")
	start := time.Date(2002, 3, 1, 0, 0, 0, 0, damascus)
	end := time.Date(2002, 11, 1, 0, 0, 0, 0, damascus)
	chunks := mustChunks(t, backfill.Months(start, end, damascus))
	requireTimeTiling(t, chunks, start, end, damascus)
	want := []span{
		{"2002-03-01T00:00:00+02:00", "2002-04-01T01:00:00+03:00", 744 * time.Hour},
		{"2002-04-01T01:00:00+03:00", "2002-05-01T00:00:00+03:00", 719 * time.Hour},
		{"2002-05-01T00:00:00+03:00", "2002-06-01T00:00:00+03:00", 744 * time.Hour},
		{"2002-06-01T00:00:00+03:00", "2002-07-01T00:00:00+03:00", 720 * time.Hour},
		{"2002-07-01T00:00:00+03:00", "2002-08-01T00:00:00+03:00", 744 * time.Hour},
		{"2002-08-01T00:00:00+03:00", "2002-09-01T00:00:00+03:00", 744 * time.Hour},
		{"2002-09-01T00:00:00+03:00", "2002-10-01T00:00:00+02:00", 721 * time.Hour},
		{"2002-10-01T00:00:00+02:00", "2002-11-01T00:00:00+02:00", 744 * time.Hour},
	}
	if diff := cmp.Diff(want, spans(chunks)); diff != "" {
		t.Errorf("Months mismatch (-want +got):\n%s", diff)
	}
}

func TestHours(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		zone       string
		start, end time.Time
		want       []span
	}{
		{"new york spring forward", "America/New_York",
			time.Date(2024, 3, 10, 5, 0, 0, 0, time.UTC), time.Date(2024, 3, 10, 8, 0, 0, 0, time.UTC), []span{
				{"2024-03-10T00:00:00-05:00", "2024-03-10T01:00:00-05:00", time.Hour},
				{"2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00", time.Hour},
				{"2024-03-10T03:00:00-04:00", "2024-03-10T04:00:00-04:00", time.Hour},
			}},
		{"new york fall back repeats 01:00", "America/New_York",
			time.Date(2024, 11, 3, 4, 0, 0, 0, time.UTC), time.Date(2024, 11, 3, 8, 0, 0, 0, time.UTC), []span{
				{"2024-11-03T00:00:00-04:00", "2024-11-03T01:00:00-04:00", time.Hour},
				{"2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00", time.Hour},
				{"2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00", time.Hour},
				{"2024-11-03T02:00:00-05:00", "2024-11-03T03:00:00-05:00", time.Hour},
			}},
		{"kolkata half-hour offset, clipped both ends", "Asia/Kolkata",
			time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 1, 1, 3, 0, 0, 0, time.UTC), []span{
				{"2024-01-01T05:30:00+05:30", "2024-01-01T06:00:00+05:30", 30 * time.Minute},
				{"2024-01-01T06:00:00+05:30", "2024-01-01T07:00:00+05:30", time.Hour},
				{"2024-01-01T07:00:00+05:30", "2024-01-01T08:00:00+05:30", time.Hour},
				{"2024-01-01T08:00:00+05:30", "2024-01-01T08:30:00+05:30", 30 * time.Minute},
			}},
		{"kathmandu 45-minute offset", "Asia/Kathmandu",
			time.Date(2024, 1, 1, 0, 15, 0, 0, time.UTC), time.Date(2024, 1, 1, 2, 15, 0, 0, time.UTC), []span{
				{"2024-01-01T06:00:00+05:45", "2024-01-01T07:00:00+05:45", time.Hour},
				{"2024-01-01T07:00:00+05:45", "2024-01-01T08:00:00+05:45", time.Hour},
			}},
		{"lord howe 30-minute spring forward", "Australia/Lord_Howe",
			time.Date(2024, 10, 5, 13, 30, 0, 0, time.UTC), time.Date(2024, 10, 5, 17, 0, 0, 0, time.UTC), []span{
				{"2024-10-06T00:00:00+10:30", "2024-10-06T01:00:00+10:30", time.Hour},
				{"2024-10-06T01:00:00+10:30", "2024-10-06T02:30:00+11:00", time.Hour},
				{"2024-10-06T02:30:00+11:00", "2024-10-06T03:00:00+11:00", 30 * time.Minute},
				{"2024-10-06T03:00:00+11:00", "2024-10-06T04:00:00+11:00", time.Hour},
			}},
		{"lord howe 30-minute fall back", "Australia/Lord_Howe",
			time.Date(2024, 4, 6, 13, 0, 0, 0, time.UTC), time.Date(2024, 4, 6, 16, 30, 0, 0, time.UTC), []span{
				{"2024-04-07T00:00:00+11:00", "2024-04-07T01:00:00+11:00", time.Hour},
				{"2024-04-07T01:00:00+11:00", "2024-04-07T01:30:00+10:30", time.Hour},
				{"2024-04-07T01:30:00+10:30", "2024-04-07T02:00:00+10:30", 30 * time.Minute},
				{"2024-04-07T02:00:00+10:30", "2024-04-07T03:00:00+10:30", time.Hour},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			loc := mustLoad(t, tt.zone)
			chunks := mustChunks(t, backfill.Hours(tt.start, tt.end, loc))
			requireTimeTiling(t, chunks, tt.start, tt.end, loc)
			if diff := cmp.Diff(tt.want, spans(chunks)); diff != "" {
				t.Errorf("Hours mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEvery(t *testing.T) {
	t.Parallel()
	ny := mustLoad(t, "America/New_York")
	start := time.Date(2024, 3, 9, 12, 0, 0, 0, ny)
	end := time.Date(2024, 3, 11, 0, 0, 0, 0, ny)
	chunks := mustChunks(t, backfill.Every(start, end, 16*time.Hour, ny))
	requireTimeTiling(t, chunks, start, end, ny)
	want := []span{
		// 16 hours after 12:00 EST is 04:00 EST, which the clock shows as
		// 05:00 EDT: Every counts elapsed time, not wall-clock hours.
		{"2024-03-09T12:00:00-05:00", "2024-03-10T05:00:00-04:00", 16 * time.Hour},
		{"2024-03-10T05:00:00-04:00", "2024-03-10T21:00:00-04:00", 16 * time.Hour},
		{"2024-03-10T21:00:00-04:00", "2024-03-11T00:00:00-04:00", 3 * time.Hour}, // clipped
	}
	if diff := cmp.Diff(want, spans(chunks)); diff != "" {
		t.Errorf("Every mismatch (-want +got):\n%s", diff)
	}
	require.Equal(t, "every 16h0m0s [2024-03-09T12:00:00-05:00, 2024-03-11T00:00:00-04:00) America/New_York",
		backfill.Every(start, end, 16*time.Hour, ny).Scope())
}

func TestTimeScope(t *testing.T) {
	t.Parallel()
	ny := mustLoad(t, "America/New_York")
	// Bounds in another location are shown in the chunker's location.
	start := time.Date(2024, 3, 1, 5, 0, 0, 0, time.UTC)
	end := time.Date(2024, 4, 1, 4, 0, 0, 0, time.UTC)
	tests := []struct {
		c    backfill.Chunker
		want string
	}{
		{backfill.Days(start, end, ny), "days [2024-03-01T00:00:00-05:00, 2024-04-01T00:00:00-04:00) America/New_York"},
		{backfill.Hours(start, end, ny), "hours [2024-03-01T00:00:00-05:00, 2024-04-01T00:00:00-04:00) America/New_York"},
		{backfill.Months(start, end, time.UTC), "months [2024-03-01T05:00:00Z, 2024-04-01T04:00:00Z) UTC"},
		{backfill.Every(start, end, 90*time.Minute, ny), "every 1h30m0s [2024-03-01T00:00:00-05:00, 2024-04-01T00:00:00-04:00) America/New_York"},
		{backfill.Days(start, end, nil), "days [2024-03-01T05:00:00Z, 2024-04-01T04:00:00Z) <nil>"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, tt.c.Scope())
	}
	require.NotEqual(t, backfill.Days(start, end, ny).Scope(), backfill.Days(start, end.Add(time.Nanosecond), ny).Scope())
}

func TestTimeChunkerErrors(t *testing.T) {
	t.Parallel()
	ny := mustLoad(t, "America/New_York")
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, ny)
	end := time.Date(2024, 4, 1, 0, 0, 0, 0, ny)
	odd := time.FixedZone("odd", 5*3600+30) // +05:00:30: not representable in RFC 3339
	tests := []struct {
		name    string
		c       backfill.Chunker
		want    error
		mention string
	}{
		{"nil location", backfill.Days(start, end, nil), backfill.ErrInvalidScope, "nil location"},
		{"nil location hours", backfill.Hours(start, end, nil), backfill.ErrInvalidScope, "nil location"},
		{"start equals end", backfill.Days(start, start, ny), backfill.ErrEmptyScope, "start 2024-03-01T00:00:00-05:00 is not before end 2024-03-01T00:00:00-05:00"},
		{"start after end", backfill.Months(end, start, ny), backfill.ErrEmptyScope, "start 2024-04-01T00:00:00-04:00"},
		{"zero start", backfill.Hours(time.Time{}, end, ny), backfill.ErrInvalidScope, "start is the zero time"},
		{"zero end", backfill.Hours(start, time.Time{}, ny), backfill.ErrInvalidScope, "end is the zero time"},
		{"year 10000", backfill.Days(start, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.UTC), backfill.ErrInvalidScope, "end 10000"},
		{"zero step", backfill.Every(start, end, 0, ny), backfill.ErrInvalidScope, "step is not positive"},
		{"negative step", backfill.Every(start, end, -time.Hour, ny), backfill.ErrInvalidScope, "every -1h0m0s"},
		{"offset with seconds", backfill.Days(time.Date(2024, 1, 1, 0, 0, 0, 0, odd), time.Date(2024, 1, 3, 0, 0, 0, 0, odd), odd), backfill.ErrInvalidScope, "UTC offset 18030s"},
		{"too many chunks", backfill.Every(start, end, time.Second, ny), backfill.ErrInvalidScope, "more than 1048576 chunks"},
		{"too many hours", backfill.Hours(start, start.AddDate(200, 0, 0), ny), backfill.ErrInvalidScope, "more than 1048576 chunks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			chunks, err := tt.c.Chunks(context.Background())
			require.ErrorIs(t, err, tt.want)
			require.Nil(t, chunks)
			require.True(t, strings.HasPrefix(err.Error(), "backfill: "), err.Error())
			require.Contains(t, err.Error(), tt.mention)
		})
	}
}

func TestTimeChunkerCanceled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err := backfill.Days(start, start.AddDate(0, 0, 3), time.UTC).Chunks(ctx)
	require.ErrorIs(t, err, context.Canceled)
}

// civilDay is the date of t's wall clock as yyyymmdd.
func civilDay(t time.Time) int {
	y, m, d := t.Date()
	return y*10000 + int(m)*100 + d
}

// civilHour is t's wall clock truncated to the hour, as a time in UTC.
func civilHour(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, t.Hour(), 0, 0, 0, time.UTC)
}

func offset(t time.Time) int {
	_, off := t.Zone()
	return off
}

func TestTimeChunkersProperty(t *testing.T) {
	t.Parallel()
	locs := make([]*time.Location, len(propertyZones))
	for i, z := range propertyZones {
		locs[i] = mustLoad(t, z)
	}
	minStart := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	// Past 2037 Go extrapolates each zone's TZ rule instead of reading
	// listed transitions; cover both.
	maxStart := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).Unix()

	for _, kind := range []string{"hours", "days", "months", "every"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			rapid.Check(t, func(rt *rapid.T) {
				loc := rapid.SampledFrom(locs).Draw(rt, "loc")
				start := time.Unix(rapid.Int64Range(minStart, maxStart).Draw(rt, "startSec"), 0)
				switch rapid.IntRange(0, 3).Draw(rt, "startShape") {
				case 0: // a few hours before a zone transition
					if _, next := start.In(loc).ZoneBounds(); !next.IsZero() {
						start = next.Add(-time.Duration(rapid.IntRange(0, 72).Draw(rt, "hoursBefore")) * time.Hour)
					}
				case 1: // Go's idea of local midnight
					y, m, d := start.In(loc).Date()
					start = time.Date(y, m, d, 0, 0, 0, 0, loc)
				case 2: // arbitrary nanoseconds
					start = start.Add(time.Duration(rapid.Int64Range(0, 1e9-1).Draw(rt, "startNanos")))
				}
				var (
					c    backfill.Chunker
					end  time.Time
					step time.Duration
				)
				switch kind {
				case "hours":
					end = start.Add(time.Duration(rapid.Int64Range(1, int64(15*24*time.Hour)).Draw(rt, "span")))
					c = backfill.Hours(start, end, loc)
				case "days":
					end = start.Add(time.Duration(rapid.Int64Range(1, int64(400*24*time.Hour)).Draw(rt, "span")))
					c = backfill.Days(start, end, loc)
				case "months":
					end = start.Add(time.Duration(rapid.Int64Range(1, int64(12*366*24*time.Hour)).Draw(rt, "span")))
					c = backfill.Months(start, end, loc)
				case "every":
					step = time.Duration(rapid.Int64Range(1, int64(72*time.Hour)).Draw(rt, "step"))
					n := rapid.Int64Range(1, 400).Draw(rt, "steps")
					end = start.Add(time.Duration(n)*step - time.Duration(rapid.Int64Range(0, int64(step)-1).Draw(rt, "short")))
					c = backfill.Every(start, end, step, loc)
				}
				chunks, err := c.Chunks(context.Background())
				require.NoError(rt, err, c.Scope())
				requireTimeTiling(rt, chunks, start, end, loc)

				again, err := c.Chunks(context.Background())
				require.NoError(rt, err)
				if diff := cmp.Diff(chunks, again); diff != "" {
					rt.Fatalf("second call differs (-first +second):\n%s", diff)
				}

				// What the kind promises about its boundaries.
				for i, ch := range chunks {
					last := ch.End.Add(-time.Nanosecond)
					interior := i > 0
					switch kind {
					case "hours":
						require.LessOrEqual(rt, ch.Duration(), time.Hour, "chunk %v", ch)
						require.Equal(rt, civilHour(ch.Start), civilHour(last), "chunk %v spans two local hours", ch)
						require.Equal(rt, offset(ch.Start), offset(last), "chunk %v spans an offset change", ch)
						if interior {
							onHour := ch.Start.Minute() == 0 && ch.Start.Second() == 0 && ch.Start.Nanosecond() == 0
							offChange := offset(ch.Start) != offset(ch.Start.Add(-time.Nanosecond))
							require.True(rt, onHour || offChange, "boundary %v is neither a whole hour nor an offset change", ch.Start)
						}
					case "days":
						require.Equal(rt, civilDay(ch.Start), civilDay(last), "chunk %v spans two local dates", ch)
						if interior {
							require.Less(rt, civilDay(ch.Start.Add(-time.Nanosecond)), civilDay(ch.Start),
								"boundary %v is not the first instant of its date", ch.Start)
						}
					case "months":
						require.Equal(rt, civilDay(ch.Start)/100, civilDay(last)/100, "chunk %v spans two local months", ch)
						if interior {
							require.Less(rt, civilDay(ch.Start.Add(-time.Nanosecond))/100, civilDay(ch.Start)/100,
								"boundary %v is not the first instant of its month", ch.Start)
						}
					case "every":
						require.True(rt, ch.Start.Equal(start.Add(time.Duration(i)*step)), "chunk %d %v not aligned to start", i, ch)
						if i < len(chunks)-1 {
							require.Equal(rt, step, ch.Duration())
						} else {
							require.LessOrEqual(rt, ch.Duration(), step)
						}
					}
				}

				// Every instant of the scope is in exactly one chunk,
				// whatever location it is expressed in.
				total := end.Sub(start)
				for i := range 20 {
					at := start.Add(time.Duration(rapid.Int64Range(0, int64(total)-1).Draw(rt, fmt.Sprint("in", i))))
					at = at.In(rapid.SampledFrom(locs).Draw(rt, fmt.Sprint("inLoc", i)))
					require.Len(rt, containing(chunks, at), 1, "instant %v", at)
				}
				before := start.Add(-time.Duration(rapid.Int64Range(1, int64(40*24*time.Hour)).Draw(rt, "before")))
				after := end.Add(time.Duration(rapid.Int64Range(0, int64(40*24*time.Hour)).Draw(rt, "after")))
				require.Empty(rt, containing(chunks, before), "instant %v before the scope", before)
				require.Empty(rt, containing(chunks, after), "instant %v after the scope", after)
				require.Empty(rt, containing(chunks, start.Unix()), "an int64 is not an instant")
			})
		})
	}
}

// TestDaysMatchesTimeDate checks Days against time.Date wherever time.Date
// lands on the date it was asked for (every midnight that exists once),
// over several years of every property zone.
func TestDaysMatchesTimeDate(t *testing.T) {
	t.Parallel()
	for _, z := range propertyZones {
		t.Run(z, func(t *testing.T) {
			t.Parallel()
			loc := mustLoad(t, z)
			start := time.Date(2015, 1, 1, 0, 0, 0, 0, loc)
			end := time.Date(2027, 1, 1, 0, 0, 0, 0, loc)
			chunks := mustChunks(t, backfill.Days(start, end, loc))
			requireTimeTiling(t, chunks, start, end, loc)
			byDate := make(map[int]backfill.Chunk, len(chunks))
			for _, c := range chunks {
				byDate[civilDay(c.Start)] = c
			}
			checked := 0
			for d := start; d.Before(end); d = d.AddDate(0, 0, 1) {
				y, m, dd := d.Date()
				midnight := time.Date(y, m, dd, 0, 0, 0, 0, loc)
				if midnight.Hour() != 0 || civilDay(midnight) != y*10000+int(m)*100+dd {
					continue // nonexistent midnight: covered by TestDaysMidnightTransitions
				}
				c, ok := byDate[civilDay(midnight)]
				require.True(t, ok, "no chunk for %v", midnight)
				require.True(t, c.Start.Equal(midnight) || c.Start.Before(midnight), "chunk %v starts after %v", c, midnight)
				if c.Start.Equal(midnight) {
					checked++
				}
			}
			require.Greater(t, checked, 4000)
		})
	}
}

// TestTimeChunkersExtrapolatedLeapYear covers the years Go computes from a
// zone's TZ rule rather than its transition list. There ZoneBounds reports
// the end of a leap year one day early (at or before the instant asked
// about), which must neither hang nor move a boundary.
func TestTimeChunkersExtrapolatedLeapYear(t *testing.T) {
	t.Parallel()
	for _, z := range []string{"America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Santiago"} {
		t.Run(z, func(t *testing.T) {
			t.Parallel()
			loc := mustLoad(t, z)
			start := time.Date(2040, 12, 30, 0, 0, 0, 0, loc)
			end := time.Date(2041, 1, 2, 0, 0, 0, 0, loc)

			days := mustChunks(t, backfill.Days(start, end, loc))
			requireTimeTiling(t, days, start, end, loc)
			require.Len(t, days, 3)
			for _, c := range days {
				require.Equal(t, 24*time.Hour, c.Duration(), "chunk %v", c)
				require.Zero(t, c.Start.Hour(), "chunk %v", c)
			}

			hours := mustChunks(t, backfill.Hours(start, end, loc))
			requireTimeTiling(t, hours, start, end, loc)
			require.Len(t, hours, 72)
			for _, c := range hours {
				require.Equal(t, time.Hour, c.Duration(), "chunk %v", c)
			}

			months := mustChunks(t, backfill.Months(time.Date(2040, 1, 1, 0, 0, 0, 0, loc), time.Date(2042, 1, 1, 0, 0, 0, 0, loc), loc))
			require.Len(t, months, 24)
			for _, c := range months {
				require.Equal(t, 1, c.Start.Day(), "chunk %v", c)
			}
		})
	}
}

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
