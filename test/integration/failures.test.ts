// Failures (issue 4): poison rows, retries with backoff, parking, the order policy around them,
// operator commands, and faults injected by real means: a topic that does not exist, a topic with
// a small max.message.bytes, a backend terminated with pg_terminate_backend, a rotated password,
// a broken secret, a broker killed with SIGKILL or frozen with SIGSTOP. Invocations run as real
// child processes of the CLI, except where two invocations must share one process (Runtime).
// The tests that kill or pause the broker come last and restore it in `finally`.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { CreateSecretCommand, DeleteSecretCommand, PutSecretValueCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import type { Sql } from 'postgres';
import { loadConfig } from '../../src/config.ts';
import { Deadline } from '../../src/budget.ts';
import { openConnections } from '../../src/outbox/client.ts';
import { DatabaseError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { isConnectionLost } from '../../src/outbox/store.ts';
import type { Summary } from '../../src/relay.ts';
import { Runtime } from '../../src/runtime.ts';
import { SecretsManagerSource } from '../../src/secrets.ts';
import {
  ADMIN_DATABASE_URL,
  AWS_ENDPOINT_URL,
  brokerPid,
  consumeAll,
  copiesById,
  counts,
  createTopics,
  DATABASE_URL,
  fixture,
  insertEvents,
  kafka,
  markedIds,
  ROOT,
  runCli,
  sentTableOf,
  servicesUp,
  startCli,
  topicCount,
  waitForLeaders,
  twiceIds,
  uniqueName,
  db,
  type Consumed,
  type EventSpec,
  type Fixture,
  invokeOk as invoke,
} from './helpers.ts';

let sql: Sql;
before(() => {
  sql = db();
});
after(async () => {
  await sql.end();
});

interface RowState {
  seq: number;
  id: string;
  aggregateid: string;
  topic: string | null;
  attempts: number;
  last_error: string | null;
  /** next_attempt_at - now(), in ms (negative: due) */
  due_in_ms: number | null;
  parked: boolean;
  sent: boolean;
  skipped: boolean;
}

const t = (table: string) => qualified(parseTableName(table));

async function rowStates(table: string): Promise<RowState[]> {
  const rows = await sql.unsafe<(Omit<RowState, 'seq' | 'due_in_ms'> & { seq: string; due_in_ms: string | null })[]>(
    `SELECT seq, id, aggregateid, topic, attempts, last_error,
            CASE WHEN isfinite(next_attempt_at) THEN extract(epoch FROM next_attempt_at - now()) * 1000 END AS due_in_ms,
            parked_at IS NOT NULL AS parked, sent_at IS NOT NULL AS sent, skipped_at IS NOT NULL AS skipped
     FROM ${t(table)}
     UNION ALL
     SELECT seq, id, aggregateid, topic, attempts, NULL, NULL, false, true, false FROM ${sentTableOf(table)}
     ORDER BY seq`,
  );
  return rows.map((r) => ({ ...r, seq: Number(r.seq), due_in_ms: r.due_in_ms === null ? null : Number(r.due_in_ms) }));
}

async function rowById(table: string, id: string): Promise<RowState> {
  const row = (await rowStates(table)).find((r) => r.id === id);
  assert.ok(row, `row ${id} exists`);
  return row;
}

/** Bring every backing-off row due now, so the next invocation retries it (instead of waiting). */
async function makeDue(table: string): Promise<void> {
  await sql.unsafe(`UPDATE ${t(table)} SET next_attempt_at = now() WHERE sent_at IS NULL AND attempts > 0 AND next_attempt_at > now()`);
}

function idsOf(msgs: Consumed[]): string[] {
  return msgs.map((m) => m.headers.id!);
}

async function topicExists(topic: string): Promise<boolean> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    return (await admin.listTopics()).includes(topic);
  } finally {
    await admin.disconnect();
  }
}

