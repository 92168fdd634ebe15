-- The trigger functions get a fixed search_path. Without one they run with the search_path of
-- whoever fires them, and every unqualified name in their bodies is looked up there: the table
-- itself when OUTBOX_TABLE names no schema, and pg_notify, min and the = operator (pg_catalog is
-- searched first only when the path does not name it). A role that inserts or updates rows with a
-- path of its own (its own schema first, or pg_catalog placed after it) would make them update a
-- same-named table, or call a same-named function, of its choosing. The fixed path is pg_catalog
-- first, then the outbox table's own schema, and pg_temp last (named, so that a temporary table of
-- the same name is not searched first). Idempotent: setting the same path again changes nothing.
--
-- The table's schema is known here, where this session's search_path found the table (as 001's
-- statements did), not when the SQL is rendered: hence the dynamic ALTER FUNCTION.
DO $search_path$
DECLARE
  table_schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class c WHERE c.oid = {{table_literal}}::regclass);
BEGIN
  EXECUTE pg_catalog.format('ALTER FUNCTION %s() SET search_path = pg_catalog, %s, pg_temp', {{notify_fn_literal}}, table_schema);
  EXECUTE pg_catalog.format('ALTER FUNCTION %s() SET search_path = pg_catalog, %s, pg_temp', {{unwait_fn_literal}}, table_schema);
END
$search_path$;
