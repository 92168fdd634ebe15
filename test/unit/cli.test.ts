// The command line, without a process or a database (src/cli/commands.ts): every command's
// arguments parsed and checked, each mistake a usage error (exit 2) carrying the help of the
// command it concerns; `<command> --help` is that command's help. The CLI parses before it reads
// the configuration or connects (test/integration/operator-commands.test.ts runs it for real).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { MAX_REASON_CHARS, parseCommand, STATUS_TIMEOUT_MS, USAGE, UsageError, wrap, type Command } from '../../src/cli/commands.ts';

const ID = '0b4f8a52-3f7e-4c61-9d55-2f8f1b0c9e11';
const ID2 = '7d3c2b1a-0f9e-4d8c-b7a6-5e4d3c2b1a09';

/** the usage error parseCommand throws for argv, checked to be one */
function usageError(argv: string[]): UsageError {
  try {
    parseCommand(argv);
  } catch (err) {
    if (err instanceof UsageError) return err;
    throw err;
  }
  assert.fail(`${argv.join(' ')}: no usage error`);
}

function helpText(argv: string[]): string {
  const c = parseCommand(argv);
  if (c.name !== 'help') assert.fail(`${argv.join(' ')}: ${c.name}, not help`);
  return c.text;
}

describe('parseCommand: every command with its defaults and options', () => {
  it('parses each command into what it runs, defaults filled in', () => {
    const cases: Array<[string[], Command]> = [
      [['migrate'], { name: 'migrate' }],
      [['invoke'], { name: 'invoke', timeoutMs: 60_000 }],
      [['invoke', '--timeout', '5000'], { name: 'invoke', timeoutMs: 5_000 }],
      [['schedule'], { name: 'schedule', everyMs: 60_000, timeoutMs: 60_000, max: undefined }],
      [['schedule', '--every=2000', '--max', '3', '--timeout', '1500'], { name: 'schedule', everyMs: 2_000, timeoutMs: 1_500, max: 3 }],
      [['status'], { name: 'status', json: false, timeoutMs: STATUS_TIMEOUT_MS }],
      [['status', '--json', '--timeout', '2000'], { name: 'status', json: true, timeoutMs: 2_000 }],
      [['parked', 'list'], { name: 'parked list', json: false, limit: 100 }],
      [['parked', 'list', '--limit', '5', '--json'], { name: 'parked list', json: true, limit: 5 }],
      [['parked', 'retry', ID, '--reason', 'topic fixed'], { name: 'parked retry', ids: [ID], reason: 'topic fixed', dryRun: false }],
      [['parked', 'retry', '--all', '--reason=ACL granted (OPS-12)', '--dry-run'], { name: 'parked retry', ids: null, reason: 'ACL granted (OPS-12)', dryRun: true }],
      [['parked', 'skip', '--dry-run', ID, '--reason', ' obsolete event ', ID2], { name: 'parked skip', ids: [ID, ID2], reason: 'obsolete event', dryRun: true }],
      [['parked', 'skip', ID, '--reason', 'x', '--operator', ' alice@example.com '], { name: 'parked skip', ids: [ID], reason: 'x', dryRun: false, operator: 'alice@example.com' }],
      [['parked', 'retry', '--all', '--reason', 'x', '--operator=bob'], { name: 'parked retry', ids: null, reason: 'x', dryRun: false, operator: 'bob' }],
    ];
    for (const [argv, expected] of cases) assert.deepEqual(parseCommand(argv), expected, argv.join(' '));
  });

  it('row ids: lower-cased as Postgres prints them, each once, in the order given', () => {
    const c = parseCommand(['parked', 'skip', ID2.toUpperCase(), ID, ID2, '--reason', 'x']);
    assert.deepEqual(c, { name: 'parked skip', ids: [ID2, ID], reason: 'x', dryRun: false });
  });
});

