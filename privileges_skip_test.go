package backfill_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestLeastPrivilegeSkipUnchanged: a role with only DML on the manifest's
// tables, TEMPORARY on the database and SELECT, INSERT, UPDATE on the
// target (no ownership, no CREATE, no DELETE) loads with SkipUnchanged,
// replays skipping every chunk, and merges exactly a changed chunk: the
// fingerprints, the skip key and the skipped marker need nothing more.
func TestLeastPrivilegeSkipUnchanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	r.exec(t, `CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, r.admin))
	r.exec(t, `REVOKE TEMPORARY ON DATABASE "`+dbName(t, r.admin)+`" FROM PUBLIC`)
	r.exec(t, `GRANT TEMPORARY ON DATABASE "`+dbName(t, r.admin)+`" TO {role}`)
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE ON items TO {role}`)

	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	src := newSkipSource()
	job := skipJob(src)
	rep, err := runner.Run(ctx, job)
	require.NoError(t, err, "first load as the role")
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts)

	rep, err = runner.Run(ctx, job)
	require.NoError(t, err, "unchanged replay as the role")
	require.Equal(t, 10, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)

	src.set(250, "changed", "2.50")
	rep, err = runner.Run(ctx, job)
	require.NoError(t, err, "restatement as the role")
	require.Equal(t, 9, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Updated: 1, Unchanged: 999}, rep.Counts)
	var name string
	require.NoError(t, r.admin.Get(&name, `SELECT name FROM items WHERE id = 250`))
	require.Equal(t, "changed", name)
}
