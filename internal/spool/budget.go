package spool

import "sync/atomic"

// Budget is a number of bytes of memory shared by the holders that
// reserve from it (spools, tracked keys, held rejects). It only counts:
// a holder refused a reservation moves its data elsewhere (a spool to
// its file) or stops (a chunk whose rejects do not fit fails). It is
// safe for concurrent use.
type Budget struct {
	limit int64
	used  atomic.Int64
	peak  atomic.Int64
}

// NewBudget returns a budget of limit bytes.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Used is the bytes reserved now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Peak is the most bytes reserved at once so far.
func (b *Budget) Peak() int64 { return b.peak.Load() }

// Reserve reserves n bytes if they fit, and reports whether they did.
func (b *Budget) Reserve(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			b.notePeak(u + n)
			return true
		}
	}
}

// add reserves n bytes whether or not they fit, and returns the bytes
// reserved then (a spool adds a row, then moves to its file when the
// total is past the limit).
func (b *Budget) add(n int64) int64 {
	u := b.used.Add(n)
	b.notePeak(u)
	return u
}

// Release gives n reserved bytes back.
func (b *Budget) Release(n int64) { b.used.Add(-n) }

func (b *Budget) notePeak(u int64) {
	for {
		p := b.peak.Load()
		if u <= p || b.peak.CompareAndSwap(p, u) {
			return
		}
	}
}
