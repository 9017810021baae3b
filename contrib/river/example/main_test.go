package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/pgbackfill/backfill/backfilltest"
)

func TestMain(m *testing.M) { backfilltest.PostgresMain(m) }

// TestExample runs the example twice on a fresh database: the first run
// loads every chunk through River, the second finds the run complete.
func TestExample(t *testing.T) {
	u := backfilltest.NewPostgresURL(t)
	var out bytes.Buffer
	if err := run(context.Background(), u, &out); err != nil {
		t.Fatal(err)
	}
	want := "run running with 10 chunks: 10 River jobs enqueued\n" +
		"run completed: 10 of 10 chunks done, 10000 rows read, 10000 inserted\n" +
		"River jobs completed: 10\n"
	if out.String() != want {
		t.Errorf("first run printed:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := run(context.Background(), u, &out); err != nil {
		t.Fatal(err)
	}
	want = "run completed with 10 chunks: 0 River jobs enqueued\n" +
		"run completed: 10 of 10 chunks done, 10000 rows read, 10000 inserted\n" +
		"River jobs completed: 10\n"
	if out.String() != want {
		t.Errorf("second run printed:\n%s\nwant:\n%s", out.String(), want)
	}
}
