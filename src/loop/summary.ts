/** The last two fail the invocation (Lambda's Errors metric sees them). */
export type StopReason =
  | 'empty' // nothing left to send: no pending row (parked rows may remain; `status` lists them)
  | 'behind-failed-rows' // every pending row is backing off, or is held back behind a backing-off or parked row of its aggregate
  | 'locked' // claimable rows exist, but other transactions hold them: other invocations, usually
  | 'behind-unclaimable-rows' // what is left is held back behind unclaimable rows (ClaimedRow.behindUnclaimable)
  | 'topics-backed-off' // what is left is bound for topics the broker refused in this invocation
  | 'no-lane' // exactly-once delivery: every lane is leased by other invocations (docs/DESIGN.md, "Exactly-once delivery (opt-in)")
  | 'budget' // not enough time left for another batch
  | 'broker-unavailable'
  | 'database-error';

export interface Summary {
  claimed: number;
  published: number;
  retried: number;
  parked: number;
  /** behind an earlier row of their aggregate that was not in their claim */
  heldBack: number;
  batches: number;
  /** batches, plus claims that found nothing to publish: bounded by the work done, never a loop */
  claims: number;
  pruned: number;
  topicsBackedOff: string[];
  durationMs: number;
  wakeups: { notified: number; probe: number; reclaim: number };
  /** claims not hidden behind a publish, publishes, COMMITs' answers, linger waits: for tuning, their sum is ~durationMs */
  waitedMs: { claim: number; publish: number; commit: number; idle: number };
  stoppedBecause: StopReason;
  error?: string;
}

export function newSummary(): Summary {
  return {
    claimed: 0,
    published: 0,
    retried: 0,
    parked: 0,
    heldBack: 0,
    batches: 0,
    claims: 0,
    pruned: 0,
    topicsBackedOff: [],
    durationMs: 0,
    wakeups: { notified: 0, probe: 0, reclaim: 0 },
    waitedMs: { claim: 0, publish: 0, commit: 0, idle: 0 },
    stoppedBecause: 'budget',
  };
}

/** Awaits `p`, adding the time spent to `summary.waitedMs[what]`. */
export async function timed<T>(summary: Summary, what: keyof Summary['waitedMs'], p: Promise<T>): Promise<T> {
  const t0 = performance.now();
  try {
    return await p;
  } finally {
    summary.waitedMs[what] += performance.now() - t0;
  }
}

export function finish(summary: Summary, startedAt: number, reason: StopReason): Summary {
  summary.stoppedBecause = reason;
  summary.durationMs = Date.now() - startedAt;
  for (const k of Object.keys(summary.waitedMs) as (keyof Summary['waitedMs'])[]) summary.waitedMs[k] = Math.round(summary.waitedMs[k]);
  return summary;
}
