// services: postgres
// Model-based test of the REAL claim/mark SQL on the REAL Postgres (no Kafka), part of `npm test`
// (alone: `npm run test:model`).
//
// fast-check
// generates scenarios (test/model/model-harness.ts runs them). Each run draws its table and its
// settings, and every check below must hold on each:
//   - the table's shape: plain as migrate makes it (half the runs), or rebuilt PARTITION BY RANGE
//     (created_at) in two partitions (rows inserted `old`, with a created_at a day back, land in
//     the older one, at the ctids the newer one's rows have too), or PARTITION BY HASH of
//     aggregateid or seq in 2 or 3 partitions (a batch spans partitions; by seq an aggregate's rows
//     are spread over them); and whether it has application columns named like every alias and
//     CTE of the relay's statements (tid, rel, first_gap, publishable, created_epoch, placed, ...,
//     read from the statement texts as table-shapes.test.ts does);
//   - the settings (the relay's environment, loadConfig): OUTBOX_SENT_ROWS keep or delete (the
//     mark's statement; under delete a test-only trigger notes the rows a relay deletes, for G1
//     and G2), OUTBOX_BATCH_SIZE 1-3 (with OUTBOX_MAX_BATCH_BYTES 100, several batches and byte
//     cuts), OUTBOX_KEY_COLUMN aggregateid, id or type, OUTBOX_ADDITIONAL_PLACEMENT unset, none or
//     one column as a header (type; created_at or an application column `tid`, which the claim
//     then reads), OUTBOX_METADATA none, timestamp,seq or cloudevents (the claim reads
//     created_at). The store is built with the columns the settings make the claim read
//     (claimColumns), and the fake publisher makes each message with the real toMessage under
//     them. There is no Kafka: the key reaches toMessage only (the claim, the marks and the order
//     guard are per aggregateid whatever the key, and so are the fake's refusals, as
//     ProducerPublisher's); its one-key-per-send cut (oneKeyPerAggregate) is not under the model.
// Then the steps: producers inserting rows of
// three aggregates (some in transactions left open, so that a lower seq commits after a higher
// one), invocations of the real loop (runInvocation) alone or two or three at once on relays of
// their own (each its own postgres.js client, warm across invocations, replaced and reconnected
// when the Runtime would), a fake publisher whose answer to each publish call the scenario chooses
// (all acked, one row refused and charged, a topic refused and not charged, the broker gone after
// some acks, an answer late or lost past the send deadline), pg_terminate_backend of a relay's
// backends at a chosen time or publish call, retention with old sent rows to delete, and
// operators: `parked retry` / `parked skip` (src/outbox/admin.ts), DELETE and UPDATE by hand, a
// switch of OUTBOX_PARKED_POLICY, backoffs made due. Besides single random steps, the generator
// has a few building blocks for patterns that independent steps rarely line up (a late commit,
// two failed rows of an aggregate then a removal while sending, a backend terminated while a batch
// is sent and retention is busy).
//
// Checked after every step:
//   G1  every row in the sent table was acked by the publish of the batch that moved it there (the
//       same transaction; once, and is not in the outbox too); nothing vanished: every committed
//       row is in the outbox, in the sent table, or was deleted by hand.
//   G2  an invocation that returned normally left none of the rows it had acked out of the sent
//       table (unless an operator removed them); its summary's `published` agrees with the rows
//       moved (checked when every invocation of the step returned and no operator removed a row).
//   G4  per aggregate, at each row's FIRST publication (the broker appending it for the first
//       time), every row of the aggregate that precedes it has been published already, unless an
//       operator deleted or skipped it, or it is parked and the invocation's policy is `skip`.
//       "Precedes" is what docs/DESIGN.md ("Order, stated exactly") promises, commit order, made
//       exact: r1 precedes r2 when r1 committed no later than r2 (the same transaction, or an
//       earlier COMMIT) AND has the smaller seq. Both conditions matter: a relay that looks after
//       both committed sends them in seq order whatever their commit order (they became visible
//       together), and a row committed later may follow a row already sent whatever its seq; so a
//       pair whose commit and seq orders disagree may go either way, and every other pair must go
//       in that order. Under `hold` a parked row keeps its place; a row set not due by hand keeps
//       its place too (it is unsent: DESIGN's gap check, "a row set not due by hand ... stays a
//       possible gap").
//   G7  once its invocations returned, a relay client that was not abandoned has no transaction
//       open; and at the end of a run no client that was ended (replaced, abandoned) has a backend.
//   no spin: each invocation's claims are explained by its work (at most 2 per batch, 2 per row
//       held back, 3, and 2 per batch of the invocations beside it), an invocation that no fault
//       hit never ends for want of budget without having sent a batch, and a hard cap of
//       100 + 6 × rows claims ends a spinning invocation early (it counts as a failure).
//   failures: an invocation fails only with the relay's typed errors, and only when a fault hit
//       its relay or an operator's statement ran beside it; and nothing throws where nobody can
//       catch it (an uncaught exception or an unhandled rejection ends a Lambda process).
// And after the faults stop (the final phase: producers commit, every parked row retried, every
// row made due, the publisher acks all, one relay, the scenario's final policy): every committed
// row nobody deleted or skipped is in the sent table within rows + 5 invocations, none failing or
// spinning.
//
// On failure fast-check prints the seed, the path and the shrunk scenario (as data, and the
// harness's error prints it step by step with a trace, its first line the table's shape and the
// settings). Replay with FC_SEED=<seed> FC_PATH=<path>;
// FC_NUM_RUNS overrides the number of runs (25), FC_TIME_LIMIT_MS the time the property may take
// (180 s, runs and shrinking; fewer runs by then fails), FC_TRACE=<file> appends every run's trace to a file,
// FC_KEEP_TABLES=1 keeps each run's table. The counterexamples found so far are replayed literally
// by the regression tests at the end, with the scenarios written for the defects known when this
// file was written (d8f18b5).
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import postgres, { type Sql } from 'postgres';
import type { ParkedPolicy } from '../../src/domain.ts';
import { ADMIN_DATABASE_URL, DATABASE_URL, runScenario, terminateLeftovers, uncaught, type Action, type Fault, type InvocationSpec, type InvokeStep, type Outcome, type Scenario, type Settings, type Shape, type Step } from './model-harness.ts';

