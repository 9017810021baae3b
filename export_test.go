package backfill

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/pgbackfill/backfill/internal/pgstore"
)

// The pooler guard of the tests: every statement with bind parameters
// that the library runs on a Postgres DB outside a transaction (which a
// transaction pooler may mix up with another client's)
// is recorded with the library function that ran it, and TestMain fails
// the test binary when there is any (OutsideTxStatements).
var outsideTx struct {
	mu    sync.Mutex
	sites map[string]int
}

func init() {
	pgstore.OutsideTxHook = func(query string) {
		site := callerOutsideTx()
		q := strings.Join(strings.Fields(query), " ")
		if len(q) > 100 {
			q = q[:100] + "..."
		}
		outsideTx.mu.Lock()
		defer outsideTx.mu.Unlock()
		if outsideTx.sites == nil {
			outsideTx.sites = map[string]int{}
		}
		outsideTx.sites[site+": "+q]++
	}
}

// callerOutsideTx names the library's functions on the stack (innermost
// first) that led to the statement.
func callerOutsideTx() string {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var names []string
	for {
		f, more := frames.Next()
		const pkg = "github.com/pgbackfill/backfill."
		if strings.HasPrefix(f.Function, pkg) && !strings.Contains(f.Function, "pgDB.") {
			names = append(names, fmt.Sprintf("%s (%s:%d)", strings.TrimPrefix(f.Function, pkg), f.File[strings.LastIndex(f.File, "/")+1:], f.Line))
			if len(names) == 3 {
				break
			}
		}
		if !more {
			break
		}
	}
	return strings.Join(names, " < ")
}

// OutsideTxStatements returns the statements with parameters the library
// ran outside a transaction so far, with where and how often.
func OutsideTxStatements() []string {
	outsideTx.mu.Lock()
	defer outsideTx.mu.Unlock()
	var out []string
	for s, n := range outsideTx.sites {
		out = append(out, fmt.Sprintf("%dx %s", n, s))
	}
	sort.Strings(out)
	return out
}

// SetRollbackSlices bounds the slices of a whole-batch rollback (rows
// updated and chunks per transaction) for the tests of this process, and
// returns a function that puts the defaults back.
func SetRollbackSlices(rows int64, chunks int) func() {
	r, c := sliceRows, sliceChunks
	sliceRows, sliceChunks = rows, chunks
	return func() { sliceRows, sliceChunks = r, c }
}

// SetBeforeRollbackSlice calls f before the transaction of each slice of
// a whole-batch rollback (nil: none).
func SetBeforeRollbackSlice(f func(job string, seqs []int)) {
	if f == nil {
		testBeforeSlice.Store(nil)
		return
	}
	testBeforeSlice.Store(&f)
}
