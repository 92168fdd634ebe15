#!/usr/bin/env node
// Launcher: runs the TypeScript sources through tsx in a checkout (so it never runs a stale
// build), or the bundled dist/cli.js in an installed package that ships no sources.
// Kept in plain JS so `npx outbox-relay` needs no build step.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const source = join(root, 'src', 'cli', 'main.ts');
// tsx is a devDependency: present in a checkout, absent where the package is installed
const tsx = existsSync(source) ? await import('tsx/esm/api').catch(() => undefined) : undefined;
if (tsx) {
  tsx.register();
  await import(pathToFileURL(source).href);
} else {
  await import(pathToFileURL(join(root, 'dist', 'cli.js')).href);
}
