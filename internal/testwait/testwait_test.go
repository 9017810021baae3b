package testwait

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records its failures and cleanups
// instead of failing the test that uses it.
type recorder struct {
	testing.TB
	ctx      context.Context
	msgs     []string
	cleanups []func()
}

func (r *recorder) Helper()                      {}
func (r *recorder) Context() context.Context     { return r.ctx }
func (r *recorder) Cleanup(f func())             { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Errorf(f string, args ...any) { r.msgs = append(r.msgs, fmt.Sprintf(f, args...)) }
func (r *recorder) Fatalf(f string, args ...any) {
	r.Errorf(f, args...)
	runtime.Goexit()
}

// run runs f on a goroutine of its own (Fatalf ends it), then r's
// cleanups, and returns the failure messages.
func (r *recorder) run(f func()) []string {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	return r.msgs
}

func withTimeout(t *testing.T, d time.Duration) {
	old := Timeout
	Timeout = d
	t.Cleanup(func() { Timeout = old })
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int64
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	Until(t, "three increments", func() bool { return n.Load() == 3 })
}

func TestUntilFailsNamingWhatItWaitedFor(t *testing.T) {
	withTimeout(t, 20*time.Millisecond)
	r := &recorder{TB: t, ctx: t.Context()}
	msgs := r.run(func() { Until(r, "the moon", func() bool { return false }) })
	if len(msgs) != 1 || !strings.Contains(msgs[0], "waiting for the moon") {
		t.Fatalf("messages %q, want one naming the moon", msgs)
	}
}

func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	go func() { ch <- 7 }()
	if v := Recv(t, "the value", ch); v != 7 {
		t.Fatalf("Recv = %d, want 7", v)
	}
	withTimeout(t, 20*time.Millisecond)
	r := &recorder{TB: t, ctx: t.Context()}
	msgs := r.run(func() { Recv(r, "a value never sent", make(chan int)) })
	if len(msgs) != 1 || !strings.Contains(msgs[0], "waiting for a value never sent") {
		t.Fatalf("messages %q, want one naming the value", msgs)
	}
}

func TestContextFailsAtItsDeadlineOnly(t *testing.T) {
	withTimeout(t, 20*time.Millisecond)
	r := &recorder{TB: t, ctx: t.Context()}
	msgs := r.run(func() { <-Context(r, "a call that never returns").Done() })
	if len(msgs) != 1 || !strings.Contains(msgs[0], "a call that never returns did not finish within") {
		t.Fatalf("messages %q, want one naming the call", msgs)
	}
	withTimeout(t, time.Minute)
	r = &recorder{TB: t, ctx: t.Context()}
	if msgs := r.run(func() { _ = Context(r, "a call that returns") }); len(msgs) != 0 {
		t.Fatalf("messages %q for a call that returned in time", msgs)
	}
}
