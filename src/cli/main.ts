// The outbox-relay command. The command line is parsed and checked first (cli/commands.ts), before
// the configuration is read or anything connects. `invoke` and `schedule` go through the same
// middy handler Lambda runs, with a Lambda-like context; the summary goes to stdout as JSON, logs
// to stderr. Text for humans is escaped (cli/output.ts, cli/printable.ts), and so is what JSON
// leaves raw that a terminal acts on (jsonText).
import { randomUUID } from 'node:crypto';
import type { Context, ScheduledEvent } from 'aws-lambda';
import { Deadline } from '../budget.ts';
import { parseCommand, UsageError, type Command } from './commands.ts';
import { operatorReport, parkedListText, statusText } from './output.ts';
import { operatorIdentity } from './operator.ts';
import { jsonText } from './printable.ts';
import { closeRuntime, getRuntime } from '../lambda/container.ts';
import { handler } from '../lambda/handler.ts';
import { ConfigError, RelayError } from '../errors.ts';
import { migrate } from '../outbox/migrate.ts';
import { listParked, retryParked, skipParked, status } from '../outbox/admin.ts';
import { qualified } from '../outbox/identifier.ts';
import { wrapDbError } from '../outbox/db-errors.ts';
import type { Summary } from '../loop/invocation.ts';

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

/**
 * `invoke` and `schedule` run the handler outside Lambda, where there is no function to start
 * helpers of: fan-out on would warn on every tick instead of doing anything, so it is refused.
 */
function refuseFanOut(): void {
  const max = getRuntime().config.fanoutMax;
  if (max <= 1) return;
  throw new ConfigError([
    `OUTBOX_FANOUT_MAX=${max} starts helper invocations of the Lambda function, and this command runs outside Lambda: ` +
      'unset it here (several `schedule` processes share a backlog through row locks, as invocations do)',
  ]);
}

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
      .then((summary) => process.stdout.write(jsonText(summary) + '\n'))
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

/** migrate, status and parked use the database only: they need no Kafka setting (loadConfig). */
const DATABASE_ONLY = { kafka: false };

/** Runs a parsed command; its exit status. */
export async function main(command: Command): Promise<number> {
  switch (command.name) {
    case 'help':
      process.stdout.write(command.text + '\n');
      return 0;
    case 'migrate': {
      const rt = getRuntime(DATABASE_ONLY);
      const sql = await rt.database();
      const result = await migrate(sql, rt.config.outbox.table, undefined, { partitionWidthS: rt.config.outbox.partitionWidthS }).catch((e: unknown) => {
        throw wrapDbError(e, 'migrating');
      });
      process.stdout.write(jsonText(result) + '\n');
      return 0;
    }
    case 'invoke': {
      refuseFanOut();
      const summary = await invokeOnce(command.timeoutMs);
      process.stdout.write(jsonText(summary) + '\n');
      return 0;
    }
    case 'schedule':
      refuseFanOut();
      await schedule(command.everyMs, command.timeoutMs, command.max);
      return 0;
    case 'status':
      return statusCommand(command.json, command.timeoutMs);
    case 'parked list': {
      const rt = getRuntime(DATABASE_ONLY);
      const rows = await listParked(await rt.database(), rt.config.outbox.table, command.limit).catch((e: unknown) => {
        throw wrapDbError(e, 'listing parked rows');
      });
      process.stdout.write(command.json ? jsonText(rows) + '\n' : parkedListText(rows));
      return 0;
    }
    case 'parked retry':
    case 'parked skip':
      return operatorCommand(command);
  }
}

async function statusCommand(json: boolean, timeoutMs: number): Promise<number> {
  const rt = getRuntime(DATABASE_ONLY);
  const deadline = new Deadline(Date.now() + timeoutMs);
  const s = await status(await rt.database(false, deadline), rt.config.outbox.table, rt.config.outbox.topicTemplate, deadline).catch((e: unknown) => {
    throw wrapDbError(e, 'reading status');
  });
  process.stdout.write(json ? jsonText(s) + '\n' : statusText(s));
  return 0;
}

/**
 * `parked retry|skip`: acts on the rows it may act on, records who, when and why with each, and
 * logs one line saying so (also for a dry run, which changes nothing). Exit 1 when a row named
 * was not acted on: the rest still were.
 */
async function operatorCommand(command: Extract<Command, { name: 'parked retry' | 'parked skip' }>): Promise<number> {
  const rt = getRuntime(DATABASE_ONLY);
  // who, before anything connects: a command that cannot say who ran it does not run
  const operator = await operatorIdentity(command.operator, rt.config.awsCredentials);
  const sql = await rt.database();
  const table = rt.config.outbox.table;
  const request = { reason: command.reason, operator, dryRun: command.dryRun, policy: rt.config.outbox.parkedPolicy };
  const action = command.name === 'parked retry' ? 'retry' : 'skip';
  const result = await (command.name === 'parked retry' ? retryParked(sql, table, { ...request, ids: command.ids }) : skipParked(sql, table, { ...request, ids: command.ids })).catch((e: unknown) => {
    throw wrapDbError(e, `${command.dryRun ? 'looking up' : action === 'retry' ? 'retrying' : 'skipping'} parked rows`);
  });
  const report = operatorReport(action, command, result);
  // the audit trail's log line: the same fields as the JSON, and the command and table
  rt.logger[report.code ? 'warn' : 'info'](command.dryRun ? `${command.name} --dry-run: nothing changed` : `${command.name}: done`, { command: command.name, table: qualified(table), ...report.json });
  process.stdout.write(jsonText(report.json) + '\n');
  process.stderr.write(report.text);
  return report.code;
}

async function run(): Promise<void> {
  let code: number;
  try {
    // every argument is checked here, before the configuration is read or anything connects
    code = await main(parseCommand(process.argv.slice(2)));
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`outbox-relay: ${err.message}\n\n${err.help}\n`);
      code = 2;
    } else if (err instanceof ConfigError) {
      // the environment is wrong, not the command: exit 2 as documented (docs/operations.md)
      process.stderr.write(`outbox-relay: ${err.name}: ${err.message}\n`);
      code = 2;
    } else {
      const summary = (err as { summary?: Summary }).summary;
      if (summary) process.stdout.write(jsonText(summary) + '\n');
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
