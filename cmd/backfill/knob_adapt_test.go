package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCLIAdaptiveChunkKnobs: backfill set takes the adaptive chunk knobs
// (chunk_target_ms, chunk_max_rows), kept in the run's knobs, and refuses
// a negative value naming the knob.
func TestCLIAdaptiveChunkKnobs(t *testing.T) {
	t.Parallel()
	u, db, _, b2 := loadFares(t)
	_, err := db.Exec(`UPDATE backfill.runs SET status = 'running', finished_at = NULL WHERE batch_id = $1`, b2)
	require.NoError(t, err)
	var res controlResult
	cliJSON(t, u, &res, "set", "chunk_target_ms=0", "--batch", fmt.Sprint(b2), "--why", "run chunks whole", "--actor", "ann")
	require.Equal(t, "chunk_target_ms", res.Key)
	cliJSON(t, u, &res, "set", "chunk_max_rows=5000", "--batch", fmt.Sprint(b2), "--why", "cap", "--actor", "ann")
	var v float64
	require.NoError(t, db.Get(&v, `SELECT value FROM backfill.knobs WHERE batch_id = $1 AND key = 'chunk_max_rows'`, b2))
	require.Equal(t, 5000.0, v)
	code, _, errOut := cli(t, u, "set", "chunk_max_rows=-1", "--batch", fmt.Sprint(b2), "--why", "x")
	require.NotEqual(t, exitOK, code)
	require.Contains(t, errOut, "chunk_max_rows")
}
