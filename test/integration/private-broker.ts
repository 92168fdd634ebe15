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
//
// With `mskIam`, the broker has a second listener, `iamAddress`, that logs clients in as Amazon
// MSK's IAM listener does: SASL/OAUTHBEARER with a SigV4-signed token over TLS (SASL_SSL, the
// certificate of scripts/services/tls.sh: trust .cache/tls/ca.pem), checked by
// scripts/services/MskIamValidator.java against the local AWS emulator's key (test/test).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import kafkajs from 'kafkajs';
import { ROOT, TLS_DIR } from './helpers.ts';
import { freePorts } from './free-ports.ts';

const LIBS = join(ROOT, '.cache', 'kafka', 'libs', '*');
const PROBE = 'private-broker.ready';

export interface PrivateBroker {
  /** host:port for KAFKA_BROKERS */
  readonly address: string;
  /** with `mskIam`: host:port of the SASL_SSL/OAUTHBEARER listener whose tokens MskIamValidator checks */
  readonly iamAddress: string | undefined;
  /** the broker's process, to kill or pause */
  readonly pid: number;
  /** its stdout and stderr (MskIamValidator prints why it refused a token there) */
  readonly logFile: string;
  /** Starts it (again, after a kill) on the same data and ports; resolves once it answers metadata requests. */
  start(): Promise<void>;
  /** SIGCONT, then waits until it answers again (KRaft fences a broker whose heartbeats stopped). */
  resume(): Promise<void>;
  /** SIGKILL, resolved once the process is gone (so that start() starts it again at once). */
  kill(): Promise<void>;
  stop(): Promise<void>;
}

/** The IAM listener's options: MskIamValidator's JAAS options, and how long a session may last before the client must log in again. */
export interface MskIamListener {
  /** the one access key the validator knows and its secret key (default test/test, the emulator's) */
  accessKeyId?: string;
  secretAccessKey?: string;
  /** a token is expired this long after its X-Amz-Date at most, whatever its X-Amz-Expires says (default 900) */
  maxLifetimeSeconds?: number;
  /** the listener's connections.max.reauth.ms: a session ends then, or when its token expires if sooner (default 0: never) */
  maxReauthMs?: number;
}

const VALIDATOR_SOURCE = join(ROOT, 'scripts', 'services', 'MskIamValidator.java');

/**
 * MskIamValidator compiled against the broker's jars, once per version of its source: a directory
 * under .cache/msk-iam-validator named by the source's hash (compiled into a temporary directory
 * and renamed, so a concurrent run never sees half a build).
 */
export function mskIamValidatorClasses(): string {
  const hash = createHash('sha256').update(readFileSync(VALIDATOR_SOURCE)).digest('hex').slice(0, 16);
  const dir = join(ROOT, '.cache', 'msk-iam-validator', hash);
  if (existsSync(join(dir, 'MskIamValidator.class'))) return dir;
  mkdirSync(join(dir, '..'), { recursive: true });
  const building = mkdtempSync(`${dir}.building-`);
  // javac as a module of the runtime, not the `javac` command: the JRE that scripts/services/kafka.sh
  // installs (openjdk-17-jre-headless) has the compiler module (it runs KafkaScram.java) but no javac
  // (the compiler's class path takes no `dir/*`: that is the launchers' expansion)
  const jars = readdirSync(dirname(LIBS)).filter((f) => f.endsWith('.jar')).map((f) => join(dirname(LIBS), f));
  const javac = spawnSync('java', ['-m', 'jdk.compiler/com.sun.tools.javac.Main', '-d', building, '-cp', jars.join(':'), VALIDATOR_SOURCE], { encoding: 'utf8', timeout: 120_000 });
  if (javac.status !== 0) rmSync(building, { recursive: true, force: true });
  if (javac.status !== 0) throw new Error(`compiling ${VALIDATOR_SOURCE} failed (Java 17+ with its jdk.compiler module; is .cache/kafka/libs there?):\n${javac.stdout}${javac.stderr}${javac.error ?? ''}`);
  try {
    renameSync(building, dir);
  } catch (err) {
    // another run renamed its build there first: the same source, the same classes
    rmSync(building, { recursive: true, force: true });
    if (!existsSync(join(dir, 'MskIamValidator.class'))) throw err;
  }
  return dir;
}

