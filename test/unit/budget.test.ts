import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BatchTimer, Deadline } from '../../src/budget.ts';
import { DeadlineExceededError } from '../../src/errors.ts';

describe('Deadline', () => {
  it('is remaining time minus the safety margin', () => {
    let now = 1_000;
    const d = Deadline.fromRemaining(10_000, 3_000, () => now);
    assert.equal(d.at, 8_000);
    assert.equal(d.remaining(), 7_000);
    assert.ok(d.fits(6_999));
    assert.ok(!d.fits(7_000));
    now = 9_000;
    assert.equal(d.remaining(), 0);
    assert.ok(d.expired());
  });

  it('race rejects a hung promise at the deadline and calls onTimeout', async () => {
    const d = new Deadline(Date.now() + 30);
    let cancelled = false;
    await assert.rejects(d.race('hung call', new Promise(() => undefined), () => (cancelled = true)), DeadlineExceededError);
    assert.ok(cancelled);
  });

  it('race passes a result through and rejects at once when already expired', async () => {
    assert.equal(await new Deadline(Date.now() + 1_000).race('x', Promise.resolve(42)), 42);
    await assert.rejects(new Deadline(Date.now() - 1).race('late', Promise.resolve(1)), /late did not finish/);
  });
});

describe('BatchTimer', () => {
  it('remembers a slow batch and decays', () => {
    const t = new BatchTimer(10);
    assert.equal(t.expected(), 10);
    t.record(500);
    assert.equal(t.expected(), 500);
    t.record(20);
    assert.equal(t.expected(), 400);
  });
});
