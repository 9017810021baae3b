package backfill_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
)

// TestRunExplainsAMistypedURLScheme: a database opened with a mistyped URL
// scheme fails the first use of the manifest with the scheme named and
// what to use, without the password lib/pq's message repeats.
func TestRunExplainsAMistypedURLScheme(t *testing.T) {
	db := sqlx.MustOpen("postgres", "postgress://ann:s3cret@localhost/shop?x")
	defer db.Close()
	r, err := backfill.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := backfill.Job{Name: "j", Chunker: backfill.IntRange(0, 1, 1),
		Target: backfill.Target{Table: "t", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, c.Lo)
		})}
	_, err = r.Run(context.Background(), job)
	if err == nil || !strings.Contains(err.Error(), `scheme "postgress" (a typo?): use postgres:// or postgresql://`) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Run = %v", err)
	}
}
