package backfillprom_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	backfillprom "github.com/pgbackfill/backfill/contrib/prometheus"
)

// The tracer's metrics of a run. The Runner runs on the backfilltest
// fakes, so the collector has no manifest to read (nil): only what this
// process observed.
func Example() {
	c := backfillprom.New(nil, nil, backfillprom.Options{})
	m := backfilltest.NewMerger()
	m.AddTable("orders", []string{"order_no"}, "order_no", "amount")
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{
		Manifest: backfilltest.NewManifest(), Merger: m, Tracer: c,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := backfill.Job{
		Name:             "orders",
		Chunker:          backfill.IntRange(0, 20, 10),
		Rollback:         backfill.RollbackNone,
		MaxRunRejectRate: -1,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			for n := ch.Lo; n < ch.Hi; n++ {
				if err := w.Write(ctx, fmt.Sprintf("A-%d", n), "9.90"); err != nil {
					return err
				}
			}
			return w.Reject(ctx, "line 99", "", "unparsable line")
		}),
		Target: backfill.Target{Table: "orders", Key: []string{"order_no"}, Columns: []string{"order_no", "amount"}},
	}
	if _, err := r.Run(context.Background(), job); err != nil {
		fmt.Println(err)
		return
	}
	err = testutil.CollectAndCompare(c, strings.NewReader(`
# HELP backfill_rows_total Rows of the chunks this process committed, by outcome.
# TYPE backfill_rows_total counter
backfill_rows_total{job="orders",outcome="inserted"} 20
backfill_rows_total{job="orders",outcome="read"} 22
backfill_rows_total{job="orders",outcome="rejected"} 2
`), "backfill_rows_total")
	fmt.Println("rows by outcome as expected:", err == nil)
	fmt.Println("chunk duration series:", testutil.CollectAndCount(c, "backfill_chunk_duration_seconds"))
	// Output:
	// rows by outcome as expected: true
	// chunk duration series: 1
}

// Serving the metrics of a worker process: the manifest's (chunks by
// status, run, lag) and its Runner's.
func Example_serve() {
	db, err := sqlx.Open("postgres", "postgres:///app")
	if err != nil {
		panic(err)
	}
	c := backfillprom.New(db, backfill.NewPGManifest(""), backfillprom.Options{Jobs: []string{"orders"}})
	prometheus.MustRegister(c)
	http.Handle("/metrics", promhttp.Handler())
	go func() { _ = http.ListenAndServe(":9090", nil) }()

	r, err := backfill.New(db, &backfill.Config{Tracer: c})
	if err != nil {
		panic(err)
	}
	_ = r // r.Run(ctx, job)
}
