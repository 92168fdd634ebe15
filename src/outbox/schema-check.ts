// Whatever the relay lacks would otherwise show only after a batch was published, when its marks
// fail or reach no row: the same batch published again every invocation (G1/G2 hold, but nothing
// moves on). So before the first claim every missing piece is named at once, with the command or
// the GRANT that fixes it, in one DatabaseError that no retry fixes.
import { DatabaseError } from '../errors.ts';
import { loadMigrations, type Migration } from './migrate.ts';

/** A role granted columns rather than tables needs exactly these. */
export const RELAY_COLUMNS = {
  outboxSelect: [
    'id', 'aggregatetype', 'aggregateid', 'type', 'payload', 'topic', 'headers', 'seq', 'created_at', 'sent_at',
    'attempts', 'next_attempt_at', 'parked_at', 'skipped_at', 'waiting',
    'retried_at', 'retried_by', 'retried_reason', 'retried_operator', 'payload_bytes', 'headers_bytes',
  ],
  outboxUpdate: ['attempts', 'last_error', 'next_attempt_at', 'parked_at', 'waiting'],
  sentInsert: [
    'id', 'aggregatetype', 'aggregateid', 'type', 'payload', 'topic', 'headers', 'seq', 'created_at', 'sent_at',
    'attempts', 'retried_at', 'retried_by', 'retried_reason', 'retried_operator',
  ],
} as const;

/**
 * Nothing in it fails for a missing or forbidden object, it answers NULL instead:
 * - to_regclass fails for a schema the role may not use: asked only once USAGE on it is known;
 * - the migrations table can only be named in the statement if it exists and may be read, which is
 *   known only as it runs: query_to_xml runs its SELECT only then, and its XML is read with a
 *   regular expression (xpath needs a server built with libxml).
 */
