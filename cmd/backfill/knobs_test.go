package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCLISetRefusesAThrottlePairTheWorkersWouldIgnore: "backfill set"
// reports set_knob's refusal of a high watermark below the low one, naming
// both knobs and both values, as a usage error.
func TestCLISetRefusesAThrottlePairTheWorkersWouldIgnore(t *testing.T) {
	t.Parallel()
	u, db, _, b2 := loadFares(t)
	_, err := db.Exec(`UPDATE backfill.runs SET status = 'running', finished_at = NULL WHERE batch_id = $1`, b2)
	require.NoError(t, err)
	cliOK(t, u, "set", "throttle.lag.low=8", "--batch", fmt.Sprint(b2), "--why", "looser", "--actor", "ann")
	code, _, errOut := cli(t, u, "set", "throttle.lag.high=5", "--batch", fmt.Sprint(b2), "--why", "tighter", "--actor", "ann")
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "throttle.lag.low 8 (its knob)")
	require.Contains(t, errOut, "throttle.lag.high 5 (this knob)")
}
