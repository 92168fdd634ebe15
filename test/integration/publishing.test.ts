// services: postgres, kafka
// Publishing (G6): sends sized to fit the topic, and a topic refused as a whole backed off while
// the other topics flow. A lost Produce answer and rotated Kafka credentials are in
// on-the-wire.test.ts (they need the test proxy).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import {
  consumeAll,
  copiesById,
  createTopics,
  fileDb,
  firstCopyOrder,
  fixture,
  insertEvents,
  isSorted,
  kafka,
  markedIds,
  startCli,
  type EventSpec,
  invokeOk as invoke,
  assertCopies,
} from './helpers.ts';

const sql = fileDb();

const t = (table: string) => qualified(parseTableName(table));

async function attemptsCharged(table: string): Promise<number> {
  const [r] = await sql.unsafe<{ n: string }[]>(`SELECT coalesce(sum(attempts), 0) AS n FROM ${t(table)}`);
  return Number(r!.n);
}

describe('G6: sends that fit: rows that each fit are never refused together', () => {
  it('150 rows of one aggregate (~150 KB) on a 3-partition topic with max.message.bytes=100000, between 60 small aggregates; a second topic meanwhile: every row once, each aggregate in order (G4)', async () => {
    const f = await fixture(sql, 'fit', ['small', 'other']);
    const limited = f.topic('limited');
    await createTopics([limited], 3, [{ name: 'max.message.bytes', value: '100000' }]);
    const small = (round: number): EventSpec[] => Array.from({ length: 30 }, (_, i) => ({ aggregatetype: 'limited', aggregateid: `s-${i}`, payload: { round, i } }));
    const events: EventSpec[] = [
      ...small(1),
      ...Array.from({ length: 150 }, (_, i) => ({ aggregatetype: 'limited', aggregateid: 'big', payload: { i, pad: 'b'.repeat(1_000) } })),
      ...small(2),
      ...Array.from({ length: 40 }, (_, i) => ({ aggregatetype: 'other', aggregateid: `o-${i % 5}`, payload: { i } })),
    ];
    const ids = await insertEvents(sql, f.table, events);
    const seqOf = new Map(ids.map((id, i) => [id, i]));

    const s1 = await invoke(f.env);
    const summaries = [s1];
    if ((await markedIds(sql, f.table)).size < ids.length) summaries.push(await invoke(f.env));
    assert.equal((await markedIds(sql, f.table)).size, ids.length, `every row marked within two invocations: ${JSON.stringify(summaries)}`);
    for (const s of summaries) assert.deepEqual([s.parked, s.retried, s.stoppedBecause === 'broker-unavailable'], [0, 0, false], JSON.stringify(s));
    assert.equal(await attemptsCharged(f.table), 0, 'no row was charged an attempt');

    const msgs = await consumeAll([limited, f.topic('other')], ids.length);
    // exactly once: no send was refused, so nothing had to be sent again
    const copies = assertCopies(msgs, new Set(ids), 1);
    assert.equal(copies.size, ids.length);
    for (const [key, order] of firstCopyOrder(msgs, (id) => seqOf.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} in seq order`);
  });

  it('a limit the relay did not know, on a 3-partition topic: the broker refuses one partition (MESSAGE_TOO_LARGE) and appends the others; only the big row is parked, the rest arrive, none more than twice, every marked row on Kafka (G1)', async () => {
    const f = await fixture(sql, 'sizebroker');
    const small = f.topic('small');
    await createTopics([small], 3, [{ name: 'max.message.bytes', value: '2048' }]);
    // 60 small messages (~5 KB, ~1.7 KB per partition) and one big one (~5 KB); the configured
    // limit is larger than the topic's, so neither the relay's row check nor its split sees it:
    // only the broker's answer can tell which row is to blame
    const events: EventSpec[] = Array.from({ length: 60 }, (_, i) => ({ aggregatetype: 'small', aggregateid: `s-${i}`, payload: { i, pad: 'p'.repeat(20) } }));
    events.splice(10, 0, { aggregatetype: 'small', aggregateid: 'big', payload: { blob: 'x'.repeat(5_000) } });
    const ids = await insertEvents(sql, f.table, events);
    const s = await invoke({ ...f.env, OUTBOX_MAX_MESSAGE_BYTES: '1000000' });
    assert.equal(s.published, 60, JSON.stringify(s));
    assert.equal(s.parked, 1);
    const [row] = await sql.unsafe<{ attempts: number; parked: boolean; last_error: string }[]>(
      `SELECT attempts, parked_at IS NOT NULL AS parked, last_error FROM ${t(f.table)} WHERE id = $1`,
      [ids[10]!],
    );
    assert.deepEqual([row!.attempts, row!.parked], [1, true]);
    assert.match(row!.last_error, /MESSAGE_TOO_LARGE/);
    const msgs = await consumeAll([small], 60);
    const copies = assertCopies(msgs, await markedIds(sql, f.table), 2);
    assert.deepEqual(new Set(copies.keys()), new Set(ids.filter((_, i) => i !== 10)));
  });
});

describe('G6: a topic refused as a whole: backed off, no row charged, other topics flow', () => {
  it('a topic deleted in the middle of a backlog: its rows stay pending with attempts = 0, the other topic is delivered; recreated, everything is delivered, in order per aggregate (G4)', async () => {
    const f = await fixture(sql, 'deleted', ['gone', 'stay']);
    const events: EventSpec[] = Array.from({ length: 4_000 }, (_, i) => ({ aggregatetype: i % 2 ? 'stay' : 'gone', aggregateid: `${i % 2 ? 's' : 'g'}-${i % 40}`, payload: { i } }));
    const ids = await insertEvents(sql, f.table, events);
    const gone = new Set(ids.filter((_, i) => events[i]!.aggregatetype === 'gone'));
    const seqOf = new Map(ids.map((id, i) => [id, i]));
    // small batches, slowed down, so the topic goes away while the backlog is being relayed
    const run = startCli(['invoke', '--timeout', '60000'], { ...f.env, OUTBOX_BATCH_SIZE: '100', OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '100' });
    for (let sent = 0; sent < 600; await new Promise((r) => setTimeout(r, 20))) sent = (await markedIds(sql, f.table)).size;
    const admin = kafka.admin();
    await admin.connect();
    try {
      await admin.deleteTopics({ topics: [f.topic('gone')] });
    } finally {
      await admin.disconnect();
    }
    const res = await run.result;
    assert.equal(res.code, 0, `a backed-off topic does not fail the invocation:\n${res.stderr.slice(-3_000)}`);
    const s = res.summary!;
    assert.deepEqual(s.topicsBackedOff, [f.topic('gone')], JSON.stringify(s));
    assert.deepEqual([s.retried, s.parked], [0, 0]);
    assert.match(res.stderr, /topic refused by the broker/);

    const [charged] = await sql.unsafe<{ n: string }[]>(`SELECT count(*) AS n FROM ${t(f.table)} WHERE attempts > 0 OR parked_at IS NOT NULL`);
    assert.equal(Number(charged!.n), 0, 'no row charged or parked');
    const marked = await markedIds(sql, f.table);
    const stay = ids.filter((id) => !gone.has(id));
    assert.equal(stay.filter((id) => !marked.has(id)).length, 0, 'every row of the other topic was delivered in the same invocation');
    const goneLeft = [...gone].filter((id) => !marked.has(id));
    assert.ok(goneLeft.length > 0 && goneLeft.length < gone.size, `some rows of the deleted topic were sent before, the rest wait (${goneLeft.length} of ${gone.size})`);

    await createTopics([f.topic('gone')], 3);
    const after = await invoke(f.env, 60_000);
    assert.deepEqual(after.topicsBackedOff, []);
    assert.equal((await markedIds(sql, f.table)).size, ids.length, JSON.stringify(after));
    // the recreated topic holds exactly the rows that waited, in order per aggregate; the other topic holds every row
    const recreated = await consumeAll([f.topic('gone')], goneLeft.length);
    assert.deepEqual(new Set(copiesById(recreated).keys()), new Set(goneLeft));
    for (const [key, order] of firstCopyOrder(recreated, (id) => seqOf.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} in seq order`);
    assertCopies(await consumeAll([f.topic('stay')], stay.length), new Set(stay), 2);
  });
});