export function schemaCheckSql(): string {
  const lacking = (rel: string, columns: readonly string[], privilege: string) => `
       CASE WHEN ${rel} IS NOT NULL THEN to_json(ARRAY(
         SELECT a.attname::text FROM pg_attribute a
         WHERE a.attrelid = ${rel} AND a.attnum > 0 AND NOT a.attisdropped
           AND a.attname = ANY (ARRAY[${columns.map((c) => `'${c}'`).join(', ')}]::name[])
           AND NOT has_column_privilege(${rel}, a.attnum, '${privilege}')
         ORDER BY a.attnum)) END`;
  return `
WITH name AS (
  SELECT CASE WHEN cardinality(parse_ident($1)) = 2 THEN (parse_ident($1))[1] END AS schema,
         array_to_string(parse_ident($1), '.') AS target
),
usable AS (
  SELECT n.schema, n.target,
         CASE WHEN n.schema IS NULL THEN true
              ELSE has_schema_privilege((SELECT oid FROM pg_namespace WHERE nspname = n.schema), 'USAGE') END AS schema_usage
  FROM name n
),
-- materialized: inlined, the column checks' lookup by r.outbox ran to_regclass where USAGE is lacking
rel AS MATERIALIZED (
  SELECT u.*,
         CASE WHEN u.schema_usage THEN to_regclass($1) END AS outbox,
         CASE WHEN u.schema_usage THEN to_regclass($2) END AS sent,
         to_regclass('outbox_relay_migrations') AS migrations,
         CASE WHEN u.schema_usage THEN to_regprocedure($4) END AS partitions_fn
  FROM usable u
)
SELECT current_user AS role, quote_ident(current_user) AS role_ident,
       quote_ident(r.schema) AS schema_ident, r.schema_usage,
       r.outbox IS NOT NULL AS outbox_present,
       has_any_column_privilege(r.outbox, 'SELECT') AS outbox_select,
       has_any_column_privilege(r.outbox, 'UPDATE') AS outbox_update,
       has_table_privilege(r.outbox, 'DELETE') AS outbox_delete,
       r.sent IS NOT NULL AS sent_present,
       has_any_column_privilege(r.sent, 'INSERT') AS sent_insert,
       has_any_column_privilege(r.sent, 'SELECT') AS sent_select,
       has_table_privilege(r.sent, 'DELETE') AS sent_delete,
       -- json: the relay's client parses no array type (src/outbox/client.ts)${lacking('r.outbox', RELAY_COLUMNS.outboxSelect, 'SELECT')} AS outbox_select_lacking,${lacking('r.outbox', RELAY_COLUMNS.outboxUpdate, 'UPDATE')} AS outbox_update_lacking,${lacking('r.sent', RELAY_COLUMNS.sentInsert, 'INSERT')} AS sent_insert_lacking,
       -- the columns a CHECK constraint names (the size bound of every column but the payload)
       CASE WHEN r.outbox IS NOT NULL THEN to_json(ARRAY(
         SELECT DISTINCT a.attname::text FROM pg_constraint c
         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
         WHERE c.conrelid = r.outbox AND c.contype = 'c')) END AS checked_columns,
       -- the columns the settings read ($3: OUTBOX_ADDITIONAL_PLACEMENT, OUTBOX_METADATA=trace) that
       -- the table lacks or the role may not read
       CASE WHEN r.outbox IS NOT NULL THEN to_json(ARRAY(
         SELECT c FROM unnest($3::text[]) c WHERE NOT EXISTS (
           SELECT FROM pg_attribute a WHERE a.attrelid = r.outbox AND a.attname = c AND a.attnum > 0
             AND NOT a.attisdropped AND has_column_privilege(r.outbox, a.attnum, 'SELECT')))) END AS unreadable_columns,
       -- migrate's partition maintenance function (partitioned.sql), and whether this role may call it
       r.partitions_fn IS NOT NULL AS partitions_fn,
       has_function_privilege(r.partitions_fn, 'EXECUTE') AS partitions_fn_execute,
       r.migrations::text AS migrations_table,
       has_table_privilege(r.migrations, 'SELECT') AS migrations_readable,
       -- json: the relay's client parses no array type (src/outbox/client.ts)
       CASE WHEN has_table_privilege(r.migrations, 'SELECT') THEN to_json(ARRAY(
         SELECT v[1]::int FROM regexp_matches(
           query_to_xml(format('SELECT version FROM %s WHERE target = %L ORDER BY version', r.migrations, r.target), false, false, '')::text,
           '<version>(\\d+)</version>', 'g') AS v
       )) END AS versions,${shape('r.outbox', 'oc', 'outbox', [['SELECT', 'r'], ['UPDATE', 'w'], ['DELETE', 'd']], 8 | 16)},${shape('r.sent', 'sc', 'sent', [['INSERT', 'a'], ['SELECT', 'r'], ['DELETE', 'd']], 4 | 8)}
FROM rel r
LEFT JOIN pg_class oc ON oc.oid = r.outbox
LEFT JOIN pg_class sc ON sc.oid = r.sent`;
}

