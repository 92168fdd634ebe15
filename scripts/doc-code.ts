// The check that what the project's Markdown pages say about the code is still true of it, and
// that the pages stay small enough to be read. Run by `npm run docs:testing` (scripts/testing-matrix.ts),
// so by .ci/run, beside the link check (scripts/doc-links.ts). Three checks:
//
// - code names: an inline-code span outside fenced blocks is checked when it looks like one of
//   the project's names, by a rule narrow enough that prose and SQL are left alone:
//     a path (`src/loop/plan.ts`, `bench/`): exists; a bare file name with a code extension
//       (`plan.ts`, `loop/ports.ts`): the tail of some file's path;
//     `Head.member` (`Head.member()`) with Head capitalised: Head is declared in the code and member
//       is declared in a file that declares Head (so a method moved out of its class fails);
//       Heads that are JavaScript globals (JSON, Buffer) or imported from a package are skipped;
//     camelCase (`commitBatch`, `loadConfig()`) or PascalCase of two words or more (`OutboxStore`):
//       occurs as a word in the code, comments left out;
//     a setting (`OUTBOX_*`, `DATABASE_*`, `KAFKA_*`, with or without `=value`): occurs in src/.
//   CHANGELOG.md is left out: it names what was, by design.
// - the source layout: docs/development.md's "Source layout" lists every file under src/ (the
//   migrations folder as one entry), once, nothing that is not there, in the layers' order.
// - the size: all the Markdown together stays under MAX_MARKDOWN_BYTES.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { markdownFiles } from './doc-links.ts';

/** The Markdown pages together: past this, a reader no longer finds what they came for (issue 35). */
export const MAX_MARKDOWN_BYTES = 250_000;

/** The pages whose names are history, not claims about today's code. */
const HISTORY = new Set(['CHANGELOG.md']);

/** Names the pages cite that are other software's (Kafka's protocol and Java classes, AWS's
 *  metrics and attributes, Postgres's settings): camelCase or PascalCase, yet no code of ours. */
const OTHERS = new Set([
  'InitProducerId', 'SimpleHeaderConverter', 'JsonDeserializer', 'DbiResourceId', 'TimeZone',
  'DatabaseConnectionsCurrentlySessionPinned', 'nextWrite' /* postgres.js's */,
  // the logical ids the Serverless Framework gives what serverless.yml declares
  'RelayEventsRuleSchedule1', 'RelayLambdaPermissionEventsRuleSchedule1', 'RelayLambdaEvConf',
]);

const CODE_DIRS = ['src', 'bench', 'scripts', 'test', 'bin', 'localstack'];
/** the code, and what deploys it: serverless.yml's parameters and resources are names a page cites */
const CODE_FILE = /\.(ts|mts|cts|js|mjs|cjs|sh|java|ya?ml)$/;
const ROOT_CODE = ['serverless.yml', 'package.json'];
/** not read as code: the checks' own tests, whose made-up pages name what the code lacks */
const NOT_CODE = new Set(['node_modules', '.cache', 'results', 'snapshots', 'doc-code.test.ts', 'doc-links.test.ts']);
/** the extensions that make a span a file name rather than a member (`DESIGN.md`, `plan.ts`) */
const FILE_EXT = /\.(ts|mts|cts|js|mjs|cjs|sql|sh|java|json|ya?ml|md|txt|zip|html|svg|csv|toml|env|d\.mts)$/;
const CHECKED_FILE_EXT = /\.(ts|mts|cts|js|mjs|cjs|sql|sh|java)$/;
const IDENT = '[A-Za-z_$][\\w$]*';

function walk(dir: string, skip: Set<string>): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (skip.has(e.name)) return [];
    if (e.isDirectory()) return e.name.startsWith('.') ? [] : walk(path, skip);
    return [path];
  });
}

/** Source text with its comments blanked, so a stale name kept in a comment does not count as code. */
function withoutComments(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, ' ').replace(/(^|[\s;{}()])\/\/.*$/gm, '$1');
}

