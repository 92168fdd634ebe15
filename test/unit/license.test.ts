// The licence package.json declares is the one the repository ships: npm publishes LICENSE with
// the package whatever `files` says, and a reader of the repository finds the terms in it.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';

const root = new URL('../../', import.meta.url);

describe('licence', () => {
  it('LICENSE holds the MIT licence that package.json declares, with the copyright of the contributors', () => {
    const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as { license?: string };
    assert.equal(pkg.license, 'MIT');
    const text = readFileSync(new URL('LICENSE', root), 'utf8');
    assert.match(text, /^MIT License\n\nCopyright \(c\) 2026 outbox-relay contributors\n/);
    assert.ok(text.includes('Permission is hereby granted, free of charge, to any person obtaining a copy'));
    assert.ok(text.includes('THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND'));
  });
});
