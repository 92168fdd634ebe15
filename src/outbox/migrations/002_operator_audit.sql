-- Who put a parked row back or skipped it, when and why (`outbox-relay parked retry|skip
-- --reason`; the database role is session_user). Idempotent, like every migration: each column is
-- added only if missing. Nullable without a default: adding them rewrites no row and takes only a
-- brief lock, and producers' inserts and the relay versions before this one are unchanged (they
-- name the columns they write).
--
-- skipped_*: beside skipped_at (when), the row's skip record; it stays in the outbox with them for
-- OUTBOX_RETAIN_SKIPPED_MS.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS skipped_by     text;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS skipped_reason text;
-- who ran the command (--operator, the AWS caller identity or the OS user): the role may be the relay's own
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS skipped_operator text;

-- retried_*: the last time an operator put the row back to pending (a retry resets attempts and
-- last_error, so without these nothing would say it was ever parked). A retried row is then sent:
-- the move to the sent table carries them, so the record outlives the send.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS retried_at     timestamptz;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS retried_by     text;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS retried_reason text;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS retried_operator text;

ALTER TABLE {{sent_table}} ADD COLUMN IF NOT EXISTS retried_at     timestamptz;
ALTER TABLE {{sent_table}} ADD COLUMN IF NOT EXISTS retried_by     text;
ALTER TABLE {{sent_table}} ADD COLUMN IF NOT EXISTS retried_reason text;
ALTER TABLE {{sent_table}} ADD COLUMN IF NOT EXISTS retried_operator text;
