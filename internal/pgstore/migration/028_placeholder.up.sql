-- Placeholder so that this branch's migration 031 has no gap; the migration 028 of another branch replaces it.
SELECT 1;
