// services: postgres, kafka
// Metrics (Powertools, CloudWatch Embedded Metric Format): real invocations through the CLI, which
// runs the same middy handler as Lambda. The EMF record is checked line by line: names, units,
// dimensions, and values equal to the invocation's summary and to what the table holds; the same
// figures in `status --json`; where the record goes (stdout as in Lambda, stderr by default for the
// CLI, nowhere when off). The record of invocations that fail while the broker is frozen:
// broker-paused.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { emfRecords, num, onlyRecord } from './emf.ts';
import { fileDb, fixture, insertEvents, runCli, type CliResult } from './helpers.ts';

const sql = fileDb();

const t = (table: string) => qualified(parseTableName(table));

/** What the alarms and the dashboard in serverless.yml read: a rename must break this test. */
const EXPECTED_UNITS: Record<string, string> = {
  Published: 'Count',
  Retried: 'Count',
  Parked: 'Count',
  HeldBack: 'Count',
  Batches: 'Count',
  Pruned: 'Count',
  TopicsBackedOff: 'Count',
  DurationMs: 'Milliseconds',
  WaitedClaimMs: 'Milliseconds',
  WaitedPublishMs: 'Milliseconds',
  WaitedCommitMs: 'Milliseconds',
  WaitedIdleMs: 'Milliseconds',
  Wakeups: 'Count',
  OldestPendingAgeMs: 'Milliseconds',
  PendingRows: 'Count',
  PendingRowsCapped: 'Count',
  ParkedRows: 'Count',
  ParkedRowsCapped: 'Count',
};

async function tableFigures(table: string): Promise<{ pending: number; parked: number; oldestBySeqMs: number | null }> {
  const [r] = await sql.unsafe<{ pending: string; parked: string; oldest_by_seq_ms: string | null }[]>(
    `SELECT count(*) FILTER (WHERE parked_at IS NULL) AS pending,
            count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked,
            (SELECT extract(epoch FROM clock_timestamp() - created_at) * 1000 FROM ${t(table)}
             WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL ORDER BY seq LIMIT 1) AS oldest_by_seq_ms
     FROM ${t(table)} WHERE sent_at IS NULL AND skipped_at IS NULL`,
  );
  return { pending: Number(r!.pending), parked: Number(r!.parked), oldestBySeqMs: r!.oldest_by_seq_ms === null ? null : Number(r!.oldest_by_seq_ms) };
}

const HOUR = 3_600_000;