export interface CodeIndex {
  root: string;
  /** repository-relative paths of the project's files (dependencies and caches left out) */
  paths: string[];
  /** every word of the code, comments left out */
  words: Set<string>;
  /** every word of src/ and scripts/, comments left out: where settings are read */
  settingWords: Set<string>;
  /** name → the comment-free texts of the files that declare it */
  declarations: Map<string, string[]>;
  /** names imported from a package, not from the project's own files */
  imported: Set<string>;
}

export function codeIndex(root: string): CodeIndex {
  const paths = walk(root, new Set(['node_modules', 'dist', 'reports', '.stryker-tmp'])).map((p) => relative(root, p));
  const words = new Set<string>();
  const settingWords = new Set<string>();
  const declarations = new Map<string, string[]>();
  const imported = new Set<string>();
  const files = [
    ...CODE_DIRS.flatMap((dir) => walk(join(root, dir), NOT_CODE).filter((f) => CODE_FILE.test(f))),
    ...ROOT_CODE.map((f) => join(root, f)).filter((f) => existsSync(f)),
  ];
  for (const file of files) {
    const where = relative(root, file);
    const text = /\.(ya?ml|sh|json)$/.test(file) ? readFileSync(file, 'utf8').replace(/(^|\s)#.*$/gm, '$1') : withoutComments(readFileSync(file, 'utf8'));
    for (const w of text.match(/[A-Za-z_$][\w$]*/g) ?? []) {
      words.add(w);
      // the settings: src/ reads the relay's, scripts/ the local services' (OUTBOX_SERVICES)
      if (where.startsWith('src/') || where.startsWith('scripts/')) settingWords.add(w);
    }
    const declared = new RegExp(`\\b(?:function\\*?|class|const|let|var|interface|type|enum|namespace)\\s+(${IDENT})`, 'g');
    for (const m of text.matchAll(declared)) {
      const name = m[1] ?? '';
      declarations.set(name, [...(declarations.get(name) ?? []), text]);
    }
    for (const m of text.matchAll(/import\s+(?:type\s+)?([^;]*?)\s+from\s+['"]([^'"]+)['"]/g)) {
      if ((m[2] ?? '').startsWith('.')) continue;
      for (const name of (m[1] ?? '').match(/[A-Za-z_$][\w$]*/g) ?? []) imported.add(name);
    }
  }
  return { root, paths, words, settingWords, declarations, imported };
}

/** The inline-code spans of a page, fenced blocks left out. */
export function codeSpans(markdown: string): string[] {
  const prose = markdown.replace(/^```[^\n]*\n[\s\S]*?^```/gm, '');
  return [...prose.matchAll(/(?<!`)`([^`\n]+)`(?!`)/g)].map((m) => (m[1] ?? '').trim());
}

const CAMEL = /^[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+$/;
const PASCAL = /^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$/;
const SETTING = /^((?:OUTBOX|DATABASE|KAFKA)_[A-Z0-9_]*[A-Z0-9])(?:=\S*)?$/;

/** Why a span does not match the code, or undefined when it does or is not a name the rule checks. */
export function problemOf(span: string, code: CodeIndex): string | undefined {
  const path = /^(?:\.\/)?((?:src|test|bench|scripts|bin|docs|\.ci|localstack)\/[\w./-]*)$/.exec(span)?.[1];
  // build output, not in a checkout: dist/, .build/, the zip's handler.mjs
  if (/^\.?(dist|build)\//.test(span) || span === 'handler.mjs') return undefined;
  if (path !== undefined) return existsSync(join(code.root, path)) ? undefined : 'no such file';
  if (/^[\w-][\w.-]*(?:\/[\w.-]+)*$/.test(span) && CHECKED_FILE_EXT.test(span) && !span.includes('*')) {
    return code.paths.some((p) => p === span || p.endsWith(`/${span}`)) ? undefined : 'no such file';
  }
  const setting = SETTING.exec(span)?.[1];
  if (setting !== undefined) return code.settingWords.has(setting) ? undefined : 'no such setting read in src/ or scripts/';
  const member = new RegExp(`^(${IDENT})\\.(${IDENT})(?:\\([^)]*\\))?$`).exec(span);
  if (member && !FILE_EXT.test(span)) {
    const [, head = '', name = ''] = member;
    if (!/^[A-Z]/.test(head) || head in globalThis || code.imported.has(head)) return undefined;
    const files = code.declarations.get(head);
    // a name of serverless.yml's or CloudFormation's (`VpcConfig.SubnetIds`): no members to read
    if (!files) return code.words.has(head) ? undefined : `no declaration of ${head}`;
    const declares = new RegExp(
      `^\\s*(?:(?:export|public|private|protected|readonly|static|async|override|abstract|declare|get|set)\\s+)*#?${name}\\s*[?!]?\\s*(?:<[^>]*>\\s*)?[(:=]`,
      'm',
    );
    return files.some((t) => declares.test(t)) ? undefined : `${head} declares no ${name}`;
  }
  const call = new RegExp(`^(${IDENT})\\([^)]*\\)$`).exec(span)?.[1];
  const name = call ?? span;
  if (OTHERS.has(name)) return undefined;
  if (CAMEL.test(name) || PASCAL.test(name)) return code.words.has(name) ? undefined : 'not in the code';
  return undefined;
}

/** Every code name cited by the Markdown pages under root that the code does not have. */
export function staleNames(root: string, code = codeIndex(root)): string[] {
  const out: string[] = [];
  for (const page of markdownFiles(root)) {
    const where = relative(root, page);
    if (HISTORY.has(where)) continue;
    for (const span of new Set(codeSpans(readFileSync(page, 'utf8')))) {
      const problem = problemOf(span, code);
      if (problem) out.push(`${where}: \`${span}\` (${problem})`);
    }
  }
  return out;
}

/** The layers from the bottom, as .dependency-cruiser.cjs enforces them; '' is src/*.ts. */
const LAYERS = [[''], ['config'], ['loop'], ['outbox', 'kafka'], ['lambda'], ['cli']];

function layerOf(entry: string): number {
  const folder = /^src\/([^/]+)\//.exec(entry)?.[1] ?? '';
  return LAYERS.findIndex((names) => names.includes(folder));
}

/** The files under src/ as the layout lists them: a migrations folder is one entry. */
export function sourceEntries(root: string): string[] {
  const entries = walk(join(root, 'src'), new Set()).map((p) => relative(root, p).split('\\').join('/'))
    .map((p) => p.replace(/^(src\/(?:.*\/)?migrations\/).*$/, '$1'));
  return [...new Set(entries)].sort();
}

/** What is wrong with the source layout section of a page: a file unlisted, listed twice or gone, an entry out of order. */
export function layoutProblems(markdown: string, entries: string[], page = 'docs/development.md'): string[] {
  const section = /^## Source layout\n([\s\S]*?)(?=^## |(?![\s\S]))/m.exec(markdown)?.[1];
  if (section === undefined) return [`${page}: no "## Source layout" section`];
  const listed = [...section.matchAll(/^\s*- `(src\/[^`]+)`/gm)].map((m) => m[1] ?? '');
  const out: string[] = [];
  for (const e of entries) if (!listed.includes(e)) out.push(`${page}: ${e} is not in the source layout`);
  const seen = new Set<string>();
  let layer = 0;
  for (const l of listed) {
    if (!entries.includes(l)) out.push(`${page}: the source layout lists ${l}, which does not exist`);
    if (seen.has(l)) out.push(`${page}: the source layout lists ${l} twice`);
    seen.add(l);
    const at = layerOf(l);
    if (at < 0) out.push(`${page}: ${l} is in no layer of the source layout (scripts/doc-code.ts LAYERS, .dependency-cruiser.cjs)`);
    else if (at < layer) out.push(`${page}: ${l} is listed after a layer above its own`);
    else layer = at;
  }
  return out;
}

/** The total size of the Markdown pages under root, when it is over the bound. */
export function oversize(root: string, max = MAX_MARKDOWN_BYTES): string[] {
  const total = markdownFiles(root).reduce((sum, page) => sum + statSync(page).size, 0);
  return total > max ? [`the Markdown pages are ${total} bytes together, over ${max}: cut repetition, not facts`] : [];
}

/** Every problem of the four checks, for the project under root. */
export function docCodeProblems(root: string): string[] {
  const layout = join(root, 'docs', 'development.md');
  return [
    ...staleNames(root),
    ...layoutProblems(existsSync(layout) ? readFileSync(layout, 'utf8') : '', sourceEntries(root)),
    ...oversize(root),
  ];
}
