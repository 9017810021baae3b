-- Manifest migration 33: reserved (no change). Its number belongs to a
-- change made beside this one; this file holds the numbering without a
-- gap until that change replaces it.
SELECT 1;
