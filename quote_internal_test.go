package backfill

import (
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/internal/pgstore"
)

// TestGateRemediesQuoteTheJob: the commands a reject gate suggests can be
// pasted whatever the job's name.
func TestGateRemediesQuoteTheJob(t *testing.T) {
	ex := &execution{r: &Runner{}, job: Job{Name: "reject gate"}, batchID: 7}
	got := ex.gateRemedies(true, 5931)
	if !strings.Contains(got, "backfill resume --job 'reject gate' --why TEXT") {
		t.Fatalf("the resume command does not quote the job name: %s", got)
	}
	if !strings.Contains(got, "resume the run to accept the 5931 rejects so far, after which the gate judges only the rows read after the resume") {
		t.Fatalf("the remedy does not say what a resume accepts: %s", got)
	}
	ex.job.Name = "flights"
	if got := ex.gateRemedies(false, 0); !strings.Contains(got, "backfill resume --job flights --why TEXT") {
		t.Fatalf("a plain job name is quoted: %s", got)
	}
}

// TestResumeHintNamesTheSchema: the commands suggested for a run of a
// manifest in another schema than backfill select that schema, quoted.
func TestResumeHintNamesTheSchema(t *testing.T) {
	r := &Runner{}
	r.caps.control = &pgstore.Manifest{SchemaName: "my ops"}
	got := r.resumeHint(3)
	for _, want := range []string{`SELECT "my ops".resume(3, 'ACTOR', 'WHY')`, "backfill resume --schema 'my ops' --batch 3 --why WHY"} {
		if !strings.Contains(got, want) {
			t.Errorf("%s\ndoes not contain %s", got, want)
		}
	}
	ex := &execution{r: r, job: Job{Name: "j"}, batchID: 3}
	if got := ex.gateRemedies(false, 0); !strings.Contains(got, "backfill exceptions --schema 'my ops' --batch 3") || !strings.Contains(got, "backfill rollback --schema 'my ops' --batch 3") {
		t.Errorf("gate remedies: %s", got)
	}
}