describe('G6: per-row errors are charged to that row only', () => {
  it('a row that cannot be sent (an illegal topic override): good rows delivered, the bad row backs off (base/max respected), is parked after OUTBOX_MAX_ATTEMPTS and stays parked', async (ctx) => {
    const f = await fixture(sql, 'badrow');
    const missing = `${f.prefix}.illegal!`;
    const ids = await insertEvents(sql, f.table, [
      { aggregateid: 'good-1', payload: { n: 1 } },
      { aggregateid: 'bad', topic: missing, payload: { n: 2 } },
      { aggregateid: 'good-2', payload: { n: 3 } },
    ]);
    const badId = ids[1]!;
    // attempt 1 waits base·[½,1] = 10-20 s, attempt 2 base·2·[½,1] = 20-40 s capped to 15-30 s,
    // attempt 3 (uncapped 40-80 s) also 15-30 s: the cap is visible
    const env = { ...f.env, OUTBOX_MAX_ATTEMPTS: '4', OUTBOX_BACKOFF_BASE_MS: '20000', OUTBOX_BACKOFF_MAX_MS: '30000' };

    const s1 = await invoke(env);
    assert.equal(s1.published, 2);
    assert.equal(s1.retried, 1);
    ctx.diagnostic(`an invocation with one bad row took ${String(s1.durationMs)} ms`);
    const msgs = await consumeAll([f.topic('order')], 2);
    assert.deepEqual(new Set(idsOf(msgs)), new Set([ids[0], ids[2]]), 'the good rows of the same batch were delivered');
    let bad = await rowById(f.table, badId);
    assert.equal(bad.attempts, 1);
    assert.equal(bad.sent, false);
    assert.equal(bad.parked, false);
    assert.ok(bad.last_error?.includes(missing), `last_error names the topic: ${bad.last_error}`);
    assert.match(bad.last_error!, /is not a legal Kafka topic name/);
    assert.ok(bad.due_in_ms! > 7_000 && bad.due_in_ms! <= 20_000, `attempt 1 backs off 10-20 s, got ${bad.due_in_ms}`);
    assert.deepEqual((await rowStates(f.table)).filter((r) => r.sent).map((r) => r.id).sort(), [ids[0], ids[2]].sort());

    // not due yet: the next invocation leaves it alone
    const s2 = await invoke(env);
    assert.equal(s2.claimed, 0);
    assert.equal((await rowById(f.table, badId)).attempts, 1, 'a row backing off is not retried early');

    const expected = [
      [2, 15_000, 30_000],
      [3, 15_000, 30_000],
    ] as const;
    for (const [attempt, lo, hi] of expected) {
      await makeDue(f.table);
      const s = await invoke(env);
      assert.equal(s.retried, 1, JSON.stringify(s));
      bad = await rowById(f.table, badId);
      assert.equal(bad.attempts, attempt);
      assert.equal(bad.parked, false);
      assert.ok(bad.due_in_ms! > lo - 3_000 && bad.due_in_ms! <= hi, `attempt ${attempt} backs off ${lo}-${hi} ms (OUTBOX_BACKOFF_MAX_MS), got ${bad.due_in_ms}`);
    }

    await makeDue(f.table);
    const s4 = await invoke(env);
    assert.equal(s4.parked, 1, JSON.stringify(s4));
    bad = await rowById(f.table, badId);
    assert.equal(bad.attempts, 4);
    assert.equal(bad.parked, true);
    assert.equal(bad.sent, false);
    assert.ok(bad.last_error?.includes(missing), 'the parked row keeps its reason');

    // parked means parked: even when "due", no invocation touches it again
    await sql.unsafe(`UPDATE ${t(f.table)} SET next_attempt_at = now() - interval '1 hour' WHERE id = $1`, [badId]);
    const s5 = await invoke(env);
    assert.equal(s5.claimed, 0);
    const still = await rowById(f.table, badId);
    assert.equal(still.attempts, 4);
    assert.equal(still.parked, true);
    assert.equal(await topicExists(missing), false, 'the relay never auto-creates a topic');
    assert.equal(await topicCount([f.topic('order')]), 2, 'nothing but the good rows reached Kafka');
  });

  it('a topic override naming a missing topic: the topic is backed off, its row stays pending with no attempt charged, whatever the number of invocations; created, it is delivered', async () => {
    const f = await fixture(sql, 'unknowntopic');
    const missing = `${f.prefix}.missing`;
    const ids = await insertEvents(sql, f.table, [
      { aggregateid: 'bad', topic: missing, type: 'B1' },
      { aggregateid: 'good' },
      { aggregateid: 'bad', type: 'B2' },
    ]);
    const env = { ...f.env, OUTBOX_MAX_ATTEMPTS: '1' };
    for (let i = 0; i < 3; i++) {
      const s = await invoke(env);
      assert.deepEqual([s.published, s.retried, s.parked], [i === 0 ? 1 : 0, 0, 0], JSON.stringify(s));
      assert.deepEqual(s.topicsBackedOff, [missing], 'the summary names the topic');
      assert.equal(s.stoppedBecause, 'topics-backed-off');
      const [b1, good, b2] = await Promise.all(ids.map((id) => rowById(f.table, id)));
      assert.deepEqual([b1!.sent, b1!.attempts, b1!.parked, b1!.last_error], [false, 0, false, null], 'not charged, not parked (max attempts 1)');
      assert.equal(b2!.sent, false, 'the later row of the aggregate waits behind it (G4)');
      assert.equal(good!.sent, true);
    }
    assert.equal(await topicExists(missing), false, 'the relay never auto-creates a topic');
    await createTopics([missing], 1);
    const s = await invoke(env);
    assert.equal(s.published, 2, JSON.stringify(s));
    assert.deepEqual(s.topicsBackedOff, []);
    assert.deepEqual(idsOf(await consumeAll([missing], 1)), [ids[0]]);
    assert.deepEqual(new Set(idsOf(await consumeAll([f.topic('order')], 2))), new Set([ids[1], ids[2]]));
  });

  it('partial batch failure: rows to a good topic are acked and marked, the rows of the missing topic stay pending, uncharged', async () => {
    const f = await fixture(sql, 'partial');
    const missing = `${f.prefix}.later`;
    const events: EventSpec[] = [];
    for (let i = 0; i < 30; i++) events.push(i % 3 === 2 ? { aggregateid: `m-${i}`, topic: missing, payload: { i } } : { aggregateid: `g-${i % 7}`, payload: { i } });
    const ids = await insertEvents(sql, f.table, events);
    const goodIds = ids.filter((_, i) => i % 3 !== 2);
    const failIds = ids.filter((_, i) => i % 3 === 2);
    const env = { ...f.env, OUTBOX_BACKOFF_BASE_MS: '60000' };

    const s1 = await invoke(env);
    assert.equal(s1.batches, 1, 'one batch held both topics');
    assert.equal(s1.published, 20);
    assert.equal(s1.retried, 0);
    assert.deepEqual(s1.topicsBackedOff, [missing]);
    const states = await rowStates(f.table);
    assert.deepEqual(states.filter((r) => r.sent).map((r) => r.id), goodIds);
    for (const r of states.filter((x) => !x.sent)) {
      assert.equal(r.attempts, 0);
      assert.equal(r.last_error, null);
    }
    assert.deepEqual(new Set(idsOf(await consumeAll([f.topic('order')], 20))), new Set(goodIds));

    // the topic appears; the retry sends only the 10 failed rows, the good ones are not re-sent
    await createTopics([missing], 3);
    const s2 = await invoke(env);
    assert.equal(s2.published, 10);
    assert.deepEqual(new Set(idsOf(await consumeAll([missing], 10))), new Set(failIds));
    assert.equal(await topicCount([f.topic('order')]), 20, 'no good row was sent twice');
    assert.deepEqual(await counts(sql, f.table), { total: 30, sent: 30, parked: 0, pending: 0 });
  });
});

describe('G6: a message over the size limit is parked at once', () => {
  const big = { blob: 'x'.repeat(5_000) };

  it('limit from OUTBOX_MAX_MESSAGE_BYTES', async () => {
    const f = await fixture(sql, 'sizeenv');
    const ids = await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'big', payload: big }, { aggregateid: 'b' }]);
    const s = await invoke({ ...f.env, OUTBOX_MAX_MESSAGE_BYTES: '2048' });
    assert.equal(s.published, 2);
    assert.equal(s.parked, 1);
    const row = await rowById(f.table, ids[1]!);
    assert.equal(row.attempts, 1, 'parked at the first attempt, not after OUTBOX_MAX_ATTEMPTS');
    assert.equal(row.parked, true);
    assert.equal(row.sent, false);
    assert.match(row.last_error ?? '', /over the 2048-byte limit of topic/);
    assert.deepEqual(new Set(idsOf(await consumeAll([f.topic('order')], 2))), new Set([ids[0], ids[2]]), 'the big row never reached Kafka');
  });

  it('limit read from the topic\'s max.message.bytes on the broker (no env override)', async () => {
    const f = await fixture(sql, 'sizetopic');
    const small = f.topic('small');
    await createTopics([small], 1, [{ name: 'max.message.bytes', value: '2048' }]);
    const ids = await insertEvents(sql, f.table, [
      { aggregatetype: 'small', aggregateid: 'a', payload: { blob: 'y'.repeat(1_500) } },
      { aggregatetype: 'small', aggregateid: 'big', payload: big },
      { aggregatetype: 'order', aggregateid: 'big-elsewhere', payload: big },
    ]);
    const s = await invoke(f.env);
    assert.equal(s.published, 2, JSON.stringify(s));
    assert.equal(s.parked, 1);
    const row = await rowById(f.table, ids[1]!);
    assert.equal(row.attempts, 1);
    assert.equal(row.parked, true);
    // the relay's own check, with the broker's number: not a send the broker had to refuse
    assert.match(row.last_error ?? '', new RegExp(`over the 2048-byte limit of topic ${small.replaceAll('.', '\\.')}`));
    assert.deepEqual(idsOf(await consumeAll([small], 1)), [ids[0]], 'a message under the limit on the same topic went through');
    assert.deepEqual(idsOf(await consumeAll([f.topic('order')], 1)), [ids[2]], 'the same payload fits a topic with the default limit');
  });
  // a limit the relay did not know (the broker refuses): test/integration/publishing.test.ts, on 3 partitions
});

