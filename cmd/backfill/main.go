// Command backfill is the operator's tool for the backfill library.
//
// Commands:
//
//	backfill migrate [--grant ROLE]...   create or migrate the manifest's schema (an administrator, once per release)
//	backfill grants ROLE [--table T]...  print the GRANT statements a runtime role needs
//
// Every command connects to the database named by --database-url, or the
// DATABASE_URL environment variable; --schema names the manifest's schema
// (default "backfill"); --json prints one JSON document instead of text.
// Exit status: 0 done, 1 failed, 2 bad usage.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
