// src/config/settings.ts against what reads it, documents it and deploys it: a setting is added
// in one place (its declaration), and this test says which of the reader, docs/configuration.md
// and serverless.yml does not agree with it yet.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { EnvReader } from '../../src/config/env-reader.ts';
import { REMOVED_SETTINGS, removedSettingProblems } from '../../src/config/load.ts';
import { DECLARED, SETTINGS, declared } from '../../src/config/settings.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const read = (...path: string[]) => readFileSync(join(root, ...path), 'utf8');

/** At most this many settings documented: each one a decision users must understand (issue 35). */
const MAX_DOCUMENTED = 40;
const MAX_DOC_BYTES = 24_000;

function sourceFiles(dir: string): string[] {
  return readdirSync(join(root, dir), { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => join(e.parentPath, e.name));
}

/** The section of a Markdown page under `heading`, up to the next heading of its level. */
function section(text: string, heading: string): string {
  const start = text.indexOf(`\n${heading}\n`);
  assert.ok(start >= 0, `docs/configuration.md has no "${heading}"`);
  const rest = text.slice(start + heading.length + 2);
  const end = rest.search(/\n## /);
  return end < 0 ? rest : rest.slice(0, end);
}

/** A table's rows whose first cell is a variable, as cells. */
function rows(text: string): string[][] {
  return text
    .split('\n')
    .filter((l) => l.startsWith('| `'))
    .map((l) => l.slice(1, -1).split(' | ').map((c) => c.trim()));
}

describe('settings: one declaration (src/config/settings.ts)', () => {
  it('each name once', () => {
    assert.equal(DECLARED.size, SETTINGS.length, 'a name declared twice');
    for (const s of SETTINGS) {
      assert.equal(s.kind === 'setting', s.default !== undefined && s.decision !== undefined, `${s.name}: a setting has a default and a decision, nothing else has`);
      if (s.kind === 'alias') assert.equal(SETTINGS.find((t) => t.name === s.aliasOf)?.kind, 'setting', `${s.name} stands for ${s.aliasOf}, which is no setting`);
    }
  });

  it('the reader refuses a name not declared', () => {
    const reader = new EnvReader({ OUTBOX_NOT_DECLARED: 'x' });
    assert.throws(() => reader.str('OUTBOX_NOT_DECLARED'), /OUTBOX_NOT_DECLARED is read but not declared in src\/config\/settings\.ts/);
    assert.equal(reader.given('OUTBOX_NOT_DECLARED'), 'x', 'a removed setting is still seen, to be refused');
  });

  it('every name the sources read is declared, and every declared name is read', () => {
    const quoted = new Set<string>();
    for (const file of sourceFiles('src')) {
      const text = readFileSync(file, 'utf8');
      for (const m of text.matchAll(/\bread\.(?:str|int|bool|oneOf)\(\s*'([A-Z0-9_]+)'/g)) {
        assert.ok(DECLARED.has(m[1]!), `${m[1]} is read in ${file.slice(root.length + 1)} but not declared in src/config/settings.ts`);
      }
      for (const m of text.matchAll(/'([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)'/g)) quoted.add(m[1]!);
    }
    quoted.add('OUTBOX_ALLOW_PLAINTEXT_LOGIN'); // read through transport.ts' ALLOW_PLAINTEXT_LOGIN
    for (const s of SETTINGS) assert.ok(quoted.has(s.name), `${s.name} is declared but no source names it: remove the declaration, or read it`);
  });

  it('the removed settings are no settings any more: refused by every build, read as test hooks only through tsx', () => {
    for (const name of Object.keys(REMOVED_SETTINGS)) {
      const kind = SETTINGS.find((s) => s.name === name)?.kind;
      assert.ok(kind === undefined || kind === 'test-hook', `${name} is removed but declared as a ${kind}`);
      const env = new EnvReader({ [name]: '1' });
      assert.match(removedSettingProblems(env, false)[0] ?? '', new RegExp(`^${name} was removed: `), `a build refuses ${name}`);
      assert.equal(removedSettingProblems(env, true).length, kind === 'test-hook' ? 0 : 1, `${name} through tsx`);
    }
  });
});

describe('settings: docs/configuration.md', () => {
  const doc = read('docs', 'configuration.md');
  const table = rows(section(doc, '## Every variable'));

  it(`documents each setting in one row, with its default and decision, and nothing else (at most ${MAX_DOCUMENTED})`, () => {
    const settings = declared('setting');
    assert.deepEqual(
      table.map((r) => r[0]),
      settings.map((s) => `\`${s.name}\``),
      'the table rows, in the order of SETTINGS',
    );
    for (const s of settings) {
      const row = table.find((r) => r[0] === `\`${s.name}\``)!;
      assert.equal(row[1], s.default, `${s.name}'s default in the docs`);
      assert.equal(row[2], s.decision, `${s.name}'s decision in the docs`);
    }
    assert.ok(table.length <= MAX_DOCUMENTED, `${table.length} settings documented, more than ${MAX_DOCUMENTED}: is each one a decision a user makes?`);
  });

  it("names each alias in its setting's row, each platform variable under \"Set by the platform\", no test hook, and every removed setting", () => {
    for (const a of declared('alias')) {
      const row = table.find((r) => r[0] === `\`${a.aliasOf}\``);
      assert.ok(row?.join(' | ').includes(`\`${a.name}\``), `${a.name} is not named in ${a.aliasOf}'s row`);
    }
    const platform = section(doc, '## Set by the platform');
    for (const p of declared('platform')) assert.ok(platform.includes(`\`${p.name}\``), `${p.name} is not listed under "Set by the platform"`);
    const removed = rows(section(doc, '## Removed settings')).map((r) => r[0]).join(', ');
    for (const h of declared('test-hook')) {
      assert.ok(!doc.includes(h.name) || Object.hasOwn(REMOVED_SETTINGS, h.name), `${h.name} is a test hook: it leaves the docs`);
    }
    for (const name of Object.keys(REMOVED_SETTINGS)) assert.ok(removed.includes(`\`${name}\``), `${name} is not under "Removed settings"`);
  });

  it(`stays under ${MAX_DOC_BYTES} bytes`, () => {
    assert.ok(Buffer.byteLength(doc) <= MAX_DOC_BYTES, `${Buffer.byteLength(doc)} bytes: link to the page that explains, instead of explaining again`);
  });
});

describe('settings: serverless.yml', () => {
  const text = read('serverless.yml');
  const sls = parse(text) as { params: { default: Record<string, unknown> }; provider: { environment: Record<string, string> } };

  it('sets exactly the declared variables that name a serverless.yml value, to that value', () => {
    const env = Object.entries(sls.provider.environment).filter(([name]) => !name.startsWith('NODE_'));
    assert.deepEqual(
      Object.fromEntries(env),
      Object.fromEntries(SETTINGS.filter((s) => s.serverless !== undefined).map((s) => [s.name, s.serverless])),
    );
  });

  it('uses every parameter it defines (none left behind by a removed setting)', () => {
    for (const name of Object.keys(sls.params.default)) {
      assert.match(text, new RegExp(`param:${name}\\b`), `params.default.${name} is used nowhere`);
    }
  });
});
