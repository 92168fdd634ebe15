// services: postgres, kafka
// Rows a producer could abuse (src/loop/row-rules.ts, docs/security.md): a topic outside
// OUTBOX_TOPIC_PREFIX, chosen through the row's `topic` column or through the template's
// placeholder; a reserved header (`__TypeId__`); more headers, or more header bytes, than the
// limits. Each such row is parked at once with its rule and setting named and never reaches Kafka
// (the foreign topics exist, and the relay's principal may write them: only the rule stops the
// row), while the other rows of its batch are delivered (G6); its aggregate's later rows wait
// behind it (G4). Invocations run as real child processes of the CLI.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  consumeAll,
  createTopics,
  fileDb,
  fixture,
  idsOf,
  insertEvents,
  outboxTableOf,
  rowById,
  rowStates,
  runCli,
  topicCount,
  type EventSpec,
  type Fixture,
  invokeOk as invoke,
} from './helpers.ts';

const sql = fileDb();

/** Insert `events` in order, then give the rows that have them their `headers` (insertEvents writes none). */
async function insertWithHeaders(f: Fixture, events: Array<EventSpec & { headers?: Record<string, unknown> }>): Promise<string[]> {
  const ids = await insertEvents(sql, f.table, events);
  for (const [i, e] of events.entries()) {
    if (e.headers) await sql.unsafe(`UPDATE ${outboxTableOf(f.table)} SET headers = $1::text::jsonb WHERE id = $2`, [JSON.stringify(e.headers), ids[i]!]);
  }
  return ids;
}

/** A topic outside the fixture's prefix that exists, so that a row sent to it would be appended. */
async function foreignTopic(f: Fixture): Promise<string> {
  const topic = `other.${f.table}.payments`;
  await createTopics([topic], 1);
  return topic;
}

