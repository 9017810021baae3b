package backfill

import (
	"time"

	"github.com/pgbackfill/backfill/internal/chunkers"
)

// Hours returns a [Chunker] of [backfilltype.KindTime] chunks, one per
// clock hour of the IANA location loc, that tile the half-open scope
// [start, end).
//
// start and end are instants (a time.Time in any location). A boundary is
// every instant at which loc's clock reads a whole hour, plus every
// instant at which loc's UTC offset changes, so every chunk lies inside
// one local clock hour under one offset and is at most one hour long: the
// repeated autumn hour of a daylight-saving change yields two chunks, and
// a 30-minute change a 30-minute chunk. If start or end is not on a
// boundary, the first or last chunk is clipped to the scope. The chunks'
// Start and End are expressed in loc; their IDs are "time:<Start>/<End>"
// in RFC 3339 with nanoseconds and loc's offset, e.g.
// "time:2024-03-10T01:00:00-05:00/2024-03-10T03:00:00-04:00". Scope is
// "hours [<start>, <end>) <loc>". The Chunker is immutable and safe for
// concurrent use.
//
// Chunks returns [ErrInvalidScope] if loc is nil, start or end is the zero
// time or outside the years 0001 to 9999 in loc, a boundary has a UTC
// offset with seconds, or the scope has more than 1<<20 chunks; and
// [ErrEmptyScope] if start is not before end. Pass a location from
// [time.LoadLocation]: [time.Local] is named "Local" in Scope whatever zone
// the host uses. The design note docs/design/time-chunks.md gives examples.
func Hours(start, end time.Time, loc *time.Location) Chunker {
	return &chunkers.Time{Unit: chunkers.UnitHour, Start: start, End: end, Loc: loc}
}

// Days returns a [Chunker] of [backfilltype.KindTime] chunks, one per
// calendar day of the IANA location loc, that tile the half-open scope
// [start, end).
//
// A day starts at the first instant at which loc's clock reads that date:
// local midnight on almost every day, so a day is 24 hours long, or 23 or
// 25 across a daylight-saving change ([backfilltype.Chunk.Duration] says
// which). Where a change skips midnight the day starts at the change; where
// midnight occurs twice, at the first; a date that does not exist has no
// chunk. Boundaries come from the zone's transitions
// ([time.Time.ZoneBounds]), not from [time.Date], which is ambiguous there.
// If start or end is not on a boundary, the first or last chunk is clipped
// to the scope. IDs and Start and End are as for [Hours], e.g.
// "time:2024-03-10T00:00:00-05:00/2024-03-11T00:00:00-04:00". Scope is
// "days [<start>, <end>) <loc>", e.g. "days [2024-03-01T00:00:00-05:00,
// 2024-04-01T00:00:00-04:00) America/New_York". The Chunker is immutable
// and safe for concurrent use.
//
// Chunks returns the same errors as for [Hours]. Pass a location from
// [time.LoadLocation] rather than [time.Local]. The design note
// docs/design/time-chunks.md gives examples.
func Days(start, end time.Time, loc *time.Location) Chunker {
	return &chunkers.Time{Unit: chunkers.UnitDay, Start: start, End: end, Loc: loc}
}

// Months returns a [Chunker] of [backfilltype.KindTime] chunks, one per
// calendar month of the IANA location loc, that tile the half-open scope
// [start, end).
//
// A month starts at the start of its first day, as defined by [Days]: local
// midnight of the 1st, or the first instant of the 1st where a
// daylight-saving change skips that midnight. Chunks are 28 to 31 days long,
// give or take a daylight-saving hour. start and end are instants; the
// chunks' Start and End are expressed in loc and their IDs are
// "time:<Start>/<End>" in RFC 3339 with nanoseconds and loc's offset, e.g.
// "time:2024-03-01T00:00:00-05:00/2024-04-01T00:00:00-04:00".
//
// If start or end is not on a month boundary, the first or last chunk is
// clipped to the scope.
//
// Scope is "months [<start>, <end>) <loc>" with both bounds in loc. The
// returned Chunker is immutable and safe for concurrent use.
//
// Chunks returns the same errors as for [Days]: [ErrInvalidScope] for a nil
// loc, a zero or out-of-range bound, an offset with seconds or more than
// 1<<20 chunks, and [ErrEmptyScope] if start is not before end.
func Months(start, end time.Time, loc *time.Location) Chunker {
	return &chunkers.Time{Unit: chunkers.UnitMonth, Start: start, End: end, Loc: loc}
}

// Every returns a [Chunker] of [backfilltype.KindTime] chunks of a fixed
// duration step that tile the half-open scope [start, end), aligned to
// start: chunk i is [start+i*step, start+(i+1)*step), and the last chunk is
// clipped to end if step does not divide end-start.
//
// Unlike [Days] and [Hours], Every ignores the calendar: Every(start, end,
// 24*time.Hour, loc) yields 24-hour chunks that drift off local midnight
// across a daylight-saving change. loc only sets the location in which the
// chunks' Start and End (and so their IDs, "time:<Start>/<End>") are
// expressed.
//
// Scope is "every <step> [<start>, <end>) <loc>", with step formatted by
// [time.Duration.String], e.g. "every 15m0s [2024-03-01T00:00:00Z,
// 2024-03-02T00:00:00Z) UTC". The returned Chunker is immutable and safe for
// concurrent use.
//
// Chunks returns [ErrInvalidScope] if step is not positive, loc is nil,
// start or end is the zero time or outside the years 0001 to 9999 in loc, a
// boundary has a UTC offset with seconds, or the scope has more than 1<<20
// (1,048,576) chunks; and [ErrEmptyScope] if start is not before end.
func Every(start, end time.Time, step time.Duration, loc *time.Location) Chunker {
	return &chunkers.Time{Unit: chunkers.UnitEvery, Start: start, End: end, Step: step, Loc: loc}
}
