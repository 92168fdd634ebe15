// services: postgres, kafka
// The tables teams point the relay at, beyond the one `migrate` makes: partitioned, with
// inheritance children, row-level security, triggers, columns of their own. Every statement that
// marks, moves or deletes rows names them by address (tableoid, ctid) and fails unless it affected
// exactly the rows named (src/outbox/sql.ts, exactly): a mark that matched nothing would re-send
// its batch forever, one that matched more loses rows. Against the real database and broker.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { DatabaseError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { retryParked, skipParked } from '../../src/outbox/admin.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import * as q from '../../src/outbox/sql.ts';
import { OutboxStore, type SentRowsMode } from '../../src/outbox/store.ts';
import type { Summary } from '../../src/loop/invocation.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { consumeAll, copiesById, fileDb, firstCopyOrder, fixture, insertEvents, isSorted, partitionByRange, sentTableOf, topicCount, type Fixture } from './helpers.ts';

const sql = fileDb();

/** A warm relay: one Runtime, invoked again and again, as Lambda reuses a container. */
function warmRelay(env: Record<string, string>): { invoke(ms?: number): Promise<Summary>; close(): Promise<void> } {
  const rt = new Runtime(loadConfig({ ...env, OUTBOX_LOG_LEVEL: 'error' }), createLogger('error', {}, () => undefined));
  return { invoke: (ms = 10_000) => rt.invoke(ms), close: () => rt.close() };
}

/** The invocation fails with a DatabaseError no retry fixes; its message. */
async function failsLoudly(run: Promise<Summary>): Promise<string> {
  let message = '';
  await assert.rejects(run, (err: unknown) => {
    assert.ok(err instanceof DatabaseError, String(err));
    assert.equal(err.retriable, false, err.message);
    message = err.message;
    return true;
  });
  return message;
}

/** Rows still in the outbox, and how many of them were ever charged an attempt. */
async function outboxRows(f: { table: string }): Promise<{ pending: number; charged: number }> {
  const [r] = await sql.unsafe<{ pending: number; charged: number }[]>(
    `SELECT count(*)::int AS pending, count(*) FILTER (WHERE attempts > 0)::int AS charged FROM ${qualified(parseTableName(f.table))}`,
  );
  return r!;
}

