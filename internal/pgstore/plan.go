package pgstore

import (
	"fmt"
	"strings"

	"github.com/pgbackfill/backfill/backfilltype"
)

func planChangedError(job string, batchID int64, old, cur backfilltype.Plan) error {
	diff := backfilltype.PlanDiff(old, cur)
	if len(diff) == 0 {
		diff = []string{"fingerprint: " + old.Fingerprint + " -> " + cur.Fingerprint}
	}
	return fmt.Errorf("%w: job %q batch %d was planned differently (%s); set Job.NewRun to start a new run", backfilltype.ErrPlanChanged, job, batchID, strings.Join(diff, "; "))
}
