// Jitter, so that rows that failed together do not all come due in the same second.
export function backoffMs(attempt: number, baseMs: number, maxMs: number, random: () => number = Math.random): number {
  const exp = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt - 1));
  // "equal jitter": at least half the exponential delay, so backoff still grows
  return Math.round(exp / 2 + random() * (exp / 2));
}

export function shouldPark(attempt: number, maxAttempts: number, permanent: boolean): boolean {
  return permanent || attempt >= maxAttempts;
}
