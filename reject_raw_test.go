package backfill_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

type cycleNode struct {
	Name string
	Next *cycleNode
	Any  any
}

// TestRejectStoresAnyValue: whatever an extractor passes to Reject, or
// writes into a jsonb column, is stored in the exception queue: a map or
// slice that contains itself, a pointer cycle, a value nested deeper than
// jsonb takes, a huge value. Before, fmt and the JSON walk recursed
// forever on the self-referencing map ("fatal error: stack overflow",
// which no recover catches).
func TestRejectStoresAnyValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE docs (id bigint PRIMARY KEY, doc jsonb)`)
	require.NoError(t, err)

	selfMap := map[string]any{"name": "loop"}
	selfMap["self"] = selfMap
	selfSlice := []any{"a", nil}
	selfSlice[1] = selfSlice
	node := &cycleNode{Name: "n"}
	node.Next = node
	viaAny := &cycleNode{Name: "m"}
	viaAny.Any = map[string]any{"back": viaAny, "list": []any{viaAny}}
	deep := any("bottom")
	for range 10_000 {
		deep = []any{deep}
	}
	deepMap := map[string]any{}
	for m, i := deepMap, 0; i < 5000; i++ {
		next := map[string]any{}
		m["k"] = next
		m = next
	}
	huge := make([]any, 200_000)
	for i := range huge {
		huge[i] = i
	}
	hugeMap := map[int]string{}
	for i := range 200_000 {
		hugeMap[i] = "v"
	}
	wideMap := map[string]any{}
	for i := range 100_000 {
		wideMap[strconv.Itoa(i)] = i
	}
	values := []any{selfMap, selfSlice, node, *node, viaAny, deep, deepMap, huge, hugeMap, strings.Repeat("é", 600_000), wideMap}

	r, err := backfill.New(db, &backfill.Config{MaxRejectsPerChunk: -1})
	require.NoError(t, err)
	rep, err := r.Run(ctx, backfill.Job{
		Name: "raw", Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "docs", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for i, v := range values {
				if err := w.Reject(ctx, v, "doc", "odd value"); err != nil {
					return err
				}
				// The same value written into a jsonb column: what JSON
				// cannot encode (a cycle) is queued as the row's raw.
				if err := w.Write(ctx, int64(i), v); err != nil {
					return err
				}
			}
			return w.Write(ctx, int64(-1), map[string]any{"fine": true})
		}),
	})
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.EqualValues(t, 2*len(values)+1, rep.Counts.Read)
	require.EqualValues(t, rep.Counts.Read, rep.Counts.Rejected+rep.Counts.Inserted)
	require.GreaterOrEqual(t, rep.Counts.Rejected, int64(len(values)+2), "every Reject, and at least the cyclic values written")

	ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, int(rep.Counts.Rejected))
	byRow := map[int64]backfill.Exception{}
	for _, e := range ex {
		require.True(t, json.Valid(e.Raw), "row %d", e.Row)
		require.LessOrEqual(t, len(e.Raw), 70<<10, "row %d: raw is capped (jsonb adds spaces)", e.Row)
		require.LessOrEqual(t, len(e.Value), 1100, "row %d: value is capped", e.Row)
		byRow[e.Row] = e
	}
	// Rejected values (odd rows) keep their content up to the cycle.
	var m map[string]any
	require.NoError(t, json.Unmarshal(byRow[1].Raw, &m))
	require.Equal(t, "loop", m["name"])
	require.Equal(t, "<cycle>", m["self"])
	var s []any
	require.NoError(t, json.Unmarshal(byRow[3].Raw, &s))
	require.Equal(t, []any{"a", "<cycle>"}, s)
	for _, row := range []int64{5, 7, 9} {
		var text string
		require.NoError(t, json.Unmarshal(byRow[row].Raw, &text), "row %d: %s", row, byRow[row].Raw)
		require.Contains(t, text, "{", "row %d: stored as its %%v text", row)
	}
	require.Contains(t, string(byRow[11].Raw), "<too deep>")
	require.Contains(t, string(byRow[13].Raw), "<too deep>")
	// The self-referencing map written into the jsonb column is queued
	// with its value shown and the cycle marked.
	w := byRow[2]
	require.Equal(t, "doc", w.Column)
	require.Contains(t, w.Value, "<cycle>")
	require.Contains(t, w.Reason, "json")
}
