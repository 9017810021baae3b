-- Manifest migration 20: the source version (ChunkVersioner,
-- replay_skip_version.go) a chunk's fingerprints were recorded with,
-- written by the chunk's checkpoint statement with them (NULL otherwise).

ALTER TABLE {s}.chunks ADD COLUMN source_version text;
COMMENT ON COLUMN {s}.chunks.source_version IS
	'The extractor''s version of the chunk''s source rows (ChunkVersioner), read before the extraction that source_fingerprint hashes; a replay whose version is equal does not extract the chunk (SkipUnchanged).';
