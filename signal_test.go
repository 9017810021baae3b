//go:build unix

package backfill_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
)

// TestPauseOnSignal: the first signal (SIGUSR1 here: pgtest owns SIGINT
// and SIGTERM) pauses the run through the manifest's control (the chunk
// in flight finishes and is done; Run returns ErrRunPaused saying how to
// resume), the second cancels it (the chunk in flight rolls back and
// stays pending; Run returns ErrRunCancelled); each is written to out and
// recorded in the audit trail. Not parallel: it signals its own process.
func TestPauseOnSignal(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE t (id bigint PRIMARY KEY)`)
	r, err := backfill.New(db, &backfill.Config{ThrottleInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	status := func() string {
		var s string
		_ = db.Get(&s, `SELECT status FROM backfill.runs WHERE job_name = 'sig'`)
		return s
	}
	waitStatus := func(want string) {
		for deadline := time.Now().Add(30 * time.Second); status() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("run never %s (is %s)", want, status())
				return
			}
		}
	}
	var signals int // signals to send in the chunk in flight
	var once sync.Once
	job := backfill.Job{
		Name: "sig", Chunker: backfill.IntRange(0, 30, 10), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "t", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id); err != nil {
					return err
				}
			}
			once.Do(func() {
				for i := range signals {
					_ = syscall.Kill(syscall.Getpid(), syscall.SIGUSR1)
					waitStatus([]string{"paused", "cancelled"}[i])
				}
			})
			if signals == 2 {
				<-ctx.Done() // aborted by the cancel
				return ctx.Err()
			}
			return nil
		}),
	}
	run := func(n int) (string, error) {
		signals, once = n, sync.Once{}
		var out bytes.Buffer
		stop := r.PauseOnSignal("sig", &out, syscall.SIGUSR1)
		_, err := r.Run(ctx, job)
		stop()
		return out.String(), err
	}

	out, err := run(1)
	require.ErrorIs(t, err, backfill.ErrRunPaused, out)
	require.Contains(t, err.Error(), "backfill resume --batch")
	require.Contains(t, out, "pausing")
	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
	require.Equal(t, 1, done, "the chunk in flight finishes")

	db.MustExec(`SELECT backfill.resume('sig', 'test', 'go on')`)
	out, err = run(2)
	require.ErrorIs(t, err, backfill.ErrRunCancelled, out)
	require.Contains(t, out, "cancelling")
	var st []string
	require.NoError(t, db.Select(&st, `SELECT status FROM backfill.chunks ORDER BY seq`))
	require.Equal(t, "[done pending pending]", fmt.Sprint(st))
	// The library's own pauses and cancel: actor "backfill", the session's
	// role recorded, the signal, the process and its user in the reason.
	var kinds []string
	require.NoError(t, db.Select(&kinds, `SELECT kind || ' ' || (detail->>'why') FROM backfill.events
		WHERE kind IN ('run_paused', 'run_cancelled') AND actor = 'backfill' AND db_role = session_user ORDER BY id`))
	require.Len(t, kinds, 3)
	for _, k := range kinds {
		require.Contains(t, k, "received by pid "+fmt.Sprint(syscall.Getpid())+" (", k)
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer goroutine and a
// reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestPauseOnSignalCancelsOnlyThePauseInForce: a signal cancels only
// while the run is still paused by the previous signal's pause. Paused
// by a signal, then resumed by an operator, the next signal pauses the
// run again (the one after cancels); started against a paused run, the
// first signal's refused pause counts as its pause, but once an
// operator resumed the run the next signal pauses it again. Not
// parallel: it signals its own process.
func TestPauseOnSignalCancelsOnlyThePauseInForce(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE t (id bigint PRIMARY KEY)`)
	r, err := backfill.New(db, &backfill.Config{RetryBackoff: 1})
	require.NoError(t, err)
	// A run of the job to steer: failed at once (an extractor bug).
	job := backfill.Job{
		Name: "sig2", Chunker: backfill.IntRange(0, 10, 10), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "t", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, c.Lo, "one value too many")
		}),
	}
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrExtractor)
	status := func() string {
		var s string
		require.NoError(t, db.Get(&s, `SELECT status FROM backfill.runs WHERE job_name = 'sig2'`))
		return s
	}
	// waitChange waits until the run's status is no longer from, and
	// returns it.
	waitChange := func(from string) string {
		var s string
		testwait.Until(t, "the run's status to change from "+from, func() bool { s = status(); return s != from })
		return s
	}
	signal := func() { require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGUSR1)) }
	sql := func(q string) { db.MustExec(q) }

	// Paused by a signal, resumed by an operator: the next signal
	// pauses again, the one after cancels.
	sql(`SELECT backfill.pause('sig2', 'test', 'start paused')`)
	sql(`SELECT backfill.resume('sig2', 'test', 'running')`)
	out := &lockedBuffer{}
	stop := r.PauseOnSignal("sig2", out, syscall.SIGUSR1)
	signal()
	require.Equal(t, "paused", waitChange("running"), out.String())
	sql(`SELECT backfill.resume('sig2', 'operator', 'go on')`)
	signal()
	require.Equal(t, "paused", waitChange("running"), "a signal after a resume pauses again: %s", out.String())
	signal()
	require.Equal(t, "cancelled", waitChange("paused"), out.String())
	stop()

	// Started against a paused run: the first signal finds it paused
	// (that counts as its pause); an operator resumes it; the next
	// signal pauses it again, the one after cancels.
	sql(`SELECT backfill.resume('sig2', 'test', 'running')`)
	sql(`SELECT backfill.pause('sig2', 'operator', 'paused before the signals')`)
	out = &lockedBuffer{}
	stop = r.PauseOnSignal("sig2", out, syscall.SIGUSR1)
	defer stop()
	signal()
	testwait.Until(t, "the signal to find the run paused", func() bool { return strings.Contains(out.String(), "paused already") })
	require.Equal(t, "paused", status())
	sql(`SELECT backfill.resume('sig2', 'operator', 'go on')`)
	signal()
	require.Equal(t, "paused", waitChange("running"), "a signal after a resume pauses again: %s", out.String())
	signal()
	require.Equal(t, "cancelled", waitChange("paused"), out.String())
}