describe('G4/G6: order policy around failed rows', () => {
  async function setup(name: string): Promise<{ f: Fixture; p: string[]; q: string[] }> {
    const f = await fixture(sql, name);
    // aggregate P: its first row can never be sent (an illegal topic), its later rows can
    const ids = await insertEvents(sql, f.table, [
      { aggregateid: 'P', topic: `${f.prefix}.illegal!`, type: 'P1' },
      { aggregateid: 'Q', type: 'Q1' },
      { aggregateid: 'P', type: 'P2' },
      { aggregateid: 'Q', type: 'Q2' },
      { aggregateid: 'P', type: 'P3' },
    ]);
    return { f, p: [ids[0]!, ids[2]!, ids[4]!], q: [ids[1]!, ids[3]!] };
  }

  it('hold (default): a backing-off or parked row holds back its aggregate\'s later rows (not charged), never other aggregates', async () => {
    const { f, p, q } = await setup('holdpolicy');
    const env = { ...f.env, OUTBOX_MAX_ATTEMPTS: '2', OUTBOX_BACKOFF_BASE_MS: '60000' };
    const s1 = await invoke(env);
    assert.equal(s1.retried, 1);
    let states = await rowStates(f.table);
    const byId = (id: string) => states.find((r) => r.id === id)!;
    assert.equal(byId(p[0]!).attempts, 1);
    for (const id of p.slice(1)) {
      assert.equal(byId(id).sent, false, 'a later row of P was not sent past P1');
      assert.equal(byId(id).attempts, 0, 'held-back rows are not charged');
    }
    for (const id of q) assert.equal(byId(id).sent, true, 'Q flows');

    // P1 backing off: P stays held, new rows of other aggregates flow
    const [q3] = await insertEvents(sql, f.table, [{ aggregateid: 'Q', type: 'Q3' }]);
    await invoke(env);
    states = await rowStates(f.table);
    assert.equal(byId(q3!).sent, true);
    for (const id of p.slice(1)) assert.equal(byId(id).sent, false);

    // P1 parked: P still held
    await makeDue(f.table);
    const s3 = await invoke(env);
    assert.equal(s3.parked, 1);
    const [q4] = await insertEvents(sql, f.table, [{ aggregateid: 'Q', type: 'Q4' }]);
    await invoke(env);
    states = await rowStates(f.table);
    assert.equal(byId(p[0]!).parked, true);
    assert.equal(byId(q4!).sent, true);
    for (const id of p.slice(1)) {
      assert.equal(byId(id).sent, false, 'a parked row holds its aggregate back');
      assert.equal(byId(id).attempts, 0);
    }
    const msgs = await consumeAll([f.topic('order')], 4);
    assert.equal(msgs.filter((m) => m.key === 'P').length, 0, 'nothing of P reached Kafka');
    assert.deepEqual(msgs.map((m) => m.headers.type), ['Q1', 'Q2', 'Q3', 'Q4']);
  });

  it('skip: the later rows wait while the row backs off, and pass it once it is parked', async () => {
    const { f, p, q } = await setup('skippolicy');
    const env = { ...f.env, OUTBOX_PARKED_POLICY: 'skip', OUTBOX_MAX_ATTEMPTS: '2', OUTBOX_BACKOFF_BASE_MS: '60000' };
    await invoke(env);
    let states = await rowStates(f.table);
    const byId = (id: string) => states.find((r) => r.id === id)!;
    assert.equal(byId(p[0]!).attempts, 1);
    for (const id of p.slice(1)) assert.equal(byId(id).sent, false, 'a backing-off row holds its aggregate even under skip');
    for (const id of q) assert.equal(byId(id).sent, true);

    await makeDue(f.table);
    const s2 = await invoke(env);
    assert.equal(s2.parked, 1);
    states = await rowStates(f.table);
    assert.equal(byId(p[0]!).parked, true);
    for (const id of p.slice(1)) assert.equal(byId(id).sent, true, 'under skip, later rows pass a parked row');
    const msgs = await consumeAll([f.topic('order')], 4);
    assert.deepEqual(msgs.filter((m) => m.key === 'P').map((m) => m.headers.type), ['P2', 'P3']);
  });
});

describe('G6: a poison row among 1,000 good ones', () => {
  it('the good rows go in one invocation; the poison row is parked and holds its aggregate; fixed and retried, it goes first, then the rows it held, in seq order', async () => {
    const f = await fixture(sql, 'poison');
    const events: EventSpec[] = Array.from({ length: 1_000 }, (_, i) => ({ aggregateid: `g-${i % 50}`, payload: { i } }));
    // the poison row early in the first batch, its aggregate's later rows spread behind it
    events.splice(300, 0, { aggregateid: 'poison', type: 'E1', topic: `${f.prefix}.illegal!` });
    events.splice(500, 0, { aggregateid: 'poison', type: 'E2' });
    events.splice(800, 0, { aggregateid: 'poison', type: 'E3' });
    events.push({ aggregateid: 'poison', type: 'E4' });
    const ids = await insertEvents(sql, f.table, events);
    const poisonIds = ids.filter((_, i) => events[i]!.aggregateid === 'poison');
    const env = { ...f.env, OUTBOX_MAX_ATTEMPTS: '3', OUTBOX_BACKOFF_BASE_MS: '60000' };

    const s1 = await invoke(env, 30_000);
    assert.equal(s1.published, 1_000, JSON.stringify(s1));
    assert.equal(s1.retried, 1);
    for (let attempt = 2; attempt <= 3; attempt++) {
      await makeDue(f.table);
      const s = await invoke(env);
      assert.equal(s.published, 0);
      assert.equal(attempt === 3 ? s.parked : s.retried, 1, JSON.stringify(s));
    }
    let poison = (await rowStates(f.table)).filter((r) => r.aggregateid === 'poison');
    assert.equal(poison[0]!.parked, true);
    assert.equal(poison[0]!.attempts, 3);
    for (const r of poison.slice(1)) {
      assert.equal(r.sent, false, 'held behind the parked row');
      assert.equal(r.attempts, 0);
    }
    assert.equal(await topicCount([f.topic('order')]), 1_000);

    // the operator fixes the row's topic and puts it back
    await sql.unsafe(`UPDATE ${t(f.table)} SET topic = NULL WHERE id = $1`, [poisonIds[0]!]);
    const retry = await runCli(['parked', 'retry', poisonIds[0]!], f.env);
    assert.equal(retry.code, 0, retry.stderr);
    assert.deepEqual(retry.summary, { retried: [poisonIds[0]] });
    const s = await invoke(env);
    assert.equal(s.published, 4, JSON.stringify(s));
    poison = (await rowStates(f.table)).filter((r) => r.aggregateid === 'poison');
    assert.ok(poison.every((r) => r.sent));
    const msgs = await consumeAll([f.topic('order')], 1_004);
    assert.equal(msgs.length, 1_004);
    const sorted = msgs.filter((m) => m.key === 'poison').sort((a, b) => Number(a.offset) - Number(b.offset));
    assert.deepEqual(idsOf(sorted), poisonIds, 'the poison row first, then the rows it held, in seq order');
    assert.deepEqual(await counts(sql, f.table), { total: 1_004, sent: 1_004, parked: 0, pending: 0 });
  });
});