// BEFORE ROW triggers can skip the relay's row by returning NULL (tgtype bits: 4 INSERT, 8 DELETE,
// 16 UPDATE); migrate's own triggers are all AFTER (001_baseline.sql).
function shape(rel: string, c: string, prefix: string, commands: Array<[command: string, polcmd: string]>, events: number): string {
  // a policy applies to PUBLIC (0) or a role whose privileges this one has, as Postgres decides it
  const applies = `(p.polroles && ARRAY[0]::oid[] OR EXISTS (SELECT FROM unnest(p.polroles) pr WHERE pg_has_role(pr, 'USAGE')))`;
  const cmds = `unnest(ARRAY[${commands.map(([n]) => `'${n}'`).join(', ')}], ARRAY[${commands.map(([, l]) => `'${l}'`).join(', ')}]) WITH ORDINALITY AS n(cmd, polcmd, i)`;
  const restrictive = `SELECT FROM pg_policy p WHERE p.polrelid = ${rel} AND NOT p.polpermissive AND p.polcmd::text IN ('*', n.polcmd) AND ${applies}`;
  // USING (true) for what the command reads; WITH CHECK, or USING in its place, (true) for what it writes
  const open = `SELECT FROM pg_policy p WHERE p.polrelid = ${rel} AND p.polpermissive AND p.polcmd::text IN ('*', n.polcmd) AND ${applies}
             AND (n.cmd = 'INSERT' OR pg_get_expr(p.polqual, p.polrelid) = 'true')
             AND (n.cmd NOT IN ('INSERT', 'UPDATE') OR coalesce(pg_get_expr(p.polwithcheck, p.polrelid), pg_get_expr(p.polqual, p.polrelid)) = 'true')`;
  return `
       ${c}.relkind::text AS ${prefix}_kind, ${c}.relpersistence::text AS ${prefix}_persistence, ${c}.relispartition AS ${prefix}_is_partition,
       CASE WHEN ${rel} IS NOT NULL THEN to_json(ARRAY(SELECT i.inhrelid::regclass::text FROM pg_inherits i WHERE i.inhparent = ${rel} ORDER BY 1)) END AS ${prefix}_children,
       CASE WHEN ${rel} IS NOT NULL THEN to_json(ARRAY(SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = ${rel} ORDER BY i.inhseqno)) END AS ${prefix}_parents,
       -- row_security_active: RLS on, and the role neither superuser, BYPASSRLS, nor the owner (unless FORCE)
       CASE WHEN ${rel} IS NOT NULL AND row_security_active(${rel}) THEN to_json(ARRAY(
         SELECT n.cmd FROM ${cmds}
         WHERE NOT EXISTS (${open}) OR EXISTS (${restrictive})
         ORDER BY n.i)) END AS ${prefix}_rls_blocked,
       CASE WHEN ${rel} IS NOT NULL AND row_security_active(${rel}) THEN to_json(ARRAY(
         SELECT DISTINCT quote_ident(p.polname) FROM pg_policy p, ${cmds}
         WHERE p.polrelid = ${rel} AND NOT p.polpermissive AND p.polcmd::text IN ('*', n.polcmd) AND ${applies})) END AS ${prefix}_rls_restrictive,
       CASE WHEN ${rel} IS NOT NULL THEN to_json(ARRAY(
         SELECT json_build_object('name', quote_ident(t.tgname), 'events', concat_ws(' OR ',
                  CASE WHEN t.tgtype::int & ${events} & 4 <> 0 THEN 'INSERT' END,
                  CASE WHEN t.tgtype::int & ${events} & 16 <> 0 THEN 'UPDATE' END,
                  CASE WHEN t.tgtype::int & ${events} & 8 <> 0 THEN 'DELETE' END))
         FROM pg_trigger t
         WHERE t.tgrelid = ${rel} AND NOT t.tgisinternal AND t.tgenabled <> 'D'
           AND t.tgtype::int & 3 = 3 AND t.tgtype::int & ${events} <> 0
         ORDER BY t.tgname)) END AS ${prefix}_triggers,
       -- rules on the same events (ev_type 2 UPDATE, 3 INSERT, 4 DELETE): a rule rewrites the statement
       CASE WHEN ${rel} IS NOT NULL THEN to_json(ARRAY(
         SELECT quote_ident(w.rulename) FROM pg_rewrite w
         WHERE w.ev_class = ${rel} AND w.ev_enabled <> 'D'
           AND w.ev_type::text = ANY (ARRAY[${[[16, '2'], [4, '3'], [8, '4']].filter(([bit]) => (events & (bit as number)) !== 0).map(([, t]) => `'${t}'`).join(', ')}])
         ORDER BY 1)) END AS ${prefix}_rules`;
}

/** Restated from store.ts, which imports this module. */
export type CheckedMode = 'keep' | 'delete';

