// `npm run bench:publish -- bench/results/throughput.json`: the throughput figures the README and
// docs/benchmarks/README.md quote, rewritten from the JSON record of one `npm run bench` run (the
// plain run writes it there), with the commit it measured and its date. Each page holds one block
// between `<!-- bench:begin PATH -->` and `<!-- bench:end -->`, PATH naming the record from the
// repository's root; test/unit/bench-publish.test.ts checks that every block is what this script
// renders from the record it names, so no page quotes a figure that its record does not hold.
// A smoke run's record (it measures nothing) or a run of uncommitted code is refused.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
/** the pages holding a block, from the root */
export const PAGES = ['README.md', 'docs/benchmarks/README.md'] as const;
type Page = (typeof PAGES)[number];

const BLOCK = /<!-- bench:begin(?: (\S+))? -->\n([\s\S]*?)<!-- bench:end -->/g;
/** What a block says before any record was published: no figure. */
export const PENDING = 'Throughput: not measured on this code yet. `npm run bench -- --peer debezium`, then `npm run bench:publish -- bench/results/throughput.json`.\n';

export class BenchPublishError extends Error {
  override name = 'BenchPublishError';
}

interface ClientFigures {
  relayEventsPerSec: number;
  ratio: number;
  relayCpuMsPer1k?: number;
  /** OUTBOX_DELIVERY=exactly-once in the same run (kafkajs) */
  relayExactlyOnceEventsPerSec?: number;
  exactlyOnceRatio?: number;
  relayExactlyOnceCpuMsPer1k?: number;
}
interface PeerFigures {
  debeziumEventsPerSec?: number;
  debeziumCpuMsPer1k?: { total: number };
  p3Keep?: number;
  relayCpuMsPer1k?: number;
}
export interface BenchRecord {
  commit: string;
  date: string;
  smoke: boolean;
  repeat?: number;
  events: number;
  clients: Record<string, ClientFigures>;
  peer?: Record<string, PeerFigures>;
}

/** The record at `path`, checked: a plain run's, of a commit, with every client's figures. */
export function readRecord(path: string): BenchRecord {
  let r: BenchRecord;
  try {
    r = JSON.parse(readFileSync(path, 'utf8')) as BenchRecord;
  } catch (e) {
    throw new BenchPublishError(`${path}: not a bench record (${e instanceof Error ? e.message : String(e)})`);
  }
  if (r.smoke !== false) throw new BenchPublishError(`${path}: a smoke run's record (smoke: ${String(r.smoke)}), which measures nothing`);
  if (typeof r.commit !== 'string' || !/^[0-9a-f]{7,40}$/.test(r.commit)) {
    throw new BenchPublishError(`${path}: commit ${JSON.stringify(r.commit)} is not one commit: run the bench on a clean checkout`);
  }
  if (Number.isNaN(Date.parse(r.date))) throw new BenchPublishError(`${path}: no date`);
  const clients = Object.entries(r.clients ?? {});
  if (clients.length === 0) throw new BenchPublishError(`${path}: no client's figures`);
  for (const [name, c] of clients) {
    if (!(c.relayEventsPerSec > 0) || !(c.ratio > 0)) throw new BenchPublishError(`${path}: client ${name} has no relay rate`);
  }
  return r;
}

const n = (x: number) => Math.round(x).toLocaleString('en-US');
const LABEL: Record<string, string> = { kafkajs: 'kafkajs (the default)' };

