package backfill

import (
	"context"
	"testing"

	"github.com/pgbackfill/backfill/backfilltrace"
)

// TestTraceWithoutTracerCostsNothing: without Config.Tracer the chunk
// path's tracing calls allocate nothing and start no span.
func TestTraceWithoutTracerCostsNothing(t *testing.T) {
	ex := &execution{r: &Runner{}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		var cr chunkRun
		c := ex.traceChunk(ctx, &cr, Chunk{}, cr.res.StartedAt)
		cr.span.next(c, backfilltrace.PhaseExtract)
		cr.span.setRows(1)
		cr.span.release()
		cr.span.end(&cr, nil)
		ex.traceRetry(c, backfilltrace.RetryData{})
		ex.traceThrottle(c, backfilltrace.ThrottleData{})
		ex.tracePause(c, "", "")
		if cr.span != nil || c != ctx {
			t.Fatal("a span without a tracer")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per chunk without a tracer, want 0", allocs)
	}
}
