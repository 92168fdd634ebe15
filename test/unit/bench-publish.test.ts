// The throughput figures README.md and docs/benchmarks/README.md quote come from one bench run's
// JSON record, through `npm run bench:publish` (scripts/bench-publish.ts): each page's block is
// exactly what the script renders from the record it names, and that record is in the repository.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, rmSync, writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { BenchPublishError, blocks, PAGES, PENDING, readRecord, render, rewrite, ROOT, type BenchRecord } from '../../scripts/bench-publish.ts';

const record: BenchRecord = {
  commit: 'abc1234',
  date: '2026-12-04T10:00:00.000Z',
  smoke: false,
  repeat: 3,
  events: 50_000,
  clients: {
    kafkajs: { relayEventsPerSec: 21_791, ratio: 0.812, relayCpuMsPer1k: 124 },
    platformatic: { relayEventsPerSec: 33_844, ratio: 0.9, relayCpuMsPer1k: 85 },
  },
  peer: {
    kafkajs: { debeziumEventsPerSec: 22_011, debeziumCpuMsPer1k: { total: 88 }, p3Keep: 0.99 },
    platformatic: { debeziumEventsPerSec: 24_704, debeziumCpuMsPer1k: { total: 88 }, p3Keep: 1.37 },
  },
};

/** `r` written to a file of its own; its path */
function recordFile(r: unknown): { path: string; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), 'bench-record-'));
  const path = join(dir, 'throughput.json');
  writeFileSync(path, JSON.stringify(r));
  return { path, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

describe('bench:publish (scripts/bench-publish.ts)', () => {
  it("README.md and docs/benchmarks/README.md each hold one throughput block, and it is what bench:publish renders from the record it names, a file in the repository (or, before any record, the pending text with no figure)", () => {
    for (const page of PAGES) {
      const found = blocks(readFileSync(join(ROOT, page), 'utf8'));
      assert.equal(found.length, 1, `${page}: ${found.length} bench blocks`);
      const [{ record: path, body }] = found as [(typeof found)[0]];
      if (path === undefined) {
        assert.equal(body, PENDING, `${page}: a block that names no record holds figures of its own`);
        continue;
      }
      assert.ok(existsSync(join(ROOT, path)), `${page} names ${path}, which is not in the repository`);
      assert.equal(body, render(readRecord(join(ROOT, path)), path, page), `${page}: the block is not what ${path} says; npm run bench:publish -- ${path}`);
    }
  });

  it('the blocks quote every figure from the record, its commit and date, linked relative to each page', () => {
    const readme = render(record, 'bench/results/throughput.json', 'README.md');
    for (const figure of ['abc1234', '2026-12-04', '50,000 events', 'median of 3', '21,791', '33,844', '0.99×', '1.37×', '| 124 (Debezium 88) |', '| 85 (Debezium 88) |', '0.81', '0.90', '](bench/results/throughput.json)']) {
      assert.ok(readme.includes(figure), `README block without ${figure}:\n${readme}`);
    }
    const docs = render(record, 'bench/results/throughput.json', 'docs/benchmarks/README.md');
    for (const figure of ['abc1234', '2026-12-04', "kafkajs 21,791 events/s (0.81 of its ceiling, 0.99× Debezium's rate, 124 ms of CPU per 1,000 events (Debezium 88))", "platformatic 33,844 events/s (0.90 of its ceiling, 1.37× Debezium's rate", '](../../bench/results/throughput.json)']) {
      assert.ok(docs.includes(figure), `docs block without ${figure}:\n${docs}`);
    }
    // without the Debezium peer: no ratio to Debezium is made up
    const alone = render({ ...record, peer: undefined }, 'bench/results/throughput.json', 'README.md');
    assert.ok(alone.includes('| kafkajs (the default) | 21,791 | 0.81 | not run | 124 |'), alone);
    assert.ok(!alone.includes('--peer debezium'), alone);
  });

  it("rewriting replaces the block's body and the record it names, and nothing else on the page", () => {
    const page = 'before\n<!-- bench:begin -->\nold figure 1.52×\n<!-- bench:end -->\nafter\n';
    const out = rewrite(page, 'README.md', 'bench/results/throughput.json', record);
    assert.ok(out.startsWith('before\n<!-- bench:begin bench/results/throughput.json -->\nThroughput draining a backlog'));
    assert.ok(out.endsWith('<!-- bench:end -->\nafter\n'));
    assert.ok(!out.includes('1.52'));
    assert.deepEqual(blocks(out).map((b) => b.record), ['bench/results/throughput.json']);
    assert.throws(() => rewrite('no block\n', 'README.md', undefined, undefined), BenchPublishError);
    assert.throws(() => rewrite(page + page, 'README.md', undefined, undefined), BenchPublishError);
  });

  it('refuses a smoke run\'s record, a run of uncommitted code, and a record without a relay rate', () => {
    for (const [bad, why] of [
      [{ ...record, smoke: true }, /smoke/],
      [{ ...record, commit: 'abc1234 (with uncommitted changes)' }, /not one commit/],
      [{ ...record, clients: { kafkajs: { relayEventsPerSec: 0, ratio: 0 } } }, /no relay rate/],
      [{ ...record, clients: {} }, /no client/],
    ] as const) {
      const f = recordFile(bad);
      try {
        assert.throws(() => readRecord(f.path), (e: unknown) => e instanceof BenchPublishError && why.test(e.message));
      } finally {
        f.remove();
      }
    }
    const ok = recordFile(record);
    try {
      assert.equal(readRecord(ok.path).commit, 'abc1234');
    } finally {
      ok.remove();
    }
  });
});
