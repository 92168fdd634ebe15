// services: postgres, kafka
// Poison rows: a row that cannot be sent (an illegal topic override, a message over its topic's
// size limit) is charged to itself alone: retried with backoff (base and cap respected), then
// parked with its reason, or parked at once when no retry could help; the order policy around a
// failed row (hold, skip); one poison row among 1,000 good ones, fixed and put back by the
// operator. Guarantees: G6 (one bad row blocks no one else) and G4 (its aggregate's later rows
// wait behind it, and follow it in order). Invocations run as real child processes of the CLI.
// A topic that does not exist is a failure of the topic, not of its rows: missing-topics.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  consumeAll,
  counts,
  createTopics,
  fileDb,
  fixture,
  idsOf,
  insertEvents,
  makeDue,
  outboxTableOf as t,
  rowById,
  rowStates,
  runCli,
  topicCount,
  topicExists,
  type EventSpec,
  type Fixture,
  invokeOk as invoke,
} from './helpers.ts';

const sql = fileDb();

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
    let bad = await rowById(sql, f.table, badId);
    assert.equal(bad.attempts, 1);
    assert.equal(bad.sent, false);
    assert.equal(bad.parked, false);
    assert.ok(bad.last_error?.includes(missing), `last_error names the topic: ${bad.last_error}`);
    assert.match(bad.last_error!, /is not a legal Kafka topic name/);
    assert.ok(bad.due_in_ms! > 7_000 && bad.due_in_ms! <= 20_000, `attempt 1 backs off 10-20 s, got ${bad.due_in_ms}`);
    assert.deepEqual((await rowStates(sql, f.table)).filter((r) => r.sent).map((r) => r.id).sort(), [ids[0], ids[2]].sort());

    // not due yet: the next invocation leaves it alone
    const s2 = await invoke(env);
    assert.equal(s2.claimed, 0);
    assert.equal((await rowById(sql, f.table, badId)).attempts, 1, 'a row backing off is not retried early');

    const expected = [
      [2, 15_000, 30_000],
      [3, 15_000, 30_000],
    ] as const;
    for (const [attempt, lo, hi] of expected) {
      await makeDue(sql, f.table);
      const s = await invoke(env);
      assert.equal(s.retried, 1, JSON.stringify(s));
      bad = await rowById(sql, f.table, badId);
      assert.equal(bad.attempts, attempt);
      assert.equal(bad.parked, false);
      assert.ok(bad.due_in_ms! > lo - 3_000 && bad.due_in_ms! <= hi, `attempt ${attempt} backs off ${lo}-${hi} ms (OUTBOX_BACKOFF_MAX_MS), got ${bad.due_in_ms}`);
    }

    await makeDue(sql, f.table);
    const s4 = await invoke(env);
    assert.equal(s4.parked, 1, JSON.stringify(s4));
    bad = await rowById(sql, f.table, badId);
    assert.equal(bad.attempts, 4);
    assert.equal(bad.parked, true);
    assert.equal(bad.sent, false);
    assert.ok(bad.last_error?.includes(missing), 'the parked row keeps its reason');

    // parked means parked: even when "due", no invocation touches it again
    await sql.unsafe(`UPDATE ${t(f.table)} SET next_attempt_at = now() - interval '1 hour' WHERE id = $1`, [badId]);
    const s5 = await invoke(env);
    assert.equal(s5.claimed, 0);
    const still = await rowById(sql, f.table, badId);
    assert.equal(still.attempts, 4);
    assert.equal(still.parked, true);
    assert.equal(await topicExists(missing), false, 'the relay never auto-creates a topic');
    assert.equal(await topicCount([f.topic('order')]), 2, 'nothing but the good rows reached Kafka');
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
    const row = await rowById(sql, f.table, ids[1]!);
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
    const row = await rowById(sql, f.table, ids[1]!);
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
    let states = await rowStates(sql, f.table);
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
    states = await rowStates(sql, f.table);
    assert.equal(byId(q3!).sent, true);
    for (const id of p.slice(1)) assert.equal(byId(id).sent, false);

    // P1 parked: P still held
    await makeDue(sql, f.table);
    const s3 = await invoke(env);
    assert.equal(s3.parked, 1);
    const [q4] = await insertEvents(sql, f.table, [{ aggregateid: 'Q', type: 'Q4' }]);
    await invoke(env);
    states = await rowStates(sql, f.table);
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
    let states = await rowStates(sql, f.table);
    const byId = (id: string) => states.find((r) => r.id === id)!;
    assert.equal(byId(p[0]!).attempts, 1);
    for (const id of p.slice(1)) assert.equal(byId(id).sent, false, 'a backing-off row holds its aggregate even under skip');
    for (const id of q) assert.equal(byId(id).sent, true);

    await makeDue(sql, f.table);
    const s2 = await invoke(env);
    assert.equal(s2.parked, 1);
    states = await rowStates(sql, f.table);
    assert.equal(byId(p[0]!).parked, true);
    for (const id of p.slice(1)) assert.equal(byId(id).sent, true, 'under skip, later rows pass a parked row');
    const msgs = await consumeAll([f.topic('order')], 4);
    assert.deepEqual(msgs.filter((m) => m.key === 'P').map((m) => m.headers.type), ['P2', 'P3']);
  });
});

describe('G4/G6: a poison row among 1,000 good ones', () => {
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
      await makeDue(sql, f.table);
      const s = await invoke(env);
      assert.equal(s.published, 0);
      assert.equal(attempt === 3 ? s.parked : s.retried, 1, JSON.stringify(s));
    }
    let poison = (await rowStates(sql, f.table)).filter((r) => r.aggregateid === 'poison');
    assert.equal(poison[0]!.parked, true);
    assert.equal(poison[0]!.attempts, 3);
    for (const r of poison.slice(1)) {
      assert.equal(r.sent, false, 'held behind the parked row');
      assert.equal(r.attempts, 0);
    }
    assert.equal(await topicCount([f.topic('order')]), 1_000);

    // the operator fixes the row's topic and puts it back
    await sql.unsafe(`UPDATE ${t(f.table)} SET topic = NULL WHERE id = $1`, [poisonIds[0]!]);
    const retry = await runCli(['parked', 'retry', poisonIds[0]!, '--reason', 'topic fixed'], f.env);
    assert.equal(retry.code, 0, retry.stderr);
    assert.deepEqual(retry.summary?.retried, [poisonIds[0]]);
    const s = await invoke(env);
    assert.equal(s.published, 4, JSON.stringify(s));
    poison = (await rowStates(sql, f.table)).filter((r) => r.aggregateid === 'poison');
    assert.ok(poison.every((r) => r.sent));
    const msgs = await consumeAll([f.topic('order')], 1_004);
    assert.equal(msgs.length, 1_004);
    const sorted = msgs.filter((m) => m.key === 'poison').sort((a, b) => Number(a.offset) - Number(b.offset));
    assert.deepEqual(idsOf(sorted), poisonIds, 'the poison row first, then the rows it held, in seq order');
    assert.deepEqual(await counts(sql, f.table), { total: 1_004, sent: 1_004, parked: 0, pending: 0 });
  });
});
