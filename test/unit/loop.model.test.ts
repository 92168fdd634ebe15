// Model-based tests of the invocation loop (src/relay.ts, runInvocation) against in-memory fakes
// of its ports (test/unit/fakes/outbox.ts says what they model and what not). fast-check
// generates outbox tables, batch sizes, latencies (interleavings), faults at every step of the
// loop (claim, sends, premark, COMMIT, its answer, the next claim, ...) and a crash at any
// operation; after every run, and at the moment of a crash, the guarantees are checked on the
// fake database's committed state and the fake broker's acks:
//   G1  nothing is committed as sent that the broker did not ack
//   G2  rows acked but not committed as sent are at most one batch (one transaction's claim, at
//       most OUTBOX_BATCH_SIZE rows); not counted: rows whose COMMIT the database refused (a
//       fault the test injects; the loop learns of it one batch later by design, so a crash
//       right after can leave that batch and the one in flight unmarked). After a normal
//       return, none at all.
//   G4  per aggregate, a row's first ack comes only after every earlier row of its aggregate
//       was acked (so first copies are in seq order, and nothing jumps a held, failed or parked row)
//   G5  runInvocation settles by the deadline + G5_MARGIN_MS
//   and: without faults every row is acked exactly once and committed sent; the summary agrees
//   with the committed state; the stop reason is true; no transaction is left open; the loop
//   uses the ports as specified (no statement on an ended transaction, every row published is
//   held by an open transaction).
//
// On failure fast-check prints the seed, the path and the shrunk scenario; replay one with
// FC_SEED=<seed> FC_PATH=<path> npm run test:unit. FC_NUM_RUNS overrides every property's count.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config.ts';
import { DatabaseError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { runInvocation, type Summary } from '../../src/relay.ts';
import { FakePublisher, FakeStore, World, firstBlocked, type PublishFault, type RowSpec, type RowState, type StoreFault, type WorldPlan } from './fakes/outbox.ts';

/**
 * G5's margin. In production a failed invocation may outlive its deadline by BatchTx.rollback's
 * own grace (deadlineFree: 2 000 ms for a ROLLBACK that no longer answers). The fake rollback
 * answers at once, so the loop itself must settle within a few event-loop turns of the
 * deadline; 100 ms leaves room for timer granularity on a loaded machine.
 */
const G5_MARGIN_MS = 100;
/** how long after the deadline a run counts as hung (a G5 failure rather than a stuck test) */
const WATCHDOG_MS = 1_000;
/** deadline of the runs without hangs: never reached, the fakes answer within event-loop turns */
const ROOMY_DEADLINE_MS = 5_000;

interface Scenario extends WorldPlan {
  batchSize: number;
  maxAttempts: number;
  deadlineMs: number;
}

type Ending =
  | { kind: 'returned'; summary: Summary; elapsedMs: number }
  | { kind: 'rejected'; error: unknown; elapsedMs: number }
  | { kind: 'crashed' }
  | { kind: 'hung' };

const logger = createLogger('error', {}, () => undefined);

async function run(sc: Scenario): Promise<{ world: World; ending: Ending }> {
  const world = new World(sc);
  const config = loadConfig({
    DATABASE_URL: 'postgres://x@y/z',
    KAFKA_BROKERS: 'k:9092',
    OUTBOX_BATCH_SIZE: String(sc.batchSize),
    OUTBOX_MAX_ATTEMPTS: String(sc.maxAttempts),
  }).outbox;
  const deadline = Deadline.fromRemaining(sc.deadlineMs, 0);
  const t0 = performance.now();
  const relay = runInvocation({ store: new FakeStore(world), publisher: new FakePublisher(world), config, logger, random: () => 0.5 }, deadline).then(
    (summary): Ending => ({ kind: 'returned', summary, elapsedMs: performance.now() - t0 }),
    (error: unknown): Ending => ({ kind: 'rejected', error, elapsedMs: performance.now() - t0 }),
  );
  let watchdog: NodeJS.Timeout | undefined;
  const hung = new Promise<Ending>((resolve) => (watchdog = setTimeout(() => resolve({ kind: 'hung' }), sc.deadlineMs + WATCHDOG_MS)));
  try {
    // a crash abandons the run: its promises never settle, and hold no timer
    const ending = await Promise.race([relay, world.died.then((): Ending => ({ kind: 'crashed' })), hung]);
    return { world, ending: world.dead ? { kind: 'crashed' } : ending };
  } finally {
    clearTimeout(watchdog);
  }
}

function fail(world: World, message: string): never {
  assert.fail(`${message}\n  last operations (#n: operation, ✝: the crash):\n  ${world.tail()}`);
}

/** G1, G2, G4 and the ports' protocol: after every run, and at the moment of a crash. */
function checkSafety(sc: Scenario, world: World, ending: Ending): void {
  if (world.violations.length > 0) fail(world, `the loop misused its ports:\n  ${world.violations.join('\n  ')}`);
  const acked = new Set(world.ackLog.map((a) => a.seq));
  for (const r of world.sortedRows()) {
    if (r.sent && !acked.has(String(r.seq))) fail(world, `G1 violated: row ${r.seq} (${r.aggregateid}) is committed as sent, but the broker never acked it`);
  }
  const unmarked = [...acked].filter((s) => world.rows.get(Number(s))?.sent === false);
  if (ending.kind === 'returned' && unmarked.length > 0) fail(world, `G2 violated: the run returned normally, but rows [${unmarked.join(',')}] were acked and are not committed as sent`);
  const bounded = unmarked.filter((s) => !world.failedCommitRows.has(s));
  if (bounded.length > sc.batchSize) fail(world, `G2 violated (${ending.kind}): ${bounded.length} rows acked but not committed as sent ([${bounded.join(',')}]), more than a batch (${sc.batchSize})`);
  if (bounded.length > 0 && !world.txs.some((tx) => bounded.every((s) => tx.claimed.has(s)))) {
    fail(world, `G2 violated (${ending.kind}): rows [${bounded.join(',')}] were acked and are not committed as sent, and they are not all one batch's`);
  }
  const firstAcked = new Set<string>();
  for (const a of world.ackLog) {
    if (firstAcked.has(a.seq)) continue;
    const earlier = world.sortedRows().find((r) => r.aggregateid === a.aggregateid && r.seq < Number(a.seq) && !firstAcked.has(String(r.seq)));
    if (earlier) fail(world, `G4 violated: row ${a.seq} of ${a.aggregateid} was acked (operation #${a.step}) before row ${earlier.seq} of the same aggregate ever was`);
    firstAcked.add(a.seq);
  }
}

/** G5, no leftovers, and what the run reported agrees with the committed state. */
function checkEnding(sc: Scenario, world: World, ending: Ending): void {
  if (ending.kind === 'crashed') return;
  if (ending.kind === 'hung') fail(world, `G5 violated: runInvocation had not settled ${WATCHDOG_MS} ms after its ${sc.deadlineMs} ms deadline`);
  if (ending.elapsedMs > sc.deadlineMs + G5_MARGIN_MS) fail(world, `G5 violated: runInvocation took ${Math.round(ending.elapsedMs)} ms, deadline ${sc.deadlineMs} ms + margin ${G5_MARGIN_MS} ms`);
  const open = world.openTransactions();
  if (open.length > 0) fail(world, `transactions left open after the run (${ending.kind}): ${open.map((t) => `tx${t.id}`).join(', ')}`);
  const relayLocks = [...world.aggregateLocks.values(), ...[...world.rowLocks.values()].filter((h) => h > 0)];
  if (relayLocks.length > 0) fail(world, `locks left held after the run: transactions ${[...new Set(relayLocks)].join(', ')}`);

  if (ending.kind === 'rejected') {
    const { error } = ending;
    if (!(error instanceof DatabaseError)) fail(world, `the run rejected with something else than a DatabaseError: ${String(error)}`);
    const summary = (error as DatabaseError & { summary?: Summary }).summary;
    if (summary?.stoppedBecause !== 'database-error') fail(world, `a DatabaseError without its summary (stoppedBecause 'database-error'): ${error.message}`);
    if (!world.fired.some((f) => f.includes(':') && !f.startsWith('premark:recoverable') && !f.startsWith('prune:'))) fail(world, `the run failed without a database fault that could explain it: ${error.message}`);
    return;
  }

  const { summary } = ending;
  const rows = world.sortedRows();
  const sent = rows.filter((r) => r.sent).length;
  if (summary.published !== sent) fail(world, `summary.published = ${summary.published}, but ${sent} rows are committed as sent`);
  const parked = world.committedFailures.filter((f) => f.park).length;
  const retried = world.committedFailures.length - parked;
  if (summary.parked !== parked || summary.retried !== retried) fail(world, `summary parked/retried = ${summary.parked}/${summary.retried}, committed failures say ${parked}/${retried}`);

  // the stop reason is true
  const now = Date.now();
  const pending = rows.filter((r) => !r.sent && !r.parked);
  const blocked = firstBlocked(rows, now);
  const foreign = sc.foreignLocked.some((i) => i < sc.rows.length);
  const truth: Record<Summary['stoppedBecause'], () => boolean> = {
    empty: () => pending.length === 0,
    'behind-failed-rows': () => pending.length > 0 && pending.every((r) => r.nextAttemptAt > now || (blocked.get(r.aggregateid) ?? Infinity) < r.seq),
    locked: () => foreign,
    'behind-foreign-locks': () => foreign && summary.heldBack > 0,
    'topics-backed-off': () => summary.topicsBackedOff.length > 0 && world.fired.includes('backoff'),
    budget: () => sc.deadlineMs < ROOMY_DEADLINE_MS,
    'broker-unavailable': () => world.fired.some((f) => f === 'unavailable' || f === 'limits' || f === 'publish-hang'),
    'database-error': () => false,
  };
  if (!truth[summary.stoppedBecause]()) {
    fail(world, `stoppedBecause '${summary.stoppedBecause}' is not true of the outcome (pending: [${pending.map((r) => r.seq).join(',')}], faults fired: [${world.fired.join(', ')}])`);
  }
}

// ---------------------------------------------------------------- generators

function rowsArb(illegalTopics: boolean): fc.Arbitrary<RowSpec[]> {
  const topic = fc.oneof(
    { weight: 6, arbitrary: fc.constant(null) },
    // another topic through the per-row override: an aggregate changing topic waits (plan.ts)
    { weight: 2, arbitrary: fc.constant('outbox.audit') },
    // never sendable: rejected by the plan, charged an attempt
    ...(illegalTopics ? [{ weight: 1, arbitrary: fc.constant('not a topic!') }] : []),
  );
  const row = fc.record({ aggregate: fc.oneof(fc.nat(2), fc.nat(9)), topic, attempts: fc.nat(2) });
  return fc.oneof({ weight: 1, arbitrary: fc.array(row, { maxLength: 8 }) }, { weight: 2, arbitrary: fc.array(row, { minLength: 8, maxLength: 40 }) });
}

/** event-loop turns per operation: mostly quick, sometimes slow enough to reorder the overlapped steps */
const latenciesArb = fc.array(fc.oneof({ weight: 6, arbitrary: fc.nat(2) }, { weight: 1, arbitrary: fc.integer({ min: 3, max: 12 }) }), { minLength: 1, maxLength: 12 });

const foreignArb = fc.oneof({ weight: 3, arbitrary: fc.constant<number[]>([]) }, { weight: 1, arbitrary: fc.uniqueArray(fc.nat(39), { minLength: 1, maxLength: 3 }) });

const call = fc.oneof(fc.nat(2), fc.nat(8));

function storeFaultArb(hangs: boolean): fc.Arbitrary<StoreFault> {
  return fc.oneof(
    fc.record({ op: fc.constantFrom('begin', 'claim', 'whyEmpty', 'prune'), call, kind: hangs ? fc.constantFrom('fail', 'hang') : fc.constant('fail') }),
    fc.record({ op: fc.constant('premark'), call, kind: fc.constantFrom('recoverable', 'aborting') }),
    fc.record({ op: fc.constantFrom('commit', 'mark'), call, kind: hangs ? fc.constantFrom('fail', 'lost', 'hang-applied', 'hang-unapplied') : fc.constantFrom('fail', 'lost') }),
  );
}

function publishFaultArb(hangs: boolean): fc.Arbitrary<PublishFault> {
  const what = hangs ? fc.constantFrom('reject', 'reject-permanent', 'backoff', 'unavailable', 'hang') : fc.constantFrom('reject', 'reject-permanent', 'backoff', 'unavailable');
  return fc.oneof(
    { weight: 6, arbitrary: fc.record({ op: fc.constant('publish'), call, at: fc.oneof(fc.nat(3), fc.nat(19)), what }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant('limits'), call }) },
  );
}

