// The outbox-relay command line: each command with its options and help, and argv parsed into a
// Command whose every argument has been checked. src/cli/main.ts parses before it reads the
// configuration or connects to anything, so a mistyped id or option is a usage error (exit 2)
// whether or not the database is up, and never half-runs a command. Pure: the unit tests call
// parseCommand.
import { parseArgs } from 'node:util';
import { quoted } from './printable.ts';

/** The command line is wrong: exit 2, the message and the help of the command (or the global usage) on stderr. */
export class UsageError extends Error {
  constructor(
    message: string,
    /** the help to print after the message: the command's, when the command is known */
    readonly help: string,
  ) {
    super(message);
    this.name = 'UsageError';
  }
}

export type Command =
  | { name: 'help'; text: string }
  | { name: 'migrate' }
  | { name: 'invoke'; timeoutMs: number }
  | { name: 'schedule'; everyMs: number; timeoutMs: number; max: number | undefined }
  | { name: 'status'; json: boolean; timeoutMs: number }
  | { name: 'parked list'; json: boolean; limit: number }
  | { name: 'parked retry'; ids: string[] | null; reason: string; dryRun: boolean; operator?: string }
  | { name: 'parked skip'; ids: string[]; reason: string; dryRun: boolean; operator?: string };

/** `status` never waits longer than this by default (a table locked by a migration, a hung server) */
export const STATUS_TIMEOUT_MS = 30_000;
/** the longest a --reason may be: a sentence or a ticket, not a pasted file */
export const MAX_REASON_CHARS = 1_000;
/** the longest an --operator may be: a name, an ARN or an e-mail address */
export const MAX_OPERATOR_CHARS = 200;
/** setTimeout's and setInterval's limit (a longer delay fires at once) */
const MAX_DELAY_MS = 2_147_483_647;

interface Option {
  name: string;
  /** the value's placeholder (MS, N, TEXT); none for a flag */
  value?: string;
  help: string;
}

type Values = Record<string, string[] | boolean | undefined>;

interface Spec {
  name: Exclude<Command['name'], 'help'>;
  /** what follows the command's name in its usage line */
  synopsis: string;
  /** one line, for the global usage */
  summary: string;
  /** a paragraph, for the command's help */
  about: string;
  options: Option[];
  /** exit statuses, when the command has more than the usual ones */
  exit?: string;
  /** allowed positional arguments: none unless said */
  positionals?: boolean;
  build(read: Reader, positionals: string[]): Command;
}

const REASON: Option = {
  name: 'reason',
  value: 'TEXT',
  help: `why (required, at most ${MAX_REASON_CHARS} characters): stored with each row, with the database role (session_user), the operator and the time, and logged`,
};
const DRY_RUN: Option = { name: 'dry-run', help: 'print what would be done; change nothing' };
const OPERATOR: Option = {
  name: 'operator',
  value: 'NAME',
  help: `who runs the command (at most ${MAX_OPERATOR_CHARS} characters; default: the AWS caller identity when AWS credentials are set, else the OS user): stored with each row and logged`,
};
const JSON_OUT: Option = { name: 'json', help: 'print JSON instead of text' };
const REPAIR_EXIT = (done: string) =>
  `0 every row named was ${done}; 1 some were not (each listed on stderr with why, and in the JSON as not${done[0]!.toUpperCase()}${done.slice(1)}) ` +
  `or the command failed; 2 usage or configuration error. A dry run exits as the command would.`;

