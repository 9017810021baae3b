package benchpg

import (
	"context"
	"fmt"
	"os"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/pgurl"
)

// Setting is one row of pg_settings.
type Setting struct {
	Name  string `db:"name"`
	Value string `db:"setting"`
}

// Open connects to DATABASE_URL or, when it is unset, to a throwaway
// server it starts (production durability, fsync and synchronous_commit
// on, unless fast), with at most maxConns connections. It returns the
// URL, the server's settings of names (and server_version), and stop,
// which closes the pool and stops a server it started.
func Open(ctx context.Context, fast bool, maxConns int, names ...string) (db *sqlx.DB, url string, settings []Setting, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	url = os.Getenv("DATABASE_URL")
	if url == "" {
		c, err := pgtest.StartWith(ctx, pgtest.Options{Durable: !fast})
		if err != nil {
			return nil, "", nil, stop, err
		}
		stops = append(stops, func() { _ = c.Stop() })
		url = c.URL()
	} else if err := pgurl.Check(url); err != nil {
		return nil, "", nil, stop, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if db, err = sqlx.Open("postgres", url); err != nil {
		return nil, "", nil, stop, err
	}
	stops = append(stops, func() { _ = db.Close() })
	db.SetMaxOpenConns(maxConns)
	err = db.SelectContext(ctx, &settings, `SELECT name, setting FROM pg_settings WHERE name = ANY ($1) OR name = 'server_version' ORDER BY name`,
		pq.Array(names))
	return db, url, settings, stop, err
}
