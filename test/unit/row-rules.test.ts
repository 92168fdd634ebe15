// What a row may choose (src/loop/row-rules.ts): the topic prefix, the reserved header names, the
// header count and size; and their settings (src/config/load.ts). How a row breaking one is parked
// while its batch is delivered: test/integration/row-rules.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { RELAY_HEADERS, templateHead, type OutboxRow } from '../../src/domain.ts';
import { ConfigError } from '../../src/errors.ts';
import { toMessage } from '../../src/kafka/message.ts';
import type { RowRules } from '../../src/domain.ts';
import { brokenRule } from '../../src/loop/row-rules.ts';

const rules: RowRules = { topicPrefix: 'acme.', reservedHeadersAllowed: [], maxHeaders: 3, maxHeaderBytes: 40 };
const row = (over: Partial<OutboxRow> = {}): OutboxRow => ({
  seq: '1', id: 'id-1', aggregatetype: 'order', aggregateid: 'o-1', type: 'OrderPaid', payload: '{}', topic: null, headers: null, attempts: 0, ...over,
});
const check = (over: Partial<OutboxRow>, r: RowRules = rules, template = 'acme.{aggregatetype}') => brokenRule(toMessage(row(over), template), r);

describe('brokenRule: the topic prefix', () => {
  it('a topic from the template or the row\'s own topic passes when it starts with the prefix', () => {
    assert.equal(check({}), undefined);
    assert.equal(check({ topic: 'acme.payments' }), undefined);
    assert.equal(check({ topic: 'acme.' }), undefined, 'the prefix alone is a topic inside it');
  });

  it('G6: a topic outside the prefix, chosen by the topic column or by the template\'s placeholders, breaks the rule, permanently, naming the topic, the rule and the setting', () => {
    for (const [over, template, topic] of [
      [{ topic: 'payments.refunds' }, 'acme.{aggregatetype}', 'payments.refunds'],
      [{ topic: '__consumer_offsets' }, 'acme.{aggregatetype}', '__consumer_offsets'],
      [{ topic: 'acm.x' }, 'acme.{aggregatetype}', 'acm.x'],
      [{ aggregatetype: 'connect-configs' }, '{aggregatetype}', 'connect-configs'],
    ] as const) {
      const err = check(over, rules, template);
      assert.ok(err, topic);
      assert.equal(err.permanent, true, 'parked at once: the row would break it on every attempt');
      assert.equal(err.message.split(':')[0], `topic "${topic}" breaks the topic-prefix rule`);
      assert.match(err.message, /every topic must start with OUTBOX_TOPIC_PREFIX "acme\."\. Fix the row's topic \(or aggregatetype\); if the relay is meant to write that topic, widen OUTBOX_TOPIC_PREFIX, and the relay's Kafka ACL or IAM policy with it$/);
    }
  });

  it('the prefix is case-sensitive, as Kafka topic names and prefixed ACLs are', () => {
    assert.ok(check({ topic: 'ACME.orders' }));
  });
});

