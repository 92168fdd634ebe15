import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CloudEvent, Kafka, type KafkaMessage } from 'cloudevents';
import { DEFAULT_ROUTER, NO_METADATA, claimColumns, relayHeaders, topicFor, type Metadata, type OutboxRow, type RouterOptions } from '../../src/domain.ts';
import { tracingSpanContext } from '../../src/outbox/enqueue.ts';
import { MessageRejectedError } from '../../src/errors.ts';
import { BATCH_OVERHEAD_BYTES, compactJson, compressionSlack, createdAtMs, encodedSize, javaDouble, javaProperties, recordBytes, splitBySize, toMessage, traceContext } from '../../src/kafka/message.ts';
import type { OutboundMessage } from '../../src/loop/ports.ts';
import { brokenRule } from '../../src/loop/row-rules.ts';

const row: OutboxRow = {
  seq: '7',
  id: '4c2b6b7e-7d8a-4c55-9a52-0d5f3c1e9a10',
  aggregatetype: 'order',
  aggregateid: 'order-1',
  type: 'OrderCreated',
  payload: '{"total":42}',
  topic: null,
  headers: { traceparent: '00-abc', tenant: 7, type: 'spoofed', id: 'spoofed', skip: null },
  attempts: 0,
};

describe('row → message', () => {
  it('keys by aggregate, keeps the payload text, sets id and type headers that rows cannot override', () => {
    const m = toMessage(row, 'outbox.event.{aggregatetype}');
    assert.equal(m.topic, 'outbox.event.order');
    assert.equal(m.key, 'order-1');
    assert.equal(m.value, '{"total":42}');
    assert.deepEqual(m.headers, { traceparent: '00-abc', tenant: '7', id: row.id, type: 'OrderCreated' });
  });

  it('routes by template or the row override', () => {
    assert.equal(topicFor(row, 'x.{aggregatetype}.{type}'), 'x.order.OrderCreated');
    assert.equal(topicFor({ ...row, topic: 'special' }, 'x.{aggregatetype}'), 'special');
  });

  it('rejects illegal topic names as the row\'s own fault', () => {
    assert.throws(() => toMessage({ ...row, topic: 'bad topic!' }, 'x'), MessageRejectedError);
    assert.throws(() => toMessage({ ...row, aggregatetype: 'a/b' }, 'outbox.event.{aggregatetype}'), /not a legal Kafka topic name/);
  });

  it('estimates the encoded size from key, value and headers', () => {
    const small = encodedSize(toMessage(row, 't'));
    const big = encodedSize(toMessage({ ...row, payload: JSON.stringify('x'.repeat(10_000)) }, 't'));
    assert.ok(big - small >= 9_900);
    assert.ok(small < 300);
  });
});

describe('splitBySize', () => {
  const msg = (seq: number, bytes: number): OutboundMessage => ({ seq: String(seq), aggregateid: 'a', topic: 't', key: 'a', value: 'v'.repeat(bytes), headers: {} });

  it('keeps the order and puts every message in exactly one send', () => {
    const msgs = Array.from({ length: 50 }, (_, i) => msg(i, 100 + i * 7));
    const sends = splitBySize(msgs, 1_000);
    assert.deepEqual(sends.flat().map((m) => m.seq), msgs.map((m) => m.seq));
  });

  it('no send is over the limit, batch header included, however many messages share it', () => {
    const msgs = Array.from({ length: 150 }, (_, i) => msg(i, 1_000));
    const limit = 100_000;
    const sends = splitBySize(msgs, limit);
    assert.ok(sends.length >= 2);
    for (const s of sends) assert.ok(BATCH_OVERHEAD_BYTES + s.reduce((n, m) => n + recordBytes(m), 0) <= limit);
    // and each send is as full as the limit allows: adding the next message would cross it
    for (let i = 0; i < sends.length - 1; i++) {
      const bytes = BATCH_OVERHEAD_BYTES + sends[i]!.reduce((n, m) => n + recordBytes(m), 0);
      assert.ok(bytes + recordBytes(sends[i + 1]![0]!) > limit);
    }
  });

  it('a message over the limit on its own travels alone (the per-row check decides about it)', () => {
    const sends = splitBySize([msg(1, 10), msg(2, 5_000), msg(3, 10)], 1_000);
    assert.deepEqual(sends.map((s) => s.map((m) => m.seq)), [['1'], ['2'], ['3']]);
  });

  it('record bytes bound what the broker stores: key, value, headers', () => {
    const m: OutboundMessage = { seq: '1', aggregateid: 'k', topic: 't', key: 'key', value: 'é', headers: { id: 'x' } };
    assert.equal(recordBytes(m), 21 + 3 + 2 + (2 + 1 + 10));
    assert.equal(encodedSize(m), BATCH_OVERHEAD_BYTES + recordBytes(m));
  });
});

