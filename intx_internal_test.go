package backfill

import (
	"context"
	"errors"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestInTxReadCommittedAndRetriesConflicts checks the two promises of
// inTx under a SERIALIZABLE database default: the transaction it begins
// is READ COMMITTED, and a transaction that fails with 40001 or 40P01
// runs again (its earlier attempt rolled back), while other errors are
// returned at once.
func TestInTxReadCommittedAndRetriesConflicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	admin, err := sqlx.Open("postgres", u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	_, err = admin.Exec(`CREATE TABLE t (n int);
		DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = serializable', current_database()); END $$`)
	require.NoError(t, err)
	db, err := sqlx.Open("postgres", u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })

	for _, via := range []sqlx.ExtContext{db, pgstore.PGDB{DB: db}} {
		for _, code := range []string{"40001", "40P01", "23514"} {
			_, err := admin.Exec(`TRUNCATE t`)
			require.NoError(t, err)
			calls := 0
			err = pgstore.InTx(ctx, via, func(tx sqlx.ExtContext) error {
				calls++
				var level string
				if err := sqlx.GetContext(ctx, tx, &level, `SHOW transaction_isolation`); err != nil {
					return err
				}
				if level != "read committed" {
					return errors.New("isolation " + level)
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO t VALUES ($1)`, calls); err != nil {
					return err
				}
				if calls < 3 {
					_, err := tx.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '`+code+`'; END $$`)
					return err
				}
				return nil
			})
			var ns []int
			require.NoError(t, admin.Select(&ns, `SELECT n FROM t`))
			if code == "23514" {
				var pe *pq.Error
				require.ErrorAs(t, err, &pe)
				require.Equal(t, code, string(pe.Code))
				require.Equal(t, 1, calls)
				require.Empty(t, ns)
				continue
			}
			require.NoError(t, err, code)
			require.Equal(t, 3, calls, code)
			require.Equal(t, []int{3}, ns, code)
		}
	}
}
