package spool

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// MemLimit is how many bytes of rows a spool keeps in memory before
// it moves them to a temporary file.
var MemLimit = 8 << 20

// MemBudget is how many bytes of rows all the spools of the process keep
// in memory at once: a spool whose next row would take the total past it
// moves its rows to a temporary file, whatever its own size. With
// Concurrency workers each holding a chunk being written and one
// extracted ahead, it bounds the memory of the rows in flight.
var MemBudget int64 = 16 << 20

// inMem is the bytes of rows the spools without a Budget of their own
// keep in memory (each spool's memBytes, summed).
var inMem atomic.Int64

// InMem returns the bytes of rows the spools without a Budget of their
// own keep in memory now (tests).
func InMem() int64 { return inMem.Load() }

// Spool records Add calls (row number and converted values).
type Spool struct {
	// Budget, when set, is what the spool's rows in memory are counted
	// against instead of MemBudget (a Runner's share of its
	// Config.MemoryBudget); Limit, when positive, replaces MemLimit.
	Budget   *Budget    `json:"-" db:"-"`
	Limit    int        `json:"-" db:"-"`
	Mem      []spoolRow `json:"-" db:"-"`
	memBytes int
	// memOnly: a value of a type the file encoding does not know came
	// before the spool moved to a file; it stays in memory.
	memOnly bool
	F       *os.File `json:"-" db:"-"`
	w       *bufio.Writer
	enc     []byte
	rows    int64
	// slab is where the rows in memory take their values from, the rest
	// of the last of slabs (spoolSlabs): no allocation per row, and none
	// per chunk once the pools hold a chunk's worth.
	slab  []any
	slabs []*[]any
}

// spoolSlabLen is the number of values of a slab of spoolSlabs.
const spoolSlabLen = 1024

// spoolSlabs and spoolMems hold the memory of spools closed (cleared:
// they keep no value alive) for the next chunks' spools.
var (
	spoolSlabs = sync.Pool{New: func() any { s := make([]any, spoolSlabLen); return &s }}
	spoolMems  sync.Pool // *[]spoolRow, empty
)

// values returns a slice of n values for a row in memory.
func (s *Spool) values(n int) []any {
	if n > spoolSlabLen {
		return make([]any, n)
	}
	if len(s.slab) < n {
		p := spoolSlabs.Get().(*[]any)
		s.slabs = append(s.slabs, p)
		s.slab = *p
	}
	vs := s.slab[:n:n]
	s.slab = s.slab[n:]
	return vs
}

// release returns the memory of the rows in memory to the pools.
func (s *Spool) release() {
	for _, p := range s.slabs {
		clear(*p)
		spoolSlabs.Put(p)
	}
	if cap(s.Mem) > 0 {
		m := s.Mem[:cap(s.Mem)]
		clear(m)
		m = m[:0]
		spoolMems.Put(&m)
	}
	if s.Budget != nil {
		s.Budget.Release(int64(s.memBytes))
	} else {
		inMem.Add(-int64(s.memBytes))
	}
	s.Mem, s.memBytes, s.slab, s.slabs = nil, 0, nil, nil
}

type spoolRow struct {
	row    int64
	values []any
}

// Add keeps one row. values is copied (the row writer reuses its
// buffer), byte slices included.
func (s *Spool) Add(ctx context.Context, row int64, values []any) error {
	s.rows++
	if s.F != nil {
		return s.write(row, values)
	}
	if s.Mem == nil {
		if p, ok := spoolMems.Get().(*[]spoolRow); ok {
			s.Mem = *p
		}
	}
	vs := s.values(len(values))
	// The row's memory: its entry in Mem, its slots, and what they box.
	size := 32
	for i, v := range values {
		switch x := v.(type) {
		case []byte:
			if x != nil {
				// Empty stays empty, not NULL.
				vs[i] = append(make([]byte, 0, len(x)), x...)
			}
			size += len(x) + 40
		case string:
			vs[i] = v // the interface as it came: boxing x again would allocate
			size += len(x) + 32
		case nil, bool:
			vs[i] = v
			size += 16
		case time.Time:
			vs[i] = v
			size += 40
		default:
			vs[i] = v
			size += 24
		}
	}
	s.Mem = append(s.Mem, spoolRow{row: row, values: vs})
	s.memBytes += size
	limit, over := MemLimit, false
	if s.Limit > 0 {
		limit = s.Limit
	}
	if s.Budget != nil {
		over = s.Budget.add(int64(size)) > s.Budget.Limit()
	} else {
		over = inMem.Add(int64(size)) > MemBudget
	}
	if (s.memBytes > limit || over) && !s.memOnly {
		return s.spill()
	}
	return nil
}

// spill moves the rows in memory to a temporary file.
func (s *Spool) spill() error {
	for _, r := range s.Mem {
		for _, v := range r.values {
			if !spoolable(v) {
				s.memOnly = true
				return nil
			}
		}
	}
	f, err := os.CreateTemp("", "backfill-spool-*")
	if err != nil {
		return fmt.Errorf("backfill: spool: %w", err)
	}
	s.F, s.w = f, bufio.NewWriterSize(f, 64<<10)
	for _, r := range s.Mem {
		if err := s.write(r.row, r.values); err != nil {
			return err
		}
	}
	s.release()
	return nil
}

