// services: postgres, kafka
// What consumers read besides the row (OUTBOX_METADATA, docs/configuration.md "Consumer
// metadata"), read back from the broker: the record's timestamp from created_at, the `seq` header,
// W3C trace context from the tracingspancontext column (as enqueue() and Debezium write it, a bare
// traceparent, none), and CloudEvents' binary-mode headers, decoded and validated by the
// `cloudevents` package's own Kafka binding. Each option is off by default. Runs once per Kafka
// client (scripts/run-tests.ts passes): both must set the record's CreateTime.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Kafka, type CloudEvent, type KafkaMessage } from 'cloudevents';
import { parseTableName } from '../../src/domain.ts';
import { enqueue } from '../../src/outbox/enqueue.ts';
import { qualified } from '../../src/outbox/identifier.ts';
import { consumeAll, createTopics, fileDb, fixture, insertEvents, invokeOk as invoke, rowById, rowStates, type Consumed, type Fixture } from './helpers.ts';

const sql = fileDb();

const PARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const OTHER_PARENT = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00';
const STATE = 'rojo=00f067aa0ba902b7,congo=t61rcWkgMzE';

interface Written {
  id: string;
  seq: string;
  created_at: Date;
  payload: unknown;
}

/**
 * Four rows of one aggregate: created an hour ago, each earlier than the one before it (created_at
 * follows transaction start, not seq), with the headers a row could try to spoof the relay's with.
 * Row 0 carries trace context through enqueue() (Debezium's format), row 1 a bare traceparent,
 * row 2 none, row 3 Debezium's own text with its date comment.
 */
async function writeRows(f: Fixture): Promise<Written[]> {
  const table = qualified(parseTableName(f.table));
  await sql.begin(async (tx) => {
    await enqueue(tx, { aggregatetype: 'order', aggregateid: 'o-1', type: 'OrderPlaced', payload: { n: 0, name: 'Zoë' }, traceContext: { traceparent: PARENT, tracestate: STATE } }, { table: f.table });
  });
  await insertEvents(sql, f.table, [1, 2, 3].map((n) => ({ aggregateid: 'o-1', type: 'OrderPaid', payload: { n } })));
  await sql.unsafe(`UPDATE ${table} SET headers = '{"seq": "999", "traceparent": "${OTHER_PARENT}", "ce_id": "spoofed", "tenant": "acme"}'::jsonb`);
  await sql.unsafe(`UPDATE ${table} SET created_at = now() - interval '1 hour' - seq * interval '7.123 milliseconds'`);
  const seqs = await sql.unsafe<{ seq: string }[]>(`SELECT seq::text AS seq FROM ${table} ORDER BY seq`);
  await sql.unsafe(`UPDATE ${table} SET tracingspancontext = $1 WHERE seq = $2`, [` ${PARENT}\n`, seqs[1]!.seq]);
  await sql.unsafe(`UPDATE ${table} SET tracingspancontext = $1 WHERE seq = $2`, [`#Thu Dec 03 04:05:06 UTC 2026\ntraceparent=${OTHER_PARENT}\n`, seqs[3]!.seq]);
  return sql.unsafe<Written[]>(`SELECT id::text AS id, seq::text AS seq, created_at, payload FROM ${table} ORDER BY seq`);
}

/** The relay's messages for `rows`, by row, after one invocation with `metadata` (OUTBOX_METADATA). */
async function relay(f: Fixture, rows: Written[], env: Record<string, string>): Promise<Consumed[]> {
  const summary = await invoke({ ...f.env, ...env });
  assert.equal(summary.published, rows.length);
  const messages = await consumeAll([f.topic('order')], rows.length);
  assert.equal(messages.length, rows.length);
  return rows.map((r) => messages.find((m) => m.headers.id === r.id)!);
}

const only = (m: Consumed, names: string[]) => Object.fromEntries(Object.entries(m.headers).filter(([k]) => names.includes(k)));
const METADATA_HEADERS = ['traceparent', 'tracestate', 'ce_specversion', 'ce_id', 'ce_source', 'ce_type', 'ce_time', 'ce_subject', 'content-type'];

