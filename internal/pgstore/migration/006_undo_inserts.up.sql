-- Manifest migration 6: inserted keys are logged once per statement, as a
-- jsonb array.

ALTER TABLE {s}.undo DROP CONSTRAINT undo_op_check;
ALTER TABLE {s}.undo ADD CONSTRAINT undo_op_check CHECK (op IN ('insert', 'inserts', 'update'));
