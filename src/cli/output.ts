// What the operator commands print. Text for a human passes every value that came from the
// database through printable() (a row's error, key, type or topic cannot forge a line or drive
// the terminal); JSON is printed by jsonText, which escapes what a terminal acts on. Pure: the unit
// tests call these.
import type { NotActedOn, OperatorResult, ParkedRow, Status } from '../outbox/admin.ts';
import { printable } from './printable.ts';

/** `status` as text: the table's totals, then one line per topic. */
export function statusText(s: Status): string {
  const age = (ms: number | null) => (ms === null ? '-' : `${(ms / 1000).toFixed(1)}s`);
  const lines = [`table ${printable(s.table)}: ${s.pending} pending (${s.retrying} retrying), ${s.parked} parked, oldest pending ${age(s.oldestPendingMs)}`];
  for (const t of s.topics) {
    lines.push(`  ${printable(t.topic).padEnd(40)} pending ${String(t.pending).padStart(8)}  retrying ${String(t.retrying).padStart(6)}  parked ${String(t.parked).padStart(6)}  oldest ${age(t.oldestPendingMs)}`);
  }
  return lines.join('\n') + '\n';
}

/** `parked list` as text: two or three lines per row (the row, its last error, its last retry by hand). */
export function parkedListText(rows: ParkedRow[]): string {
  if (!rows.length) return 'no parked rows\n';
  return rows
    .map((r) => {
      const head = `${r.id}  seq ${r.seq}  ${printable(r.aggregatetype)}/${printable(r.aggregateid)} ${printable(r.type)}  attempts ${r.attempts}  parked ${r.parked_at.toISOString()}`;
      const lines = [head, `    ${printable(r.last_error ?? '')}`];
      const operator = r.retried_operator ? ` (operator ${printable(r.retried_operator)})` : '';
      if (r.retried_at) lines.push(`    retried before: ${r.retried_at.toISOString()} by ${printable(r.retried_by ?? '?')}${operator}: ${printable(r.retried_reason ?? '')}`);
      return lines.join('\n') + '\n';
    })
    .join('');
}

export type OperatorAction = 'retry' | 'skip';

/** What `parked retry|skip` prints and exits with. */
export interface OperatorReport {
  /** the JSON line for stdout */
  json: Record<string, unknown>;
  /** for stderr: the rows named that were not acted on, one line each; empty when none */
  text: string;
  /** 1 when a row named was not acted on (so a script notices), else 0 */
  code: 0 | 1;
}

const DONE: Record<OperatorAction, { done: string; not: string; would: string }> = {
  retry: { done: 'retried', not: 'notRetried', would: 'wouldRetry' },
  skip: { done: 'skipped', not: 'notSkipped', would: 'wouldSkip' },
};

/**
 * The JSON names what was done (`retried` / `skipped`) or, in a dry run, what would be
 * (`wouldRetry` / `wouldSkip`), so that a script reading the first never mistakes a dry run for
 * the real one; the rows not acted on are `notRetried` / `notSkipped`, each with its id, state
 * and why, in both.
 */
export function operatorReport(action: OperatorAction, request: { reason: string; dryRun: boolean }, result: OperatorResult): OperatorReport {
  const names = DONE[action];
  const json = {
    [request.dryRun ? names.would : names.done]: result.actedOn,
    [names.not]: result.notActedOn,
    dryRun: request.dryRun,
    reason: request.reason,
    by: result.by,
    operator: result.operator,
    at: result.at.toISOString(),
  };
  return { json, text: notActedOnText(action, request.dryRun, result), code: result.notActedOn.length ? 1 : 0 };
}

function notActedOnText(action: OperatorAction, dryRun: boolean, result: OperatorResult): string {
  const n = result.notActedOn.length;
  if (!n) return '';
  const asked = n + result.actedOn.length;
  const verb = dryRun ? `would not be ${DONE[action].done}` : `not ${DONE[action].done}`;
  const lines = result.notActedOn.map((r: NotActedOn) => `  ${r.id}: ${printable(r.why)}`);
  return `outbox-relay: ${dryRun ? 'dry run: ' : ''}${n} of ${asked} ${asked === 1 ? 'row' : 'rows'} named ${verb}:\n${lines.join('\n')}\n`;
}
