package backfilltest

import (
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// PostgresMain is for TestMain, in modules whose tests need a real
// PostgreSQL (adapters, host applications):
//
//	func TestMain(m *testing.M) { backfilltest.PostgresMain(m) }
//
// It runs the tests against the server named by the DATABASE_URL
// environment variable when it is set; otherwise it starts a throwaway
// server in a temporary directory from the PostgreSQL binaries installed
// on the machine (PG_BIN names their directory, else the usual places and
// PATH) and removes it when the tests are done. Without a server, tests
// that call [NewPostgres] are skipped, except with CI=true, where
// PostgresMain exits with status 1. It does not return.
func PostgresMain(m interface{ Run() int }) { pgtest.Main(m) }

// NewPostgres returns a connection pool on a fresh, empty database of the
// server [PostgresMain] gave the test binary, created for t under a
// unique name. The database is dropped when t passes and kept (its URL
// logged) when it fails. It skips t when there is no server.
func NewPostgres(t testing.TB) *sqlx.DB { return pgtest.New(t) }

// NewPostgresURL is [NewPostgres] returning the database's URL, for code
// that opens its own connections.
func NewPostgresURL(t testing.TB) string { return pgtest.NewURL(t) }
