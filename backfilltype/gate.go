package backfilltype

// GateFailure is the evidence of one chunk attempt that a failed quality
// gate rolled back, the argument of
// backfilldriver.ManifestGates.RecordGateFailure.
type GateFailure struct {
	// BatchID is the run (batch) the chunk belongs to.
	BatchID int64
	// ChunkID is the [Chunk.ID] of the chunk whose attempt failed.
	ChunkID string
	// Attempt is the 1-based number of the failed attempt of the chunk;
	// the results and exceptions are marked with it
	// ([Validation.FailedAttempt], [Exception.FailedAttempt]).
	Attempt int
	// Results are the results of every check the gate ran on the
	// attempt, failed or not.
	Results []CheckResult
	// Exceptions are the rows the attempt rejected (at write and at
	// merge time), kept outside the exception queue of loaded chunks.
	Exceptions []Exception
	// Reason says why the gate failed, e.g. "c: expected 0, got 2"; it
	// becomes the chunk's last error (after "quality gate failed: ") and
	// the run's pause reason (after "chunk <ChunkID>: ").
	Reason string
}
