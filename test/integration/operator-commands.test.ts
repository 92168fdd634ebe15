// services: postgres, kafka
// Operator commands (CLI): `status` (text and --json), `parked list`, `parked retry <id> | --all`
// and `parked skip <id>` on rows parked, retrying and pending; what a row carries printed escaped
// in their text output; `status` against a table another transaction has locked gives up at its
// --timeout; the command line checked before anything connects (usage errors exit 2 on stderr,
// `<command> --help` exits 0). Guarantees: G8 (a usage error exits 2 with a clear message and
// changes nothing). The commands and the invocations between them run as real child processes of
// the CLI. The audit trail of retry and skip (--reason, --dry-run, rows not acted on):
// operator-audit.test.ts.
import assert from 'node:assert/strict';
import { createServer, type AddressInfo } from 'node:net';
import { describe, it } from 'node:test';
import { parseTableName } from '../../src/outbox/identifier.ts';
import { dropOutbox } from '../../src/outbox/migrate.ts';
import {
  DATABASE_URL,
  consumeAll,
  createTopics,
  fileDb,
  fixture,
  idsOf,
  insertEvents,
  makeDue,
  outboxTableOf as t,
  rowById,
  runCli,
  uniqueName,
  invokeOk as invoke,
} from './helpers.ts';

const sql = fileDb();

describe('operator commands (CLI)', () => {
  it('status, parked list, parked retry <id> | --all, parked skip <id>', async () => {
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
    // 90 s and however long this took; not the hour of the parked rows, which are not pending
    assert.ok(status.oldestPendingMs >= 90_000 && status.oldestPendingMs < 1_800_000, `oldest pending ${status.oldestPendingMs}`);
    const topics = Object.fromEntries(status.topics.map(({ topic, ...rest }) => [topic, rest]));
    assert.deepEqual(Object.keys(topics).sort(), [f.topic('invoice'), nope1, nope2, f.topic('order')].sort());
    assert.deepEqual({ ...topics[f.topic('order')], oldestPendingMs: undefined }, { pending: 3, retrying: 0, parked: 0, oldestPendingMs: undefined });
    assert.ok(topics[f.topic('order')]!.oldestPendingMs! >= 90_000);
    assert.deepEqual({ ...topics[nope1] }, { pending: 0, retrying: 0, parked: 2, oldestPendingMs: null });
    assert.deepEqual({ ...topics[nope2], oldestPendingMs: undefined }, { pending: 1, retrying: 1, parked: 0, oldestPendingMs: undefined });
    assert.equal(topics[f.topic('invoice')]!.pending, 1);

    const text = (await cli('status')).stdout;
    // at least the 90 s set above (how much more depends on the machine's load: no upper bound)
    const oldest = /: 5 pending \(1 retrying\), 2 parked, oldest pending (\d+\.\d)s\n/.exec(text);
    assert.ok(oldest && Number(oldest[1]) >= 90, text);
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

    // the operator fixes b1's topic and puts it back; b2 is skipped
    const fixed1 = `${f.prefix}.nope1`;
    await createTopics([fixed1], 1);
    await sql.unsafe(`UPDATE ${t(f.table)} SET topic = $1 WHERE id = $2`, [fixed1, b1!]);
    assert.deepEqual((await cli('parked', 'retry', b1!, '--reason', 'topic fixed')).summary?.retried, [b1]);
    const back = await rowById(sql, f.table, b1!);
    assert.deepEqual([back.parked, back.attempts, back.last_error], [false, 0, null]);
    assert.deepEqual((await cli('parked', 'skip', b2!, '--reason', 'obsolete')).summary?.skipped, [b2]);
    const again = await runCli(['parked', 'retry', b2!, '--reason', 'by mistake'], f.env);
    assert.equal(again.code, 1, 'a skipped row cannot be retried: not acted on');
    assert.deepEqual(again.summary?.retried, []);

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
    const all = (await cli('parked', 'retry', '--all', '--reason', 'broker back')).summary as { retried: string[] };
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
    // its --timeout, not the default 30 s (process start on a loaded machine can take seconds)
    assert.ok(res.durationMs < 20_000, `gave up at its timeout, not the default 30 s (plus process start): ${res.durationMs} ms`);
    assert.match(res.stderr, /DatabaseError: database error while reading status: canceling statement due to statement timeout/);
    // unlocked, it answers
    const ok = await runCli(['status', '--json'], f.env);
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((ok.summary as { pending: number }).pending, 1);
  });
});

/** a TCP port on which nothing listens (taken from the OS, then given back) */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

