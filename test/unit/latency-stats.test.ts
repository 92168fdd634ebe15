import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { msPer1k, pairLatencies, percentile } from '../../bench/latency-stats.ts';

describe('latency bench arithmetic (bench/latency-stats.ts)', () => {
  it('a percentile is the smallest value with that share of the values at or below it', () => {
    const hundred = Array.from({ length: 100 }, (_, i) => i + 1); // 1..100
    assert.equal(percentile(hundred, 50), 50);
    assert.equal(percentile(hundred, 95), 95);
    assert.equal(percentile(hundred, 99), 99);
    assert.equal(percentile(hundred, 100), 100);
    assert.equal(percentile(hundred, 0), 1);
    // few values: p99 of three is the largest, p50 the middle one
    assert.equal(percentile([10, 20, 30], 99), 30);
    assert.equal(percentile([10, 20, 30], 50), 20);
    assert.ok(Number.isNaN(percentile([], 50)), 'nothing measured is not a number, never 0');
  });

  it('pairs each row with the time its id was seen, and counts the rows never seen', () => {
    const created = [
      { id: 'a', c: 1_000 },
      { id: 'b', c: 1_010 },
      { id: 'c', c: 1_020 },
    ];
    const seen = new Map([
      ['c', 1_025],
      ['a', 1_040],
      ['x', 9_999], // a message for no row of the table is not a latency
    ]);
    const p = pairLatencies(created, seen);
    assert.deepEqual(p.latencies, [
      [1_000, 40],
      [1_020, 5],
    ]);
    assert.deepEqual(p.sorted, [5, 40]);
    assert.equal(p.missing, 1);
  });

  it('CPU per 1,000 events: 0.5 s over 2,000 events is 250 ms', () => {
    assert.equal(msPer1k(0.5, 2_000), 250);
  });
});
