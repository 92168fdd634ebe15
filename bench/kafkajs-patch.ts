// `npm run bench -- --only kafkajsPatch`: the relay on kafkajs 2.2.4 as published and as
// patches/kafkajs+2.2.4.patch leaves it, in the same run, on the same rows and broker. Each
// variant relays one backlog per round in a process of its own (bench/scale-worker.ts, a warm
// container): the unpatched one loads a copy of node_modules/kafkajs with the patch reversed
// (bench/kafkajs-from.ts). Rounds interleave the variants, in alternating order; medians of events/s
// and of each party's CPU per 1,000 events, then the relay process's CPU while it sits connected
// and idle (the unpatched queue's 1 ms timer runs per connection for as long as it is open). A
// variant that prints a TimeoutNegativeWarning when it should not, or none when it should, fails
// the bench: it did not load the copy it names.
import { execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type kafkajs from 'kafkajs';
import type { Sql } from 'postgres';
import { CpuMeter } from './cpu.ts';
import { drain, readBack, startWorkers, type WorkerStart } from './scale.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

export interface KafkajsPatchContext {
  sql: Sql;
  kafka: kafkajs.Kafka;
  env: Record<string, string>;
  meter: CpuMeter;
  createTable(name: string): Promise<string>;
  fillTable(table: string, events: number, aggregates: number): Promise<void>;
  createTopic(topic: string): Promise<void>;
  drop(table: string): Promise<void>;
  run(): string;
}

export interface KafkajsPatchOptions {
  events: number;
  aggregates: number;
  repeat: number;
  /** how long each variant's relay sits connected and idle after its drain */
  idleMs: number;
}

type Variant = 'unpatched' | 'patched';

interface Round {
  events: number;
  ms: number;
  /** CPU seconds: the relay's process, every Postgres process, the broker */
  relay: number;
  postgres?: number;
  broker?: number;
  /** CPU ms per second of the relay's process while connected and idle */
  idleMsPerS: number;
}

/** A copy of node_modules/kafkajs with every patches/kafkajs+*.patch reversed; its directory. */
function unpatchedCopy(): { dir: string; remove(): void } {
  const patches = readdirSync(join(ROOT, 'patches')).filter((f) => /^kafkajs\+.*\.patch$/.test(f));
  if (patches.length === 0) throw new Error('--only kafkajsPatch: no patches/kafkajs+*.patch to compare against');
  const root = mkdtempSync(join(tmpdir(), 'kafkajs-unpatched-'));
  cpSync(join(ROOT, 'node_modules', 'kafkajs'), join(root, 'node_modules', 'kafkajs'), { recursive: true });
  // the patches' paths are node_modules/kafkajs/...; outside a repository git apply works as patch(1)
  for (const p of patches) {
    try {
      execFileSync('git', ['apply', '--reverse', join(ROOT, 'patches', p)], { cwd: root, stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (e) {
      rmSync(root, { recursive: true, force: true });
      throw new Error(`--only kafkajsPatch: patches/${p} does not reverse on node_modules/kafkajs (is it patched? npm ci applies it): ${String((e as { stderr?: Buffer }).stderr ?? e)}`);
    }
  }
  return { dir: join(root, 'node_modules', 'kafkajs'), remove: () => rmSync(root, { recursive: true, force: true }) };
}

const WARNING = /TimeoutNegativeWarning/g;

async function measure(ctx: KafkajsPatchContext, variant: Variant, start: WorkerStart, o: KafkajsPatchOptions, round: number): Promise<Round> {
  const name = `kjs${variant === 'patched' ? 'p' : 'u'}r${round}`;
  const table = await ctx.createTable(name);
  const topic = `bench.${ctx.run()}.${name}`;
  await ctx.createTopic(topic);
  const env = { ...ctx.env, OUTBOX_TABLE: table, OUTBOX_TOPIC_TEMPLATE: topic, OUTBOX_KAFKA_CLIENT: 'kafkajs', OUTBOX_METRICS: 'off' };
  const [worker] = await startWorkers(1, env, topic, start);
  let measured: Round;
  try {
    await ctx.fillTable(table, o.events, o.aggregates);
    const relay0 = worker!.cpu();
    const cpu0 = ctx.meter.available ? ctx.meter.sample() : undefined;
    const t0 = performance.now();
    const { published } = await drain([worker!], o.events);
    const ms = performance.now() - t0;
    const cpu = cpu0 ? CpuMeter.diff(cpu0, ctx.meter.sample()) : undefined;
    const relay = worker!.cpu() - relay0;
    if (published !== o.events) throw new Error(`kafkajsPatch ${name}: published ${published} of ${o.events}`);
    await readBack(ctx.kafka, topic, o.events);
    // connected, nothing to do: what the process spends on its own (its producer stays open)
    const idle0 = worker!.cpu();
    await new Promise((r) => setTimeout(r, o.idleMs));
    const idleMsPerS = ((worker!.cpu() - idle0) * 1000) / (o.idleMs / 1000);
    measured = { events: o.events, ms, relay, ...(cpu ? { postgres: cpu.postgres, broker: cpu.broker } : {}), idleMsPerS };
  } finally {
    await worker!.close();
    await ctx.drop(table);
  }
  // Node prints the warning once per process: the process has exited, so all of its stderr is here
  const warnings = worker!.stderr.match(WARNING)?.length ?? 0;
  if (variant === 'patched' && warnings > 0) throw new Error(`kafkajsPatch: the patched kafkajs printed ${warnings} TimeoutNegativeWarning (is node_modules patched? npm ci)`);
  if (variant === 'unpatched' && warnings === 0) throw new Error('kafkajsPatch: the unpatched copy printed no TimeoutNegativeWarning: the relay did not load it');
  return measured;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const per1k = (seconds: number, events: number) => Math.round((seconds * 1e6) / events);

export async function benchKafkajsPatch(ctx: KafkajsPatchContext, o: KafkajsPatchOptions): Promise<Record<string, unknown>> {
  const copy = unpatchedCopy();
  const starts: Record<Variant, WorkerStart> = {
    unpatched: { execArgv: ['--import', join(ROOT, 'bench', 'kafkajs-from.ts')], env: { BENCH_KAFKAJS_DIR: copy.dir } },
    patched: {},
  };
  process.stderr.write(`kafkajsPatch: ${o.events} events per round, ${o.repeat} rounds, each variant in a process of its own, then ${o.idleMs} ms idle\n`);
  const rounds: Record<Variant, Round[]> = { unpatched: [], patched: [] };
  try {
    for (let i = 0; i < o.repeat; i++) {
      const order: Variant[] = i % 2 === 0 ? ['unpatched', 'patched'] : ['patched', 'unpatched'];
      for (const v of order) {
        const r = await measure(ctx, v, starts[v], o, i);
        rounds[v].push(r);
        process.stderr.write(`  round ${i + 1}/${o.repeat} kafkajs ${v}: ${Math.round((r.events / r.ms) * 1000)} events/s, relay ${per1k(r.relay, r.events)} ms/1k events, idle ${r.idleMsPerS.toFixed(1)} ms CPU/s\n`);
      }
    }
  } finally {
    copy.remove();
  }
  type Figures = { eventsPerSec: number; cpuMsPer1k: { relay: number; postgres?: number; broker?: number; total?: number }; idleRelayCpuMsPerS: number };
  const figures = Object.fromEntries(
    (['unpatched', 'patched'] as const).map((v): [Variant, Figures] => {
      const rs = rounds[v];
      const pick = (f: (r: Round) => number) => median(rs.map(f));
      const withCpu = rs.every((r) => r.postgres !== undefined);
      return [
        v,
        {
          eventsPerSec: Math.round(pick((r) => (r.events / r.ms) * 1000)),
          cpuMsPer1k: {
            relay: pick((r) => per1k(r.relay, r.events)),
            ...(withCpu ? { postgres: pick((r) => per1k(r.postgres!, r.events)), broker: pick((r) => per1k(r.broker!, r.events)), total: pick((r) => per1k(r.relay + r.postgres! + r.broker!, r.events)) } : {}),
          },
          idleRelayCpuMsPerS: Number(pick((r) => r.idleMsPerS).toFixed(1)),
        },
      ];
    }),
  ) as Record<Variant, Figures>;
  console.log(`\nkafkajs 2.2.4 unpatched and patched (patches/kafkajs+2.2.4.patch), median of ${o.repeat}; CPU in ms per 1,000 events`);
  console.log(`${'variant'.padEnd(11)}${'events/s'.padStart(9)}${'relay'.padStart(7)}${'pg'.padStart(6)}${'broker'.padStart(8)}${'total'.padStart(7)}   idle relay CPU ms/s`);
  for (const v of ['unpatched', 'patched'] as const) {
    const f = figures[v];
    const c = f.cpuMsPer1k;
    console.log(`${v.padEnd(11)}${String(f.eventsPerSec).padStart(9)}${String(c.relay).padStart(7)}${String(c.postgres ?? '').padStart(6)}${String(c.broker ?? '').padStart(8)}${String(c.total ?? '').padStart(7)}   ${f.idleRelayCpuMsPerS}`);
  }
  return { events: o.events, rounds: o.repeat, idleMs: o.idleMs, ...figures };
}
