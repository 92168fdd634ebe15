// Safe when several run at once: the whole run holds a transaction-scoped advisory lock.
// Partitioned outboxes: docs/schema.md, "Partitioned outboxes".
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Sql, TransactionSql } from 'postgres';
import type { PartitionMaintenance } from '../loop/ports.ts';
import { derivedName, derivedUniqueName, displayName, lanesTable, notifyChannel, qualified, quoteIdent, quoteLiteral, sentTable, type TableName } from './identifier.ts';

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

const here = dirname(fileURLToPath(import.meta.url));

export function loadMigrations(dir = join(here, 'migrations')): Migration[] {
  const embedded = (globalThis as { __OUTBOX_MIGRATIONS__?: Migration[] }).__OUTBOX_MIGRATIONS__;
  if (embedded) return embedded;
  return readdirSync(dir)
    .filter((f) => /^\d+_.+\.sql$/.test(f))
    .sort()
    .map((f) => ({ version: Number(f.split('_')[0]), name: f, sql: readFileSync(join(dir, f), 'utf8') }));
}

export interface RenderShape {
  outboxPartitioned?: boolean;
  sentPartitioned?: boolean;
  partitionWidthS?: number;
}

/**
 * Storage options are a partition's, not its parent's ("unrecognized parameter"): for a partitioned
 * table they are set on each leaf of pg_partition_tree, the DEFAULT one among them, whose options
 * the maintenance function gives every partition it makes later.
 */
const STORAGE_STATEMENT = /^ALTER TABLE \{\{(table|sent_table)\}\} SET \(([^;]*)\);$/gm;

function onPartitions(placeholder: string, options: string): string {
  const statement = quoteLiteral(`ALTER TABLE %s SET (${options.trim().replace(/\s+/g, ' ')})`);
  return `DO $storage$
DECLARE
  p regclass;
BEGIN
  FOR p IN SELECT relid FROM pg_catalog.pg_partition_tree({{${placeholder}_literal}}::regclass) WHERE isleaf LOOP
    EXECUTE pg_catalog.format(${statement}, p);
  END LOOP;
END
$storage$;`;
}

export function render(sqlText: string, table: TableName, shape: RenderShape = {}): string {
  if (shape.outboxPartitioned || shape.sentPartitioned) {
    sqlText = sqlText.replace(STORAGE_STATEMENT, (statement, which: string, options: string) =>
      (which === 'table' ? shape.outboxPartitioned : shape.sentPartitioned) ? onPartitions(which, options) : statement);
  }
  const names: Record<string, string> = {
    table: qualified(table),
    schema: table.schema ? quoteIdent(table.schema) : 'public',
    pkey: derivedName(table, 'pkey'),
    seq_key: derivedName(table, 'seq_key'),
    headers_check: derivedName(table, 'headers_check'),
    // the size checks: an INSERT refused names the constraint, so its name says what was exceeded
    aggregatetype_max: derivedName(table, 'aggregatetype_max_255_chars'),
    aggregateid_max: derivedName(table, 'aggregateid_max_255_chars'),
    type_max: derivedName(table, 'type_max_255_chars'),
    topic_max: derivedName(table, 'topic_max_249_chars'),
    headers_max: derivedName(table, 'headers_max_65536_bytes'),
    tracingspancontext_max: derivedName(table, 'tracingspancontext_max_2048_chars'),
    idx_claim: derivedName(table, 'claim_idx'),
    idx_aggregate: derivedName(table, 'aggregate_idx'),
    idx_retry: derivedName(table, 'retry_idx'),
    idx_skipped: derivedName(table, 'skipped_idx'),
    idx_waiting: derivedName(table, 'waiting_idx'),
    // a function lives in a schema: the table's, or (unqualified, like the table) the search_path's
    notify_fn: inSchema(table, derivedName(table, 'notify')),
    notify_trigger: derivedName(table, 'notify'),
    // a hash when truncated: this one names its table, and two tables must not share it
    unwait_fn: inSchema(table, derivedUniqueName(table, 'unwait')),
    unwait_delete_trigger: derivedName(table, 'unwait_on_delete'),
    unwait_update_trigger: derivedName(table, 'unwait_on_update'),
    channel: quoteLiteral(notifyChannel(table)),
    sent_table: qualified(sentTable(table)),
    idx_sent_table: derivedName(sentTable(table), 'sent_at_idx'),
    lanes_table: qualified(lanesTable(table)),
    lanes_pkey: derivedName(lanesTable(table), 'pkey'),
    // partitioned.sql's
    table_default: inSchema(table, derivedName(table, 'default')),
    sent_default: inSchema(table, derivedName(sentTable(table), 'default')),
    partitions_fn: inSchema(table, derivedUniqueName(table, 'partitions')),
    ...(shape.partitionWidthS === undefined ? {} : { partition_width_s: String(shape.partitionWidthS) }),
  };
  // the same names as string literals, for statements that build SQL (the ALTER FUNCTION of the search_path)
  for (const key of ['table', 'sent_table', 'notify_fn', 'unwait_fn', 'partitions_fn']) names[`${key}_literal`] = quoteLiteral(names[key]!);
  return sqlText.replace(/\{\{(\w+)\}\}/g, (_, key: string) => {
    const v = names[key];
    if (v === undefined) throw new Error(`unknown migration placeholder {{${key}}}`);
    return v;
  });
}