async function assertParkedAtOnce(f: Fixture, id: string, error: RegExp): Promise<void> {
  const row = await rowById(sql, f.table, id);
  assert.deepEqual([row.parked, row.sent, row.attempts], [true, false, 1], 'parked at the first attempt, not after OUTBOX_MAX_ATTEMPTS');
  assert.match(row.last_error ?? '', error);
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

describe('G6: a row cannot publish outside OUTBOX_TOPIC_PREFIX', () => {
  it('through its topic column (prefix unset: the template\'s start): parked at once naming the rule and the setting, nothing on the foreign topic; the batch\'s other rows delivered; its aggregate\'s later row waits behind it (G4)', async () => {
    const f = await fixture(sql, 'prefixcol');
    const foreign = await foreignTopic(f);
    const near = `${f.prefix}x`;
    await createTopics([near], 1);
    const ids = await insertWithHeaders(f, [
      { aggregateid: 'a', type: 'A1' },
      { aggregateid: 'bad', type: 'B1', topic: foreign },
      { aggregateid: 'b', type: 'B' },
      { aggregateid: 'bad', type: 'B2' },
      // one character short of the prefix (its final dot): outside too
      { aggregateid: 'near', type: 'N1', topic: near },
      { aggregateid: 'a', type: 'A2' },
    ]);
    const s = await invoke(f.env);
    assert.equal(s.published, 3, JSON.stringify(s));
    assert.equal(s.parked, 2);
    const rule = new RegExp(`breaks the topic-prefix rule: every topic must start with OUTBOX_TOPIC_PREFIX "${escape(f.prefix)}\\."`);
    await assertParkedAtOnce(f, ids[1]!, new RegExp(`^topic "${escape(foreign)}" ${rule.source}`));
    await assertParkedAtOnce(f, ids[4]!, rule);
    const held = await rowById(sql, f.table, ids[3]!);
    assert.deepEqual([held.sent, held.attempts], [false, 0], 'the later row of its aggregate waits behind it, uncharged (hold)');
    const msgs = await consumeAll([f.topic('order')], 3);
    assert.deepEqual(idsOf(msgs).sort(), [ids[0], ids[2], ids[5]].sort(), 'the other aggregates were delivered');
    assert.equal(await topicCount([foreign, near]), 0, 'nothing reached the topics outside the prefix');
  });

  it('through the template\'s placeholder ({aggregatetype}, with OUTBOX_TOPIC_PREFIX): parked at once, the others delivered; without the prefix the relay refuses to start (G8)', async () => {
    const f = await fixture(sql, 'prefixtpl');
    const foreign = await foreignTopic(f);
    const env = { ...f.env, OUTBOX_TOPIC_TEMPLATE: '{aggregatetype}', OUTBOX_TOPIC_PREFIX: `${f.prefix}.` };
    const ids = await insertEvents(sql, f.table, [
      { aggregatetype: f.topic('order'), aggregateid: 'a' },
      { aggregatetype: foreign, aggregateid: 'bad' },
      { aggregatetype: '__consumer_offsets', aggregateid: 'worse' },
      { aggregatetype: f.topic('order'), aggregateid: 'b' },
    ]);

    const { OUTBOX_TOPIC_PREFIX: _, ...unprefixed } = env;
    const refused = await runCli(['invoke'], unprefixed);
    assert.equal(refused.code, 2, refused.stderr); // a configuration error: exit 2 (docs/operations.md)
    assert.match(refused.stderr, /ConfigError: invalid configuration:\n {2}- OUTBOX_TOPIC_PREFIX is required when OUTBOX_TOPIC_TEMPLATE \("\{aggregatetype\}"\) starts with a placeholder/);
    assert.ok((await rowStates(sql, f.table)).every((r) => !r.sent && r.attempts === 0), 'nothing claimed without the prefix');

    const s = await invoke(env);
    assert.equal(s.published, 2, JSON.stringify(s));
    assert.equal(s.parked, 2);
    await assertParkedAtOnce(f, ids[1]!, new RegExp(`^topic "${escape(foreign)}" breaks the topic-prefix rule: .*OUTBOX_TOPIC_PREFIX "${escape(f.prefix)}\\."`));
    await assertParkedAtOnce(f, ids[2]!, /^topic "__consumer_offsets" breaks the topic-prefix rule/);
    assert.deepEqual(idsOf(await consumeAll([f.topic('order')], 2)).sort(), [ids[0], ids[3]].sort());
    assert.equal(await topicCount([foreign]), 0, 'nothing reached the foreign topic');
  });
});

describe('G6: a row\'s extra headers are limited by name, count and size', () => {
  it('a reserved header (__TypeId__), one header too many, headers a byte too large: each row parked at once naming its rule and setting; the rows beside them delivered with their headers; __TypeId__ allowed by name (OUTBOX_HEADERS_ALLOW_RESERVED) and the row put back', async () => {
    const f = await fixture(sql, 'headers');
    const env = { ...f.env, OUTBOX_HEADERS_MAX_COUNT: '3', OUTBOX_HEADERS_MAX_BYTES: '100' };
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    const ids = await insertWithHeaders(f, [
      { aggregateid: 'good', headers: { traceparent, tenant: 'acme' } },
      { aggregateid: 'typeid', headers: { traceparent, __TypeId__: 'com.example.Gadget' } },
      { aggregateid: 'many', headers: { a: '1', b: '2', c: '3', d: '4' } },
      // 4 + 96 = 100 bytes at the limit, 101 over it
      { aggregateid: 'at-limits', headers: { blob: 'x'.repeat(96), b: null, id: 'forged' } },
      { aggregateid: 'big', headers: { blob: 'x'.repeat(97) } },
      { aggregateid: 'plain' },
    ]);
    const s = await invoke(env);
    assert.equal(s.published, 3, JSON.stringify(s));
    assert.equal(s.parked, 3);
    await assertParkedAtOnce(f, ids[1]!, /^header "__TypeId__" breaks the reserved-header rule: .*OUTBOX_HEADERS_ALLOW_RESERVED/);
    await assertParkedAtOnce(f, ids[2]!, /^the row's 4 headers break the header-count rule: at most OUTBOX_HEADERS_MAX_COUNT=3 per row/);
    await assertParkedAtOnce(f, ids[4]!, /^the row's headers \(101 bytes of names and values\) break the header-size rule: at most OUTBOX_HEADERS_MAX_BYTES=100 per row/);

    const msgs = await consumeAll([f.topic('order')], 3);
    assert.deepEqual(idsOf(msgs).sort(), [ids[0], ids[3], ids[5]].sort());
    const good = msgs.find((m) => m.headers.id === ids[0])!;
    assert.deepEqual(good.headers, { traceparent, tenant: 'acme', id: ids[0], type: 'Happened' }, 'ordinary headers go through as written');
    assert.equal(msgs.find((m) => m.key === 'at-limits')!.headers.id, ids[3], 'a forged id is overridden, not counted');
    assert.ok(msgs.every((m) => !('__TypeId__' in m.headers)));

    // the operator decides consumers may see __TypeId__: allowed by name, the row put back
    const allowing = { ...env, OUTBOX_HEADERS_ALLOW_RESERVED: '__TypeId__' };
    const retry = await runCli(['parked', 'retry', ids[1]!, '--reason', '__TypeId__ now allowed'], allowing);
    assert.equal(retry.code, 0, retry.stderr);
    const s2 = await invoke(allowing);
    assert.equal(s2.published, 1, JSON.stringify(s2));
    const again = await consumeAll([f.topic('order')], 4);
    assert.equal(again.find((m) => m.headers.id === ids[1])?.headers.__TypeId__, 'com.example.Gadget', JSON.stringify(again));
    assert.deepEqual((await rowStates(sql, f.table)).filter((r) => r.parked).map((r) => r.id).sort(), [ids[2], ids[4]].sort(), 'the other rules still hold');
  });
});