interface ScenarioOptions {
  faults: boolean;
  crash: boolean;
  hangs: boolean;
}

function scenarioArb({ faults, crash, hangs }: ScenarioOptions): fc.Arbitrary<Scenario> {
  return fc.record({
    rows: rowsArb(faults),
    batchSize: fc.oneof(fc.integer({ min: 1, max: 5 }), fc.integer({ min: 1, max: 20 })),
    maxAttempts: fc.integer({ min: 1, max: 3 }),
    foreignLocked: foreignArb,
    latencies: latenciesArb,
    storeFaults: faults ? fc.array(storeFaultArb(hangs), { maxLength: 3 }) : fc.constant<StoreFault[]>([]),
    publishFaults: faults ? fc.array(publishFaultArb(hangs), { maxLength: 3 }) : fc.constant<PublishFault[]>([]),
    deadlineMs: fc.constant(ROOMY_DEADLINE_MS),
  }).chain((sc) => {
    // about as many operations as a run without faults has: every one can be the last
    if (crash) return fc.nat(sc.rows.length * 8 + 12).map((crashAt): Scenario => ({ ...sc, crashAt }));
    if (!hangs) return fc.constant(sc);
    // one hang (the database or the broker stops answering), early enough to be reached, on a short budget
    const hang = fc.oneof(
      fc.record({ op: fc.constantFrom('begin', 'claim', 'whyEmpty', 'prune'), call: fc.nat(2), kind: fc.constant('hang') }),
      fc.record({ op: fc.constantFrom('commit', 'mark'), call: fc.nat(2), kind: fc.constantFrom('hang-applied', 'hang-unapplied') }),
      fc.record({ op: fc.constant('publish'), call: fc.nat(2), at: fc.nat(3), what: fc.constant('hang') }),
    );
    return fc.record({ hang, deadlineMs: fc.integer({ min: 60, max: 120 }) }).map(({ hang: h, deadlineMs }): Scenario => ({
      ...sc,
      deadlineMs,
      storeFaults: h.op === 'publish' ? sc.storeFaults : [h, ...sc.storeFaults],
      publishFaults: h.op === 'publish' ? [h, ...sc.publishFaults] : sc.publishFaults,
    }));
  });
}

