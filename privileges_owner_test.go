package backfill_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestOwnerPrivilegeNeverSuggestsPrivilegedMembership: PublishVersionedView
// on an existing view the role does not own reports OWNER with a
// statement that never makes the role a member of a superuser's or
// otherwise privileged role: ALTER VIEW ... OWNER TO, unless the owner is
// a plain NOLOGIN owner role. The statement it names is enough.
func TestOwnerPrivilegeNeverSuggestsPrivilegedMembership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	r.exec(t, `CREATE SCHEMA app`)
	r.exec(t, `CREATE TABLE app.items (id bigint PRIMARY KEY, name text)`)
	require.NoError(t, backfill.NewPGManifest("").Migrate(ctx, r.admin))
	r.exec(t, `GRANT USAGE, CREATE ON SCHEMA backfill, app TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE ON app.items TO {role}`)
	// Owner roles of the view: privileged ones (each its own way) and a
	// plain NOLOGIN one.
	owners := []struct {
		name, create string
		plain        bool
	}{
		{"", "", false}, // the test's superuser
		{r.name + "_cr", `CREATE ROLE {owner} NOLOGIN CREATEROLE`, false},
		{r.name + "_db", `CREATE ROLE {owner} NOLOGIN CREATEDB`, false},
		{r.name + "_rls", `CREATE ROLE {owner} NOLOGIN BYPASSRLS`, false},
		{r.name + "_login", `CREATE ROLE {owner} LOGIN`, false},
		{r.name + "_pg", `CREATE ROLE {owner} NOLOGIN; GRANT pg_read_all_data TO {owner}`, false},
		{r.name + "_up", `CREATE ROLE {owner}_s NOLOGIN SUPERUSER; CREATE ROLE {owner} NOLOGIN; GRANT {owner}_s TO {owner}`, false},
		{r.name + "_plain", `CREATE ROLE {owner} NOLOGIN`, true},
	}
	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	rows := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, c.Lo, "x")
	})
	job := backfill.Job{Name: "view", Chunker: backfill.IntRange(0, 4, 2), Extractor: rows,
		Target:  backfill.Target{Table: "app.items", Key: []string{"id"}, Columns: []string{"id", "name"}},
		Publish: backfill.Publish{Mode: backfill.PublishVersionedView, View: "app.items_v"}}
	for _, o := range owners {
		r.exec(t, `DROP VIEW IF EXISTS app.items_v`)
		r.exec(t, `CREATE VIEW app.items_v AS SELECT * FROM app.items`)
		owner := o.name
		if o.create != "" {
			sub := func(q string) string { return strings.ReplaceAll(q, "{owner}", owner) }
			r.exec(t, sub(o.create))
			t.Cleanup(func() {
				_, _ = r.admin.Exec(sub(`DROP OWNED BY {owner}; DROP ROLE {owner}`))
				_, _ = r.admin.Exec(sub(`DROP ROLE IF EXISTS {owner}_s`))
			})
			r.exec(t, `GRANT CREATE ON SCHEMA app TO `+owner)
			r.exec(t, `ALTER VIEW app.items_v OWNER TO `+owner)
		} else {
			require.NoError(t, r.admin.Get(&owner, `SELECT current_user`))
		}
		_, err := runner.Run(ctx, job)
		var pe *backfill.PrivilegeError
		require.True(t, errors.As(err, &pe), "owner %s: %v", owner, err)
		require.Len(t, pe.Missing, 1, "owner %s", owner)
		p := pe.Missing[0]
		require.Equal(t, "OWNER", p.Privilege)
		require.Equal(t, `view "app"."items_v"`, p.Object)
		want := `ALTER VIEW "app"."items_v" OWNER TO "` + r.name + `";`
		if o.plain {
			want = `GRANT "` + owner + `" TO "` + r.name + `";`
		}
		require.Equal(t, want, p.Grant, "owner %s", owner)
		require.Equal(t, []string{want}, pe.Grants())
		require.Contains(t, err.Error(), "lacks 1 privilege:")
		// The statement it names is enough, and the role gets no
		// privileged membership from it.
		r.exec(t, want)
		_, err = runner.Run(ctx, job)
		require.NoError(t, err, "owner %s, after %s", owner, want)
		var super bool
		require.NoError(t, r.db.Get(&super, `SELECT EXISTS (SELECT FROM pg_roles x WHERE pg_has_role(x.oid, 'MEMBER')
			AND (x.rolsuper OR x.rolcreaterole OR x.rolcreatedb OR x.rolbypassrls OR x.rolname LIKE 'pg\_%'))`))
		require.False(t, super, "owner %s: %s gave the role a privileged membership", owner, want)
		r.exec(t, `SET session_replication_role = replica; DELETE FROM backfill.runs; RESET session_replication_role`) // past the audit log's append-only trigger
		r.exec(t, `REVOKE "`+owner+`" FROM {role}`)
		job.NewRun = true
	}
}

// TestInsertOnlyNamesColumns: a role with UPDATE on some of the columns an
// Upsert writes but not all runs insert-only, and the warning and the
// refused chunk name the missing columns with the column-level GRANT,
// which is enough.
func TestInsertOnlyNamesColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	s := &itemsSetup{db: r.admin}
	r.exec(t, `CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	require.NoError(t, backfill.NewPGManifest("").Migrate(ctx, r.admin))
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT ON items TO {role}`)
	r.exec(t, `GRANT UPDATE (name, backfill_updated_by) ON items TO {role}`)
	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	rep, err := runner.Run(ctx, s.job(1))
	require.NoError(t, err)
	grant := `GRANT UPDATE ("amount", "seen_at") ON TABLE "public"."items" TO "` + r.name + `";`
	require.Contains(t, strings.Join(rep.Warnings, "\n"), `lacks UPDATE on "public"."items" (columns "amount", "seen_at"): the run only inserts`)
	require.Contains(t, strings.Join(rep.Warnings, "\n"), grant)
	job := s.job(2)
	job.NewRun = true
	_, err = runner.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrPrivilege)
	require.Contains(t, err.Error(), `lacks UPDATE on "public"."items" (columns "amount", "seen_at")`)
	require.Contains(t, err.Error(), grant)
	r.exec(t, grant)
	job.NewRun = false
	rep, err = runner.Run(ctx, job)
	require.NoError(t, err, "after %s", grant)
	require.Equal(t, int64(100), rep.Counts.Updated)
}
