// `parked retry|skip` without a database: which rows named the command may act on and why not the
// others (decide, src/outbox/admin.ts), and what it prints and exits with (operatorReport,
// src/cli/output.ts). Against the real table: test/integration/operator-audit.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { operatorReport } from '../../src/cli/output.ts';
import { decide, type LookedUp, type OperatorResult } from '../../src/outbox/admin.ts';

const id = (n: number) => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;
const T = new Date('2026-12-01T10:00:00Z');

function row(n: number, over: Partial<LookedUp> = {}): LookedUp {
  return { id: id(n), aggregateid: `a${n}`, parked_at: T, skipped_at: null, skipped_by: null, sent_at: null, attempts: 3, next_attempt_at: T, ...over };
}

describe('decide: a command acts on parked rows only, and says why not on each other row named', () => {
  const found = [
    row(1),
    row(2, { parked_at: null, attempts: 0 }),
    row(3, { parked_at: null, attempts: 2, next_attempt_at: new Date('2026-12-01T10:05:00Z') }),
    row(4, { skipped_at: T, skipped_by: 'alice' }),
    row(5, { sent_at: T }),
    row(6),
  ];

  it('skip: parked rows are acted on; unknown, pending, retrying, skipped and sent ones are not, each with its state and why, in the order named', () => {
    const d = decide('skip', [id(9), id(1), id(2), id(3), id(4), id(5), id(6)], found);
    assert.deepEqual(d.actedOn, [id(1), id(6)]);
    assert.deepEqual(
      d.notActedOn.map((n) => [n.id, n.state]),
      [
        [id(9), 'unknown'],
        [id(2), 'pending'],
        [id(3), 'retrying'],
        [id(4), 'skipped'],
        [id(5), 'sent'],
      ],
    );
    const why = Object.fromEntries(d.notActedOn.map((n) => [n.state, n.why]));
    assert.match(why.unknown!, /^no such row in the outbox table/);
    assert.equal(why.pending, 'not parked: pending (it has not failed)');
    assert.equal(why.retrying, 'not parked: retrying (2 failed attempts; next attempt at 2026-12-01T10:05:00.000Z)');
    assert.equal(why.skipped, 'already skipped, at 2026-12-01T10:00:00.000Z by alice');
    assert.equal(why.sent, 'already sent, at 2026-12-01T10:00:00.000Z');
  });

  it('retry: a skipped row is never sent again, and says so', () => {
    const d = decide('retry', [id(4)], found);
    assert.deepEqual(d.actedOn, []);
    assert.match(d.notActedOn[0]!.why, /^skipped \(a skipped row is never sent: it cannot be retried\), at .* by alice$/);
  });

  it('an id named twice is decided once; --all (asked: null) acts on every row its lookup found', () => {
    const d = decide('retry', [id(2), id(1), id(2)], [row(1), row(2, { parked_at: null, attempts: 0 })]);
    assert.deepEqual(d, { actedOn: [id(1)], notActedOn: [{ id: id(2), state: 'pending', why: 'not parked: pending (it has not failed)' }] });
    assert.deepEqual(decide('retry', null, [row(1), row(6)]), { actedOn: [id(1), id(6)], notActedOn: [] });
  });
});

describe('operatorReport: what parked retry|skip prints and exits with', () => {
  const result: OperatorResult = {
    actedOn: [id(1)],
    notActedOn: [{ id: id(2), state: 'pending', why: 'not parked: pending (it has not failed)' }],
    by: 'relay',
    operator: 'alice@laptop',
    at: T,
  };

  it('every row acted on: exit 0, nothing on stderr; the JSON names who (the database role and the operator), when, why', () => {
    const r = operatorReport('skip', { reason: 'obsolete', dryRun: false }, { ...result, notActedOn: [] });
    assert.equal(r.code, 0);
    assert.equal(r.text, '');
    assert.deepEqual(r.json, { skipped: [id(1)], notSkipped: [], dryRun: false, reason: 'obsolete', by: 'relay', operator: 'alice@laptop', at: '2026-12-01T10:00:00.000Z' });
  });

  it('a row not acted on: exit 1, listed on stderr by id with why; the rows acted on are still reported', () => {
    const r = operatorReport('retry', { reason: 'fixed', dryRun: false }, result);
    assert.equal(r.code, 1);
    assert.equal(r.text, `outbox-relay: 1 of 2 rows named not retried:\n  ${id(2)}: not parked: pending (it has not failed)\n`);
    assert.deepEqual(r.json.retried, [id(1)]);
    assert.deepEqual(r.json.notRetried, result.notActedOn);
  });

  it('a dry run: `wouldSkip`, never `skipped` (a script cannot mistake it for the real run), and the exit the real run would have', () => {
    const r = operatorReport('skip', { reason: 'obsolete', dryRun: true }, result);
    assert.equal(r.code, 1);
    assert.deepEqual(Object.keys(r.json), ['wouldSkip', 'notSkipped', 'dryRun', 'reason', 'by', 'operator', 'at']);
    assert.equal(r.json.dryRun, true);
    assert.match(r.text, /^outbox-relay: dry run: 1 of 2 rows named would not be skipped:\n/);
  });

  it('JSON stays JSON: the reason as given, escaped only by the JSON encoder; the stderr text escapes what a why quotes', () => {
    const reason = 'line one\nline two \x1b[31m';
    const r = operatorReport('skip', { reason, dryRun: false }, { ...result, notActedOn: [{ id: id(2), state: 'skipped', why: 'already skipped, at x by evil\x1b[2J' }] });
    assert.equal((JSON.parse(JSON.stringify(r.json)) as { reason: string }).reason, reason);
    assert.ok(r.text.includes('by evil\\x1b[2J\n'), r.text);
  });
});
