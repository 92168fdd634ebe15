// services: kafka
// kcat (librdkafka, scripts/services/kcat.sh) as the reader that exactly-once (issue 36) will be
// judged by: a consumer that is neither of the relay's clients, so a test cannot pass because a
// client agrees with itself. Here kafkajs writes one transaction that commits, one that aborts and
// one left open; read_committed must see the committed records only (and stop at the open
// transaction), read_uncommitted every record. Runs once: no relay, no client of the relay's.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Producer } from 'kafkajs';
import { createTopics, kafka, uniqueName } from './helpers.ts';
import { kcatPath, kcatRead } from './kcat.ts';

function transactional(id: string): Producer {
  return kafka.producer({ transactionalId: id, idempotent: true, maxInFlightRequests: 1 });
}

const records = (prefix: string, n: number) => Array.from({ length: n }, (_, i) => ({ key: `${prefix}-${i}`, value: `${prefix} value ${i}` }));

describe('kcat reads transactions as a read_committed consumer does', () => {
  const topic = uniqueName('test.kcat');
  const done = transactional(uniqueName('kcat-tx-done'));
  const open = transactional(uniqueName('kcat-tx-open'));
  let openTx: Awaited<ReturnType<Producer['transaction']>> | undefined;
  let kcat = '';

  before(async () => {
    kcat = kcatPath();
    await createTopics([topic], 1);
    await done.connect();
    await open.connect();

    const committed = await done.transaction();
    await committed.send({ topic, messages: records('committed', 3) });
    await committed.commit();

    const aborted = await done.transaction();
    await aborted.send({ topic, messages: records('aborted', 2) });
    await aborted.abort();

    openTx = await open.transaction();
    await openTx.send({ topic, messages: records('open', 2) });
  });

  after(async () => {
    // its records stay aborted on the log, past the last read: nothing else reads this topic
    await openTx?.abort().catch(() => {});
    await done.disconnect();
    await open.disconnect();
  });

  it('read_committed: the committed transaction only', async () => {
    assert.deepEqual(await kcatRead(kcat, topic, 'read_committed'), ['committed-0=committed value 0', 'committed-1=committed value 1', 'committed-2=committed value 2']);
  });

  it('read_uncommitted: every record, the aborted and the open ones too', async () => {
    const seen = await kcatRead(kcat, topic, 'read_uncommitted');
    assert.deepEqual(
      seen.map((l) => l.split('=')[0]),
      ['committed-0', 'committed-1', 'committed-2', 'aborted-0', 'aborted-1', 'open-0', 'open-1'],
    );
  });
});