describe('parseCommand: usage errors (exit 2), each with the help of the command it concerns', () => {
  const SKIP_HELP = /^usage: outbox-relay parked skip <id>\.\.\. --reason TEXT \[--dry-run\]/;
  const RETRY_HELP = /^usage: outbox-relay parked retry /;

  it('--reason is required by parked retry and skip: missing, empty, blank, too long or given twice is refused', () => {
    const cases: Array<[string[], RegExp, RegExp]> = [
      [['parked', 'skip', ID], /^parked skip needs --reason TEXT: why, stored with each row/, SKIP_HELP],
      [['parked', 'skip', ID, '--dry-run'], /^parked skip needs --reason TEXT/, SKIP_HELP],
      [['parked', 'retry', '--all'], /^parked retry needs --reason TEXT/, RETRY_HELP],
      [['parked', 'skip', ID, '--reason', ''], /^--reason must not be empty/, SKIP_HELP],
      [['parked', 'retry', ID, '--reason=  \t '], /^--reason must not be empty/, RETRY_HELP],
      [['parked', 'skip', ID, '--reason'], /Option '--reason <value>' argument missing/, SKIP_HELP],
      // a flag where the reason was to be: refused rather than taken as the reason
      [['parked', 'skip', ID, '--reason', '--dry-run'], /Option '--reason' argument is ambiguous/, SKIP_HELP],
      [['parked', 'skip', ID, '--reason', 'a', '--reason', 'b'], /^--reason given 2 times; give it once/, SKIP_HELP],
      [['parked', 'skip', ID, '--reason', 'a', '--operator', ' '], /^--operator must not be empty/, SKIP_HELP],
      [['parked', 'retry', ID, '--reason', 'a', '--operator', 'x'.repeat(201)], /^--operator is 201 characters long, at most 200/, RETRY_HELP],
      [['parked', 'skip', ID, '--reason', 'x'.repeat(MAX_REASON_CHARS + 1)], new RegExp(`^--reason is ${MAX_REASON_CHARS + 1} characters long, at most ${MAX_REASON_CHARS}`), SKIP_HELP],
    ];
    for (const [argv, message, help] of cases) {
      const err = usageError(argv);
      assert.match(err.message, message, argv.join(' '));
      assert.match(err.help, help, argv.join(' '));
    }
    assert.equal((parseCommand(['parked', 'skip', ID, '--reason', 'x'.repeat(MAX_REASON_CHARS)]) as { reason: string }).reason.length, MAX_REASON_CHARS);
  });

  it('row ids: each must be a uuid; retry takes ids or --all, not both, not neither; skip needs ids', () => {
    const cases: Array<[string[], RegExp]> = [
      [['parked', 'skip', 'not-a-uuid', '--reason', 'x'], /^"not-a-uuid" is not a row id \(a uuid/],
      [['parked', 'retry', ID, '123456781234123412341234567890abcdef', '--reason', 'x'], /^"123456781234123412341234567890abcdef" is not a row id/],
      // what cannot be printed is escaped in the message as well
      [['parked', 'skip', 'x\x1b[2Jy', '--reason', 'x'], /^"x\\x1b\[2Jy" is not a row id/],
      [['parked', 'retry', ID, '--all', '--reason', 'x'], /^give row ids or --all, not both/],
      [['parked', 'retry', '--reason', 'x'], /^parked retry needs row ids or --all/],
      [['parked', 'skip', '--reason', 'x'], /^parked skip needs row ids/],
    ];
    for (const [argv, message] of cases) assert.match(usageError(argv).message, message, argv.join(' '));
  });

  it('an option the command does not take, a stray argument, a bad number: refused, with that command\'s help', () => {
    const cases: Array<[string[], RegExp, RegExp]> = [
      [['parked', 'retry', '--al', '--reason', 'x'], /Unknown option '--al'/, RETRY_HELP],
      // options of other commands are not accepted silently any more
      [['status', '--all'], /Unknown option '--all'/, /^usage: outbox-relay status /],
      [['parked', 'list', '--dry-run'], /Unknown option '--dry-run'/, /^usage: outbox-relay parked list /],
      [['migrate', 'now'], /^unexpected argument "now": migrate takes options only/, /^usage: outbox-relay migrate/],
      [['status', '--timeout', '0'], /^--timeout must be a whole number of milliseconds from 1 to 2147483647, got "0"/, /^usage: outbox-relay status/],
      [['status', '--timeout', '1.5'], /^--timeout must be a whole number of milliseconds/, /^usage: outbox-relay status/],
      [['invoke', '--timeout', '9999999999'], /^--timeout must be a whole number of milliseconds from 1 to 2147483647/, /^usage: outbox-relay invoke/],
      [['schedule', '--max', 'two'], /^--max must be a whole number of invocations/, /^usage: outbox-relay schedule/],
      [['parked', 'list', '--limit', '-1'], /Option '--limit' argument is ambiguous/, /^usage: outbox-relay parked list/],
      [['parked', 'list', '--limit', '0'], /^--limit must be a whole number of rows/, /^usage: outbox-relay parked list/],
      [['status', '--timeout', '1', '--timeout', '2'], /^--timeout given 2 times/, /^usage: outbox-relay status/],
    ];
    for (const [argv, message, help] of cases) {
      const err = usageError(argv);
      assert.match(err.message, message, argv.join(' '));
      assert.match(err.help, help, argv.join(' '));
    }
  });

  it('no command, an unknown one, an option before the command, parked without a known subcommand: the global (or parked) usage', () => {
    const cases: Array<[string[], RegExp, RegExp]> = [
      [[], /^no command given$/, /^usage: outbox-relay <command> \[options\]/],
      [['frobnicate'], /^unknown command "frobnicate"$/, /^usage: outbox-relay <command>/],
      [['--json', 'status'], /^"--json" before the command: the command comes first, then its options$/, /^usage: outbox-relay <command>/],
      [['parked'], /^parked needs a subcommand: list, retry or skip$/, /^usage: outbox-relay parked <list\|retry\|skip>/],
      [['parked', 'frobnicate'], /^unknown parked subcommand "frobnicate": use list, retry or skip$/, /^usage: outbox-relay parked <list\|retry\|skip>/],
      [['help', 'frobnicate'], /^no such command: "frobnicate"$/, /^usage: outbox-relay <command>/],
    ];
    for (const [argv, message, help] of cases) {
      const err = usageError(argv);
      assert.match(err.message, message, argv.join(' '));
      assert.match(err.help, help, argv.join(' '));
    }
  });
});

describe('help', () => {
  it('`<command> --help` (or -h, or `help <command>`) is that command\'s help: its usage line and every option it takes', () => {
    const options: Record<string, string[]> = {
      migrate: [],
      invoke: ['--timeout MS'],
      schedule: ['--every MS', '--timeout MS', '--max N'],
      status: ['--json', '--timeout MS'],
      'parked list': ['--limit N', '--json'],
      'parked retry': ['--all', '--reason TEXT', '--operator NAME', '--dry-run'],
      'parked skip': ['--reason TEXT', '--operator NAME', '--dry-run'],
    };
    for (const [name, opts] of Object.entries(options)) {
      const words = name.split(' ');
      const text = helpText([...words, '--help']);
      assert.equal(helpText([...words, '-h']), text);
      assert.equal(helpText(['help', ...words]), text);
      assert.ok(text.startsWith(`usage: outbox-relay ${name}`), text);
      for (const o of [...opts, '-h, --help']) assert.match(text, new RegExp(`^  ${o.replace(/[-[\]]/g, '\\$&')}  `, 'm'), `${name}: ${o}`);
      assert.match(text, /^exit status: /m);
      assert.ok(text.split('\n').every((l) => l.length <= 96), `${name}: lines of at most 96 characters`);
    }
    assert.match(helpText(['parked', 'skip', '--help']), /OUTBOX_RETAIN_SKIPPED_MS/);
    assert.match(helpText(['parked', 'retry', '--help']), /^exit status: 0 every row named was retried; 1 some were not/m);
  });

  it('--help wins over the rest of the line, mistakes included; after `--` it is an argument', () => {
    assert.match(helpText(['parked', 'skip', 'not-a-uuid', '--bogus', '--help']), /^usage: outbox-relay parked skip/);
    assert.match(usageError(['parked', 'skip', '--reason', 'x', '--', '--help']).message, /^"--help" is not a row id/);
  });

  it('the global usage (--help, -h, help) lists every command; `parked --help` the three parked ones', () => {
    for (const argv of [['--help'], ['-h'], ['help']]) assert.equal(helpText(argv), USAGE);
    for (const name of ['migrate', 'invoke', 'schedule', 'status', 'parked list', 'parked retry', 'parked skip']) assert.match(USAGE, new RegExp(`^  ${name} `, 'm'));
    assert.match(USAGE, /`outbox-relay <command> --help` shows the options of a command/);
    const parked = helpText(['parked', '--help']);
    assert.equal(helpText(['help', 'parked']), parked);
    for (const sub of ['list', 'retry', 'skip']) assert.match(parked, new RegExp(`^  parked ${sub} `, 'm'));
  });

  it('wrap fills lines up to the width, indents the following ones, keeps a longer word whole', () => {
    assert.equal(wrap('aa bb cc dd', 5, '  '), 'aa bb\n  cc\n  dd');
    assert.equal(wrap('a verylongword b', 6), 'a\nverylongword\nb');
    assert.equal(wrap('x y', 10, '', 4), 'x y');
  });
});
