package backfill

import (
	"context"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
)

// TestRowAllocs counts the allocations of one order line on the
// short-transaction path (issue 15, per-row cost): the row writer's
// conversions box no value that came in the type it is staged in (an
// int64, a string), and the spool keeps the values' interfaces as they
// came, in slabs it takes from a pool (no allocation per row).
// Allocation counts, not times.
func TestRowAllocs(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC)
	ship := time.Date(2024, 1, 5, 0, 0, 0, 0, time.UTC)
	vals := make([]any, 11)
	orderLine(vals, 123456, at, ship)

	sp := &spool{}
	defer sp.Close()
	row := []any{"erp", int64(123456), "SKU-12345", "a description", "1234.56", nil, true}
	if n := testing.AllocsPerRun(200, func() {
		if err := sp.Add(ctx, 1, row); err != nil {
			t.Fatal(err)
		}
		sp.mem = sp.mem[:0] // the row slice only, not the spool's growth
	}); n > 0 {
		t.Errorf("spool.Add allocates %v times per row, want 0 (the rows take their values from pooled slabs)", n)
	}

	s := &copySink{}
	w := newRowWriter(Chunk{ID: "int:0/1", Kind: backfilltype.KindInt, Hi: 1}, Job{}, orderLineInfo(), s, 0, time.Now())
	// Two time columns: their text and its boxing, nothing else.
	if n := testing.AllocsPerRun(200, func() {
		if err := w.Write(ctx, vals...); err != nil {
			t.Fatal(err)
		}
	}); n > 4 {
		t.Errorf("RowWriter.Write allocates %v times per order line, want at most 4", n)
	}
	if s.rows == 0 {
		t.Fatal("no row reached the sink")
	}
}
