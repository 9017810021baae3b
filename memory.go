package backfill

import (
	"fmt"

	"github.com/pgbackfill/backfill/internal/spool"
)

// memoryShares are the parts of [Config.MemoryBudget] each kind of
// buffer reserves from: the spools' rows in memory (a quarter, an eighth
// in one spool), the merge's tracked identities (an eighth) and the
// rejected rows held until their chunk commits (an eighth). The other
// half is headroom for what is not counted (a row being converted, the
// COPY buffer, the runtime, the garbage collector's slack).
type memoryShares struct {
	rows       *spool.Budget
	spoolLimit int
	keys       *spool.Budget
	rejects    *spool.Budget
}

func newMemoryShares(budget int64) memoryShares {
	return memoryShares{
		rows:       spool.NewBudget(budget / 4),
		spoolLimit: int(budget / 8),
		keys:       spool.NewBudget(budget / 8),
		rejects:    spool.NewBudget(budget / 8),
	}
}

// newSpool returns a spool for one chunk's rows, counted against the
// Runner's share for spools.
func (r *Runner) newSpool() *spool.Spool {
	return &spool.Spool{Budget: r.mem.rows, Limit: r.mem.spoolLimit}
}

// rejectSize is what a held rejected row is counted as: its raw row,
// column, value and reason, plus the Exception's own fields.
func rejectSize(raw []byte, column, value, reason string) int64 {
	return int64(len(raw)+len(column)+len(value)+len(reason)) + 160
}

// errRejectsOverBudget is the error of a chunk whose held rejected rows
// do not fit in their share of the budget.
func errRejectsOverBudget(c Chunk, rejected int64, held, share int64) error {
	return fmt.Errorf("%w: chunk %s: its %d rejected rows hold %d bytes until the chunk commits, past their share of Config.MemoryBudget (%d bytes, an eighth); the chunk rolls back: raise MemoryBudget, lower MaxRejectsPerChunk or fix the source",
		ErrTooManyRejects, c.ID, rejected, held, share)
}
