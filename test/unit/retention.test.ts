// Retention's pass over the places that hold old rows (src/loop/retention.ts): a place the database
// refuses (SQLSTATE class 42: a table missing, a privilege lacking) is logged once and the others
// are still pruned; any other failure ends the pass, as before. Sent and skipped rows have windows
// of their own (OUTBOX_RETAIN_SENT_MS, OUTBOX_RETAIN_SKIPPED_MS), and a window of 0 prunes nothing.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Deadline } from '../../src/budget.ts';
import { DatabaseError, DeadlineExceededError } from '../../src/errors.ts';
import type { Logger } from '../../src/log.ts';
import type { PruneTarget, Store } from '../../src/loop/ports.ts';
import { PRUNE_CHUNK_ROWS, Retention, type RetentionWindows } from '../../src/loop/retention.ts';

/** the store's wrapping of a server error (wrapDbError): the SQLSTATE is on the cause */
function refused(code: string, message: string): DatabaseError {
  return new DatabaseError(`database error while pruning sent rows: ${message} (${code})`, { cause: Object.assign(new Error(message), { code }) });
}

function run(fail: Partial<Record<PruneTarget, Error>>, rows: Partial<Record<PruneTarget, number>> = {}, windows: RetentionWindows = { sentMs: 60_000, skippedMs: 60_000 }) {
  const calls: PruneTarget[] = [];
  const windowsUsed: Array<[PruneTarget, number]> = [];
  const logged: Array<{ level: string; msg: string; fields?: Record<string, unknown> }> = [];
  const store = {
    pruneChunk: (what: PruneTarget, retainMs: number) => {
      calls.push(what);
      windowsUsed.push([what, retainMs]);
      const err = fail[what];
      if (err) return Promise.reject(err);
      return Promise.resolve(rows[what] ?? 0);
    },
  } as unknown as Store;
  const log = (level: string) => (msg: string, fields?: Record<string, unknown>) => logged.push({ level, msg, fields });
  const logger = { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error'), child: () => logger } as Logger;
  const retention = new Retention(store, windows, logger);
  return retention.run(new Deadline(Date.now() + 60_000)).then((deleted) => ({ deleted, calls, logged, windowsUsed }));
}

describe('Retention.run', () => {
  it('a sent table refused (missing, or no privilege) is warned about once, and the outbox\'s places are still pruned', async () => {
    for (const err of [refused('42501', 'permission denied for table outbox_sent'), refused('42P01', 'relation "outbox_sent" does not exist')]) {
      const { deleted, calls, logged } = await run({ sent: err }, { skipped: 7 });
      assert.deepEqual(calls, ['sent', 'skipped']);
      assert.equal(deleted, 7);
      assert.equal(logged.length, 1);
      assert.equal(logged[0]!.level, 'warn');
      assert.match(logged[0]!.msg, /^pruning the sent table failed/);
      assert.equal(logged[0]!.fields?.target, 'sent');
    }
  });

  it('every place refused: one warning each', async () => {
    const err = refused('42501', 'permission denied');
    const { calls, logged } = await run({ sent: err, skipped: err });
    assert.deepEqual(calls, ['sent', 'skipped']);
    assert.deepEqual(logged.map((l) => l.fields?.target), ['sent', 'skipped']);
  });

  it('any other failure ends the pass: the deadline (info), a lost connection or an unknown error (warn)', async () => {
    const cases: Array<[Error, string]> = [
      [new DeadlineExceededError('pruning sent rows'), 'info'],
      [new DatabaseError('database error while pruning sent rows: Connection terminated', { cause: Object.assign(new Error('x'), { code: 'CONNECTION_CLOSED' }) }), 'warn'],
      [refused('57P01', 'terminating connection due to administrator command'), 'warn'],
      [new DatabaseError('injected'), 'warn'],
    ];
    for (const [err, level] of cases) {
      const { calls, logged } = await run({ sent: err });
      assert.deepEqual(calls, ['sent'], err.message);
      assert.deepEqual(logged.map((l) => [l.level, l.msg]), [[level, 'pruning old sent rows stopped; the next invocation goes on']]);
    }
  });

  it('a full chunk is followed by another of the same place', async () => {
    let sentCalls = 0;
    const calls: PruneTarget[] = [];
    const store = {
      pruneChunk: (what: PruneTarget) => {
        calls.push(what);
        return Promise.resolve(what === 'sent' && sentCalls++ === 0 ? PRUNE_CHUNK_ROWS : 0);
      },
    } as unknown as Store;
    const logger = { debug() {}, info() {}, warn() {}, error() {}, child: () => logger } as Logger;
    assert.equal(await new Retention(store, { sentMs: 1, skippedMs: 1 }, logger).run(new Deadline(Date.now() + 60_000)), PRUNE_CHUNK_ROWS);
    assert.deepEqual(calls, ['sent', 'sent', 'skipped']);
  });

  it('skipped rows are pruned with their own window (OUTBOX_RETAIN_SKIPPED_MS), sent ones with theirs', async () => {
    const { windowsUsed } = await run({}, {}, { sentMs: 86_400_000, skippedMs: 30 * 86_400_000 });
    assert.deepEqual(windowsUsed, [
      ['sent', 86_400_000],
      ['skipped', 30 * 86_400_000],
    ]);
  });

  it('a window of 0 keeps those rows forever: that place is not pruned at all', async () => {
    assert.deepEqual((await run({}, {}, { sentMs: 60_000, skippedMs: 0 })).calls, ['sent']);
    assert.deepEqual((await run({}, { skipped: 3 }, { sentMs: 0, skippedMs: 60_000 })).calls, ['skipped']);
  });
});
