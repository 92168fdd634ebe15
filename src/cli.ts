// The outbox-relay command. `invoke` and `schedule` go through the same middy handler Lambda
// runs, with a Lambda-like context; the summary goes to stdout as JSON, logs to stderr.
import { randomUUID } from 'node:crypto';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import type { Context, ScheduledEvent } from 'aws-lambda';
import { Deadline } from './budget.ts';
import { closeRuntime, getRuntime, handler } from './handler.ts';
import { RelayError } from './errors.ts';
import { migrate } from './outbox/migrate.ts';
import { listParked, retryParked, skipParked, status } from './outbox/admin.ts';
import { wrapDbError } from './outbox/store.ts';
import type { Summary } from './relay.ts';

const USAGE = `usage: outbox-relay <command> [options]

commands:
  migrate                          create or upgrade the outbox table (idempotent)
  invoke [--timeout MS]            run one invocation (default timeout 60000); prints the summary JSON
  schedule [--every MS] [--timeout MS] [--max N]
                                   fire an invocation every MS (default 60000), like EventBridge;
                                   Ctrl-C lets running invocations finish, then exits
  status [--json] [--timeout MS]   pending, retrying and parked rows per topic, oldest pending age (gives up after MS, default 30000)
  parked list [--limit N] [--json] parked rows with their last error
  parked retry <id>... | --all     put parked rows back to pending (attempts reset)
  parked skip <id>...              never send these rows (kept for audit)

configuration comes from the environment: see docs/configuration.md (every variable).`;

function lambdaContext(timeoutMs: number, functionName: string): Context {
  const deadline = Date.now() + timeoutMs;
  const requestId = randomUUID();
  return {
    callbackWaitsForEmptyEventLoop: false,
    functionName,
    functionVersion: '$LATEST',
    invokedFunctionArn: `arn:aws:lambda:local:000000000000:function:${functionName}`,
    memoryLimitInMB: '512',
    awsRequestId: requestId,
    logGroupName: `/aws/lambda/${functionName}`,
    logStreamName: 'local',
    getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
    done: () => undefined,
    fail: () => undefined,
    succeed: () => undefined,
  };
}

function scheduledEvent(): ScheduledEvent {
  return {
    version: '0',
    id: randomUUID(),
    'detail-type': 'Scheduled Event',
    source: 'aws.events',
    account: '000000000000',
    time: new Date().toISOString(),
    region: 'local',
    resources: ['arn:aws:events:local:000000000000:rule/outbox-relay-local'],
    detail: {},
  };
}

