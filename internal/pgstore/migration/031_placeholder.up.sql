-- Placeholder for migration 031, numbered by another branch: drop this file when
-- that branch's migration 031 is merged.
SELECT 1;