function inSchema(table: TableName, name: string): string {
  return table.schema ? `${quoteIdent(table.schema)}.${name}` : name;
}

export function loadPartitionedSql(file = join(here, 'partitioned.sql')): string {
  return (globalThis as { __OUTBOX_PARTITIONED_SQL__?: string }).__OUTBOX_PARTITIONED_SQL__ ?? readFileSync(file, 'utf8');
}

export interface MigrateOptions {
  partitionWidthS?: number;
}

export type { PartitionMaintenance };

export interface MigrateResult {
  table: string;
  applied: number[];
  alreadyApplied: number[];
  partitions?: PartitionMaintenance;
}

export async function migrate(sql: Sql, table: TableName, migrations = loadMigrations(), options: MigrateOptions = {}): Promise<MigrateResult> {
  const target = displayName(table);
  return sql.begin(async (tx) => {
    // one migrator at a time, across every process and table
    await tx`SELECT pg_advisory_xact_lock(hashtext('outbox-relay:migrate'))`;
    if (table.schema) await tx.unsafe(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(table.schema)}`);
    await tx`
      CREATE TABLE IF NOT EXISTS outbox_relay_migrations (
        target     text        NOT NULL,
        version    integer     NOT NULL,
        name       text        NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (target, version)
      )`;
    const done = new Set((await tx<{ version: number }[]>`SELECT version FROM outbox_relay_migrations WHERE target = ${target}`).map((r) => r.version));
    const result: MigrateResult = { table: target, applied: [], alreadyApplied: [] };
    let shape = await tableShape(tx, table);
    if (options.partitionWidthS !== undefined) {
      // only a table it creates: turning a plain table's rows into partitions is a copy of every row
      const plain = [shape.outbox === 'r' ? qualified(table) : undefined, shape.sent === 'r' ? qualified(sentTable(table)) : undefined].filter(Boolean);
      if (plain.length) {
        throw new Error(
          `OUTBOX_PARTITION_WIDTH is set and ${plain.join(' and ')} ${plain.length === 1 ? 'is a plain table' : 'are plain tables'}: ` +
            'migrate makes an outbox partitioned only when it creates it (docs/schema.md, "Partitioned outboxes"). Unset OUTBOX_PARTITION_WIDTH, or migrate into a new OUTBOX_TABLE',
        );
      }
      await tx.unsafe(render(loadPartitionedSql(), table, { partitionWidthS: options.partitionWidthS }));
      shape = await tableShape(tx, table);
    }
    for (const m of migrations) {
      if (done.has(m.version)) {
        result.alreadyApplied.push(m.version);
        continue;
      }
      await tx.unsafe(render(m.sql, table, { outboxPartitioned: shape.outbox === 'p', sentPartitioned: shape.sent === 'p' }));
      await tx`INSERT INTO outbox_relay_migrations (target, version, name) VALUES (${target}, ${m.version}, ${m.name})`;
      result.applied.push(m.version);
    }
    if (shape.maintained) {
      // the partitions ahead (and the outbox's old empty ones dropped); the sent table's are retention's
      const [row] = await tx.unsafe<{ done: string }[]>(`SELECT ${render('{{partitions_fn}}', table)}(NULL)::text AS done`);
      result.partitions = JSON.parse(row!.done) as PartitionMaintenance;
    }
    return result;
  });
}

async function tableShape(tx: TransactionSql, table: TableName): Promise<{ outbox?: string; sent?: string; maintained: boolean }> {
  const [row] = await tx.unsafe<{ outbox: string | null; sent: string | null; maintained: boolean }[]>(
    `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)) AS outbox,
            (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($2)) AS sent,
            to_regprocedure($3) IS NOT NULL AS maintained`,
    [qualified(table), qualified(sentTable(table)), `${render('{{partitions_fn}}', table)}(bigint)`],
  );
  return { outbox: row?.outbox ?? undefined, sent: row?.sent ?? undefined, maintained: row?.maintained ?? false };
}

/** For the benchmark's and tests' throwaway tables; the relay never calls it. */
export async function dropOutbox(sql: Sql, table: TableName): Promise<void> {
  await sql.begin(async (tx) => {
    await tx.unsafe(`DROP TABLE IF EXISTS ${qualified(table)}, ${qualified(sentTable(table))}, ${qualified(lanesTable(table))}`);
    await tx.unsafe(`DROP FUNCTION IF EXISTS ${render('{{notify_fn}}', table)}(), ${render('{{unwait_fn}}', table)}(), ${render('{{partitions_fn}}', table)}(bigint)`);
    await tx`DELETE FROM outbox_relay_migrations WHERE target = ${displayName(table)}`;
  });
}
