package chunkers

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/calendar"
)

// Unit selects how a [Time] chunker places its boundaries.
type Unit int

const (
	UnitHour Unit = iota
	UnitDay
	UnitMonth
	UnitEvery
)

func (u Unit) String() string {
	switch u {
	case UnitHour:
		return "hours"
	case UnitDay:
		return "days"
	case UnitMonth:
		return "months"
	default:
		return "every"
	}
}

// Time is the chunker of backfill.Hours, Days, Months and Every.
type Time struct {
	Unit       Unit           `json:"-" db:"-"`
	Start, End time.Time      `json:"-" db:"-"`
	Step       time.Duration  `json:"-" db:"-"` // unitEvery only
	Loc        *time.Location `json:"-" db:"-"`
}

// name is the chunker's kind as it appears in Scope and in errors.
func (c *Time) name() string {
	if c.Unit == UnitEvery {
		return fmt.Sprintf("every %v", c.Step)
	}
	return c.Unit.String()
}

// Scope returns e.g. "days [2024-03-01T00:00:00-05:00,
// 2024-04-01T00:00:00-04:00) America/New_York" or "every 15m0s [...) UTC".
// Bounds are formatted in loc; a nil loc is shown as "<nil>" with UTC bounds.
func (c *Time) Scope() string {
	loc, locName := c.Loc, "<nil>"
	if loc == nil {
		loc = time.UTC
	} else {
		locName = loc.String()
	}
	return fmt.Sprintf("%s [%s, %s) %s", c.name(),
		c.Start.In(loc).Format(time.RFC3339Nano), c.End.In(loc).Format(time.RFC3339Nano), locName)
}

func (c *Time) validate() error {
	name := c.name()
	if c.Loc == nil {
		return fmt.Errorf("%w: %s: nil location", backfilltype.ErrInvalidScope, name)
	}
	if c.Unit == UnitEvery && c.Step <= 0 {
		return fmt.Errorf("%w: %s: step is not positive", backfilltype.ErrInvalidScope, name)
	}
	for _, b := range []struct {
		name string
		t    time.Time
	}{{"start", c.Start}, {"end", c.End}} {
		if b.t.IsZero() {
			return fmt.Errorf("%w: %s: %s is the zero time", backfilltype.ErrInvalidScope, name, b.name)
		}
		if y := b.t.In(c.Loc).Year(); y < 1 || y > 9999 {
			return fmt.Errorf("%w: %s: %s %s is outside the years 0001 to 9999 in %s",
				backfilltype.ErrInvalidScope, name, b.name, b.t.In(c.Loc).Format(time.RFC3339Nano), c.Loc)
		}
	}
	if !c.Start.Before(c.End) {
		return fmt.Errorf("%w: %s: start %s is not before end %s", backfilltype.ErrEmptyScope, name,
			c.Start.In(c.Loc).Format(time.RFC3339Nano), c.End.In(c.Loc).Format(time.RFC3339Nano))
	}
	return nil
}

// Chunks implements [backfilltype.Chunker.Chunks]; see [Hours], [Days],
// [Months] and [Every] for the boundaries and errors.
func (c *Time) Chunks(ctx context.Context) ([]backfilltype.Chunk, error) {
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
func (c *Time) cuts(ctx context.Context) ([]time.Time, error) {
	start, end := c.Start.In(c.Loc), c.End.In(c.Loc)
	cuts := []time.Time{start}
	add := func(b time.Time) error {
		if len(cuts) > maxChunks {
			return fmt.Errorf("%w: %s has more than %d chunks", backfilltype.ErrInvalidScope, c.Scope(), maxChunks)
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
func (c *Time) boundaries(start time.Time) iter.Seq[time.Time] {
	return func(yield func(time.Time) bool) {
		switch c.Unit {
		case UnitHour:
			for b := calendar.NextHour(start); yield(b); b = calendar.NextHour(b) {
			}
		case UnitEvery:
			for b := start.Add(c.Step); yield(b); b = b.Add(c.Step) {
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
				if c.Unit == UnitDay {
					b = calendar.DayStart(y, m, d+k, c.Loc)
				} else {
					b = calendar.MonthStart(y, m+time.Month(k), c.Loc)
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
func (c *Time) tile(cuts []time.Time) ([]backfilltype.Chunk, error) {
	chunks := make([]backfilltype.Chunk, len(cuts)-1)
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
func (c *Time) ChunkSeq(ctx context.Context) iter.Seq2[backfilltype.Chunk, error] {
	return func(yield func(backfilltype.Chunk, error) bool) {
		if err := c.validate(); err != nil {
			yield(backfilltype.Chunk{}, err)
			return
		}
		if err := ctx.Err(); err != nil {
			yield(backfilltype.Chunk{}, err)
			return
		}
		start, end := c.Start.In(c.Loc), c.End.In(c.Loc)
		lo, seq := start, 0
		emit := func(hi time.Time) bool {
			// Chunks counts cuts, start and end included, up to
			// maxChunks+1: the same limit.
			if seq+1 > maxChunks {
				yield(backfilltype.Chunk{}, fmt.Errorf("%w: %s has more than %d chunks", backfilltype.ErrInvalidScope, c.Scope(), maxChunks))
				return false
			}
			if seq%4096 == 4095 {
				if err := ctx.Err(); err != nil {
					yield(backfilltype.Chunk{}, err)
					return false
				}
			}
			ch, err := c.chunk(seq, lo, hi)
			if err != nil {
				yield(backfilltype.Chunk{}, err)
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
func (c *Time) chunk(seq int, lo, hi time.Time) (backfilltype.Chunk, error) {
	for _, b := range [...]time.Time{lo, hi} {
		if _, off := b.Zone(); off%60 != 0 {
			return backfilltype.Chunk{}, fmt.Errorf("%w: %s: boundary %s has UTC offset %ds in %s, which RFC 3339 cannot represent",
				backfilltype.ErrInvalidScope, c.name(), b.Format(time.RFC3339Nano), off, c.Loc)
		}
	}
	return backfilltype.Chunk{
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
func (c *Time) ChunkOf(x backfilltype.Chunk) (backfilltype.Chunk, bool) {
	if c.validate() != nil || x.Kind != backfilltype.KindTime || x.Seq < 0 || x.Start.Before(c.Start) || x.End.After(c.End) || !x.Start.Before(x.End) {
		return backfilltype.Chunk{}, false
	}
	if c.Unit == UnitEvery {
		d := x.Start.Sub(c.Start)
		if d%c.Step != 0 || int64(d/c.Step) != int64(x.Seq) {
			return backfilltype.Chunk{}, false
		}
	}
	ch, err := c.chunk(x.Seq, x.Start.In(c.Loc), x.End.In(c.Loc))
	if err != nil || ch.ID != x.ID {
		return backfilltype.Chunk{}, false
	}
	next := c.End
	for b := range c.boundaries(ch.Start) {
		if b.Before(next) {
			next = b
		}
		break
	}
	if !next.Equal(ch.End) {
		return backfilltype.Chunk{}, false
	}
	return ch, true
}
