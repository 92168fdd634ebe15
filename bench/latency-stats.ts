// The latency bench's arithmetic (bench/latency.ts), kept pure for its unit test: each event's
// latency from its row's created_at to a time the consumer saw (the broker's append time, or the
// consumer's receipt), the percentiles, and a party's CPU per 1,000 events.

/** The value at percentile p (0-100) of ascending `sorted`: the smallest with p % of them at or below it. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(1, Math.ceil((p / 100) * sorted.length)) - 1)]!;
}

export interface Paired {
  /** [created_at ms, latency ms] per event, in the order of `created` */
  latencies: Array<[number, number]>;
  /** ascending latencies, for percentile() */
  sorted: number[];
  /** rows with no time in `seen`: events the consumer never got */
  missing: number;
}

/** Pairs each row (id, created_at in epoch ms) with the time `seen` holds for its id (epoch ms). */
export function pairLatencies(
  created: ReadonlyArray<{ id: string; c: number }>,
  seen: ReadonlyMap<string, number>,
): Paired {
  const latencies: Array<[number, number]> = [];
  let missing = 0;
  for (const r of created) {
    const t = seen.get(r.id);
    if (t === undefined) missing++;
    else latencies.push([r.c, t - r.c]);
  }
  return { latencies, sorted: latencies.map(([, l]) => l).sort((a, b) => a - b), missing };
}

/** CPU seconds spent on `events` events, as milliseconds per 1,000 events */
export const msPer1k = (cpuSeconds: number, events: number): number => (cpuSeconds * 1e6) / events;
