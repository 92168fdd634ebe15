// scripts/third-party-notices.mjs: the THIRD-PARTY-NOTICES.txt of the Lambda zip, from esbuild's
// metafile and the bundled packages' own files (here a node_modules made up in a temporary
// directory). That the real zip lists every package whose code it holds is checked on the zip
// (test/integration/package.test.ts).
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { bundledPackageDirs, packageDirOf, thirdPartyNotices, type Metafile } from '../../scripts/third-party-notices.mjs';

const MIT_ALPHA = 'MIT License\n\nCopyright (c) 2020 Alpha Author\n\nPermission is hereby granted, free of charge, ...';

let root: string;

function put(path: string, text: string): void {
  mkdirSync(dirname(join(root, path)), { recursive: true });
  writeFileSync(join(root, path), text);
}

before(() => {
  root = mkdtempSync(join(tmpdir(), 'notices-'));
  put('node_modules/alpha/package.json', JSON.stringify({ name: 'alpha', version: '1.0.0', license: 'MIT', repository: { type: 'git', url: 'git+https://github.com/o/alpha.git' }, author: { name: 'Alpha Author' } }));
  // Windows line endings and trailing blank lines are normalised
  put('node_modules/alpha/LICENSE', `${MIT_ALPHA.replaceAll('\n', '\r\n')}\r\n\r\n`);
  put('node_modules/alpha/NOTICE.txt', 'Alpha includes software developed at Example Corp.');
  put('node_modules/alpha/index.js', '');
  put('node_modules/@scope/beta/package.json', JSON.stringify({ name: '@scope/beta', version: '0.3.1', license: { type: 'ISC' }, repository: 'o/beta' }));
  put('node_modules/@scope/beta/license.md', 'ISC License\n\nCopyright (c) Beta People');
  put('node_modules/gamma/package.json', JSON.stringify({ name: 'gamma', version: '1.0.0', license: 'Apache-2.0', author: 'Gamma Team <g@example.com>' }));
  put('node_modules/gamma/README.md', '# gamma\n\nDoes things.\n\n## Licence\n\nLicensed under the Apache License 2.0.\n\n### Notes\n\nSee the repository.\n\n## Contributing\n\nPlease do.\n');
  // a nested copy in another version, shipping the same license text as alpha
  put('node_modules/alpha/node_modules/gamma/package.json', JSON.stringify({ name: 'gamma', version: '2.0.0', licenses: [{ type: 'MIT' }] }));
  put('node_modules/alpha/node_modules/gamma/LICENSE', MIT_ALPHA);
  put('node_modules/delta/package.json', JSON.stringify({ name: 'delta', version: '5.0.0', license: 'Unlicense', homepage: 'https://delta.example' }));
  put('node_modules/delta/README.md', '# delta\n\nNo licence heading here.\n');
  put('node_modules/epsilon/index.js', '');
});

after(() => rmSync(root, { recursive: true, force: true }));

const metafile: Metafile = {
  outputs: {
    'handler.mjs': {
      inputs: {
        'src/lambda/handler.ts': {},
        'node_modules/alpha/index.js': {},
        'node_modules/@scope/beta/dist/esm/index.js': {},
        'node_modules/alpha/node_modules/gamma/index.js': {},
      },
    },
    'handler.mjs.map': { inputs: {} },
    'chunks/client-X.mjs': {
      inputs: {
        'node_modules/gamma/lib/a.js': {},
        'node_modules/delta/x.js': {},
        'node_modules/alpha/other.js': {},
      },
    },
  },
};

