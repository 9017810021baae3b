-- Manifest migration 4: the undo log; rolled back chunks.

ALTER TABLE {s}.chunks DROP CONSTRAINT chunks_status_check;
ALTER TABLE {s}.chunks ADD CONSTRAINT chunks_status_check CHECK (status IN ('pending', 'done', 'failed', 'rolled_back'));
CREATE TABLE {s}.undo (
	batch_id bigint NOT NULL,
	seq      int NOT NULL,
	id       bigint GENERATED ALWAYS AS IDENTITY,
	op       text NOT NULL CHECK (op IN ('insert', 'update')),
	key      jsonb NOT NULL,
	before   jsonb,
	PRIMARY KEY (batch_id, seq, id)
);