const env = process.env;
const NUM_RUNS = env.FC_NUM_RUNS ? Number(env.FC_NUM_RUNS) : 25;
// 25 runs took 38 s alone and 61 s beside two busy cores (the load of three test files on two
// cores): the limit leaves three times that, and a run that does not finish them fails. Drawing
// the table's shape and the settings (half the runs partitioned, rebuilt per run) cost nothing
// measurable: 21-32 s alone on a 2-core machine, 33 s before (the whole file 72-84 s, 80 s before)
const TIME_LIMIT_MS = env.FC_TIME_LIMIT_MS ? Number(env.FC_TIME_LIMIT_MS) : 180_000;

let sql: Sql;
let runnerRejectionListeners: NodeJS.UnhandledRejectionListener[] = [];
const onUnhandledRejection = (reason: unknown) => uncaught(reason, 'an unhandled rejection');
let admin: Sql;

before(() => {
  // an uncaught exception (postgres.js's from its write loop) fails the run that caused it, not the file
  process.setUncaughtExceptionCaptureCallback(uncaught);
  // likewise an unhandled rejection (Node's default, and Lambda's runtime, end the process on one);
  // node:test's own listener would fail the whole file instead of the run
  runnerRejectionListeners = process.listeners('unhandledRejection');
  process.removeAllListeners('unhandledRejection');
  process.on('unhandledRejection', onUnhandledRejection);
  sql = postgres(DATABASE_URL, { max: 8, onnotice: () => undefined });
  admin = postgres(ADMIN_DATABASE_URL, { max: 2, onnotice: () => undefined });
});

after(async () => {
  process.setUncaughtExceptionCaptureCallback(null);
  process.off('unhandledRejection', onUnhandledRejection);
  for (const l of runnerRejectionListeners) process.on('unhandledRejection', l);
  await terminateLeftovers(admin);
  await sql.end({ timeout: 5 });
  await admin.end({ timeout: 5 });
});

const run = (sc: Scenario) => runScenario(sc, { sql, admin, keepTable: env.FC_KEEP_TABLES === '1', traceFile: env.FC_TRACE });

// --- arbitraries ------------------------------------------------------------------------------

// mostly two aggregates, so that rows of one aggregate meet in claims, failures and late commits
const agg = fc.oneof({ weight: 3, arbitrary: fc.constantFrom<'a' | 'b'>('a', 'b') }, { weight: 1, arbitrary: fc.constant<'c'>('c') });
// mostly one topic; sometimes an aggregate's rows change topic (planBatch stops the aggregate there)
const aggType = fc.oneof({ weight: 4, arbitrary: fc.constant<'order'>('order') }, { weight: 1, arbitrary: fc.constant<'user'>('user') });
const txSlot = fc.constantFrom<0 | 1>(0, 1);
const pick = fc.nat({ max: 7 });

