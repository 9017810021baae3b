-- Manifest migration 18: an index of the chunks a claim can take (pending
-- or open) in seq order, which claimQuery and leaseChunk walk from the
-- first and stop at the first claimable row, and an index of the chunks
-- holding a lease, which leaseChunk counts for the job-wide concurrency
-- cap, so that a claim stays flat as done chunks accumulate. Both stay
-- small: a done chunk leaves them, a lease is cleared when its chunk
-- commits. chunks_claimable replaces chunks_pending (status = 'pending'
-- implies its predicate).

CREATE INDEX chunks_claimable ON {s}.chunks (batch_id, seq) WHERE status IN ('pending', 'open');
CREATE INDEX chunks_leased ON {s}.chunks (batch_id) WHERE lease_key IS NOT NULL;
DROP INDEX {s}.chunks_pending;
