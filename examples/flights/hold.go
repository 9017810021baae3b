package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/examples/internal/cli"
)

// holdDDL creates the control table of the injected throttle.
const holdDDL = `CREATE TABLE IF NOT EXISTS demo_throttle (hold float8 NOT NULL);
DELETE FROM demo_throttle;
INSERT INTO demo_throttle VALUES (0);`

// hold injects a throttle into the flights run and measures the ETA
// (options holdAt, holdFor, etaMarks): a custom SQL signal reads
// demo_throttle.hold, which hold raises once holdAt of the chunks are
// done and lowers holdFor later; and it records the ETA shown when 25%,
// 50% and 75% of the chunks were done. Its methods are safe on a nil
// *hold (neither option given).
type hold struct {
	db    *sqlx.DB
	o     options
	begin time.Time

	mu     sync.Mutex
	raised bool
	timer  *time.Timer
	marks  []etaMark
}

// etaMark is the ETA shown when a fraction of the chunks was done.
type etaMark struct {
	at    float64
	when  time.Time
	eta   time.Duration
	known bool
}

// newHold prepares the throttle and the marks, and hooks them to live's
// statuses; nil when no option asks for them.
func newHold(ctx context.Context, db *sqlx.DB, o options, live *cli.Live) (*hold, error) {
	if o.holdFor <= 0 && !o.etaMarks {
		return nil, nil
	}
	h := &hold{db: db, o: o, begin: time.Now(), marks: []etaMark{{at: 0.25}, {at: 0.50}, {at: 0.75}}}
	if o.holdFor > 0 {
		if _, err := db.ExecContext(ctx, holdDDL); err != nil {
			return nil, fmt.Errorf("throttle table: %w", err)
		}
	}
	live.OnStatus = h.status
	return h, nil
}

// throttles returns the injected throttle, if any.
func (h *hold) throttles() []backfillthrottle.Throttle {
	if h == nil || h.o.holdFor <= 0 {
		return nil
	}
	return []backfillthrottle.Throttle{{
		Signal: backfillthrottle.SQLSignal("demo_hold", `SELECT coalesce((SELECT max(hold) FROM demo_throttle), 0)`),
		High:   1, Low: 0.5,
	}}
}

// status raises the throttle and records the marks.
func (h *hold) status(s backfill.Status) {
	if s.Chunks.Total == 0 {
		return
	}
	frac := float64(s.Chunks.Done+s.Chunks.Open) / float64(s.Chunks.Total)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.o.holdFor > 0 && !h.raised && frac >= h.o.holdAt {
		h.raised = true
		h.set(1)
		h.timer = time.AfterFunc(h.o.holdFor, func() { h.set(0) })
	}
	for i := range h.marks {
		m := &h.marks[i]
		if m.when.IsZero() && frac >= m.at {
			m.when = time.Now()
			m.eta, m.known = s.ETA()
		}
	}
}

// set writes the throttle's value; a failure is printed, not fatal (the
// measurement is then void, the run is not).
func (h *hold) set(v float64) {
	if _, err := h.db.Exec(`UPDATE demo_throttle SET hold = $1`, v); err != nil {
		fmt.Printf("flights: throttle to %v: %v\n", v, err)
	}
}

// stop lowers the throttle (a run that ended while held).
func (h *hold) stop() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timer != nil && h.timer.Stop() {
		h.set(0)
	}
}

// printMarks prints the ETA shown at each mark against the time that
// actually remained until ended.
func (h *hold) printMarks(out io.Writer, ended time.Time) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.o.holdFor > 0 {
		fmt.Fprintf(out, "  throttle   held %s from %.0f%% of the chunks (demo_throttle)\n", h.o.holdFor, 100*h.o.holdAt)
	}
	fmt.Fprintln(out, "  ETA        | chunks done | at | ETA shown | actual remaining | error |")
	for _, m := range h.marks {
		if m.when.IsZero() || !m.known {
			fmt.Fprintf(out, "             | %.0f%% | - | - | - | - |\n", 100*m.at)
			continue
		}
		actual := ended.Sub(m.when)
		fmt.Fprintf(out, "             | %.0f%% | %.1fs | %.1fs | %.1fs | %+.1f%% |\n", 100*m.at, m.when.Sub(h.begin).Seconds(),
			m.eta.Seconds(), actual.Seconds(), 100*(m.eta.Seconds()-actual.Seconds())/actual.Seconds())
	}
}