// now and then a row created a day ago (explicit created_at): the range shape's older partition
const old = fc.oneof({ weight: 2, arbitrary: fc.constant({}) }, { weight: 1, arbitrary: fc.constant({ old: true as const }) });
const action: fc.Arbitrary<Action> = fc.oneof(
  { weight: 6, arbitrary: fc.tuple(fc.record({ kind: fc.constant('insert' as const), agg, type: aggType, n: fc.integer({ min: 1, max: 3 }) }), old).map(([a, o]): Action => ({ ...a, ...o })) },
  { weight: 3, arbitrary: fc.tuple(fc.record({ kind: fc.constant('open' as const), tx: txSlot, agg, type: aggType, n: fc.integer({ min: 1, max: 2 }) }), old).map(([a, o]): Action => ({ ...a, ...o })) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('commit' as const), tx: txSlot }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('due' as const) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('notDue' as const), pick }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('delete' as const), pick }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('skip' as const), pick }) },
);

const operator: fc.Arbitrary<Step> = fc.oneof(
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('retry' as const), pick: fc.oneof(pick, fc.constant('all' as const)) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('reset' as const), pick }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('policy' as const), policy: fc.constantFrom<ParkedPolicy>('hold', 'skip') }) },
);

// now and then an answer that comes after the send deadline: lost (the broker appended, the relay never heard)
const delayMs = fc.oneof({ weight: 12, arbitrary: fc.constant(0) }, { weight: 3, arbitrary: fc.integer({ min: 5, max: 120 }) }, { weight: 1, arbitrary: fc.integer({ min: 700, max: 1_100 }) });
const outcome: fc.Arbitrary<Outcome> = fc.record({
  kind: fc.oneof(
    { weight: 4, arbitrary: fc.constant('ack' as const) },
    { weight: 2, arbitrary: fc.constant('reject' as const) },
    { weight: 1, arbitrary: fc.constant('rejectPermanent' as const) },
    { weight: 1, arbitrary: fc.constant('backoff' as const) },
    { weight: 1, arbitrary: fc.constant('unavailable' as const) },
  ),
  at: fc.nat({ max: 3 }),
  delayMs,
});

const invocation = (relay: 0 | 1 | 2): fc.Arbitrary<InvocationSpec> =>
  fc.record({ relay: fc.constant(relay), deadlineMs: fc.constantFrom(1_000, 1_500, 2_500), publishes: fc.array(outcome, { maxLength: 4 }) });

const fault: fc.Arbitrary<Fault> = fc.record({
  inv: fc.nat({ max: 2 }),
  at: fc.oneof(fc.record({ afterMs: fc.integer({ min: 0, max: 150 }) }), fc.record({ publish: fc.nat({ max: 2 }) })),
  target: fc.constantFrom<Fault['target']>('any', 'idle', 'intx', 'notBatch', 'newestBatch', 'all'),
  pick: fc.nat({ max: 3 }),
});

const invoke: fc.Arbitrary<InvokeStep> = fc.record({
  kind: fc.constant('invoke' as const),
  invocations: fc.oneof(
    { weight: 3, arbitrary: fc.tuple(invocation(0)) },
    { weight: 2, arbitrary: fc.tuple(invocation(0), invocation(1)) },
    { weight: 1, arbitrary: fc.tuple(invocation(0), invocation(1), invocation(2)) },
  ).map((t): InvocationSpec[] => [...t]),
  faults: fc.oneof({ weight: 3, arbitrary: fc.constant<Fault[]>([]) }, { weight: 1, arbitrary: fc.array(fault, { minLength: 1, maxLength: 1 }) }),
  side: fc.oneof({ weight: 2, arbitrary: fc.constant<InvokeStep['side']>([]) }, { weight: 1, arbitrary: fc.array(fc.record({ afterMs: fc.integer({ min: 0, max: 100 }), action }), { minLength: 1, maxLength: 2 }) }),
});

const step: fc.Arbitrary<Step> = fc.oneof({ weight: 6, arbitrary: action }, { weight: 2, arbitrary: operator }, { weight: 4, arbitrary: invoke });

// Patterns that independent random steps rarely line up, as building blocks of their own.
const oneRelay = (publishes: Outcome[], side: InvokeStep['side'] = [], faults: Fault[] = []): InvokeStep => ({ kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1_500, publishes }], faults, side });

