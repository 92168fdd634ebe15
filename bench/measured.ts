// The check every measurement passes before its figures count (pure, so a unit test holds it:
// test/unit/bench-measured.test.ts): a bench that no longer measures what it says must fail, not
// print NaN or a rate over fewer events than were sent.

export interface Measurement {
  name: string;
  /** events inside the timed window */
  events: number;
  perSec: number;
  /** a peer's: the messages it read back from the topic and matched to the table, once each */
  readBack?: number;
}

/**
 * Why `r` is not a measurement of `sent` events, or undefined when it is. The relay's window holds
 * every event. A peer's clock starts at its first message (its restart is not its speed), so its
 * window holds fewer: what must equal `sent` there is what it read back.
 */
export function notMeasured(r: Measurement, sent: number): string | undefined {
  if (!(r.perSec > 0) || !Number.isFinite(r.perSec)) {
    return `${r.name}: ${r.perSec} events/s over ${r.events} events of ${sent}`;
  }
  if (r.readBack === undefined) {
    return r.events === sent ? undefined : `${r.name}: ${r.events} events of ${sent} measured`;
  }
  if (r.readBack !== sent) return `${r.name}: ${r.readBack} events of ${sent} read back`;
  if (!(r.events > 0 && r.events <= sent)) return `${r.name}: ${r.events} events timed of ${sent} sent`;
  return undefined;
}