/** NULL privileges: that table is missing (or its schema may not be used). */
interface SchemaFactsBase {
  role: string;
  role_ident: string;
  schema_ident: string | null;
  /** true also when no schema is named; null when the schema does not exist */
  schema_usage: boolean | null;
  outbox_present: boolean;
  outbox_select: boolean | null;
  outbox_update: boolean | null;
  outbox_delete: boolean | null;
  sent_present: boolean;
  sent_insert: boolean | null;
  sent_select: boolean | null;
  sent_delete: boolean | null;
  outbox_select_lacking: string[] | null;
  outbox_update_lacking: string[] | null;
  sent_insert_lacking: string[] | null;
  checked_columns: string[] | null;
  unreadable_columns: string[] | null;
  /** absent in rows built by hand */
  partitions_fn?: boolean;
  partitions_fn_execute?: boolean | null;
  migrations_table: string | null;
  migrations_readable: boolean | null;
  /** null when the migrations table could not be read */
  versions: number[] | null;
}

export type SchemaFacts = SchemaFactsBase & Prefixed<'outbox'> & Prefixed<'sent'>;
type Prefixed<P extends string> = { [K in keyof TableShape as `${P}_${K}`]: TableShape[K] | null };

export interface TableShape {
  /** 'p' partitioned is accepted here: its marks by ctid are another matter */
  kind: string;
  persistence: string;
  is_partition: boolean;
  /** a partitioned table's partitions too */
  children: string[];
  parents: string[];
  rls_blocked: string[];
  rls_restrictive: string[];
  triggers: Array<{ name: string; events: string }>;
  /** a DO INSTEAD rule skips or redirects the relay's statement */
  rules: string[];
}

export interface SchemaNeeds {
  table: string;
  sentTable: string;
  sentRows: CheckedMode;
  migrations: ReadonlyArray<Pick<Migration, 'version' | 'name'>>;
}

const MIGRATE = '`outbox-relay migrate`';

/** The payload is bounded by the claim's byte cut instead (docs/schema.md, "Every column bounded"). */
export const SIZE_CHECKED_COLUMNS = ['aggregatetype', 'aggregateid', 'type', 'topic', 'headers_bytes', 'tracingspancontext'] as const;

function outboxNeeds(mode: CheckedMode): Array<[privilege: string, why: string]> {
  const needs: Array<[string, string]> = [
    ['SELECT', 'claims read the pending rows'],
    ['UPDATE', 'claims lock rows FOR UPDATE, and failed attempts, backoff, parking and the waiting marks are UPDATEs'],
  ];
  if (mode === 'keep') needs.push(['DELETE', 'a sent row is moved out of it: without DELETE the relay would publish the same batch again on every invocation']);
  if (mode === 'delete') needs.push(['DELETE', 'a sent row is deleted from it: without DELETE the relay would publish the same batch again on every invocation']);
  return needs;
}

