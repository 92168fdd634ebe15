// What a mode costs on Lambda, per month, from figures the latency bench measures (bench/latency.ts).
//
// Lambda bills GB-seconds: the function's memory times each invocation's duration, to the
// millisecond. A scheduled relay is invoked once a minute: 43,200 times in 30 days.
// - exit mode: an invocation lasts as long as the events of one period take to relay, plus the
//   fixed cost of an invocation that finds nothing (claims and the backlog read: round trips).
//   Relaying is CPU work, and Lambda gives a function CPU in proportion to its memory (1,769 MB is
//   one vCPU), so the per-event part is this machine's CPU per event divided by that share.
// - linger mode: an invocation lasts until its deadline whatever the rate: timeout - margin.
// Both are estimates from one machine's CPU per event, not Lambda measurements; the table says so.

/** Lambda's price for Arm (Graviton), us-east-1, first 6 billion GB-seconds a month, and per request. */
export const PRICE = {
  gbSecond: 0.0000133334,
  perRequest: 0.2 / 1_000_000,
  source: 'https://aws.amazon.com/lambda/pricing/ (Arm price, us-east-1, first 6 billion GB-seconds per month)',
};

/** memory at which a function has one full vCPU */
export const MB_PER_VCPU = 1_769;
export const INVOCATIONS_PER_MONTH = 30 * 24 * 60;

export interface CostInputs {
  /** events per second the application writes */
  rate: number;
  /** the relay's CPU seconds per event on one full core (measured) */
  cpuPerEvent: number;
  /** duration of a warm invocation that finds nothing to do, seconds (measured; round trips, not CPU) */
  emptyInvocationS: number;
  /** the schedule's period, seconds (EventBridge: 60) */
  periodS: number;
  /** linger mode's function timeout and safety margin, seconds (e.g. 70 and 3) */
  lingerTimeoutS: number;
  marginS: number;
}

export interface CostRow {
  mode: 'exit' | 'linger';
  memoryMb: number;
  /** seconds billed per invocation */
  secondsPerInvocation: number;
  gbSecondsPerMonth: number;
  dollarsPerMonth: number;
  /** the share of the function's CPU that relaying `rate` takes: near or above 1, it cannot keep up */
  cpuShareUsed: number;
}

export function costRow(mode: 'exit' | 'linger', memoryMb: number, i: CostInputs): CostRow {
  const vcpu = Math.min(1, memoryMb / MB_PER_VCPU);
  const cpuShareUsed = (i.rate * i.cpuPerEvent) / vcpu;
  const relayS = (i.rate * i.periodS * i.cpuPerEvent) / vcpu;
  const secondsPerInvocation = mode === 'exit' ? i.emptyInvocationS + relayS : i.lingerTimeoutS - i.marginS;
  const gbSecondsPerMonth = (memoryMb / 1024) * secondsPerInvocation * INVOCATIONS_PER_MONTH;
  const dollarsPerMonth = gbSecondsPerMonth * PRICE.gbSecond + INVOCATIONS_PER_MONTH * PRICE.perRequest;
  return { mode, memoryMb, secondsPerInvocation, gbSecondsPerMonth, dollarsPerMonth, cpuShareUsed };
}
