// services: postgres, kafka
// Operator commands (CLI): `status` (text and --json), `parked list`, `parked retry <id> | --all`
// and `parked skip <id>` on rows parked, retrying and pending, and their usage errors; `status`
// against a table another transaction has locked gives up at its --timeout. Guarantees: G8 (a
// usage error exits 2 with a clear message and changes nothing). The commands and the invocations
// between them run as real child processes of the CLI.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import {
  consumeAll,
  createTopics,
  db,
  fixture,
  idsOf,
  insertEvents,
  makeDue,
  outboxTableOf as t,
  rowById,
  runCli,
  invokeOk as invoke,
} from './helpers.ts';

let sql: Sql;
before(() => {
  sql = db();
});
after(async () => {
  await sql.end();
});

describe('operator commands (CLI)', () => {
  it('status, parked list, parked retry <id> | --all, parked skip <id>; usage errors exit 2 with a clear message and change nothing (G8)', async () => {
    const f = await fixture(sql, 'operator', ['order', 'invoice']);
    // rows that can never be sent as they are: illegal topic overrides (charged, then parked)
    const nope1 = `${f.prefix}.nope1!`;
    const nope2 = `${f.prefix}.nope2!`;
    const cli = async (...args: string[]) => {
      const res = await runCli(args, f.env);
      assert.equal(res.code, 0, `${args.join(' ')}:\n${res.stderr}`);
      return res;
    };

    // two rows parked at once (max attempts 1), one aggregate held behind one of them
    const [b1, b2, b2later] = await insertEvents(sql, f.table, [
      { aggregateid: 'B1', topic: nope1 },
      { aggregateid: 'B2', topic: nope1 },
      { aggregateid: 'B2', type: 'Later' },
    ]);
    assert.equal((await invoke({ ...f.env, OUTBOX_MAX_ATTEMPTS: '1' })).parked, 2);
    // one row retrying
    const [r1] = await insertEvents(sql, f.table, [{ aggregateid: 'R1', topic: nope2 }]);
    assert.equal((await invoke({ ...f.env, OUTBOX_BACKOFF_BASE_MS: '60000' })).retried, 1);
    // plain pending rows; the oldest pending one 90 s old; the parked ones older still (not pending)
    const [o1] = await insertEvents(sql, f.table, [
      { aggregatetype: 'order', aggregateid: 'O' },
      { aggregatetype: 'order', aggregateid: 'O' },
      { aggregatetype: 'invoice', aggregateid: 'I' },
    ]);
    await sql.unsafe(`UPDATE ${t(f.table)} SET created_at = now() - interval '90 seconds' WHERE id = $1`, [o1!]);
    await sql.unsafe(`UPDATE ${t(f.table)} SET created_at = now() - interval '1 hour' WHERE id = ANY($1::uuid[])`, [[b1!, b2!]]);

    const status = (await cli('status', '--json')).summary as {
      pending: number;
      retrying: number;
      parked: number;
      oldestPendingMs: number;
      topics: Array<{ topic: string; pending: number; retrying: number; parked: number; oldestPendingMs: number | null }>;
    };
    assert.equal(status.pending, 5, 'b2later, r1 and three new rows');
    assert.equal(status.retrying, 1);
    assert.equal(status.parked, 2);
    assert.ok(status.oldestPendingMs >= 90_000 && status.oldestPendingMs < 120_000, `oldest pending ${status.oldestPendingMs}`);
    const topics = Object.fromEntries(status.topics.map(({ topic, ...rest }) => [topic, rest]));
    assert.deepEqual(Object.keys(topics).sort(), [f.topic('invoice'), nope1, nope2, f.topic('order')].sort());
    assert.deepEqual({ ...topics[f.topic('order')], oldestPendingMs: undefined }, { pending: 3, retrying: 0, parked: 0, oldestPendingMs: undefined });
    assert.ok(topics[f.topic('order')]!.oldestPendingMs! >= 90_000);
    assert.deepEqual({ ...topics[nope1] }, { pending: 0, retrying: 0, parked: 2, oldestPendingMs: null });
    assert.deepEqual({ ...topics[nope2], oldestPendingMs: undefined }, { pending: 1, retrying: 1, parked: 0, oldestPendingMs: undefined });
    assert.equal(topics[f.topic('invoice')]!.pending, 1);

    const text = (await cli('status')).stdout;
    assert.match(text, /: 5 pending \(1 retrying\), 2 parked, oldest pending 9\d\.\ds\n/);
    assert.match(text, new RegExp(`${nope1.replaceAll('.', '\\.')}\\s+pending\\s+0\\s+retrying\\s+0\\s+parked\\s+2\\s+oldest -`));

    const listed = JSON.parse((await cli('parked', 'list', '--json')).stdout) as Array<{ id: string; attempts: number; last_error: string; aggregateid: string }>;
    assert.deepEqual(listed.map((r) => r.id), [b1, b2]);
    for (const r of listed) {
      assert.equal(r.attempts, 1);
      assert.ok(r.last_error.includes(nope1) && r.last_error.includes('is not a legal Kafka topic name'), r.last_error);
    }
    const listText = (await cli('parked', 'list')).stdout;
    assert.ok(listText.includes(b1!) && listText.includes(b2!), listText);
    assert.match(listText, /attempts 1/);
    assert.ok(listText.includes(`${nope1}" is not a legal Kafka topic name`), listText);

    // usage errors: exit 2, a clear message, nothing changed
    const usage: Array<[string[], RegExp]> = [
      [['parked', 'retry', b1!, 'not-a-uuid'], /"not-a-uuid" is not a row id \(uuid\)/],
      [['parked', 'retry', '123456781234123412341234567890abcdef'], /is not a row id \(uuid\)/],
      [['parked', 'retry', '--al'], /Unknown option '--al'/],
      [['parked', 'retry'], /parked retry needs row ids or --all/],
      [['parked', 'skip'], /parked skip needs row ids/],
      [['parked', 'frobnicate'], /unknown parked subcommand "frobnicate"/],
    ];
    const results = await Promise.all(usage.map(([args]) => runCli(args, f.env)));
    usage.forEach(([args, message], i) => {
      const res = results[i]!;
      assert.equal(res.code, 2, `${args.join(' ')} → ${res.code}\n${res.stderr}`);
      assert.match(res.stderr, message);
      assert.match(res.stderr, /usage: outbox-relay/);
    });
    assert.equal((await rowById(sql, f.table, b1!)).parked, true, 'a rejected command changed nothing');

    // the operator fixes b1's topic and puts it back; b2 is skipped
    const fixed1 = `${f.prefix}.nope1`;
    await createTopics([fixed1], 1);
    await sql.unsafe(`UPDATE ${t(f.table)} SET topic = $1 WHERE id = $2`, [fixed1, b1!]);
    assert.deepEqual((await cli('parked', 'retry', b1!)).summary, { retried: [b1] });
    const back = await rowById(sql, f.table, b1!);
    assert.deepEqual([back.parked, back.attempts, back.last_error], [false, 0, null]);
    assert.deepEqual((await cli('parked', 'skip', b2!)).summary, { skipped: [b2] });
    assert.deepEqual((await cli('parked', 'retry', b2!)).summary, { retried: [] }, 'a skipped row cannot be retried');

    const s = await invoke(f.env);
    assert.equal(s.published, 5, JSON.stringify(s));
    const skipped = await rowById(sql, f.table, b2!);
    assert.deepEqual([skipped.skipped, skipped.sent], [true, false], 'kept in the table, never sent');
    assert.equal((await rowById(sql, f.table, b2later!)).sent, true, 'a skipped row no longer holds its aggregate');
    assert.deepEqual(idsOf(await consumeAll([fixed1], 1)), [b1], 'the retried row was sent, the skipped one was not');
    assert.equal((await cli('parked', 'list')).stdout, 'no parked rows\n');

    // --all: park r1 and one more, put both back
    const [x1] = await insertEvents(sql, f.table, [{ aggregateid: 'X1', topic: nope2 }]);
    await makeDue(sql, f.table);
    assert.equal((await invoke({ ...f.env, OUTBOX_MAX_ATTEMPTS: '1' })).parked, 2);
    const all = (await cli('parked', 'retry', '--all')).summary as { retried: string[] };
    assert.deepEqual(new Set(all.retried), new Set([r1, x1]));
    for (const id of [r1!, x1!]) assert.deepEqual(await rowById(sql, f.table, id).then((r) => [r.parked, r.attempts]), [false, 0]);
    const after = (await cli('status', '--json')).summary as { pending: number; parked: number; retrying: number };
    assert.deepEqual([after.pending, after.parked, after.retrying], [2, 0, 0]);
  });
});

describe('every wait has an end: status', () => {
  it('a table locked by another transaction (a migration holding ACCESS EXCLUSIVE): status gives up at its timeout with a clear error', async () => {
    const f = await fixture(sql, 'statuslock');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const locker = await sql.reserve();
    let res;
    try {
      await locker`BEGIN`;
      await locker.unsafe(`LOCK TABLE ${t(f.table)} IN ACCESS EXCLUSIVE MODE`);
      res = await runCli(['status', '--json', '--timeout', '2000'], f.env);
    } finally {
      await locker`ROLLBACK`;
      locker.release();
    }
    assert.equal(res.code, 1, res.stderr);
    assert.ok(res.durationMs < 2_000 + 4_000, `gave up near its timeout (plus process start): ${res.durationMs} ms`);
    assert.match(res.stderr, /DatabaseError: database error while reading status: canceling statement due to statement timeout/);
    // unlocked, it answers
    const ok = await runCli(['status', '--json'], f.env);
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((ok.summary as { pending: number }).pending, 1);
  });
});
