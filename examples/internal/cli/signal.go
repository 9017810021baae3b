package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"syscall"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// PauseOnSignal steers job's run from SIGINT and SIGTERM, through the
// manifest's SQL control functions (schema's pause and cancel, the path
// an operator's psql takes): the first signal pauses the run (every
// worker stops claiming, the chunks in flight finish and checkpoint, and
// Run returns backfill.ErrRunPaused), a second one cancels it (the chunks
// in flight roll back, Run returns backfill.ErrRunCancelled). It says so
// on out and returns the function that stops listening. Run the job with
// a context the signals do not cancel. sigs replaces SIGINT and SIGTERM
// when given (tests).
func PauseOnSignal(db *sqlx.DB, schema, job string, out io.Writer, sigs ...os.Signal) (stop func()) {
	ch := make(chan os.Signal, 2)
	if len(sigs) == 0 {
		sigs = []os.Signal{os.Interrupt, syscall.SIGTERM}
	}
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	actor := "signal"
	if u, err := user.Current(); err == nil {
		actor = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		actor += "@" + h
	}
	go func() {
		n := 0
		for {
			select {
			case <-done:
				return
			case s := <-ch:
				n++
				action, says := "pause", "pausing: the chunks in flight finish; press Ctrl-C again to cancel"
				if n > 1 {
					action, says = "cancel", "cancelling: the chunks in flight roll back"
				}
				fmt.Fprintf(out, "\n%s received: %s job %s\n", s, says, job)
				q := fmt.Sprintf(`SELECT %s.%s($1::text, $2::text, $3::text)`, pq.QuoteIdentifier(schema), action)
				err := func() error {
					tx, err := db.BeginTxx(context.Background(), nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					if _, err := tx.Exec(q, job, actor, fmt.Sprintf("%s received by pid %d", s, os.Getpid())); err != nil {
						return err
					}
					return tx.Commit()
				}()
				if err != nil {
					fmt.Fprintf(out, "%s of job %s failed: %v\n", action, job, err)
				}
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
