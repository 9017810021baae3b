//go:build faults

package faulttest

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freezeCount is how many workers freezeAnywhere freezes in all, over
// rounds of at most freezesPerRound; about half of them between a
// chunk's merge and its commit.
const (
	freezeCount     = 20
	freezesPerRound = 5
)

// freezeAnywhere: a worker is frozen (SIGSTOP) for longer than the bound
// at a random point of its chunk, freezeCount times, one at a time, about
// half of the times deliberately between its chunk's merge and its commit
// (it then holds the merge's key locks, which neighbouring chunks share:
// a key lock covers a range of 4,096 ids, a chunk 1,000). After each
// round the job must have converged (check), and no healthy worker may
// have waited longer than the bound behind a frozen one.
func (s *suite) freezeAnywhere(t *testing.T, seed int64) {
	total, atCommit := 0, 0
	var figures []string
	for i := 0; total < freezeCount && i < 2*freezeCount/freezesPerRound; i++ {
		t.Run(fmt.Sprintf("round_%d", i+1), func(t *testing.T) {
			n, m, fig := s.freezeRound(t, seed+int64(i)*7919, min(freezesPerRound, freezeCount-total))
			total, atCommit = total+n, atCommit+m
			figures = append(figures, fig)
		})
		if t.Failed() {
			break
		}
	}
	t.Logf("%d freezes, %d of them between merge and commit; per round: %s", total, atCommit, strings.Join(figures, "; "))
	if total < freezeCount && !t.Failed() {
		t.Errorf("only %d freezes landed while the job ran, want %d", total, freezeCount)
	}
}

// freezeRound runs one round of freezeAnywhere with up to want freezes:
// n were made, m of them between merge and commit; fig is the round's
// longest healthy waits.
func (s *suite) freezeRound(t *testing.T, seed int64, want int) (n, m int, fig string) {
	r := s.newRound(t, t.Name(), seed, roundOptions{chunks: 240, rows: 1000, sleep: time.Second, mergedPause: 300 * time.Millisecond})
	stop := make(chan struct{})
	done := r.start(stop)
	defer r.teardown()
freezes:
	for n < want {
		if !sleepOrDone(r.between(500*time.Millisecond, 1500*time.Millisecond), done) {
			break
		}
		// Longer than the bound: the others must fence it to go on.
		d := r.between(bound+time.Second, bound+4*time.Second)
		if r.rng.IntN(2) == 0 {
			// Between merge and commit: the next worker to say "merged".
			for len(r.merged) > 0 {
				<-r.merged
			}
			var e event
			select {
			case e = <-r.merged:
			case <-done:
				break freezes
			case <-time.After(30 * time.Second):
				t.Fatalf("no worker merged a chunk within 30 s: %s", r.progress())
			}
			if !r.freezeMerged(r.workers[e.worker], e.seq, d, done) {
				continue
			}
			m++
		} else {
			// At a random point: whatever the worker is doing now.
			w := r.pick()
			if w == nil {
				continue
			}
			r.freeze("sigstop", w, d, done)
		}
		n++
	}
	r.wait(done, stop, 5*time.Minute)
	r.check()
	return n, m, r.figures()
}

// freezeMerged stops w (SIGSTOP) for d right after it said it merged
// chunk seq, so between the merge and the commit, and records the window
// (held: w holds seq). It reports false if w was not running.
func (r *round) freezeMerged(w *worker, seq int, d time.Duration, done <-chan struct{}) bool {
	win := window{kind: "sigstop", start: time.Now(), frozen: map[int]bool{w.idx: true}, held: true, seqs: []int{seq}}
	if !w.signal(syscall.SIGSTOP) {
		return false
	}
	r.t.Logf("fault: SIGSTOP %s for %v between the merge and the commit of chunk %d", w.id, d.Round(time.Millisecond), seq)
	sleepOrDone(d, done)
	w.signal(syscall.SIGCONT)
	win.end = time.Now()
	r.fault("sigstop-merged")
	r.mu.Lock()
	r.windows = append(r.windows, win)
	r.mu.Unlock()
	return true
}

// figures is the round's longest healthy wait, measured outside and
// logged, for the scenario's summary.
func (r *round) figures() string {
	wait, _ := r.longestHealthyWait(time.Now())
	logged, _ := r.longestLoggedWait()
	return fmt.Sprintf("%s: outside %v, logged %v", strings.TrimPrefix(r.name, "TestFaults/"), wait.Round(time.Millisecond), logged.Round(time.Millisecond))
}