/** Pure: the unit tests feed it rows. */
export function schemaProblems(f: SchemaFacts, needs: SchemaNeeds): string[] {
  const { table, sentTable } = needs;
  const problems: string[] = [];
  if (f.schema_usage === false) {
    // the tables cannot even be looked up; the migrations table can
    problems.push(`the database role ${f.role} may not use the schema ${f.schema_ident} of the outbox table ${table}: GRANT USAGE ON SCHEMA ${f.schema_ident} TO ${f.role_ident}`);
  } else if (!f.outbox_present) {
    // nothing else about it means anything; this says what to do
    return [`the outbox table ${table} does not exist${f.schema_ident ? '' : " (on the database role's search_path)"}: run ${MIGRATE} (it creates the table), or check OUTBOX_TABLE`];
  }

  const missing = migrationProblems(f, needs, problems);
  if (f.outbox_present) outboxShapeProblems(f, needs, problems);

  // a view's or a foreign table's constraints bound nothing: the kind is the problem there
  if (f.outbox_present && f.checked_columns && isTable(f.outbox_kind)) {
    const unbounded = SIZE_CHECKED_COLUMNS.filter((c) => !f.checked_columns!.includes(c));
    if (unbounded.length) {
      problems.push(
        `the outbox table ${table} bounds no size of ${list(unbounded, 'and')} (no CHECK constraint names ${unbounded.length === 1 ? 'it' : 'them'}): ` +
          'one large row could take the relay past its memory. Add the size check of docs/schema.md ("Every column bounded"), as `outbox-relay migrate` creates it',
      );
    }
  }

  if (f.outbox_present && f.unreadable_columns?.length) {
    const cols = f.unreadable_columns;
    problems.push(
      `the outbox table ${table} has no column ${list(cols, 'or')} that the role ${f.role} may read, and the settings read ${cols.length === 1 ? 'it' : 'them'} ` +
        '(OUTBOX_ADDITIONAL_PLACEMENT places a column, OUTBOX_METADATA=trace reads tracingspancontext): correct the setting, add the column to the table, ' +
        `or GRANT SELECT (${cols.join(', ')}) ON ${table} TO ${f.role_ident}`,
    );
  }

  if (f.outbox_present) {
    const lacking = outboxNeeds(needs.sentRows).filter(([p]) => !privilege(f, p));
    if (lacking.length) {
      const privileges = lacking.map(([p]) => p);
      problems.push(
        `the database role ${f.role} lacks ${list(privileges, 'and')} on the outbox table ${table} (${lacking.map(([p, why]) => `${p}: ${why}`).join('; ')}): ` +
          `GRANT ${privileges.join(', ')} ON ${table} TO ${f.role_ident}`,
      );
    }
    // granted on some columns only: has_any_column_privilege passes, the statement that needs the others fails
    for (const [p, why] of outboxNeeds(needs.sentRows)) {
      const columns = p === 'SELECT' ? f.outbox_select_lacking : p === 'UPDATE' ? f.outbox_update_lacking : null;
      if (privilege(f, p) && columns?.length) problems.push(columnProblem(f, p, columns, `the outbox table ${table}`, why, table));
    }
  }

  if (needs.sentRows === 'keep' && f.schema_usage !== false) {
    if (!f.sent_present) {
      // a missing migration already says what brings it back
      if (!missing) problems.push(`the sent table ${sentTable} does not exist: this version of the relay moves sent rows there. Run ${MIGRATE} (idempotent) before the relay, or set OUTBOX_SENT_ROWS=delete to keep no sent rows`);
    } else if (!isTable(f.sent_kind)) {
      problems.push(
        `the sent table ${sentTable} is ${KINDS[f.sent_kind ?? ''] ?? `a relation of kind ${f.sent_kind}`}, not a table: acked rows are moved into it and retention deletes them by address (tableoid, ctid). ` +
          `Make it a table (rename this one and run ${MIGRATE}, which creates it), or set OUTBOX_SENT_ROWS=delete to keep no sent rows`,
      );
    } else if (f.sent_insert && f.sent_insert_lacking?.length) {
      problems.push(columnProblem(f, 'INSERT', f.sent_insert_lacking, `the sent table ${sentTable}`, 'acked rows are moved there, every column', sentTable));
    } else if (!f.sent_insert) {
      // Retention's SELECT and DELETE alone missing are not refused: only the sent table grows, which
      // retention's warning says every invocation; stopping the relay would trade that for an outage.
      // Named here with INSERT, since a GRANT is being run anyway.
      const retention = [f.sent_select ? undefined : 'SELECT', f.sent_delete ? undefined : 'DELETE'].filter((p): p is string => p !== undefined);
      const privileges = ['SELECT', 'INSERT', 'DELETE'].filter((p) => p === 'INSERT' || retention.includes(p));
      problems.push(
        `the database role ${f.role} may not INSERT into the sent table ${sentTable}, where acked rows are moved: GRANT ${privileges.join(', ')} ON ${sentTable} TO ${f.role_ident}` +
          (retention.length ? ` (${retention.join(' and ')} for retention)` : ''),
      );
    }
  }
  if (needs.sentRows === 'keep' && f.sent_present && isTable(f.sent_kind)) sentShapeProblems(f, needs, problems);
  return problems;
}