// A row committed late: a transaction is opened on an aggregate, a later row of it is committed and
// relayed (maybe refused), then the transaction commits its lower seq (DESIGN "Order, stated exactly").
const lateCommit: fc.Arbitrary<Step[]> = fc
  .record({ tx: txSlot, agg, type: aggType, first: outcome })
  .map(({ tx, agg, type, first }): Step[] => [{ kind: 'open', tx, agg, type, n: 1 }, { kind: 'insert', agg, type, n: 1 }, oneRelay([first]), { kind: 'commit', tx }]);

// An operator removes or skips a row while the relay is sending another one (two removals of an
// aggregate's rows at once), and a producer adds a row behind them meanwhile.
const removeWhileSending: fc.Arbitrary<Step[]> = fc
  .record({
    agg,
    kind: fc.constantFrom<Outcome['kind']>('ack', 'reject'),
    delayMs: fc.integer({ min: 40, max: 120 }),
    removal: fc.oneof(fc.record({ kind: fc.constant('delete' as const), pick }), fc.record({ kind: fc.constant('skip' as const), pick })),
    removeAt: fc.integer({ min: 5, max: 35 }),
    insertAt: fc.integer({ min: 20, max: 60 }),
  })
  .map(({ agg, kind, delayMs, removal, removeAt, insertAt }): Step[] => [
    oneRelay([{ kind, at: 0, delayMs }], [{ afterMs: removeAt, action: removal }, { afterMs: insertAt, action: { kind: 'insert', agg, type: 'order', n: 1 } }]),
  ]);

// A backend of the relay terminated while its first batch is on its way, and the batch is not all acked.
const killWhileSending: fc.Arbitrary<Step[]> = fc
  .record({
    kind: fc.constantFrom<Outcome['kind']>('unavailable', 'backoff', 'reject'),
    target: fc.constantFrom<Fault['target']>('newestBatch', 'notBatch', 'idle', 'intx'),
    pick: fc.nat({ max: 3 }),
    waitMs: fc.constantFrom(0, 5, 15),
  })
  .map(({ kind, target, pick, waitMs }): Step[] => [oneRelay([{ kind, at: 0, delayMs: 0 }], [], [{ inv: 0, at: { publish: 0, waitMs }, target, pick }])]);

// Two failed rows in one aggregate, the later one parked or backing off, the earlier one (committed
// late, with the lower seq) due again, and a row waiting behind them: then a removal while sending.
const failuresThenRemoval: fc.Arbitrary<Step[]> = fc
  .record({ tx: txSlot, agg, second: fc.constantFrom<Outcome['kind']>('reject', 'rejectPermanent'), then: removeWhileSending })
  .map(({ tx, agg, second, then }): Step[] => [
    { kind: 'open', tx, agg, type: 'order', n: 1 },
    { kind: 'insert', agg, type: 'order', n: 1 },
    oneRelay([{ kind: second, at: 0, delayMs: 0 }]),
    { kind: 'commit', tx },
    oneRelay([{ kind: 'reject', at: 0, delayMs: 0 }]),
    { kind: 'insert', agg, type: 'order', n: 1 },
    oneRelay([]),
    { kind: 'due' },
    ...then,
  ]);

// Retention behind (old sent rows to delete in chunks beside the loop) when a backend is terminated
// while a batch is sent.
const killWhileRetentionBusy: fc.Arbitrary<Step[]> = fc
  .record({ n: fc.integer({ min: 6_000, max: 15_000 }), then: killWhileSending })
  .map(({ n, then }): Step[] => [{ kind: 'oldSent', n }, ...then]);

const steps: fc.Arbitrary<Step[]> = fc
  .array(
    fc.oneof(
      { weight: 14, arbitrary: step.map((s) => [s]) },
      { weight: 1, arbitrary: lateCommit },
      { weight: 1, arbitrary: removeWhileSending },
      { weight: 1, arbitrary: killWhileSending },
      { weight: 1, arbitrary: failuresThenRemoval },
      { weight: 1, arbitrary: killWhileRetentionBusy },
    ),
    {
    minLength: 3,
    maxLength: 16,
    size: 'medium',
  })
  .map((xs) => xs.flat());

// The table's shape: half the runs plain (a partitioned table costs a rebuild per run), the rest
// partitioned by range of created_at or by hash of a column the model varies.
const shape: fc.Arbitrary<Shape> = fc.oneof(
  { weight: 2, arbitrary: fc.constant<Shape>({ kind: 'plain' }) },
  { weight: 1, arbitrary: fc.constant<Shape>({ kind: 'range' }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('hash' as const), column: fc.constantFrom<'aggregateid' | 'seq'>('aggregateid', 'seq'), partitions: fc.constantFrom<2 | 3>(2, 3) }) },
);