describe('row → message: edges', () => {
  it('drops null and undefined headers, serialises non-string ones as JSON', () => {
    const m = toMessage({ ...row, headers: { a: undefined, b: null, c: { x: 1 }, d: false, e: 'text' } }, 't');
    assert.deepEqual(m.headers, { c: '{"x":1}', d: 'false', e: 'text', id: row.id, type: 'OrderCreated' });
  });

  it('quotes at most 300 characters of an illegal topic in the error', () => {
    const topic = 'x'.repeat(250) + 'y'.repeat(100);
    assert.throws(
      () => toMessage({ ...row, topic }, 't'),
      (err: Error) => err.message.startsWith(`topic ${JSON.stringify(topic.slice(0, 300))} is not a legal Kafka topic name`),
    );
  });

  it('accepts a topic of 249 legal characters, refuses 250', () => {
    assert.equal(toMessage({ ...row, topic: 'a'.repeat(249) }, 't').topic, 'a'.repeat(249));
    assert.throws(() => toMessage({ ...row, topic: 'a'.repeat(250) }, 't'), MessageRejectedError);
  });

  it('a null value (tombstone) counts no value bytes', () => {
    const m: OutboundMessage = { seq: '1', aggregateid: 'k', topic: 't', key: 'key', value: null, headers: {} };
    assert.equal(recordBytes(m), 21 + 3);
  });
});

describe('splitBySize: edges', () => {
  const msg = (seq: number, bytes: number): OutboundMessage => ({ seq: String(seq), aggregateid: 'a', topic: 't', key: 'a', value: 'v'.repeat(bytes), headers: {} });

  it('no messages: no sends', () => {
    assert.deepEqual(splitBySize([], 1_000), []);
  });

  it('a first message over the limit is sent alone, never after an empty send', () => {
    assert.deepEqual(splitBySize([msg(1, 5_000)], 1_000).map((s) => s.map((m) => m.seq)), [['1']]);
    assert.deepEqual(splitBySize([msg(1, 5_000), msg(2, 10)], 1_000).map((s) => s.map((m) => m.seq)), [['1'], ['2']]);
  });

  it('a send may be exactly at the limit', () => {
    const [a, b] = [msg(1, 100), msg(2, 200)];
    const exact = BATCH_OVERHEAD_BYTES + recordBytes(a) + recordBytes(b);
    assert.deepEqual(splitBySize([a, b], exact).map((s) => s.length), [2]);
    assert.deepEqual(splitBySize([a, b], exact - 1).map((s) => s.length), [1, 1]);
  });
});

describe('compressionSlack', () => {
  it('5 bytes per started 16 KiB block plus 32 for the gzip header and trailer', () => {
    assert.equal(compressionSlack(1), 37);
    assert.equal(compressionSlack(16_384), 37);
    assert.equal(compressionSlack(16_385), 42);
    assert.equal(compressionSlack(1_048_576), 64 * 5 + 32);
  });
});