describe('consumer metadata, read back from Kafka', () => {
  it('none by default: the record\'s timestamp is the send time, and a row\'s own headers pass as they are (no seq, trace context or CloudEvents header of the relay\'s)', async () => {
    const f = await fixture(sql, 'meta_none', ['order'], 1);
    const rows = await writeRows(f);
    const sentAfter = Date.now();
    for (const [i, m] of (await relay(f, rows, {})).entries()) {
      assert.ok(Number(m.timestamp) >= sentAfter - 1_000, `row ${i}: send time, not created_at an hour ago`);
      assert.equal(m.headers.seq, '999', 'the row\'s own seq header');
      assert.deepEqual(only(m, METADATA_HEADERS), { traceparent: OTHER_PARENT, ce_id: 'spoofed' }, 'the row\'s own headers only');
    }
  });

  it('timestamp: each record\'s CreateTime is its row\'s created_at (ms), however created_at and seq disagree', async () => {
    const f = await fixture(sql, 'meta_ts', ['order'], 1);
    const rows = await writeRows(f);
    const messages = await relay(f, rows, { OUTBOX_METADATA: 'timestamp' });
    assert.deepEqual(messages.map((m) => Number(m.timestamp)), rows.map((r) => r.created_at.getTime()));
    assert.ok(messages.every((m) => m.headers.seq === '999' && m.headers.ce_specversion === undefined), 'no other metadata');
  });

  it('seq and trace: the row\'s position, and traceparent/tracestate from the column (enqueue()\'s, a bare one, none, Debezium\'s text); a row\'s own trace and seq headers never pass', async () => {
    const f = await fixture(sql, 'meta_trace', ['order'], 1);
    const rows = await writeRows(f);
    const [stored] = await sql.unsafe<{ tracingspancontext: string }[]>(`SELECT tracingspancontext FROM ${qualified(parseTableName(f.table))} WHERE id = $1`, [rows[0]!.id]);
    assert.equal(stored!.tracingspancontext, `traceparent=${PARENT}\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\n`, 'enqueue() writes Debezium\'s format');
    const messages = await relay(f, rows, { OUTBOX_METADATA: 'seq,trace' });
    assert.deepEqual(messages.map((m) => m.headers.seq), rows.map((r) => r.seq));
    assert.deepEqual(messages.map((m) => only(m, ['traceparent', 'tracestate'])), [
      { traceparent: PARENT, tracestate: STATE },
      { traceparent: PARENT },
      {},
      { traceparent: OTHER_PARENT },
    ]);
    assert.ok(messages.every((m, i) => m.headers.tenant === 'acme' && Number(m.timestamp) !== rows[i]!.created_at.getTime()), 'the row\'s other headers kept; no timestamp');
  });

  it('cloudevents: binary-mode headers that the cloudevents package\'s Kafka binding decodes into events that validate, with the row\'s id, type, aggregate, created_at and payload', async () => {
    const f = await fixture(sql, 'meta_ce', ['order'], 1);
    const rows = await writeRows(f);
    const messages = await relay(f, rows, { OUTBOX_METADATA: 'cloudevents', OUTBOX_CLOUDEVENTS_SOURCE: '/orders-service' });
    for (const [i, m] of messages.entries()) {
      const row = rows[i]!;
      assert.match(m.headers.ce_time ?? '', /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'RFC 3339');
      // binary mode: one event (a structured batch would decode into several)
      const event = Kafka.toEvent({ key: m.key!, value: m.value, headers: m.headers, timestamp: m.timestamp } as KafkaMessage<string>) as CloudEvent<unknown>;
      assert.equal(event.validate(), true);
      assert.deepEqual(
        { specversion: event.specversion, id: event.id, source: event.source, type: event.type, subject: event.subject, time: event.time, datacontenttype: event.datacontenttype, data: event.data },
        { specversion: '1.0', id: row.id, source: '/orders-service', type: i === 0 ? 'OrderPlaced' : 'OrderPaid', subject: 'o-1', time: row.created_at.toISOString(), datacontenttype: 'application/json', data: row.payload },
      );
    }
  });

  it('G6, timestamp: a row older than its topic\'s message.timestamp.before.max.ms is parked at once with the broker\'s INVALID_TIMESTAMP; the batch\'s other row is delivered', async () => {
    const f = await fixture(sql, 'meta_old', ['order'], 1);
    await createTopics([f.topic('late')], 1, [{ name: 'message.timestamp.before.max.ms', value: '600000' }]);
    const [old, fresh] = await insertEvents(sql, f.table, [{ aggregatetype: 'late', aggregateid: 'old-1' }, { aggregatetype: 'late', aggregateid: 'new-1' }]);
    await sql.unsafe(`UPDATE ${qualified(parseTableName(f.table))} SET created_at = now() - interval '1 hour' WHERE id = $1`, [old!]);
    const summary = await invoke({ ...f.env, OUTBOX_METADATA: 'timestamp' });
    assert.deepEqual([summary.published, summary.parked], [1, 1]);
    const row = await rowById(sql, f.table, old!);
    assert.deepEqual([row.parked, row.attempts], [true, 1]);
    assert.match(row.last_error ?? '', /INVALID_TIMESTAMP/);
    assert.deepEqual((await consumeAll([f.topic('late')], 1)).map((m) => m.headers.id), [fresh]);
  });

  it('G6, cloudevents: a row whose created_at is infinity, -infinity or in year 10000, or whose type or aggregateid is empty, is parked at once with its reason; the rows beside it are delivered as events that validate, and the invocation succeeds', async () => {
    const f = await fixture(sql, 'meta_ce_bad', ['order'], 1);
    const table = qualified(parseTableName(f.table));
    const ids = await insertEvents(sql, f.table, [
      { aggregateid: 'o-1', type: 'OrderPlaced' },
      { aggregateid: 'inf', type: 'OrderPlaced' },
      { aggregateid: 'inf', type: 'OrderPaid' },
      { aggregateid: 'o-2', type: 'OrderPlaced' },
      { aggregateid: 'minus-inf', type: 'OrderPlaced' },
      { aggregateid: 'y10k', type: 'OrderPlaced' },
      { aggregateid: 'no-type', type: '' },
      { aggregateid: '', type: 'OrderPlaced' },
      { aggregateid: 'o-3', type: 'OrderPlaced' },
    ]);
    const [good1, inf, infLater, good2, minusInf, y10k, noType, noSubject, good3] = ids as [string, string, string, string, string, string, string, string, string];
    await sql.unsafe(`UPDATE ${table} SET created_at = 'infinity' WHERE id = $1`, [inf]);
    await sql.unsafe(`UPDATE ${table} SET created_at = '-infinity' WHERE id = $1`, [minusInf]);
    await sql.unsafe(`UPDATE ${table} SET created_at = '10000-01-01 00:00:00+00' WHERE id = $1`, [y10k]);
    const summary = await invoke({ ...f.env, OUTBOX_METADATA: 'cloudevents', OUTBOX_CLOUDEVENTS_SOURCE: 'https://example.com/orders' });
    assert.deepEqual([summary.published, summary.parked], [3, 5]);
    const states = await rowStates(sql, f.table);
    const state = (id: string) => states.find((r) => r.id === id)!;
    const reasons: Array<[string, RegExp]> = [
      [inf, /^created_at \("Infinity" seconds since 1970.*gives no CloudEvents time: ce_time is RFC 3339/],
      [minusInf, /^created_at \("-Infinity" seconds since 1970.*ce_time is RFC 3339/],
      [y10k, /^created_at \("253402300800(\.0+)?" seconds since 1970.*a time of the years 0000 to 9999/],
      [noType, /^type is empty, and CloudEvents' ce_type must be a non-empty string/],
      [noSubject, /^aggregateid is empty, and CloudEvents' ce_subject must be a non-empty string/],
    ];
    for (const [id, reason] of reasons) {
      assert.deepEqual([state(id).parked, state(id).attempts], [true, 1], 'parked at once');
      assert.match(state(id).last_error ?? '', reason);
    }
    assert.deepEqual([state(infLater).sent, state(infLater).attempts], [false, 0], 'its aggregate\'s later row waits behind it (hold), uncharged');
    const messages = await consumeAll([f.topic('order')], 3);
    assert.deepEqual(messages.map((m) => m.headers.id), [good1, good2, good3]);
    for (const m of messages) {
      const event = Kafka.toEvent({ key: m.key!, value: m.value, headers: m.headers, timestamp: m.timestamp } as KafkaMessage<string>) as CloudEvent<unknown>;
      assert.equal(event.validate(), true);
    }
  });
});