// The settings that change the relay's statements or messages (Settings says how each reaches the code).
const settings: fc.Arbitrary<Settings> = fc.record({
  sentRows: fc.constantFrom<Settings['sentRows']>('keep', 'delete'),
  key: fc.constantFrom<Settings['key']>('aggregateid', 'id', 'type'),
  placement: fc.constantFrom<Settings['placement']>('default', 'none', 'type', 'created_at', 'tid'),
  metadata: fc.constantFrom<Settings['metadata']>('none', 'timestamp,seq', 'cloudevents'),
});

// the application's column `tid` can be placed only where it exists
const table = fc
  .record({ shape, appColumns: fc.boolean(), settings })
  .map((t): Pick<Scenario, 'shape' | 'appColumns' | 'settings'> => (t.settings.placement === 'tid' && !t.appColumns ? { ...t, settings: { ...t.settings, placement: 'created_at' } } : t));

const scenario: fc.Arbitrary<Scenario> = fc.tuple(table, fc.record({
  poolMax: fc.constantFrom<3 | 4>(3, 4),
  batchSize: fc.integer({ min: 1, max: 3 }),
  maxAttempts: fc.integer({ min: 1, max: 3 }),
  // short: rows come due again during a scenario; long: they wait for a `due` step
  backoffBaseMs: fc.constantFrom(30, 300, 60_000),
  policy: fc.constantFrom<ParkedPolicy>('hold', 'skip'),
  // a few rows first, so that the early (small) runs have something to relay
  steps: fc
    .tuple(fc.array(action.filter((a) => a.kind === 'insert' || a.kind === 'open'), { minLength: 1, maxLength: 3 }), steps)
    .map(([first, rest]): Step[] => [...first, ...rest]),
  finalPolicy: fc.constantFrom<ParkedPolicy>('hold', 'skip'),
})).map(([t, rest]): Scenario => ({ ...t, ...rest }));

// --- the property -----------------------------------------------------------------------------

describe('model: the real claim/mark SQL on the real Postgres, generated scenarios', () => {
  it(`G1, G2, G4, G7, no spin, and delivery once faults stop, on drawn table shapes and settings (${NUM_RUNS} cases, all of them run)`, async () => {
    await fc.assert(fc.asyncProperty(scenario, run), {
      numRuns: NUM_RUNS,
      ...(env.FC_SEED ? { seed: Number(env.FC_SEED) } : {}),
      ...(env.FC_PATH ? { path: env.FC_PATH } : {}),
      // each run (and each shrinking step) replays a whole scenario against the database: the whole,
      // runs and shrinking, stops after FC_TIME_LIMIT_MS (0: no limit). Fewer cases than NUM_RUNS
      // by then is a failure, not a pass; a shrink cut short reports what it has
      ...(TIME_LIMIT_MS > 0 ? { interruptAfterTimeLimit: TIME_LIMIT_MS, markInterruptAsFailure: true } : {}),
    });
  });
});

// --- regressions --------------------------------------------------------------------------------
//
// Each scenario below failed on d8f18b5 (the code when this file was written), and each is replayed
// with every check. Where the failure depends on timing (a backend terminated while the loop runs),
// the scenario is replayed up to `attempts` times, failing at the first violation: the number of
// attempts makes a miss on that code improbable (the rate measured there is given), and a fixed
// relay passes them all.

/** Replay a scenario up to `attempts` times; the first run with a violation fails the test. */
async function replay(sc: Scenario, attempts = 1): Promise<void> {
  for (let i = 0; i < attempts; i++) await run(sc);
}

