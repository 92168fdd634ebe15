// THIRD-PARTY-NOTICES.txt for the Lambda zip (scripts/build.mjs): every package whose code esbuild
// put in the bundle, with its version, its declared license, and the license and notice files it
// ships, verbatim. The bundle itself keeps no license comment (`legalComments: 'none'`): the only
// ones in the bundled code are coverage pragmas (`/* v8 ignore next -- @preserve */`), and the
// notices a license asks to be passed on are in the packages' files, which no bundle carries.
//
// The packages come from esbuild's metafile: the inputs of every output file (handler.mjs and its
// chunks) that lie in a node_modules package, each package by its own directory, so a nested copy
// in another version (node_modules/a/node_modules/b) is listed apart. The text depends only on
// those packages' files, in a fixed order, so an unchanged bundle gives a byte-identical file
// (and the zip stays reproducible). A text several packages ship word for word (the Apache
// License 2.0) is given in full once; the later packages name the copy given.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/** LICENSE, LICENCE, COPYING, NOTICE, with any suffix (LICENSE.md, LICENSE-MIT, license.txt, NOTICE.txt) */
const NOTICE_FILE = /^(licen[cs]e|copying|notice)([-._].*)?$/i;

/**
 * The package directory of a metafile input path (relative to the build's working directory), or
 * undefined for the project's own files. The last node_modules segment decides: a package nested in
 * another package's node_modules is its own package.
 * @param {string} input
 * @returns {string | undefined}
 */
export function packageDirOf(input) {
  const m = /^(.*node_modules\/(?:@[^/]+\/)?[^/]+)\//.exec(input.replaceAll('\\', '/'));
  return m?.[1];
}

/**
 * @param {{ outputs: Record<string, { inputs: Record<string, unknown> }> }} metafile
 * @returns {string[]} the package directories the outputs hold code from, sorted
 */
export function bundledPackageDirs(metafile) {
  const dirs = new Set();
  for (const output of Object.values(metafile.outputs)) {
    for (const input of Object.keys(output.inputs)) {
      const dir = packageDirOf(input);
      if (dir) dirs.add(dir);
    }
  }
  return [...dirs].sort();
}

/** @param {unknown} pkg */
function declaredLicense(pkg) {
  const p = /** @type {{ license?: unknown, licenses?: unknown }} */ (pkg);
  const one = (/** @type {unknown} */ l) => (typeof l === 'string' ? l : typeof l === 'object' && l !== null && 'type' in l ? String(l.type) : undefined);
  if (p.license !== undefined) return one(p.license) ?? 'not stated';
  // the old form: "licenses": [{ "type": "MIT", "url": ... }]
  if (Array.isArray(p.licenses) && p.licenses.length) return p.licenses.map(one).filter(Boolean).join(' OR ') || 'not stated';
  return 'not stated';
}

