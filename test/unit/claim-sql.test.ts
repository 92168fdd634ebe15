// The claim the database receives, for each policy and shape, against checked-in snapshots
// (test/unit/snapshots/claim-*.sql): a reviewer sees every change to it in the diff. After an
// intended change: UPDATE_SNAPSHOTS=1 npm run test:unit, and read the diff of the .sql files.
// What the claim does is tested on the real database (claims.test.ts, claim-plan.test.ts,
// relay.test.ts, test/model/).
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { CREATED_EPOCH, type ParkedPolicy } from '../../src/domain.ts';
import type { ClaimFilter } from '../../src/loop/ports.ts';
import { claimStatement, type ClaimBytes } from '../../src/outbox/sql.ts';

const TABLE = '"outbox"';
const USUAL: ClaimFilter = { aggregates: [], inFlight: ['41', '42'], topics: [], topicTemplate: '{aggregatetype}' };
const BYTES: ClaimBytes = { batch: 64 * 1024 * 1024, payload: 1_048_576 };
const EVERY_PART: ClaimFilter = { aggregates: ['held-back'], inFlight: ['41'], topics: ['refused'], topicTemplate: '{aggregatetype}' };

/** the statement as it reads without its comments and indentation */
function bare(sql: string): string {
  return sql.replace(/--[^\n]*/g, '').replace(/\s+/g, ' ').trim();
}

function matchesSnapshot(name: string, sql: string): void {
  const file = new URL(`./snapshots/${name}.sql`, import.meta.url);
  if (process.env.UPDATE_SNAPSHOTS === '1') writeFileSync(file, `${sql.trim()}\n`);
  assert.equal(`${sql.trim()}\n`, readFileSync(file, 'utf8'), `the claim (${name}) differs from test/unit/snapshots/${name}.sql: if intended, UPDATE_SNAPSHOTS=1 npm run test:unit and review the diff`);
}

describe('the claim statement', () => {
  for (const policy of ['hold', 'skip'] as ParkedPolicy[]) {
    it(`${policy}, the usual shape (nothing left out, no topic backed off): as in its snapshot, under 2,500 characters, its parameters numbered as bound`, () => {
      const { text, params } = claimStatement(TABLE, policy, 500, USUAL, TABLE, BYTES);
      matchesSnapshot(`claim-${policy}`, text);
      assert.ok(bare(text).length < 2_500, `${bare(text).length} characters`);
      assert.deepEqual(params, [500, TABLE, ['41', '42'], BYTES.batch, BYTES.payload]);
      assert.deepEqual([...new Set(text.match(/\$\d+/g))].sort(), ['$1', '$2', '$3', '$4', '$5']);
      assert.ok(!/\bheld\b/.test(text) && !/aggregateid <> ALL/.test(text), 'no fragment of a feature that is off');
    });
  }

  it('hold, every part (aggregates left out, a topic backed off): as in its snapshot, its parameters numbered as bound', () => {
    const { text, params } = claimStatement(TABLE, 'hold', 500, EVERY_PART, TABLE, BYTES);
    matchesSnapshot('claim-hold-every-part', text);
    assert.deepEqual(params, [500, TABLE, ['41'], BYTES.batch, BYTES.payload, ['held-back'], '{aggregatetype}', ['refused']]);
    assert.deepEqual([...new Set(text.match(/\$\d+/g))].sort(), ['$1', '$2', '$3', '$4', '$5', '$6', '$7', '$8']);
  });

  it('reads created_at and tracingspancontext only when the metadata need them (claimColumns): the usual text plus the columns, in the result', () => {
    const usual = claimStatement(TABLE, 'hold', 500, USUAL, TABLE, BYTES).text;
    const more = claimStatement(TABLE, 'hold', 500, USUAL, TABLE, BYTES, [CREATED_EPOCH, 'tracingspancontext']).text;
    assert.equal(more.replace(`, ${CREATED_EPOCH}, tracingspancontext`, '').replace(', created_epoch, tracingspancontext', ''), usual);
    assert.equal(more.split('created_at').length - 1, 1, 'read once, by the candidates (named, no `*`), and returned as created_epoch');
    assert.ok(!/created_at|tracingspancontext/.test(usual));
  });

  it('the same shape gives the same text (one prepared statement per shape), whatever the values', () => {
    const a = claimStatement(TABLE, 'hold', 500, EVERY_PART, TABLE, BYTES).text;
    const b = claimStatement(TABLE, 'hold', 10, { aggregates: ['x', 'y'], inFlight: [], topics: ['t1', 't2'], topicTemplate: 'other' }, TABLE, { batch: 1, payload: 2 }).text;
    assert.equal(a, b);
  });
});
