-- Retention deletes skipped rows too; without an index of their own, every prune scanned the table
-- for them. Partial: only skipped rows enter it (normally a handful).
CREATE INDEX IF NOT EXISTS {{idx_skipped}} ON {{table}} (skipped_at) WHERE skipped_at IS NOT NULL;
