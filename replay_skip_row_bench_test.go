package backfill

import (
	"context"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// BenchmarkSkipRow splits the client's per-row cost of a chunk of a job
// with SkipUnchanged (benchload's order line, converted by Write):
// "write" is Write's conversion and checks into a discarding stager,
// "write+spool" adds the spool, "write+fingerprint" the source
// fingerprint, "write+fingerprint+spool" is the skip path's row writer
// (spool cleared every 10,000 rows, a chunk), and "fingerprint" is the
// fingerprint alone of an already converted row.
func BenchmarkSkipRow(b *testing.B) {
	info := benchOrderLineInfo()
	c := Chunk{ID: "int:0/1", Kind: backfilltype.KindInt, Hi: 1}
	at := time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC)
	ctx := context.Background()
	row := func(vals []any, i int) {
		vals[0], vals[1], vals[2], vals[3] = "erp-eu", int64(1_000_000_000+i/8), i%8+1, "SKU-123456-A"
		vals[4], vals[5], vals[6], vals[7], vals[8] = "washer 123 mm, zinc-plated", 7, "1234.56", at.Add(time.Duration(i)*time.Second), i%29 == 0
	}
	run := func(b *testing.B, fingerprint, spooled bool) {
		var add pgstore.RowAdder = &nopStager{}
		sp := &spool{}
		if spooled {
			add = sp
		}
		var fa *pgstore.FingerprintAdder
		if fingerprint {
			fa = &pgstore.FingerprintAdder{Cols: info.Columns[:info.Written], Next: add}
			add = fa
		}
		w := newRowWriter(c, Job{}, info, add, 0, time.Now())
		vals := make([]any, info.Written)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			row(vals, i)
			if err := w.Write(ctx, vals...); err != nil {
				b.Fatal(err)
			}
			if sp.Len() == 10000 {
				_ = sp.Close()
				*sp = spool{}
			}
		}
		_ = sp.Close()
		if fa != nil && fa.Fp.Rows == 0 {
			b.Fatal("no row fingerprinted")
		}
	}
	b.Run("write", func(b *testing.B) { run(b, false, false) })
	b.Run("write+spool", func(b *testing.B) { run(b, false, true) })
	b.Run("write+fingerprint", func(b *testing.B) { run(b, true, false) })
	b.Run("write+fingerprint+spool", func(b *testing.B) { run(b, true, true) })
	b.Run("fingerprint", func(b *testing.B) {
		s := &captureStager{}
		w := newRowWriter(c, Job{}, info, s, 0, time.Now())
		vals := make([]any, info.Written)
		row(vals, 1)
		if err := w.Write(ctx, vals...); err != nil {
			b.Fatal(err)
		}
		var fp pgstore.ChunkFingerprint
		b.ReportAllocs()
		for b.Loop() {
			fp.Add(info.Columns[:info.Written], s.values)
		}
	})
}

// captureStager keeps a copy of the last row added.
type captureStager struct{ values []any }

func (s *captureStager) Add(_ context.Context, _ int64, values []any) error {
	s.values = append(s.values[:0], values...)
	return nil
}

// benchOrderLineInfo is the target of benchload's -skip loads.
func benchOrderLineInfo() TableInfo {
	return TableInfo{
		Target: Target{Table: "t", Key: []string{"source_system", "order_no", "line_no"}},
		Columns: []Column{
			{Name: "source_system", BaseType: "text", Key: true, NotNull: true},
			{Name: "order_no", BaseType: "int8", Key: true, NotNull: true},
			{Name: "line_no", BaseType: "int4", Key: true, NotNull: true},
			{Name: "product_code", BaseType: "varchar", Type: "character varying(20)", MaxLen: 20, NotNull: true},
			{Name: "description", BaseType: "text"},
			{Name: "quantity", BaseType: "int4", NotNull: true},
			{Name: "unit_price", BaseType: "numeric", Type: "numeric(12,2)", Precision: 12, Scale: 2, NotNull: true},
			{Name: "ordered_at", BaseType: "timestamptz", NotNull: true},
			{Name: "is_returned", BaseType: "bool", NotNull: true},
		},
		Written: 9,
	}
}
