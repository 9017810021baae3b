// Command backfill is the operator's tool for the backfill library: it
// inspects and rolls back runs from any machine, with only the database
// (DATABASE_URL) and without the jobs' code, and migrates the manifest.
//
// It is a module of its own. Install it from a checkout with
//
//	go -C cmd/backfill install .
//
// or run it in place with "go -C cmd/backfill run . COMMAND".
//
// Commands:
//
//	backfill runs [--job NAME] [--status S] [--limit N]           recent runs: job, batch, status, times, chunks, rows
//	backfill chunks [JOB | --job NAME | --batch N] [--status S]   a run's chunks: status, counts, attempts, error, worker
//	backfill exceptions [JOB | --job NAME | --batch N] [--reason TEXT] [--column C] [--chunk ID] [--limit N] [--csv]
//	                                                              a run's exception queue, with the raw rows
//	backfill validations [JOB | --job NAME | --batch N] [--chunk ID] [--failed]
//	                                                              a run's validation evidence per chunk
//	backfill events [JOB | --job NAME | --batch N] [--kind K]...  a run's audit trail
//	backfill rollback --preview (--job NAME | --batch N)          what a rollback would do; changes nothing
//	backfill rollback --batch N --why TEXT [--actor NAME] [--force] [--chunk ID]
//	                                                              withdraw a batch from what the manifest recorded
//	backfill migrate [--grant ROLE]...                            create or migrate the manifest's schema (an administrator, once per release)
//	backfill grants ROLE [--table T]...                           print the GRANT statements a runtime role needs
//
// Every command connects to the database named by --database-url, or the
// DATABASE_URL environment variable; --schema names the manifest's schema
// (default "backfill"); --json prints one JSON document, with stable
// field names, instead of text for people (aligned tables, counts with
// thousands separators, times in UTC). "backfill COMMAND --help" documents
// each command and its JSON.
//
// Exit status: 0 done, 1 failed (a database error, a refused rollback),
// 2 bad usage (also: no DATABASE_URL), 3 no such job, batch or chunk,
// 4 the manifest is missing, behind or ahead of this program (run
// "backfill migrate").
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
