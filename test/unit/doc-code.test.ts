// The docs' code check (scripts/doc-code.ts, run by `npm run docs:testing`): in a made-up project,
// a page that cites a name or file the code does not have is reported, and one the code has is not;
// the source layout reports a file it does not list, a listed file that is gone, and one out of
// its layer; the pages' total size has a bound.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { codeSpans, layoutProblems, oversize, sourceEntries, staleNames } from '../../scripts/doc-code.ts';

const root = mkdtempSync(join(tmpdir(), 'doc-code-'));
after(() => rmSync(root, { recursive: true, force: true }));

function write(path: string, text: string): void {
  mkdirSync(dirname(join(root, path)), { recursive: true });
  writeFileSync(join(root, path), text);
}

write('src/loop/invocation.ts', [
  "import { commitBatch } from './commit-batch.ts';",
  "import { Kafka } from 'kafkajs';",
  'export class Invocation {',
  '  private async relayBatch(): Promise<void> {',
  '    await commitBatch();',
  '  }',
  '}',
].join('\n'));
write('src/loop/commit-batch.ts', 'export async function commitBatch(): Promise<void> {}\n// oldName: only in a comment\n');
write('src/budget.ts', "export const BUDGET = {\n  markReserveMs: 500,\n};\nread.int('OUTBOX_MAX_ROWS', 1);\n");
write('src/outbox/migrations/001_baseline.sql', 'create table outbox ();\n');
write('src/outbox/store.ts', 'export class OutboxStore {}\n');

describe('doc code names', () => {
  it('spans: inline code outside fenced blocks', () => {
    assert.deepEqual(codeSpans('a `one` b\n```ts\n`two`\n```\n`three()` and ``four``'), ['one', 'three()']);
  });

  it('a page citing a name, member, file or setting the code does not have is reported; those it has, prose and SQL are not', () => {
    write('docs/page.md', [
      'Fine: `commitBatch`, `commitBatch()`, `Invocation.relayBatch`, `BUDGET.markReserveMs`, `OutboxStore`,',
      '`src/loop/invocation.ts`, `loop/commit-batch.ts`, `001_baseline.sql`, `OUTBOX_MAX_ROWS=100`, `JSON.stringify`,',
      '`Kafka.producer`, `pg_terminate_backend()`, `FOR UPDATE SKIP LOCKED`, `DESIGN.md`, `dist/cli.js`, `now()`.',
      'Stale: `Invocation.commitBatch`, `Relay.run`, `relayEveryBatch`, `oldName`, `OutboxStorage`, `src/relay.ts`,',
      '`relay.ts`, `OUTBOX_WAKE`.',
      '```',
      '`notChecked` in a fenced block',
      '```',
    ].join('\n'));
    write('CHANGELOG.md', 'History may name what was: `src/relay.ts`, `Invocation.commitBatch`.\n');
    assert.deepEqual(staleNames(root).sort(), [
      'docs/page.md: `Invocation.commitBatch` (Invocation declares no commitBatch)',
      'docs/page.md: `OUTBOX_WAKE` (no such setting read in src/ or scripts/)',
      'docs/page.md: `OutboxStorage` (not in the code)',
      'docs/page.md: `Relay.run` (no declaration of Relay)',
      'docs/page.md: `oldName` (not in the code)',
      'docs/page.md: `relay.ts` (no such file)',
      'docs/page.md: `relayEveryBatch` (not in the code)',
      'docs/page.md: `src/relay.ts` (no such file)',
    ]);
  });
});

describe('doc source layout', () => {
  const entries = sourceEntries(root);

  it('entries: every file under src/, a migrations folder as one', () => {
    assert.deepEqual(entries, ['src/budget.ts', 'src/loop/commit-batch.ts', 'src/loop/invocation.ts', 'src/outbox/migrations/', 'src/outbox/store.ts']);
  });

  it('a complete layout in the layers order has no problem', () => {
    const page = [
      '## Source layout', '', '- `src/budget.ts`: the numbers', '- `src/loop/invocation.ts`: the loop',
      '- `src/loop/commit-batch.ts`: a commit', '- `src/outbox/migrations/`: the schema', '- `src/outbox/store.ts`: the store',
      '## Next', '- `src/gone.ts`: not in the section',
    ].join('\n');
    assert.deepEqual(layoutProblems(page, entries), []);
  });

  it('an unlisted file, a listed file that is gone, one listed twice, one out of its layer and a folder of no layer are reported', () => {
    const page = [
      '## Source layout', '', '- `src/loop/invocation.ts`: the loop', '- `src/budget.ts`: the numbers',
      '- `src/outbox/store.ts`: the store', '- `src/outbox/store.ts`: again', '- `src/outbox/migrations/`: the schema',
      '- `src/relay.ts`: renamed', '- `src/extra/x.ts`: a new folder',
    ].join('\n');
    assert.deepEqual(layoutProblems(page, entries), [
      'docs/development.md: src/loop/commit-batch.ts is not in the source layout',
      'docs/development.md: src/budget.ts is listed after a layer above its own',
      'docs/development.md: the source layout lists src/outbox/store.ts twice',
      'docs/development.md: the source layout lists src/relay.ts, which does not exist',
      'docs/development.md: src/relay.ts is listed after a layer above its own',
      'docs/development.md: the source layout lists src/extra/x.ts, which does not exist',
      'docs/development.md: src/extra/x.ts is in no layer of the source layout (scripts/doc-code.ts LAYERS, .dependency-cruiser.cjs)',
    ]);
    assert.deepEqual(layoutProblems('# no section', entries), ['docs/development.md: no "## Source layout" section']);
  });

  it('the pages together have a bound', () => {
    assert.deepEqual(oversize(root, 1_000_000), []);
    assert.match(oversize(root, 100).join(), /^the Markdown pages are \d+ bytes together, over 100/);
  });
});
