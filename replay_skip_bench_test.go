package backfill

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// BenchmarkSourceFingerprint measures what summing the source fingerprint
// adds to a row of BenchmarkRowWriter (compare the two ns/op).
func BenchmarkSourceFingerprint(b *testing.B) {
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
	fa := &pgstore.FingerprintAdder{Cols: info.Columns[:info.Written], Next: &nopStager{}}
	w := newRowWriter(c, Job{}, info, fa, 0, time.Now())
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := w.Write(ctx, "erp", int64(i), 3, "SKU-12345", "a description of the product", int64(7), "1234.56", at, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTargetFingerprint measures the replay's re-check of a chunk's
// target rows (targetFingerprint) against the replay of the same chunk
// today (Job.NewRun: extract, stage, merge, checkpoint), for a chunk of
// 10,000 order lines in a 200,000-row target with an index on the
// ChunkColumn. ns/op is per chunk.
func BenchmarkTargetFingerprint(b *testing.B) {
	const rows, chunk = 200000, 10000
	ctx := context.Background()
	db := pgtest.New(b)
	db.MustExec(`CREATE TABLE lines (id bigint PRIMARY KEY, source_system text NOT NULL, order_no bigint NOT NULL, line_no int NOT NULL,
		product_code varchar(20) NOT NULL, description text, quantity int NOT NULL, unit_price numeric(12,2) NOT NULL,
		ordered_at timestamptz NOT NULL, is_returned bool NOT NULL)`)
	cols := []string{"id", "source_system", "order_no", "line_no", "product_code", "description", "quantity", "unit_price", "ordered_at", "is_returned"}
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	job := func(lo, hi int64, newRun bool) Job {
		return Job{
			Name: "lines", Chunker: IntRange(lo, hi, chunk), ChunkColumn: "id", NewRun: newRun, Rollback: RollbackNone,
			Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
				for id := c.Lo; id < c.Hi; id++ {
					if err := w.Write(ctx, id, "erp", id/8, int64(id%8), fmt.Sprintf("SKU-%05d", id%100000), "a description of the product",
						id%50, fmt.Sprintf("%d.%02d", id%10000, id%100), at.Add(time.Duration(id)*time.Second), id%17 == 0); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: Target{Table: "lines", Key: []string{"id"}, Columns: cols},
		}
	}
	r, err := New(db, &Config{Concurrency: 1})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := r.Run(ctx, job(0, rows, false)); err != nil {
		b.Fatal(err)
	}
	db.MustExec(`VACUUM ANALYZE lines`)
	var info TableInfo
	if err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		info, err = pgstore.NewMerger().Prepare(ctx, tx, Target{Table: "lines", Key: []string{"id"}, Columns: cols})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	c := Chunk{ID: "int:100000/110000", Kind: backfilltype.KindInt, Lo: 100000, Hi: 110000}
	b.Run("fingerprint", func(b *testing.B) {
		for b.Loop() {
			if err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
				fp, err := pgstore.TargetFingerprint(ctx, tx, info, "id", nil, c)
				if err == nil && fp.Rows != chunk {
					err = fmt.Errorf("%d rows", fp.Rows)
				}
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	// What a merged chunk records (targetFingerprintMerged): the same
	// fingerprint and, in the same statement, the count of target rows
	// that differ from the staged row of their identity or have none (a
	// join to the staging table), with hash and merge joins off as the
	// merge leaves them. Compare with "fingerprint" for the join's cost.
	b.Run("merged-fingerprint", func(b *testing.B) {
		b.StopTimer()
		for range b.N {
			if err := pgstore.InTx(ctx, db, func(tx sqlx.ExtContext) error {
				if _, err := tx.ExecContext(ctx, `SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off;
					CREATE TEMP TABLE bench_stage ON COMMIT DROP AS SELECT * FROM lines WHERE id >= 100000 AND id < 110000`); err != nil {
					return err
				}
				b.StartTimer()
				fp, err := pgstore.TargetFingerprintMerged(ctx, tx, pgstore.TargetFingerprintMergedParams{Info: info, ChunkColumn: "id", Zone: nil, Staging: "bench_stage", Chunk: c})
				b.StopTimer()
				if err == nil && (fp.Rows != chunk || fp.Stray != 0) {
					err = fmt.Errorf("%d rows, %d stray", fp.Rows, fp.Stray)
				}
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The floor of a skipped chunk: the extraction, conversion and
	// source fingerprint of its rows, then the target's re-check, in one
	// transaction; no manifest write.
	b.Run("skip-projection", func(b *testing.B) {
		x := job(c.Lo, c.Hi, true).Extractor
		for b.Loop() {
			fa := &pgstore.FingerprintAdder{Cols: info.Columns[:info.Written], Next: &nopStager{}}
			w := newRowWriter(c, Job{}, info, fa, 0, time.Now())
			if err := x.Extract(ctx, c, w); err != nil {
				b.Fatal(err)
			}
			if err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
				_, err := pgstore.TargetFingerprint(ctx, tx, info, "id", nil, c)
				return err
			}); err != nil {
				b.Fatal(err)
			}
			if fa.Fp.Rows != chunk {
				b.Fatalf("%d rows", fa.Fp.Rows)
			}
		}
	})
	// A run of the chunk with Job.SkipUnchanged (after one that recorded
	// its fingerprints): the skipped chunk with its run's manifest work.
	b.Run("skip", func(b *testing.B) {
		skip := job(c.Lo, c.Hi, true)
		skip.SkipUnchanged = true
		if _, err := r.Run(ctx, skip); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			rep, err := r.Run(ctx, skip)
			if err != nil {
				b.Fatal(err)
			}
			if rep.ChunksSkipped != 1 || rep.Counts.Unchanged != chunk {
				b.Fatalf("skip: %d skipped, %+v", rep.ChunksSkipped, rep.Counts)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		for b.Loop() {
			rep, err := r.Run(ctx, job(c.Lo, c.Hi, true))
			if err != nil {
				b.Fatal(err)
			}
			if rep.Counts.Unchanged != chunk {
				b.Fatalf("replay: %+v", rep.Counts)
			}
		}
	})
}
