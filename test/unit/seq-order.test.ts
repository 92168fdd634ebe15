// The claim returns rows unordered and the store sorts them by seq (the publishing order within
// an aggregate), comparing int8 values carried as decimal strings.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { bySeq } from '../../src/outbox/batch-tx.ts';

describe('bySeq', () => {
  it('orders decimal seq strings numerically, not lexically', () => {
    const seqs = ['10', '9', '100', '1', '99', '9223372036854775807', '1000000000000', '2'];
    const sorted = seqs.map((seq) => ({ seq })).sort(bySeq).map((r) => r.seq);
    assert.deepEqual(sorted, ['1', '2', '9', '10', '99', '100', '1000000000000', '9223372036854775807']);
  });

  it('agrees with BigInt comparison on random values', () => {
    const values = Array.from({ length: 2_000 }, () => BigInt(Math.floor(Math.random() * 2 ** 53)) * BigInt(1 + Math.floor(Math.random() * 1000)));
    const byString = values.map((v) => ({ seq: v.toString() })).sort(bySeq).map((r) => r.seq);
    const byBigInt = [...values].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)).map(String);
    assert.deepEqual(byString, byBigInt);
  });
});
