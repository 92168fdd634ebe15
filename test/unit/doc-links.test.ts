// The docs' link check (scripts/doc-links.ts, run by `npm run docs:testing`): GitHub's heading
// anchors, links read outside code, and broken links found in a made-up tree of pages.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { anchors, brokenLinks, linksOf } from '../../scripts/doc-links.ts';

describe('doc links', () => {
  it('anchors: lower case, punctuation and code ticks dropped, spaces to hyphens, repeats numbered', () => {
    const page = [
      '# The order guard: how a claim keeps each aggregate in order (G4)',
      '### Stop reasons (`stoppedBecause`)',
      '## Guarantee → test matrix',
      '## RDS Proxy / PgBouncer',
      '## Why OUTBOX_MAX_BATCH_BYTES defaults to a sixth',
      '## See [the table](x.md)',
      '## Notes',
      '## Notes',
      '```sh',
      '# not a heading: a comment in code',
      '```',
    ].join('\n');
    assert.deepEqual([...anchors(page)], [
      'the-order-guard-how-a-claim-keeps-each-aggregate-in-order-g4',
      'stop-reasons-stoppedbecause',
      'guarantee--test-matrix',
      'rds-proxy--pgbouncer',
      'why-outbox_max_batch_bytes-defaults-to-a-sixth',
      'see-the-table',
      'notes',
      'notes-1',
    ]);
  });

  it('links: targets of inline links and images, titles dropped, none read from code', () => {
    const page = [
      'See [a](a.md#top "title"), ![b](img/b.svg) and [c](https://example.com/c).',
      'Not `[d](d.md)`, nor:',
      '```',
      '[e](e.md)',
      '```',
      '[f](#local)',
    ].join('\n');
    assert.deepEqual(linksOf(page), ['a.md#top', 'img/b.svg', 'https://example.com/c', '#local']);
  });

  const root = mkdtempSync(join(tmpdir(), 'doc-links-'));
  after(() => rmSync(root, { recursive: true, force: true }));

  it('broken links: a missing file, a missing heading, in a page or its neighbour; URLs and skipped dirs not read', () => {
    mkdirSync(join(root, 'docs'));
    mkdirSync(join(root, 'node_modules'));
    writeFileSync(join(root, 'README.md'), '# Top\n[ok](docs/a.md#part-one) [gone](docs/gone.md) [web](https://x.y/z.md)\n');
    writeFileSync(join(root, 'docs', 'a.md'), '## Part one\n[up](../README.md#top) [self](#part-two) [dir](.)\n');
    writeFileSync(join(root, 'node_modules', 'n.md'), '[x](nowhere.md)\n');
    assert.deepEqual(brokenLinks(root).sort(), ['README.md: docs/gone.md (no such file)', 'docs/a.md: #part-two (no such heading)']);
  });
});
