// Publishing that survives the broker's answers (G1, G2, G6): sends sized to fit the topic,
// a producer never reused after a failed send, failures handled by their scope (record, topic,
// producer, credentials, broker). Real broker throughout; the broker's answers are lost on purpose
// through a TCP proxy (kafka-proxy.ts) that the broker advertises to the clients that use it.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { CreateSecretCommand, DeleteSecretCommand, PutSecretValueCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import type { Sql } from 'postgres';
import { loadConfig } from '../../src/config.ts';
import { BrokerUnavailableError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { Runtime } from '../../src/runtime.ts';
import { SecretsManagerSource } from '../../src/secrets.ts';
import { startKafkaProxy } from './kafka-proxy.ts';
import {
  AWS_ENDPOINT_URL,
  KAFKA_PROXIED_PORT,
  KAFKA_PROXY_PORT,
  KAFKA_SASL_PROXIED_PORT,
  KAFKA_SASL_PROXY_PORT,
  KAFKA_SCRAM_PASSWORD,
  KAFKA_SCRAM_USER,
  setScramPassword,
  topicCount,
  uniqueName,
  consumeAll,
  copiesById,
  createTopics,
  db,
  firstCopyOrder,
  fixture,
  insertEvents,
  isSorted,
  kafka,
  markedIds,
  startCli,
  type Consumed,
  type EventSpec,
  invokeOk as invoke,
} from './helpers.ts';

let sql: Sql;
before(() => {
  sql = db();
});
after(async () => {
  await sql.end();
});

const t = (table: string) => qualified(parseTableName(table));

async function attemptsCharged(table: string): Promise<number> {
  const [r] = await sql.unsafe<{ n: string }[]>(`SELECT coalesce(sum(attempts), 0) AS n FROM ${t(table)}`);
  return Number(r!.n);
}

/** Each row's copies on Kafka: every marked row at least once (G1), none more than `maxCopies`. */
function assertCopies(msgs: Consumed[], marked: Set<string>, maxCopies: number): Map<string, number> {
  const copies = copiesById(msgs);
  const lost = [...marked].filter((id) => !copies.has(id));
  assert.equal(lost.length, 0, `${lost.length} rows are marked sent but not on Kafka`);
  const over = [...copies].filter(([, n]) => n > maxCopies);
  assert.equal(over.length, 0, `${over.length} rows arrived more than ${maxCopies} times (first: ${over[0]?.join(' ×')})`);
  return copies;
}

describe('G6: sends that fit: rows that each fit are never refused together', () => {
  it('150 rows of one aggregate (~150 KB) on a 3-partition topic with max.message.bytes=100000, between 60 small aggregates; a second topic meanwhile: every row once, each aggregate in order (G4)', async () => {
    const f = await fixture(sql, 'fit', ['small', 'other']);
    const limited = f.topic('limited');
    await createTopics([limited], 3, [{ name: 'max.message.bytes', value: '100000' }]);
    const small = (round: number): EventSpec[] => Array.from({ length: 30 }, (_, i) => ({ aggregatetype: 'limited', aggregateid: `s-${i}`, payload: { round, i } }));
    const events: EventSpec[] = [
      ...small(1),
      ...Array.from({ length: 150 }, (_, i) => ({ aggregatetype: 'limited', aggregateid: 'big', payload: { i, pad: 'b'.repeat(1_000) } })),
      ...small(2),
      ...Array.from({ length: 40 }, (_, i) => ({ aggregatetype: 'other', aggregateid: `o-${i % 5}`, payload: { i } })),
    ];
    const ids = await insertEvents(sql, f.table, events);
    const seqOf = new Map(ids.map((id, i) => [id, i]));

    const s1 = await invoke(f.env);
    const summaries = [s1];
    if ((await markedIds(sql, f.table)).size < ids.length) summaries.push(await invoke(f.env));
    assert.equal((await markedIds(sql, f.table)).size, ids.length, `every row marked within two invocations: ${JSON.stringify(summaries)}`);
    for (const s of summaries) assert.deepEqual([s.parked, s.retried, s.stoppedBecause === 'broker-unavailable'], [0, 0, false], JSON.stringify(s));
    assert.equal(await attemptsCharged(f.table), 0, 'no row was charged an attempt');

    const msgs = await consumeAll([limited, f.topic('other')], ids.length);
    // exactly once: no send was refused, so nothing had to be sent again
    const copies = assertCopies(msgs, new Set(ids), 1);
    assert.equal(copies.size, ids.length);
    for (const [key, order] of firstCopyOrder(msgs, (id) => seqOf.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} in seq order`);
  });

  it('a limit the relay did not know, on a 3-partition topic: the broker refuses one partition (MESSAGE_TOO_LARGE) and appends the others; only the big row is parked, the rest arrive, none more than twice, every marked row on Kafka (G1)', async () => {
    const f = await fixture(sql, 'sizebroker');
    const small = f.topic('small');
    await createTopics([small], 3, [{ name: 'max.message.bytes', value: '2048' }]);
    // 60 small messages (~5 KB, ~1.7 KB per partition) and one big one (~5 KB); the configured
    // limit is larger than the topic's, so neither the relay's row check nor its split sees it:
    // only the broker's answer can tell which row is to blame
    const events: EventSpec[] = Array.from({ length: 60 }, (_, i) => ({ aggregatetype: 'small', aggregateid: `s-${i}`, payload: { i, pad: 'p'.repeat(20) } }));
    events.splice(10, 0, { aggregatetype: 'small', aggregateid: 'big', payload: { blob: 'x'.repeat(5_000) } });
    const ids = await insertEvents(sql, f.table, events);
    const s = await invoke({ ...f.env, OUTBOX_MAX_MESSAGE_BYTES: '1000000' });
    assert.equal(s.published, 60, JSON.stringify(s));
    assert.equal(s.parked, 1);
    const [row] = await sql.unsafe<{ attempts: number; parked: boolean; last_error: string }[]>(
      `SELECT attempts, parked_at IS NOT NULL AS parked, last_error FROM ${t(f.table)} WHERE id = $1`,
      [ids[10]!],
    );
    assert.deepEqual([row!.attempts, row!.parked], [1, true]);
    assert.match(row!.last_error, /MESSAGE_TOO_LARGE/);
    const msgs = await consumeAll([small], 60);
    const copies = assertCopies(msgs, await markedIds(sql, f.table), 2);
    assert.deepEqual(new Set(copies.keys()), new Set(ids.filter((_, i) => i !== 10)));
  });
});

describe('G6: a topic refused as a whole: backed off, no row charged, other topics flow', () => {
  it('a topic deleted in the middle of a backlog: its rows stay pending with attempts = 0, the other topic is delivered; recreated, everything is delivered, in order per aggregate (G4)', async () => {
    const f = await fixture(sql, 'deleted', ['gone', 'stay']);
    const events: EventSpec[] = Array.from({ length: 4_000 }, (_, i) => ({ aggregatetype: i % 2 ? 'stay' : 'gone', aggregateid: `${i % 2 ? 's' : 'g'}-${i % 40}`, payload: { i } }));
    const ids = await insertEvents(sql, f.table, events);
    const gone = new Set(ids.filter((_, i) => events[i]!.aggregatetype === 'gone'));
    const seqOf = new Map(ids.map((id, i) => [id, i]));
    // small batches, slowed down, so the topic goes away while the backlog is being relayed
    const run = startCli(['invoke', '--timeout', '60000'], { ...f.env, OUTBOX_BATCH_SIZE: '100', OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '100' });
    for (let sent = 0; sent < 600; await new Promise((r) => setTimeout(r, 20))) sent = (await markedIds(sql, f.table)).size;
    const admin = kafka.admin();
    await admin.connect();
    try {
      await admin.deleteTopics({ topics: [f.topic('gone')] });
    } finally {
      await admin.disconnect();
    }
    const res = await run.result;
    assert.equal(res.code, 0, `a backed-off topic does not fail the invocation:\n${res.stderr.slice(-3_000)}`);
    const s = res.summary!;
    assert.deepEqual(s.topicsBackedOff, [f.topic('gone')], JSON.stringify(s));
    assert.deepEqual([s.retried, s.parked], [0, 0]);
    assert.match(res.stderr, /topic refused by the broker/);

    const [charged] = await sql.unsafe<{ n: string }[]>(`SELECT count(*) AS n FROM ${t(f.table)} WHERE attempts > 0 OR parked_at IS NOT NULL`);
    assert.equal(Number(charged!.n), 0, 'no row charged or parked');
    const marked = await markedIds(sql, f.table);
    const stay = ids.filter((id) => !gone.has(id));
    assert.equal(stay.filter((id) => !marked.has(id)).length, 0, 'every row of the other topic was delivered in the same invocation');
    const goneLeft = [...gone].filter((id) => !marked.has(id));
    assert.ok(goneLeft.length > 0 && goneLeft.length < gone.size, `some rows of the deleted topic were sent before, the rest wait (${goneLeft.length} of ${gone.size})`);

    await createTopics([f.topic('gone')], 3);
    const after = await invoke(f.env, 60_000);
    assert.deepEqual(after.topicsBackedOff, []);
    assert.equal((await markedIds(sql, f.table)).size, ids.length, JSON.stringify(after));
    // the recreated topic holds exactly the rows that waited, in order per aggregate; the other topic holds every row
    const recreated = await consumeAll([f.topic('gone')], goneLeft.length);
    assert.deepEqual(new Set(copiesById(recreated).keys()), new Set(goneLeft));
    for (const [key, order] of firstCopyOrder(recreated, (id) => seqOf.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} in seq order`);
    assertCopies(await consumeAll([f.topic('stay')], stay.length), new Set(stay), 2);
  });
});

describe('G1/G2: a lost answer: the broker appended a batch, the relay never heard', () => {
  // The warm container's producer sends through a proxy that swallows the broker's answers to
  // Produce requests. Another container then sends and marks those rows, and the warm container
  // goes on with as many new rows, to the same partition: a producer reused with its sequence
  // numbers rolled back would send them under the sequence range the broker already holds, be told
  // "duplicate" and mark rows that were never written.
  for (const mode of ['drop', 'hold'] as const) {
    const how = mode === 'drop' ? 'the answer dropped and the connection closed, the client retries exhausted' : 'the answer held past the invocation\'s budget';
    it(`${how}: the next warm invocation marks only rows that are on Kafka; duplicates at most one batch`, async () => {
      const f = await fixture(sql, `lost${mode}`, ['order'], 1);
      const proxy = await startKafkaProxy({ listenPort: KAFKA_PROXY_PORT, targetPort: KAFKA_PROXIED_PORT });
      const env = { ...f.env, OUTBOX_BATCH_SIZE: '10', OUTBOX_LOG_LEVEL: 'error' };
      const warm = new Runtime(loadConfig({ ...env, KAFKA_BROKERS: `127.0.0.1:${KAFKA_PROXY_PORT}` }), createLogger('error'));
      const other = new Runtime(loadConfig(env), createLogger('error'));
      const ten = (p: string): EventSpec[] => Array.from({ length: 10 }, (_, i) => ({ aggregateid: `${p}-${i % 3}`, payload: { p, i } }));
      try {
        // a producer that has sent before, as in any warm container
        await insertEvents(sql, f.table, ten('w'));
        assert.equal((await warm.invoke(20_000)).published, 10);

        const lost = await insertEvents(sql, f.table, ten('a'));
        proxy.setProduceAnswers(mode, 30_000);
        const failed = await warm.invoke(mode === 'drop' ? 20_000 : 5_000).then(
          (s) => assert.fail(`the invocation should fail: ${JSON.stringify(s)}`),
          (err: unknown) => err,
        );
        assert.ok(failed instanceof BrokerUnavailableError, String(failed));
        assert.ok(proxy.dropped >= 1, 'the proxy withheld at least one answer');
        const marked = await markedIds(sql, f.table);
        assert.ok(!lost.some((id) => marked.has(id)), 'nothing marked without its answer');
        proxy.setProduceAnswers('pass');

        // another container takes the same rows and marks them
        assert.equal((await other.invoke(20_000)).published, 10);
        const next = await insertEvents(sql, f.table, ten('b'));
        const s = await warm.invoke(20_000);
        assert.equal(s.published, 10, JSON.stringify(s));

        const all = await consumeAll([f.topic('order')], await topicCount([f.topic('order')]));
        const copies = assertCopies(all, await markedIds(sql, f.table), 2);
        for (const id of next) assert.equal(copies.get(id), 1, 'the warm container\'s next rows are on Kafka, once');
        const twice = [...copies].filter(([, n]) => n > 1).map(([id]) => id);
        assert.ok(twice.every((id) => lost.includes(id)), 'only the batch whose answer was lost is duplicated');
        assert.ok(warm.publisher().connects >= 2, 'a new producer after the failed send');
      } finally {
        proxy.setProduceAnswers('pass');
        await Promise.all([warm.close(), other.close()]);
        await proxy.close();
      }
    });
  }
});

describe('Kafka credentials rotate at any time (SASL/SCRAM)', () => {
  it('password changed on the broker and in the secret between two warm invocations, connections dropped: the second re-reads the secret once and delivers', async () => {
    const sm = new SecretsManagerClient({ endpoint: AWS_ENDPOINT_URL, region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' }, maxAttempts: 2 });
    const f = await fixture(sql, 'saslrot');
    const secretId = `outbox-relay-test/${uniqueName('kafka')}`;
    const creds = (password: string) => JSON.stringify({ username: KAFKA_SCRAM_USER, password, mechanism: 'scram-sha-256' });
    await sm.send(new CreateSecretCommand({ Name: secretId, SecretString: creds(KAFKA_SCRAM_PASSWORD) }));
    const proxy = await startKafkaProxy({ listenPort: KAFKA_SASL_PROXY_PORT, targetPort: KAFKA_SASL_PROXIED_PORT });
    const source = new SecretsManagerSource(sm);
    const logs: string[] = [];
    const rotated = `rotated-${uniqueName('pw')}`;
    const rt = new Runtime(
      loadConfig({ ...f.env, KAFKA_BROKERS: `127.0.0.1:${KAFKA_SASL_PROXY_PORT}`, KAFKA_SECRET_ID: secretId, AWS_REGION: 'us-east-1' }),
      createLogger('warn', {}, (l) => logs.push(l)),
      source,
    );
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      assert.equal((await rt.invoke(20_000)).published, 2);
      assert.equal(source.fetches, 1);

      // rotate: the broker first (as a rotation Lambda does), then the secret; the broker drops
      // the connections (a restart, a balancer, a re-authentication), so the next request logs in
      await setScramPassword(KAFKA_SCRAM_USER, rotated, 'SCRAM-SHA-256');
      await sm.send(new PutSecretValueCommand({ SecretId: secretId, SecretString: creds(rotated) }));
      proxy.dropAllConnections();

      await insertEvents(sql, f.table, [{ aggregateid: 'c' }]);
      const s = await rt.invoke(20_000);
      assert.equal(s.published, 1, JSON.stringify(s));
      assert.equal(source.fetches, 2, 'the secret was read again, once');
      assert.ok(!logs.some((l) => l.includes(rotated) || l.includes(KAFKA_SCRAM_PASSWORD)), 'no password in the logs');
      assert.equal((await markedIds(sql, f.table)).size, 3);
      assert.equal(await topicCount([f.topic('order')]), 3);
    } finally {
      await rt.close();
      await proxy.close();
      await setScramPassword(KAFKA_SCRAM_USER, KAFKA_SCRAM_PASSWORD, 'SCRAM-SHA-256');
      await sm.send(new DeleteSecretCommand({ SecretId: secretId, ForceDeleteWithoutRecovery: true })).catch(() => undefined);
      sm.destroy();
    }
  });
});
