package backfill

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// HandoffOptions configures [Runner.Handoff].
type HandoffOptions struct {
	// Lookback is how far before the backfill's watermark the rescan
	// starts: the overlap with what the backfill already loaded, so that
	// rows committed late by transactions that were in flight at the
	// watermark are picked up. Must be positive.
	Lookback time.Duration
	// Until is the exclusive end of the rescan, where live ingestion takes
	// over; zero means now. Truncated to microseconds.
	Until time.Time
	// Step splits the rescan into chunks of this length; zero means one
	// chunk.
	Step time.Duration
	// Actor names who asked for the handoff, for the audit log.
	Actor string
}

// Handoff prepares the return to live ingestion after a backfill: it
// rescans the half-open interval [watermark - Lookback, Until) of the
// source modification time with the job's own extractor and target, so
// that the business key (and version) remove the duplicates of rows
// already loaded and rows committed late are added. job is the backfill's
// job; its Chunker is replaced by time chunks of the interval in
// [Job.Zone], so its extractor must read by the chunk's time bounds (the
// practical design: extract by source modification time, assign the
// reporting period from event time).
//
// The watermark is the one recorded by the latest completed run of job
// ([Job.Watermark]), or of its latest running run whose only unfinished
// chunks are open ([ChunkOpen]: they end after the watermark, which is
// what the rescan covers); without one Handoff returns [ErrNoWatermark]. The
// rescan runs as its own run, job name job.Name+"/handoff", and a
// "handoff" event with the watermark, interval and rescan's batch ID and
// counts is appended to the backfill's audit log. The Manifest must
// implement [backfilldriver.ManifestAudit] ([ErrUnsupported] otherwise).
func (r *Runner) Handoff(ctx context.Context, job Job, opts HandoffOptions) (Report, error) {
	audit := r.caps.audit
	if audit == nil {
		return Report{}, fmt.Errorf("backfill: handoff of job %q: %w: the manifest has no audit log", job.Name, ErrUnsupported)
	}
	if opts.Lookback <= 0 {
		return Report{}, fmt.Errorf("backfill: handoff of job %q: %w: Lookback must be positive", job.Name, ErrInvalidConfig)
	}
	if err := r.cfg.Manifest.Init(ctx, r.db); err != nil {
		return Report{}, err
	}
	run, err := audit.LatestRun(ctx, r.db, job.Name, RunCompleted, RunRunning)
	if err == nil && run.Status == RunRunning {
		// Loaded up to its open chunks, which end after the watermark.
		var states []backfilltype.ChunkState
		if states, err = r.cfg.Manifest.Chunks(ctx, r.db, run.BatchID); err == nil &&
			slices.ContainsFunc(states, func(s backfilltype.ChunkState) bool { return s.Status != ChunkDone && s.Status != ChunkOpen }) {
			err = ErrRunNotFound
		}
	}
	if errors.Is(err, ErrRunNotFound) {
		return Report{}, fmt.Errorf("backfill: handoff of job %q: %w (no completed run)", job.Name, ErrNoWatermark)
	}
	if err != nil {
		return Report{}, fmt.Errorf("backfill: handoff of job %q: %w", job.Name, err)
	}
	if run.Watermark == nil {
		return Report{}, fmt.Errorf("backfill: handoff of job %q: batch %d: %w", job.Name, run.BatchID, ErrNoWatermark)
	}
	until := pgstore.TruncMicro(opts.Until)
	if until.IsZero() {
		until = pgstore.TruncMicro(time.Now())
	}
	from := run.Watermark.Add(-opts.Lookback)
	step := opts.Step
	if step <= 0 {
		step = until.Sub(from)
	}
	zone := job.Zone
	if zone == nil {
		zone = time.UTC
	}
	rescan := job
	rescan.Name = job.Name + "/handoff"
	rescan.Chunker = Every(from, until, step, zone)
	rescan.Watermark = nil
	rescan.NewRun = true
	rep, runErr := r.Run(ctx, rescan)
	detail, err := json.Marshal(map[string]any{
		"watermark": run.Watermark.In(zone).Format(time.RFC3339Nano), "lookback": opts.Lookback.String(),
		"from": from.In(zone).Format(time.RFC3339Nano), "until": until.In(zone).Format(time.RFC3339Nano),
		"rescan_batch_id": rep.BatchID, "status": rep.Status, "counts": rep.Counts,
	})
	if err != nil {
		return rep, err
	}
	if err := audit.RecordEvent(context.WithoutCancel(ctx), r.db, backfilltype.Event{BatchID: run.BatchID, Job: job.Name, Kind: "handoff",
		Actor: cmp.Or(opts.Actor, r.cfg.WorkerID), Detail: detail}); err != nil {
		return rep, err
	}
	return rep, runErr
}
