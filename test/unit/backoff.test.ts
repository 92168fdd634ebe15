import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { backoffMs, shouldPark } from '../../src/loop/backoff.ts';

describe('backoff', () => {
  it('grows exponentially between half and all of base*2^(n-1), capped', () => {
    assert.equal(backoffMs(1, 1000, 60_000, () => 0), 500);
    assert.equal(backoffMs(1, 1000, 60_000, () => 1), 1000);
    assert.equal(backoffMs(3, 1000, 60_000, () => 1), 4000);
    assert.equal(backoffMs(30, 1000, 60_000, () => 1), 60_000);
    for (let i = 0; i < 100; i++) {
      const v = backoffMs(4, 100, 10_000);
      assert.ok(v >= 400 && v <= 800);
    }
  });

  it('parks after max attempts or at once when permanent', () => {
    assert.equal(shouldPark(2, 3, false), false);
    assert.equal(shouldPark(3, 3, false), true);
    assert.equal(shouldPark(1, 3, true), true);
  });
});
