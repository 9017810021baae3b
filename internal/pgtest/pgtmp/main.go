// Command pgtmp runs a throwaway PostgreSQL server for as long as its
// standard input stays open.
//
// It starts a server with pgtest.Start (with production durability,
// fsync, full_page_writes and synchronous_commit on, when BACKFILL_DURABLE
// is set: pgtest.Options.Durable), prints DATABASE_URL=<url> as the
// first line of its standard output, then waits until standard input is
// closed (EOF) or it gets SIGINT or SIGTERM, stops the server and removes
// its files. internal/pgtest/with-postgres.sh uses it to run a command
// against a throwaway server.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

func main() {
	os.Exit(run())
}

func run() int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	srv, err := pgtest.StartWith(ctx, pgtest.Options{Durable: os.Getenv("BACKFILL_DURABLE") != ""})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtmp:", err)
		return 1
	}
	fmt.Printf("DATABASE_URL=%s\n", srv.URL())
	fmt.Fprintf(os.Stderr, "pgtmp: PostgreSQL on %s (socket in %s); close stdin or send SIGINT/SIGTERM to stop it\n",
		srv.URL(), srv.SocketDir())

	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case sig := <-sigs:
		fmt.Fprintf(os.Stderr, "pgtmp: %v\n", sig)
	}
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtmp:", err)
		return 1
	}
	return 0
}
