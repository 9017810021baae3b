-- Manifest migration 9: open chunks (ending after the run's horizon), read
-- again by the next call of the run: runs.calls counts the calls that
-- started or resumed the run, chunks.open_call is the call that left a
-- chunk open.

ALTER TABLE {s}.chunks DROP CONSTRAINT chunks_status_check;
ALTER TABLE {s}.chunks ADD CONSTRAINT chunks_status_check CHECK (status IN ('pending', 'staged', 'done', 'open', 'failed', 'rolled_back'));
ALTER TABLE {s}.chunks ADD COLUMN open_call int;
ALTER TABLE {s}.runs ADD COLUMN calls int NOT NULL DEFAULT 1;
