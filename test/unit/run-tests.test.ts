// The rules of scripts/run-tests.ts (npm test): every test file names the services it uses, and
// a file that needs one alone never runs beside a file that uses it.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { jobs, parseServices, Services, type Claims } from '../../scripts/run-tests.ts';

const claims = (entries: Array<[string, 'shared' | 'alone']>) => new Map(entries) as Claims;

describe('npm test: which files may run together', () => {
  it('every integration and model file has a valid services line (jobs() parses them all)', () => {
    const all = jobs();
    assert.ok(all.length > 40, `${all.length} jobs`);
    // the unit tests need no service, and run beside the other files
    assert.deepEqual([...all.find((j) => j.name === 'unit')!.claims], []);
    // the pooler pass shares PgBouncer
    for (const job of all.filter((j) => j.name.startsWith('pgbouncer '))) assert.ok(job.claims.has('pgbouncer'), job.name);
    // ...and runs the guarantee files against a partitioned outbox (test/integration/helpers.ts OUTBOX_SHAPE)
    const pooled = all.filter((j) => j.name.startsWith('pgbouncer '));
    assert.ok(pooled.length > 0);
    for (const job of pooled) assert.equal(job.env.TEST_OUTBOX_SHAPE, 'partitioned', job.name);
  });

  it('parses shared and alone services, and refuses a missing line or an unknown service', () => {
    assert.deepEqual([...parseServices('a.test.ts', '// services: postgres, kafka alone\n// more')], [['postgres', 'shared'], ['kafka', 'alone']]);
    assert.throws(() => parseServices('a.test.ts', '// no line\n'), /a\.test\.ts: no "\/\/ services: \.\.\." header line/);
    assert.throws(() => parseServices('a.test.ts', '// services: postgres, redis\n'), /"redis" in its services line is not one of/);
    assert.throws(() => parseServices('a.test.ts', '// services: kafka sometimes\n'), /"kafka sometimes"/);
  });

  it('a service used alone is busy for everyone else, a shared one only for who needs it alone', () => {
    const s = new Services();
    const shared = claims([['kafka', 'shared'], ['postgres', 'shared']]);
    const kafkaAlone = claims([['kafka', 'alone']]);
    assert.deepEqual(s.busy(kafkaAlone), []);
    s.take(shared);
    assert.deepEqual(s.busy(shared), [], 'shared with shared');
    assert.deepEqual(s.busy(kafkaAlone), ['kafka'], 'alone waits for the sharers');
    s.release(shared);
    s.take(kafkaAlone);
    assert.deepEqual(s.busy(shared), ['kafka'], 'sharers wait for the one alone');
    assert.deepEqual(s.busy(claims([['postgres', 'shared']])), [], 'other services stay free');
    s.release(kafkaAlone);
    assert.deepEqual(s.busy(shared), []);
  });
});
