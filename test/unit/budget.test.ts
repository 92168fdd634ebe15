import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BUDGET, BatchTimer, Deadline } from '../../src/budget.ts';
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

  it('rollbackGrace: what the deadline leaves, within BUDGET.rollbackGraceMs (250 ms to 2 s)', () => {
    let now = 1_000;
    const clock = () => now;
    assert.equal(new Deadline(now + 1_000, clock).rollbackGrace().remaining(), 1_000);
    assert.equal(new Deadline(now + 60_000, clock).rollbackGrace().remaining(), BUDGET.rollbackGraceMs.max);
    assert.equal(new Deadline(now - 5, clock).rollbackGrace().remaining(), BUDGET.rollbackGraceMs.min);
    const grace = new Deadline(now, clock).rollbackGrace();
    now += BUDGET.rollbackGraceMs.min;
    assert.ok(grace.expired(), 'on the same clock');
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

describe('Deadline: edges', () => {
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  it('minus is the same deadline earlier, on the same clock; expired only once nothing remains', () => {
    let now = 1_000;
    const d = new Deadline(5_000, () => now);
    const earlier = d.minus(1_500);
    assert.equal(earlier.at, 3_500);
    assert.equal(earlier.remaining(), 2_500);
    assert.equal(d.expired(), false);
    now = 4_999;
    assert.equal(d.expired(), false);
    assert.equal(earlier.expired(), true);
    now = 5_000;
    assert.equal(d.expired(), true);
  });

  it('race without onTimeout still rejects at the deadline', async () => {
    await assert.rejects(new Deadline(Date.now() + 20).race('hung call', new Promise(() => undefined)), DeadlineExceededError);
  });

  it('a race that is won stops its timer: onTimeout is never called afterwards', async () => {
    let cancelled = false;
    assert.equal(await new Deadline(Date.now() + 20).race('quick', Promise.resolve(1), () => (cancelled = true)), 1);
    await sleep(60);
    assert.equal(cancelled, false);
  });

  it('an expired race cancels at once, and a rejection of the abandoned promise is never unhandled', async () => {
    let cancelled = false;
    const late = new Promise<never>((_, reject) => setTimeout(() => reject(new Error('answered too late')), 10));
    await assert.rejects(new Deadline(Date.now() - 1).race('late', late, () => (cancelled = true)), DeadlineExceededError);
    assert.ok(cancelled);
    // an unhandled rejection would fail this test
    await sleep(40);
  });
});
