import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { OutboxRow } from '../../src/domain.ts';
import { encodedSize, toMessage, tooLarge } from '../../src/kafka/message.ts';
import { planBatch, topicsToSend, type PlanContext } from '../../src/loop/plan.ts';
import type { RowRules } from '../../src/domain.ts';
import { settle } from '../../src/loop/settlement.ts';
import { MessageRejectedError } from '../../src/errors.ts';

let seq = 0;
function row(aggregateid: string, over: Partial<OutboxRow> = {}): OutboxRow {
  seq++;
  return { seq: String(seq), id: `id-${seq}`, aggregatetype: 'order', aggregateid, type: 'T', payload: '{}', topic: null, headers: null, attempts: 0, ...over };
}
/** the Kafka publisher's MessageFormat (ProducerPublisher's) */
const format = { toMessage, tooLarge };
/** no rule in the way: '' as the prefix (config never allows it) lets every topic pass */
const open: RowRules = { topicPrefix: '', reservedHeadersAllowed: [], maxHeaders: 32, maxHeaderBytes: 16_384 };
const ctx = (over: Partial<PlanContext> = {}): PlanContext => ({ format, topicTemplate: 'e.{aggregatetype}', rules: open, limits: new Map(), backedOff: new Set(), ...over });
const seqs = (xs: Array<{ seq: string }>) => xs.map((x) => x.seq);

describe('planBatch', () => {
  it('every row sendable: all become messages, in order', () => {
    const rows = [row('a'), row('b'), row('a')];
    const plan = planBatch(rows, ctx());
    assert.deepEqual(seqs(plan.messages), seqs(rows));
    assert.deepEqual([plan.rejected, plan.waiting], [[], []]);
  });

  it('a row that can never be sent is rejected; its aggregate\'s later rows wait; other aggregates go', () => {
    const [a1, b1, a2, b2] = [row('a', { topic: 'bad topic!' }), row('b'), row('a'), row('b')];
    const plan = planBatch([a1, b1, a2, b2], ctx());
    assert.deepEqual(seqs(plan.rejected), [a1.seq]);
    assert.match(plan.rejected[0]!.error.message, /not a legal Kafka topic name/);
    assert.equal(plan.rejected[0]!.error.permanent, false);
    assert.deepEqual(plan.waiting, [a2.seq]);
    assert.deepEqual(seqs(plan.messages), [b1.seq, b2.seq]);
  });

  it('over the topic\'s limit: rejected as permanent (parked at once), later rows wait', () => {
    const [big, next, other] = [row('a', { payload: JSON.stringify('x'.repeat(2_000)) }), row('a'), row('b')];
    const plan = planBatch([big, next, other], ctx({ limits: new Map([['e.order', 1_000]]) }));
    assert.deepEqual(seqs(plan.rejected), [big.seq]);
    assert.equal(plan.rejected[0]!.error.permanent, true);
    assert.match(plan.rejected[0]!.error.message, /over the 1000-byte limit of topic e\.order/);
    assert.deepEqual(plan.waiting, [next.seq]);
    assert.deepEqual(seqs(plan.messages), [other.seq]);
  });

  it('an aggregate changing topic mid-batch: its rows up to the change go, the rest wait (uncharged)', () => {
    const rows = [row('a'), row('a', { topic: 'other' }), row('a'), row('b', { topic: 'other' })];
    const plan = planBatch(rows, ctx());
    assert.deepEqual(seqs(plan.messages), [rows[0]!.seq, rows[3]!.seq]);
    assert.deepEqual(plan.waiting, [rows[1]!.seq, rows[2]!.seq]);
    assert.deepEqual(plan.rejected, []);
  });

  it('a backed-off topic: its rows and their aggregates\' later rows wait, uncharged', () => {
    const rows = [row('a', { topic: 'gone' }), row('a'), row('b'), row('c', { topic: 'gone' })];
    const plan = planBatch(rows, ctx({ backedOff: new Set(['gone']) }));
    assert.deepEqual(seqs(plan.messages), [rows[2]!.seq]);
    assert.deepEqual(plan.waiting, [rows[0]!.seq, rows[1]!.seq, rows[3]!.seq]);
  });

  it('topicsToSend lists the legal, not backed-off topics', () => {
    const rows = [row('a'), row('b', { topic: 'bad topic!' }), row('c', { topic: 'x' }), row('d', { topic: 'gone' }), row('e')];
    assert.deepEqual(topicsToSend(rows, ctx({ backedOff: new Set(['gone']) })).sort(), ['e.order', 'x']);
  });

  it('G6: a row breaking a row rule (topic outside the prefix, a reserved header) is rejected as permanent, its aggregate\'s later rows wait, other aggregates go; its topic is never looked up', () => {
    const rules: RowRules = { ...open, topicPrefix: 'e.' };
    const rows = [row('a', { topic: 'payments.refunds' }), row('b'), row('a'), row('c', { headers: { __TypeId__: 'com.evil.Gadget' } }), row('d', { topic: 'e.other' })];
    const plan = planBatch(rows, ctx({ rules }));
    assert.deepEqual(seqs(plan.rejected), [rows[0]!.seq, rows[3]!.seq]);
    assert.ok(plan.rejected.every((r) => r.error.permanent), 'parked at once');
    assert.match(plan.rejected[0]!.error.message, /topic "payments\.refunds" breaks the topic-prefix rule: every topic must start with OUTBOX_TOPIC_PREFIX "e\."/);
    assert.match(plan.rejected[1]!.error.message, /header "__TypeId__" breaks the reserved-header rule/);
    assert.deepEqual(plan.waiting, [rows[2]!.seq]);
    assert.deepEqual(seqs(plan.messages), [rows[1]!.seq, rows[4]!.seq]);
    assert.deepEqual(topicsToSend(rows, ctx({ rules })).sort(), ['e.order', 'e.other'], 'no DescribeConfigs for a topic outside the prefix');
  });

  it('an illegal topic name is the broker\'s rule and is checked first: backed off, not parked at once, even outside the prefix', () => {
    const plan = planBatch([row('a', { topic: 'bad topic!' })], ctx({ rules: { ...open, topicPrefix: 'e.' } }));
    assert.match(plan.rejected[0]!.error.message, /not a legal Kafka topic name/);
    assert.equal(plan.rejected[0]!.error.permanent, false);
  });
});

