// What Debezium needs from Postgres, checked before anything starts, and the publication and slot
// of one measurement, removed afterwards. A logical slot left behind retains WAL forever (the
// server's disk fills), so every name carries the bench's pid: a later bench drops the slots
// and publications of benches that no longer run, whatever killed them.
import { existsSync } from 'node:fs';
import type { Sql } from 'postgres';
import { quoteIdent } from '../../src/outbox/identifier.ts';

const PREFIX = 'bench_dbz_';

/** slot, publication and connector name of one measurement: bench_dbz_<pid>_<run> */
export function replicationName(run: string): string {
  return `${PREFIX}${process.pid}_${run.replace(/[^a-z0-9]/g, '')}`;
}

/** wal_level, free slots and senders, and the role's REPLICATION right; all problems at once */
export async function checkReplication(sql: Sql, where: string): Promise<void> {
  const [s] = await sql<{ wal_level: string; slots: number; used_slots: number; senders: number; used_senders: number; can: boolean; role: string }[]>`
    SELECT current_setting('wal_level') AS wal_level,
           current_setting('max_replication_slots')::int AS slots,
           (SELECT count(*)::int FROM pg_replication_slots) AS used_slots,
           current_setting('max_wal_senders')::int AS senders,
           (SELECT count(*)::int FROM pg_stat_replication) AS used_senders,
           (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user) AS can,
           current_user AS role`;
  const problems: string[] = [];
  if (s!.wal_level !== 'logical') {
    problems.push(
      `wal_level is '${s!.wal_level}', Debezium needs 'logical'. scripts/services/postgres.sh sets it when it starts Postgres, so a server started before that setting existed needs one restart: npm run services:down && npm run services:up (or, for a server of your own: ALTER SYSTEM SET wal_level = logical, then restart it)`,
    );
  }
  if (s!.used_slots >= s!.slots) problems.push(`all ${s!.slots} replication slots are taken (max_replication_slots); drop unused ones (SELECT slot_name, active FROM pg_replication_slots) or raise the setting`);
  if (s!.used_senders >= s!.senders) problems.push(`all ${s!.senders} WAL senders are busy (max_wal_senders)`);
  if (!s!.can) problems.push(`role ${s!.role} may not replicate: ALTER ROLE ${s!.role} REPLICATION (as a superuser)`);
  if (problems.length) throw new Error(`Postgres at ${where} cannot serve Debezium:\n  - ${problems.join('\n  - ')}`);
}

export async function createPublication(sql: Sql, name: string, qualifiedTable: string): Promise<void> {
  await sql.unsafe(`CREATE PUBLICATION ${quoteIdent(name)} FOR TABLE ${qualifiedTable}`);
}

/**
 * Drops the slot (ending the walsender that still holds it, after a grace period for a connector
 * that is being deleted) and the publication. Safe to call twice or when neither exists.
 */
export async function dropReplication(sql: Sql, name: string, graceMs = 10_000): Promise<void> {
  const deadline = Date.now() + graceMs;
  for (;;) {
    const [slot] = await sql<{ active_pid: number | null }[]>`SELECT active_pid FROM pg_replication_slots WHERE slot_name = ${name}`;
    if (!slot) break;
    if (slot.active_pid === null) {
      // the slot may turn active again between the two statements (a connector still running); retry then
      const dropped = await sql`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ${name} AND NOT active`.catch(() => []);
      if (dropped.length) break;
    } else if (Date.now() > deadline) {
      await sql`SELECT pg_terminate_backend(${slot.active_pid})`;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  await sql.unsafe(`DROP PUBLICATION IF EXISTS ${quoteIdent(name)}`);
}

/** Slots and publications of benches whose process is gone (killed before they could clean up). */
export async function dropLeftovers(sql: Sql): Promise<string[]> {
  const rows = await sql<{ name: string }[]>`
    SELECT slot_name::text AS name FROM pg_replication_slots WHERE slot_name LIKE ${PREFIX + '%'} AND database = current_database()
    UNION SELECT pubname::text FROM pg_publication WHERE pubname LIKE ${PREFIX + '%'}`;
  const dropped: string[] = [];
  for (const { name } of rows) {
    const pid = Number(/^bench_dbz_(\d+)_/.exec(name)?.[1]);
    if (!pid || pid === process.pid || existsSync(`/proc/${pid}`)) continue; // not ours, or a bench that still runs
    await dropReplication(sql, name, 0);
    dropped.push(name);
  }
  return dropped;
}
