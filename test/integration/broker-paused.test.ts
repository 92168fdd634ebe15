// services: postgres
// The broker paused (SIGSTOP) around what is not a batch's send (broker-faults.test.ts pauses it
// mid-batch): an invocation lingering for new rows (linger mode, G1/G5), and invocations that fail
// while it is paused, whose metrics must still be published. The broker is this file's own
// (private-broker.ts), so the files beside it keep theirs; each test resumes it.
import { MIN_SAFETY_MARGIN_MS } from '../../src/budget.ts';
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { loadConfig } from '../../src/config/load.ts';
import { enqueue } from '../../src/outbox/enqueue.ts';
import { BrokerUnavailableError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import type { Summary } from '../../src/loop/invocation.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { num, onlyRecord, type Emf } from './emf.ts';
import { counts, db, fixture, insertEvents, runCli, startWatching, topicCount, useKafka, waitForLeaders, type CliResult, type Fixture } from './helpers.ts';
import { startPrivateBroker, type PrivateBroker } from './private-broker.ts';

let sql: Sql;
let broker: PrivateBroker;
before(async () => {
  sql = db();
  broker = await startPrivateBroker();
  useKafka(broker.address);
});
after(async () => {
  await sql.end();
  await broker?.stop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A warm container in linger mode (retention off, as in linger.test.ts). */
function lingering(f: Fixture, env: Record<string, string>): Runtime {
  return new Runtime(loadConfig({ ...f.env, OUTBOX_IDLE: 'linger', OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0', OUTBOX_LOG_LEVEL: 'warn', ...env }), createLogger('warn'));
}

describe('linger mode, the broker paused', () => {
  it('G1/G5: broker paused (SIGSTOP) while an invocation lingers: a new row is sent into the pause and the invocation still returns before its deadline, failing as broker-unavailable; nothing is lost', async (ctx) => {
    const f = await fixture(sql, 'linger_paused');
    const rt = lingering(f, { OUTBOX_SAFETY_MARGIN_MS: '2000' });
    let failure: unknown;
    let elapsed = Infinity;
    const started = Date.now();
    try {
      const invocation = rt.invoke(8_000).catch((err: unknown) => err);
      await sleep(1_000);
      process.kill(broker.pid, 'SIGSTOP');
      await sql.begin((tx) => enqueue(tx, { aggregatetype: 'order', aggregateid: 'o-1', type: 'Placed', payload: {} }, { table: f.table }));
      failure = await invocation;
      elapsed = Date.now() - started;
    } finally {
      await broker.resume();
      await waitForLeaders([f.topic('order')]);
    }
    ctx.diagnostic(`returned after ${elapsed} ms (the loop's own duration ${(failure as { summary?: Summary }).summary?.durationMs} ms): ${String(failure)}`);
    assert.ok(elapsed < 8_000, `the invocation returned after ${elapsed} ms, its Lambda timeout 8000 ms`);
    assert.ok(elapsed < 6_500, `…and within its safety margin (8000 - 2000 ms): ${elapsed} ms`);
    assert.ok(failure instanceof BrokerUnavailableError, `failed as broker-unavailable: ${String(failure)}`);
    assert.equal((await counts(sql, f.table)).sent, 0, 'nothing marked while the broker was away');
    // the next invocation (same container) delivers it
    const watching = await startWatching([f.topic('order')]);
    try {
      const next = await rt.invoke(15_000);
      assert.equal(next.published, 1, JSON.stringify(next));
      const until = Date.now() + 5_000;
      while (watching.arrivals.size < 1 && Date.now() < until) await sleep(50);
      assert.equal(watching.arrivals.size, 1);
    } finally {
      await watching.stop();
      await rt.close();
    }
  });
});

describe('metrics: the backlog age while the broker is frozen', () => {
  it('failed invocations still publish their record, and OldestPendingAgeMs grows between them (SIGSTOP, then SIGCONT)', async (ctx) => {
    const f = await fixture(sql, 'metricsfrozen');
    await insertEvents(sql, f.table, Array.from({ length: 20 }, (_, i) => ({ aggregateid: `a-${i % 4}` })));
    await topicCount([f.topic('order')]); // the topic answers before the broker is frozen
    const env = { ...f.env, OUTBOX_METRICS: 'stdout', OUTBOX_SAFETY_MARGIN_MS: '2000' };
    const runs: Array<{ res: CliResult; record: Emf }> = [];
    process.kill(broker.pid, 'SIGSTOP');
    try {
      for (let i = 0; i < 2; i++) {
        if (i > 0) await new Promise((r) => setTimeout(r, 1_500));
        const res = await runCli(['invoke', '--timeout', '5000'], env);
        runs.push({ res, record: onlyRecord(res.stdout, `stdout of run ${i + 1}`) });
      }
    } finally {
      await broker.resume();
    }
    for (const { res, record } of runs) {
      assert.equal(res.code, 1, 'a frozen broker fails the invocation');
      assert.equal(res.summary?.stoppedBecause, 'broker-unavailable', JSON.stringify(res.summary));
      assert.equal(num(record, 'Published'), 0);
      assert.equal(num(record, 'PendingRows'), 20);
      assert.equal(num(record, 'DurationMs'), res.summary?.durationMs);
    }
    const [first, second] = runs.map((r) => r.record) as [Emf, Emf];
    const grew = num(second, 'OldestPendingAgeMs') - num(first, 'OldestPendingAgeMs');
    const between = second._aws.Timestamp - first._aws.Timestamp;
    ctx.diagnostic(`OldestPendingAgeMs ${num(first, 'OldestPendingAgeMs')} → ${num(second, 'OldestPendingAgeMs')} (+${grew} ms; records ${between} ms apart)`);
    assert.ok(num(first, 'OldestPendingAgeMs') > 0);
    assert.ok(grew > 1_500 && Math.abs(grew - between) < 1_000, `the age grew by ${grew} ms over ${between} ms`);

    // the broker is back: the next invocation delivers, and the age drops to 0
    await waitForTopic(f.topic('order'));
    const res = await runCli(['invoke', '--timeout', '30000'], { ...env, OUTBOX_SAFETY_MARGIN_MS: String(MIN_SAFETY_MARGIN_MS) });
    assert.equal(res.code, 0, res.stderr.slice(-3_000));
    const record = onlyRecord(res.stdout, 'stdout');
    assert.equal(num(record, 'Published'), 20);
    assert.equal(num(record, 'PendingRows'), 0);
    assert.equal(num(record, 'OldestPendingAgeMs'), 0);
  });
});

async function waitForTopic(topic: string, timeoutMs = 60_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    try {
      await topicCount([topic]);
      return;
    } catch (err) {
      if (Date.now() > until) throw err;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}
