import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { loadConfig } from '../../src/config.ts';
import { ConfigError } from '../../src/errors.ts';

const base = { DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db', KAFKA_BROKERS: '127.0.0.1:9092' };

function problems(env: Record<string, string>): string[] {
  try {
    loadConfig(env);
  } catch (e) {
    assert.ok(e instanceof ConfigError);
    return e.problems;
  }
  assert.fail('expected a ConfigError');
}

describe('loadConfig', () => {
  it('applies documented defaults', () => {
    const c = loadConfig(base);
    assert.deepEqual(c.kafka.brokers, ['127.0.0.1:9092']);
    assert.equal(c.outbox.batchSize, 500);
    assert.equal(c.outbox.safetyMarginMs, 3000);
    assert.equal(c.outbox.topicTemplate, 'outbox.event.{aggregatetype}');
    assert.deepEqual(c.outbox.table, { schema: undefined, name: 'outbox' });
    assert.equal(c.outbox.parkedPolicy, 'hold');
    assert.equal(c.database.prepare, true);
    assert.equal(c.kafka.ssl, false);
    assert.equal(c.outbox.maxMessageBytes, undefined);
  });

  it('reads every knob', () => {
    const c = loadConfig({
      DATABASE_SECRET_ID: 'outbox/db',
      KAFKA_BROKERS: 'a:9092, b:9093',
      KAFKA_SECRET_ID: 'outbox/kafka',
      KAFKA_SSL: 'true',
      OUTBOX_TABLE: 'app.events',
      OUTBOX_BATCH_SIZE: '100',
      OUTBOX_SAFETY_MARGIN_MS: '1500',
      OUTBOX_MAX_ATTEMPTS: '3',
      OUTBOX_BACKOFF_BASE_MS: '10',
      OUTBOX_BACKOFF_MAX_MS: '100',
      OUTBOX_TOPIC_TEMPLATE: 'events.{aggregatetype}.{type}',
      OUTBOX_PARKED_POLICY: 'skip',
      OUTBOX_MAX_MESSAGE_BYTES: '2048',
      DATABASE_PREPARE: 'false',
      OUTBOX_CLIENT_ID: 'orders-relay',
    });
    assert.deepEqual(c.kafka.brokers, ['a:9092', 'b:9093']);
    assert.equal(c.database.secretId, 'outbox/db');
    assert.equal(c.database.prepare, false);
    assert.deepEqual(c.outbox.table, { schema: 'app', name: 'events' });
    assert.equal(c.outbox.batchSize, 100);
    assert.equal(c.outbox.parkedPolicy, 'skip');
    assert.equal(c.outbox.maxMessageBytes, 2048);
    assert.equal(c.kafka.clientId, 'orders-relay');
    assert.equal(c.kafka.ssl, true);
  });

  it('names the variable and the expected form for every problem at once', () => {
    const p = problems({ KAFKA_BROKERS: '', OUTBOX_BATCH_SIZE: 'lots', OUTBOX_PARKED_POLICY: 'maybe' });
    assert.ok(p.some((x) => x.includes('DATABASE_URL or DATABASE_SECRET_ID is required')));
    assert.ok(p.some((x) => x.startsWith('KAFKA_BROKERS is required')));
    assert.ok(p.some((x) => x.startsWith('OUTBOX_BATCH_SIZE="lots" is not a whole number')));
    assert.ok(p.some((x) => x.startsWith('OUTBOX_PARKED_POLICY="maybe" is not one of hold, skip')));
  });

  it('rejects a table name that is not an identifier, so it never reaches SQL', () => {
    const p = problems({ ...base, OUTBOX_TABLE: 'outbox; drop table x' });
    assert.equal(p.length, 1);
    assert.match(p[0]!, /^OUTBOX_TABLE: "outbox; drop table x" is not a valid table name/);
    assert.ok(problems({ ...base, OUTBOX_TABLE: 'a.b.c' }).length === 1);
    assert.ok(problems({ ...base, OUTBOX_TABLE: '"quoted"' }).length === 1);
  });

  it('rejects bad URLs, brokers, ranges and templates', () => {
    assert.match(problems({ ...base, DATABASE_URL: 'mysql://x' })[0]!, /DATABASE_URL must start with postgres:\/\//);
    assert.match(problems({ ...base, KAFKA_BROKERS: 'localhost' })[0]!, /KAFKA_BROKERS entry "localhost" is not host:port/);
    assert.match(problems({ ...base, OUTBOX_BATCH_SIZE: '0' })[0]!, /out of range/);
    assert.match(problems({ ...base, OUTBOX_TOPIC_TEMPLATE: 'x.{tenant}' })[0]!, /unknown placeholder\(s\) \{tenant\}/);
    assert.match(problems({ ...base, OUTBOX_BACKOFF_BASE_MS: '1000', OUTBOX_BACKOFF_MAX_MS: '10' })[0]!, /OUTBOX_BACKOFF_MAX_MS/);
    assert.match(problems({ ...base, DATABASE_SECRET_ID: 'x' })[0]!, /only one of DATABASE_URL and DATABASE_SECRET_ID/);
  });
});
