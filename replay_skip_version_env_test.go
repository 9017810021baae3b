package backfill_test

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestLeastPrivilegeChunkVersion: a role with DML only (no ownership, no
// CREATE, no DELETE on the target), ExtractAhead at Concurrency 2: an
// unchanged replay with a ChunkVersioner extracts nothing and skips every
// chunk; a changed target row and a changed source row each make exactly
// their chunk extracted and merged.
func TestLeastPrivilegeChunkVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	r.exec(t, `CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, r.admin))
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE ON items TO {role}`)
	runner, err := backfill.New(r.db, &backfill.Config{Concurrency: 2, ExtractAhead: true})
	require.NoError(t, err)
	src := newVersionedSource()
	job := skipJob(src.skipSource)
	job.Extractor = src
	_, err = runner.Run(ctx, job)
	require.NoError(t, err)
	src.calls()
	rep, err := runner.Run(ctx, job)
	require.NoError(t, err)
	ex, _ := src.calls()
	require.Empty(t, ex)
	require.Equal(t, 10, rep.ChunksSkipped)
	r.admin.MustExec(`UPDATE items SET name = 'x' WHERE id = 420`)
	src.set(130, "c", "1.00")
	rep, err = runner.Run(ctx, job)
	require.NoError(t, err)
	ex, _ = src.calls()
	require.Equal(t, []string{"int:100/200", "int:400/500"}, ex)
	require.Equal(t, 8, rep.ChunksSkipped)
}

// TestPoolerChunkVersion: the same through PgBouncer in transaction mode
// at Concurrency 4 with ExtractAhead; the changed target row is restored.
func TestPoolerChunkVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewPoolerURL(t))
	defer db.Close()
	db.MustExec(`CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	runner, err := backfill.New(db, &backfill.Config{Concurrency: 4, ExtractAhead: true})
	require.NoError(t, err)
	src := newVersionedSource()
	job := skipJob(src.skipSource)
	job.Extractor = src
	_, err = runner.Run(ctx, job)
	require.NoError(t, err)
	src.calls()
	db.MustExec(`UPDATE items SET name = 'x' WHERE id = 420`)
	src.set(130, "c", "1.00")
	rep, err := runner.Run(ctx, job)
	require.NoError(t, err)
	ex, _ := src.calls()
	require.Equal(t, []string{"int:100/200", "int:400/500"}, ex)
	require.Equal(t, 8, rep.ChunksSkipped)
	var n string
	require.NoError(t, db.Get(&n, `SELECT name FROM items WHERE id = 420`))
	require.NotEqual(t, "x", n)
}
