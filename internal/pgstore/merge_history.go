package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
)

// openVersionIndexes returns the partial unique indexes of table oid whose
// key columns are exactly key, by name, with their predicate as
// pg_get_expr prints it: on a History target typically
// UNIQUE (key) WHERE valid_to IS NULL, one open version per key.
func openVersionIndexes(ctx context.Context, db sqlx.ExtContext, oid int64, key []string) (map[string]string, error) {
	var idx []struct {
		Name    string         `db:"name"`
		Pred    string         `db:"pred"`
		Columns pq.StringArray `db:"columns"`
	}
	if err := sqlx.SelectContext(ctx, db, &idx, `
		SELECT c.relname AS name, pg_get_expr(i.indpred, i.indrelid) AS pred,
			array_agg(a.attname::text ORDER BY a.attname) AS columns
		FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1])
		WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NOT NULL AND i.indexprs IS NULL
		GROUP BY c.relname, i.indpred, i.indrelid`, oid); err != nil {
		return nil, err
	}
	want := slices.Sorted(slices.Values(key))
	out := map[string]string{}
	for _, x := range idx {
		if slices.Equal([]string(x.Columns), want) {
			out[x.Name] = x.Pred
		}
	}
	return out, nil
}

// openVersionConflict explains a unique violation of a partial unique
// index on the business key of a History target (one open version per
// key), or returns nil for any other error. The merge closes a key's
// versions before it inserts new ones and holds the key's lock, so only
// a writer that does not take the merge's key locks can cause it; the
// error stays retryable (23505), and the retried chunk sees that
// writer's versions.
func (s *PGStager) openVersionConflict(err error) error {
	var pe *pq.Error
	if !errors.As(err, &pe) || pe.Code != "23505" {
		return nil
	}
	pred, ok := s.Info.OpenIndexes[pe.Constraint]
	if !ok {
		return nil
	}
	return fmt.Errorf("%w (unique index %q allows one version per key WHERE %s: another transaction, not a merge of this library, "+
		"added a version of the same key at the same time (%s); retrying the chunk merges after it)", err, pe.Constraint, pred, pe.Detail)
}

// historyRace is the error of a History merge after which the versions of
// keys bad do not tile. The merge recomputed valid_to of every version of
// those keys, and inserted its new versions with the valid_to of the next,
// from what its statements saw: the intervals tile unless versions of the
// keys changed between those statements, committed by a writer that does
// not take the merge's key locks (or a trigger on the target changed
// them). It wraps [backfilltype.ErrHistoryIntervals] and is retryable.
func historyRace(table string, bad []string) error {
	return fmt.Errorf("backfill: merge %s: %w: valid_from/valid_to intervals overlap or leave a gap for keys %v after the merge recomputed them: "+
		"another transaction, not a merge of this library, added or changed versions of these keys during the merge (%w; the chunk is retried), "+
		"or a trigger on the target changed valid_to", table, backfilltype.ErrHistoryIntervals, bad, backfilltype.ErrConcurrentChange)
}
