package backfill_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// signalHandler is a slog.Handler that closes seen the first time a
// record's message contains match.
type signalHandler struct {
	match string
	once  *sync.Once
	seen  chan struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, h.match) {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// TestRunGraphWaitsWhilePaused: an operator's pause of the graph's run
// during RunGraph stops the claims, and the call waits for the resume
// (as Run does by default) instead of returning; resumed, it completes
// every module. With Config.ReturnOnPause, a call on the paused graph
// returns an error wrapping ErrRunPaused that says how to resume.
func TestRunGraphWaitsWhilePaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	graph := func(name string) backfill.Graph {
		var once sync.Once
		pause := func(c backfill.Chunk) error {
			var err error
			once.Do(func() {
				_, err = db.ExecContext(ctx, `SELECT backfill.pause($1, 'ops', 'night check')`, name)
			})
			return err
		}
		return backfill.Graph{Name: name, Modules: []backfill.Module{
			{Name: "a", Jobs: []backfill.Job{graphTable(t, db, name+"_a", 10, pause)}},
			{Name: "b", Jobs: []backfill.Job{graphTable(t, db, name+"_b", 10, nil)}, DependsOn: []string{"a"}},
		}}
	}

	// ReturnOnPause: the call returns, saying how to resume.
	quick, err := backfill.New(db, &backfill.Config{Concurrency: 1, ThrottleInterval: time.Nanosecond, ReturnOnPause: true})
	require.NoError(t, err)
	_, err = quick.RunGraph(ctx, graph("gq"))
	require.ErrorIs(t, err, backfill.ErrRunPaused)
	require.ErrorContains(t, err, "resume")

	// By default: paused during the call, it waits, and goes on once resumed.
	g := graph("gp")
	h := signalHandler{match: "this call waits for the resume", once: &sync.Once{}, seen: make(chan struct{})}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ThrottleInterval: time.Nanosecond, Logger: slog.New(h)})
	require.NoError(t, err)
	type result struct {
		rep backfill.GraphReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := r.RunGraph(ctx, g)
		done <- result{rep, err}
	}()
	select {
	case res := <-done:
		t.Fatalf("RunGraph returned on a paused graph instead of waiting: %v", res.err)
	case <-h.seen:
	}
	_, err = db.ExecContext(ctx, `SELECT backfill.resume('gp', 'ops', 'checked')`)
	require.NoError(t, err)
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, backfill.RunCompleted, res.rep.Status)
	require.Equal(t, map[string]string{"a": "completed", "b": "completed"}, moduleStates(res.rep.Modules))
}
