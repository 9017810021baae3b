package main

import (
	"fmt"
	"sync"

	"github.com/parquet-go/parquet-go"
)

// rowGroup is one row group of the file, decoded once and shared by every
// Extract that reads it: a day is a few percent of a row group (this file
// has a single page per column per row group), so decoding the pages
// again for each day would decompress the same row group a dozen times
// and hold one decoded copy per chunk in flight.
//
// Each column is held as a dictionary of its distinct values and one small
// code per row (1, 2 or 4 bytes, whichever the dictionary needs): 272,727
// rows of the five columns take about 2.2 MB, against about 9 MB for the
// same pages decoded by parquet-go (32-bit dictionary indexes, definition
// levels, decompressed and compressed page buffers).
type rowGroup struct {
	rows int64
	cols [numCols]column
}

// column is one column of a row group: the value of row r is
// vals[codes.at(r)]; code 0 is the null value.
type column struct {
	codes codes
	vals  []parquet.Value
	// boxed[i] is vals[i] as Write takes it (nil for null), made once
	// per distinct value rather than once per row; nil for the date
	// column, whose values become times in emit.
	boxed []any
}

func (c *column) value(r int64) parquet.Value { return c.vals[c.codes.at(r)] }

// codes is a column's dictionary codes, one per row, in the narrowest
// width that holds the largest code: only one of the slices is used.
type codes struct {
	u8  []uint8
	u16 []uint16
	u32 []uint32
}

func (c *codes) at(r int64) uint32 {
	switch {
	case c.u8 != nil:
		return uint32(c.u8[r])
	case c.u16 != nil:
		return uint32(c.u16[r])
	default:
		return c.u32[r]
	}
}

// add appends code; n is the number of rows, the capacity to allocate.
func (c *codes) add(code uint32, n int64) {
	switch {
	case c.u32 != nil:
		c.u32 = append(c.u32, code)
	case code > 0xffff:
		c.u32 = make([]uint32, 0, n)
		for r := range c.len() {
			c.u32 = append(c.u32, c.at(int64(r)))
		}
		c.u32 = append(c.u32, code)
		c.u8, c.u16 = nil, nil
	case c.u16 != nil:
		c.u16 = append(c.u16, uint16(code))
	case code > 0xff:
		c.u16 = make([]uint16, 0, n)
		for _, x := range c.u8 {
			c.u16 = append(c.u16, uint16(x))
		}
		c.u16 = append(c.u16, uint16(code))
		c.u8 = nil
	default:
		if c.u8 == nil {
			c.u8 = make([]uint8, 0, n)
		}
		c.u8 = append(c.u8, uint8(code))
	}
}

func (c *codes) len() int { return max(len(c.u8), len(c.u16), len(c.u32)) }

// decodeRowGroup reads row group g one column at a time, so that only one
// column's pages are decoded at once.
func (f *Flights) decodeRowGroup(g int) (*rowGroup, error) {
	rg := &rowGroup{rows: f.pf.RowGroups()[g].NumRows()}
	for i := range rg.cols {
		box := boxInt
		switch i {
		case iDate:
			box = nil
		case iOrigin, iDestination:
			box = boxString
		}
		col, err := f.decodeColumn(g, i, rg.rows, box)
		if err != nil {
			return nil, err
		}
		rg.cols[i] = col
	}
	return rg, nil
}

func boxInt(v parquet.Value) any { return intOf(v) }

func boxString(v parquet.Value) any { return string(v.ByteArray()) }

// decodeColumn reads column i of row group g into a dictionary and codes.
func (f *Flights) decodeColumn(g, i int, rows int64, box func(parquet.Value) any) (column, error) {
	cur, err := f.openCursor(g, 0, []int{f.cols[i]})
	if err != nil {
		return column{}, err
	}
	defer cur.close()
	col := column{vals: []parquet.Value{parquet.NullValue()}}
	if box != nil {
		col.boxed = []any{nil}
	}
	var (
		ints  map[int64]uint32
		bytes map[string]uint32
	)
	for {
		n, err := cur.next()
		if err != nil {
			return column{}, fmt.Errorf("row group %d: %w", g, err)
		}
		if n == 0 {
			break
		}
		for _, v := range cur.vals[0][:n] {
			code, ok := uint32(0), true
			switch {
			case v.IsNull():
			case v.Kind() == parquet.ByteArray:
				if bytes == nil {
					bytes = make(map[string]uint32)
				}
				code, ok = bytes[string(v.ByteArray())]
				if !ok {
					code = uint32(len(col.vals))
					bytes[string(v.ByteArray())] = code
				}
			default:
				if ints == nil {
					ints = make(map[int64]uint32)
				}
				code, ok = ints[intOf(v)]
				if !ok {
					code = uint32(len(col.vals))
					ints[intOf(v)] = code
				}
			}
			if !ok {
				v = v.Clone()
				col.vals = append(col.vals, v)
				if box != nil {
					col.boxed = append(col.boxed, box(v))
				}
			}
			col.codes.add(code, rows)
		}
	}
	if got := int64(col.codes.len()); got != rows {
		return column{}, fmt.Errorf("row group %d: column %d has %d values for %d rows", g, i, got, rows)
	}
	return col, nil
}

// rowGroups shares decoded row groups between the Extract calls in
// flight, and keeps the most recently used one after its last reader is
// done (the next day usually lies in the same row group).
type rowGroups struct {
	mu      sync.Mutex
	entries map[int]*rgEntry
	tick    uint64
}

// keepIdle is how many decoded row groups no Extract is reading are kept.
const keepIdle = 1

type rgEntry struct {
	ready chan struct{} // closed once rg or err is set
	rg    *rowGroup
	err   error
	refs  int
	used  uint64 // tick of the last release
}

// rowGroup returns row group g decoded, and the function to call once
// done with it. Concurrent callers asking for the same row group share one
// decoding.
func (f *Flights) rowGroup(g int) (*rowGroup, func(), error) {
	c := &f.rgs
	c.mu.Lock()
	if c.entries == nil {
		c.entries = make(map[int]*rgEntry)
	}
	e, ok := c.entries[g]
	if !ok {
		e = &rgEntry{ready: make(chan struct{})}
		c.entries[g] = e
	}
	e.refs++
	c.mu.Unlock()
	if !ok {
		e.rg, e.err = f.decodeRowGroup(g)
		close(e.ready)
	} else {
		<-e.ready
	}
	release := func() { c.release(g, e) }
	if e.err != nil {
		release()
		return nil, nil, e.err
	}
	return e.rg, release, nil
}

// release drops one reference to e and forgets the idle row groups beyond
// the keepIdle most recently used (and e at once if it failed).
func (c *rowGroups) release(g int, e *rgEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	c.tick++
	e.used = c.tick
	if e.err != nil && c.entries[g] == e {
		delete(c.entries, g)
	}
	for {
		idle, oldest := 0, -1
		for k, x := range c.entries {
			if x.refs > 0 {
				continue
			}
			idle++
			if oldest < 0 || x.used < c.entries[oldest].used {
				oldest = k
			}
		}
		if idle <= keepIdle {
			return
		}
		delete(c.entries, oldest)
	}
}