describe('model: regressions, the shrunk counterexamples the property found', () => {
  // seed -1514808437. inv3 claimed until the claim cap: a1 was set not due by hand (attempts 0), so
  // it neither blocks its aggregate nor can be claimed, and every claim took a2, held it back
  // behind a1 and rolled back, until the budget was gone.
  it('no spin: a row set not due by hand before later rows of its aggregate (claim, hold back, roll back until the budget is gone)', () =>
    replay({
      poolMax: 3, batchSize: 1, maxAttempts: 1, backoffBaseMs: 30, policy: 'hold', finalPolicy: 'hold',
      steps: [
        { kind: 'insert', agg: 'a', type: 'order', n: 1 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [] }, { relay: 1, deadlineMs: 1000, publishes: [] }, { relay: 2, deadlineMs: 1000, publishes: [] }], faults: [], side: [{ afterMs: 0, action: { kind: 'notDue', pick: 0 } }] },
        { kind: 'insert', agg: 'a', type: 'order', n: 1 },
        { kind: 'open', tx: 0, agg: 'a', type: 'user', n: 1 },
        { kind: 'insert', agg: 'a', type: 'user', n: 1 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'reject', at: 0, delayMs: 0 }] }], faults: [], side: [] },
        { kind: 'commit', tx: 0 },
        { kind: 'reset', pick: 0 },
      ],
    }));

  // seed 886165452 (found with the two other crashes tolerated, to see past them). On d8f18b5
  // (4 of 8 replays): the batch's own backend terminated while it was sent, its connection
  // released to the pool anyway, and retention's next `sql.begin` wrote to the closed socket:
  // postgres.js 3.4.9 throws an uncatchable TypeError from nextWrite (porsager/postgres#1208). The
  // same happens when retention's or the waiting marks' own transaction loses its backend:
  // postgres.js's begin() writes its `rollback` to the closed socket. Fixed by running those on a
  // connection of their own, ended as a batch's is (src/outbox/side-tx.ts).
  it('no crash: a relay backend terminated while a batch is sent and retention runs beside it', () =>
    replay(
      {
        poolMax: 3, batchSize: 1, maxAttempts: 1, backoffBaseMs: 30, policy: 'hold', finalPolicy: 'hold',
        steps: [
          { kind: 'insert', agg: 'c', type: 'order', n: 1 },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'unavailable', at: 0, delayMs: 0 }] }], faults: [{ inv: 0, at: { publish: 0 }, target: 'newestBatch', pick: 0 }], side: [] },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [] }], faults: [], side: [] },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'unavailable', at: 0, delayMs: 0 }] }], faults: [{ inv: 0, at: { publish: 0 }, target: 'notBatch', pick: 0 }], side: [] },
        ],
      },
      6,
    ));

  // seed 421313792 (the TypeError tolerated, to see past it). A backend terminated (or the client
  // ended) while postgres.js fetches the array types on a connection it has just opened: its
  // fetchArrayTypes() is an async function nobody awaits, so the error is an unhandled rejection,
  // which ends the process (Node's default; Lambda's runtime too). 2 of 8 replays on d8f18b5, and
  // on d842934 too. Fixed by not fetching them at all (src/outbox/client.ts).
  it('no crash: a relay backend terminated while its client opens a connection (postgres.js fetching the array types)', () =>
    replay(
      {
        poolMax: 3, batchSize: 1, maxAttempts: 1, backoffBaseMs: 30, policy: 'hold', finalPolicy: 'hold',
        steps: [
          { kind: 'insert', agg: 'c', type: 'order', n: 1 },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'unavailable', at: 0, delayMs: 0 }] }], faults: [{ inv: 0, at: { publish: 0 }, target: 'notBatch', pick: 0 }], side: [] },
          { kind: 'insert', agg: 'a', type: 'order', n: 1 },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [] }], faults: [], side: [{ afterMs: 0, action: { kind: 'insert', agg: 'a', type: 'order', n: 1 } }] },
          { kind: 'retry', pick: 'all' },
        ],
      },
      12,
    ));
});

describe('model: regressions found by the property with crashes tolerated (to see past them)', () => {
  // seed 1448315494 on d8f18b5 (crashes and spins tolerated in an exploratory run). Retention behind
  // (old sent rows), a backend of the relay that is not a batch's terminated while a1's batch is
  // sent, the broker unavailable: the batch's ROLLBACK was skipped, its connection pooled inside the
  // transaction, and retention's next chunk committed the premark: a1 in the sent table, never
  // acked (3 of 10 replays there, and the TypeError crash in 3 more). On 1b8177b with its
  // uncommitted store.ts G1 holds, but when the backend terminated is retention's own, postgres.js's
  // begin() writes its rollback to the closed socket: the TypeError.
  it('G1: no row is marked sent by a pooled transaction after a connection of the client closed', () =>
    replay(
      {
        poolMax: 3, batchSize: 1, maxAttempts: 1, backoffBaseMs: 30, policy: 'hold', finalPolicy: 'skip',
        steps: [
          { kind: 'insert', agg: 'a', type: 'order', n: 1 },
          { kind: 'insert', agg: 'a', type: 'order', n: 1 },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [{ kind: 'backoff', at: 0, delayMs: 0 }] }, { relay: 1, deadlineMs: 1000, publishes: [] }], faults: [], side: [] },
          { kind: 'oldSent', n: 10_008 },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'unavailable', at: 0, delayMs: 0 }] }], faults: [{ inv: 0, at: { publish: 0, waitMs: 0 }, target: 'notBatch', pick: 2 }], side: [] },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [{ kind: 'ack', at: 2, delayMs: 5 }, { kind: 'reject', at: 0, delayMs: 0 }, { kind: 'ack', at: 3, delayMs: 0 }] }], faults: [], side: [] },
          { kind: 'due' },
        ],
      },
      6,
    ));
});

