// Kafka Connect standalone, started and stopped by the bench for its Debezium peer: one JVM from
// the jars scripts/debezium/install.sh resolved into .cache/debezium/libs, its REST API on its own
// port, its offsets file and log under .cache/debezium. Only this bench process owns it: the pid
// is recorded so that a bench killed before it could stop the JVM has it stopped by the next one.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, openSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export interface ConnectOptions {
  /** .cache/debezium: libs/ (the jars), and where the worker's files go */
  dir: string;
  brokers: string;
  /** the REST port; 18083 by default, away from Connect's usual 8083 another Connect may hold */
  port: number;
  heap?: string;
}

/** The class whose command line identifies our JVM (with the worker file's path). */
const MAIN = 'org.apache.kafka.connect.cli.ConnectStandalone';

export class ConnectWorker {
  private child?: ChildProcess;
  private exited?: string;
  readonly url: string;
  private readonly pidFile: string;
  private readonly workerFile: string;
  readonly logFile: string;

  constructor(private readonly opts: ConnectOptions) {
    this.url = `http://127.0.0.1:${opts.port}`;
    this.pidFile = join(opts.dir, 'connect.pid');
    this.workerFile = join(opts.dir, 'worker.properties');
    this.logFile = join(opts.dir, 'connect.log');
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  async start(): Promise<void> {
    const libs = join(this.opts.dir, 'libs');
    if (!existsSync(join(libs, '.stamp')) || !readdirSync(libs).some((f) => f.startsWith('debezium-connector-postgres'))) {
      throw new Error(`Debezium's jars are missing from ${libs}: run bash scripts/debezium/install.sh (npm run bench -- --peer debezium runs it for you)`);
    }
    await this.stopLeftover();
    if (await this.answers()) {
      throw new Error(`port ${this.opts.port} already answers HTTP (another Kafka Connect?); stop it or pick another port with BENCH_CONNECT_PORT`);
    }
    this.writeConfig();
    const log = openSync(this.logFile, 'w');
    this.child = spawn(
      'java',
      [
        `-Xmx${this.opts.heap ?? '1g'}`,
        '-Xms256m',
        '-XX:+ExitOnOutOfMemoryError',
        '-Djava.awt.headless=true',
        `-Dlog4j2.configurationFile=${join(this.opts.dir, 'log4j2.properties')}`,
        '-cp',
        `${libs}/*`,
        MAIN,
        this.workerFile,
      ],
      { stdio: ['ignore', log, log] },
    );
    this.child.on('exit', (code, signal) => (this.exited = signal ?? `exit code ${code}`));
    writeFileSync(this.pidFile, `${this.child.pid}\n`);
    const deadline = Date.now() + 120_000;
    while (!(await this.ready())) {
      if (this.exited) throw new Error(`Kafka Connect exited during start-up (${this.exited}); its log: ${this.logFile}\n${this.tail()}`);
      if (Date.now() > deadline) throw new Error(`Kafka Connect did not answer on ${this.url} within 120 s; its log: ${this.logFile}\n${this.tail()}`);
      await sleep(250);
    }
  }

  /** SIGTERM (Connect stops its tasks and closes their replication connections), SIGKILL after 20 s */
  async stop(): Promise<void> {
    const child = this.child;
    if (!child || this.exited) return;
    const gone = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), 20_000);
    await gone;
    clearTimeout(t);
    rmSync(this.pidFile, { force: true });
  }

  /** Synchronous last resort for process exit: the JVM must not outlive the bench. */
  killNow(): void {
    if (this.child && !this.exited) this.child.kill('SIGKILL');
  }

  async request<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    if (this.exited) throw new Error(`Kafka Connect has exited (${this.exited}); its log: ${this.logFile}\n${this.tail()}`);
    const res = await fetch(`${this.url}${path}`, {
      method,
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(60_000),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`Kafka Connect ${method} ${path}: HTTP ${res.status} ${text}`);
    return (text ? JSON.parse(text) : undefined) as T;
  }

  /** the last lines of Connect's log, for error messages */
  tail(lines = 30): string {
    try {
      return readFileSync(this.logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '';
    }
  }

  /** anything answers HTTP on the port (a clash, before our JVM starts) */
  private async answers(): Promise<boolean> {
    try {
      await fetch(`${this.url}/`, { signal: AbortSignal.timeout(1_000) });
      return true;
    } catch {
      return false;
    }
  }

  /** the herder is up: Jetty answers `/` before the connector resources exist (404 until then) */
  private async ready(): Promise<boolean> {
    try {
      return (await fetch(`${this.url}/connectors`, { signal: AbortSignal.timeout(1_000) })).ok;
    } catch {
      return false;
    }
  }

  /** A JVM a previous bench started and could not stop (killed with SIGKILL): stop it now. */
  private async stopLeftover(): Promise<void> {
    let pid: number;
    try {
      pid = Number(readFileSync(this.pidFile, 'utf8').trim());
    } catch {
      return;
    }
    let cmdline = '';
    try {
      cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
    } catch {
      // gone already
    }
    // only ours: the same main class with the same worker file (a recycled pid is left alone)
    if (cmdline.includes(MAIN) && cmdline.includes(this.workerFile)) {
      process.stderr.write(`  debezium: stopping Kafka Connect pid ${pid} left running by an earlier bench\n`);
      process.kill(pid, 'SIGTERM');
      for (let i = 0; i < 100 && existsSync(`/proc/${pid}`); i++) await sleep(200);
      if (existsSync(`/proc/${pid}`)) process.kill(pid, 'SIGKILL');
    }
    rmSync(this.pidFile, { force: true });
  }

  private writeConfig(): void {
    mkdirSync(this.opts.dir, { recursive: true });
    const offsets = join(this.opts.dir, 'offsets.dat');
    // every run uses a new connector name and slot, so old offsets are never read again
    rmSync(offsets, { force: true });
    writeFileSync(
      this.workerFile,
      [
        '# Written by bench/debezium/connect.ts on every start: the bench\'s Kafka Connect worker.',
        `bootstrap.servers=${this.opts.brokers}`,
        `listeners=http://127.0.0.1:${this.opts.port}`,
        // the outbox event router emits the payload column (jsonb, as text) and the aggregate id
        // as strings; the String converters send those bytes as they are, like the relay does
        'key.converter=org.apache.kafka.connect.storage.StringConverter',
        'value.converter=org.apache.kafka.connect.storage.StringConverter',
        `offset.storage.file.filename=${offsets}`,
        // Connect's source producer is not Kafka's default one: it turns idempotence off (acks=all,
        // one request in flight, linger 5 ms, 16 KB batches are its defaults). Make it the relay's.
        'producer.enable.idempotence=true',
        'producer.acks=all',
        // everything is on the classpath; no plugin.path to scan
        'plugin.discovery=only_scan',
        '',
      ].join('\n'),
    );
    writeFileSync(
      join(this.opts.dir, 'log4j2.properties'),
      [
        'status = warn',
        'appender.out.type = Console',
        'appender.out.name = STDOUT',
        'appender.out.layout.type = PatternLayout',
        'appender.out.layout.pattern = [%d] %p %m (%c)%n',
        // INFO shows each connector's start, stop and slot handling; WARN for the chatty clients
        'rootLogger.level = INFO',
        'rootLogger.appenderRef.out.ref = STDOUT',
        'logger.clients.name = org.apache.kafka.clients',
        'logger.clients.level = WARN',
        'logger.config.name = org.apache.kafka.common.config.AbstractConfig',
        'logger.config.level = WARN',
        '',
      ].join('\n'),
    );
  }
}
