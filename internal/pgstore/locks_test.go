package pgstore

import (
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/backfilltype"
)

// TestDescribeBlockersEmptyFields: the fields PostgreSQL leaves empty
// (another role's session state, a holder without mode) leave no empty
// field in the text.
func TestDescribeBlockersEmptyFields(t *testing.T) {
	for _, tc := range []struct {
		b    backfilltype.Blocker
		want string
	}{
		{backfilltype.Blocker{PID: 7, ApplicationName: "psql", Mode: "AccessExclusiveLock on backfill.chunks", Query: "SELECT pg_sleep(60)"},
			`pid 7 (application_name "psql", holding AccessExclusiveLock on backfill.chunks, query "SELECT pg_sleep(60)")`},
		{backfilltype.Blocker{PID: 8, ApplicationName: "psql", State: "active", WaitEvent: "PgSleep", Mode: "ShareLock", Query: "q"},
			`pid 8 (application_name "psql", active, waiting on PgSleep, holding ShareLock, query "q")`},
		{backfilltype.Blocker{PID: 9, State: "idle in transaction", Query: ""},
			`pid 9 (application_name "", idle in transaction, query "")`},
	} {
		got := DescribeBlockers([]backfilltype.Blocker{tc.b})
		if got != tc.want {
			t.Errorf("DescribeBlockers(%+v)\n got %s\nwant %s", tc.b, got, tc.want)
		}
		if strings.Contains(got, ", ,") || strings.Contains(got, "(,") {
			t.Errorf("empty field in %s", got)
		}
	}
}
