// Numbered .sql migrations, applied once per target table and recorded. Safe when several run
// at once: the whole run holds a transaction-scoped advisory lock.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Sql } from 'postgres';
import { derivedName, derivedUniqueName, displayName, notifyChannel, qualified, quoteIdent, quoteLiteral, sentTable, type TableName } from './identifier.ts';

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

const here = dirname(fileURLToPath(import.meta.url));

/** Migrations are read from src/outbox/migrations, or embedded by the bundler (see scripts/build.mjs). */
export function loadMigrations(dir = join(here, 'migrations')): Migration[] {
  const embedded = (globalThis as { __OUTBOX_MIGRATIONS__?: Migration[] }).__OUTBOX_MIGRATIONS__;
  if (embedded) return embedded;
  return readdirSync(dir)
    .filter((f) => /^\d+_.+\.sql$/.test(f))
    .sort()
    .map((f) => ({ version: Number(f.split('_')[0]), name: f, sql: readFileSync(join(dir, f), 'utf8') }));
}

export function render(sqlText: string, table: TableName): string {
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
  };
  // the same names as string literals, for statements that build SQL (the ALTER FUNCTION of the search_path)
  for (const key of ['table', 'notify_fn', 'unwait_fn']) names[`${key}_literal`] = quoteLiteral(names[key]!);
  return sqlText.replace(/\{\{(\w+)\}\}/g, (_, key: string) => {
    const v = names[key];
    if (v === undefined) throw new Error(`unknown migration placeholder {{${key}}}`);
    return v;
  });
}

/** an object that lives in the table's schema (an index, a function), named so a statement finds it there */
function inSchema(table: TableName, name: string): string {
  return table.schema ? `${quoteIdent(table.schema)}.${name}` : name;
}

export interface MigrateResult {
  table: string;
  applied: number[];
  alreadyApplied: number[];
}

export async function migrate(sql: Sql, table: TableName, migrations = loadMigrations()): Promise<MigrateResult> {
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
    for (const m of migrations) {
      if (done.has(m.version)) {
        result.alreadyApplied.push(m.version);
        continue;
      }
      await tx.unsafe(render(m.sql, table));
      await tx`INSERT INTO outbox_relay_migrations (target, version, name) VALUES (${target}, ${m.version}, ${m.name})`;
      result.applied.push(m.version);
    }
    return result;
  });
}

/**
 * The inverse of migrate(): drops the outbox table, its sent table and its trigger functions, and
 * forgets the table's migrations. For the benchmark's and tests' throwaway tables; the relay never
 * calls it.
 */
export async function dropOutbox(sql: Sql, table: TableName): Promise<void> {
  await sql.begin(async (tx) => {
    await tx.unsafe(`DROP TABLE IF EXISTS ${qualified(table)}, ${qualified(sentTable(table))}`);
    await tx.unsafe(`DROP FUNCTION IF EXISTS ${render('{{notify_fn}}', table)}(), ${render('{{unwait_fn}}', table)}()`);
    await tx`DELETE FROM outbox_relay_migrations WHERE target = ${displayName(table)}`;
  });
}
