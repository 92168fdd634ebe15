// The scale bench's arithmetic (bench/scale-model.ts): the figures docs/benchmarks/scale.md
// publishes are a median round's and the model's ceilings computed from them.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ceiling, ceilings, DEFAULT_ASSUMPTIONS, medianSample, perEvent } from '../../bench/scale-model.ts';
import type { Sample } from '../../bench/scale-model.ts';

const sample = (events: number, ms: number, cpu = { relay: 1, postgres: 1, broker: 1 }): Sample =>
  ({ events, ms, cpu, invocations: 1, empty: 0, heldBack: 0 });

describe('scale bench: medians and the model', () => {
  it('takes the median round by rate, with its own CPU figures, and the range of the rates', () => {
    const slow = sample(1000, 1000, { relay: 9, postgres: 9, broker: 9 });
    const mid = sample(1000, 500, { relay: 2, postgres: 3, broker: 4 });
    const fast = sample(1000, 250, { relay: 7, postgres: 7, broker: 7 });
    const m = medianSample([fast, slow, mid]);
    assert.deepEqual(m.cpu, mid.cpu);
    assert.equal(m.ms, 500);
    assert.deepEqual([m.min, m.max], [1000, 4000]);
    assert.deepEqual(perEvent(m), { relay: 0.002, postgres: 0.003, broker: 0.004 });
    assert.throws(() => medianSample([]), /no rounds measured/);
  });

  it('turns CPU per event into ceilings: vCPUs × utilization ÷ CPU per event, rounded down to 100', () => {
    // 0.7 × 2 vCPUs at 46.67 µs per event: 29,999.99… in floating point, 30,000 events/s
    assert.equal(ceiling(2, 0.7, 1.4 / 30_000), 30_000);
    assert.equal(ceiling(1, 1, 30e-6), 33_300);
    assert.throws(() => ceiling(1, 1, 0), /must be positive/);
    const m = ceilings({ relay: 40e-6, postgres: 30e-6, broker: 10e-6 }, { ...DEFAULT_ASSUMPTIONS, lambdaVcpu: 0.25 });
    assert.equal(m.perDbVcpu, 33_300);
    assert.deepEqual(m.rds.map((r) => r.eventsPerSec), [46_600, 93_300, 186_600, 373_300]);
    // three copies of each message, each about the leader's CPU
    assert.equal(m.perBrokerVcpu, 33_300);
    assert.deepEqual(m.msk.map((b) => b.eventsPerSec), [140_000, 280_000, 560_000]);
    assert.equal(m.perInvocation, 6_200);
    assert.equal(m.invocationsForSmallestRds, 8);
  });
});