describe('brokenRule: headers', () => {
  it('ordinary names pass; id and type are the relay\'s, neither counted nor measured; null values are not sent, so not counted', () => {
    assert.equal(check({ headers: { traceparent: 'x', b: 'y', c: 'z', id: 'forged', type: 'forged', dropped: null } }), undefined);
    assert.deepEqual(RELAY_HEADERS, Object.keys(toMessage(row(), 'acme.x').headers), 'the headers the relay itself sets');
  });

  it('G6: a name starting with "__" breaks the reserved-header rule, permanently, naming the header and OUTBOX_HEADERS_ALLOW_RESERVED', () => {
    for (const name of ['__TypeId__', '__KeyTypeId__', '__', '__x']) {
      const err = check({ headers: { ok: '1', [name]: 'com.example.Gadget' } });
      assert.ok(err, name);
      assert.equal(err.permanent, true);
      assert.match(err.message, new RegExp(`^header "${name}" breaks the reserved-header rule: .*OUTBOX_HEADERS_ALLOW_RESERVED`));
    }
    assert.equal(check({ headers: { _x: '1', 'a__b': '2', 'x__': '3' } }), undefined, 'one underscore, or "__" inside or at the end of a name, is not reserved');
    const long = `__${'n'.repeat(500)}`;
    assert.ok(check({ headers: { [long]: 'x' } })?.message.startsWith(`header "${long.slice(0, 100)}" breaks`), 'at most 100 characters of the name are quoted');
  });

  it('a reserved name listed in OUTBOX_HEADERS_ALLOW_RESERVED passes; others stay refused (exact names)', () => {
    const allowing = { ...rules, reservedHeadersAllowed: ['__TypeId__'] };
    assert.equal(check({ headers: { __TypeId__: 'com.example.OrderPaid' } }, allowing), undefined);
    assert.ok(check({ headers: { __KeyTypeId__: 'x' } }, allowing));
    assert.ok(check({ headers: { __typeid__: 'x' } }, allowing));
  });

  it('G6: more extra headers than OUTBOX_HEADERS_MAX_COUNT break the header-count rule (at the limit passes)', () => {
    assert.equal(check({ headers: { a: '', b: '', c: '' } }), undefined);
    const err = check({ headers: { a: '', b: '', c: '', d: '' } });
    assert.equal(err?.permanent, true);
    assert.equal(err?.message, "the row's 4 headers break the header-count rule: at most OUTBOX_HEADERS_MAX_COUNT=3 per row (the relay's own headers not counted). Send fewer headers, or raise OUTBOX_HEADERS_MAX_COUNT");
    assert.ok(check({ headers: { a: '' } }, { ...rules, maxHeaders: 0 }), '0: rows may set no header');
  });

  it('G6: names and values over OUTBOX_HEADERS_MAX_BYTES (UTF-8, as sent: non-strings as JSON) break the header-size rule (at the limit passes)', () => {
    assert.equal(check({ headers: { k: 'v'.repeat(39) } }), undefined, '1 + 39 = 40 bytes');
    assert.equal(
      check({ headers: { k: 'v'.repeat(40) } })?.message,
      "the row's headers (41 bytes of names and values) break the header-size rule: at most OUTBOX_HEADERS_MAX_BYTES=40 per row (the relay's own headers not counted). Move the data into the payload, or raise OUTBOX_HEADERS_MAX_BYTES",
    );
    assert.ok(check({ headers: { k: 'é'.repeat(20) } }), 'é is 2 bytes: 41 in all');
    assert.ok(check({ headers: { k: { nested: 'v'.repeat(30) } } }), 'an object value is sent as its JSON text, and measured so');
  });

  it('the first broken rule is reported: topic, then names, then count, then size', () => {
    const all = { topic: 'other', headers: { __TypeId__: 'x', a: 'v'.repeat(50), b: '', c: '' } };
    assert.match(check(all)?.message ?? '', /topic-prefix rule/);
    assert.match(check({ ...all, topic: null })?.message ?? '', /reserved-header rule/);
  });
});

