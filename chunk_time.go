package backfill

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/calendar"
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
	return &timeChunker{unit: unitHour, start: start, end: end, loc: loc}
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
	return &timeChunker{unit: unitDay, start: start, end: end, loc: loc}
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
	return &timeChunker{unit: unitMonth, start: start, end: end, loc: loc}
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
	return &timeChunker{unit: unitEvery, start: start, end: end, step: step, loc: loc}
}

// timeUnit selects how a timeChunker places its boundaries.
type timeUnit int

const (
	unitHour timeUnit = iota
	unitDay
	unitMonth
	unitEvery
)

func (u timeUnit) String() string {
	switch u {
	case unitHour:
		return "hours"
	case unitDay:
		return "days"
	case unitMonth:
		return "months"
	default:
		return "every"
	}
}

// timeChunker implements Hours, Days, Months and Every.
type timeChunker struct {
	unit       timeUnit
	start, end time.Time
	step       time.Duration // unitEvery only
	loc        *time.Location
}

// name is the chunker's kind as it appears in Scope and in errors.
func (c *timeChunker) name() string {
	if c.unit == unitEvery {
		return fmt.Sprintf("every %v", c.step)
	}
	return c.unit.String()
}

// Scope returns e.g. "days [2024-03-01T00:00:00-05:00,
// 2024-04-01T00:00:00-04:00) America/New_York" or "every 15m0s [...) UTC".
// Bounds are formatted in loc; a nil loc is shown as "<nil>" with UTC bounds.
func (c *timeChunker) Scope() string {
	loc, locName := c.loc, "<nil>"
	if loc == nil {
		loc = time.UTC
	} else {
		locName = loc.String()
	}
	return fmt.Sprintf("%s [%s, %s) %s", c.name(),
		c.start.In(loc).Format(time.RFC3339Nano), c.end.In(loc).Format(time.RFC3339Nano), locName)
}

func (c *timeChunker) validate() error {
	name := c.name()
	if c.loc == nil {
		return fmt.Errorf("%w: %s: nil location", ErrInvalidScope, name)
	}
	if c.unit == unitEvery && c.step <= 0 {
		return fmt.Errorf("%w: %s: step is not positive", ErrInvalidScope, name)
	}
	for _, b := range []struct {
		name string
		t    time.Time
	}{{"start", c.start}, {"end", c.end}} {
		if b.t.IsZero() {
			return fmt.Errorf("%w: %s: %s is the zero time", ErrInvalidScope, name, b.name)
		}
		if y := b.t.In(c.loc).Year(); y < 1 || y > 9999 {
			return fmt.Errorf("%w: %s: %s %s is outside the years 0001 to 9999 in %s",
				ErrInvalidScope, name, b.name, b.t.In(c.loc).Format(time.RFC3339Nano), c.loc)
		}
	}
	if !c.start.Before(c.end) {
		return fmt.Errorf("%w: %s: start %s is not before end %s", ErrEmptyScope, name,
			c.start.In(c.loc).Format(time.RFC3339Nano), c.end.In(c.loc).Format(time.RFC3339Nano))
	}
	return nil
}

// Chunks implements [backfilltype.Chunker.Chunks]; see [Hours], [Days],
// [Months] and [Every] for the boundaries and errors.
func (c *timeChunker) Chunks(ctx context.Context) ([]Chunk, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cuts, err := c.cuts(ctx)
	if err != nil {
		return nil, err
	}
	return c.tile(cuts)
}

// cuts returns the scope's start, every boundary strictly inside the
// scope in increasing order, then its end, all in loc.
func (c *timeChunker) cuts(ctx context.Context) ([]time.Time, error) {
	start, end := c.start.In(c.loc), c.end.In(c.loc)
	cuts := []time.Time{start}
	add := func(b time.Time) error {
		if len(cuts) > maxChunks {
			return fmt.Errorf("%w: %s has more than %d chunks", ErrInvalidScope, c.Scope(), maxChunks)
		}
		if len(cuts)%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		cuts = append(cuts, b)
		return nil
	}
	for b := range c.boundaries(start) {
		if !b.Before(end) {
			break
		}
		if err := add(b); err != nil {
			return nil, err
		}
	}
	if err := add(end); err != nil {
		return nil, err
	}
	return cuts, nil
}

