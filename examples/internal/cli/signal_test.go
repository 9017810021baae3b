package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestSignalPausesThenCancels: the first signal (SIGUSR1 here: pgtest
// owns SIGINT and SIGTERM; the commands use those) pauses the run through
// the manifest's SQL control (the chunk in flight finishes and is done),
// the second cancels it (the chunk in flight rolls back and stays
// pending); the errors say how to resume. Not parallel: it signals its
// own process.
func TestSignalPausesThenCancels(t *testing.T) {
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE t (id bigint PRIMARY KEY)`)
	r, err := backfill.New(db, &backfill.Config{ThrottleInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	status := func() string {
		var s string
		_ = db.Get(&s, `SELECT status FROM backfill.runs WHERE job_name = 'sig'`)
		return s
	}
	waitStatus := func(want string) {
		for deadline := time.Now().Add(30 * time.Second); status() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("run never %s (is %s)", want, status())
			}
		}
	}
	var signals int // SIGINTs to send in the chunk in flight
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
		return out.String(), RunError("sig", "-x", err)
	}

	out, err := run(1)
	if !errors.Is(err, backfill.ErrRunPaused) || !strings.Contains(err.Error(), "SELECT backfill.resume('sig'") || !strings.Contains(err.Error(), "go -C cmd/backfill run . resume --job sig --why") {
		t.Fatalf("first signal: %v\n%s", err, out)
	}
	if !strings.Contains(out, "pausing") {
		t.Errorf("output %q does not say it pauses", out)
	}
	var done int
	_ = db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`)
	if done != 1 {
		t.Errorf("%d chunks done after the pause, want 1 (the chunk in flight finishes)", done)
	}

	db.MustExec(`SELECT backfill.resume('sig', 'test', 'go on')`)
	out, err = run(2)
	if !errors.Is(err, backfill.ErrRunCancelled) || !strings.Contains(out, "cancelling") {
		t.Fatalf("second signal: %v\n%s", err, out)
	}
	var st []string
	_ = db.Select(&st, `SELECT status FROM backfill.chunks ORDER BY seq`)
	if got := fmt.Sprint(st); got != "[done pending pending]" {
		t.Errorf("chunks after the cancel: %s, want [done pending pending]", got)
	}
	var actors []string
	_ = db.Select(&actors, `SELECT kind FROM backfill.events WHERE kind IN ('run_paused', 'run_cancelled') ORDER BY id`)
	if fmt.Sprint(actors) != "[run_paused run_paused run_cancelled]" {
		t.Errorf("audit: %v", actors)
	}
}
