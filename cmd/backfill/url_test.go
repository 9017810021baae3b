package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestDatabaseURLChecked: a mistyped scheme is a usage error naming the
// scheme, before any connection; a server without SSL asked for it is
// told to be asked with sslmode=disable.
func TestDatabaseURLChecked(t *testing.T) {
	u := pgtest.NewURL(t)
	typo := "postgress" + strings.TrimPrefix(u, "postgres")
	code, _, stderr := cli(t, typo, "runs")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, `scheme "postgress"`)

	ssl := strings.Replace(u, "sslmode=disable", "sslmode=require", 1)
	require.NotEqual(t, u, ssl, "the test server's URL names sslmode=disable")
	code, _, stderr = cli(t, ssl, "runs")
	require.Equal(t, exitError, code, stderr)
	require.Contains(t, stderr, "SSL is not enabled on the server")
	require.Contains(t, stderr, "add sslmode=disable")
}
