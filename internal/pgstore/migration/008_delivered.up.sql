-- Manifest migration 8: rows a chunk delivered unchanged that another batch
-- last wrote, summarised per (chunk, owner batch): how many and the least
-- and greatest identity (JSON of key_columns). A rollback of the owner
-- keeps its hands off them while the chunk stays done (see
-- recordDelivered). A few rows per chunk and owner (one per merge of the
-- chunk: a chunk whose rows the target refused is merged in parts, an open
-- chunk is read again), never one per row.

CREATE TABLE {s}.delivered (
	batch_id    bigint NOT NULL,
	seq         int NOT NULL,
	owner       bigint NOT NULL,
	key_columns text[] NOT NULL,
	lo          jsonb NOT NULL,
	hi          jsonb NOT NULL,
	row_count   bigint NOT NULL
);
CREATE INDEX delivered_owner ON {s}.delivered (owner, batch_id, seq);
