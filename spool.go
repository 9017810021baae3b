package backfill

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
	"time"
)

// A chunk's spool: the rows its extractor wrote, converted, kept between
// the extraction (outside any transaction) and the chunk's short
// transaction, which stages them ([execution.runChunk]). Rows are
// kept in memory up to spoolMemLimit bytes (an estimate of their values'
// sizes), then in a temporary file (os.CreateTemp), removed by Close. The
// spool can be replayed any number of times: the isolation of refused
// values ([chunkStaging]) stages the chunk again from it.

// spoolMemLimit is how many bytes of rows a spool keeps in memory before
// it moves them to a temporary file.
var spoolMemLimit = 8 << 20

// spool records Add calls (row number and converted values).
type spool struct {
	mem      []spoolRow
	memBytes int
	// memOnly: a value of a type the file encoding does not know came
	// before the spool moved to a file; it stays in memory.
	memOnly bool
	f       *os.File
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
func (s *spool) values(n int) []any {
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
func (s *spool) release() {
	for _, p := range s.slabs {
		clear(*p)
		spoolSlabs.Put(p)
	}
	if cap(s.mem) > 0 {
		m := s.mem[:cap(s.mem)]
		clear(m)
		m = m[:0]
		spoolMems.Put(&m)
	}
	s.mem, s.memBytes, s.slab, s.slabs = nil, 0, nil, nil
}

type spoolRow struct {
	row    int64
	values []any
}

// Add keeps one row. values is copied (the row writer reuses its
// buffer), byte slices included.
func (s *spool) Add(ctx context.Context, row int64, values []any) error {
	s.rows++
	if s.f != nil {
		return s.write(row, values)
	}
	if s.mem == nil {
		if p, ok := spoolMems.Get().(*[]spoolRow); ok {
			s.mem = *p
		}
	}
	vs := s.values(len(values))
	size := 16
	for i, v := range values {
		switch x := v.(type) {
		case []byte:
			if x != nil {
				// Empty stays empty, not NULL.
				vs[i] = append(make([]byte, 0, len(x)), x...)
			}
			size += len(x) + 24
		case string:
			vs[i] = v // the interface as it came: boxing x again would allocate
			size += len(x) + 16
		default:
			vs[i] = v
			size += 16
		}
	}
	s.mem = append(s.mem, spoolRow{row: row, values: vs})
	s.memBytes += size
	if s.memBytes > spoolMemLimit && !s.memOnly {
		return s.spill()
	}
	return nil
}

// spill moves the rows in memory to a temporary file.
func (s *spool) spill() error {
	for _, r := range s.mem {
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
	s.f, s.w = f, bufio.NewWriterSize(f, 64<<10)
	for _, r := range s.mem {
		if err := s.write(r.row, r.values); err != nil {
			return err
		}
	}
	s.release()
	return nil
}

// Len is the number of rows kept.
func (s *spool) Len() int64 { return s.rows }

// Close removes the spool's file, if any. It is idempotent.
func (s *spool) Close() error {
	s.release()
	if s.f == nil {
		return nil
	}
	name := s.f.Name()
	err := errors.Join(s.f.Close(), os.Remove(name))
	s.f, s.w = nil, nil
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

func (s *spool) write(row int64, values []any) error {
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

// replay calls f with each row kept, in order. The values slice is
// reused between calls.
func (s *spool) replay(ctx context.Context, f func(row int64, values []any) error) error {
	if s.f == nil {
		for _, r := range s.mem {
			if err := f(r.row, r.values); err != nil {
				return err
			}
		}
		return nil
	}
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("backfill: spool: %w", err)
	}
	end, err := s.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("backfill: spool: %w", err)
	}
	r := bufio.NewReaderSize(io.NewSectionReader(s.f, 0, end), 64<<10)
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
