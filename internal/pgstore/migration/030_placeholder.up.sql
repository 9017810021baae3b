-- Placeholder for migration 030, numbered by another branch: drop this file when
-- that branch's migration 030 is merged.
SELECT 1;