describe('OUTBOX_TOPIC_PREFIX and the header settings (src/config/load.ts)', () => {
  const base = { DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db', KAFKA_BROKERS: '127.0.0.1:9092' };
  const problems = (env: Record<string, string>): string[] => {
    try {
      loadConfig({ ...base, ...env });
    } catch (e) {
      assert.ok(e instanceof ConfigError);
      return e.problems;
    }
    return [];
  };

  it('the template\'s fixed start is its text before the first placeholder (all of it without one)', () => {
    assert.equal(templateHead('outbox.event.{aggregatetype}'), 'outbox.event.');
    assert.equal(templateHead('{aggregatetype}'), '');
    assert.equal(templateHead('a.{type}.{aggregatetype}'), 'a.');
    assert.equal(templateHead('events'), 'events');
  });

  it('defaults: the prefix is the template\'s fixed start (outbox.event.); headers: no reserved name, 32 headers, 16 KiB', () => {
    assert.deepEqual(loadConfig(base).outbox.rowRules, { topicPrefix: 'outbox.event.', reservedHeadersAllowed: [], maxHeaders: 32, maxHeaderBytes: 16_384, relayHeaders: ['id', 'type'] });
    assert.equal(loadConfig({ ...base, OUTBOX_TOPIC_TEMPLATE: 'orders.{type}' }).outbox.rowRules.topicPrefix, 'orders.');
  });

  it('reads every setting', () => {
    const r = loadConfig({
      ...base,
      OUTBOX_TOPIC_TEMPLATE: '{aggregatetype}',
      OUTBOX_TOPIC_PREFIX: 'acme.',
      OUTBOX_HEADERS_ALLOW_RESERVED: ' __TypeId__, __KeyTypeId__ ,',
      OUTBOX_HEADERS_MAX_COUNT: '0',
      OUTBOX_HEADERS_MAX_BYTES: '65536',
    }).outbox.rowRules;
    assert.deepEqual(r, { topicPrefix: 'acme.', reservedHeadersAllowed: ['__TypeId__', '__KeyTypeId__'], maxHeaders: 0, maxHeaderBytes: 65_536, relayHeaders: ['id', 'type'] });
  });

  it('G8: a template starting with a placeholder needs OUTBOX_TOPIC_PREFIX: the problem says why and what to set', () => {
    const p = problems({ OUTBOX_TOPIC_TEMPLATE: '{aggregatetype}' });
    assert.equal(p.length, 1);
    assert.match(p[0]!, /^OUTBOX_TOPIC_PREFIX is required when OUTBOX_TOPIC_TEMPLATE \("\{aggregatetype\}"\) starts with a placeholder: without it a row could publish to any topic/);
    assert.match(p[0]!, /e\.g\. OUTBOX_TOPIC_PREFIX=outbox\.$/);
  });

  it('G8: a prefix that cannot start a topic, or reaches the internal topics (a leading "_"), is refused, given or taken from the template', () => {
    assert.match(problems({ OUTBOX_TOPIC_PREFIX: 'acme/' })[0]!, /^OUTBOX_TOPIC_PREFIX="acme\/" cannot start a Kafka topic name/);
    assert.match(problems({ OUTBOX_TOPIC_PREFIX: 'x'.repeat(250), OUTBOX_TOPIC_TEMPLATE: '{type}' })[0]!, /cannot start a Kafka topic name/);
    assert.match(problems({ OUTBOX_TOPIC_PREFIX: '_', OUTBOX_TOPIC_TEMPLATE: '_{type}' })[0]!, /^OUTBOX_TOPIC_PREFIX="_" starts with "_", as Kafka's and its tools' internal topics do/);
    assert.match(problems({ OUTBOX_TOPIC_PREFIX: '_x.', OUTBOX_TOPIC_TEMPLATE: '{type}' })[0]!, /^OUTBOX_TOPIC_PREFIX="_x\." starts with "_"/);
    assert.deepEqual(problems({ OUTBOX_TOPIC_PREFIX: 'x_', OUTBOX_TOPIC_TEMPLATE: '{type}' }), [], 'an underscore elsewhere is fine');
    assert.match(problems({ OUTBOX_TOPIC_TEMPLATE: '__{aggregatetype}' })[0]!, /^OUTBOX_TOPIC_PREFIX \(unset: OUTBOX_TOPIC_TEMPLATE's text before its first placeholder, "__"\) starts with "_"/);
    assert.match(problems({ OUTBOX_TOPIC_TEMPLATE: 'bad topic.{type}' })[0]!, /^OUTBOX_TOPIC_PREFIX \(unset: .*"bad topic\."\) cannot start a Kafka topic name/);
  });

  it('G8: a template that can never give a topic inside the prefix is refused; one that can is accepted', () => {
    assert.deepEqual(problems({ OUTBOX_TOPIC_PREFIX: 'acme.', OUTBOX_TOPIC_TEMPLATE: 'other.{aggregatetype}' }), [
      'OUTBOX_TOPIC_TEMPLATE="other.{aggregatetype}" never gives a topic starting with OUTBOX_TOPIC_PREFIX="acme.", so every row it routes would be parked: start the template with the prefix, e.g. OUTBOX_TOPIC_TEMPLATE=acme.{aggregatetype}',
    ]);
    assert.equal(problems({ OUTBOX_TOPIC_PREFIX: 'acme.events', OUTBOX_TOPIC_TEMPLATE: 'acme.event' }).length, 1, 'a template without a placeholder must start with the prefix');
    for (const template of ['acme.{aggregatetype}', 'acme.outbox.{type}', '{aggregatetype}', 'ac{aggregatetype}', 'acme.orders']) {
      assert.deepEqual(problems({ OUTBOX_TOPIC_PREFIX: 'acme.', OUTBOX_TOPIC_TEMPLATE: template }), [], template);
    }
  });

  it('G8: header settings: allowed names must be reserved ones; count and size within bounds', () => {
    assert.deepEqual(problems({ OUTBOX_HEADERS_ALLOW_RESERVED: '__TypeId__,TypeId' }), [
      'OUTBOX_HEADERS_ALLOW_RESERVED entry "TypeId" does not start with "__": only such names are reserved, every other name is allowed already (a comma-separated list of exact names, e.g. __TypeId__)',
    ]);
    assert.match(problems({ OUTBOX_HEADERS_ALLOW_RESERVED: 'TypeId__,__x' }).join('\n'), /^OUTBOX_HEADERS_ALLOW_RESERVED entry "TypeId__" does not start with "__"[^\n]*$/, 'ending with "__" is not starting with it');
    assert.deepEqual(problems({ OUTBOX_HEADERS_MAX_COUNT: '1001' }), ['OUTBOX_HEADERS_MAX_COUNT=1001 is out of range; expected an integer between 0 and 1000 (default 32)']);
    assert.deepEqual(problems({ OUTBOX_HEADERS_MAX_BYTES: 'lots' }), ['OUTBOX_HEADERS_MAX_BYTES="lots" is not a whole number; expected an integer between 0 and 65536 (default 16384)']);
    // the table refuses headers over 64 KiB of JSON at INSERT: a higher setting could never apply
    assert.deepEqual(problems({ OUTBOX_HEADERS_MAX_BYTES: '65537' }), ['OUTBOX_HEADERS_MAX_BYTES=65537 is out of range; expected an integer between 0 and 65536 (default 16384)']);
  });
});
