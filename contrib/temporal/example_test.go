package backfilltemporal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/pgbackfill/backfill"
	backfilltemporal "github.com/pgbackfill/backfill/contrib/temporal"
)

// orderParams are the parameters of the example's job, carried in the
// workflow's input.
type orderParams struct {
	From, To string // dates, 2006-01-02
}

// ordersJob builds the job on the workers from the workflow's input.
func ordersJob(_ context.Context, in backfilltemporal.Input) (backfill.Job, error) {
	var p orderParams
	if err := json.Unmarshal(in.Params, &p); err != nil {
		return backfill.Job{}, err
	}
	from, err := time.Parse(time.DateOnly, p.From)
	if err != nil {
		return backfill.Job{}, err
	}
	to, err := time.Parse(time.DateOnly, p.To)
	if err != nil {
		return backfill.Job{}, err
	}
	return backfill.Job{
		Name:    in.Job,
		Chunker: backfill.Days(from, to, time.UTC),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			// Read the source's orders of [c.Start, c.End) and write them.
			return w.Write(ctx, "A-"+c.Start.Format("20060102"), "9.90")
		}),
		Target: backfill.Target{Table: "orders", Key: []string{"order_no"}, Columns: []string{"order_no", "amount"}},
	}, nil
}

// A worker process and a client of the Temporal service: the worker runs
// the workflow and its activities (start as many as you like, on any
// hosts), the client starts a run of the job with 2 worker slots, pauses
// and resumes it, reads its status and waits for its result. The
// functions run against a Temporal service (TEMPORAL_ADDRESS) and
// PostgreSQL (DATABASE_URL); without them the example says so.
func Example() {
	ctx := context.Background()
	if os.Getenv("TEMPORAL_ADDRESS") == "" || os.Getenv("DATABASE_URL") == "" {
		fmt.Println("set TEMPORAL_ADDRESS and DATABASE_URL to run it")
		return
	}
	c, err := client.Dial(client.Options{HostPort: os.Getenv("TEMPORAL_ADDRESS")})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The worker side.
	db, err := sqlx.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	acts := &backfilltemporal.Activities{DB: db, Config: backfill.Config{Concurrency: 2}, Job: ordersJob}
	w := worker.New(c, "backfill", worker.Options{})
	acts.Register(w)
	if err := w.Start(); err != nil {
		log.Fatal(err)
	}
	defer w.Stop()

	// The client side.
	params, _ := json.Marshal(orderParams{From: "2024-01-01", To: "2024-02-01"})
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "backfill-orders-2024-01", TaskQueue: "backfill"},
		backfilltemporal.WorkflowName, backfilltemporal.Input{Job: "orders-2024-01", Params: params, Workers: 2})
	if err != nil {
		log.Fatal(err)
	}
	// A signal sent before the first slot created the run is refused
	// (run not found), as the status query's Controls then say.
	pause := backfilltemporal.ControlRequest{Actor: "alice", Reason: "month-end close"}
	if err := c.SignalWorkflow(ctx, run.GetID(), "", backfilltemporal.SignalPause, pause); err != nil {
		log.Fatal(err)
	}
	resume := backfilltemporal.ControlRequest{Actor: "alice", Reason: "close done"}
	if err := c.SignalWorkflow(ctx, run.GetID(), "", backfilltemporal.SignalResume, resume); err != nil {
		log.Fatal(err)
	}
	if v, err := c.QueryWorkflow(ctx, run.GetID(), "", backfilltemporal.QueryStatus); err == nil {
		var st backfilltemporal.WorkflowStatus
		if v.Get(&st) == nil && st.Progress != nil {
			fmt.Println("run", st.Progress.BatchID, st.Progress.Status)
		}
	}
	var res backfilltemporal.Result
	err = run.Get(ctx, &res)
	var ae *temporal.ApplicationError
	switch {
	case errors.As(err, &ae) && ae.Type() == backfilltemporal.ErrTypeFailed:
		fmt.Println("the run failed:", ae.Error())
	case err != nil:
		fmt.Println(err)
	default:
		fmt.Printf("run %d %s: %d rows read\n", res.Progress.BatchID, res.Progress.Status, res.Progress.Rows.Read)
	}
}
