// services: postgres, kafka
// Missing topics: a topic the broker does not have is a failure of the topic, not of its rows. It
// is backed off; its rows stay pending with no attempt charged however many invocations meet it;
// the rows to other topics in the same batch are acked and marked; once the topic exists, its rows
// are delivered. Guarantees: G6 (a missing topic blocks no one else and costs its rows nothing),
// G4 (an aggregate's later row waits behind its row to the missing topic), G1 (of a batch, only
// the acked rows are marked). Invocations run as real child processes of the CLI. A topic deleted
// in the middle of a backlog: publishing.test.ts.
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
  rowById,
  rowStates,
  topicCount,
  topicExists,
  type EventSpec,
  invokeOk as invoke,
} from './helpers.ts';

const sql = fileDb();

describe('G6: a missing topic is backed off, never charged to its rows', () => {
  it('a topic override naming a missing topic: the topic is backed off, its row stays pending with no attempt charged, whatever the number of invocations, and the later row of its aggregate waits behind it (G4); created, it is delivered', async () => {
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
      const [b1, good, b2] = await Promise.all(ids.map((id) => rowById(sql, f.table, id)));
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

  it('partial batch failure: rows to a good topic are acked and marked, the rows of the missing topic stay pending and uncharged, none of them marked (G1)', async () => {
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
    const states = await rowStates(sql, f.table);
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
