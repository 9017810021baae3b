package pgstore

import (
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/backfilltype"
)

// TestETABasisScaledToOneChunk: an ETA scaled down by a concurrency knob
// of 1 says "1 chunk at once", in the singular.
func TestETABasisScaledToOneChunk(t *testing.T) {
	m := NewManifest("")
	rate, rows, busy := 100.0, 1000.0, 20.0
	for _, c := range []struct {
		knob float64
		want string
	}{{1, "scaled to 1 chunk at once"}, {2, "scaled to 2 chunks at once"}} {
		s := backfilltype.Status{BatchID: 1, Status: backfilltype.RunRunning, Liveness: LivenessRunning, LiveWorkers: 1}
		r := statusRow{RecentRate: &rate, RemainingRows: &rows, RemainingChunks: 10, WindowWorking: 5}
		m.applyETA(&s, r, etaInputs{Busy: &busy, knobs: map[string]float64{KnobConcurrency: c.knob}})
		if !strings.Contains(s.ETABasis, c.want) {
			t.Errorf("basis %q, want it to contain %q", s.ETABasis, c.want)
		}
	}
}
