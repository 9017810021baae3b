-- Manifest migration 5: what reports may read: batches that completed.

CREATE VIEW {s}.completed_batches AS
	SELECT batch_id, job_name, finished_at FROM {s}.runs WHERE status = 'completed';
COMMENT ON VIEW {s}.completed_batches IS
	'Batches whose every chunk is done. Reports that must not see partly loaded batches keep rows whose lineage updated_by is NULL or in this view.';
