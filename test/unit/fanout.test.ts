import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Metrics } from '@aws-lambda-powertools/metrics';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { ConfigError } from '../../src/errors.ts';
import { fanOut, helperEvent, helperMarker, helpersWanted } from '../../src/lambda/fanout.ts';
import type { Logger } from '../../src/log.ts';
import { newSummary } from '../../src/loop/summary.ts';
import type { Backlog } from '../../src/outbox/admin.ts';

const backlog = (pendingRows: number, pendingRowsCapped = false): Backlog => ({ oldestPendingAgeMs: 1, pendingRows, pendingRowsCapped, parkedRows: 0, parkedRowsCapped: false });
const budget = (claimed: number) => ({ stoppedBecause: 'budget' as const, claimed });

describe('fan-out: how many helpers a scheduled invocation starts (helpersWanted)', () => {
  it('as many as the backlog needs at its pace, ceil(pending / moved) - 1, at most max - 1', () => {
    assert.equal(helpersWanted(4, budget(1_000), backlog(1_001)), 1);
    assert.equal(helpersWanted(4, budget(1_000), backlog(2_000)), 1);
    assert.equal(helpersWanted(4, budget(1_000), backlog(2_001)), 2);
    assert.equal(helpersWanted(4, budget(1_000), backlog(9_000)), 3, 'capped at max - 1');
    assert.equal(helpersWanted(8, budget(3_000), backlog(10_001, true)), 7, 'a capped count is a backlog of unknown size: max - 1');
  });

  it('none when fan-out is off, the invocation did not stop on its budget or moved nothing, the backlog is no larger than what it moved, or unknown', () => {
    assert.equal(helpersWanted(1, budget(1_000), backlog(10_001, true)), 0, 'max 1: off');
    for (const stop of ['empty', 'locked', 'behind-failed-rows', 'topics-backed-off'] as const) {
      assert.equal(helpersWanted(4, { stoppedBecause: stop, claimed: 1_000 }, backlog(5_000)), 0, stop);
    }
    assert.equal(helpersWanted(4, budget(0), backlog(5_000)), 0, 'moved nothing: more invocations would not help');
    assert.equal(helpersWanted(4, budget(1_000), backlog(1_000)), 0);
    assert.equal(helpersWanted(4, budget(1_000), undefined), 0, 'backlog not read');
  });

  it("a helper's event carries the marker; the schedule's event and anything else do not", () => {
    const event = helperEvent('req-1', new Date('2026-01-02T03:04:05.000Z'));
    assert.deepEqual(event, { outboxRelay: { helper: true, startedBy: 'req-1', at: '2026-01-02T03:04:05.000Z' } });
    assert.deepEqual(helperMarker(JSON.parse(JSON.stringify(event))), event.outboxRelay);
    for (const other of [{ 'detail-type': 'Scheduled Event', source: 'aws.events' }, {}, null, undefined, { outboxRelay: { helper: 'yes' } }]) {
      assert.equal(helperMarker(other), undefined, JSON.stringify(other));
    }
  });
});