describe('operator commands (CLI)', () => {
  it('status, parked list, parked retry <id> | --all, parked skip <id>, and usage errors', async () => {
    const f = await fixture(sql, 'operator', ['order', 'invoice']);
    // rows that can never be sent as they are: illegal topic overrides (charged, then parked)
    const nope1 = `${f.prefix}.nope1!`;
    const nope2 = `${f.prefix}.nope2!`;
    const cli = async (...args: string[]) => {
      const res = await runCli(args, f.env);
      assert.equal(res.code, 0, `${args.join(' ')}:\n${res.stderr}`);
      return res;
    };

    // two rows parked at once (max attempts 1), one aggregate held behind one of them
    const [b1, b2, b2later] = await insertEvents(sql, f.table, [
      { aggregateid: 'B1', topic: nope1 },
      { aggregateid: 'B2', topic: nope1 },
      { aggregateid: 'B2', type: 'Later' },
    ]);
    assert.equal((await invoke({ ...f.env, OUTBOX_MAX_ATTEMPTS: '1' })).parked, 2);
    // one row retrying
    const [r1] = await insertEvents(sql, f.table, [{ aggregateid: 'R1', topic: nope2 }]);
    assert.equal((await invoke({ ...f.env, OUTBOX_BACKOFF_BASE_MS: '60000' })).retried, 1);
    // plain pending rows; the oldest pending one 90 s old; the parked ones older still (not pending)
    const [o1] = await insertEvents(sql, f.table, [
      { aggregatetype: 'order', aggregateid: 'O' },
      { aggregatetype: 'order', aggregateid: 'O' },
      { aggregatetype: 'invoice', aggregateid: 'I' },
    ]);
    await sql.unsafe(`UPDATE ${t(f.table)} SET created_at = now() - interval '90 seconds' WHERE id = $1`, [o1!]);
    await sql.unsafe(`UPDATE ${t(f.table)} SET created_at = now() - interval '1 hour' WHERE id = ANY($1::uuid[])`, [[b1!, b2!]]);

    const status = (await cli('status', '--json')).summary as {
      pending: number;
      retrying: number;
      parked: number;
      oldestPendingMs: number;
      topics: Array<{ topic: string; pending: number; retrying: number; parked: number; oldestPendingMs: number | null }>;
    };
    assert.equal(status.pending, 5, 'b2later, r1 and three new rows');
    assert.equal(status.retrying, 1);
    assert.equal(status.parked, 2);
    assert.ok(status.oldestPendingMs >= 90_000 && status.oldestPendingMs < 120_000, `oldest pending ${status.oldestPendingMs}`);
    const topics = Object.fromEntries(status.topics.map(({ topic, ...rest }) => [topic, rest]));
    assert.deepEqual(Object.keys(topics).sort(), [f.topic('invoice'), nope1, nope2, f.topic('order')].sort());
    assert.deepEqual({ ...topics[f.topic('order')], oldestPendingMs: undefined }, { pending: 3, retrying: 0, parked: 0, oldestPendingMs: undefined });
    assert.ok(topics[f.topic('order')]!.oldestPendingMs! >= 90_000);
    assert.deepEqual({ ...topics[nope1] }, { pending: 0, retrying: 0, parked: 2, oldestPendingMs: null });
    assert.deepEqual({ ...topics[nope2], oldestPendingMs: undefined }, { pending: 1, retrying: 1, parked: 0, oldestPendingMs: undefined });
    assert.equal(topics[f.topic('invoice')]!.pending, 1);

    const text = (await cli('status')).stdout;
    assert.match(text, /: 5 pending \(1 retrying\), 2 parked, oldest pending 9\d\.\ds\n/);
    assert.match(text, new RegExp(`${nope1.replaceAll('.', '\\.')}\\s+pending\\s+0\\s+retrying\\s+0\\s+parked\\s+2\\s+oldest -`));

    const listed = JSON.parse((await cli('parked', 'list', '--json')).stdout) as Array<{ id: string; attempts: number; last_error: string; aggregateid: string }>;
    assert.deepEqual(listed.map((r) => r.id), [b1, b2]);
    for (const r of listed) {
      assert.equal(r.attempts, 1);
      assert.ok(r.last_error.includes(nope1) && r.last_error.includes('is not a legal Kafka topic name'), r.last_error);
    }
    const listText = (await cli('parked', 'list')).stdout;
    assert.ok(listText.includes(b1!) && listText.includes(b2!), listText);
    assert.match(listText, /attempts 1/);
    assert.ok(listText.includes(`${nope1}" is not a legal Kafka topic name`), listText);

    // usage errors: exit 2, a clear message, nothing changed
    const usage: Array<[string[], RegExp]> = [
      [['parked', 'retry', b1!, 'not-a-uuid'], /"not-a-uuid" is not a row id \(uuid\)/],
      [['parked', 'retry', '123456781234123412341234567890abcdef'], /is not a row id \(uuid\)/],
      [['parked', 'retry', '--al'], /Unknown option '--al'/],
      [['parked', 'retry'], /parked retry needs row ids or --all/],
      [['parked', 'skip'], /parked skip needs row ids/],
      [['parked', 'frobnicate'], /unknown parked subcommand "frobnicate"/],
    ];
    const results = await Promise.all(usage.map(([args]) => runCli(args, f.env)));
    usage.forEach(([args, message], i) => {
      const res = results[i]!;
      assert.equal(res.code, 2, `${args.join(' ')} → ${res.code}\n${res.stderr}`);
      assert.match(res.stderr, message);
      assert.match(res.stderr, /usage: outbox-relay/);
    });
    assert.equal((await rowById(f.table, b1!)).parked, true, 'a rejected command changed nothing');

    // the operator fixes b1's topic and puts it back; b2 is skipped
    const fixed1 = `${f.prefix}.nope1`;
    await createTopics([fixed1], 1);
    await sql.unsafe(`UPDATE ${t(f.table)} SET topic = $1 WHERE id = $2`, [fixed1, b1!]);
    assert.deepEqual((await cli('parked', 'retry', b1!)).summary, { retried: [b1] });
    const back = await rowById(f.table, b1!);
    assert.deepEqual([back.parked, back.attempts, back.last_error], [false, 0, null]);
    assert.deepEqual((await cli('parked', 'skip', b2!)).summary, { skipped: [b2] });
    assert.deepEqual((await cli('parked', 'retry', b2!)).summary, { retried: [] }, 'a skipped row cannot be retried');

    const s = await invoke(f.env);
    assert.equal(s.published, 5, JSON.stringify(s));
    const skipped = await rowById(f.table, b2!);
    assert.deepEqual([skipped.skipped, skipped.sent], [true, false], 'kept in the table, never sent');
    assert.equal((await rowById(f.table, b2later!)).sent, true, 'a skipped row no longer holds its aggregate');
    assert.deepEqual(idsOf(await consumeAll([fixed1], 1)), [b1], 'the retried row was sent, the skipped one was not');
    assert.equal((await cli('parked', 'list')).stdout, 'no parked rows\n');

    // --all: park r1 and one more, put both back
    const [x1] = await insertEvents(sql, f.table, [{ aggregateid: 'X1', topic: nope2 }]);
    await makeDue(f.table);
    assert.equal((await invoke({ ...f.env, OUTBOX_MAX_ATTEMPTS: '1' })).parked, 2);
    const all = (await cli('parked', 'retry', '--all')).summary as { retried: string[] };
    assert.deepEqual(new Set(all.retried), new Set([r1, x1]));
    for (const id of [r1!, x1!]) assert.deepEqual(await rowById(f.table, id).then((r) => [r.parked, r.attempts]), [false, 0]);
    const after = (await cli('status', '--json')).summary as { pending: number; parked: number; retrying: number };
    assert.deepEqual([after.pending, after.parked, after.retrying], [2, 0, 0]);
  });
});