export async function startPrivateBroker(options: { mskIam?: MskIamListener } = {}): Promise<PrivateBroker> {
  const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-broker-'));
  const iam = options.mskIam;
  const [port, controllerPort, iamPort] = (await freePorts(3)) as [number, number, number];
  const address = `127.0.0.1:${port}`;
  const iamAddress = iam ? `127.0.0.1:${iamPort}` : undefined;
  const classPath = iam ? `${LIBS}:${mskIamValidatorClasses()}` : LIBS;
  const jaasOption = (name: string, value: string | number | undefined) => (value === undefined ? '' : ` ${name}="${value}"`);
  const config = join(dir, 'server.properties');
  // the shared broker's settings (scripts/services/kafka.sh) that tests depend on: no topic created
  // by a client, one replica, three partitions
  writeFileSync(
    config,
    [
      'process.roles=broker,controller',
      'node.id=1',
      `controller.quorum.bootstrap.servers=127.0.0.1:${controllerPort}`,
      `listeners=PLAINTEXT://${address},CONTROLLER://127.0.0.1:${controllerPort}${iam ? `,IAM://${iamAddress}` : ''}`,
      `advertised.listeners=PLAINTEXT://${address}${iam ? `,IAM://${iamAddress}` : ''}`,
      'inter.broker.listener.name=PLAINTEXT',
      'controller.listener.names=CONTROLLER',
      `listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT${iam ? ',IAM:SASL_SSL' : ''}`,
      // MSK's IAM listener, over TLS as MSK's is: the shared broker's certificate and PEM keystore
      // (scripts/services/kafka.sh), no client certificates
      ...(iam
        ? [
            'listener.name.iam.ssl.keystore.type=PEM',
            `listener.name.iam.ssl.keystore.location=${join(TLS_DIR, 'kafka-keystore.pem')}`,
            'listener.name.iam.sasl.enabled.mechanisms=OAUTHBEARER',
            'listener.name.iam.oauthbearer.sasl.server.callback.handler.class=MskIamValidator',
            // the login module wants a login of the broker's own on every OAUTHBEARER listener, though it never uses it here
            'listener.name.iam.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="broker"' +
              `${jaasOption('accessKeyId', iam.accessKeyId)}${jaasOption('secretAccessKey', iam.secretAccessKey)}${jaasOption('maxLifetimeSeconds', iam.maxLifetimeSeconds)};`,
            `listener.name.iam.oauthbearer.connections.max.reauth.ms=${iam.maxReauthMs ?? 0}`,
          ]
        : []),
      `log.dirs=${join(dir, 'data')}`,
      'num.partitions=3',
      'default.replication.factor=1',
      'auto.create.topics.enable=false',
      'min.insync.replicas=1',
      'offsets.topic.replication.factor=1',
      'offsets.topic.num.partitions=3',
      'transaction.state.log.replication.factor=1',
      'transaction.state.log.min.isr=1',
      'transaction.state.log.num.partitions=3',
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
    iamAddress,
    logFile: log,
    get pid() {
      return child!.pid!;
    },
    async start() {
      if (alive()) return;
      const out = openSync(log, 'a');
      child = spawn('java', ['-Xmx256m', '-Xms64m', '-XX:+UseSerialGC', `-Dlog4j2.configurationFile=${join(ROOT, '.cache', 'kafka', 'log4j2.properties')}`, '-cp', classPath, 'kafka.Kafka', config], {
        stdio: ['ignore', out, out],
      });
      await ready();
    },
    async resume() {
      if (alive()) process.kill(child!.pid!, 'SIGCONT');
      await ready();
    },
    async kill() {
      if (!alive()) return;
      const exited = new Promise((r) => child!.once('exit', r));
      process.kill(child!.pid!, 'SIGCONT');
      process.kill(child!.pid!, 'SIGKILL');
      await exited;
    },
    async stop() {
      await broker.kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await broker.start();
  return broker;
}