describe('settle', () => {
  const policy = { maxAttempts: 3, backoffBaseMs: 1_000, backoffMaxMs: 10_000 };
  it('acked rows are sent; rejected rows get an attempt with backoff, or are parked at the last attempt or when permanent', () => {
    const rejected = [
      { seq: '1', error: new MessageRejectedError('flaky') },
      { seq: '2', error: new MessageRejectedError('too large', true) },
      { seq: '3', error: new MessageRejectedError('flaky again') },
    ];
    const attempts = new Map([['1', 0], ['2', 0], ['3', 2]]);
    const s = settle(['7', '8'], rejected, (seq) => attempts.get(seq) ?? 0, policy, () => 1);
    assert.deepEqual(s.sent, ['7', '8']);
    assert.deepEqual(s.failures, [
      { seq: '1', error: 'flaky', park: false, delayMs: 1_000 },
      { seq: '2', error: 'too large', park: true, delayMs: 0 },
      { seq: '3', error: 'flaky again', park: true, delayMs: 0 },
    ]);
  });
});

describe('planBatch: edges', () => {
  it('a message exactly at its topic\'s limit is sent; one byte over is rejected', () => {
    const r = row('a', { payload: JSON.stringify('x'.repeat(500)) });
    const size = encodedSize(toMessage(r, 'e.{aggregatetype}'));
    assert.deepEqual(seqs(planBatch([r], ctx({ limits: new Map([['e.order', size]]) })).messages), [r.seq]);
    assert.deepEqual(seqs(planBatch([r], ctx({ limits: new Map([['e.order', size - 1]]) })).rejected), [r.seq]);
  });

  it('only a MessageRejectedError rejects a row: any other failure is a bug and propagates', () => {
    const unserialisable = row('a', { headers: { n: 1n } });
    assert.throws(() => planBatch([row('b'), unserialisable], ctx()), TypeError);
  });
});

describe('planBatch: payloads the claim left out (payload_bytes, payload null)', () => {
  const limits = new Map([['e.order', 1_000_000]]);
  it('over the topic\'s limit from its size alone: rejected as permanent, the error names the size, the limit and what to do; later rows of its aggregate wait', () => {
    const [a1, b1, a2] = [row('a', { payload: null, payload_bytes: 200_000_000 }), row('b'), row('a')];
    const plan = planBatch([a1, b1, a2], ctx({ limits }));
    assert.deepEqual(seqs(plan.rejected), [a1.seq]);
    assert.equal(plan.rejected[0]!.error.permanent, true);
    assert.match(plan.rejected[0]!.error.message, /^payload is 200000000 bytes \(the message \d+\), over the 1000000-byte limit of topic e\.order; parked from its size, the payload was not read: shrink the payload/);
    assert.deepEqual(plan.waiting, [a2.seq]);
    assert.deepEqual(seqs(plan.messages), [b1.seq]);
    assert.deepEqual(plan.unread, []);
  });

  it('within the limit: every such row is listed to read at once, whatever its aggregate; read, the plan sends them in order', () => {
    const [a1, a2, b1] = [row('a', { payload: null, payload_bytes: 500_000 }), row('a', { payload: null, payload_bytes: 400_000 }), row('b')];
    const first = planBatch([a1, a2, b1], ctx({ limits }));
    assert.deepEqual(first.unread, [a1.seq, a2.seq]);
    assert.deepEqual(first.rejected, []);
    a1.payload = JSON.stringify('x'.repeat(499_998));
    a2.payload = JSON.stringify('y'.repeat(399_998));
    const second = planBatch([a1, a2, b1], ctx({ limits }));
    assert.deepEqual(second.unread, []);
    assert.deepEqual(seqs(second.messages), [a1.seq, a2.seq, b1.seq]);
  });

  it('a NULL payload (payload_bytes null too) is no payload left out', () => {
    const r = row('a', { payload: null, payload_bytes: null });
    assert.deepEqual(seqs(planBatch([r], ctx({ limits })).messages), [r.seq]);
  });
});

