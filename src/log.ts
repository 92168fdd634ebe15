// Structured JSON logs through Powertools for AWS Lambda's Logger, behind the project's own small
// `Logger` interface (the loop, the publisher and the tests only know debug/info/warn/error/child).
//
// Every line goes to stderr, not to the console Powertools would use (stdout for debug and info):
// CloudWatch reads both streams, and the CLI keeps stdout for its summary (and, when asked, the
// metrics' EMF records). The Lambda context (request id, function name, cold start) is added by
// Powertools' injectLambdaContext middleware in src/lambda/handler.ts.
import { Logger as PowertoolsLogger, type LogItem } from '@aws-lambda-powertools/logger';
import type { ConstructorOptions, LogAttributes } from '@aws-lambda-powertools/logger/types';

/** The levels a logger may be set to: Powertools' (the relay writes at debug, info, warn and error; trace is below them, critical and silent above). */
export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'critical', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(fields: Record<string, unknown>): Logger;
}

/** Where a finished JSON line goes (without its newline). */
export type Write = (line: string) => void;

const toStderr: Write = (line) => {
  process.stderr.write(line + '\n');
};

/**
 * Powertools' Logger, printing through `write` instead of its own console. `printLog` and
 * `createLogger` are the extension points Powertools documents for subclasses; children made by
 * `createChild` are of this class too, so they print through the same `write`.
 */
export class PowertoolsStderrLogger extends PowertoolsLogger {
  // set after super(): a line printed while Powertools' constructor runs goes to stderr
  private write: Write | undefined;

  constructor(options: ConstructorOptions = {}, write: Write = toStderr) {
    super(options);
    this.write = write;
  }

  protected override printLog(_logLevel: number, log: LogItem): void {
    log.prepareForPrint();
    (this.write ?? toStderr)(JSON.stringify(log.getAttributes(), this.getJsonReplacer()));
  }

  protected override createLogger(options: ConstructorOptions = {}): PowertoolsLogger {
    return new PowertoolsStderrLogger(options, this.write ?? toStderr);
  }
}

// Keys Powertools owns in every line (it drops them from extra fields, with a warning line):
// kept under `<key>_` instead, e.g. the `timestamp` kafkajs puts in its log entries.
const RESERVED = new Set(['level', 'message', 'sampling_rate', 'service', 'timestamp']);

function attributes(fields: Record<string, unknown> | undefined): LogAttributes {
  const out: LogAttributes = {};
  for (const [k, v] of Object.entries(fields ?? {})) out[RESERVED.has(k) ? `${k}_` : k] = v;
  return out;
}

/**
 * Errors as before the move to Powertools: name, message, a string `code` when there is one, the
 * stack, and the cause, recursively. Not every enumerable property (Powertools' default): driver
 * errors carry query parameters and connection details that have no place in a log.
 */
function errorFields(value: unknown): unknown {
  if (!(value instanceof Error)) return value;
  const { code } = value as { code?: unknown };
  const cause = (value as { cause?: unknown }).cause;
  return {
    name: value.name,
    message: value.message,
    ...(typeof code === 'string' ? { code } : {}),
    stack: value.stack,
    ...(cause !== undefined ? { cause: errorFields(cause) } : {}),
  };
}

/** The project's Logger over a Powertools Logger. `powertools` is the instance the middy middleware decorates. */
export class RelayLogger implements Logger {
  constructor(readonly powertools: PowertoolsLogger) {}

  debug(msg: string, fields?: Record<string, unknown>): void {
    this.powertools.debug(msg, attributes(fields));
  }

  info(msg: string, fields?: Record<string, unknown>): void {
    this.powertools.info(msg, attributes(fields));
  }

  warn(msg: string, fields?: Record<string, unknown>): void {
    this.powertools.warn(msg, attributes(fields));
  }

  error(msg: string, fields?: Record<string, unknown>): void {
    this.powertools.error(msg, attributes(fields));
  }

  /** A logger whose lines also carry `fields`, and the Lambda context the parent holds now. */
  child(fields: Record<string, unknown>): RelayLogger {
    return new RelayLogger(this.powertools.createChild({ persistentKeys: attributes(fields) }));
  }
}

export interface LoggerOptions {
  /** the `service` key of every line (default outbox-relay) */
  serviceName?: string;
}

/**
 * A JSON logger on stderr (or `write`), lines below `level` dropped, `base` fields on every line.
 * Lambda's Advanced Logging Controls level (AWS_LAMBDA_LOG_LEVEL), when set, takes precedence,
 * as Powertools does.
 */
export function createLogger(level: LogLevel = 'info', base: Record<string, unknown> = {}, write: Write = toStderr, options: LoggerOptions = {}): RelayLogger {
  const powertools = new PowertoolsStderrLogger(
    {
      logLevel: level.toUpperCase() as Uppercase<LogLevel>,
      serviceName: options.serviceName ?? 'outbox-relay',
      persistentKeys: attributes(base),
      jsonReplacerFn: (_key, value) => errorFields(value),
    },
    write,
  );
  return new RelayLogger(powertools);
}