/** The block's text for `page`, from the record at `recordPath` (from the root). */
export function render(r: BenchRecord, recordPath: string, page: Page): string {
  const link = relative(dirname(join(ROOT, page)), join(ROOT, recordPath));
  const run = `\`npm run bench${r.peer ? ' -- --peer debezium' : ''}\` on commit ${r.commit}, ${r.date.slice(0, 10)}, ${n(r.events)} events, median of ${r.repeat ?? '?'}`;
  const clients = Object.entries(r.clients);
  if (page === 'README.md') {
    const rows = clients.map(([name, c]) => {
      const p = r.peer?.[name];
      const vs = p?.p3Keep === undefined ? 'not run' : `${p.p3Keep.toFixed(2)}×`;
      const cpu = c.relayCpuMsPer1k === undefined ? '' : n(c.relayCpuMsPer1k);
      const dbz = p?.debeziumCpuMsPer1k === undefined ? '' : ` (Debezium ${n(p.debeziumCpuMsPer1k.total)})`;
      return `| ${LABEL[name] ?? name} | ${n(c.relayEventsPerSec)} | ${c.ratio.toFixed(2)} | ${vs} | ${cpu}${dbz} |`;
    });
    return [
      `Throughput draining a backlog (${run}; [the record](${link})):`,
      '',
      '| client | relay events/s | of its ceiling | × Debezium | CPU ms per 1,000 events, all parties |',
      '|---|---|---|---|---|',
      ...rows,
      '',
    ].join('\n');
  }
  const parts = clients.map(([name, c]) => {
    const p = r.peer?.[name];
    const vs = p?.p3Keep === undefined ? '' : `, ${p.p3Keep.toFixed(2)}× Debezium's rate`;
    const cpu = c.relayCpuMsPer1k === undefined ? '' : `, ${n(c.relayCpuMsPer1k)} ms of CPU per 1,000 events${p?.debeziumCpuMsPer1k ? ` (Debezium ${n(p.debeziumCpuMsPer1k.total)})` : ''}`;
    const eos = c.relayExactlyOnceEventsPerSec === undefined ? '' : `; exactly-once ${n(c.relayExactlyOnceEventsPerSec)} events/s (${c.exactlyOnceRatio?.toFixed(2) ?? '?'} of at-least-once, ${c.relayExactlyOnceCpuMsPer1k === undefined ? '?' : n(c.relayExactlyOnceCpuMsPer1k)} ms)`;
    return `${name} ${n(c.relayEventsPerSec)} events/s (${c.ratio.toFixed(2)} of its ceiling${vs}${cpu})${eos}`;
  });
  return `- **Throughput** (${run}; [the record](${link})): one invocation draining a backlog, keep mode, all parties' CPU counted: ${parts.join('; ')}. Rerun: \`npm run bench -- --peer debezium\` ([throughput.md](throughput.md), [debezium.md](debezium.md)).\n`;
}

export interface Block {
  record: string | undefined;
  body: string;
}

/** The bench blocks of a page's text. */
export function blocks(text: string): Block[] {
  return [...text.matchAll(BLOCK)].map((m) => ({ record: m[1], body: m[2]! }));
}

/** `text` with its one block rendered from the record (or `PENDING` without one). */
export function rewrite(text: string, page: Page, recordPath: string | undefined, r: BenchRecord | undefined): string {
  const found = blocks(text);
  if (found.length !== 1) throw new BenchPublishError(`${page}: ${found.length} bench blocks (<!-- bench:begin … --> … <!-- bench:end -->), not one`);
  const body = recordPath && r ? render(r, recordPath, page) : PENDING;
  return text.replace(BLOCK, () => `<!-- bench:begin${recordPath ? ` ${recordPath}` : ''} -->\n${body}<!-- bench:end -->`);
}

function main(args: string[]): void {
  if (args.length !== 1) throw new BenchPublishError('usage: npm run bench:publish -- <the JSON record of npm run bench, e.g. bench/results/throughput.json>');
  const recordPath = relative(ROOT, resolve(args[0]!));
  if (recordPath.startsWith('..') || !existsSync(join(ROOT, recordPath))) throw new BenchPublishError(`${args[0]}: no such file in the repository`);
  const r = readRecord(join(ROOT, recordPath));
  for (const page of PAGES) {
    const file = join(ROOT, page);
    writeFileSync(file, rewrite(readFileSync(file, 'utf8'), page, recordPath, r));
    console.log(`bench:publish: ${page} quotes ${recordPath} (commit ${r.commit}, ${r.date})`);
  }
  console.log(`commit ${recordPath} with the pages`);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  try {
    main(process.argv.slice(2));
  } catch (e) {
    if (!(e instanceof BenchPublishError)) throw e;
    console.error(`bench:publish: ${e.message}`);
    process.exit(1);
  }
}
