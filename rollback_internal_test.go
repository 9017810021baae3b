package backfill

import (
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// rollbackStatements builds every rollback statement of a golden case:
// for the whole batch and for one chunk of a time plan on the version
// column.
func rollbackStatements(t *testing.T, g goldenTarget) [][2]string {
	info := goldenInfo(t, g)
	rb := pgstore.NewPGRollback(&PGManifest{SchemaName: "backfill"}, info)
	for _, c := range info.Columns {
		rb.Columns = append(rb.Columns, c.Name)
	}
	if info.Target.Mode == History {
		rb.Columns = append(rb.Columns, info.Target.ValidTo)
	}
	rb.ChunkColumn, rb.Zone = "version", "Europe/Berlin"
	rb.KeyTypes = map[string]string{}
	for _, c := range info.Columns {
		rb.KeyTypes[c.Name] = c.Type
	}
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	chunk := &backfilltype.ChunkState{Chunk: Chunk{ID: "2024-03-01", Seq: 3, Kind: backfilltype.KindTime, Start: start, End: start.AddDate(0, 0, 1)}}
	whole, _ := rb.InsertedFilter(nil, 4)
	one, _ := rb.InsertedFilter(chunk, 4)
	out := [][2]string{
		{"conflicts: batch", rb.ConflictsSQL(whole)},
		{"conflicts: chunk", rb.ConflictsSQL(one)},
		{"preview: batch", rb.PreviewSQL(whole)},
		{"preview: chunk", rb.PreviewSQL(one)},
		{"restore", rb.RestoreSQL()},
		{"delete logged inserts", rb.DeleteLoggedSQL()},
	}
	whole, _ = rb.InsertedFilter(nil, 3)
	one, _ = rb.InsertedFilter(chunk, 3)
	out = append(out, [][2]string{
		{"delete inserted: batch", rb.DeleteInsertedSQL(whole)},
		{"delete inserted: chunk", rb.DeleteInsertedSQL(one)},
	}...)
	if info.Target.Mode == History {
		out = append(out, [][2]string{{"retile", rb.RetileSQL()}, {"check retiled", rb.CheckRetiledSQL()}}...)
	}
	one, _ = rb.InsertedFilter(chunk, 5)
	out = append(out, [][2]string{
		{"delivered: batch", rb.DeliveredSQL(false, "true")},
		{"delivered: chunk", rb.DeliveredSQL(true, one)},
		{"record delivered (merge)", (&pgstore.PGStager{Info: info, Q: pgstore.BuildMergeSQL(info)}).RecordDeliveredSQL()},
	}...)
	return out
}

// TestRollbackSQLGolden pins the SQL of every rollback statement, and of
// the merge's record of unchanged deliveries, per mode with lineage and
// an undo log: testdata/rollback_*.golden.sql.
func TestRollbackSQLGolden(t *testing.T) {
	for _, g := range goldenTargets() {
		if g.target.Lineage.UpdatedBy == "" {
			continue
		}
		t.Run(g.name, func(t *testing.T) {
			checkGolden(t, "rollback_"+g.name, goldenStatements(rollbackStatements(t, g)))
		})
	}
}
