-- Manifest migration 2: the source's high-water mark of a run.
ALTER TABLE {s}.runs ADD COLUMN watermark timestamptz;