describe('model: targeted scenarios, written in the model\'s steps for the defects known on d8f18b5', () => {
  // Retention busy (old sent rows), a batch premarked and sent, the claim ahead's backend
  // terminated, the broker unavailable: the batch's ROLLBACK was skipped (the client had lost a
  // connection), its connection went back to the pool inside the transaction, and retention's next
  // chunk (`sql.begin`) committed the premark: a1 in the sent table, never acked. The claim ahead's
  // closed connection, released too, then crashed the process (the TypeError above). On d8f18b5
  // 7 of 8 replays failed, 1 of 8 with G1 itself.
  it('G1: a batch whose ROLLBACK was skipped after another connection of the client closed never has its premarks committed by the pool', () =>
    replay(
      {
        poolMax: 3, batchSize: 1, maxAttempts: 3, backoffBaseMs: 60_000, policy: 'hold', finalPolicy: 'hold',
        steps: [
          { kind: 'insert', agg: 'a', type: 'order', n: 3 },
          { kind: 'insert', agg: 'b', type: 'order', n: 3 },
          { kind: 'oldSent', n: 15_000 },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'unavailable', at: 0, delayMs: 0 }] }], faults: [{ inv: 0, at: { publish: 0, waitMs: 5 }, target: 'newestBatch', pick: 0 }], side: [] },
        ],
      },
      5,
    ));

  // a1 acked by a batch whose backend is terminated while it is sent (its marks never commit), then
  // refused by the next invocation's batch: only that batch's failure may be recorded. A mark of it
  // there would pass a check of "acked at some point"; G1 asks "acked by the batch that marked it".
  it('G1: a row acked by a batch that could not commit, then refused by the next batch, is not marked sent by that batch', () =>
    replay({
      poolMax: 3, batchSize: 1, maxAttempts: 3, backoffBaseMs: 60_000, policy: 'hold', finalPolicy: 'hold',
      steps: [
        { kind: 'insert', agg: 'a', type: 'order', n: 1 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'ack', at: 0, delayMs: 0 }] }], faults: [{ inv: 0, at: { publish: 0 }, target: 'newestBatch', pick: 0 }], side: [] },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'reject', at: 0, delayMs: 0 }] }], faults: [], side: [] },
      ],
    }));

  // a2 failed and backs off; a1, committed late with the lower seq, then fails too, and the marking
  // of a1's aggregate marks a2, a failed row, waiting. a1 is deleted by hand: the trigger clears
  // the marks below the first failed row left, a2, not a2's own. Once a2 is due it cannot be
  // claimed (waiting), and a3, committed meanwhile, is claimed, held back behind a2 and rolled
  // back, again and again until the claim cap (every replay on d8f18b5).
  it('no spin: a failed row marked waiting stays unclaimable once due, and a newer row of its aggregate is claimed and held back behind it in a loop', () =>
    replay({
      poolMax: 4, batchSize: 1, maxAttempts: 3, backoffBaseMs: 300, policy: 'hold', finalPolicy: 'hold',
      steps: [
        { kind: 'open', tx: 0, agg: 'a', type: 'order', n: 1 },
        { kind: 'insert', agg: 'a', type: 'order', n: 1 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [{ kind: 'reject', at: 0, delayMs: 0 }] }], faults: [], side: [] },
        { kind: 'commit', tx: 0 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [{ kind: 'reject', at: 0, delayMs: 0 }] }], faults: [], side: [] },
        { kind: 'delete', pick: 0 },
        { kind: 'insert', agg: 'b', type: 'order', n: 4 },
        {
          kind: 'invoke',
          invocations: [{ relay: 0, deadlineMs: 2500, publishes: [{ kind: 'ack', at: 0, delayMs: 100 }, { kind: 'ack', at: 0, delayMs: 100 }, { kind: 'ack', at: 0, delayMs: 100 }, { kind: 'ack', at: 0, delayMs: 100 }] }],
          faults: [],
          side: [{ afterMs: 250, action: { kind: 'insert', agg: 'a', type: 'order', n: 1 } }],
        },
      ],
    }));

  // a2 parked (hold) and a1 (committed late, lower seq) backing off; a3 marked waiting behind them.
  // a1 made due and sent while an operator deletes a2: two removals at once, each statement's
  // trigger sees the other's row still there, and a3's mark outlives both, with no failed row left
  // in its aggregate. The claim probes the waiting rows only of aggregates with a failed row that
  // no longer blocks, so a4, committed during the send, passed a3 (every replay on d8f18b5).
  it('G4: stale waiting marks with no failed row in their aggregate (two removals at once) never let a newer row pass', () =>
    replay({
      poolMax: 4, batchSize: 1, maxAttempts: 3, backoffBaseMs: 60_000, policy: 'hold', finalPolicy: 'hold',
      steps: [
        { kind: 'open', tx: 0, agg: 'a', type: 'order', n: 1 },
        { kind: 'insert', agg: 'a', type: 'order', n: 1 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [{ kind: 'rejectPermanent', at: 0, delayMs: 0 }] }], faults: [], side: [] },
        { kind: 'commit', tx: 0 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [{ kind: 'reject', at: 0, delayMs: 0 }] }], faults: [], side: [] },
        { kind: 'insert', agg: 'a', type: 'order', n: 1 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1000, publishes: [] }], faults: [], side: [] },
        { kind: 'due' },
        {
          kind: 'invoke',
          invocations: [{ relay: 0, deadlineMs: 2000, publishes: [{ kind: 'ack', at: 0, delayMs: 80 }] }],
          faults: [],
          side: [{ afterMs: 20, action: { kind: 'delete', pick: 1 } }, { afterMs: 40, action: { kind: 'insert', agg: 'a', type: 'order', n: 1 } }],
        },
      ],
    }));
});

