package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestCLIReport: report writes the run's self-contained HTML file
// (--html), its JSON twin (--json) and a summary, from the manifest.
func TestCLIReport(t *testing.T) {
	t.Parallel()
	u, _, b1, _ := loadFares(t)

	var rep backfill.RunReport
	cliJSON(t, u, &rep, "report", "--batch", fmt.Sprint(b1))
	require.Equal(t, b1, rep.Plan.BatchID)
	require.Equal(t, "fares", rep.Plan.Job)
	require.EqualValues(t, 3005, rep.Totals.Rows.Read)
	chunks := 0
	for _, b := range rep.Buckets.Buckets {
		chunks += b.Chunks
	}
	require.Equal(t, 3, chunks, "every chunk in the buckets")
	require.NotEmpty(t, rep.Events)

	path := filepath.Join(t.TempDir(), "fares.html")
	out := cliOK(t, u, "report", "--batch", fmt.Sprint(b1), "--html", path)
	require.Contains(t, out, "written to "+path)
	html, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(html), "<svg")
	require.Contains(t, string(html), "fares")
	for _, ref := range []string{`src="http`, `href="http`, `url(http`} {
		require.NotContains(t, string(html), ref, "the report fetches something")
	}

	sum := cliOK(t, u, "report", "--batch", fmt.Sprint(b1))
	require.Contains(t, sum, "fares batch")
	require.Contains(t, sum, "read 3,005")
	require.Contains(t, sum, "--html report.html")

	code, _, errOut := cli(t, u, "report", "--batch", fmt.Sprint(b1), "--html", filepath.Join(t.TempDir(), "no", "such", "dir", "r.html"))
	require.Equal(t, exitUsage, code)
	require.True(t, strings.Contains(errOut, "--html"), errOut)
}