describe('every wait has an end: status', () => {
  it('a table locked by another transaction (a migration holding ACCESS EXCLUSIVE): status gives up at its timeout with a clear error', async () => {
    const f = await fixture(sql, 'statuslock');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const locker = await sql.reserve();
    let res;
    try {
      await locker`BEGIN`;
      await locker.unsafe(`LOCK TABLE ${t(f.table)} IN ACCESS EXCLUSIVE MODE`);
      res = await runCli(['status', '--json', '--timeout', '2000'], f.env);
    } finally {
      await locker`ROLLBACK`;
      locker.release();
    }
    assert.equal(res.code, 1, res.stderr);
    assert.ok(res.durationMs < 2_000 + 4_000, `gave up near its timeout (plus process start): ${res.durationMs} ms`);
    assert.match(res.stderr, /DatabaseError: database error while reading status: canceling statement due to statement timeout/);
    // unlocked, it answers
    const ok = await runCli(['status', '--json'], f.env);
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((ok.summary as { pending: number }).pending, 1);
  });
});

/** Terminate every backend of the relay (found by its application_name = OUTBOX_CLIENT_ID); returns how many. */
async function terminateBackends(admin: Sql, where: { applicationName?: string; user?: string }): Promise<number> {
  const rows = where.applicationName
    ? await admin<{ ok: boolean }[]>`SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE application_name = ${where.applicationName} AND pid <> pg_backend_pid()`
    : await admin<{ ok: boolean }[]>`SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE usename = ${where.user!} AND pid <> pg_backend_pid()`;
  return rows.filter((r) => r.ok).length;
}

/** Resolves once at least `n` rows of the table are marked sent (or the deadline passes). */
async function waitSent(table: string, n: number, timeoutMs = 20_000): Promise<number> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const { sent } = await counts(sql, table);
    if (sent >= n || Date.now() > until) return sent;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** G1: every row marked sent is on Kafka. Reads everything the topics hold (duplicates included). */
async function assertMarkedOnKafka(table: string, topics: string[]): Promise<Consumed[]> {
  const total = await topicCount(topics);
  const msgs = await consumeAll(topics, total, 60_000);
  assert.equal(msgs.length, total, 'read the whole topic');
  const onKafka = new Set(idsOf(msgs));
  const missing = (await rowStates(table)).filter((r) => r.sent && !onKafka.has(r.id));
  assert.equal(missing.length, 0, `${missing.length} rows are marked sent but not on Kafka (first: seq ${missing[0]?.seq})`);
  return msgs;
}