// boundaries yields the chunker's boundaries after start, in increasing
// order, without end.
func (c *timeChunker) boundaries(start time.Time) iter.Seq[time.Time] {
	return func(yield func(time.Time) bool) {
		switch c.unit {
		case unitHour:
			for b := calendar.NextHour(start); yield(b); b = calendar.NextHour(b) {
			}
		case unitEvery:
			for b := start.Add(c.step); yield(b); b = b.Add(c.step) {
			}
		default:
			// The start of the k-th day or month after the one start
			// reads is at or before start for k 0, because start itself
			// reads that date; it is non-decreasing in k but may repeat
			// (a skipped date) or not yet exceed start (a clock set back
			// across midnight).
			y, m, d := start.Date()
			last := start
			for k := 1; ; k++ {
				var b time.Time
				if c.unit == unitDay {
					b = calendar.DayStart(y, m, d+k, c.loc)
				} else {
					b = calendar.MonthStart(y, m+time.Month(k), c.loc)
				}
				if !b.After(last) {
					continue
				}
				if !yield(b) {
					return
				}
				last = b
			}
		}
	}
}

// tile returns the chunks between consecutive cuts.
func (c *timeChunker) tile(cuts []time.Time) ([]Chunk, error) {
	chunks := make([]Chunk, len(cuts)-1)
	for i := range chunks {
		var err error
		if chunks[i], err = c.chunk(i, cuts[i], cuts[i+1]); err != nil {
			return nil, err
		}
	}
	return chunks, nil
}

// ChunkSeq implements [backfilltype.ChunkStreamer.ChunkSeq]: the chunks of
// Chunks, one boundary at a time.
func (c *timeChunker) ChunkSeq(ctx context.Context) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		if err := c.validate(); err != nil {
			yield(Chunk{}, err)
			return
		}
		if err := ctx.Err(); err != nil {
			yield(Chunk{}, err)
			return
		}
		start, end := c.start.In(c.loc), c.end.In(c.loc)
		lo, seq := start, 0
		emit := func(hi time.Time) bool {
			// Chunks counts cuts, start and end included, up to
			// maxChunks+1: the same limit.
			if seq+1 > maxChunks {
				yield(Chunk{}, fmt.Errorf("%w: %s has more than %d chunks", ErrInvalidScope, c.Scope(), maxChunks))
				return false
			}
			if seq%4096 == 4095 {
				if err := ctx.Err(); err != nil {
					yield(Chunk{}, err)
					return false
				}
			}
			ch, err := c.chunk(seq, lo, hi)
			if err != nil {
				yield(Chunk{}, err)
				return false
			}
			seq, lo = seq+1, hi
			return yield(ch, nil)
		}
		for b := range c.boundaries(start) {
			if !b.Before(end) {
				break
			}
			if !emit(b) {
				return
			}
		}
		emit(end)
	}
}

// chunk returns chunk seq [lo, hi), or an error for a bound RFC 3339
// cannot represent.
func (c *timeChunker) chunk(seq int, lo, hi time.Time) (Chunk, error) {
	for _, b := range [...]time.Time{lo, hi} {
		if _, off := b.Zone(); off%60 != 0 {
			return Chunk{}, fmt.Errorf("%w: %s: boundary %s has UTC offset %ds in %s, which RFC 3339 cannot represent",
				ErrInvalidScope, c.name(), b.Format(time.RFC3339Nano), off, c.loc)
		}
	}
	return Chunk{
		ID:    "time:" + lo.Format(time.RFC3339Nano) + "/" + hi.Format(time.RFC3339Nano),
		Seq:   seq,
		Kind:  backfilltype.KindTime,
		Start: lo,
		End:   hi,
	}, nil
}

// ChunkOf implements [backfilltype.ChunkStreamer.ChunkOf]: c's bounds in the
// chunker's location, when they lie in the scope, give c's ID, and end
// at the first boundary after the start (or the scope's end). Seq is
// checked for [Every] only (the k-th chunk starts k steps after the
// scope's): the position of a calendar hour, day or month would take a
// walk from the scope's start.
func (c *timeChunker) ChunkOf(x Chunk) (Chunk, bool) {
	if c.validate() != nil || x.Kind != backfilltype.KindTime || x.Seq < 0 || x.Start.Before(c.start) || x.End.After(c.end) || !x.Start.Before(x.End) {
		return Chunk{}, false
	}
	if c.unit == unitEvery {
		d := x.Start.Sub(c.start)
		if d%c.step != 0 || int64(d/c.step) != int64(x.Seq) {
			return Chunk{}, false
		}
	}
	ch, err := c.chunk(x.Seq, x.Start.In(c.loc), x.End.In(c.loc))
	if err != nil || ch.ID != x.ID {
		return Chunk{}, false
	}
	next := c.end
	for b := range c.boundaries(ch.Start) {
		if b.Before(next) {
			next = b
		}
		break
	}
	if !next.Equal(ch.End) {
		return Chunk{}, false
	}
	return ch, true
}
