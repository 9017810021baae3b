package backfill

import (
	"strings"
	"testing"
)

// TestGateRemediesQuoteTheJob: the commands a reject gate suggests can be
// pasted whatever the job's name.
func TestGateRemediesQuoteTheJob(t *testing.T) {
	ex := &execution{job: Job{Name: "reject gate"}, batchID: 7}
	got := ex.gateRemedies(true)
	if !strings.Contains(got, "backfill resume --job 'reject gate' --why TEXT") {
		t.Fatalf("the resume command does not quote the job name: %s", got)
	}
	ex.job.Name = "flights"
	if got := ex.gateRemedies(false); !strings.Contains(got, "backfill resume --job flights --why TEXT") {
		t.Fatalf("a plain job name is quoted: %s", got)
	}
}
