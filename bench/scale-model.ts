// The scale bench's arithmetic (bench/scale.ts), pure so that a unit test holds it to what
// docs/benchmarks/scale.md claims: the median of a case's rounds, and the model that turns the CPU
// each party spent per event into events/s ceilings for an RDS primary, MSK brokers and Lambda.

/** CPU seconds per event of each party of one measurement */
export interface PartyCpu {
  /** the relay processes, summed */
  relay: number;
  /** every Postgres process: the relays' backends (claim, publish-side reads, mark, commit) */
  postgres: number;
  broker: number;
}

export interface Sample {
  events: number;
  ms: number;
  /** CPU seconds per party over the measurement (not per event) */
  cpu?: PartyCpu;
  invocations: number;
  /** invocations that published nothing: they found every claimable row held by another */
  empty: number;
  /** rows claimed but held back behind an earlier row of their aggregate in another invocation's batch */
  heldBack: number;
  /** ms the invocations waited for claims, publishes, commits, summed over invocations */
  waitedMs?: { claim: number; publish: number; commit: number };
  /** concurrent invocations of the measurement */
  invocationsAtOnce?: number;
}

export const eventsPerSec = (s: Sample): number => (s.events / s.ms) * 1000;

/**
 * The round with the median rate (the upper middle one of an even count), with the range of the
 * rates: its CPU figures come from that same round, as one measurement's parties belong together.
 */
export function medianSample(samples: readonly Sample[]): Sample & { min: number; max: number } {
  if (samples.length === 0) throw new Error('medianSample: no rounds measured');
  const sorted = [...samples].sort((a, b) => eventsPerSec(a) - eventsPerSec(b));
  const mid = sorted[Math.floor(sorted.length / 2)]!;
  return { ...mid, min: eventsPerSec(sorted[0]!), max: eventsPerSec(sorted[sorted.length - 1]!) };
}

/** CPU seconds per event of each party of a sample */
export function perEvent(s: Sample): PartyCpu | undefined {
  if (!s.cpu) return undefined;
  return { relay: s.cpu.relay / s.events, postgres: s.cpu.postgres / s.events, broker: s.cpu.broker / s.events };
}

/** What the model assumes; docs/benchmarks/scale.md states each one. */
export interface ModelAssumptions {
  /** the share of a machine's vCPUs the relay may use: the primary also serves the application */
  utilization: number;
  /** copies of each message the brokers write (MSK: 3), each costing about what the leader's append costs */
  replicationFactor: number;
  /** a Lambda function's vCPUs: memory / 1,769 MB (AWS: 1 vCPU at 1,769 MB) */
  lambdaVcpu: number;
}

export const DEFAULT_ASSUMPTIONS: ModelAssumptions = { utilization: 0.7, replicationFactor: 3, lambdaVcpu: 512 / 1769 };

/** RDS for PostgreSQL instance classes and their vCPUs (Graviton2: one vCPU is one core) */
export const RDS_CLASSES: ReadonlyArray<readonly [string, number]> = [
  ['db.r6g.large', 2],
  ['db.r6g.xlarge', 4],
  ['db.r6g.2xlarge', 8],
  ['db.r6g.4xlarge', 16],
];

/** MSK clusters: broker count × broker type's vCPUs */
export const MSK_CLUSTERS: ReadonlyArray<readonly [string, number, number]> = [
  ['kafka.m5.large', 3, 2],
  ['kafka.m5.xlarge', 3, 4],
  ['kafka.m5.xlarge', 6, 4],
];

export interface Ceilings {
  /** events/s one vCPU of the primary sustains: 1 / Postgres CPU per event */
  perDbVcpu: number;
  rds: Array<{ name: string; vcpus: number; eventsPerSec: number }>;
  /** events/s one broker vCPU sustains, replication included */
  perBrokerVcpu: number;
  msk: Array<{ name: string; brokers: number; vcpus: number; eventsPerSec: number }>;
  /** events/s one invocation's CPU allows (its waits on the database and broker not counted) */
  perInvocation: number;
  /** concurrent invocations needed to reach the smallest RDS class's ceiling */
  invocationsForSmallestRds: number;
}

/** vCPUs × utilization ÷ CPU seconds per event, rounded down to 100 events/s: a ceiling is never rounded up */
export function ceiling(vcpus: number, utilization: number, cpuPerEvent: number): number {
  if (!(cpuPerEvent > 0)) throw new Error(`ceiling: CPU per event must be positive, got ${cpuPerEvent}`);
  // the small epsilon: 1.4 / 0.0000466… is 29999.99… in floating point, and means 30000
  return Math.floor((vcpus * utilization) / cpuPerEvent / 100 + 1e-6) * 100;
}

export function ceilings(cpu: PartyCpu, a: ModelAssumptions = DEFAULT_ASSUMPTIONS): Ceilings {
  const brokerPerEvent = cpu.broker * a.replicationFactor;
  const rds = RDS_CLASSES.map(([name, vcpus]) => ({
    name,
    vcpus,
    eventsPerSec: ceiling(vcpus, a.utilization, cpu.postgres),
  }));
  const msk = MSK_CLUSTERS.map(([name, brokers, vcpus]) => ({
    name,
    brokers,
    vcpus,
    eventsPerSec: ceiling(brokers * vcpus, a.utilization, brokerPerEvent),
  }));
  const perInvocation = ceiling(a.lambdaVcpu, 1, cpu.relay);
  return {
    perDbVcpu: ceiling(1, 1, cpu.postgres),
    rds,
    perBrokerVcpu: ceiling(1, 1, brokerPerEvent),
    msk,
    perInvocation,
    invocationsForSmallestRds: Math.ceil(rds[0]!.eventsPerSec / perInvocation),
  };
}
