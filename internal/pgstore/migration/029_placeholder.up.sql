-- Placeholder for migration 029, numbered by another branch: drop this file when
-- that branch's migration 029 is merged.
SELECT 1;