describe('fan-out: OUTBOX_FANOUT_MAX', () => {
  const base = { DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db', KAFKA_BROKERS: '127.0.0.1:9092' };
  const problems = (env: Record<string, string>): string[] => {
    try {
      loadConfig({ ...base, ...env });
    } catch (e) {
      assert.ok(e instanceof ConfigError);
      return e.problems;
    }
    assert.fail('expected a ConfigError');
  };

  it('is 1 (off) by default, and takes a whole number from 1 to 1,000', () => {
    assert.equal(loadConfig(base).fanoutMax, 1);
    assert.equal(loadConfig({ ...base, OUTBOX_FANOUT_MAX: '4' }).fanoutMax, 4);
    assert.deepEqual(problems({ OUTBOX_FANOUT_MAX: '0' }), [
      'OUTBOX_FANOUT_MAX=0 is not a number of invocations: set 1 to turn fan-out off (the default), or N > 1 to let up to N invocations work at once on a backlog',
    ]);
    assert.deepEqual(problems({ OUTBOX_FANOUT_MAX: 'two' }), ['OUTBOX_FANOUT_MAX="two" is not a whole number; expected an integer between 1 and 1000 (default 1)']);
    assert.deepEqual(problems({ OUTBOX_FANOUT_MAX: '1001' }), ['OUTBOX_FANOUT_MAX=1001 is out of range; expected an integer between 1 and 1000 (default 1)']);
  });
});

describe('fan-out: the step after the backlog read (fanOut)', () => {
  const context = { awsRequestId: 'req-1', invokedFunctionArn: 'arn:aws:lambda:us-east-1:123456789012:function:relay' };
  // the Lambda timeout `remainingMs` away, on a clock that stands still
  const timeout = (remainingMs: number) => new Deadline(1_000 + remainingMs, () => 1_000);
  const recorded = () => {
    const metrics = new Metrics({ namespace: 'Test', serviceName: 'test' });
    const warnings: Array<{ message: string; extra: unknown }> = [];
    const logger: Logger = {
      debug: () => undefined,
      info: () => undefined,
      error: () => undefined,
      warn: (message: string, extra?: unknown) => void warnings.push({ message, extra }),
      child: () => logger,
    };
    const values = () => {
      const record = metrics.serializeMetrics() as unknown as Record<string, unknown>;
      return Object.fromEntries(['HelpersStarted', 'HelpersNotStarted', 'HelpersFoundNothing'].filter((k) => k in record).map((k) => [k, record[k]]));
    };
    return { metrics, logger, warnings, values };
  };

  it('a helper starts none and counts whether it found nothing (HelpersFoundNothing)', async () => {
    for (const claimed of [0, 500]) {
      const r = recorded();
      const summary = { ...newSummary(), claimed };
      await fanOut({ max: 4, event: helperEvent('req-0'), context, timeout: timeout(5_000), summary, backlog: backlog(10_001, true), metrics: r.metrics, logger: r.logger });
      assert.deepEqual(r.values(), { HelpersFoundNothing: claimed === 0 ? 1 : 0 });
    }
  });

  it('a helper out of budget on a backlog starts none: only the schedule starts helpers', async () => {
    const r = recorded();
    const summary = { ...newSummary(), stoppedBecause: 'budget' as const, claimed: 500 };
    await fanOut({ max: 4, event: helperEvent('req-0'), context, timeout: timeout(5_000), summary, backlog: backlog(10_001, true), metrics: r.metrics, logger: r.logger });
    assert.deepEqual(r.values(), { HelpersFoundNothing: 0 });
    assert.deepEqual(r.warnings, []);
  });

  it('too little time left to start the helpers it wants: none started, counted (HelpersNotStarted) and logged, nothing thrown', async () => {
    const r = recorded();
    const summary = { ...newSummary(), claimed: 1_000 };
    await fanOut({ max: 4, event: {}, context, timeout: timeout(550), summary, backlog: backlog(2_500), metrics: r.metrics, logger: r.logger });
    assert.deepEqual(r.values(), { HelpersStarted: 0, HelpersNotStarted: 2 });
    assert.equal(r.warnings.length, 1);
    assert.match(r.warnings[0]!.message, /helpers not started: their rows stay claimable for the next tick/);
    assert.match(JSON.stringify(r.warnings[0]!.extra), /too little time left before the Lambda timeout \(50 ms\): raise OUTBOX_SAFETY_MARGIN_MS/);
  });

  it('fan-out off: no fan-out metric at all', async () => {
    const r = recorded();
    await fanOut({ max: 1, event: {}, context, timeout: timeout(5_000), summary: { ...newSummary(), claimed: 1_000 }, backlog: backlog(9_000), metrics: r.metrics, logger: r.logger });
    assert.deepEqual(r.values(), {});
  });
});
