package backfill_test

import (
	"context"
	"fmt"

	"github.com/pgbackfill/backfill"
)

// priceSource is a source of prices whose chunks say their version
// without being extracted (backfill.ChunkVersioner): here an edit
// counter per chunk of 100 skus (it only grows); over a PostgreSQL
// source, a count(*) and a sum of hashes of each row's key and xmin.
type priceSource struct {
	price     map[int64]string
	edits     map[int64]int // chunk (sku / 100) -> edits
	extracted int
}

func (s *priceSource) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	s.extracted++
	for sku := c.Lo; sku < c.Hi; sku++ {
		p, ok := s.price[sku]
		if !ok {
			p = fmt.Sprintf("%d.99", sku)
		}
		if err := w.Write(ctx, sku, p); err != nil {
			return err
		}
	}
	return nil
}

func (s *priceSource) ChunkVersion(_ context.Context, c backfill.Chunk) (string, error) {
	return fmt.Sprintf("edits=%d", s.edits[c.Lo/100]), nil
}

// A replay with Job.SkipUnchanged and an extractor that is a
// ChunkVersioner extracts only the chunks whose version changed since
// their last load (or whose target rows another session changed).
func ExampleChunkVersioner() {
	ctx := context.Background()
	db := exampleDB("skip_version")
	defer db.Close()
	db.MustExec(`CREATE TABLE prices (sku bigint PRIMARY KEY, price numeric(10,2) NOT NULL,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	r, err := backfill.New(db, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	src := &priceSource{price: map[int64]string{}, edits: map[int64]int{}}
	job := backfill.Job{
		Name:          "prices",
		Chunker:       backfill.IntRange(0, 400, 100),
		Extractor:     src,
		Target:        backfill.Target{Table: "prices", Key: []string{"sku"}, Columns: []string{"sku", "price"}},
		ChunkColumn:   "sku",
		SkipUnchanged: true,
		NewRun:        true,
	}
	for i, edit := range []func(){nil, nil, func() { src.price[250], src.edits[2] = "1.00", src.edits[2]+1 }} {
		if edit != nil {
			edit()
		}
		src.extracted = 0
		rep, err := r.Run(ctx, job)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("call %d: %d chunks extracted, %d skipped; updated=%d unchanged=%d\n",
			i+1, src.extracted, rep.ChunksSkipped, rep.Counts.Updated, rep.Counts.Unchanged)
	}
	// Output:
	// call 1: 4 chunks extracted, 0 skipped; updated=0 unchanged=0
	// call 2: 0 chunks extracted, 4 skipped; updated=0 unchanged=400
	// call 3: 1 chunks extracted, 3 skipped; updated=1 unchanged=399
}
