package backfill

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/stretchr/testify/require"
)

// goldenScope is the validation scope of a golden case's chunk: a time
// chunk on the version column, staged in the merge's staging table.
func goldenScope(t testing.TB, g goldenTarget, chunkColumn string) ValidationScope {
	t.Helper()
	info := goldenInfo(t, g)
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	return ValidationScope{BatchID: 7, Info: info, Staging: pgstore.BuildMergeSQL(info).Stage, ChunkColumn: chunkColumn, Zone: time.UTC,
		Chunk: Chunk{ID: "2024-03-01", Seq: 3, Kind: backfilltype.KindTime, Start: start, End: start.AddDate(0, 0, 1)}}
}

// withArgs renders a statement followed by its bind parameters.
func withArgs(q string, a pgstore.SQLArgs) string {
	if len(a) == 0 {
		return q
	}
	return fmt.Sprintf("-- args: %v\n%s", []any(a), q)
}

// validateStatements builds every validator statement for scope.
func validateStatements(t *testing.T, scope ValidationScope) [][2]string {
	c, err := pgstore.NewPGCheck("golden", SeverityError, scope)
	require.NoError(t, err)
	var out [][2]string
	add := func(name, q string) { out = append(out, [2]string{name, q}) }

	var a pgstore.SQLArgs
	chunkRows, _, err := c.ChunkRows("c", &a)
	require.NoError(t, err)
	add("duplicate_keys", withArgs(c.DuplicateKeysSQL(scope.Info.Identity(), chunkRows, false), a))
	add("duplicate_keys across target", withArgs(c.DuplicateKeysSQL([]string{"name"}, chunkRows, true), a))

	add("completeness: missing from target", c.MissingFromTargetSQL())
	if wins := c.SourceWins("s", "t"); wins != "false" {
		add("completeness: differing content", c.DifferingContentSQL(wins))
	}
	a = nil
	bounds, err := c.InChunk("t", &a)
	require.NoError(t, err)
	add("completeness: missing from staging", withArgs(c.MissingFromStagingSQL(bounds), a))

	add("referential_integrity", c.OrphansSQL([]string{"name", "k"}, "sales.customers", []string{"name", "code"}))

	a = nil
	v := Aggregates{Day: "version", Dimensions: []string{"name", `Odd "col"`}, Measures: []Measure{{Column: "amount", Tolerance: 0.5}, {Column: "id"}}}
	day, _, err := c.AggregatesDay(v.Day, &a)
	require.NoError(t, err)
	add("aggregates", withArgs(c.AggregatesSQL(day, v.Dimensions, v.Measures, &a), a))
	a = nil
	add("aggregates: zero value", withArgs(c.AggregatesSQL(nil, nil, nil, &a), a))

	a = nil
	add("sample", withArgs(c.SampleSQL(DefaultSampleSize, 42, c.SourceWins("s", "t"), &a), a))

	cols := c.FingerprintColumns()
	add("fingerprint: staged rows", c.FingerprintStagingSQL(cols))
	a = nil
	bounds, err = c.InChunk("t", &a)
	require.NoError(t, err)
	add("fingerprint: chunk's target rows", withArgs(c.FingerprintTargetSQL(cols, bounds), a))
	add("fingerprint: target rows of staged identities", c.FingerprintTargetSQL(cols, ""))
	return out
}

// TestValidateSQLGolden pins the SQL of every validator statement per
// mode and policy: testdata/validate_*.golden.sql.
func TestValidateSQLGolden(t *testing.T) {
	for _, g := range goldenTargets() {
		t.Run(g.name, func(t *testing.T) {
			checkGolden(t, "validate_"+g.name, goldenStatements(validateStatements(t, goldenScope(t, g, "version"))))
		})
	}
}