describe('database faults: the relay\'s backend terminated mid-batch', () => {
  let admin: Sql;
  before(() => {
    admin = db(ADMIN_DATABASE_URL);
  });
  after(async () => {
    await admin.end();
  });

  it('CLI: the invocation fails with a database error, marks nothing unsent; the next one delivers everything', async () => {
    const f = await fixture(sql, 'pgkill');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 6_000 }, (_, i) => ({ aggregateid: `a-${i % 40}`, payload: { i } })));
    const appName = `relay-${f.table}`;
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '10', OUTBOX_CLIENT_ID: appName };
    const running = startCli(['invoke', '--timeout', '30000'], env);
    const sentBefore = await waitSent(f.table, 300);
    assert.ok(sentBefore >= 300 && sentBefore < 6_000, `mid-invocation: ${sentBefore} sent`);
    const killed = await terminateBackends(admin, { applicationName: appName });
    assert.ok(killed >= 1, 'the relay\'s backends were found and terminated');
    const res = await running.result;
    assert.equal(res.code, 1, `the invocation fails:\n${res.stderr.slice(-2_000)}`);
    assert.equal(res.summary?.stoppedBecause, 'database-error');
    // the wording depends on where the relay was (ECONNRESET, CONNECTION_CLOSED, 57P01, ...); once,
    // on a machine loaded by a benchmark, a statement on a terminated connection got no answer at
    // all and the invocation failed at its deadline instead (G5 holds either way)
    assert.match(res.stderr, /outbox-relay: DatabaseError: (database error while|a database connection closed|the database did not answer in time)/);
    const stateAfterKill = await rowStates(f.table);
    assert.ok(stateAfterKill.some((r) => !r.sent), 'work was left for the next invocation');
    assert.equal(Math.max(...stateAfterKill.map((r) => r.attempts)), 0, 'a database fault is charged to no row');

    const s = await invoke(env, 30_000);
    assert.equal(s.stoppedBecause, 'empty');
    assert.deepEqual(await counts(sql, f.table), { total: 6_000, sent: 6_000, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 6_000, 60_000);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids), 'no row lost (duplicates allowed)');
  });

  it('in-process: the next invocation of the same Runtime recovers its connections and finishes the work', async () => {
    const f = await fixture(sql, 'pgkillrt');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 6_000 }, (_, i) => ({ aggregateid: `a-${i % 40}`, payload: { i } })));
    const appName = `relay-${f.table}`;
    const logs: string[] = [];
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_BATCH_SIZE: '10', OUTBOX_CLIENT_ID: appName }), createLogger('warn', {}, (l) => logs.push(l)));
    try {
      const first = rt.invoke(30_000).then(
        (summary) => ({ summary, error: undefined }),
        (error: unknown) => ({ summary: (error as { summary?: Summary }).summary, error }),
      );
      await waitSent(f.table, 300);
      assert.ok((await terminateBackends(admin, { applicationName: appName })) >= 1);
      const r1 = await first;
      assert.ok(r1.error instanceof DatabaseError, `the first invocation ends with a DatabaseError, got ${String(r1.error)}`);
      assert.equal(r1.summary?.stoppedBecause, 'database-error');
      assert.ok((await counts(sql, f.table)).pending > 0, 'work was left over');

      const s2 = await rt.invoke(30_000);
      assert.equal(s2.stoppedBecause, 'empty', JSON.stringify(s2));
      assert.deepEqual(await counts(sql, f.table), { total: 6_000, sent: 6_000, parked: 0, pending: 0 });
      const [conns] = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName}`;
      assert.ok(conns!.n >= 1, 'the same Runtime holds fresh connections');

      // connections killed while the (warm) Runtime is idle, the next invocation right after:
      // whether or not the client noticed the close yet, the invocation reconnects and works
      assert.ok((await terminateBackends(admin, { applicationName: appName })) >= 1);
      const [late] = await insertEvents(sql, f.table, [{ aggregateid: 'late' }]);
      const s3 = await rt.invoke(30_000);
      assert.equal(s3.published, 1, JSON.stringify(s3));
      ids.push(late!);
    } catch (err) {
      // this test failed in 2 of 12 runs before the store stopped waiting on postgres.js' stranded
      // reserve (porsager/postgres#1195, the test above): the third invocation's claim waited for
      // a connection until its deadline. If it fails, say what the Runtime logged and which
      // backends the server had for it
      const backends = await admin`SELECT pid, state, wait_event_type, wait_event, backend_start, left(query, 80) AS query FROM pg_stat_activity WHERE application_name = ${appName}`;
      console.error(`runtime logs:\n${logs.join('\n')}\nbackends of ${appName}: ${JSON.stringify(backends)}`);
      throw err;
    } finally {
      await rt.close();
    }
    const msgs = await consumeAll([f.topic('order')], 6_001, 60_000);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids));
  });
});

describe('database faults: a connection closes while a batch waits for one', () => {
  it('the wait for a free connection fails at once as a lost connection, not at the deadline (postgres.js would strand it, porsager/postgres#1195); the same Runtime\'s next invocation reconnects and delivers', async () => {
    const f = await fixture(sql, 'pgstrand');
    const ids = await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'a' }]);
    const appName = `relay-${f.table}`;
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_CLIENT_ID: appName }), createLogger('warn', {}, () => undefined));
    const admin = db(ADMIN_DATABASE_URL);
    try {
      const store = await rt.outboxStore();
      const client = await rt.database();
      // every connection of the client (max 3) taken, so the batch's reserve has to wait in line;
      // each in a transaction, so that through a transaction pooler its server connection is tied
      // to it and a terminated backend closes it too
      // the client's connections opened first, as every reserve of the relay's is preceded (the
      // relay's client fetches no array types, and postgres.js never answers a reserve that opens
      // a connection without that fetch: src/outbox/client.ts)
      await openConnections(client);
      const held = await Promise.all([client.reserve(), client.reserve(), client.reserve()]);
      const pids = await Promise.all(
        held.map(async (c) => {
          await c`BEGIN`;
          return (await c<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`)[0]!.pid;
        }),
      );
      const started = Date.now();
      const waiting = store.begin(new Deadline(Date.now() + 20_000)).then(
        () => undefined,
        (err: unknown) => err,
      );
      await new Promise((r) => setTimeout(r, 200));
      // one held connection's backend ends: postgres.js hands the waiting reserve to its reconnect,
      // which drops it
      await admin`SELECT pg_terminate_backend(${pids[0]!})`;
      const err = await waiting;
      assert.ok(err instanceof DatabaseError, `the wait fails with a DatabaseError, got ${String(err)}`);
      assert.ok(isConnectionLost(err.cause), `as a lost connection: ${err.message}`);
      assert.ok(Date.now() - started < 10_000, `failed when the connection closed, not at the 20 s deadline (${Date.now() - started} ms)`);
      // a client known to have lost a connection is not asked for another
      const again = await store.begin(new Deadline(Date.now() + 20_000)).then(() => undefined, (e: unknown) => e);
      assert.ok(again instanceof DatabaseError && isConnectionLost(again.cause), String(again));
      // the client was ended at the close (OutboxStore.abandon): the server rolled back the
      // transactions of the held connections too, none of them is released into a pool (through
      // PgBouncer, idle server connections stay in its pool: only transactions count)
      const end = Date.now() + 10_000;
      while ((await admin`SELECT 1 FROM pg_stat_activity WHERE application_name = ${appName} AND state LIKE 'idle in transaction%'`).length > 0) {
        assert.ok(Date.now() < end, 'the held connections were closed');
        await new Promise((r) => setTimeout(r, 50));
      }

      const s = await rt.invoke(30_000);
      assert.equal(s.published, 2, JSON.stringify(s));
      assert.notEqual(await rt.database(), client, 'a new client');
    } finally {
      await rt.close();
      await admin.end();
    }
    assert.deepEqual(new Set(idsOf(await consumeAll([f.topic('order')], 2))), new Set(ids));
  });
});

describe('database faults: a batch\'s COMMIT fails', () => {
  it('the invocation fails; the batch in flight still commits its acks; only the failed batch is re-sent', async () => {
    const f = await fixture(sql, 'commitfail');
    // one aggregate per row, so batch 2 is claimed while batch 1 is in flight, and is published
    // before batch 1's COMMIT has answered
    const ids = await insertEvents(sql, f.table, Array.from({ length: 300 }, (_, i) => ({ aggregateid: `c-${i}`, payload: { i } })));
    // a real commit-time failure: a deferred constraint trigger rejects moving row i=50 to the sent table
    await sql.unsafe(`CREATE FUNCTION ${f.table}_fail() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.payload->>'i' = '50' THEN RAISE EXCEPTION 'injected commit failure'; END IF; RETURN NEW; END $$`);
    await sql.unsafe(`CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON ${sentTableOf(f.table)} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ${f.table}_fail()`);
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '100' };
    const res = await runCli(['invoke', '--timeout', '30000'], env);
    assert.equal(res.code, 1, `the invocation fails:\n${res.stderr.slice(-2_000)}`);
    assert.equal(res.summary?.stoppedBecause, 'database-error');
    assert.match(String(res.summary?.error), /injected commit failure/);
    assert.equal(res.summary?.published, 100, 'batch 2 was committed, batch 1 was not');
    assert.deepEqual(await markedIds(sql, f.table), new Set(ids.slice(100, 200)));
    assert.equal(await topicCount([f.topic('order')]), 200, 'batch 3 was not published');

    await sql.unsafe(`DROP TRIGGER fail_at_commit ON ${sentTableOf(f.table)}`);
    const s = await invoke(env, 30_000);
    assert.equal(s.published, 200);
    assert.deepEqual(await counts(sql, f.table), { total: 300, sent: 300, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 400);
    const copies = copiesById(msgs);
    assert.deepEqual(new Set(copies.keys()), new Set(ids), 'nothing lost');
    assert.deepEqual(twiceIds(copies), new Set(ids.slice(0, 100)), 'only batch 1 is duplicated');
  });
});