async function sentCount(f: { table: string }): Promise<number> {
  const [r] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${sentTableOf(f.table)}`);
  return r!.n;
}

describe('the mark checks what it moved', () => {
  for (const mode of ['keep', 'delete'] as const) {
    it(`G1/G2/G8: OUTBOX_SENT_ROWS=${mode}, a trigger added under a warm relay that suppresses the mark's DELETE fails the invocation loudly: the batch rolled back, nothing marked or charged, no batch published again and again; dropped, the rows flow`, async () => {
      const f = await fixture(sql, `suppress${mode}`);
      const t = qualified(parseTableName(f.table));
      const relay = warmRelay({ ...f.env, OUTBOX_SENT_ROWS: mode });
      try {
        await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
        assert.equal((await relay.invoke()).published, 2, 'the table as migrate made it');
        // a DBA's audit trigger gone wrong: it returns NULL, which cancels the row's DELETE
        const fn = `${f.table}_keep`;
        await sql.unsafe(`CREATE FUNCTION "${fn}"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`);
        await sql.unsafe(`CREATE TRIGGER keep_rows BEFORE DELETE ON ${t} FOR EACH ROW EXECUTE FUNCTION "${fn}"()`);
        const ids = await insertEvents(sql, f.table, [{ aggregateid: 'c' }, { aggregateid: 'd' }, { aggregateid: 'e' }]);

        const message = await failsLoudly(relay.invoke(5_000));
        assert.match(message, mode === 'keep' ? /the mark moved 0 rows out of the outbox and wrote 0 into the sent table, of 3 rows named/ : /the mark deleted 0 rows of the outbox, of 3 rows named/);
        assert.match(message, /Nothing of the batch was marked or charged/);
        assert.deepEqual(await outboxRows(f), { pending: 3, charged: 0 });
        if (mode === 'keep') assert.equal(await sentCount(f), 2, 'nothing moved to the sent table');
        // the invocation stopped at the first batch: each row published at most once by it
        // (before the check, 3 rows were published 342 times in one 5-second invocation)
        const afterOne = await topicCount([f.topic('order')]);
        assert.ok(afterOne <= 2 + 3, `${afterOne} messages after one failed invocation`);
        await failsLoudly(relay.invoke(5_000));
        assert.ok((await topicCount([f.topic('order')])) <= 2 + 6, 'at most one batch per invocation');

        await sql.unsafe(`DROP TRIGGER keep_rows ON ${t}`);
        assert.equal((await relay.invoke()).published, 3, 'the warm relay recovers once the table is fixed');
        assert.deepEqual(await outboxRows(f), { pending: 0, charged: 0 });
        const copies = copiesById(await consumeAll([f.topic('order')], afterOne + 3));
        for (const id of ids) assert.ok((copies.get(id) ?? 0) >= 1, `row ${id} delivered`);
      } finally {
        await relay.close();
      }
    });
  }

  it('G1/G2/G8: row-level security forced on a warm relay\'s outbox with no DELETE policy: the mark that matches nothing fails the invocation instead of committing; its rows stay pending, uncharged', async () => {
    const f = await fixture(sql, 'rlsdel');
    const t = qualified(parseTableName(f.table));
    const relay = warmRelay({ ...f.env, OUTBOX_SENT_ROWS: 'delete' });
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
      assert.equal((await relay.invoke()).published, 1);
      // the relay's role owns the table: FORCE makes the policies apply to it too
      await sql.unsafe(`ALTER TABLE ${t} ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY`);
      await sql.unsafe(`CREATE POLICY see ON ${t} FOR SELECT USING (true)`);
      await sql.unsafe(`CREATE POLICY change ON ${t} FOR UPDATE USING (true)`);
      await sql.unsafe(`CREATE POLICY add ON ${t} FOR INSERT WITH CHECK (true)`);
      await insertEvents(sql, f.table, [{ aggregateid: 'b' }, { aggregateid: 'c' }]);
      const message = await failsLoudly(relay.invoke(5_000));
      assert.match(message, /the mark deleted 0 rows of the outbox, of 2 rows named/);
      assert.match(message, /row-level security/);
      assert.deepEqual(await outboxRows(f), { pending: 2, charged: 0 });
      assert.ok((await topicCount([f.topic('order')])) <= 1 + 2, 'one batch, once');
    } finally {
      await relay.close();
    }
  });

  it('G1/G6: a failed attempt whose UPDATE a trigger suppresses fails the batch instead of leaving the row uncharged (retried without backoff forever); a premarked batch whose mark matches nothing is not committed', async () => {
    const f = await fixture(sql, 'suppressupd');
    const t = qualified(parseTableName(f.table));
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    const store = new OutboxStore(sql, parseTableName(f.table), 'hold');
    const fn = `${f.table}_frozen`;
    await sql.unsafe(`CREATE FUNCTION "${fn}"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`);
    await sql.unsafe(`CREATE TRIGGER frozen BEFORE UPDATE OR DELETE ON ${t} FOR EACH ROW EXECUTE FUNCTION "${fn}"()`);

    const deadline = new Deadline(Date.now() + 10_000);
    const tx = await store.begin(deadline);
    const rows = await tx.claim(10);
    assert.equal(rows.length, 2);
    await assert.rejects(tx.markAndCommit([], [{ seq: rows[0]!.seq, error: 'poison', delayMs: 1_000, park: false }]),
      (err: Error) => /recording failed attempts updated 0 rows, of 1 rows named/.test(err.message));

    const tx2 = await store.begin(deadline);
    const again = await tx2.claim(10);
    const seqs = again.map((r) => r.seq);
    tx2.premark(seqs);
    assert.equal(await tx2.commitIfAllPremarked(seqs, []), undefined, 'the premark failed: no COMMIT of it');
    await assert.rejects(tx2.markAndCommit(seqs, []), (err: Error) => /the mark moved 0 rows out of the outbox/.test(err.message));
    assert.deepEqual(await outboxRows(f), { pending: 2, charged: 0 });
    assert.equal(await sentCount(f), 0);
  });
});

describe('operators\' commands check what they changed', () => {
  it('G8: `parked retry` whose UPDATE a trigger suppresses fails, changing nothing, instead of reporting rows retried that stay parked', async () => {
    const f = await fixture(sql, 'opcheck');
    const t = qualified(parseTableName(f.table));
    const [id] = await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    await sql.unsafe(`UPDATE ${t} SET attempts = 5, parked_at = now(), last_error = 'poison' WHERE id = $1`, [id!]);
    const fn = `${f.table}_frozen`;
    await sql.unsafe(`CREATE FUNCTION "${fn}"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`);
    await sql.unsafe(`CREATE TRIGGER frozen BEFORE UPDATE ON ${t} FOR EACH ROW EXECUTE FUNCTION "${fn}"()`);
    const request = { ids: [id!], reason: 'fixed the consumer', operator: 'test', dryRun: false, policy: 'hold' as const };
    await assert.rejects(retryParked(sql, parseTableName(f.table), request), (err: unknown) => {
      assert.ok(err instanceof DatabaseError && !err.retriable, String(err));
      assert.match(err.message, /retrying 1 parked rows of .* changed 0: row-level security/);
      return true;
    });
    await assert.rejects(skipParked(sql, parseTableName(f.table), request), /skipping 1 parked rows of .* changed 0/);
    const [row] = await sql.unsafe<{ parked: boolean; attempts: number }[]>(`SELECT parked_at IS NOT NULL AS parked, attempts FROM ${t}`);
    assert.deepEqual(row, { parked: true, attempts: 5 });
  });
});

