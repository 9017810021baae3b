// Package testwait gives tests waits with a deadline of their own: a
// test that waits for an event that never comes fails within
// [Timeout] with a message naming what it waited for, well before the
// package's timeout (go test -timeout) kills the whole binary with a
// goroutine dump and no word of which wait hung.
//
// Wait for the event itself (a channel, a hook, a row in the manifest)
// with [Until], [Recv] or [Context]; a fixed sleep is either too short
// on a loaded machine or too long on an idle one.
package testwait

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// Timeout is the deadline of one wait: generous, as a wait ends at the
// event, and a test machine may be loaded by other processes. The
// environment variable BACKFILL_TEST_WAIT (a duration, e.g. 5m) replaces
// it.
var Timeout = 2 * time.Minute

// Poll is the interval at which [Until] checks its condition.
const Poll = 5 * time.Millisecond

func init() {
	if v := os.Getenv("BACKFILL_TEST_WAIT"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			Timeout = d
		}
	}
}

// Until polls cond every [Poll] until it holds, and fails t (FailNow)
// when it still does not after [Timeout], naming what it waited for.
// Call it from the test's goroutine.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	UntilWithin(t, Timeout, what, cond)
}

// UntilWithin is [Until] with a deadline of d.
func UntilWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("testwait: timed out after %v waiting for %s", d, what)
		}
		time.Sleep(Poll)
	}
}

// Recv returns the next value of ch, and fails t (FailNow) when none
// comes within [Timeout], naming what it waited for. A closed channel
// yields its zero value, as a receive does. Call it from the test's
// goroutine.
func Recv[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	tm := time.NewTimer(Timeout)
	defer tm.Stop()
	select {
	case v := <-ch:
		return v
	case <-tm.C:
		t.Fatalf("testwait: timed out after %v waiting for %s", Timeout, what)
		panic("unreachable")
	}
}

// errDeadline is the cause of a [Context]'s end at its deadline.
var errDeadline = errors.New("testwait: deadline")

// Context returns a context derived from t.Context() that ends after
// [Timeout], for a call that waits for its own events (a run, a worker):
// the call returns at the deadline instead of hanging, and t fails then
// (at its cleanup, beside whatever the call's error made the test
// report) with a message naming what the call was.
func Context(t testing.TB, what string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeoutCause(t.Context(), Timeout, errDeadline)
	t.Cleanup(func() {
		if errors.Is(context.Cause(ctx), errDeadline) {
			t.Errorf("testwait: %s did not finish within %v (its context was canceled at that deadline)", what, Timeout)
		}
		cancel()
	})
	return ctx
}