describe('the command line is checked before anything connects', () => {
  const ID = '0b4f8a52-3f7e-4c61-9d55-2f8f1b0c9e11';
  const CONNECTING = /ECONNREFUSED|DatabaseError|connect/i;

  it('G8: with DATABASE_URL on a closed port, a bad row id, a missing or empty --reason, an unknown option, subcommand or command exit 2 with a usage error on stderr, and no connection error', async () => {
    const env = { DATABASE_URL: `postgres://outbox:outbox@127.0.0.1:${await closedPort()}/outbox`, KAFKA_BROKERS: '127.0.0.1:9', DATABASE_CONNECT_TIMEOUT_MS: '1000' };
    // the control: a well-formed command does try the database there, and fails on it
    const control = await runCli(['parked', 'skip', ID, '--reason', 'x'], env);
    assert.equal(control.code, 1, control.stderr);
    assert.match(control.stderr, CONNECTING);
    const usage: Array<[string[], RegExp, RegExp]> = [
      [['parked', 'skip', 'not-a-uuid', '--reason', 'x'], /"not-a-uuid" is not a row id/, /^usage: outbox-relay parked skip /m],
      [['parked', 'retry', ID, '123456781234123412341234567890abcdef', '--reason', 'x'], /is not a row id/, /^usage: outbox-relay parked retry /m],
      [['parked', 'skip', ID], /parked skip needs --reason TEXT/, /^usage: outbox-relay parked skip /m],
      [['parked', 'retry', '--all', '--reason', ' '], /--reason must not be empty/, /^usage: outbox-relay parked retry /m],
      [['parked', 'retry', '--al', '--reason', 'x'], /Unknown option '--al'/, /^usage: outbox-relay parked retry /m],
      [['parked', 'retry', '--reason', 'x'], /parked retry needs row ids or --all/, /^usage: outbox-relay parked retry /m],
      [['parked', 'frobnicate'], /unknown parked subcommand "frobnicate"/, /^usage: outbox-relay parked <list\|retry\|skip>/m],
      [['status', '--all'], /Unknown option '--all'/, /^usage: outbox-relay status /m],
      [['status', '--timeout', '0'], /--timeout must be a whole number of milliseconds/, /^usage: outbox-relay status /m],
      [['frobnicate'], /unknown command "frobnicate"/, /^usage: outbox-relay <command>/m],
      [[], /no command given/, /^usage: outbox-relay <command>/m],
    ];
    const results = await Promise.all(usage.map(([args]) => runCli(args, env)));
    usage.forEach(([args, message, help], i) => {
      const res = results[i]!;
      const what = `${args.join(' ') || '(no arguments)'} → ${res.code}\n${res.stderr}`;
      assert.equal(res.code, 2, what);
      assert.equal(res.stdout, '', `usage errors go to stderr only: ${what}`);
      assert.match(res.stderr.split('\n')[0]!, new RegExp(`^outbox-relay: .*${message.source}`), what);
      assert.match(res.stderr, help, what);
      assert.doesNotMatch(res.stderr, CONNECTING, what);
    });
    // the environment is wrong rather than the command line: exit 2 too, as documented
    const config = await runCli(['status'], { KAFKA_BROKERS: env.KAFKA_BROKERS });
    assert.equal(config.code, 2, config.stderr);
    assert.match(config.stderr, /ConfigError: invalid configuration:\n {2}- DATABASE_URL or DATABASE_SECRET_ID is required/);
  });

  it('G8: migrate, status and parked need the database settings alone (no KAFKA_BROKERS); invoke still asks for it', async () => {
    const table = uniqueName('dbonly');
    // the test file's DATABASE_URL, direct: these commands never reach Kafka
    const env = { DATABASE_URL, OUTBOX_TABLE: table };
    const migrated = await runCli(['migrate'], env);
    assert.equal(migrated.code, 0, migrated.stderr);
    for (const args of [['status', '--json'], ['parked', 'list'], ['parked', 'retry', '--all', '--reason', 'none parked', '--dry-run']]) {
      const res = await runCli(args, env);
      assert.equal(res.code, 0, `${args.join(' ')}: ${res.stderr}`);
    }
    const invoke = await runCli(['invoke'], env);
    assert.equal(invoke.code, 2, invoke.stderr);
    assert.match(invoke.stderr, /KAFKA_BROKERS is required/);
    await dropOutbox(sql, parseTableName(table));
  });

  it('`<command> --help` prints that command\'s usage and options on stdout and exits 0, without connecting; `--help` alone, the global usage', async () => {
    const env = { DATABASE_URL: `postgres://outbox:outbox@127.0.0.1:${await closedPort()}/outbox`, KAFKA_BROKERS: '127.0.0.1:9' };
    const cases: Array<[string[], RegExp[]]> = [
      [['parked', 'skip', '--help'], [/^usage: outbox-relay parked skip <id>\.\.\. --reason TEXT \[--dry-run\]\n/, /^ {2}--reason TEXT /m, /^ {2}--dry-run /m, /OUTBOX_RETAIN_SKIPPED_MS/]],
      [['parked', 'retry', ID, '-h'], [/^usage: outbox-relay parked retry /, /^ {2}--all /m, /^ {2}--reason TEXT /m, /^ {2}--dry-run /m]],
      [['status', '--help'], [/^usage: outbox-relay status \[--json\] \[--timeout MS\]\n/, /^ {2}--timeout MS /m]],
      [['parked', '--help'], [/^usage: outbox-relay parked <list\|retry\|skip>/]],
      [['--help'], [/^usage: outbox-relay <command> \[options\]\n/, /^ {2}parked skip /m, /`outbox-relay <command> --help`/]],
    ];
    const results = await Promise.all(cases.map(([args]) => runCli(args, env)));
    cases.forEach(([args, patterns], i) => {
      const res = results[i]!;
      assert.equal(res.code, 0, `${args.join(' ')}\n${res.stderr}`);
      assert.equal(res.stderr, '');
      for (const p of patterns) assert.match(res.stdout, p, args.join(' '));
    });
  });
});