describe('partitions and inheritance children: rows named by address, never by a ctid alone', () => {
  it('G1/G3/G4: an outbox partitioned by range of created_at (ctids repeat across partitions), relayed by two warm relays at once: every row once on Kafka, every row moved once, per-aggregate order', async () => {
    const f = await fixture(sql, 'partitioned');
    const t = qualified(parseTableName(f.table));
    const parts = await partitionByRange(sql, f.table, 'created_at', '2026-06-01');
    // the first half in the older partition, the second in the newer, at the same ctids: a batch of
    // the first half's rows names ctids that the second half's rows have too
    const n = 400;
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload, created_at)
       SELECT 'order', 'agg-' || (i % 20), 'Happened', jsonb_build_object('n', i),
              CASE WHEN i <= $1::int / 2 THEN timestamptz '2026-01-15' ELSE now() END
       FROM generate_series(1, $1::int) i ORDER BY i`, [n]);
    const split = await sql.unsafe<{ part: string; n: number }[]>(`SELECT tableoid::regclass::text AS part, count(*)::int AS n FROM ${t} GROUP BY 1`);
    assert.deepEqual(split.map((s) => s.n), [n / 2, n / 2], JSON.stringify(split));
    assert.equal(split.length, parts.length);

    const relays = [warmRelay({ ...f.env, OUTBOX_BATCH_SIZE: '50' }), warmRelay({ ...f.env, OUTBOX_BATCH_SIZE: '50' })];
    try {
      for (let round = 0; round < 10 && (await outboxRows(f)).pending > 0; round++) await Promise.all(relays.map((r) => r.invoke(3_000)));
    } finally {
      await Promise.all(relays.map((r) => r.close()));
    }
    assert.deepEqual(await outboxRows(f), { pending: 0, charged: 0 });
    assert.equal(await sentCount(f), n, 'each row moved once (before: all 400 moved, 201 published)');
    const msgs = await consumeAll([f.topic('order')], n);
    const copies = copiesById(msgs);
    assert.equal(copies.size, n, 'every row on Kafka');
    assert.ok([...copies.values()].every((c) => c === 1), 'no duplicates without faults (G3)');
    const seqs = await sentSeqsById(f);
    for (const [agg, order] of firstCopyOrder(msgs, (id) => seqs.get(id)!)) assert.ok(isSorted(order), `aggregate ${agg} in seq order`);
  });

  it('G1: an inheritance child beside the outbox: the claim reads both, and the mark moves exactly the rows claimed, not the child\'s rows at the same ctids', async () => {
    const f = await fixture(sql, 'inherits');
    const t = qualified(parseTableName(f.table));
    const child = `"${f.table}_child"`;
    await insertEvents(sql, f.table, Array.from({ length: 10 }, (_, i) => ({ aggregateid: `p-${i}` })));
    await sql.unsafe(`CREATE TABLE ${child} () INHERITS (${t})`);
    // a child inherits no identity: its rows take seqs from the parent's sequence, after the parent's rows
    await sql.unsafe(`INSERT INTO ${child} (aggregatetype, aggregateid, type, payload, seq)
      SELECT 'order', 'c-' || i, 'Happened', '{}', nextval(pg_get_serial_sequence('${t}', 'seq')) FROM generate_series(1, 10) i`);
    for (const mode of ['keep', 'delete'] satisfies SentRowsMode[]) {
      const store = new OutboxStore(sql, parseTableName(f.table), 'hold', { sentRows: mode });
      const tx = await store.begin(new Deadline(Date.now() + 10_000));
      const rows = await tx.claim(5);
      assert.equal(rows.length, 5);
      await tx.markAndCommit(rows.map((r) => r.seq), []);
      const [left] = await sql.unsafe<{ parent: number; child: number }[]>(
        `SELECT count(*) FILTER (WHERE tableoid = '${t}'::regclass)::int AS parent, count(*) FILTER (WHERE tableoid = '${child}'::regclass)::int AS child FROM ${t}`);
      // before: the child's rows at the claimed rows' ctids left with them, unpublished
      assert.deepEqual(left, mode === 'keep' ? { parent: 5, child: 10 } : { parent: 0, child: 10 }, mode);
    }
    assert.equal(await sentCount(f), 5, 'keep moved its five; delete kept none');
  });

  it('retention: a sent table partitioned by range of sent_at deletes exactly the rows due, not the newer partition\'s rows at the same ctids', async () => {
    const f = await fixture(sql, 'sentparts');
    const sent = sentTableOf(f.table);
    const sentName = parseTableName(f.table).name + '_sent';
    await partitionByRange(sql, sentName, 'sent_at', '2026-06-01');
    const row = `gen_random_uuid(), 'order', 'a', 'Happened', '{}'::jsonb, NULL::text, NULL::jsonb, i, now(), `;
    await sql.unsafe(`INSERT INTO ${sent} (id, aggregatetype, aggregateid, type, payload, topic, headers, seq, created_at, sent_at, attempts)
      SELECT ${row} timestamptz '2026-01-10', 0 FROM generate_series(1, 10) i UNION ALL SELECT ${row} now(), 0 FROM generate_series(11, 20) i`);
    const store = new OutboxStore(sql, parseTableName(f.table), 'hold');
    const pruned = await store.pruneChunk('sent', 24 * 3600_000, 100, new Deadline(Date.now() + 10_000));
    assert.equal(pruned, 10, 'the ten older than a day');
    assert.equal(await sentCount(f), 10, 'before: 20 deleted for 10 due');
  });
});

describe('columns of the application\'s own', () => {
  it('G1/G4: an outbox with a column named like every alias and CTE of the relay\'s statements relays as migrate\'s does, in both modes and with the metadata columns read', async () => {
    const f = await fixture(sql, 'aliases');
    const t = qualified(parseTableName(f.table));
    const store = new OutboxStore(sql, parseTableName(f.table), 'hold');
    const texts = [store.claimStatement(10, { aggregates: ['x'], inFlight: ['1'], topics: ['y'], topicTemplate: 'z' }).text, store.markText,
      store.unwaitText, store.markWaitingText, store.waitingWorkText, ...Object.values(store.pruneText),
      new OutboxStore(sql, parseTableName(f.table), 'skip', { sentRows: 'delete' }).markText,
      q.recordFailuresSql(t), q.whyEmptySql(t, 'hold'), q.heldGapsSql(t), q.backlogSql(t), q.statusSql(t), q.parkedListSql(t),
      q.operatorLookupSql(t, 'all-parked', true), q.parkedRetrySql(t), q.parkedSkipSql(t)];
    const names = new Set<string>();
    for (const text of texts) for (const m of text.matchAll(/\b(?:AS|AS NOT MATERIALIZED|AS MATERIALIZED)\s+\(?"?([a-z_][a-z0-9_]*)"?/gi)) names.add(m[1]!.toLowerCase());
    for (const m of texts.join('\n').matchAll(/\b([a-z_][a-z0-9_]*)\s+AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(/gi)) names.add(m[1]!.toLowerCase());
    for (const m of texts.join('\n').matchAll(/\bAS\s+[a-z_]+\(([a-z_, ]+)\)/gi)) for (const c of m[1]!.split(',')) names.add(c.trim());
    const columns = await sql.unsafe<{ attname: string }[]>(`SELECT attname::text FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0`, [t]);
    const own = new Set(columns.map((c) => c.attname));
    const added = [...names].filter((n) => !own.has(n) && !['materialized', 'not'].includes(n));
    for (const required of ['tid', 'rel', 'first_gap', 'publishable', 'running', 'last_seq', 'affected', 'delay_ms', 'claimable', 'why']) assert.ok(added.includes(required), `${required} among ${added.join(', ')}`);
    for (const c of added) await sql.unsafe(`ALTER TABLE ${t} ADD COLUMN "${c}" text DEFAULT 'the application''s'`);

    const ids = await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'a' }, { aggregateid: 'b' }]);
    const relay = warmRelay({ ...f.env, OUTBOX_METADATA: 'timestamp,seq' });
    try {
      assert.equal((await relay.invoke()).published, 3, `relays with columns ${added.join(', ')}`);
    } finally {
      await relay.close();
    }
    const more = await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'c' }]);
    const deleting = warmRelay({ ...f.env, OUTBOX_SENT_ROWS: 'delete' });
    try {
      assert.equal((await deleting.invoke()).published, 2);
    } finally {
      await deleting.close();
    }
    const msgs = await consumeAll([f.topic('order')], 5);
    assert.deepEqual(new Set(msgs.map((m) => m.headers.id)), new Set([...ids, ...more]));
    assert.equal(await sentCount(f), 3);
  });
});

/** The sent rows' seqs by event id. */
async function sentSeqsById(f: Fixture): Promise<Map<string, number>> {
  const rows = await sql.unsafe<{ id: string; seq: string }[]>(`SELECT id, seq::text FROM ${sentTableOf(f.table)}`);
  return new Map(rows.map((r) => [r.id, Number(r.seq)]));
}
