-- Manifest migration 29: the delivered summaries of one chunk, found by
-- its (batch_id, seq). A replay that skips a chunk its base skipped too
-- copies the base's summary (CopyDelivered) instead of reading the
-- chunk's target rows; delivered_owner, led by the owner, cannot find
-- them.

CREATE INDEX delivered_chunk ON {s}.delivered (batch_id, seq);
