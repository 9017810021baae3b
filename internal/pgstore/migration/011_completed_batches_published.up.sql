-- Manifest migration 11: a versioned-view batch is not completed for
-- readers until its view switch is recorded (the "published" event,
-- written in the switch's transaction): a publish blocked by readers
-- leaves it out.

CREATE OR REPLACE VIEW {s}.completed_batches AS
	SELECT r.batch_id, r.job_name, r.finished_at FROM {s}.runs r
	WHERE r.status = 'completed'
		AND (left(coalesce(r.plan->>'publish', ''), 15) <> 'versioned_view:'
			OR EXISTS (SELECT 1 FROM {s}.events e WHERE e.batch_id = r.batch_id AND e.kind = 'published'));
COMMENT ON VIEW {s}.completed_batches IS
	'Batches whose every chunk is done and, for a versioned view, whose view switch is done. Reports that must not see partly loaded batches keep rows whose lineage updated_by is NULL or in this view.';