describe('model: targeted scenarios on the drawn table shapes and settings', () => {
  // Two rows at the same ctid, (0,1), one in each partition of the range shape: a1 created a day
  // ago (the older partition), b1 now. A batch of one takes a1 and is acked; a mark that named rows
  // by ctid alone (unchecked) moved b1 too, never acked (G1), as the property found in 3 runs
  // (seed 1446244508) with the mark so broken.
  it('G1: on a table partitioned by range, the mark of a batch moves its own row, not the other partition\'s row at the same ctid (both modes)', async () => {
    for (const sentRows of ['keep', 'delete'] as const) {
      await run({
        shape: { kind: 'range' }, appColumns: false, settings: { sentRows, key: 'aggregateid', placement: 'default', metadata: 'none' },
        poolMax: 3, batchSize: 1, maxAttempts: 3, backoffBaseMs: 60_000, policy: 'hold', finalPolicy: 'hold',
        steps: [
          { kind: 'insert', agg: 'a', type: 'order', n: 1, old: true },
          { kind: 'insert', agg: 'b', type: 'order', n: 1 },
          { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'ack', at: 0, delayMs: 0 }, { kind: 'reject', at: 0, delayMs: 0 }] }], faults: [], side: [] },
        ],
      });
    }
  });

  // A batch over three hash partitions (by seq), with a refusal (a failure recorded by address) and
  // the application's columns named like the statements' aliases (tid, rel, ...; the claim must name
  // its own columns), the metadata and a placed application column read by the claim. Seen red with
  // the mark by ctid alone (b1, in another partition, moved unacked) and with the candidates
  // selecting `r.tableoid AS rel, r.ctid AS tid, *` (column reference "created_epoch" is
  // ambiguous; the property found that one in its first run, seed -790428882: "rel" is ambiguous).
  it('G1/G4: on a table partitioned by hash with the application\'s columns named like the aliases, a batch over several partitions is marked and charged by address', () =>
    run({
      shape: { kind: 'hash', column: 'seq', partitions: 3 }, appColumns: true, settings: { sentRows: 'keep', key: 'id', placement: 'tid', metadata: 'cloudevents' },
      poolMax: 3, batchSize: 3, maxAttempts: 3, backoffBaseMs: 30, policy: 'hold', finalPolicy: 'hold',
      steps: [
        { kind: 'insert', agg: 'a', type: 'order', n: 1 },
        { kind: 'insert', agg: 'b', type: 'order', n: 1, old: true },
        { kind: 'insert', agg: 'c', type: 'order', n: 1 },
        { kind: 'insert', agg: 'a', type: 'order', n: 1 },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [{ kind: 'reject', at: 1, delayMs: 0 }] }], faults: [], side: [] },
        { kind: 'due' },
        { kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 1500, publishes: [] }], faults: [], side: [] },
      ],
    }));
});
