package backfill

import (
	"context"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
)

type nopStager struct{ n int64 }

func (s *nopStager) Add(ctx context.Context, row int64, values []any) error { s.n++; return nil }
func (s *nopStager) Merge(ctx context.Context) (backfilltype.MergeResult, error) {
	return backfilltype.MergeResult{}, nil
}
func (s *nopStager) Close() error { return nil }

// BenchmarkRowWriter measures the client-side cost of one row: conversion
// and checks of a typical order line, without the database.
func BenchmarkRowWriter(b *testing.B) {
	info := TableInfo{
		Target: Target{Table: "t", Key: []string{"source_system", "order_no", "line_no"}},
		Columns: []Column{
			{Name: "source_system", BaseType: "text", Key: true},
			{Name: "order_no", BaseType: "int8", Key: true},
			{Name: "line_no", BaseType: "int4", Key: true},
			{Name: "product_code", BaseType: "varchar", MaxLen: 20},
			{Name: "description", BaseType: "text"},
			{Name: "quantity", BaseType: "int4"},
			{Name: "unit_price", BaseType: "numeric", Type: "numeric(12,2)", Precision: 12, Scale: 2},
			{Name: "ordered_at", BaseType: "timestamptz"},
			{Name: "is_returned", BaseType: "bool"},
		},
		Written: 9,
	}
	c := Chunk{ID: "int:0/1", Kind: backfilltype.KindInt, Hi: 1}
	w := newRowWriter(c, Job{}, info, &nopStager{}, 0, time.Now())
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := w.Write(ctx, "erp", int64(i), 3, "SKU-12345", "a description of the product", int64(7), "1234.56", at, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRowWriterTimeText measures rows of dates and times written as
// text and as time.Time, the forms of the date and time columns.
func BenchmarkRowWriterTimeText(b *testing.B) {
	info := TableInfo{
		Target: Target{Table: "t", Key: []string{"id"}},
		Columns: []Column{
			{Name: "id", BaseType: "int8", Key: true},
			{Name: "d", BaseType: "date"},
			{Name: "ts", BaseType: "timestamp"},
			{Name: "tz", BaseType: "timestamptz"},
			{Name: "d2", BaseType: "date"},
			{Name: "ts2", BaseType: "timestamp"},
		},
		Written: 6,
	}
	c := Chunk{ID: "int:0/1", Kind: backfilltype.KindInt, Hi: 1}
	w := newRowWriter(c, Job{}, info, &nopStager{}, 0, time.Now())
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := w.Write(ctx, int64(i), "2024-01-02", "2024-01-02 03:04:05.123456", "2024-01-02T03:04:05.123456+01:00", at, at); err != nil {
			b.Fatal(err)
		}
	}
}
