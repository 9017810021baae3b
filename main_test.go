package backfill_test

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// exampleDB returns a fresh database on the tests' server for a runnable
// example (examples have no *testing.T); it is dropped with the server.
func exampleDB(name string) *sqlx.DB {
	admin := sqlx.MustOpen("postgres", pgtest.AdminURL())
	defer admin.Close()
	dbname := fmt.Sprintf("example_%s_%d", name, time.Now().UnixNano())
	admin.MustExec(`CREATE DATABASE ` + pq.QuoteIdentifier(dbname))
	u, err := url.Parse(pgtest.AdminURL())
	if err != nil {
		panic(err)
	}
	u.Path = "/" + dbname
	return sqlx.MustOpen("postgres", u.String())
}