export function schemaWarnings(f: SchemaFacts, needs: Pick<SchemaNeeds, 'table'> & { partitionsFn?: string }): string[] {
  const warnings: string[] = [];
  if (f.outbox_persistence === 'u') {
    warnings.push(
      `the outbox table ${needs.table} is UNLOGGED: a crash of the database empties it, with every row not yet relayed (nor is it on a replica, so a failover loses them too). ` +
        `ALTER TABLE ${needs.table} SET LOGGED`,
    );
  }
  if (f.partitions_fn && f.partitions_fn_execute === false) {
    warnings.push(
      `the outbox table ${needs.table} is partitioned by \`outbox-relay migrate\`, and the database role ${f.role} may not EXECUTE its partition maintenance function: ` +
        'the relay makes no partition ahead (rows go to the DEFAULT partition once those made by migrate have passed) and prunes the sent table row by row instead of dropping its old partitions. ' +
        `GRANT EXECUTE ON FUNCTION ${needs.partitionsFn ?? 'the maintenance function'} TO ${f.role_ident} (docs/schema.md, "Partitioned outboxes")`,
    );
  }
  return warnings;
}

const KINDS: Record<string, string> = {
  v: 'a view', m: 'a materialized view', f: 'a foreign table', S: 'a sequence', c: 'a composite type', i: 'an index', I: 'a partitioned index', t: 'a TOAST table',
};

function isTable(kind: string | null): boolean {
  return kind === null || kind === 'r' || kind === 'p';
}

const RLS_WHY: Record<'outbox' | 'sent', Record<string, string>> = {
  outbox: {
    SELECT: 'claims see only the rows it lets through: the others stay pending forever',
    UPDATE: 'claims lock rows FOR UPDATE, which sees only the rows an UPDATE policy lets through: the others stay pending forever, and failed attempts go unrecorded',
    DELETE: 'a mark deletes only the rows a DELETE policy lets through: the others are published again on every invocation',
  },
  sent: {
    INSERT: 'the move of acked rows fails, and the batch is published again on every invocation',
    SELECT: 'retention sees only the rows it lets through',
    DELETE: 'retention deletes only the rows a DELETE policy lets through: the table grows',
  },
};

function outboxShapeProblems(f: SchemaFacts, needs: SchemaNeeds, problems: string[]): void {
  const { table } = needs;
  if (!isTable(f.outbox_kind)) {
    problems.push(
      `the outbox table ${table} is ${KINDS[f.outbox_kind!] ?? `a relation of kind ${f.outbox_kind}`}, not a table: the relay locks its rows, then deletes or moves them by address (tableoid, ctid) ` +
        `in the batch's transaction, which only a table's rows allow. Set OUTBOX_TABLE to the table itself, made by ${MIGRATE}`,
    );
  }
  // a partitioned table's children are its partitions: not refused here
  if (f.outbox_kind !== 'p' && f.outbox_children?.length) {
    const children = f.outbox_children;
    problems.push(
      `the outbox table ${table} has inheritance ${children.length === 1 ? 'child' : 'children'} ${list(children, 'and')}: the relay's claims reach their rows too, ` +
        "which have none of the outbox's indexes, identity, size checks or triggers (each claim reads a child whole, and a child's seqs can repeat the outbox's). " +
        `Detach ${children.length === 1 ? 'it' : 'each'} (${children.map((c) => `ALTER TABLE ${c} NO INHERIT ${table}`).join('; ')}), or set OUTBOX_TABLE to a table without children`,
    );
  }
  if (!f.outbox_is_partition && f.outbox_parents?.length) {
    const parents = f.outbox_parents;
    problems.push(
      `the outbox table ${table} inherits from ${list(parents, 'and')}: rows inserted there are never relayed, and a statement on ${parents.length === 1 ? 'it' : 'them'} ` +
        `(another relay's claims and marks, a DELETE by hand) reaches the outbox's rows too. Detach it (${parents.map((p) => `ALTER TABLE ${table} NO INHERIT ${p}`).join('; ')})`,
    );
  }
  rlsProblem(f, 'outbox', `the outbox table ${table}`, table, f.outbox_rls_blocked, f.outbox_rls_restrictive, problems);
  if (f.outbox_rules?.length) problems.push(ruleProblem(f.outbox_rules, `the outbox table ${table}`, table, "the relay's UPDATE or DELETE of its rows"));
  if (f.outbox_triggers?.length) {
    problems.push(
      triggerProblem(f.outbox_triggers, `the outbox table ${table}`, table, "the relay's UPDATE or DELETE of a row",
        'a skipped mark leaves its row pending, published again on every invocation, and a skipped UPDATE loses a failed attempt'),
    );
  }
}

