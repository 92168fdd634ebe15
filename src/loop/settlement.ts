// Settling a batch (pure): the broker's acks and rejections become the marks, attempts and parks
// that the batch's transaction writes before its COMMIT.
import { backoffMs, shouldPark } from './backoff.ts';
import type { MessageRejectedError } from '../errors.ts';

/** One failed attempt of a row: why, when to try again, or park it. */
export interface Failure {
  seq: string;
  error: string;
  delayMs: number;
  park: boolean;
}

export interface Settlement {
  /** rows the broker acknowledged: the only ones marked sent (G1) */
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