describe('THIRD-PARTY-NOTICES.txt (scripts/third-party-notices.mjs)', () => {
  it('a package is the directory under its last node_modules (scoped, nested); the project\'s own files are none', () => {
    assert.equal(packageDirOf('node_modules/@scope/beta/dist/esm/index.js'), 'node_modules/@scope/beta');
    assert.equal(packageDirOf('node_modules/alpha/node_modules/gamma/index.js'), 'node_modules/alpha/node_modules/gamma');
    assert.equal(packageDirOf('src/kafka/clients.ts'), undefined);
    assert.deepEqual(bundledPackageDirs(metafile), [
      'node_modules/@scope/beta',
      'node_modules/alpha',
      'node_modules/alpha/node_modules/gamma',
      'node_modules/delta',
      'node_modules/gamma',
    ]);
  });

  it('lists every package of every output file, with version and declared license, sorted by name and version, each with its license and notice files verbatim', () => {
    const { text, packages } = thirdPartyNotices(metafile, root);
    assert.deepEqual(
      packages.map((p) => `${p.name} ${p.version} ${p.license}`),
      ['@scope/beta 0.3.1 ISC', 'alpha 1.0.0 MIT', 'delta 5.0.0 Unlicense', 'gamma 1.0.0 Apache-2.0', 'gamma 2.0.0 MIT'],
    );
    assert.match(text, /bundles code from the 5 packages below/);
    for (const line of ['  @scope/beta 0.3.1 (ISC)', '  alpha 1.0.0 (MIT)', '  delta 5.0.0 (Unlicense)', '  gamma 1.0.0 (Apache-2.0)', '  gamma 2.0.0 (MIT)']) {
      assert.ok(text.includes(`\n${line}\n`), `the summary lists ${line.trim()}`);
    }
    const entry = (header: string): string => {
      const start = text.indexOf(`\n${'='.repeat(80)}\n${header}\n`);
      assert.ok(start >= 0, `an entry for ${header}`);
      const end = text.indexOf(`\n${'='.repeat(80)}\n`, start + 1);
      return text.slice(start, end < 0 ? undefined : end);
    };
    const alpha = entry('alpha 1.0.0');
    assert.ok(alpha.includes(`LICENSE:\n\n${MIT_ALPHA}\n`), alpha);
    assert.ok(alpha.includes('NOTICE.txt:\n\nAlpha includes software developed at Example Corp.'), alpha);
    assert.ok(alpha.includes('Source: https://github.com/o/alpha\n'), alpha);
    assert.ok(alpha.includes('Author: Alpha Author\n'), alpha);
    assert.ok(!alpha.includes('\r'), 'line endings normalised');
    const beta = entry('@scope/beta 0.3.1');
    assert.ok(beta.includes('license.md:\n\nISC License\n\nCopyright (c) Beta People'), beta);
    assert.ok(beta.includes('Source: https://github.com/o/beta\n'), beta);
    // no license file: the README's License section, up to the next heading of its level
    const gamma1 = entry('gamma 1.0.0');
    assert.ok(gamma1.includes('The package ships no license file. The License section of its README.md:\n\nLicensed under the Apache License 2.0.\n\n### Notes\n\nSee the repository.'), gamma1);
    assert.ok(!gamma1.includes('Please do.'), gamma1);
    // the same text as a package above: named, not repeated
    assert.ok(entry('gamma 2.0.0').includes('LICENSE: the same text, word for word, as the LICENSE of alpha 1.0.0 above.'));
    assert.equal(text.split(MIT_ALPHA).length - 1, 1, 'the MIT text of alpha is given once');
    const delta = entry('delta 5.0.0');
    assert.ok(delta.includes('Source: https://delta.example\n'), delta);
    assert.ok(delta.includes('ships no license file and its README has no License section; its package.json declares Unlicense.'), delta);
  });

  it('the same packages in any order give the same bytes (the zip stays reproducible)', () => {
    const shuffled: Metafile = {
      outputs: Object.fromEntries(
        Object.entries(metafile.outputs)
          .reverse()
          .map(([name, o]) => [name, { inputs: Object.fromEntries(Object.entries(o.inputs).reverse()) }]),
      ),
    };
    assert.equal(thirdPartyNotices(shuffled, root).text, thirdPartyNotices(metafile, root).text);
  });

  it('bundled code in a directory without a package.json fails the build, saying what to do', () => {
    const broken: Metafile = { outputs: { 'handler.mjs': { inputs: { 'node_modules/epsilon/index.js': {} } } } };
    assert.throws(() => thirdPartyNotices(broken, root), /node_modules\/epsilon holds bundled code but has no package\.json .*run npm ci/);
  });
});
