// services: postgres, pgbouncer, moto, kafka alone
// `services.sh status` must report a dead broker as down (exit non-zero, naming kafka), and
// `services.sh up` must bring back only that broker. Kills the broker through its pid file,
// .cache/run/kafka.pid, the same way failure tests do; restores it in `finally` whatever happens.
// (A SIGSTOPped broker is "up (paused)", not down: only a dead one is.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const PID_FILE = join(ROOT, '.cache', 'run', 'kafka.pid');

function services(...args: string[]): { code: number | null; out: string } {
  const r = spawnSync('bash', [join(ROOT, 'scripts', 'services.sh'), ...args], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 240_000,
    env: { ...process.env, OUTBOX_SERVICES: 'local' },
  });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

function gone(pid: number): boolean {
  try {
    // a killed child of a non-reaping init lingers as a zombie: that is dead too
    return /^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}

async function waitGone(pid: number, ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (!gone(pid)) {
    if (Date.now() > until) throw new Error(`broker pid ${pid} still alive ${ms} ms after SIGKILL`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

test('status reports a killed broker as down, and up restarts it', { timeout: 300_000 }, async () => {
  const before = services('status', 'kafka');
  assert.equal(before.code, 0, `kafka must be up before this test (npm run services:up):\n${before.out}`);
  const pid = Number(readFileSync(PID_FILE, 'utf8').trim());
  assert.ok(Number.isInteger(pid) && pid > 1, `no broker pid in ${PID_FILE}`);

  try {
    process.kill(pid, 'SIGKILL');
    await waitGone(pid, 10_000);

    const status = services('status');
    assert.notEqual(status.code, 0, `status must fail while the broker is dead:\n${status.out}`);
    assert.match(status.out, /^kafka\s+down\b/m, status.out);
    assert.match(status.out, /^postgres\s+up\b/m, status.out);
  } finally {
    const up = services('up');
    assert.equal(up.code, 0, `services.sh up did not restore the broker:\n${up.out}`);
  }

  const after = services('status');
  assert.equal(after.code, 0, after.out);
  assert.match(after.out, /^kafka\s+up\b/m, after.out);
  const newPid = Number(readFileSync(PID_FILE, 'utf8').trim());
  assert.notEqual(newPid, pid, 'a new broker process was expected');
});
