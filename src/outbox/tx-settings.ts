import { BUDGET, type Deadline } from '../budget.ts';

// Why each, with the measurements behind it: docs/benchmarks/planner-settings.md.
export const BATCH_PLANNER_SETTINGS: ReadonlyArray<readonly [string, string]> = [
  ['plan_cache_mode', 'force_custom_plan'],
  ['enable_sort', 'off'],
  ['enable_incremental_sort', 'off'],
  ['jit', 'off'],
];

const TIMEOUTS = ['statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout'].map(
  (name, i) => `set_config('${name}', $${i + 1}, true)`,
);
const PLANNER = BATCH_PLANNER_SETTINGS.map((_, i) => `set_config($${4 + 2 * i}, $${5 + 2 * i}, true)`);

const BATCH_SETTINGS_SQL = `SELECT ${[...TIMEOUTS, ...PLANNER].join(', ')}`;
const SIDE_SETTINGS_SQL = `SELECT ${TIMEOUTS.join(', ')}`;

export interface TxSettings {
  text: string;
  params: string[];
}

// idle_in_transaction past the deadline: a batch transaction sits idle while its batch is on its way to Kafka.
export function txSettings(
  deadline: Deadline,
  { batch, lockTimeoutMs }: { batch: boolean; lockTimeoutMs?: number },
): TxSettings {
  const left = deadline.remaining();
  const statementMs = Math.max(1, left);
  const timeouts = [statementMs, lockTimeoutMs ?? statementMs, left + BUDGET.idleInTransactionPastDeadlineMs].map(
    String,
  );
  if (!batch) return { text: SIDE_SETTINGS_SQL, params: timeouts };
  return { text: BATCH_SETTINGS_SQL, params: [...timeouts, ...BATCH_PLANNER_SETTINGS.flat()] };
}
