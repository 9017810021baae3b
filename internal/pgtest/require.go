package pgtest

import (
	"os"
	"strconv"
	"testing"
)

// What the tests need from the machine beyond Go, by the name of the
// environment variable BACKFILL_REQUIRE_<name> that makes their absence
// a failure rather than a skip.
const (
	// Postgres: PostgreSQL's server binaries (initdb, postgres), for the
	// throwaway server, unless DATABASE_URL names one.
	Postgres = "POSTGRES"
	// PgBouncer: the pooler of [NewPoolerURL].
	PgBouncer = "PGBOUNCER"
	// Chromium: the browser of contrib/report's browser test.
	Chromium = "CHROMIUM"
)

// Required reports whether the tests must fail when component (one of
// [Postgres], [PgBouncer], [Chromium]) is missing, rather than skip what
// needs it: BACKFILL_REQUIRE_<component> is true, or CI is (.ci/run sets
// the former for each component it installs, so that CI never skips a
// test silently).
func Required(component string) bool {
	if inCI() {
		return true
	}
	v, _ := strconv.ParseBool(os.Getenv("BACKFILL_REQUIRE_" + component))
	return v
}

// Missing skips t, saying what is missing (why) and how to install it,
// or fails it when the component is [Required].
func Missing(t testing.TB, component, why string) {
	t.Helper()
	if Required(component) {
		t.Fatalf("%s (BACKFILL_REQUIRE_%s or CI is set: a failure, not a skip)", why, component)
	}
	t.Skipf("SKIP: %s (set BACKFILL_REQUIRE_%s=1 to make this a failure)", why, component)
}