const SPECS: Spec[] = [
  {
    name: 'migrate',
    synopsis: '',
    summary: 'create or upgrade the outbox table (idempotent)',
    about: 'Creates or upgrades the outbox table and its sent table: applies the migrations not yet recorded for OUTBOX_TABLE (idempotent; safe when several run at once). With OUTBOX_PARTITION_WIDTH (e.g. "1 day") it creates them partitioned by time, with their maintenance function, which it calls (docs/schema.md, "Partitioned outboxes"). Prints what it applied, as JSON.',
    options: [],
    build: () => ({ name: 'migrate' }),
  },
  {
    name: 'invoke',
    synopsis: '[--timeout MS]',
    summary: 'run one invocation; prints its summary (JSON)',
    about: 'Runs one invocation through the same handler Lambda runs, with a Lambda-like context. The summary goes to stdout as JSON, the logs to stderr.',
    options: [{ name: 'timeout', value: 'MS', help: "the invocation's deadline, as Lambda's timeout (default 60000)" }],
    build: (r) => ({ name: 'invoke', timeoutMs: r.whole('timeout', 60_000, MAX_DELAY_MS, 'milliseconds') }),
  },
  {
    name: 'schedule',
    synopsis: '[--every MS] [--timeout MS] [--max N]',
    summary: 'fire an invocation every MS, like EventBridge',
    about: 'A local stand-in for the EventBridge schedule: fires an invocation every MS (overlapping allowed), each summary a JSON line on stdout. Ctrl-C (SIGINT) or SIGTERM lets running invocations finish, then exits.',
    options: [
      { name: 'every', value: 'MS', help: 'the period (default 60000)' },
      { name: 'timeout', value: 'MS', help: "each invocation's deadline (default 60000)" },
      { name: 'max', value: 'N', help: 'stop after N invocations (default: run until stopped)' },
    ],
    build: (r) => ({
      name: 'schedule',
      everyMs: r.whole('every', 60_000, MAX_DELAY_MS, 'milliseconds'),
      timeoutMs: r.whole('timeout', 60_000, MAX_DELAY_MS, 'milliseconds'),
      max: r.one('max') === undefined ? undefined : r.whole('max', 1, Number.MAX_SAFE_INTEGER, 'invocations'),
    }),
  },
  {
    name: 'status',
    synopsis: '[--json] [--timeout MS]',
    summary: 'pending, retrying and parked rows per topic; oldest pending age',
    about: 'Pending, retrying and parked rows per topic, the age of the oldest pending row, and (with --json) the backlog figures the metrics report.',
    options: [JSON_OUT, { name: 'timeout', value: 'MS', help: `give up after MS with a clear error (default ${STATUS_TIMEOUT_MS})` }],
    build: (r) => ({ name: 'status', json: r.flag('json'), timeoutMs: r.whole('timeout', STATUS_TIMEOUT_MS, MAX_DELAY_MS, 'milliseconds') }),
  },
  {
    name: 'parked list',
    synopsis: '[--limit N] [--json]',
    summary: 'parked rows with their last error',
    about: 'The parked rows, oldest first, each with its last error (and its last `parked retry`, if it was put back before).',
    options: [{ name: 'limit', value: 'N', help: 'at most N rows (default 100)' }, JSON_OUT],
    build: (r) => ({ name: 'parked list', json: r.flag('json'), limit: r.whole('limit', 100, 1_000_000, 'rows') }),
  },
  {
    name: 'parked retry',
    synopsis: '(<id>... | --all) --reason TEXT [--dry-run]',
    summary: 'put parked rows back to pending (attempts reset)',
    about: "Puts the parked rows named (or every parked row) back to pending, attempts reset; the rows of their aggregates waiting behind them are freed. Who (the database role and the operator), when and why are recorded with each row (retried_by, retried_operator, retried_at, retried_reason, carried to the sent table when it is sent) and logged. Prints the result as JSON.",
    options: [{ name: 'all', help: 'every parked row (instead of ids)' }, REASON, OPERATOR, DRY_RUN],
    exit: REPAIR_EXIT('retried'),
    positionals: true,
    build: (r, p) => {
      const all = r.flag('all');
      if (all && p.length) throw r.usage('give row ids or --all, not both');
      if (!all && !p.length) throw r.usage('parked retry needs row ids or --all');
      return { name: 'parked retry', ids: all ? null : r.rowIds(p), reason: r.reason(), dryRun: r.flag('dry-run'), ...r.operator() };
    },
  },
  {
    name: 'parked skip',
    synopsis: '<id>... --reason TEXT [--dry-run]',
    summary: 'never send these parked rows (kept for audit)',
    about: "Never sends the parked rows named. They stay in the outbox for OUTBOX_RETAIN_SKIPPED_MS (default 30 days) with who skipped them (the database role and the operator), when and why (skipped_by, skipped_operator, skipped_at, skipped_reason), and no longer hold their aggregate's later rows back. Logged too. Prints the result as JSON.",
    options: [REASON, OPERATOR, DRY_RUN],
    exit: REPAIR_EXIT('skipped'),
    positionals: true,
    build: (r, p) => {
      if (!p.length) throw r.usage('parked skip needs row ids');
      return { name: 'parked skip', ids: r.rowIds(p), reason: r.reason(), dryRun: r.flag('dry-run'), ...r.operator() };
    },
  },
];