describe('what a row carries is printed escaped', () => {
  it('parked list and status as text: line breaks and escape sequences in a row\'s error, key, type and topic print escaped, a row on its own lines; --json gives them back as they are, C1 and bidi controls as \\u escapes', async () => {
    const f = await fixture(sql, 'escape');
    const evil = { aggregateid: 'K\r\x1b[1A', type: 'T\u2028x', topic: `${f.prefix}.t\n  fake.topic  pending 99\x1b[2J` };
    const [id] = await insertEvents(sql, f.table, [evil]);
    // parked by hand, with an error such as a broker's message (or anyone with UPDATE) could carry
    // \x9b: a single-byte CSI; \u202e: a right-to-left override (JSON.stringify leaves both raw)
    const error = 'boom\nfake-row  seq 1  order/x T  attempts 1\n\x1b]0;pwned\x07 \x9b2J \u202egnp.exe';
    await sql.unsafe(`UPDATE ${t(f.table)} SET attempts = 3, parked_at = now(), last_error = $1 WHERE id = $2`, [error, id!]);

    const cli = async (...args: string[]) => {
      const res = await runCli(args, f.env);
      assert.equal(res.code, 0, `${args.join(' ')}:\n${res.stderr}`);
      return res.stdout;
    };
    const [list, listJson, statusOut, statusJson] = await Promise.all([cli('parked', 'list'), cli('parked', 'list', '--json'), cli('status'), cli('status', '--json')]);
    assert.equal(list.split('\n').length, 3, `one row, two lines:\n${list}`);
    assert.ok(list.includes('/K\\r\\x1b[1A T\\u2028x  attempts 3'), list);
    assert.ok(list.includes('    boom\\nfake-row  seq 1  order/x T  attempts 1\\n\\x1b]0;pwned\\x07 \\x9b2J \\u202egnp.exe\n'), list);
    assert.equal(statusOut.split('\n').length, 3, `the totals and one topic:\n${statusOut}`);
    assert.ok(statusOut.includes('.t\\n  fake.topic  pending 99\\x1b[2J '), statusOut);
    for (const out of [list, statusOut]) for (const raw of ['\x1b', '\r', '\u2028']) assert.ok(!out.includes(raw), `${JSON.stringify(raw)} printed raw:\n${out}`);

    for (const out of [listJson, statusJson]) assert.ok(!/[\x80-\x9f\u202a-\u202e\u2066-\u2069]/.test(out), `a C1 or bidi control printed raw:\n${out}`);
    assert.ok(listJson.includes('\\u009b2J \\u202egnp.exe'), listJson);
    const [row] = JSON.parse(listJson) as Array<{ aggregateid: string; type: string; last_error: string }>;
    assert.deepEqual([row!.aggregateid, row!.type, row!.last_error], [evil.aggregateid, evil.type, error]);
    assert.deepEqual((JSON.parse(statusJson) as { topics: Array<{ topic: string }> }).topics.map((x) => x.topic), [evil.topic]);
  });
});
