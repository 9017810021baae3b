-- Placeholder for migration 028, numbered by another branch: drop this file when
-- that branch's migration 028 is merged.
SELECT 1;