// TestWorkWaitsAfterPauseOnSignal: a worker process (Work) whose run a
// signal paused (PauseOnSignal) does not exit: it waits as a registered
// worker of the run and, once an operator resumes the run from SQL,
// works it to the end and returns ExitDone. Not parallel: it signals its
// own process.
func TestWorkWaitsAfterPauseOnSignal(t *testing.T) {
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE t (id bigint PRIMARY KEY)`)
	r, err := backfill.New(db, &backfill.Config{ThrottleInterval: 20 * time.Millisecond, Concurrency: 1})
	require.NoError(t, err)
	status := func() string {
		var s string
		_ = db.Get(&s, `SELECT status FROM backfill.runs WHERE job_name = 'sigwork'`)
		return s
	}
	var once sync.Once
	job := backfill.Job{
		Name: "sigwork", Chunker: backfill.IntRange(0, 30, 10), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "t", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id); err != nil {
					return err
				}
			}
			once.Do(func() {
				_ = syscall.Kill(syscall.Getpid(), syscall.SIGUSR1)
				testwait.Until(t, "the signal paused the run", func() bool { return status() == "paused" })
			})
			return nil
		}),
	}
	var out lockedBuffer
	stop := r.PauseOnSignal("sigwork", &out, syscall.SIGUSR1)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	codes := make(chan backfill.ExitCode, 1)
	go func() { codes <- backfill.Work(ctx, r, job) }()
	testwait.Until(t, "the paused run idle with its worker waiting", func() bool {
		select {
		case code := <-codes:
			t.Fatalf("Work returned %d when a signal paused the run, instead of waiting for the resume: %s", code, out.String())
		default:
		}
		var st struct {
			Done     int `db:"done"`
			Leased   int `db:"leased"`
			Unfinish int `db:"unfinished"`
		}
		// Fails until the first worker created the manifest.
		err := db.Get(&st, `SELECT count(*) FILTER (WHERE c.status = 'done') AS done,
			count(*) FILTER (WHERE c.lease_key IS NOT NULL) AS leased,
			(SELECT count(*) FROM backfill.workers w WHERE w.finished_at IS NULL) AS unfinished
			FROM backfill.chunks c`)
		return err == nil && status() == "paused" && st.Done == 1 && st.Leased == 0 && st.Unfinish == 1
	})
	db.MustExec(`SELECT backfill.resume('sigwork', 'ann', 'go on')`)
	require.Equal(t, backfill.ExitDone, testwait.Recv(t, "Work's exit code after the resume", codes), out.String())
	require.Contains(t, out.String(), "pausing")
}