const BY_NAME = new Map(SPECS.map((s) => [s.name as string, s]));
const PARKED = SPECS.filter((s) => s.name.startsWith('parked '));

const HELP_OPTION = '-h, --help';

/** The global usage: every command in one line. */
export const USAGE = [
  'usage: outbox-relay <command> [options]',
  '',
  'commands:',
  ...SPECS.map((s) => `  ${s.name.padEnd(14)} ${s.summary}`),
  '',
  '`outbox-relay <command> --help` shows the options of a command.',
  'Configuration comes from the environment: see docs/configuration.md (every variable).',
  'exit status: 0 done; 1 the command failed (the message names the cause); 2 usage or configuration error.',
].join('\n');

/** `outbox-relay parked` alone or with --help: its three subcommands, each with its synopsis */
const PARKED_USAGE = [
  'usage: outbox-relay parked <list|retry|skip> [options]',
  '',
  'Rows the relay gave up on (docs/operations.md, "Parked rows: runbook"):',
  ...PARKED.flatMap((s) => [`  ${s.name} ${s.synopsis}`, `      ${s.summary}`]),
  '',
  '`outbox-relay parked <list|retry|skip> --help` shows the options of each.',
].join('\n');

/** the width help text is wrapped to */
const COLUMNS = 96;

/**
 * Words filled into lines of at most `width` characters (a longer word stays whole), every line
 * but the first indented by `indent`; the first starts `start` characters in (after a label).
 */
export function wrap(text: string, width = COLUMNS, indent = '', start = 0): string {
  const lines: string[] = [];
  let line = ' '.repeat(start);
  for (const word of text.split(' ').filter(Boolean)) {
    if (line.trim() && line.length + 1 + word.length > width) {
      lines.push(line);
      line = indent + word;
    } else line = line.trim() ? `${line} ${word}` : line + word;
  }
  lines.push(line);
  return lines.join('\n').slice(start);
}

/** A command's help: its usage line, what it does, its options, its exit statuses. */
export function help(spec: Spec): string {
  const rows: Array<[string, string]> = spec.options.map((o) => [`--${o.name}${o.value ? ` ${o.value}` : ''}`, o.help]);
  rows.push([HELP_OPTION, 'show this help']);
  const width = Math.max(...rows.map(([l]) => l.length)) + 4;
  return [
    `usage: outbox-relay ${spec.name}${spec.synopsis ? ` ${spec.synopsis}` : ''}`,
    '',
    wrap(spec.about),
    '',
    'options:',
    ...rows.map(([l, h]) => `  ${l.padEnd(width - 2)}${wrap(h, COLUMNS, ' '.repeat(width), width)}`),
    '',
    wrap(`exit status: ${spec.exit ?? '0 done; 1 the command failed (the message names the cause); 2 usage or configuration error.'}`, COLUMNS, '  '),
  ].join('\n');
}

const isHelp = (arg: string | undefined) => arg === '--help' || arg === '-h';

/** argv (after the program) into a Command, every argument checked; throws UsageError. */
export function parseCommand(argv: readonly string[]): Command {
  const [first, ...rest] = argv;
  if (first === undefined) throw new UsageError('no command given', USAGE);
  if (isHelp(first)) return { name: 'help', text: USAGE };
  if (first === 'help') return { name: 'help', text: helpTopic(rest) };
  if (first.startsWith('-')) throw new UsageError(`${quoted(first)} before the command: the command comes first, then its options`, USAGE);
  let spec: Spec;
  let args: string[];
  if (first === 'parked') {
    const [sub, ...more] = rest;
    if (sub === undefined) throw new UsageError('parked needs a subcommand: list, retry or skip', PARKED_USAGE);
    if (isHelp(sub)) return { name: 'help', text: PARKED_USAGE };
    const found = BY_NAME.get(`parked ${sub}`);
    if (!found) throw new UsageError(`unknown parked subcommand ${quoted(sub)}: use list, retry or skip`, PARKED_USAGE);
    [spec, args] = [found, more];
  } else {
    const found = BY_NAME.get(first);
    if (!found) throw new UsageError(`unknown command ${quoted(first)}`, USAGE);
    [spec, args] = [found, rest];
  }
  // --help anywhere among the options wins over everything else on the line (not after `--`,
  // which ends the options)
  const end = args.indexOf('--');
  if ((end < 0 ? args : args.slice(0, end)).some(isHelp)) return { name: 'help', text: help(spec) };
  const { values, positionals } = parseOptions(spec, args);
  if (!spec.positionals && positionals.length) throw new UsageError(`unexpected argument ${quoted(positionals[0]!)}: ${spec.name} takes options only`, help(spec));
  return spec.build(new Reader(spec, values), positionals);
}

