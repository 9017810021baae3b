package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestCLIControlAndStatus: status shows a run's progress (human and
// JSON); pause, resume, cancel and set go through the manifest's control
// functions, are refused without --why or for an impossible transition,
// and land in the audit trail with the actor and the reason. A knob set
// on a cancelled run is kept for its resume; a completed run refuses it.
func TestCLIControlAndStatus(t *testing.T) {
	t.Parallel()
	u, db, b1, b2 := loadFares(t)

	var st backfill.Status
	cliJSON(t, u, &st, "status", "--batch", fmt.Sprint(b1))
	require.Equal(t, b1, st.BatchID)
	require.Equal(t, backfill.RunCompleted, st.Status)
	require.Equal(t, 3, st.Chunks.Total)
	require.Equal(t, 3, st.Chunks.Done)
	require.EqualValues(t, 3005, st.Rows.Read)
	out := cliOK(t, u, "status", "fares")
	require.Contains(t, out, "job fares batch")
	require.Contains(t, out, "ETA")

	// A completed run cannot be paused: refused, naming its status.
	code, _, errOut := cli(t, u, "pause", "--batch", fmt.Sprint(b1), "--why", "test")
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "completed")
	code, _, errOut = cli(t, u, "pause", "--batch", fmt.Sprint(b1))
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--why")

	// A running run: pause, resume, set, cancel.
	_, err := db.Exec(`UPDATE backfill.runs SET status = 'running', finished_at = NULL WHERE batch_id = $1`, b2)
	require.NoError(t, err)
	var res controlResult
	cliJSON(t, u, &res, "pause", "--batch", fmt.Sprint(b2), "--why", "replica lag", "--actor", "ann")
	require.Equal(t, backfill.RunPaused, res.Status)
	require.Contains(t, cliOK(t, u, "resume", "--batch", fmt.Sprint(b2), "--why", "lag gone", "--actor", "ann"), "resumed fares batch")
	cliJSON(t, u, &res, "set", "rows_per_second=2000", "--batch", fmt.Sprint(b2), "--why", "peak hours", "--actor", "ann")
	require.Equal(t, "rows_per_second", res.Key)
	code, _, errOut = cli(t, u, "set", "rows_per_second=fast", "--batch", fmt.Sprint(b2), "--why", "x")
	require.NotEqual(t, exitOK, code)
	require.Contains(t, errOut, "fast")
	code, _, errOut = cli(t, u, "set", "nonsense", "--batch", fmt.Sprint(b2), "--why", "x")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "KEY=VALUE")
	cliJSON(t, u, &res, "cancel", "--batch", fmt.Sprint(b2), "--why", "wrong scope", "--actor", "ann")
	require.Equal(t, backfill.RunCancelled, res.Status)

	// A cancelled run keeps a knob for when it is resumed; a completed
	// one refuses it, saying what to do.
	out = cliOK(t, u, "set", "rows_per_second=10", "--batch", fmt.Sprint(b2), "--why", "gentle restart", "--actor", "ann")
	require.Contains(t, out, fmt.Sprintf("the knob is kept and applies once it is resumed (backfill resume --batch %d --why TEXT)", b2))
	cliOK(t, u, "resume", "--batch", fmt.Sprint(b2), "--why", "restart", "--actor", "ann")
	var kept float64
	require.NoError(t, db.Get(&kept, `SELECT value FROM backfill.knobs WHERE batch_id = $1 AND key = 'rows_per_second'`, b2))
	require.Equal(t, 10.0, kept, "the knob survives the resume")
	require.NotContains(t, cliOK(t, u, "set", "rows_per_second=20", "--batch", fmt.Sprint(b2), "--why", "x"), "applies once")
	cliOK(t, u, "cancel", "--batch", fmt.Sprint(b2), "--why", "done", "--actor", "ann")
	code, _, errOut = cli(t, u, "set", "rows_per_second=10", "--batch", fmt.Sprint(b1), "--why", "x")
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "start a new run")

	ev := cliOK(t, u, "events", "--batch", fmt.Sprint(b2))
	for _, want := range []string{"replica lag", "lag gone", "peak hours", "wrong scope"} {
		require.Contains(t, ev, want)
	}
	require.True(t, strings.Count(ev, "ann") >= 4, ev)
}