describe('metrics: one EMF record per invocation', () => {
  it('names, units, namespace and dimensions; values equal to the summary and to the table; the same figures in status --json', async () => {
    const f = await fixture(sql, 'metrics');
    await insertEvents(sql, f.table, [
      ...Array.from({ length: 200 }, (_, i) => ({ aggregateid: `a-${i % 20}` })),
      // parked at once (over OUTBOX_MAX_MESSAGE_BYTES); its aggregate's two later rows wait behind it
      { aggregateid: 'big', payload: { blob: 'x'.repeat(5_000) } },
      { aggregateid: 'big' },
      { aggregateid: 'big' },
      // an illegal topic name: charged, backs off (retried)
      { aggregateid: 'bad', topic: 'not a legal topic!' },
      // a topic that does not exist: backed off for the invocation, uncharged
      { aggregateid: 'gone', topic: `${f.prefix}.missing` },
    ]);
    // an hour old, so the age is unmistakable
    await sql.unsafe(`UPDATE ${t(f.table)} SET created_at = now() - interval '1 hour'`);
    const env = {
      ...f.env,
      OUTBOX_MAX_MESSAGE_BYTES: '2048',
      // the failed row backs off past the invocation: retried once, not again
      OUTBOX_BACKOFF_BASE_MS: '60000',
      OUTBOX_METRICS: 'stdout',
      OUTBOX_STAGE: 'metricstest',
      POWERTOOLS_SERVICE_NAME: 'outbox-relay-test',
    };
    const res = await runCli(['invoke', '--timeout', '20000'], env);
    assert.equal(res.code, 0, res.stderr.slice(-3_000));
    const summary = res.summary as { published: number; retried: number; parked: number; heldBack: number; batches: number; pruned: number; topicsBackedOff: string[]; durationMs: number; waitedMs: { claim: number; publish: number; commit: number } };
    assert.ok(!('_aws' in summary), 'the summary is still the last line on stdout');
    const record = onlyRecord(res.stdout, 'stdout');

    // the record's shape: namespace, the two low-cardinality dimensions, every metric with its unit
    const [directive] = record._aws.CloudWatchMetrics;
    assert.ok(directive);
    assert.equal(record._aws.CloudWatchMetrics.length, 1);
    assert.equal(directive.Namespace, 'OutboxRelay');
    assert.deepEqual(directive.Dimensions, [['service', 'stage']]);
    assert.equal(record.service, 'outbox-relay-test');
    assert.equal(record.stage, 'metricstest');
    assert.deepEqual(Object.fromEntries(directive.Metrics.map((m) => [m.Name, m.Unit])), EXPECTED_UNITS);
    assert.ok(Math.abs(record._aws.Timestamp - Date.now()) < 60_000, 'timestamped now');

    // the summary's figures, exactly
    assert.equal(summary.published, 200);
    assert.equal(summary.parked, 1);
    assert.equal(summary.retried, 1);
    assert.deepEqual(summary.topicsBackedOff, [`${f.prefix}.missing`]);
    const fromSummary: Record<string, number> = {
      Published: summary.published,
      Retried: summary.retried,
      Parked: summary.parked,
      HeldBack: summary.heldBack,
      Batches: summary.batches,
      Pruned: summary.pruned,
      TopicsBackedOff: summary.topicsBackedOff.length,
      DurationMs: summary.durationMs,
      WaitedClaimMs: summary.waitedMs.claim,
      WaitedPublishMs: summary.waitedMs.publish,
      WaitedCommitMs: summary.waitedMs.commit,
    };
    for (const [name, value] of Object.entries(fromSummary)) assert.equal(num(record, name), value, name);

    // the table's figures, as the table holds them after the invocation
    const table = await tableFigures(f.table);
    assert.deepEqual(table.pending, 4, 'two rows behind the parked one, the backing-off row, the row for the missing topic');
    assert.equal(num(record, 'PendingRows'), table.pending);
    assert.equal(num(record, 'ParkedRows'), table.parked);
    assert.equal(num(record, 'ParkedRows'), 1);
    assert.equal(num(record, 'PendingRowsCapped'), 0);
    assert.equal(num(record, 'ParkedRowsCapped'), 0);
    const age = num(record, 'OldestPendingAgeMs');
    assert.ok(age >= HOUR && age < HOUR + 60_000, `OldestPendingAgeMs ${age}`);
    assert.ok(table.oldestBySeqMs! >= age && table.oldestBySeqMs! - age < 30_000, `read later from the table: ${table.oldestBySeqMs} ≥ ${age}`);

    // Powertools' logger on stderr, with the Lambda context injected by its middleware
    const finished = res.stderr
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .find((l) => l.message === 'invocation finished');
    assert.ok(finished, res.stderr.slice(-2_000));
    assert.equal(finished.level, 'INFO');
    assert.equal(finished.service, 'outbox-relay-test');
    assert.equal(finished.stage, 'metricstest');
    assert.equal(finished.function_name, 'outbox-relay-local');
    assert.match(String(finished.function_request_id), /^[0-9a-f-]{36}$/);
    assert.equal(typeof finished.cold_start, 'boolean', 'true only when Lambda says the container is on-demand and new');
    assert.deepEqual(finished.summary, summary);
    assert.equal(emfRecords(res.stderr).length, 0, 'no EMF on stderr when it goes to stdout');

    // `status --json`: the same figures under the same names, next to the exact counts
    const status = (await runCli(['status', '--json'], env)).summary as Record<string, unknown>;
    assert.equal(status.pendingRows, num(record, 'PendingRows'));
    assert.equal(status.parkedRows, num(record, 'ParkedRows'));
    assert.equal(status.pendingRowsCapped, false);
    assert.equal(status.parkedRowsCapped, false);
    assert.equal(status.pending, status.pendingRows, 'exact below the cap');
    assert.equal(status.parked, status.parkedRows);
    const statusAge = status.oldestPendingAgeMs as number;
    assert.ok(statusAge >= age && statusAge - age < 30_000, `status ${statusAge} vs metric ${age}`);
    assert.ok(Math.abs((status.oldestPendingMs as number) - statusAge) < 5_000, 'every row has the same created_at here: the approximation is exact');
  });

  it('where the record goes: stderr by default for the CLI (stdout keeps the summary alone), stdout inside Lambda, nowhere when off', async () => {
    const f = await fixture(sql, 'metricsout');
    const invoke = async (extra: Record<string, string>): Promise<CliResult> => {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      const res = await runCli(['invoke', '--timeout', '20000'], { ...f.env, ...extra });
      assert.equal(res.code, 0, res.stderr.slice(-3_000));
      return res;
    };

    const cli = await invoke({});
    assert.equal(cli.stdout.trim().split('\n').length, 1, `stdout holds the summary alone:\n${cli.stdout}`);
    assert.equal(num(onlyRecord(cli.stderr, 'stderr'), 'Published'), 2);
    assert.equal(onlyRecord(cli.stderr, 'stderr').stage, 'local', 'the default stage');

    // Lambda sets AWS_LAMBDA_FUNCTION_NAME: there the record goes to stdout, as CloudWatch Logs expects
    const lambda = await invoke({ AWS_LAMBDA_FUNCTION_NAME: 'outbox-relay-prod-relay' });
    assert.equal(num(onlyRecord(lambda.stdout, 'stdout'), 'Published'), 2);
    assert.equal(emfRecords(lambda.stderr).length, 0);
    assert.equal(lambda.summary?.published, 2);

    const off = await invoke({ OUTBOX_METRICS: 'off' });
    assert.equal(emfRecords(off.stdout).length + emfRecords(off.stderr).length, 0);
    assert.equal(off.summary?.published, 2);
  });

  it('counts stop at 10,000: more pending rows read as 10,001 with PendingRowsCapped (status --json and the metric alike)', async () => {
    const f = await fixture(sql, 'metricscap');
    // bound for a topic that does not exist: they stay pending through the invocation
    await insertEvents(sql, f.table, Array.from({ length: 10_050 }, (_, i) => ({ aggregateid: `a-${i % 100}`, topic: `${f.prefix}.missing` })));
    const env = { ...f.env, OUTBOX_METRICS: 'stdout' };
    const status = (await runCli(['status', '--json'], env)).summary as Record<string, unknown>;
    assert.equal(status.pending, 10_050);
    assert.equal(status.pendingRows, 10_001);
    assert.equal(status.pendingRowsCapped, true);
    assert.equal(status.parkedRowsCapped, false);

    const res = await runCli(['invoke', '--timeout', '20000'], env);
    assert.equal(res.code, 0, res.stderr.slice(-3_000));
    const record = onlyRecord(res.stdout, 'stdout');
    assert.equal(num(record, 'Published'), 0);
    assert.equal(num(record, 'TopicsBackedOff'), 1);
    assert.equal(num(record, 'PendingRows'), 10_001);
    assert.equal(num(record, 'PendingRowsCapped'), 1);
  });
});
