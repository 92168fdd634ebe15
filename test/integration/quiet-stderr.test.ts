// services: postgres, kafka
// What a normal invocation writes to stderr: the relay's own JSON lines, its log's (src/log.ts sends
// every line there) and its metrics' EMF record (src/lambda/metrics.ts), and nothing else. Node's process warnings land on stderr too, as plain text
// ("(node:PID) TimeoutNegativeWarning: ..."): kafkajs 2.2.4 armed a negative timeout after every
// broker response (patches/kafkajs+2.2.4.patch), one warning per process, so per CLI invocation
// and per Lambda cold start, and CloudWatch took it for a line of the relay's. The CLI runs here
// without --disable-warning or NODE_NO_WARNINGS (helpers.ts startCli passes no flags).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { counts, fileDb, fixture, insertEvents, KAFKA_CLIENT, runCli } from './helpers.ts';

const sql = fileDb();

describe('stderr of a normal invocation', () => {
  it(`a normal invocation (${KAFKA_CLIENT}) writes to stderr only the relay's JSON lines (its log, its EMF metrics), none of them a Node warning: 40 rows relayed`, async () => {
    const f = await fixture(sql, 'quiet', ['order', 'invoice']);
    await insertEvents(sql, f.table, Array.from({ length: 40 }, (_, i) => ({ aggregatetype: i % 2 ? 'order' : 'invoice', aggregateid: `a-${i % 5}`, payload: { i } })));
    const res = await runCli(['invoke', '--timeout', '20000'], f.env);
    assert.equal(res.code, 0, res.stderr);
    assert.equal(res.summary?.published, 40, res.stdout);
    assert.equal((await counts(sql, f.table)).pending, 0);

    const lines = res.stderr.split('\n').filter((l) => l !== '');
    // info level (the fixture's): the invocation logs lines of its own, so the check below reads some
    assert.ok(lines.length > 0, 'the relay logged nothing at info level: the check below would read no line');
    const foreign = lines.filter((l) => {
      try {
        const line = JSON.parse(l) as Record<string, unknown>;
        const emf = typeof line._aws === 'object' && line._aws !== null && 'CloudWatchMetrics' in line._aws;
        return line.service !== 'outbox-relay' || !(emf || (typeof line.level === 'string' && typeof line.message === 'string'));
      } catch {
        return true;
      }
    });
    assert.deepEqual(foreign, [], 'lines on stderr that are not the relay\'s JSON log or metrics');
    // a warning class's name (TimeoutNegativeWarning, DeprecationWarning, ...), also inside a JSON line
    assert.deepEqual(lines.filter((l) => /[A-Za-z]Warning\b/.test(l)), [], 'a Node warning on stderr');
  });
});
