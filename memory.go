package backfill

import (
	"errors"
	"fmt"

	"github.com/pgbackfill/backfill/internal/spool"
)

// memoryShares are the parts of [Config.MemoryBudget] each kind of
// buffer reserves from. What is not counted comes off first: about 13
// MiB of resident memory a process running the library has with no rows
// at all (code, runtime, connections, the manifest's migrations),
// memoryFloor; of the rest, the counted buffers take half, because the
// garbage collector lets the heap grow to about twice what is live
// (GOGC=100): the spools' rows in memory a quarter (an eighth in one
// spool), the merge's tracked identities an eighth, the rejected rows
// held until their chunk commits an eighth. Measured with
// cmd/bench/memory: peak RSS within the budget for 100-byte and 10-KiB
// rows at 32 and 64 MiB.
type memoryShares struct {
	rows       *spool.Budget
	spoolLimit int
	keys       *spool.Budget
	rejects    *spool.Budget
}

// memoryFloor is the part of a budget left for what a process running
// the library holds with no rows at all.
const memoryFloor = 16 << 20

// minMemoryBudget is the least Config.MemoryBudget: the floor and 16 MiB.
const minMemoryBudget = 32 << 20

func newMemoryShares(budget int64) memoryShares {
	u := budget - memoryFloor
	return memoryShares{
		rows:       spool.NewBudget(u / 4),
		spoolLimit: int(u / 8),
		keys:       spool.NewBudget(u / 8),
		rejects:    spool.NewBudget(u / 8),
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

// errMemoryShare marks a chunk that failed because the other chunks in
// flight held most of a share of the budget its own rows fit in:
// [IsRetryable] accepts it, the retry runs once they released it.
var errMemoryShare = errors.New("the memory budget's share is held by other chunks in flight")

// errRejectsOverBudget is the error of a chunk whose held rejected rows
// do not fit in their share of the budget: retryable (errMemoryShare)
// when its own hold at most half the share, the rest held by other
// chunks in flight.
func errRejectsOverBudget(c Chunk, rejected int64, held, share int64) error {
	if held <= share/2 {
		return fmt.Errorf("%w: chunk %s: its %d rejected rows hold %d bytes, but with those the other chunks in flight hold they pass their share of Config.MemoryBudget (%d bytes): the chunk rolls back and is tried again (%w)",
			ErrTooManyRejects, c.ID, rejected, held, share, errMemoryShare)
	}
	return fmt.Errorf("%w: chunk %s: its %d rejected rows hold %d bytes until the chunk commits, past their share of Config.MemoryBudget (%d bytes); the chunk rolls back: raise MemoryBudget, lower MaxRejectsPerChunk or fix the source",
		ErrTooManyRejects, c.ID, rejected, held, share)
}
