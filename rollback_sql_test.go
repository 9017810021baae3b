package backfill

import (
	"testing"
	"time"
)

// rollbackStatements builds every rollback statement of a golden case:
// for the whole batch and for one chunk of a time plan on the version
// column.
func rollbackStatements(t *testing.T, g goldenTarget) [][2]string {
	info := goldenInfo(t, g)
	rb := newPGRollback(&PGManifest{schema: "backfill"}, info)
	for _, c := range info.Columns {
		rb.columns = append(rb.columns, c.Name)
	}
	if info.Target.Mode == History {
		rb.columns = append(rb.columns, info.Target.ValidTo)
	}
	rb.chunkColumn, rb.zone = "version", "Europe/Berlin"
	rb.keyTypes = map[string]string{}
	for _, c := range info.Columns {
		rb.keyTypes[c.Name] = c.Type
	}
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	chunk := &ChunkState{Chunk: Chunk{ID: "2024-03-01", Seq: 3, Kind: KindTime, Start: start, End: start.AddDate(0, 0, 1)}}
	whole, _ := rb.insertedFilter(nil, 4)
	one, _ := rb.insertedFilter(chunk, 4)
	out := [][2]string{
		{"conflicts: batch", rb.conflictsSQL(whole)},
		{"conflicts: chunk", rb.conflictsSQL(one)},
		{"preview: batch", rb.previewSQL(whole)},
		{"preview: chunk", rb.previewSQL(one)},
		{"restore", rb.restoreSQL()},
		{"delete logged inserts", rb.deleteLoggedSQL()},
	}
	whole, _ = rb.insertedFilter(nil, 3)
	one, _ = rb.insertedFilter(chunk, 3)
	out = append(out, [][2]string{
		{"delete inserted: batch", rb.deleteInsertedSQL(whole)},
		{"delete inserted: chunk", rb.deleteInsertedSQL(one)},
	}...)
	if info.Target.Mode == History {
		out = append(out, [][2]string{{"retile", rb.retileSQL()}, {"check retiled", rb.checkRetiledSQL()}}...)
	}
	one, _ = rb.insertedFilter(chunk, 5)
	out = append(out, [][2]string{
		{"delivered: batch", rb.deliveredSQL(false, "true")},
		{"delivered: chunk", rb.deliveredSQL(true, one)},
		{"record delivered (merge)", (&pgStager{info: info, q: buildMergeSQL(info)}).recordDeliveredSQL()},
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