function params(numRuns: number): fc.Parameters<[Scenario]> {
  const env = process.env;
  return {
    numRuns: env.FC_NUM_RUNS ? Number(env.FC_NUM_RUNS) : numRuns,
    ...(env.FC_SEED ? { seed: Number(env.FC_SEED) } : {}),
    ...(env.FC_PATH ? { path: env.FC_PATH } : {}),
  };
}

// ---------------------------------------------------------------- properties

describe('invocation loop, model-based (in-memory store and broker, fast-check)', () => {
  const NO_FAULT_RUNS = 400;
  it(`without faults: every row is acked once and committed sent, except behind foreign locks (${NO_FAULT_RUNS} cases)`, async () => {
    await fc.assert(
      fc.asyncProperty(scenarioArb({ faults: false, crash: false, hangs: false }), async (sc) => {
        const { world, ending } = await run(sc);
        checkSafety(sc, world, ending);
        checkEnding(sc, world, ending);
        if (ending.kind !== 'returned') fail(world, `a run without faults ended ${ending.kind}`);
        // Rows of an aggregate from its first foreign-locked row on wait. The others are all
        // sent, except that an aggregate found waiting behind a foreign lock is left out of the
        // invocation's later claims (stuckAggregates) as a whole: its rows before the lock that
        // the batch could not send (they wait behind a change of topic, plan.ts) wait for the
        // next invocation too.
        const firstForeign = new Map<string, number>();
        for (const i of [...sc.foreignLocked].sort((a, b) => a - b)) {
          const r = world.rows.get(i + 1);
          if (r && !firstForeign.has(r.aggregateid)) firstForeign.set(r.aggregateid, r.seq);
        }
        const rows = world.sortedRows();
        // a row the claim can take behind a foreign-locked one: its aggregate is found stuck
        const foreignSeqs = new Set(sc.foreignLocked.map((i) => i + 1));
        const behind = (r: RowState) => r.seq > (firstForeign.get(r.aggregateid) ?? Infinity) && !foreignSeqs.has(r.seq);
        const stuck = new Set(rows.filter(behind).map((r) => r.aggregateid));
        const acks = world.ackLog.map((a) => a.seq);
        if (acks.length !== new Set(acks).size) fail(world, `a row was acked more than once without faults: [${acks.join(',')}]`);
        for (const r of rows) {
          const sent = r.sent;
          const acked = acks.includes(String(r.seq));
          if (sent !== acked) fail(world, `row ${r.seq}: committed sent ${sent}, acked ${acked}`);
          if (r.seq >= (firstForeign.get(r.aggregateid) ?? Infinity)) {
            if (sent) fail(world, `row ${r.seq} of ${r.aggregateid} was sent, but a foreign transaction holds row ${firstForeign.get(r.aggregateid)}`);
            continue;
          }
          if (sent) continue;
          const previous = rows.filter((o) => o.aggregateid === r.aggregateid && o.seq < r.seq).at(-1);
          const excused = stuck.has(r.aggregateid) && previous?.sent === true && (previous.topic ?? '') !== (r.topic ?? '');
          if (!excused && !rows.some((o) => o.aggregateid === r.aggregateid && o.seq < r.seq && !o.sent)) fail(world, `row ${r.seq} of ${r.aggregateid} was never sent, though nothing held it back`);
        }
        assert.equal(ending.summary.published, acks.length);
        assert.equal(ending.summary.stoppedBecause, stuck.size > 0 ? 'behind-foreign-locks' : firstForeign.size > 0 ? 'locked' : 'empty');
      }),
      params(NO_FAULT_RUNS),
    );
  });

  const FAULT_RUNS = 1_500;
  it(`faults at every step (claim, sends, premark, COMMIT, its answer): G1, G2, G4, G5, summary = committed state (${FAULT_RUNS} cases)`, async () => {
    await fc.assert(
      fc.asyncProperty(scenarioArb({ faults: true, crash: false, hangs: false }), async (sc) => {
        const { world, ending } = await run(sc);
        checkSafety(sc, world, ending);
        checkEnding(sc, world, ending);
      }),
      params(FAULT_RUNS),
    );
  });

  const CRASH_RUNS = 1_500;
  it(`a crash at any operation: G1, G2 and G4 hold in the committed state at the moment of death (${CRASH_RUNS} cases)`, async () => {
    await fc.assert(
      fc.asyncProperty(scenarioArb({ faults: true, crash: true, hangs: false }), async (sc) => {
        const { world, ending } = await run(sc);
        checkSafety(sc, world, ending);
        checkEnding(sc, world, ending);
      }),
      params(CRASH_RUNS),
    );
  });

  const HANG_RUNS = 60;
  it(`a database or broker that stops answering: settles by the deadline (G5), G1, G2, G4 (${HANG_RUNS} cases, 60-120 ms budgets)`, async () => {
    await fc.assert(
      fc.asyncProperty(scenarioArb({ faults: true, crash: false, hangs: true }), async (sc) => {
        const { world, ending } = await run(sc);
        checkSafety(sc, world, ending);
        checkEnding(sc, world, ending);
      }),
      params(HANG_RUNS),
    );
  });
});
