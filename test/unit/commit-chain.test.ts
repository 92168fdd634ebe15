import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CommitChain } from '../../src/loop/commit-chain.ts';
import type { BatchTransaction } from '../../src/loop/ports.ts';

// CommitChain only holds the transaction (for `behind`): a stub stands in for it
const tx = (name: string) => ({ name }) as unknown as BatchTransaction;
const tick = () => new Promise((resolve) => setImmediate(resolve));

describe('CommitChain', () => {
  it('empty: nothing behind, nothing to wait for, no failure', async () => {
    const chain = new CommitChain();
    assert.equal(chain.behind, undefined);
    await chain.answered();
    assert.equal(await chain.failureOf(), undefined);
  });

  it('the transaction whose COMMIT is on the wire is behind until its answer was read', async () => {
    const chain = new CommitChain();
    const first = tx('first');
    chain.add(first, Promise.resolve());
    assert.equal(chain.behind, first);
    await chain.answered();
    assert.equal(chain.behind, undefined);
  });

  it('a later COMMIT replaces the outstanding one', async () => {
    const chain = new CommitChain();
    const second = tx('second');
    chain.add(tx('first'), Promise.reject(new Error('first failed')));
    chain.add(second, Promise.resolve());
    assert.equal(chain.behind, second);
    assert.equal(await chain.failureOf(), undefined);
  });

  it('answered waits for the answer and rejects with its failure, once', async () => {
    const chain = new CommitChain();
    let resolveAnswer!: () => void;
    chain.add(tx('t'), new Promise<void>((resolve) => (resolveAnswer = resolve)));
    let done = false;
    const waiting = chain.answered().then(() => (done = true));
    await tick();
    assert.equal(done, false);
    resolveAnswer();
    await waiting;
    assert.equal(done, true);

    const boom = new Error('COMMIT failed');
    chain.add(tx('u'), Promise.reject(boom));
    await assert.rejects(chain.answered(), boom);
    assert.equal(chain.behind, undefined);
    await chain.answered();
  });

  it('a failed COMMIT is never an unhandled rejection while it waits to be read', async () => {
    const chain = new CommitChain();
    const boom = new Error('COMMIT failed');
    chain.add(tx('t'), Promise.reject(boom));
    // an unhandled rejection would fail this test
    await tick();
    await tick();
    assert.equal(await chain.failureOf(), boom);
    assert.equal(await chain.failureOf(), undefined);
  });

  it('failureOf turns a non-Error rejection into an Error', async () => {
    const chain = new CommitChain();
    // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- the case under test: a rejection that is not an Error
    chain.add(tx('t'), Promise.reject('connection reset'));
    const failure = await chain.failureOf();
    assert.ok(failure instanceof Error);
    assert.equal(failure.message, 'connection reset');
  });
});