/** @param {unknown} pkg */
function repositoryOf(pkg) {
  const p = /** @type {{ repository?: unknown, homepage?: unknown }} */ (pkg);
  const repo = typeof p.repository === 'string' ? p.repository : typeof p.repository === 'object' && p.repository !== null && 'url' in p.repository ? String(p.repository.url) : undefined;
  if (repo) {
    const url = repo.replace(/^git\+/, '').replace(/^git:\/\//, 'https://').replace(/\.git$/, '');
    // the npm shorthand "owner/name" (or "github:owner/name")
    return /^(github:)?[\w.-]+\/[\w.-]+$/.test(url) ? `https://github.com/${url.replace(/^github:/, '')}` : url;
  }
  return typeof p.homepage === 'string' ? p.homepage : undefined;
}

/** @param {unknown} pkg */
function authorOf(pkg) {
  const a = /** @type {{ author?: unknown }} */ (pkg).author;
  if (typeof a === 'string') return a;
  if (typeof a === 'object' && a !== null && 'name' in a) return String(a.name);
  return undefined;
}

/** @param {string} text */
const normalise = (text) => text.replace(/\r\n?/g, '\n').replace(/\s+$/, '');

/**
 * A README's "License" section (a heading named License or Licence, up to the next heading of the
 * same or a higher level): what a package that ships no license file says about its license.
 * @param {string} dir
 */
function readmeLicenseSection(dir) {
  const readme = readdirSync(dir)
    .filter((f) => /^readme(\.(md|markdown|txt))?$/i.test(f))
    .sort()[0];
  if (!readme) return undefined;
  const lines = normalise(readFileSync(join(dir, readme), 'utf8')).split('\n');
  const start = lines.findIndex((l) => /^#{1,6}\s+licen[cs]e\b/i.test(l));
  if (start < 0) return undefined;
  const level = /** @type {string} */ (/^#+/.exec(/** @type {string} */ (lines[start]))?.[0]).length;
  let end = lines.length;
  for (let i = start + 1; i < lines.length; i++) {
    const h = /^(#{1,6})\s/.exec(/** @type {string} */ (lines[i]));
    if (h && /** @type {string} */ (h[1]).length <= level) {
      end = i;
      break;
    }
  }
  const section = normalise(lines.slice(start + 1, end).join('\n')).replace(/^\n+/, '');
  return section ? { file: readme, text: section } : undefined;
}

/**
 * What one package contributes to the notices.
 * @param {string} root the directory the metafile's paths are relative to
 * @param {string} dir a package directory, relative to root
 */
export function packageNotice(root, dir) {
  const abs = join(root, dir);
  const manifest = join(abs, 'package.json');
  if (!existsSync(manifest)) {
    throw new Error(`third-party notices: ${dir} holds bundled code but has no package.json to name its package and license; run npm ci, or fix scripts/third-party-notices.mjs`);
  }
  const pkg = JSON.parse(readFileSync(manifest, 'utf8'));
  const files = readdirSync(abs, { withFileTypes: true })
    .filter((e) => e.isFile() && NOTICE_FILE.test(e.name))
    .map((e) => e.name)
    .sort()
    .map((name) => ({ name, text: normalise(readFileSync(join(abs, name), 'utf8')) }));
  return {
    name: typeof pkg.name === 'string' ? pkg.name : dir.replace(/^.*node_modules\//, ''),
    version: typeof pkg.version === 'string' ? pkg.version : 'unknown',
    license: declaredLicense(pkg),
    repository: repositoryOf(pkg),
    author: authorOf(pkg),
    dir,
    files,
    readme: files.length ? undefined : readmeLicenseSection(abs),
  };
}

const RULE = '='.repeat(80);
const THIN = '-'.repeat(80);

/**
 * The notices file for a build.
 * @param {{ outputs: Record<string, { inputs: Record<string, unknown> }> }} metafile
 * @param {string} root the directory esbuild ran in (the metafile's paths are relative to it)
 * @param {string} [product] what the notices are for
 * @returns {{ text: string, packages: ReturnType<typeof packageNotice>[] }}
 */
export function thirdPartyNotices(metafile, root, product = 'outbox-relay') {
  const packages = bundledPackageDirs(metafile)
    .map((dir) => packageNotice(root, dir))
    // by name, then version, then directory: code points, not the locale's collation
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : a.version < b.version ? -1 : a.version > b.version ? 1 : a.dir < b.dir ? -1 : 1));
  const out = [
    'THIRD-PARTY NOTICES',
    '',
    `${product} bundles code from the ${packages.length} packages below (handler.mjs and the files in`,
    'chunks/). Each is listed with its version and the license its package.json declares, followed',
    'by the license and notice files the package ships, verbatim (a text given in full once is',
    'named by the later packages that ship the same).',
    '',
    ...packages.map((p) => `  ${p.name} ${p.version} (${p.license})`),
  ];
  // a text given in full once (the Apache License 2.0 comes with twenty packages): later copies name it
  const given = new Map();
  for (const p of packages) {
    out.push('', RULE, `${p.name} ${p.version}`, `License: ${p.license}`);
    if (p.repository) out.push(`Source: ${p.repository}`);
    if (p.author) out.push(`Author: ${p.author}`);
    if (p.files.length) {
      for (const f of p.files) {
        const first = given.get(f.text);
        if (first) {
          out.push(THIN, `${f.name}: the same text, word for word, as the ${first} above.`);
        } else {
          given.set(f.text, `${f.name} of ${p.name} ${p.version}`);
          out.push(THIN, `${f.name}:`, '', f.text);
        }
      }
    } else if (p.readme) {
      out.push(THIN, `The package ships no license file. The License section of its ${p.readme.file}:`, '', p.readme.text);
    } else {
      out.push(THIN, `The package ships no license file and its README has no License section; its package.json declares ${p.license}.`);
    }
  }
  return { text: `${out.join('\n')}\n`, packages };
}