describe('row → message: consumer metadata (OUTBOX_METADATA)', () => {
  const created = new Date('2026-12-03T04:05:06.789Z');
  // as the claim reads created_at: extract(epoch FROM created_at)::text (claimColumns)
  const traced = { ...row, created_epoch: '1796270706.789000', tracingspancontext: null as string | null };
  const all: Metadata = { timestamp: true, seq: true, trace: true, cloudEventsSource: '/orders-service' };
  const PARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

  it('none by default: no timestamp of its own (the send time), no header beyond id, type and the row\'s', () => {
    const m = toMessage(traced, 't');
    assert.equal(m.timestamp, undefined);
    assert.deepEqual(Object.keys(m.headers).sort(), ['id', 'tenant', 'traceparent', 'type']);
  });

  it('timestamp: the record\'s CreateTime is the row\'s created_at, in milliseconds', () => {
    assert.equal(toMessage(traced, 't', { ...NO_METADATA, timestamp: true }).timestamp, created.getTime());
    assert.throws(() => toMessage(row, 't', { ...NO_METADATA, timestamp: true }), /row 7 has no created_at/);
  });

  it('seq: the row\'s position as a header, which the row\'s own `seq` header cannot override', () => {
    const m = toMessage({ ...traced, headers: { seq: '999' } }, 't', { ...NO_METADATA, seq: true });
    assert.equal(m.headers.seq, '7');
  });

  it('trace: traceparent and tracestate from Debezium\'s column (Java properties, as its extension stores them), or a bare traceparent', () => {
    const trace = { ...NO_METADATA, trace: true };
    const debezium = `#Thu Dec 03 04:05:06 UTC 2026\ntraceparent=${PARENT}\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\n`;
    assert.deepEqual(pick(toMessage({ ...traced, tracingspancontext: debezium }, 't', trace)), { traceparent: PARENT, tracestate: 'rojo=00f067aa0ba902b7,congo=t61rcWkgMzE' });
    assert.deepEqual(pick(toMessage({ ...traced, tracingspancontext: ` ${PARENT}\n` }, 't', trace)), { traceparent: PARENT });
    assert.deepEqual(pick(toMessage({ ...traced, tracingspancontext: `traceparent : ${PARENT}` }, 't', trace)), { traceparent: PARENT });
  });

  it('trace: none for a row without trace context or with an invalid one; the row\'s own trace headers never pass', () => {
    const trace = { ...NO_METADATA, trace: true };
    for (const column of [null, '', 'tracestate=a=b', 'traceparent=00-abc', `traceparent=00-${'0'.repeat(32)}-00f067aa0ba902b7-01`, `traceparent=ff${PARENT.slice(2)}`]) {
      assert.deepEqual(pick(toMessage({ ...traced, headers: { traceparent: PARENT, tracestate: 'x=y' }, tracingspancontext: column }, 't', trace)), {}, String(column));
    }
  });

  it('cloudevents: the binary-mode headers of the CloudEvents Kafka binding', () => {
    const m = toMessage(traced, 't', { ...NO_METADATA, cloudEventsSource: '/orders-service' });
    assert.deepEqual(Object.fromEntries(Object.entries(m.headers).filter(([k]) => k.startsWith('ce_') || k === 'content-type')), {
      ce_specversion: '1.0',
      ce_id: row.id,
      ce_source: '/orders-service',
      ce_type: 'OrderCreated',
      ce_time: '2026-12-03T04:05:06.789Z',
      ce_subject: 'order-1',
      'content-type': 'application/json',
    });
  });

  it('created_at as the claim reads it (Postgres\' extract(epoch)): exact milliseconds whatever the year, floored before 1970; ±infinity and times beyond JavaScript\'s dates are no time', () => {
    const at = (created_epoch: string) => createdAtMs({ ...row, created_epoch });
    assert.equal(at('1796270706.789000'), Date.parse('2026-12-03T04:05:06.789Z'));
    assert.equal(at('1796270706.789999'), Date.parse('2026-12-03T04:05:06.789Z'), 'microseconds truncated, as ISO text keeps milliseconds');
    assert.equal(at('1796270706'), Date.parse('2026-12-03T04:05:06.000Z'), 'PG 13\'s float8 prints a whole second bare');
    assert.equal(at('1e-06'), 0, 'or in exponent form');
    // new Date('0050-06-01 00:00:00+00'), postgres.js' parse of timestamptz text, is 1950: not here
    assert.equal(new Date(at('-60589296000.000000')).toISOString(), '0050-01-01T00:00:00.000Z');
    assert.equal(at('-1.500000'), -1500);
    assert.equal(at('-1.500001'), -1501, 'a fraction of a millisecond before 1970 is the millisecond before');
    assert.equal(new Date(at('253402300800.000000')).getUTCFullYear(), 10000);
    for (const none of ['Infinity', '-Infinity', 'NaN', '9224318016000.000000', '', 'x']) assert.ok(Number.isNaN(at(none)), none);
    assert.throws(() => at(undefined as unknown as string), /row 7 has no created_at: the claim must read it/);
  });

  it('G6: a created_at that no record can carry parks its row, naming the column and the setting: ±infinity, a year beyond 9999 or before 0 (cloudevents), before 1970 or ±infinity (timestamp)', () => {
    const ce = { ...NO_METADATA, cloudEventsSource: '/orders-service' };
    const ts = { ...NO_METADATA, timestamp: true };
    const parks = (created_epoch: string, metadata: Metadata, reason: RegExp) => {
      assert.throws(() => toMessage({ ...traced, created_epoch }, 't', metadata), (err: unknown) => {
        assert.ok(err instanceof MessageRejectedError && err.permanent, `parked at once: ${String(err)}`);
        assert.match(err.message, /^created_at \(/);
        assert.match(err.message, reason);
        return true;
      }, `${created_epoch} ${JSON.stringify(metadata)}`);
    };
    for (const v of ['Infinity', '-Infinity', '253402300800.000000', '-62167219200.001000']) parks(v, ce, /ce_time is RFC 3339, a time of the years 0000 to 9999 \(OUTBOX_METADATA=cloudevents\)/);
    for (const v of ['Infinity', '-Infinity']) parks(v, ts, /is not a time a Kafka record timestamp \(OUTBOX_METADATA=timestamp\) can hold/);
    parks('-0.001000', ts, /before 1970-01-01, and a Kafka record timestamp \(OUTBOX_METADATA=timestamp\) cannot be negative/);
    // the edges that are times: year 0000 and 9999 (RFC 3339's four digits), 1970 itself, year 10000 as a record timestamp
    assert.equal(toMessage({ ...traced, created_epoch: '-62167219200.000000' }, 't', ce).headers.ce_time, '0000-01-01T00:00:00.000Z');
    assert.equal(toMessage({ ...traced, created_epoch: '253402300799.999999' }, 't', ce).headers.ce_time, '9999-12-31T23:59:59.999Z');
    assert.equal(toMessage({ ...traced, created_epoch: '0' }, 't', ts).timestamp, 0);
    assert.equal(toMessage({ ...traced, created_epoch: '253402300800.000000' }, 't', ts).timestamp, 253402300800000);
  });

  it('G6, cloudevents: an empty type or aggregateid, or one holding a character CloudEvents forbids, parks its row naming the column and the attribute; every other row gives headers the cloudevents package validates', () => {
    const ce = { ...NO_METADATA, cloudEventsSource: 'urn:example:orders' };
    const cases: Array<[Partial<OutboxRow>, RegExp]> = [
      [{ type: '' }, /^type is empty, and CloudEvents' ce_type must be a non-empty string \(OUTBOX_METADATA=cloudevents\)/],
      [{ aggregateid: '' }, /^aggregateid is empty, and CloudEvents' ce_subject must be a non-empty string/],
      [{ type: 'Order\nCreated' }, /^type holds U\+000A, a character CloudEvents' ce_type may not hold/],
      [{ aggregateid: 'o\u0085' }, /^aggregateid holds U\+0085/],
      [{ type: 'x\ufdd0' }, /^type holds U\+FDD0/],
      [{ aggregateid: 'x\u{10ffff}' }, /^aggregateid holds U\+10FFFF/],
    ];
    for (const [change, reason] of cases) {
      assert.throws(() => toMessage({ ...traced, ...change }, 't', ce), (err: unknown) => err instanceof MessageRejectedError && err.permanent && reason.test(err.message), JSON.stringify(change));
    }
    for (const change of [{}, { type: 'ü.😀 type', aggregateid: ' ' }, { created_epoch: '-62167219200.000000' }, { created_epoch: '253402300799.999999' }]) {
      const m = toMessage({ ...traced, ...change }, 't', ce);
      const event = Kafka.toEvent({ key: m.key, value: m.value, headers: m.headers } as KafkaMessage<string>) as CloudEvent<unknown>;
      assert.equal(event.validate(), true, JSON.stringify(change));
    }
  });

  it('relayHeaders names exactly the headers the relay writes: the row\'s own of those names are replaced and not counted by the row rules', () => {
    const full = { ...traced, headers: null, tracingspancontext: `traceparent=${PARENT}\ntracestate=a=b` };
    for (const metadata of [NO_METADATA, { ...NO_METADATA, seq: true }, all]) {
      assert.deepEqual(Object.keys(toMessage(full, 't', metadata).headers).sort(), [...relayHeaders(metadata)].sort());
    }
    // a row at its limits (one header of 11 bytes) whose spoofed relay headers would break both
    const spoofed = Object.fromEntries(relayHeaders(all).map((name) => [name, 'x'.repeat(100)]));
    const rules = { topicPrefix: 't', reservedHeadersAllowed: [], maxHeaders: 1, maxHeaderBytes: 11, relayHeaders: relayHeaders(all) };
    assert.equal(brokenRule(toMessage({ ...full, headers: { ...spoofed, tenant: '12345' } }, 't', all), rules), undefined);
    assert.match(brokenRule(toMessage({ ...full, headers: { tenant: '12345', b: '1' } }, 't', all), rules)?.message ?? '', /header-count rule/);
  });

  it('counts a timestamp\'s delta at its widest in the record\'s size bound', () => {
    const plain = toMessage(traced, 't');
    assert.equal(recordBytes({ ...plain, timestamp: created.getTime() }) - recordBytes(plain), 9);
  });
});

describe('trace context as enqueue() writes it and the relay reads it', () => {
  it('round-trips through Debezium\'s properties format, escapes included', () => {
    const context = { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', tracestate: 'rojo=00f067aa0ba902b7,congo=t61r:c#W!k\\z' };
    const text = tracingSpanContext(context);
    assert.equal(text, 'traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61r\\:c\\#W\\!k\\\\z\n');
    assert.deepEqual(Object.fromEntries(javaProperties(text)), context);
    assert.deepEqual(traceContext(tracingSpanContext({ traceparent: context.traceparent })), { traceparent: context.traceparent });
  });

  it('reads java.util.Properties text: comments, separators, continuation lines, unicode escapes', () => {
    const text = '# comment\n! another\n  a = 1\nb:2\nc 3\nd=x\\\n   y\ne=\\u0041\\tB\nf\n';
    assert.deepEqual(Object.fromEntries(javaProperties(text)), { a: '1', b: '2', c: '3', d: 'xy', e: 'A\tB', f: '' });
  });
});

function pick(m: OutboundMessage): Record<string, string> {
  return Object.fromEntries(Object.entries(m.headers).filter(([k]) => k === 'traceparent' || k === 'tracestate'));
}

describe('row → message: Debezium router options (docs/debezium.md)', () => {
  const router = (over: Partial<RouterOptions>): Metadata => ({ ...NO_METADATA, router: { ...DEFAULT_ROUTER, ...over } });
  const plain = { ...row, headers: null, payload: '{"total": 42, "note": "a b, c: d \\" e"}' };

  it('defaults are today\'s messages: key aggregateid, id as text, type placed as a header, the payload as stored', () => {
    assert.deepEqual(toMessage(plain, 't', router({})), toMessage(plain, 't'));
    assert.deepEqual(toMessage(plain, 't').headers, { id: row.id, type: 'OrderCreated' });
  });

  it('table.field.event.key: the key from another column', () => {
    assert.equal(toMessage(plain, 't', router({ key: 'id' })).key, row.id);
    assert.equal(toMessage(plain, 't', router({ key: 'type' })).key, 'OrderCreated');
  });

  it('placement none: no type header, and a row\'s own type header then passes (it is no longer the relay\'s)', () => {
    const m = toMessage({ ...row, headers: { type: 'mine' } }, 't', router({ placement: [] }));
    assert.deepEqual(m.headers, { id: row.id, type: 'mine' });
    assert.deepEqual(relayHeaders(router({ placement: [] })), ['id']);
  });

  it('placement: columns to headers under their alias (a NULL one absent), and to the envelope as JSON', () => {
    const placed: OutboxRow = { ...plain, placed: { tenant: 'acme ✓', region: null } };
    const m = toMessage(placed, 't', router({
      placement: [
        { column: 'type', place: 'header', alias: 'eventType' },
        { column: 'tenant', place: 'header', alias: 'tenant' },
        { column: 'region', place: 'header', alias: 'region' },
        { column: 'aggregatetype', place: 'envelope', alias: 'aggregateType' },
        { column: 'region', place: 'envelope', alias: 'region' },
      ],
    }));
    assert.deepEqual(m.headers, { id: row.id, eventType: 'OrderCreated', tenant: 'acme ✓' });
    assert.equal(m.value, `{"payload":${JSON.stringify(plain.payload)},"aggregateType":"order","region":null}`);
    assert.deepEqual(relayHeaders(router({ placement: [{ column: 'tenant', place: 'header', alias: 'tenant' }] })), ['id', 'tenant']);
  });

  it('placement: a placed column over 1,024 characters parks its row (the claim reads 1,025 of it)', () => {
    const r = router({ placement: [{ column: 'tenant', place: 'header', alias: 'tenant' }] });
    assert.equal(toMessage({ ...plain, placed: { tenant: '😀'.repeat(1024) } }, 't', r).headers.tenant, '😀'.repeat(1024));
    assert.throws(() => toMessage({ ...plain, placed: { tenant: 'x'.repeat(1025) } }, 't', r), (e: unknown) =>
      e instanceof MessageRejectedError && e.permanent && /column tenant holds more than 1024 characters/.test(e.message));
    assert.deepEqual(claimColumns(r), [`json_build_object('tenant', left("tenant"::text, 1025)) AS placed`]);
    assert.deepEqual(claimColumns(router({})), [], 'the default claim reads nothing more');
  });

  it('table.expand.json.payload: the payload without whitespace between tokens, strings untouched; in the envelope as JSON', () => {
    assert.equal(toMessage(plain, 't', router({ expandPayload: true })).value, '{"total":42,"note":"a b, c: d \\" e"}');
    assert.equal(compactJson('[1, {"a": "\\\\", "b": [ ]}, "x"]'), '[1,{"a":"\\\\","b":[]},"x"]');
    // a number with a fraction or exponent as the Java double Debezium parsed it into; integers and strings as printed
    assert.equal(compactJson('{"a": 12.50, "b": [2.0, -3.25e3, 10000000.0, 0.0001, 123456789012345678901], "c": "1.50 \\" x"}'),
      '{"a":12.5,"b":[2.0,-3250.0,1.0E7,1.0E-4,123456789012345678901],"c":"1.50 \\" x"}');
    // members whose value is null are dropped, as Debezium's expansion does; nulls in arrays stay
    assert.equal(compactJson('{"a": null, "b": {"c": null}, "d": [null], "e": "f: null", "g": null}'), '{"b":{},"d":[null],"e":"f: null"}');
    // one pass, joined every 8,192 tokens: members dropped at every place a join falls (a comma held across one)
    const member = (i: number) => [`{"a": null, "b": ${i}.50, "c": null}`, '{"b": 1.50}', `{"x": null}`, `[null, {"d": "n\\"ull", "e": null}]`][i % 4]!;
    const expanded = (i: number) => ['{"b":' + `${i}.5}`, '{"b":1.5}', '{}', '[null,{"d":"n\\"ull"}]'][i % 4]!;
    const n = 20_000;
    assert.equal(compactJson(`{"items": [${Array.from({ length: n }, (_, i) => member(i)).join(', ')}], "z": null}`), `{"items":[${Array.from({ length: n }, (_, i) => expanded(i)).join(',')}]}`);
    assert.deepEqual([0, 1, 0.001, 9999999.5, 1e7, 1.5e-4, 1e21, -2.5].map(javaDouble), ['0.0', '1.0', '0.001', '9999999.5', '1.0E7', '1.5E-4', '1.0E21', '-2.5']);
    const m = toMessage(plain, 't', router({ expandPayload: true, placement: [{ column: 'type', place: 'envelope', alias: 'eventType' }] }));
    assert.equal(m.value, '{"payload":{"total":42,"note":"a b, c: d \\" e"},"eventType":"OrderCreated"}');
    assert.equal(toMessage({ ...plain, payload: null }, 't', router({ expandPayload: true })).value, null);
    // only an object or an array is expanded: any other payload stays its JSON text, which JsonConverter writes as a string
    assert.equal(toMessage({ ...plain, payload: '"a ✓"' }, 't', router({ expandPayload: true })).value, '"\\"a ✓\\""');
    assert.equal(toMessage({ ...plain, payload: '[1.50, {"a": null}]' }, 't', router({ expandPayload: true })).value, '[1.5,{}]');
    // as Jackson writes JSON (Connect's JsonConverter): beyond the BMP, escaped UTF-16 surrogates
    const emoji = { ...plain, payload: '{"a": "é 😀"}' };
    assert.equal(toMessage(emoji, 't', router({ expandPayload: true })).value, '{"a":"é \\uD83D\\uDE00"}');
    const inEnvelope = router({ placement: [{ column: 'type', place: 'envelope', alias: 't' }] });
    assert.equal(toMessage(emoji, 't', inEnvelope).value, '{"payload":"{\\"a\\": \\"é \\uD83D\\uDE00\\"}","t":"OrderCreated"}');
    assert.equal(toMessage(emoji, 't').value, '{"a": "é 😀"}', 'not expanded: as stored');
  });

  it('the router\'s headers (id, placed ones) as text, or as JSON strings (Connect\'s JsonConverter as header converter); the row\'s own as they are', () => {
    const m = toMessage({ ...plain, headers: { own: 'x' }, type: 'Geändert 😀' }, 't', router({ headerFormat: 'json' }));
    assert.deepEqual(m.headers, { own: 'x', id: `"${row.id}"`, type: '"Geändert \\uD83D\\uDE00"' });
    const tenant = router({ headerFormat: 'json', placement: [{ column: 'tenant', place: 'header', alias: 'tenant' }] });
    assert.equal(toMessage({ ...plain, placed: { tenant: null } }, 't', tenant).headers.tenant, 'null', 'a NULL column: JSON\'s null');
  });
});
