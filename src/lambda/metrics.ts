// CloudWatch metrics through Powertools for AWS Lambda's Metrics: one Embedded Metric Format
// (EMF) record per invocation, published by Powertools' logMetrics middy middleware. In Lambda
// the record goes to stdout, where CloudWatch Logs turns it into metrics; no API call, no
// permission. Dimensions are only `service` and `stage`: low cardinality, one series per
// deployment.
// What each record holds: src/lambda/invocation-metrics.ts; docs/operations.md, "Metrics", lists
// every metric.
import { Metrics, MetricUnit } from '@aws-lambda-powertools/metrics';
import type { Config } from '../config/types.ts';
import type { Summary } from '../loop/summary.ts';
import type { Backlog } from '../outbox/admin.ts';

type Unit = (typeof MetricUnit)[keyof typeof MetricUnit];
type MetricsOptions = NonNullable<ConstructorParameters<typeof Metrics>[0]>;

/** Every metric the relay emits, with its unit. Names are CloudWatch's; `status --json` uses the same names in camelCase for the table's figures. */
export const METRICS = {
  // from the Summary, per invocation (Sum is the rate per period)
  Published: MetricUnit.Count,
  Retried: MetricUnit.Count,
  Parked: MetricUnit.Count,
  HeldBack: MetricUnit.Count,
  Batches: MetricUnit.Count,
  Pruned: MetricUnit.Count,
  TopicsBackedOff: MetricUnit.Count,
  DurationMs: MetricUnit.Milliseconds,
  WaitedClaimMs: MetricUnit.Milliseconds,
  WaitedPublishMs: MetricUnit.Milliseconds,
  WaitedCommitMs: MetricUnit.Milliseconds,
  // linger mode (OUTBOX_IDLE=linger): time spent waiting for new rows, and how often it woke
  WaitedIdleMs: MetricUnit.Milliseconds,
  Wakeups: MetricUnit.Count,
  // from the table, after the invocation (Maximum is the figure to watch)
  OldestPendingAgeMs: MetricUnit.Milliseconds,
  PendingRows: MetricUnit.Count,
  PendingRowsCapped: MetricUnit.Count,
  ParkedRows: MetricUnit.Count,
  ParkedRowsCapped: MetricUnit.Count,
  // fan-out (OUTBOX_FANOUT_MAX > 1, src/lambda/fanout.ts): helpers a scheduled invocation started, those
  // it wanted and could not start (throttled, failed), and per helper 1 when it found nothing
  HelpersStarted: MetricUnit.Count,
  HelpersNotStarted: MetricUnit.Count,
  HelpersFoundNothing: MetricUnit.Count,
} as const satisfies Record<string, Unit>;

export type MetricName = keyof typeof METRICS;

/**
 * Powertools' Metrics with a choice of stream. Powertools always prints EMF to stdout (which is
 * what Lambda needs, and then this class defers to it unchanged); the CLI's stdout holds its
 * summary, so there the record goes to stderr, or nowhere.
 */
export class RelayMetrics extends Metrics {
  constructor(
    options: MetricsOptions,
    readonly output: Config['telemetry']['metrics'],
  ) {
    super(options);
  }

  override publishStoredMetrics(): this {
    if (this.output === 'stdout') return super.publishStoredMetrics();
    try {
      if (this.output === 'stderr' && this.hasStoredMetrics() && !this.isDisabled()) {
        process.stderr.write(JSON.stringify(this.serializeMetrics()) + '\n');
      }
    } finally {
      this.clearMetrics();
      this.clearDimensions();
      this.clearMetadata();
    }
    return this;
  }
}

/** `logger`: where Powertools' own warnings go (a Powertools logger, or anything with warn/info/debug/error). */
export function createMetrics(telemetry: Config['telemetry'], logger?: MetricsOptions['logger']): RelayMetrics {
  return new RelayMetrics(
    {
      namespace: telemetry.metricsNamespace,
      serviceName: telemetry.serviceName,
      defaultDimensions: { stage: telemetry.stage },
      ...(logger ? { logger } : {}),
    },
    telemetry.metrics,
  );
}

/** The Summary's figures: counts, where the time went. */
export function addSummaryMetrics(metrics: Metrics, s: Summary): void {
  const add = (name: MetricName, value: number) => metrics.addMetric(name, METRICS[name], value);
  add('Published', s.published);
  add('Retried', s.retried);
  add('Parked', s.parked);
  add('HeldBack', s.heldBack);
  add('Batches', s.batches);
  add('Pruned', s.pruned);
  add('TopicsBackedOff', s.topicsBackedOff.length);
  add('DurationMs', s.durationMs);
  add('WaitedClaimMs', s.waitedMs.claim);
  add('WaitedPublishMs', s.waitedMs.publish);
  add('WaitedCommitMs', s.waitedMs.commit);
  add('WaitedIdleMs', s.waitedMs.idle);
  add('Wakeups', s.wakeups.notified + s.wakeups.probe + s.wakeups.reclaim);
}

/** The table's figures; the capped flags as 0 or 1. */
export function addBacklogMetrics(metrics: Metrics, b: Backlog): void {
  const add = (name: MetricName, value: number) => metrics.addMetric(name, METRICS[name], value);
  add('OldestPendingAgeMs', b.oldestPendingAgeMs);
  add('PendingRows', b.pendingRows);
  add('PendingRowsCapped', b.pendingRowsCapped ? 1 : 0);
  add('ParkedRows', b.parkedRows);
  add('ParkedRowsCapped', b.parkedRowsCapped ? 1 : 0);
}
