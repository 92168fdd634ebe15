// What the exactly-once files share (exactly-once.test.ts, exactly-once-broker.test.ts): the mode's
// settings, invocations paused in a window, the lanes' state, and the read_committed check by kcat.
import assert from 'node:assert/strict';
import type { Sql } from 'postgres';
import type { PauseWindow } from '../../src/config/types.ts';
import { lanesTable, parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { counts, insertEvents, kafka, runCli, seqsById, startCli, type EventSpec, type Fixture, type RunningCli } from './helpers.ts';
import { kcatPath, kcatRead, type Isolation } from './kcat.ts';

export const EXACTLY_ONCE = { OUTBOX_DELIVERY: 'exactly-once', OUTBOX_BATCH_SIZE: '20' };
export const WINDOWS = {
  publish: 'after the acks, before the record',
  'kafka-commit': 'between the Kafka commit and the marks',
  committed: 'after both commits, unreleased',
} as const;

// the invocation that dies: its lease lasts its timeout and 2 s more
export const DYING_TIMEOUT_MS = 6_000;

export function lanes(f: Fixture): string {
  return qualified(lanesTable(parseTableName(f.table)));
}

export function exactlyOnceKit(sql: Sql) {
  let kcat = '';

  async function rows(f: Fixture, n: number, aggregates = 10): Promise<string[]> {
    const events: EventSpec[] = Array.from({ length: n }, (_, i) => ({ aggregateid: `agg-${i % aggregates}`, payload: { i } }));
    return insertEvents(sql, f.table, events);
  }

  /** The row ids kcat reads, in partition-then-offset order (an aggregate is one partition). */
  async function read(f: Fixture, isolation: Isolation): Promise<Array<{ partition: number; id: string }>> {
    kcat ||= kcatPath();
    const lines = await kcatRead(kcat, f.topic('order'), isolation, '%p %o %h\\n');
    return lines
      .map((l) => {
        const [partition, offset, headers = ''] = l.split(' ');
        return { partition: Number(partition), offset: Number(offset), id: /(?:^|,)id=([0-9a-f-]{36})/.exec(headers)?.[1] ?? '' };
      })
      .sort((a, b) => a.partition - b.partition || a.offset - b.offset);
  }

  /** read_committed: each row once, under its own id, each aggregate's rows in seq order. */
  async function assertExactlyOnce(f: Fixture, ids: string[]): Promise<void> {
    const seen = await read(f, 'read_committed');
    const copies = new Map<string, number>();
    for (const { id } of seen) copies.set(id, (copies.get(id) ?? 0) + 1);
    const twice = [...copies].filter(([, n]) => n > 1);
    assert.deepEqual(twice, [], `${twice.length} rows seen more than once by a read_committed reader`);
    assert.deepEqual(new Set(copies.keys()), new Set(ids), `every row, and only those: ${seen.length} read, ${ids.length} written`);
    const seqs = await seqsById(sql, f.table);
    const last = new Map<string, number>();
    const aggregateOf = new Map((await sql.unsafe<{ id: string; aggregateid: string }[]>(`SELECT id::text, aggregateid FROM ${qualified(parseTableName(f.table))} UNION ALL SELECT id::text, aggregateid FROM ${qualified(parseTableName(f.table + '_sent'))}`)).map((r) => [r.id, r.aggregateid]));
    for (const { id } of seen) {
      const agg = aggregateOf.get(id)!;
      const seq = seqs.get(id)!;
      assert.ok((last.get(agg) ?? -1) < seq, `aggregate ${agg} out of order at seq ${seq}`);
      last.set(agg, seq);
    }
  }

  /**
   * Invocations until nothing is pending, or `tries` of them (rows on record wait for their lane's
   * lease); their stderr, all of it: a lane may be settled by any of them.
   */
  async function drain(f: Fixture, { tries = 10, mustDrain = true } = {}): Promise<string> {
    let stderr = '';
    for (let i = 0; i < tries && (await counts(sql, f.table)).pending > 0; i++) {
      const res = await runCli(['invoke', '--timeout', '10000'], { ...f.env, ...EXACTLY_ONCE });
      assert.equal(res.code, 0, res.stderr);
      stderr += res.stderr;
    }
    if (mustDrain) assert.equal((await counts(sql, f.table)).pending, 0, `not drained:\n${stderr}`);
    return stderr;
  }

  /** Until every lease a dead or frozen invocation left has run out. */
  async function leasesRunOut(f: Fixture): Promise<void> {
    const [row] = await sql.unsafe<{ wait_ms: number }[]>(`SELECT coalesce(extract(epoch FROM max(lease_until) - now()) * 1000, 0)::int AS wait_ms FROM ${lanes(f)} WHERE lease_until > now()`);
    await new Promise((r) => setTimeout(r, (row?.wait_ms ?? 0) + 200));
  }

  /** An invocation that pauses `pauseMs` at `window` once a batch is acked, and says so on stderr. */
  async function startPaused(f: Fixture, window: PauseWindow, pauseMs: number, env: Record<string, string> = {}, timeoutMs = DYING_TIMEOUT_MS): Promise<RunningCli> {
    const running = startCli(['invoke', '--timeout', String(timeoutMs)], {
      ...f.env,
      ...EXACTLY_ONCE,
      ...env,
      OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: String(pauseMs),
      OUTBOX_TEST_PAUSE_AT: window,
    });
    await running.waitForStderr('test hook: pausing after publish');
    return running;
  }

  /** Lanes with a batch on record (recorded in flight, not yet settled). */
  async function unsettled(f: Fixture): Promise<number> {
    const [row] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${lanes(f)} WHERE in_flight IS NOT NULL`);
    return row!.n;
  }

  /**
   * After a broker restart: until the group coordinator has loaded every lane's group (an
   * invocation before that fails on COORDINATOR_LOAD_IN_PROGRESS, and the next one settles).
   */
  async function coordinatorsLoaded(f: Fixture, timeoutMs = 60_000): Promise<void> {
    const groups = (await sql.unsafe<{ id: string }[]>(`SELECT transactional_id AS id FROM ${lanes(f)}`)).map((r) => r.id);
    const admin = kafka.admin();
    await admin.connect();
    try {
      for (const groupId of groups) {
        for (const until = Date.now() + timeoutMs; ; await new Promise((r) => setTimeout(r, 250))) {
          try {
            await admin.fetchOffsets({ groupId });
            break;
          } catch (err) {
            if (Date.now() > until) throw err;
          }
        }
      }
    } finally {
      await admin.disconnect();
    }
  }

  return { rows, read, assertExactlyOnce, drain, leasesRunOut, startPaused, unsettled, coordinatorsLoaded };
}
