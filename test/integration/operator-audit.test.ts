// services: postgres, kafka, moto
// The audit trail of `parked skip` and `parked retry`: who (the database role, session_user, and the
// operator: --operator, the AWS caller identity from STS when AWS credentials are set, else the OS
// user), when
// and why (--reason) stored with each row and in the CLI's structured log line, and for a retried
// row carried to the sent table once it is sent; rows named that the command did not act on
// (unknown, pending, retrying, skipped) listed by id with why, exit 1, the others acted on all the
// same; --dry-run reports what would be done and writes nothing; a table without the audit
// columns (migration 2) is refused saying what to run. The commands run as real child
// processes of the CLI. Argument checking and the text output: operator-commands.test.ts.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { hostname, userInfo } from 'node:os';
import { GetCallerIdentityCommand, STSClient } from '@aws-sdk/client-sts';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { AWS_ENDPOINT_URL, consumeAll, db, fixture, idsOf, insertEvents, invokeOk as invoke, outboxTableOf as t, runCli, sentTableOf } from './helpers.ts';

let sql: Sql;
let role: string;
/** who runs a command when no --operator is given and no AWS credentials are set */
const osUser = `${userInfo().username}@${hostname()}`;
const awsEnv = { AWS_ENDPOINT_URL, AWS_REGION: 'us-east-1', AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test' };
before(async () => {
  sql = db();
  const [me] = await sql<{ role: string }[]>`SELECT session_user::text AS role`;
  role = me!.role;
});
after(async () => {
  await sql.end();
});

/** park rows by hand, as OUTBOX_MAX_ATTEMPTS failed attempts would */
async function park(table: string, ids: string[]): Promise<void> {
  await sql.unsafe(`UPDATE ${t(table)} SET attempts = 3, parked_at = now(), last_error = 'topic refused', next_attempt_at = now() WHERE id = ANY($1::uuid[])`, [ids]);
}

interface Audit {
  skipped_at: Date | null;
  skipped_by: string | null;
  skipped_reason: string | null;
  skipped_operator: string | null;
  retried_at: Date | null;
  retried_by: string | null;
  retried_reason: string | null;
  retried_operator: string | null;
  parked: boolean;
  attempts: number;
}

async function audit(table: string, id: string): Promise<Audit> {
  const [row] = await sql.unsafe<Audit[]>(
    `SELECT skipped_at, skipped_by, skipped_reason, skipped_operator, retried_at, retried_by, retried_reason, retried_operator, parked_at IS NOT NULL AS parked, attempts FROM ${t(table)} WHERE id = $1`,
    [id],
  );
  assert.ok(row, `row ${id}`);
  return row;
}

/** the CLI's JSON log line with this message (stderr) */
function logLine(stderr: string, message: string): Record<string, unknown> {
  const line = stderr
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .find((l) => l.message === message);
  assert.ok(line, `a log line "${message}" in:\n${stderr}`);
  return line;
}

describe('parked skip: who, when and why; the rows named that were not skipped', () => {
  it('stored with each row skipped and logged; unknown, pending, retrying and already skipped rows are listed by id with why, exit 1, and the parked ones named are skipped all the same', async () => {
    const f = await fixture(sql, 'auditskip');
    const [p1, p2, pending, retrying] = await insertEvents(sql, f.table, [{ aggregateid: 'P1' }, { aggregateid: 'P2' }, { aggregateid: 'N' }, { aggregateid: 'R' }]);
    await park(f.table, [p1!, p2!]);
    await sql.unsafe(`UPDATE ${t(f.table)} SET attempts = 2, next_attempt_at = now() + interval '1 hour' WHERE id = $1`, [retrying!]);

    const started = Date.now();
    const first = await runCli(['parked', 'skip', p1!, '--reason', 'obsolete: order cancelled (OPS-7)'], f.env);
    assert.equal(first.code, 0, first.stderr);
    assert.equal(first.stderr.includes('not skipped'), false);
    const s1 = first.summary as { skipped: string[]; notSkipped: unknown[]; dryRun: boolean; reason: string; by: string; at: string };
    assert.deepEqual([s1.skipped, s1.notSkipped, s1.dryRun, s1.reason, s1.by], [[p1], [], false, 'obsolete: order cancelled (OPS-7)', role]);
    const a1 = await audit(f.table, p1!);
    assert.deepEqual([a1.skipped_by, a1.skipped_reason, a1.skipped_at?.toISOString()], [role, 'obsolete: order cancelled (OPS-7)', s1.at]);
    assert.ok(a1.skipped_at!.getTime() >= started - 5_000 && a1.skipped_at!.getTime() <= Date.now() + 5_000, `skipped at ${s1.at}`);
    const logged = logLine(first.stderr, 'parked skip: done');
    assert.equal(logged.level, 'INFO');
    assert.deepEqual([logged.skipped, logged.reason, logged.by, logged.at, logged.dryRun, logged.command], [[p1], 'obsolete: order cancelled (OPS-7)', role, s1.at, false, 'parked skip']);
    assert.match(String(logged.table), new RegExp(f.table));

    const unknown = randomUUID();
    const second = await runCli(['parked', 'skip', p2!, unknown, pending!, retrying!, p1!, '--reason', 'duplicates'], f.env);
    assert.equal(second.code, 1, `some rows named were not skipped:\n${second.stderr}`);
    const s2 = second.summary as { skipped: string[]; notSkipped: Array<{ id: string; state: string; why: string }> };
    assert.deepEqual(s2.skipped, [p2], 'the parked row named was skipped all the same');
    assert.deepEqual(
      s2.notSkipped.map((n) => [n.id, n.state]),
      [
        [unknown, 'unknown'],
        [pending, 'pending'],
        [retrying, 'retrying'],
        [p1, 'skipped'],
      ],
    );
    assert.match(second.stderr, new RegExp(`^outbox-relay: 4 of 5 rows named not skipped:\n {2}${unknown}: no such row in the outbox table`, 'm'));
    assert.match(second.stderr, new RegExp(`^ {2}${pending}: not parked: pending \\(it has not failed\\)$`, 'm'));
    assert.match(second.stderr, new RegExp(`^ {2}${retrying}: not parked: retrying \\(2 failed attempts; next attempt at .*\\)$`, 'm'));
    assert.match(second.stderr, new RegExp(`^ {2}${p1}: already skipped, at ${s1.at.replaceAll('.', '\\.')} by ${role}$`, 'm'));
    assert.deepEqual((logLine(second.stderr, 'parked skip: done') as { notSkipped: unknown }).notSkipped, s2.notSkipped);

    assert.deepEqual([(await audit(f.table, p2!)).skipped_reason, (await audit(f.table, p1!)).skipped_reason], ['duplicates', 'obsolete: order cancelled (OPS-7)'], 'an earlier skip keeps its record');
    for (const id of [pending!, retrying!]) assert.equal((await audit(f.table, id)).skipped_at, null);
  });
});

describe('--dry-run', () => {
  it('reports what would be done and writes nothing (no row version changes), exiting as the real run would; the real run then does it', async () => {
    const f = await fixture(sql, 'dryrun');
    const [d1, d2, pending] = await insertEvents(sql, f.table, [{ aggregateid: 'D1' }, { aggregateid: 'D2' }, { aggregateid: 'N' }]);
    await park(f.table, [d1!, d2!]);
    // xmin changes with any write to a row, even one that sets the same values
    const snapshot = () => sql.unsafe(`SELECT xmin::text, * FROM ${t(f.table)} ORDER BY seq`);
    const before = await snapshot();

    const skip = await runCli(['parked', 'skip', d1!, pending!, '--reason', 'obsolete', '--dry-run'], f.env);
    assert.equal(skip.code, 1, `a row named would not be skipped:\n${skip.stderr}`);
    const s = skip.summary as Record<string, unknown>;
    assert.deepEqual([s.wouldSkip, s.skipped, s.dryRun], [[d1], undefined, true]);
    assert.deepEqual((s.notSkipped as Array<{ id: string; state: string }>).map((n) => [n.id, n.state]), [[pending, 'pending']]);
    assert.match(skip.stderr, new RegExp(`^outbox-relay: dry run: 1 of 2 rows named would not be skipped:\n {2}${pending}: not parked`, 'm'));
    assert.equal(logLine(skip.stderr, 'parked skip --dry-run: nothing changed').dryRun, true);

    const retry = await runCli(['parked', 'retry', '--all', '--reason', 'broker fixed', '--dry-run'], f.env);
    assert.equal(retry.code, 0, retry.stderr);
    assert.deepEqual((retry.summary as { wouldRetry: string[] }).wouldRetry, [d1, d2]);
    assert.deepEqual(await snapshot(), before, 'nothing was written');

    const real = await runCli(['parked', 'retry', '--all', '--reason', 'broker fixed'], f.env);
    assert.equal(real.code, 0, real.stderr);
    assert.deepEqual((real.summary as { retried: string[] }).retried, [d1, d2]);
    for (const id of [d1!, d2!]) assert.deepEqual(await audit(f.table, id).then((a) => [a.parked, a.attempts, a.retried_reason]), [false, 0, 'broker fixed']);
  });
});

describe('parked retry: who, when and why, after the row is sent too', () => {
  it('stored with the row, carried to the sent table when it is sent; a row parked again shows its last retry in parked list', async () => {
    const f = await fixture(sql, 'auditretry');
    const nope = `${f.prefix}.nope!`;
    const [good, poison] = await insertEvents(sql, f.table, [{ aggregateid: 'G' }, { aggregateid: 'X', topic: nope }]);
    await park(f.table, [good!, poison!]);

    const res = await runCli(['parked', 'retry', good!, poison!, '--reason', 'ACL granted (OPS-9)'], f.env);
    assert.equal(res.code, 0, res.stderr);
    const s = res.summary as { retried: string[]; by: string; operator: string; at: string };
    assert.deepEqual([s.retried, s.by, s.operator], [[good, poison], role, osUser]);
    assert.deepEqual(logLine(res.stderr, 'parked retry: done').retried, [good, poison]);
    const a = await audit(f.table, good!);
    assert.deepEqual([a.retried_by, a.retried_operator, a.retried_reason, a.retried_at?.toISOString(), a.parked, a.attempts], [role, osUser, 'ACL granted (OPS-9)', s.at, false, 0]);

    // the good row is sent (moved to the sent table, its record with it); the poison row is
    // parked again at its first failed attempt
    assert.equal((await invoke({ ...f.env, OUTBOX_MAX_ATTEMPTS: '1' })).published, 1);
    assert.deepEqual(idsOf(await consumeAll([f.topic('order')], 1)), [good]);
    const [sent] = await sql.unsafe<Array<{ retried_at: Date | null; retried_by: string | null; retried_operator: string | null; retried_reason: string | null }>>(
      `SELECT retried_at, retried_by, retried_operator, retried_reason FROM ${sentTableOf(f.table)} WHERE id = $1`,
      [good!],
    );
    assert.deepEqual([sent?.retried_by, sent?.retried_operator, sent?.retried_reason, sent?.retried_at?.toISOString()], [role, osUser, 'ACL granted (OPS-9)', s.at]);

    const list = await runCli(['parked', 'list'], f.env);
    assert.equal(list.code, 0, list.stderr);
    assert.ok(list.stdout.includes(`    retried before: ${s.at} by ${role} (operator ${osUser}): ACL granted (OPS-9)\n`), list.stdout);
    const [json] = JSON.parse((await runCli(['parked', 'list', '--json'], f.env)).stdout) as Array<{ id: string; retried_by: string; retried_operator: string; retried_reason: string }>;
    assert.deepEqual([json?.id, json?.retried_by, json?.retried_operator, json?.retried_reason], [poison, role, osUser, 'ACL granted (OPS-9)']);
  });
});

describe('who ran the command, beside the database role (an operator using the relay\'s own secret is not the relay)', () => {
  it('--operator as given; else the AWS caller identity when AWS credentials are set (STS GetCallerIdentity, on the emulator); else the OS user: stored with the row, printed and logged', async () => {
    const f = await fixture(sql, 'auditwho');
    const [named, aws, os, retried] = await insertEvents(sql, f.table, ['N', 'A', 'O', 'R'].map((a) => ({ aggregateid: a })));
    await park(f.table, [named!, aws!, os!, retried!]);
    const sts = new STSClient({ endpoint: AWS_ENDPOINT_URL, region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' } });
    const arn = (await sts.send(new GetCallerIdentityCommand({}))).Arn!;
    sts.destroy();
    assert.match(arn, /^arn:aws:/);

    const cases: Array<[string, string[], Record<string, string>, string]> = [
      [named!, ['--operator', 'alice@example.com'], awsEnv, 'alice@example.com'],
      [aws!, [], awsEnv, arn],
      [os!, [], {}, osUser],
    ];
    for (const [id, args, env, expected] of cases) {
      const res = await runCli(['parked', 'skip', id, '--reason', 'obsolete', ...args], { ...f.env, ...env });
      assert.equal(res.code, 0, res.stderr);
      assert.equal((res.summary as { operator: string }).operator, expected);
      assert.equal(logLine(res.stderr, 'parked skip: done').operator, expected);
      const a = await audit(f.table, id);
      assert.deepEqual([a.skipped_by, a.skipped_operator], [role, expected]);
    }
    const res = await runCli(['parked', 'retry', retried!, '--reason', 'fixed'], { ...f.env, ...awsEnv });
    assert.equal(res.code, 0, res.stderr);
    assert.equal((await audit(f.table, retried!)).retried_operator, arn);
  });

  it('AWS credentials set but their identity unreadable (STS unreachable): refused before anything changes, saying to name the operator with --operator', async () => {
    const f = await fixture(sql, 'auditnowho');
    const [id] = await insertEvents(sql, f.table, [{ aggregateid: 'A' }]);
    await park(f.table, [id!]);
    const res = await runCli(['parked', 'skip', id!, '--reason', 'obsolete'], { ...f.env, ...awsEnv, AWS_ENDPOINT_URL: 'http://127.0.0.1:1' });
    assert.equal(res.code, 1);
    assert.match(res.stderr, /AWS credentials are set, but who they belong to could not be read \(STS GetCallerIdentity: .*\): fix the credentials, or name the operator with --operator NAME/);
    const a = await audit(f.table, id!);
    assert.deepEqual([a.skipped_at, a.parked], [null, true]);
  });
});
