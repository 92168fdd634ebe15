// Reading CloudWatch Embedded Metric Format records out of a CLI's output (metrics.test.ts,
// broker-paused.test.ts).
import assert from 'node:assert/strict';

export interface Emf {
  _aws: { Timestamp: number; CloudWatchMetrics: Array<{ Namespace: string; Dimensions: string[][]; Metrics: Array<{ Name: string; Unit: string }> }> };
  [key: string]: unknown;
}

/** The EMF records among a stream's JSON lines (the CLI's summary or log lines are not). */
export function emfRecords(text: string): Emf[] {
  return text
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((o): o is Emf => typeof o._aws === 'object' && o._aws !== null);
}

export function onlyRecord(text: string, where: string): Emf {
  const records = emfRecords(text);
  assert.equal(records.length, 1, `one EMF record on ${where}, got ${records.length}:\n${text}`);
  return records[0]!;
}

export function num(record: Emf, name: string): number {
  const v = record[name];
  assert.equal(typeof v, 'number', `${name} is a number in the record: ${JSON.stringify(v)}`);
  return v as number;
}