function positiveInt(name: string, raw: string | undefined, def: number): number {
  if (raw === undefined) return def;
  if (!/^\d+$/.test(raw) || Number(raw) <= 0) throw new UsageError(`--${name} must be a positive whole number of milliseconds, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

class UsageError extends Error {}

async function invokeOnce(timeoutMs: number): Promise<Summary> {
  return handler(scheduledEvent(), lambdaContext(timeoutMs, 'outbox-relay-local'));
}

async function schedule(everyMs: number, timeoutMs: number, max: number | undefined): Promise<void> {
  const rt = getRuntime();
  const running = new Set<Promise<unknown>>();
  let fired = 0;
  let stopping = false;
  let wake: () => void = () => undefined;
  const stopped = new Promise<void>((resolve) => (wake = resolve));
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    clearInterval(timer);
    rt.logger.info('stopping: waiting for running invocations', { signal, running: running.size });
    wake();
  };
  process.once('SIGINT', () => stop('SIGINT'));
  process.once('SIGTERM', () => stop('SIGTERM'));
  const fire = () => {
    if (stopping) return;
    fired++;
    // overlapping invocations are allowed, as with EventBridge: row locks keep them apart
    const p = invokeOnce(timeoutMs)
      .then((summary) => process.stdout.write(JSON.stringify(summary) + '\n'))
      .catch((err: unknown) => rt.logger.error('invocation failed', { error: err }))
      .finally(() => running.delete(p));
    running.add(p);
    if (max !== undefined && fired >= max) void p.finally(() => stop('max'));
  };
  fire();
  const timer = setInterval(fire, everyMs);
  await stopped;
  await Promise.allSettled([...running]);
}

// parseArgs throws for an unknown or malformed option (e.g. a typo like --al): that is a usage
// error (exit 2 with the usage text), not a failure of the command (exit 1)
function parseCommandLine<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (err) {
    if ((err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS_')) throw new UsageError((err as Error).message);
    throw err;
  }
}

export async function main(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommandLine({
    args: argv,
    allowPositionals: true,
    options: {
      timeout: { type: 'string' },
      every: { type: 'string' },
      max: { type: 'string' },
      json: { type: 'boolean', default: false },
      all: { type: 'boolean', default: false },
      limit: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const [command, sub, ...rest] = positionals;
  if (values.help || !command) {
    process.stdout.write(USAGE + '\n');
    return command || values.help ? 0 : 2;
  }
  switch (command) {
    case 'migrate': {
      const rt = getRuntime();
      const sql = await rt.database();
      const result = await migrate(sql, rt.config.outbox.table).catch((e: unknown) => {
        throw wrapDbError(e, 'migrating');
      });
      process.stdout.write(JSON.stringify(result) + '\n');
      return 0;
    }
    case 'invoke': {
      const summary = await invokeOnce(positiveInt('timeout', values.timeout, 60_000));
      process.stdout.write(JSON.stringify(summary) + '\n');
      return 0;
    }
    case 'schedule':
      await schedule(positiveInt('every', values.every, 60_000), positiveInt('timeout', values.timeout, 60_000), values.max === undefined ? undefined : positiveInt('max', values.max, 1));
      return 0;
    case 'status':
      return statusCommand(values.json, values.timeout);
    case 'parked':
      return parkedCommand(sub, rest, { json: values.json, all: values.all, limit: values.limit });
    default:
      throw new UsageError(`unknown command ${JSON.stringify(command)}`);
  }
}

/** how long `status` waits for the backlog figures (the same bounded read the metrics make) */
// status never waits longer than this (a table locked by a migration, a hung server); overridable
// for scripts that poll it
const STATUS_TIMEOUT_MS = 30_000;

async function statusCommand(json: boolean, timeout: string | undefined): Promise<number> {
  const rt = getRuntime();
  const deadline = new Deadline(Date.now() + positiveInt('timeout', timeout, STATUS_TIMEOUT_MS));
  const s = await status(await rt.database(false, deadline), rt.config.outbox.table, rt.config.outbox.topicTemplate, deadline).catch((e: unknown) => {
    throw wrapDbError(e, 'reading status');
  });
  if (json) {
    process.stdout.write(JSON.stringify(s) + '\n');
    return 0;
  }
  const age = (ms: number | null) => (ms === null ? '-' : `${(ms / 1000).toFixed(1)}s`);
  process.stdout.write(`table ${s.table}: ${s.pending} pending (${s.retrying} retrying), ${s.parked} parked, oldest pending ${age(s.oldestPendingMs)}\n`);
  for (const t of s.topics) process.stdout.write(`  ${t.topic.padEnd(40)} pending ${String(t.pending).padStart(8)}  retrying ${String(t.retrying).padStart(6)}  parked ${String(t.parked).padStart(6)}  oldest ${age(t.oldestPendingMs)}\n`);
  return 0;
}

async function parkedCommand(sub: string | undefined, rest: string[], options: { json: boolean; all: boolean; limit: string | undefined }): Promise<number> {
  const rt = getRuntime();
  const sql = await rt.database();
  const table = rt.config.outbox.table;
  const ids = sub === 'list' ? [] : rest;
  // the canonical 8-4-4-4-12 form: a looser check (36 of [0-9a-f-]) let e.g. 36 hex digits
  // through to Postgres, which failed with a raw "invalid input syntax for type uuid", exit 1
  for (const id of ids) if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(id)) throw new UsageError(`${JSON.stringify(id)} is not a row id (uuid)`);
  if (sub === 'list') {
    const rows = await listParked(sql, table, positiveInt('limit', options.limit, 100));
    if (options.json) process.stdout.write(JSON.stringify(rows) + '\n');
    else if (!rows.length) process.stdout.write('no parked rows\n');
    else for (const r of rows) process.stdout.write(`${r.id}  seq ${r.seq}  ${r.aggregatetype}/${r.aggregateid} ${r.type}  attempts ${r.attempts}  parked ${r.parked_at.toISOString()}\n    ${r.last_error ?? ''}\n`);
    return 0;
  }
  if (sub === 'retry') {
    if (!options.all && !ids.length) throw new UsageError('parked retry needs row ids or --all');
    process.stdout.write(JSON.stringify({ retried: await retryParked(sql, table, options.all ? null : ids, rt.config.outbox.parkedPolicy) }) + '\n');
    return 0;
  }
  if (sub === 'skip') {
    if (!ids.length) throw new UsageError('parked skip needs row ids');
    process.stdout.write(JSON.stringify({ skipped: await skipParked(sql, table, ids, rt.config.outbox.parkedPolicy) }) + '\n');
    return 0;
  }
  throw new UsageError(`unknown parked subcommand ${JSON.stringify(sub)}: use list, retry or skip`);
}

async function run(): Promise<void> {
  let code: number;
  try {
    code = await main(process.argv.slice(2));
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`outbox-relay: ${err.message}\n\n${USAGE}\n`);
      code = 2;
    } else {
      const summary = (err as { summary?: Summary }).summary;
      if (summary) process.stdout.write(JSON.stringify(summary) + '\n');
      const kind = err instanceof RelayError ? err.name : 'error';
      const cause = (err as { cause?: unknown }).cause;
      const causeText = cause instanceof Error && !(err as Error).message.includes(cause.message) ? `\n  cause: ${cause.message}` : '';
      process.stderr.write(`outbox-relay: ${kind}: ${(err as Error).message ?? String(err)}${causeText}\n`);
      code = 1;
    }
  } finally {
    await closeRuntime();
  }
  process.exit(code);
}

await run();