function sentShapeProblems(f: SchemaFacts, needs: SchemaNeeds, problems: string[]): void {
  const { sentTable } = needs;
  if (f.sent_kind !== 'p' && f.sent_children?.length) {
    const children = f.sent_children;
    problems.push(
      `the sent table ${sentTable} has inheritance ${children.length === 1 ? 'child' : 'children'} ${list(children, 'and')}: retention deletes its old rows, ` +
        `and reaches the children's rows too, deleting whatever they keep once it is older than the window. Detach ${children.length === 1 ? 'it' : 'each'} (${children.map((c) => `ALTER TABLE ${c} NO INHERIT ${sentTable}`).join('; ')})`,
    );
  }
  rlsProblem(f, 'sent', `the sent table ${sentTable}`, sentTable, f.sent_rls_blocked, f.sent_rls_restrictive, problems);
  if (f.sent_rules?.length) problems.push(ruleProblem(f.sent_rules, `the sent table ${sentTable}`, sentTable, "the move's INSERT or retention's DELETE"));
  if (f.sent_triggers?.length) {
    problems.push(triggerProblem(f.sent_triggers, `the sent table ${sentTable}`, sentTable, "the move's INSERT or retention's DELETE of a row", 'a skipped INSERT loses the sent row, a skipped DELETE keeps it past retention'));
  }
}

function rlsProblem(f: SchemaFacts, which: 'outbox' | 'sent', where: string, table: string, blocked: string[] | null, restrictive: string[] | null, problems: string[]): void {
  if (!blocked?.length) return;
  const why = blocked.map((c) => `${c}: ${RLS_WHY[which][c] ?? 'the relay needs every row'}`).join('; ');
  const held = restrictive?.length
    ? `; the RESTRICTIVE ${restrictive.length === 1 ? 'policy' : 'policies'} ${list(restrictive, 'and')} ${restrictive.length === 1 ? 'applies' : 'apply'} to it, which no permissive policy lifts`
    : '';
  problems.push(
    `row-level security on ${where} applies to the database role ${f.role} (no superuser, no BYPASSRLS, and not the table's owner, or the table forces it), ` +
      `and no policy lets it ${list(blocked, 'and')} every row (${why}${held}): ` +
      `CREATE POLICY outbox_relay ON ${table} FOR ALL TO ${f.role_ident} USING (true) WITH CHECK (true)${held ? `, with ${f.role_ident} left out of ${list(restrictive!, 'and')}` : ''}, ` +
      `or ALTER ROLE ${f.role_ident} BYPASSRLS`,
  );
}

function ruleProblem(rules: string[], where: string, table: string, what: string): string {
  const one = rules.length === 1;
  return (
    `${where} has ${one ? 'rule' : 'rules'} ${list(rules, 'and')} on ${what}, which ${one ? 'rewrites' : 'rewrite'} the relay's statements (a DO INSTEAD rule skips or redirects them): ` +
    `drop ${one ? 'it' : 'them'} (${rules.map((r) => `DROP RULE ${r} ON ${table}`).join('; ')}), or use an AFTER trigger for what ${one ? 'it does' : 'they do'}`
  );
}

function triggerProblem(triggers: Array<{ name: string; events: string }>, where: string, table: string, what: string, harm: string): string {
  const one = triggers.length === 1;
  return (
    `${where} has BEFORE ROW ${one ? 'trigger' : 'triggers'} ${list(triggers.map((t) => `${t.name} (BEFORE ${t.events})`), 'and')}, which can skip ${what} by returning NULL (${harm}): ` +
    `make ${one ? 'it an AFTER trigger' : 'them AFTER triggers'}, or drop ${one ? 'it' : 'them'} (${triggers.map((t) => `DROP TRIGGER ${t.name} ON ${table}`).join('; ')})`
  );
}

