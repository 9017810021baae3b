package backfill

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestCreateStagingInTx: PublishAtEnd's persistent staging table is
// created in a transaction of the library's (READ COMMITTED), not by a
// statement outside any transaction. Not parallel: it sets a global hook.
func TestCreateStagingInTx(t *testing.T) {
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	defer db.Close()
	var (
		mu      sync.Mutex
		outside []string
	)
	hook := func(q string) {
		if strings.Contains(q, "stage_1") {
			mu.Lock()
			defer mu.Unlock()
			outside = append(outside, q)
		}
	}
	pgstore.OutsideTxAnyHook.Store(&hook)
	defer pgstore.OutsideTxAnyHook.Store(nil)
	info := TableInfo{Columns: []Column{{Name: "id", Type: "bigint"}, {Name: "name", Type: "text"}}}
	require.NoError(t, (&pgstore.Merger{}).CreateStaging(ctx, pgstore.PGDB{DB: db}, `"public"."stage_1"`, info))
	pgstore.OutsideTxAnyHook.Store(nil)
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, outside, "statements outside a transaction")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.stage_1'::regclass AND attnum > 0`))
	require.Equal(t, 4, n)
}