describe('secrets (Secrets Manager in the AWS emulator)', () => {
  const sm = new SecretsManagerClient({ endpoint: AWS_ENDPOINT_URL, region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' }, maxAttempts: 2 });
  const awsEnv = { AWS_ENDPOINT_URL, AWS_REGION: 'us-east-1', AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test' };
  const created: string[] = [];
  const u = new URL(DATABASE_URL);
  const rds = { username: decodeURIComponent(u.username), password: decodeURIComponent(u.password), host: u.hostname, port: Number(u.port || 5432), dbname: u.pathname.slice(1), engine: 'postgres' };

  async function secret(value: string): Promise<string> {
    const name = `outbox-relay-test/${uniqueName('db')}`;
    await sm.send(new CreateSecretCommand({ Name: name, SecretString: value }));
    created.push(name);
    return name;
  }
  /** the fixture's env with the database coming from the secret instead of DATABASE_URL */
  function secretEnv(f: Fixture, secretId: string): Record<string, string> {
    const { DATABASE_URL: _omit, ...rest } = f.env;
    return { ...rest, ...awsEnv, DATABASE_SECRET_ID: secretId };
  }
  after(async () => {
    for (const name of created) await sm.send(new DeleteSecretCommand({ SecretId: name, ForceDeleteWithoutRecovery: true })).catch(() => undefined);
    sm.destroy();
  });

  it('an RDS-style JSON secret and a plain URL secret both work', async () => {
    const f = await fixture(sql, 'secretok');
    const json = await secret(JSON.stringify(rds));
    const url = await secret(DATABASE_URL);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    assert.equal((await invoke(secretEnv(f, json))).published, 1);
    await insertEvents(sql, f.table, [{ aggregateid: 'b' }]);
    assert.equal((await invoke(secretEnv(f, url))).published, 1);
    assert.equal(await topicCount([f.topic('order')]), 2);
  });

  it('rotation: password changed and the secret updated under a warm Runtime → it re-reads the secret once and carries on', async () => {
    const f = await fixture(sql, 'rotation');
    const admin = db(ADMIN_DATABASE_URL);
    const role = uniqueName('relay_rot');
    const appName = `relay-${f.table}`;
    await admin.unsafe(`CREATE ROLE ${role} LOGIN PASSWORD 'pw-a-${role}'`);
    // what a relay's role needs (README, "The table"): the outbox, INSERT into its sent table, and reading the migrations
    await admin.unsafe(`GRANT SELECT, UPDATE, DELETE ON ${t(f.table)} TO ${role}`);
    await admin.unsafe(`GRANT SELECT, INSERT, DELETE ON ${sentTableOf(f.table)} TO ${role}`);
    await admin.unsafe(`GRANT SELECT ON outbox_relay_migrations TO ${role}`);
    const name = await secret(JSON.stringify({ ...rds, username: role, password: `pw-a-${role}` }));
    const source = new SecretsManagerSource(sm);
    const logs: string[] = [];
    const rt = new Runtime(loadConfig({ ...secretEnv(f, name), OUTBOX_CLIENT_ID: appName }), createLogger('warn', {}, (l) => logs.push(l)), source);
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      assert.equal((await rt.invoke(20_000)).published, 2);
      assert.equal(source.fetches, 1);
      const [who] = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = ${role}`;
      assert.ok(who!.n >= 1, 'the relay connected as the rotated role');

      // rotate: new password on the role and in the secret; the warm client's connections go away
      await admin.unsafe(`ALTER ROLE ${role} PASSWORD 'pw-b-${role}'`);
      await sm.send(new PutSecretValueCommand({ SecretId: name, SecretString: JSON.stringify({ ...rds, username: role, password: `pw-b-${role}` }) }));
      assert.ok((await terminateBackends(admin, { user: role })) >= 1);

      await insertEvents(sql, f.table, [{ aggregateid: 'c' }]);
      const s = await rt.invoke(20_000);
      assert.equal(s.published, 1, JSON.stringify(s));
      assert.equal(source.fetches, 2, 'the secret was read again, once');
      assert.ok(logs.some((l) => l.includes('refreshing the database secret once')), logs.join('\n'));
      assert.ok(!logs.some((l) => l.includes(`pw-a-${role}`) || l.includes(`pw-b-${role}`)), 'no password in the logs');
      assert.deepEqual(await counts(sql, f.table), { total: 3, sent: 3, parked: 0, pending: 0 });
    } finally {
      await rt.close();
      await terminateBackends(admin, { user: role }).catch(() => 0);
      await admin.unsafe(`DROP OWNED BY ${role}`).catch(() => undefined);
      await admin.unsafe(`DROP ROLE IF EXISTS ${role}`).catch(() => undefined);
      await admin.end();
    }
  });

  it('malformed secrets fail clearly, naming the secret and never printing its value; a missing secret too', async () => {
    const f = await fixture(sql, 'secretbad');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const notJson = await secret('hunter2-not-json-or-url');
    const missingFields = await secret(JSON.stringify({ username: 'outbox', password: 'hunter3-secret-value' }));
    const cases: Array<[string, RegExp, string | undefined]> = [
      [notJson, /is not valid JSON; expected a postgres:\/\/ URL or RDS-style JSON/, 'hunter2'],
      [missingFields, /is missing host; expected RDS-style JSON/, 'hunter3'],
      ['outbox-relay-test/does-not-exist', /no such secret: check the id\/ARN and the region/, undefined],
    ];
    const results = await Promise.all(cases.map(([id]) => runCli(['invoke', '--timeout', '10000'], secretEnv(f, id))));
    cases.forEach(([id, message, value], i) => {
      const res = results[i]!;
      assert.notEqual(res.code, 0);
      assert.ok(res.stderr.includes(`SecretError: secret ${JSON.stringify(id)}`), res.stderr);
      assert.match(res.stderr, message);
      if (value) assert.ok(!res.stderr.includes(value) && !res.stdout.includes(value), `the secret value leaked:\n${res.stderr}`);
    });
    assert.equal((await counts(sql, f.table)).sent, 0);
  });

  it('a Secrets Manager that hangs (the emulator SIGSTOPped) at a cold start: the invocation ends within its budget, naming the secret and the network path; nothing is marked', async () => {
    const f = await fixture(sql, 'secrethang');
    const name = await secret(DATABASE_URL);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const moto = Number(readFileSync(join(ROOT, '.cache', 'run', 'moto.pid'), 'utf8').trim());
    process.kill(moto, 'SIGSTOP');
    let res;
    try {
      const run = startCli(['invoke', '--timeout', '6000'], { ...secretEnv(f, name), OUTBOX_SAFETY_MARGIN_MS: '1000' });
      // a hung invocation is killed here, so the test fails on the duration instead of hanging
      const cap = setTimeout(() => run.child.kill('SIGKILL'), 30_000);
      res = await run.result;
      clearTimeout(cap);
    } finally {
      process.kill(moto, 'SIGCONT');
    }
    assert.equal(res.code, 1, res.stderr);
    assert.ok(res.durationMs < 6_000 + 3_000, `ended within the budget (plus process start): ${res.durationMs} ms`);
    assert.match(res.stderr, new RegExp(`secret "${name.replace('/', '\\/')}": Secrets Manager did not answer before the invocation's deadline`));
    assert.match(res.stderr, /interface endpoint or a NAT gateway/);
    assert.equal((await counts(sql, f.table)).sent, 0);
    // resumed, the same secret works
    assert.equal((await invoke(secretEnv(f, name))).published, 1);
  });
});

// ---------------------------------------------------------------------------------------------
// Broker faults: these kill or freeze the shared broker, so they come last and always restore it.

describe('broker faults', () => {
  it('broker killed (SIGKILL) mid-invocation: it ends with "Kafka unavailable", nothing marked that is not on Kafka, no attempts charged; after a restart everything is delivered', async (ctx) => {
    const f = await fixture(sql, 'brokerkill');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 20_000 }, (_, i) => ({ aggregateid: `a-${i % 50}`, payload: { i } })));
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '20' };
    const pid = brokerPid();
    const running = startCli(['invoke', '--timeout', '60000'], env);
    let res;
    try {
      const sentBefore = await waitSent(f.table, 500);
      assert.ok(sentBefore >= 500 && sentBefore < 20_000, `mid-invocation: ${sentBefore} sent`);
      process.kill(pid, 'SIGKILL');
      const killedAt = Date.now();
      res = await running.result;
      const endedAfterMs = Date.now() - killedAt;
      assert.equal(res.code, 1, res.stderr.slice(-2_000));
      assert.equal(res.summary?.stoppedBecause, 'broker-unavailable');
      assert.match(res.stderr, /BrokerUnavailableError: Kafka unavailable at 127\.0\.0\.1:9092/);
      assert.ok(endedAfterMs < 20_000, `ended ${endedAfterMs} ms after the kill`);
      ctx.diagnostic(`killed after ${sentBefore} rows marked; the invocation ended ${endedAfterMs} ms later: ${String(res.summary?.error)}`);
      const states = await rowStates(f.table);
      assert.ok(states.some((r) => !r.sent), 'rows were left pending');
      assert.equal(Math.max(...states.map((r) => r.attempts)), 0, 'a broker outage is charged to no row');
    } finally {
      running.child.kill('SIGKILL');
      const restart = Date.now();
      servicesUp();
      await waitForLeaders([f.topic('order')]);
      ctx.diagnostic(`broker restarted in ${Date.now() - restart} ms`);
    }
    // G1 across the crash: every row marked before the kill made it to the log
    await assertMarkedOnKafka(f.table, [f.topic('order')]);

    const s = await invoke(env, 60_000);
    assert.equal(s.stoppedBecause, 'empty', JSON.stringify(s));
    assert.deepEqual(await counts(sql, f.table), { total: 20_000, sent: 20_000, parked: 0, pending: 0 });
    const msgs = await assertMarkedOnKafka(f.table, [f.topic('order')]);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids), 'every row is on Kafka');
    assert.equal(Math.max(...(await rowStates(f.table)).map((r) => r.attempts)), 0);
  });

  it('broker frozen (SIGSTOP) mid-invocation with an 8 s budget: returns before the deadline, marks nothing unacked; after SIGCONT everything is delivered (G5)', async (ctx) => {
    const f = await fixture(sql, 'brokerstop');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 20_000 }, (_, i) => ({ aggregateid: `a-${i % 50}`, payload: { i } })));
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '20', OUTBOX_SAFETY_MARGIN_MS: '2000' };
    const pid = brokerPid();
    const running = startCli(['invoke', '--timeout', '8000'], env);
    let res;
    try {
      const sentBefore = await waitSent(f.table, 500);
      assert.ok(sentBefore >= 500 && sentBefore < 20_000, `mid-invocation: ${sentBefore} sent`);
      process.kill(pid, 'SIGSTOP');
      res = await running.result;
    } finally {
      running.child.kill('SIGKILL');
      process.kill(pid, 'SIGCONT');
      servicesUp();
      await waitForLeaders([f.topic('order')]);
    }
    const summary = res.summary as unknown as Summary;
    assert.ok(summary, `a summary on stdout:\n${res.stderr.slice(-2_000)}`);
    ctx.diagnostic(`handler ${summary.durationMs} ms, process ${res.durationMs} ms, exit ${res.code}: ${summary.stoppedBecause} (${summary.error ?? ''})`);
    assert.ok(summary.durationMs < 8_000, `the handler returned after ${summary.durationMs} ms, deadline 8000`);
    assert.ok(summary.durationMs < 6_500, `…and within the safety margin (deadline - 2000 ms): ${summary.durationMs} ms`);
    // a hung broker fails the invocation (Lambda's Errors metric), like a broker that is down
    assert.equal(summary.stoppedBecause, 'broker-unavailable', JSON.stringify(summary));
    assert.notEqual(res.code, 0);
    assert.match(summary.error ?? '', /^publishing to \S+ did not finish before the invocation's deadline/, 'the cause is the broker, not the database');
    // the child also exits: connections to a frozen broker are closed with a bound (Runtime.close)
    assert.ok(res.durationMs < 8_000 + 3_000 + 2_000, `the process exited after ${res.durationMs} ms`);
    assert.equal(Math.max(...(await rowStates(f.table)).map((r) => r.attempts)), 0, 'a hung broker is charged to no row');
    await assertMarkedOnKafka(f.table, [f.topic('order')]);

    const s = await invoke({ ...env, OUTBOX_SAFETY_MARGIN_MS: '1000' }, 60_000);
    assert.equal(s.stoppedBecause, 'empty', JSON.stringify(s));
    assert.deepEqual(await counts(sql, f.table), { total: 20_000, sent: 20_000, parked: 0, pending: 0 });
    const msgs = await assertMarkedOnKafka(f.table, [f.topic('order')]);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids));
  });
});
