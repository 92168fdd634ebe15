// A Kafka broker of a test file's own, for the files that kill or pause the broker: breaking the
// shared one (scripts/services/kafka.sh) would break every file running beside them, so they would
// have to run alone. The same jars as the shared broker (.cache/kafka/libs, which `services:up`
// installs), one KRaft node on two free ports, its data in a temporary directory. ~2 s of CPU to
// format its storage and ~7 s to start a JVM, against a minute or more of the suite run alone.
//
//   const broker = await startPrivateBroker();
//   useKafka(broker.address);            // helpers.ts: fixtures, consumers and admin go there
//   process.kill(broker.pid, 'SIGKILL'); await broker.start();     // a crash, then a restart
//   process.kill(broker.pid, 'SIGSTOP'); await broker.resume();    // a freeze, then SIGCONT
//   await broker.stop();
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import kafkajs from 'kafkajs';
import { ROOT } from './helpers.ts';

const LIBS = join(ROOT, '.cache', 'kafka', 'libs', '*');
const PROBE = 'private-broker.ready';

export interface PrivateBroker {
  /** host:port for KAFKA_BROKERS */
  readonly address: string;
  /** the broker's process, to kill or pause */
  readonly pid: number;
  /** Starts it (again, after a kill) on the same data and ports; resolves once it answers metadata requests. */
  start(): Promise<void>;
  /** SIGCONT, then waits until it answers again (KRaft fences a broker whose heartbeats stopped). */
  resume(): Promise<void>;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((r) => server.close(r));
  return port;
}

export async function startPrivateBroker(): Promise<PrivateBroker> {
  const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-broker-'));
  const [port, controllerPort] = [await freePort(), await freePort()];
  const address = `127.0.0.1:${port}`;
  const config = join(dir, 'server.properties');
  // the shared broker's settings (scripts/services/kafka.sh) that tests depend on: no topic created
  // by a client, one replica, three partitions
  writeFileSync(
    config,
    [
      'process.roles=broker,controller',
      'node.id=1',
      `controller.quorum.bootstrap.servers=127.0.0.1:${controllerPort}`,
      `listeners=PLAINTEXT://${address},CONTROLLER://127.0.0.1:${controllerPort}`,
      `advertised.listeners=PLAINTEXT://${address}`,
      'inter.broker.listener.name=PLAINTEXT',
      'controller.listener.names=CONTROLLER',
      'listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT',
      `log.dirs=${join(dir, 'data')}`,
      'num.partitions=3',
      'default.replication.factor=1',
      'auto.create.topics.enable=false',
      'min.insync.replicas=1',
      'offsets.topic.replication.factor=1',
      'offsets.topic.num.partitions=3',
      'transaction.state.log.replication.factor=1',
      'transaction.state.log.min.isr=1',
      'share.coordinator.state.topic.replication.factor=1',
      'share.coordinator.state.topic.min.isr=1',
      'group.initial.rebalance.delay.ms=0',
      '',
    ].join('\n'),
  );
  const java = (args: string[]) => spawnSync('java', ['-XX:TieredStopAtLevel=1', '-XX:+UseSerialGC', '-cp', LIBS, ...args], { encoding: 'utf8', timeout: 120_000 });
  const id = java(['kafka.tools.StorageTool', 'random-uuid']);
  const format = java(['kafka.tools.StorageTool', 'format', '--standalone', '-t', id.stdout.trim().split('\n').pop()!, '-c', config]);
  if (format.status !== 0) throw new Error(`formatting a private broker's storage failed (is .cache/kafka/libs there? npm run services:up installs it):\n${id.stderr}${format.stdout}${format.stderr}`);

  const log = join(dir, 'broker.log');
  let child: ChildProcess | undefined;
  const alive = () => child !== undefined && child.exitCode === null && child.signalCode === null;

  async function ready(timeoutMs = 120_000): Promise<void> {
    const until = Date.now() + timeoutMs;
    const admin = new kafkajs.Kafka({ clientId: 'private-broker', brokers: [address], logLevel: kafkajs.logLevel.NOTHING, retry: { retries: 0 } }).admin();
    for (;;) {
      if (!alive()) throw new Error(`the private broker ${address} exited: ${readFileSync(log, 'utf8').slice(-3_000)}`);
      try {
        await admin.connect();
        // answering metadata is not enough: after a restart or a pause KRaft fences the broker for a
        // few seconds, and until it is unfenced its partitions have no leader. A probe topic's
        // offsets answer only once they have one.
        if (!(await admin.listTopics()).includes(PROBE)) await admin.createTopics({ topics: [{ topic: PROBE, numPartitions: 1 }], waitForLeaders: true });
        await admin.fetchTopicOffsets(PROBE);
        await admin.disconnect();
        return;
      } catch (err) {
        await admin.disconnect().catch(() => undefined);
        if (Date.now() > until) throw new Error(`the private broker ${address} did not answer within ${timeoutMs} ms (${String(err)}): ${readFileSync(log, 'utf8').slice(-3_000)}`);
        await new Promise((r) => setTimeout(r, 250));
      }
    }
  }

  const broker: PrivateBroker = {
    address,
    get pid() {
      return child!.pid!;
    },
    async start() {
      if (alive()) return;
      const out = openSync(log, 'a');
      child = spawn('java', ['-Xmx256m', '-Xms64m', '-XX:+UseSerialGC', `-Dlog4j2.configurationFile=${join(ROOT, '.cache', 'kafka', 'log4j2.properties')}`, '-cp', LIBS, 'kafka.Kafka', config], {
        stdio: ['ignore', out, out],
      });
      await ready();
    },
    async resume() {
      if (alive()) process.kill(child!.pid!, 'SIGCONT');
      await ready();
    },
    async stop() {
      if (alive()) {
        const exited = new Promise((r) => child!.once('exit', r));
        process.kill(child!.pid!, 'SIGCONT');
        process.kill(child!.pid!, 'SIGKILL');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await broker.start();
  return broker;
}
