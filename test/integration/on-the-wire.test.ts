// services: postgres, kafka, moto, kafka-proxy-ports alone
// On the wire: tests that put a proxy between the relay and a service, to see the order of what it
// sends or to lose what the service answers (kafka-proxy.ts, pg-proxy.ts). G2: a batch's COMMIT
// reaches the database before the next batch reaches the broker, and a crash while a COMMIT is on
// the wire re-sends only the batch in flight. G1/G2: a Produce answer lost (the broker appended,
// the relay never heard) marks only rows that are on Kafka. Credentials rotated while connections
// drop. The broker advertises the proxy's fixed ports (scripts/services/kafka.sh), so this file
// runs while no other file binds them.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { CreateSecretCommand, DeleteSecretCommand, PutSecretValueCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import { loadConfig } from '../../src/config/load.ts';
import { BrokerUnavailableError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { SecretsManagerSource } from '../../src/lambda/secrets.ts';
import { startKafkaProxy } from './kafka-proxy.ts';
import { startPgProxy, type PgProxyConnection } from './pg-proxy.ts';
import {
  AWS_ENDPOINT_URL,
  KAFKA_PROXIED_PORT,
  KAFKA_PROXY_PORT,
  KAFKA_SASL_PROXIED_PORT,
  KAFKA_SASL_PROXY_PORT,
  KAFKA_SCRAM_PASSWORD,
  KAFKA_SCRAM_USER,
  PLAINTEXT_DB,
  PLAINTEXT_KAFKA,
  consumeAll,
  copiesById,
  fileDb,
  fixture,
  insertEvents,
  markedIds,
  runCli,
  setScramPassword,
  startCli,
  topicCount,
  twiceIds,
  uniqueName,
  type EventSpec,
  assertCopies,
} from './helpers.ts';

const sql = fileDb();

describe('G2: a batch\'s COMMIT reaches the database before the next batch reaches the broker', () => {
  it('seen on the wire: between the relay and each service a proxy notes every COMMIT and every Produce request, in one ordered log', async () => {
    const f = await fixture(sql, 'g2wire', ['order'], 1);
    // 450 aggregates, batches of 100: each full batch has the next one claimed ahead, published
    // right after this one's COMMIT is written, without waiting for its answer; the short last
    // batch is claimed by nobody ahead of time, so nothing else flushes the COMMIT before it
    await insertEvents(sql, f.table, Array.from({ length: 450 }, (_, i) => ({ aggregateid: `a-${i}`, payload: { i, pad: 'p'.repeat(500) } })));
    const log: Array<'commit' | 'produce'> = [];
    const kafkaProxy = await startKafkaProxy({ listenPort: KAFKA_PROXY_PORT, targetPort: KAFKA_PROXIED_PORT, onProduceRequest: () => log.push('produce') });
    // in front of whatever the relay connects to: Postgres, or the pooler in the pooled run
    const pgProxy = await startPgProxy({ listenPort: 0, targetPort: Number(new URL(f.env.DATABASE_URL!).port || 5432), onStatement: (text) => void (text.trim().toUpperCase() === 'COMMIT' && log.push('commit')) });
    try {
      const url = new URL(f.env.DATABASE_URL!);
      url.port = String(pgProxy.port);
      // a child process, so the relay's writes and the proxies' reads are on different event loops;
      // retention off: its chunks commit on a connection of their own and would blur the count
      const res = await runCli(['invoke', '--timeout', '30000'], { ...f.env, DATABASE_URL: url.toString(), KAFKA_BROKERS: `127.0.0.1:${KAFKA_PROXY_PORT}`, ...PLAINTEXT_DB, ...PLAINTEXT_KAFKA, OUTBOX_BATCH_SIZE: '100', OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0' });
      assert.equal(res.code, 0, res.stderr);
      assert.equal(res.summary?.published, 450);
      assert.equal(res.summary?.batches, 5);
    } finally {
      await kafkaProxy.close();
      await pgProxy.close();
    }
    const produces = log.flatMap((e, i) => (e === 'produce' ? [i] : []));
    const commits = log.flatMap((e, i) => (e === 'commit' ? [i] : []));
    assert.deepEqual([produces.length, commits.length], [5, 5], log.join(' '));
    for (let k = 0; k + 1 < produces.length; k++) {
      assert.ok(commits[k]! < produces[k + 1]!, `batch ${k + 1}'s COMMIT went out before batch ${k + 2}'s records: ${log.join(' ')}`);
      assert.ok(produces[k]! < commits[k]!, `batch ${k + 1}'s COMMIT followed its own acks (G1): ${log.join(' ')}`);
    }
  });
});

describe('G1/G2: a crash after a batch\'s COMMIT went out, while the next batch is in flight', () => {
  it('killed while COMMIT 1 is on the wire, its answer not received, and batch 2 on the broker: the database commits what it received, only batch 2 is re-sent', async () => {
    const f = await fixture(sql, 'crash2', ['order'], 1);
    // 150 aggregates, batches of 100: batch 2 (rows 100-149) is claimed ahead while batch 1 is in
    // flight, and being short it claims nothing ahead itself, so nothing but commitIfAllPremarked's
    // own flush puts batch 1's COMMIT on the wire before batch 2's records go to the broker
    const ids = await insertEvents(sql, f.table, Array.from({ length: 150 }, (_, i) => ({ aggregateid: `a-${i}`, payload: { i } })));
    const log: string[] = [];
    let commits = 0;
    let commitAnswer: PgProxyConnection | undefined;
    // in front of whatever the relay connects to: Postgres, or the pooler in the pooled run. The
    // first COMMIT (batch 1's) reaches the server, which executes it; its answer is held here, so
    // the relay never hears it
    const pgProxy = await startPgProxy({
      listenPort: 0,
      targetPort: Number(new URL(f.env.DATABASE_URL!).port || 5432),
      onStatement: (text, connection) => {
        if (text.trim().toUpperCase() !== 'COMMIT') return;
        log.push(`commit ${++commits}`);
        if (commits === 1) {
          commitAnswer = connection;
          connection.holdAnswers();
        }
      },
    });
    // The crash: the moment batch 2's Produce request reaches the broker, the way to the database
    // is cut (what the server has received by then is all it will get from this process); the
    // process is killed once batch 2 is on the topic
    let produces = 0;
    const batch2Sent = Promise.withResolvers<void>();
    const kafkaProxy = await startKafkaProxy({
      listenPort: KAFKA_PROXY_PORT,
      targetPort: KAFKA_PROXIED_PORT,
      onProduceRequest: () => {
        log.push(`produce ${++produces}`);
        if (produces !== 2) return;
        pgProxy.cutToServer();
        batch2Sent.resolve();
      },
    });
    let killed;
    try {
      const url = new URL(f.env.DATABASE_URL!);
      url.port = String(pgProxy.port);
      // a child process, so the relay's writes and the proxies' reads are on different event loops;
      // retention off: its chunks commit on a connection of their own
      const running = startCli(['invoke', '--timeout', '60000'], { ...f.env, DATABASE_URL: url.toString(), KAFKA_BROKERS: `127.0.0.1:${KAFKA_PROXY_PORT}`, ...PLAINTEXT_DB, ...PLAINTEXT_KAFKA, OUTBOX_BATCH_SIZE: '100', OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0' });
      let timer: NodeJS.Timeout | undefined;
      const first = await Promise.race([
        batch2Sent.promise.then(() => 'sent' as const),
        running.result.then((r) => `the relay ended before batch 2 was sent (exit ${String(r.code)}):\n${r.stderr.slice(-3_000)}`),
        new Promise<string>((resolve) => (timer = setTimeout(resolve, 30_000, 'batch 2 was not sent within 30 s'))),
      ]);
      clearTimeout(timer);
      if (first !== 'sent') {
        running.child.kill('SIGKILL');
        assert.fail(`${first} (${log.join(', ')})`);
      }
      // batch 2 on the topic, and batch 1's COMMIT answered by the server (it has executed what
      // it received): the answer is held, so the relay is where it was at the cut
      for (const until = Date.now() + 10_000; Date.now() < until; await sleep(50)) {
        if ((commitAnswer?.heldBytes ?? 0) > 0 && (await topicCount([f.topic('order')])) >= 150) break;
      }
      running.child.kill('SIGKILL');
      killed = await running.result;
    } finally {
      await kafkaProxy.close();
      await pgProxy.close();
    }
    assert.equal(killed.signal, 'SIGKILL');
    assert.equal(await topicCount([f.topic('order')]), 150, 'two batches reached Kafka');
    assert.equal(commits, 1, `one COMMIT: batch 1's (${log.join(', ')})`);
    // G2: the COMMIT was written before batch 2 reached the broker, so the server received it and
    // committed it, though the relay died without its answer
    assert.deepEqual(await markedIds(sql, f.table), new Set(ids.slice(0, 100)), `exactly batch 1 is committed as sent (${log.join(', ')}; ${pgProxy.cutMessages} messages cut from the database)`);
    // and the kill was exact: the server had answered that COMMIT, and the relay never heard it
    assert.ok(commitAnswer && commitAnswer.heldBytes > 0, `batch 1's COMMIT was answered by the server, and the answer held from the relay: ${log.join(', ')}`);

    const res = await runCli(['invoke', '--timeout', '30000'], f.env);
    assert.equal(res.code, 0, res.stderr);
    assert.equal(res.summary?.published, 50);
    const msgs = await consumeAll([f.topic('order')], 200);
    const copies = copiesById(msgs);
    assert.deepEqual(new Set(copies.keys()), new Set(ids), 'every row arrived');
    assert.deepEqual(twiceIds(copies), new Set(ids.slice(100)), 'only batch 2, the batch in flight, is duplicated');
    assert.equal(msgs.length, 200);
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
      const warm = new Runtime(loadConfig({ ...env, KAFKA_BROKERS: `127.0.0.1:${KAFKA_PROXY_PORT}`, ...PLAINTEXT_KAFKA }), createLogger('error'));
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
      loadConfig({ ...f.env, KAFKA_BROKERS: `127.0.0.1:${KAFKA_SASL_PROXY_PORT}`, ...PLAINTEXT_KAFKA, KAFKA_SECRET_ID: secretId, AWS_REGION: 'us-east-1' }),
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