/** True when versions this relay needs are missing: the objects they create need not be said missing too. */
function migrationProblems(f: SchemaFacts, needs: SchemaNeeds, problems: string[]): boolean {
  const { table } = needs;
  if (!f.migrations_table) {
    problems.push(
      `outbox_relay_migrations, where ${MIGRATE} records the migrations of each outbox table, does not exist (or is not on the database role's search_path): ` +
        `the outbox table ${table} was not made by ${MIGRATE}. Run it, as the table's owner: it records what it applies, and its migrations are safe to run again on a table made from the same SQL`,
    );
    return false;
  }
  if (!f.migrations_readable || !f.versions) {
    problems.push(`the database role ${f.role} may not read ${f.migrations_table}, where ${MIGRATE} records the migrations of each outbox table, and which the relay reads to know that the schema is the one it was built for: GRANT SELECT ON ${f.migrations_table} TO ${f.role_ident}`);
    return false;
  }
  if (f.versions.length === 0) {
    problems.push(
      `no migration of the outbox table ${table} is recorded in ${f.migrations_table}: a table made by hand, by another tool, or under another name? ` +
        `Run ${MIGRATE}, as the table's owner: it records what it applies, and its migrations are safe to run again on a table made from the same SQL`,
    );
    return true;
  }
  const applied = new Set(f.versions);
  const missing = needs.migrations.filter((m) => !applied.has(m.version));
  // A schema NEWER than this relay is accepted: in a rolling deploy the new version's `migrate` runs
  // first while the old relays still run, and refusing would be an outage per deploy. Safe because
  // every migration keeps the version before it working (it adds; none renames or drops what an
  // older relay reads); one that has to break that needs a minimum relay version, which this lacks.
  if (missing.length === 0) return false;
  const names = missing.map((m) => `${m.version} (${m.name})`);
  problems.push(
    `the outbox table ${table} lacks ${missing.length === 1 ? 'migration' : 'migrations'} ${list(names, 'and')}, which this version of the relay needs ` +
      `(recorded in ${f.migrations_table}: ${f.versions.join(', ')}): run ${MIGRATE} (idempotent) before the relay`,
  );
  return true;
}

function columnProblem(f: SchemaFacts, p: string, columns: string[], where: string, why: string, table: string): string {
  return (
    `the database role ${f.role} has ${p} on some columns of ${where} only, and lacks it on ${list(columns, 'and')} (${p}: ${why}): ` +
    `GRANT ${p} (${columns.join(', ')}) ON ${table} TO ${f.role_ident}`
  );
}

function privilege(f: SchemaFacts, p: string): boolean {
  if (p === 'SELECT') return f.outbox_select === true;
  if (p === 'UPDATE') return f.outbox_update === true;
  return f.outbox_delete === true;
}

function list(items: string[], conjunction: string): string {
  return items.length <= 1 ? (items[0] ?? '') : `${items.slice(0, -1).join(', ')} ${conjunction} ${items.at(-1)}`;
}

/** `facts` undefined: the statement returned no row, which it always does; a failure to check, retriable. */
export function assertSchema(facts: SchemaFacts | undefined, needs: Omit<SchemaNeeds, 'migrations'> & { migrations?: SchemaNeeds['migrations']; partitionsFn?: string }): string[] {
  if (!facts) throw new DatabaseError(`checking the outbox table ${needs.table} returned nothing`);
  const err = schemaError(schemaProblems(facts, { ...needs, migrations: needs.migrations ?? loadMigrations() }), needs.table);
  if (err) throw err;
  return schemaWarnings(facts, needs);
}

export function schemaError(problems: string[], table: string): DatabaseError | undefined {
  if (problems.length === 0) return undefined;
  const message = problems.length === 1 ? problems[0]! : `the relay cannot run against the outbox table ${table} until these are fixed:\n  - ${problems.join('\n  - ')}`;
  return new DatabaseError(message, { retriable: false });
}
