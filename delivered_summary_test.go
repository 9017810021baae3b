package backfill_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestDeliveredSummaryOwners: the delivered summary (one row per owner
// batch other than $1: how many rows, the least and greatest identity)
// is the same whether the rows have few owners (top-1 scans per owner)
// or more than the top-1 branch takes (one sort and window), and equals
// the summary computed directly; NULLs, a collated text key column and
// owner $1's rows included.
func TestDeliveredSummaryOwners(t *testing.T) {
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE src (a text COLLATE "C", b int, owner bigint)`)
	db.MustExec(`CREATE TABLE delivered (owner bigint, batch_id bigint, seq int, key_columns text[], lo jsonb, hi jsonb, row_count bigint)`)
	rows := `SELECT s.a, s.b, s.owner AS _backfill_owner FROM src s WHERE s.owner <> $1::bigint AND s.owner <= $4`
	q := pgstore.DeliveredSummarySQL("delivered", []string{"a", "b"}, rows)
	// 20 owners; owner k has rows of keys ('k..', b) scattered, one with
	// a NULL b, and owner 1 (the batch, $1) rows that must not count.
	db.MustExec(`INSERT INTO src SELECT chr(97 + (i % 7)) || (i % 13)::text, CASE WHEN i % 97 = 0 THEN NULL ELSE i END, 1 + (i * 7919) % 20
		FROM generate_series(1, 3000) i`)
	want := `SELECT x.owner, count(*) AS row_count,
		jsonb_build_object('a', (array_agg(x.a ORDER BY x.a, x.b))[1], 'b', (array_agg(x.b ORDER BY x.a, x.b))[1]) AS lo,
		jsonb_build_object('a', (array_agg(x.a ORDER BY x.a DESC, x.b DESC))[1], 'b', (array_agg(x.b ORDER BY x.a DESC, x.b DESC))[1]) AS hi
		FROM src x WHERE x.owner <> 1 AND x.owner <= $1 GROUP BY x.owner ORDER BY x.owner`
	type summary struct {
		Owner    int64  `db:"owner"`
		RowCount int64  `db:"row_count"`
		Lo       string `db:"lo"`
		Hi       string `db:"hi"`
	}
	for _, maxOwner := range []int{2, 4, 9, 10, 20} { // 1, 3, 8 (the top-1 branch's most), 9, 19 owners
		t.Run(fmt.Sprint(maxOwner-1, " owners"), func(t *testing.T) {
			db.MustExec(`TRUNCATE delivered`)
			db.MustExec(q, 1, 5, `{a,b}`, maxOwner)
			var got, exp []summary
			require.NoError(t, db.Select(&got, `SELECT owner, row_count, lo::text AS lo, hi::text AS hi FROM delivered
				WHERE batch_id = 1 AND seq = 5 AND key_columns = '{a,b}' ORDER BY owner`))
			require.NoError(t, db.Select(&exp, `SELECT owner, row_count, lo::text AS lo, hi::text AS hi FROM (`+want+`) w`, maxOwner))
			require.Len(t, got, maxOwner-1)
			require.Equal(t, exp, got)
		})
	}
}
