-- Manifest migration 10: the evidence of chunk attempts that a failed
-- quality gate rolled back, kept outside them; failed checks an operator
-- accepted.

ALTER TABLE {s}.exceptions ADD COLUMN failed_attempt int;
ALTER TABLE {s}.validations ADD COLUMN failed_attempt int;
ALTER TABLE {s}.validations ADD COLUMN accepted boolean NOT NULL DEFAULT false;
