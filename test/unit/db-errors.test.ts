// How database errors are worded for the operator (src/outbox/db-errors.ts wrapDbError), in particular
// the ones a transaction-mode pooler causes when named prepared statements are on.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DatabaseError } from '../../src/errors.ts';
import { isPreparedStatementLost, wrapDbError } from '../../src/outbox/db-errors.ts';

/** what postgres.js rejects with: an Error carrying the server's fields */
function serverError(code: string, message: string): Error {
  return Object.assign(new Error(message), { name: 'PostgresError', code, severity: 'ERROR' });
}

/** the RangeError Node's Buffer reads throw, as postgres.js hits it on a mismatched row description */
function outOfRange(): RangeError {
  try {
    Buffer.alloc(33).readInt32BE(37);
  } catch (err) {
    return err as RangeError;
  }
  throw new Error('Buffer.readInt32BE past the end did not throw');
}

describe('a prepared statement lost to a transaction pooler', () => {
  it('is recognised by 26000, 42P05 and a Buffer RangeError (ERR_OUT_OF_RANGE)', () => {
    assert.equal(isPreparedStatementLost(serverError('26000', 'prepared statement "x1" does not exist')), true);
    assert.equal(isPreparedStatementLost(serverError('42P05', 'prepared statement "x1" already exists')), true);
    const range = outOfRange();
    assert.equal((range as { code?: string }).code, 'ERR_OUT_OF_RANGE');
    assert.equal(isPreparedStatementLost(range), true);
  });

  it('is not any other error', () => {
    assert.equal(isPreparedStatementLost(serverError('42P01', 'relation "outbox" does not exist')), false);
    assert.equal(isPreparedStatementLost(serverError('57014', 'canceling statement due to statement timeout')), false);
    // the code alone, not thrown by a Buffer read, is not evidence of a switched connection
    assert.equal(isPreparedStatementLost(Object.assign(new Error('x'), { code: 'ERR_OUT_OF_RANGE' })), false);
    assert.equal(isPreparedStatementLost(new RangeError('Invalid array length')), false);
    assert.equal(isPreparedStatementLost(undefined), false);
    assert.equal(isPreparedStatementLost('26000'), false);
  });

  it('becomes a non-retriable DatabaseError that names the pooler and the setting, keeps the cause and what failed', () => {
    for (const cause of [serverError('26000', 'prepared statement "x1" does not exist'), outOfRange(), serverError('42P05', 'prepared statement "x1" already exists')]) {
      const err = wrapDbError(cause, 'setting timeouts');
      assert.ok(err instanceof DatabaseError);
      assert.equal(err.retriable, false);
      assert.equal(err.cause, cause);
      assert.match(err.message, /^database error while setting timeouts: the database connection looks pooled in transaction mode \(PgBouncer\/RDS Proxy\)/);
      assert.match(err.message, /set DATABASE_PREPARE=false/);
      // the original text stays, for whoever has to read the log
      assert.ok(err.message.includes(cause.message), err.message);
    }
  });

  it('other errors keep their wording', () => {
    const err = wrapDbError(serverError('57014', 'canceling statement due to statement timeout'), 'claiming a batch');
    assert.equal(err.message, 'database error while claiming a batch: canceling statement due to statement timeout (57014)');
    assert.doesNotMatch(err.message, /DATABASE_PREPARE/);
  });
});
