import { backoffMs, shouldPark } from './backoff.ts';
import type { MessageRejectedError } from '../errors.ts';

export interface Failure {
  seq: string;
  error: string;
  delayMs: number;
  park: boolean;
}

export interface Settlement {
  /** acked: the only rows marked sent (G1) */
  sent: string[];
  failures: Failure[];
}

export interface RetryPolicy {
  maxAttempts: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
}

export function settle(
  acked: string[],
  rejected: Array<{ seq: string; error: MessageRejectedError }>,
  attemptsSoFar: (seq: string) => number,
  policy: RetryPolicy,
  random: () => number = Math.random,
): Settlement {
  const failures = rejected.map(({ seq, error }): Failure => {
    const attempt = attemptsSoFar(seq) + 1;
    const park = shouldPark(attempt, policy.maxAttempts, error.permanent);
    return { seq, error: error.message, park, delayMs: park ? 0 : backoffMs(attempt, policy.backoffBaseMs, policy.backoffMaxMs, random) };
  });
  return { sent: acked, failures };
}