/** `outbox-relay help [command]` */
function helpTopic(words: string[]): string {
  if (!words.length) return USAGE;
  const name = words.join(' ');
  if (name === 'parked') return PARKED_USAGE;
  const spec = BY_NAME.get(name);
  if (!spec) throw new UsageError(`no such command: ${quoted(name)}`, USAGE);
  return help(spec);
}

/** node:util parseArgs with the command's own options only: any other option is a usage error */
function parseOptions(spec: Spec, args: string[]): { values: Values; positionals: string[] } {
  const options = Object.fromEntries(spec.options.map((o) => [o.name, o.value ? { type: 'string' as const, multiple: true } : { type: 'boolean' as const }]));
  try {
    const { values, positionals } = parseArgs({ args, options, allowPositionals: true, strict: true });
    return { values: values as Values, positionals };
  } catch (err) {
    // an unknown option (a typo such as --al), a missing or ambiguous value
    if ((err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS_')) throw new UsageError((err as Error).message, help(spec));
    throw err;
  }
}

// the canonical 8-4-4-4-12 form: a looser check (36 of [0-9a-f-]) let e.g. 36 hex digits through
// to Postgres, which failed with a raw "invalid input syntax for type uuid"
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** A command's parsed options, read and checked; every mistake a UsageError with the command's help. */
class Reader {
  constructor(
    private readonly spec: Spec,
    private readonly values: Values,
  ) {}

  usage(message: string): UsageError {
    return new UsageError(message, help(this.spec));
  }

  flag(name: string): boolean {
    return this.values[name] === true;
  }

  /** a valued option, given at most once (of two, the second would silently win) */
  one(name: string): string | undefined {
    const given = this.values[name];
    if (!Array.isArray(given)) return undefined;
    if (given.length > 1) throw this.usage(`--${name} given ${given.length} times; give it once`);
    return given[0];
  }

  whole(name: string, def: number, max: number, unit: string): number {
    const raw = this.one(name);
    if (raw === undefined) return def;
    if (!/^\d+$/.test(raw) || Number(raw) < 1 || Number(raw) > max) throw this.usage(`--${name} must be a whole number of ${unit} from 1 to ${max}, got ${quoted(raw)}`);
    return Number(raw);
  }

  /** the ids, checked, lower-cased as Postgres prints them, each once, in the order given */
  rowIds(args: string[]): string[] {
    for (const id of args) if (!UUID.test(id)) throw this.usage(`${quoted(id)} is not a row id (a uuid, as \`parked list\` prints it)`);
    return [...new Set(args.map((id) => id.toLowerCase()))];
  }

  /** --operator, when given: trimmed, not empty, not too long (as the key to spread into the command) */
  operator(): { operator?: string } {
    const raw = this.one('operator');
    if (raw === undefined) return {};
    const name = raw.trim();
    if (!name) throw this.usage('--operator must not be empty: name who runs the command (it is stored with each row and logged)');
    if (name.length > MAX_OPERATOR_CHARS) throw this.usage(`--operator is ${name.length} characters long, at most ${MAX_OPERATOR_CHARS} are taken`);
    return { operator: name };
  }

  /** --reason, required: trimmed, not empty, not too long */
  reason(): string {
    const raw = this.one('reason');
    if (raw === undefined) throw this.usage(`${this.spec.name} needs --reason TEXT: why, stored with each row (with the database role and the time) and logged`);
    const text = raw.trim();
    if (!text) throw this.usage('--reason must not be empty: say why (it is stored with each row and logged)');
    if (text.length > MAX_REASON_CHARS) throw this.usage(`--reason is ${text.length} characters long, at most ${MAX_REASON_CHARS} are taken: a sentence or a ticket reference`);
    return text;
  }
}
