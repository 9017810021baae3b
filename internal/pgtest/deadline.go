package pgtest

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestDeadline is how long a test that took a database of [New] or
// [NewURL] may run (from that call) before the binary gives up on it:
// it prints that the test passed its deadline and every goroutine's
// stack, stops the throwaway server and PgBouncer, and exits 1. Well
// before go test's package timeout (15 minutes in make test), and with
// the name of the test that hung. BACKFILL_TEST_DEADLINE (a duration)
// replaces it. The waits inside a test have shorter deadlines of their
// own (internal/testwait).
var TestDeadline = 8 * time.Minute

func init() {
	if v := os.Getenv("BACKFILL_TEST_DEADLINE"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			TestDeadline = d
		}
	}
}

// stopServer stops what Main started (set by Main when it started a
// server); abortOnce makes one test's deadline the only one reported.
var (
	stopServer func()
	abortOnce  sync.Once
)

// watch starts t's deadline, stopped when t ends.
func watch(t testing.TB) {
	name, start := t.Name(), time.Now()
	tm := time.AfterFunc(TestDeadline, func() {
		abortOnce.Do(func() {
			buf := make([]byte, 1<<22)
			buf = buf[:runtime.Stack(buf, true)]
			fmt.Fprintf(os.Stderr, "pgtest: FAIL: %s still running %v after it took its database (its deadline is %v; BACKFILL_TEST_DEADLINE changes it): the goroutines follow\n\n%s\n",
				name, time.Since(start).Round(time.Second), TestDeadline, buf)
			fmt.Fprintf(os.Stderr, "pgtest: FAIL: %s passed its deadline of %v\n", name, TestDeadline)
			if stopServer != nil {
				stopServer()
			}
			os.Exit(1)
		})
	})
	t.Cleanup(func() { tm.Stop() })
}