// Len is the number of rows kept.
func (s *Spool) Len() int64 { return s.rows }

// Close removes the spool's file, if any. It is idempotent.
func (s *Spool) Close() error {
	s.release()
	if s.F == nil {
		return nil
	}
	name := s.F.Name()
	err := errors.Join(s.F.Close(), os.Remove(name))
	s.F, s.w = nil, nil
	return err
}

// Value tags of the file encoding.
const (
	spoolNil byte = iota
	spoolString
	spoolBytes
	spoolTrue
	spoolFalse
	spoolInt64
	spoolInt
	spoolInt32
	spoolFloat64
	spoolTime
)

func spoolable(v any) bool {
	switch v.(type) {
	case nil, string, []byte, bool, int64, int, int32, float64, time.Time:
		return true
	}
	return false
}

func (s *Spool) write(row int64, values []any) error {
	b := binary.AppendVarint(s.enc[:0], row)
	b = binary.AppendUvarint(b, uint64(len(values)))
	for _, v := range values {
		switch x := v.(type) {
		case nil:
			b = append(b, spoolNil)
		case string:
			b = binary.AppendUvarint(append(b, spoolString), uint64(len(x)))
			b = append(b, x...)
		case []byte:
			if x == nil {
				// A nil byte slice is NULL, as in memory.
				b = append(b, spoolNil)
				break
			}
			b = binary.AppendUvarint(append(b, spoolBytes), uint64(len(x)))
			b = append(b, x...)
		case bool:
			if x {
				b = append(b, spoolTrue)
			} else {
				b = append(b, spoolFalse)
			}
		case int64:
			b = binary.AppendVarint(append(b, spoolInt64), x)
		case int:
			b = binary.AppendVarint(append(b, spoolInt), int64(x))
		case int32:
			b = binary.AppendVarint(append(b, spoolInt32), int64(x))
		case float64:
			b = binary.LittleEndian.AppendUint64(append(b, spoolFloat64), math.Float64bits(x))
		case time.Time:
			t, err := x.MarshalBinary()
			if err != nil {
				return fmt.Errorf("backfill: spool row %d: %w", row, err)
			}
			b = binary.AppendUvarint(append(b, spoolTime), uint64(len(t)))
			b = append(b, t...)
		default:
			return fmt.Errorf("backfill: spool row %d: a converted value of type %T cannot be spooled to a file", row, v)
		}
	}
	s.enc = b
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("backfill: spool: %w", err)
	}
	return nil
}

// Replay calls f with each row kept, in order. The values slice is
// reused between calls.
func (s *Spool) Replay(ctx context.Context, f func(row int64, values []any) error) error {
	if s.F == nil {
		for _, r := range s.Mem {
			if err := f(r.row, r.values); err != nil {
				return err
			}
		}
		return nil
	}
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("backfill: spool: %w", err)
	}
	end, err := s.F.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("backfill: spool: %w", err)
	}
	r := bufio.NewReaderSize(io.NewSectionReader(s.F, 0, end), 64<<10)
	var vals []any
	for n := int64(0); n < s.rows; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		row, vs, err := readSpoolRow(r, vals)
		if err != nil {
			return fmt.Errorf("backfill: spool: read row %d: %w", n+1, err)
		}
		vals = vs
		if err := f(row, vs); err != nil {
			return err
		}
	}
	return nil
}

func readSpoolRow(r *bufio.Reader, vals []any) (int64, []any, error) {
	row, err := binary.ReadVarint(r)
	if err != nil {
		return 0, nil, err
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, nil, err
	}
	vals = vals[:0]
	for range n {
		tag, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		var v any
		switch tag {
		case spoolNil:
		case spoolString, spoolBytes, spoolTime:
			l, err := binary.ReadUvarint(r)
			if err != nil {
				return 0, nil, err
			}
			buf := make([]byte, l)
			if _, err := io.ReadFull(r, buf); err != nil {
				return 0, nil, err
			}
			switch tag {
			case spoolString:
				v = string(buf)
			case spoolBytes:
				v = buf
			default:
				var t time.Time
				if err := t.UnmarshalBinary(buf); err != nil {
					return 0, nil, err
				}
				v = t
			}
		case spoolTrue:
			v = true
		case spoolFalse:
			v = false
		case spoolInt64, spoolInt, spoolInt32:
			x, err := binary.ReadVarint(r)
			if err != nil {
				return 0, nil, err
			}
			switch tag {
			case spoolInt64:
				v = x
			case spoolInt:
				v = int(x)
			default:
				v = int32(x)
			}
		case spoolFloat64:
			var b [8]byte
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return 0, nil, err
			}
			v = math.Float64frombits(binary.LittleEndian.Uint64(b[:]))
		default:
			return 0, nil, fmt.Errorf("unknown value tag %d", tag)
		}
		vals = append(vals, v)
	}
	return row, vals, nil
}
