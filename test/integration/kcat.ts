// kcat (librdkafka, scripts/services/kcat.sh): the reader exactly-once delivery is judged by, a
// consumer that is neither of the relay's clients, so a test cannot pass because a client agrees
// with itself.
import { execFile, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { KAFKA_BROKERS, ROOT } from './helpers.ts';

const run = promisify(execFile);

export type Isolation = 'read_committed' | 'read_uncommitted';

/** The wrapper's path, installed if the machine has none yet (a stamp check once cached). */
export function kcatPath(): string {
  const r = spawnSync('bash', [join(ROOT, 'scripts', 'services', 'kcat.sh')], { cwd: ROOT, encoding: 'utf8', timeout: 300_000 });
  if (r.status !== 0) throw new Error(`scripts/services/kcat.sh failed (${r.status ?? r.signal}):\n${r.stderr}`);
  return r.stdout.trim().split('\n').at(-1)!;
}

/**
 * Every record kcat sees on the topic (`partition`: that one only) at this isolation level, as
 * `format` prints it (kcat's -f), one per line. -e exits at each partition's end, which under
 * read_committed is its last stable offset: an open transaction ends the read there.
 */
export async function kcatRead(kcat: string, topic: string, isolation: Isolation, format = '%k=%s\\n', partition?: number): Promise<string[]> {
  const args = ['-C', '-b', KAFKA_BROKERS.split(',')[0]!, '-t', topic, ...(partition === undefined ? [] : ['-p', String(partition)])];
  const { stdout } = await run(kcat, [...args, '-o', 'beginning', '-e', '-q', '-f', format, '-X', `isolation.level=${isolation}`], { timeout: 30_000 });
  return stdout.split('\n').filter((l) => l !== '');
}
