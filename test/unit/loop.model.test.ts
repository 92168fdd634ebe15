// Model-based tests of the invocation loop (src/relay.ts, runInvocation) against in-memory fakes
// of its ports (test/unit/fakes/outbox.ts says what they model and what not). fast-check
// generates outbox tables, batch sizes, latencies of the process and of the server (interleavings:
// a COMMIT is applied when the server gets to it, after what was sent before it on its
// connection), faults at every step of the loop (claim, sends, premark, COMMIT, its answer, the
// next claim, a ROLLBACK that fails with its connection, hangs or answers after its grace, ...)
// and a crash at any operation; after every run, and at a crash once the server has run what the
// dead process had sent (a COMMIT sent before the death is committed), the guarantees are checked
// on the fake database's committed state and the fake broker's acks:
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
//   with the committed state; the stop reason is true; no transaction is left open, by the loop
//   or on the server (a connection that goes back to the pool inside its transaction keeps it
//   open, with its locks and writes, and the next transaction on that connection would commit
//   them); the loop uses the ports as specified (no statement on an ended transaction, every row
//   published is held by an open transaction, no transaction's writes committed by another's
//   COMMIT).
//
// The fake's batch transactions copy BatchTx's handling of its connection (UNCONFIRMED_END).
// BatchTx before 3583737 released a connection whose ROLLBACK was skipped (the client poisoned) or
// not answered, and one whose COMMIT went unanswered: with MODEL_UNCONFIRMED_END=release the
// properties find it, and a scenario below shows it each run.
//
// Linger mode (OUTBOX_IDLE=linger, src/loop/idle.ts) has properties of its own, the same checks
// on runs where producers commit rows while the invocation runs (at generated times, and right
// between two of the loop's statements), woken by NOTIFY or by the probe, with the probe and
// LISTEN failing, hanging, slow or lost besides the other faults; and more: no batch starts
// within the batch reserve, the invocation lingers until only that reserve is left, the LISTEN is
// closed, wake-ups have causes, and without faults every row committed before the wait's end is
// delivered by the time the run returns (checkLinger, checkLingerLiveness). Those runs take real
// time (about their 1-1.3 s deadline each): few of them, side by side. Polling's one bounded
// delay (a row committed before a wait's first probe waits for RECLAIM_MS) is excused by the
// liveness check and checked by a scenario of its own (see "a bound, not a promptness").
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
import { RECLAIM_MS } from '../../src/loop/idle.ts';
import { runInvocation, type Summary } from '../../src/relay.ts';
import { FakePublisher, FakeStore, ROLLBACK_GRACE_MS, World, firstBlocked, type LateCommit, type RacingRows, type PublishFault, type RowSpec, type RowState, type StoreFault, type UnconfirmedEnd, type WorldPlan } from './fakes/outbox.ts';

/**
 * G5's margin. In production a failed invocation may outlive its deadline by BatchTx.rollback's
 * own grace (deadlineFree: 2 000 ms for a ROLLBACK that no longer answers; ROLLBACK_GRACE_MS in
 * the fake, added when a rollback hung). Otherwise the fake rollback answers within a few turns,
 * so the loop itself must settle within a few event-loop turns of the deadline; 100 ms leaves
 * room for timer granularity on a loaded machine.
 */
const G5_MARGIN_MS = 100;
/** how long after the deadline a run counts as hung (a G5 failure rather than a stuck test) */
const WATCHDOG_MS = 1_000;
/** deadline of the runs without hangs: never reached, the fakes answer within event-loop turns */
const ROOMY_DEADLINE_MS = 5_000;

// Linger mode (src/loop/idle.ts). A lingering run lasts about its deadline in real time, so these
// runs are few and short: 1 000-1 300 ms budgets, of which the loop keeps the last batch's
// reserve (src/budget.ts BUDGET: 2 × max(50 ms, slowest recent batch) + markReserveMs = 500 ms, so at
// least 600 ms) for the batch a wake-up may start; the few hundred ms before that are the wait.
// Below RECLAIM_MS, so no periodic claim: every wake-up after the first LISTEN is a NOTIFY's or a
// probe's.
const LINGER_DEADLINE_MS = { min: 1_000, max: 1_300 };
/** src/budget.ts BUDGET's batchFloorMs and markReserveMs; the reserve is batchesReserved (2) × max(floor, slowest batch) + markReserveMs */
const BATCH_FLOOR_MS = 50;
const MARK_RESERVE_MS = 500;
const MIN_RESERVE_MS = 2 * BATCH_FLOOR_MS + MARK_RESERVE_MS;
/** clocks (Date.now()'s whole ms) and the event-loop turns between a budget check and the statement it lets through */
const TIMING_TOL_MS = 30;
/**
 * linger liveness: a NOTIFY wakes the wait in the event-loop turn of the commit (only the clocks'
 * whole ms between them); a probe's timer can fire late on a loaded machine, so the poll bound
 * is loose and the probes that did run are counted too
 */
const NOTIFY_SLACK_MS = 10;
const POLL_SLACK_MS = 100;
/** the stops after which linger mode waits for new rows (relay.ts, LINGERS_AFTER) */
const LINGERS_AFTER: ReadonlySet<Summary['stoppedBecause']> = new Set(['empty', 'behind-failed-rows', 'locked', 'behind-foreign-locks', 'topics-backed-off']);

interface Scenario extends WorldPlan {
  batchSize: number;
  maxAttempts: number;
  deadlineMs: number;
  /** OUTBOX_IDLE=linger with this OUTBOX_WAKE and OUTBOX_POLL_MS; absent: exit */
  linger?: { wake: 'notify' | 'poll'; pollMs: number };
  /** OUTBOX_BACKOFF_BASE_MS; absent: the default (1 s) */
  backoffBaseMs?: number;
}

type Ending =
  | { kind: 'returned'; summary: Summary; elapsedMs: number }
  | { kind: 'rejected'; error: unknown; elapsedMs: number }
  | { kind: 'crashed' }
  | { kind: 'hung' };

const logger = createLogger('error', {}, () => undefined);

/**
 * How the fake's batch transactions end one whose end the server has not confirmed, copied from
 * BatchTx (fakes/outbox.ts, UnconfirmedEnd): 'abandon' is BatchTx as it is; 'release' is BatchTx
 * before 3583737. MODEL_UNCONFIRMED_END=release runs the model on the old code, to see it fail.
 */
const UNCONFIRMED_END: UnconfirmedEnd = process.env.MODEL_UNCONFIRMED_END === 'release' ? 'release' : 'abandon';

/** `deadlineAt`: the deadline in the world's time (World.now()) */
async function run(sc: Scenario, unconfirmedEnd = UNCONFIRMED_END): Promise<{ world: World; ending: Ending; deadlineAt: number }> {
  const world = new World(sc);
  const config = loadConfig({
    DATABASE_URL: 'postgres://x@y/z',
    KAFKA_BROKERS: 'k:9092',
    OUTBOX_BATCH_SIZE: String(sc.batchSize),
    OUTBOX_MAX_ATTEMPTS: String(sc.maxAttempts),
    // the per-row override 'outbox.audit' (rowsArb) is inside it; the template's own start, outbox.event., is not
    OUTBOX_TOPIC_PREFIX: 'outbox.',
    ...(sc.linger ? { OUTBOX_IDLE: 'linger', OUTBOX_WAKE: sc.linger.wake, OUTBOX_POLL_MS: String(sc.linger.pollMs) } : {}),
    ...(sc.backoffBaseMs ? { OUTBOX_BACKOFF_BASE_MS: String(sc.backoffBaseMs) } : {}),
  }).outbox;
  const deadline = Deadline.fromRemaining(sc.deadlineMs, 0);
  const deadlineAt = world.now() + (deadline.at - Date.now());
  const t0 = performance.now();
  const store = new FakeStore(world, unconfirmedEnd);
  // before 3583737 the loop did not look at the client's state before publishing a batch claimed
  // ahead (Store.unusable): the 'release' mirror hides it from the loop, as the code then was
  const loopStore = unconfirmedEnd === 'release' ? new Proxy(store, {
          get: (target, key) => {
            if (key === 'unusable') return () => undefined;
            const value = Reflect.get(target, key, target) as unknown;
            return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
          },
        }) : store;
  const relay = runInvocation({ store: loopStore, publisher: new FakePublisher(world, store), config, logger, random: () => 0.5 }, deadline).then(
    (summary): Ending => ({ kind: 'returned', summary, elapsedMs: performance.now() - t0 }),
    (error: unknown): Ending => ({ kind: 'rejected', error, elapsedMs: performance.now() - t0 }),
  );
  let watchdog: NodeJS.Timeout | undefined;
  const hung = new Promise<Ending>((resolve) => (watchdog = setTimeout(() => resolve({ kind: 'hung' }), sc.deadlineMs + WATCHDOG_MS)));
  try {
    // a crash abandons the run: its promises never settle, and hold no timer
    const ending = await Promise.race([relay, world.died.then((): Ending => ({ kind: 'crashed' })), hung]);
    // the server runs what it was sent, dead process or not (a COMMIT written before the death
    // commits); it then sees a dead process's connections close
    if (world.dead) await world.afterDeath();
    else await world.serverIdle();
    return { world, ending: world.dead ? { kind: 'crashed' } : ending, deadlineAt };
  } finally {
    clearTimeout(watchdog);
    world.stopInserting();
  }
}

function fail(world: World, message: string): never {
  assert.fail(`${message}\n  last operations (#n: operation, ✝: the crash):\n  ${world.tail(40)}`);
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

/** G5, no leftovers, and what the run reported agrees with the committed state. `deadlineAt`: the deadline in the world's time. */
function checkEnding(sc: Scenario, world: World, ending: Ending, deadlineAt = Infinity): void {
  if (ending.kind === 'crashed') return;
  if (ending.kind === 'hung') fail(world, `G5 violated: runInvocation had not settled ${WATCHDOG_MS} ms after its ${sc.deadlineMs} ms deadline`);
  const margin = G5_MARGIN_MS + (world.fired.includes('rollback:hang') || world.fired.includes('rollback:slow') ? ROLLBACK_GRACE_MS : 0);
  if (ending.elapsedMs > sc.deadlineMs + margin) fail(world, `G5 violated: runInvocation took ${Math.round(ending.elapsedMs)} ms, deadline ${sc.deadlineMs} ms + margin ${margin} ms`);
  const open = world.openTransactions();
  if (open.length > 0) fail(world, `transactions left open after the run (${ending.kind}): ${open.map((t) => `tx${t.id}`).join(', ')}`);
  // on the server: the client ended every transaction, but a connection that went back to the pool
  // inside one keeps it open, with its locks and writes, until the connection closes
  const serverOpen = world.openServerTxs().filter((t) => !t.conn.closed);
  if (serverOpen.length > 0) {
    const how = (t: (typeof serverOpen)[number]) =>
      `s${t.id} on connection c${t.conn.id}${t.conn.stuck ? ' (which answers nothing more)' : ''}, begun by ${t.members.map((m) => `tx${m.id}${m.rolledBack ? (m.rollbackSent ? ' (ROLLBACK sent, not answered)' : ' (ROLLBACK never sent: the client was poisoned)') : ` (${m.state})`}`).join(', ')}`;
    fail(world, `transactions left open on the server after the run (${ending.kind}), holding their locks: ${serverOpen.map(how).join('; ')}; the connection was released (back to the pool) instead of closed`);
  }
  const relayLocks = [...world.aggregateLocks.values(), ...[...world.rowLocks.values()].filter((h) => h > 0)];
  if (relayLocks.length > 0) fail(world, `locks left held after the run: transactions ${[...new Set(relayLocks)].join(', ')}`);

  if (ending.kind === 'rejected') {
    const { error } = ending;
    if (!(error instanceof DatabaseError)) fail(world, `the run rejected with something else than a DatabaseError: ${String(error)}`);
    const summary = (error as DatabaseError & { summary?: Summary }).summary;
    if (summary?.stoppedBecause !== 'database-error') fail(world, `a DatabaseError without its summary (stoppedBecause 'database-error'): ${error.message}`);
    // a LISTEN that fails, hangs or is lost falls back to polling: it never fails the invocation
    const explains = (f: string) => f.includes(':') && !f.startsWith('premark:recoverable') && !f.startsWith('prune:') && !f.startsWith('listen:');
    // (a rollback that fails or hangs explains one: it poisons the client, or closes a connection)
    if (!world.fired.some(explains)) fail(world, `the run failed without a database fault that could explain it: ${error.message}`);
    return;
  }

  const { summary } = ending;
  const rows = world.sortedRows();
  const sent = rows.filter((r) => r.sent).length;
  if (summary.published !== sent) fail(world, `summary.published = ${summary.published}, but ${sent} rows are committed as sent`);
  const parked = world.committedFailures.filter((f) => f.park).length;
  const retried = world.committedFailures.length - parked;
  if (summary.parked !== parked || summary.retried !== retried) fail(world, `summary parked/retried = ${summary.parked}/${summary.retried}, committed failures say ${parked}/${retried}`);

  // The stop reason is true. It is the last stop's: in linger mode, that of the last claim before
  // the wait that ran out of budget, so it speaks of the table as that claim and its
  // nothingClaimable saw it, not of rows committed since. The three reasons decided by
  // nothingClaimable are checked against the table it saw (its rows, its clock); an empty claim
  // followed by a nothingClaimable that found claimable rows says 'locked', which is also what a
  // row committed (or a backoff ended) between the two statements looks like.
  const why = world.whyEmpties.at(-1);
  const seen = rows.filter((r) => why !== undefined && r.seq <= why.rowsSeen);
  const pending = seen.filter((r) => !r.sent && !r.parked);
  const blocked = firstBlocked(seen, why?.now ?? Date.now());
  const foreign = sc.foreignLocked.some((i) => i < sc.rows.length);
  const claimBefore = why && world.claims.filter((c) => c.at <= why.at).at(-1);
  const raced = why !== undefined && claimBefore !== undefined && (why.rowsSeen > claimBefore.rowsSeen || seen.some((r) => r.nextAttemptAt > claimBefore.now && r.nextAttemptAt <= why.now));
  const truth: Record<Summary['stoppedBecause'], () => boolean> = {
    empty: () => why !== undefined && pending.length === 0,
    'behind-failed-rows': () => pending.length > 0 && pending.every((r) => r.nextAttemptAt > why!.now || (blocked.get(r.aggregateid) ?? Infinity) < r.seq),
    locked: () => foreign || raced,
    'behind-foreign-locks': () => foreign && summary.heldBack > 0,
    'topics-backed-off': () => summary.topicsBackedOff.length > 0 && world.fired.includes('backoff'),
    // in linger mode a wait ends without a stop of its own: 'budget' comes only from a batch that
    // ended with less than the batch reserve left (or a claim that found only waiting rows then)
    budget: () => (sc.linger ? Math.max(...world.txs.map((t) => t.endedAt ?? -Infinity)) >= lingerWindow(world, deadlineAt).until - TIMING_TOL_MS : sc.deadlineMs < ROOMY_DEADLINE_MS),
    'broker-unavailable': () => world.fired.some((f) => f === 'unavailable' || f === 'limits' || f === 'publish-hang'),
    'database-error': () => false,
  };
  if (!truth[summary.stoppedBecause]()) {
    fail(world, `stoppedBecause '${summary.stoppedBecause}' is not true of the outcome (pending: [${pending.map((r) => r.seq).join(',')}], faults fired: [${world.fired.join(', ')}])`);
  }
}

/**
 * Without faults: every row was acked at most once, committed sent exactly when acked, and every
 * row `owed` (all of them in exit mode; in linger mode those committed early enough) was sent,
 * unless a foreign lock held it back. Rows of an aggregate from its first foreign-locked row on
 * wait. The others are all sent, except that an aggregate found waiting behind a foreign lock is
 * left out of the invocation's later claims (stuckAggregates) as a whole: its rows before the
 * lock that the batch could not send (they wait behind a change of topic, plan.ts) wait for the
 * next invocation too.
 */
function checkDelivered(sc: Scenario, world: World, owed: (r: RowState) => boolean): { acks: string[]; stuck: Set<string>; firstForeign: Map<string, number> } {
  // foreignLocked indexes the initial rows (World locks no other)
  const locked = sc.foreignLocked.filter((i) => i < sc.rows.length);
  const firstForeign = new Map<string, number>();
  for (const i of [...locked].sort((a, b) => a - b)) {
    const r = world.rows.get(i + 1);
    if (r && !firstForeign.has(r.aggregateid)) firstForeign.set(r.aggregateid, r.seq);
  }
  const rows = world.sortedRows();
  // a row the claim can take behind a foreign-locked one: its aggregate is found stuck
  const foreignSeqs = new Set(locked.map((i) => i + 1));
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
    if (sent || !owed(r)) continue;
    const previous = rows.filter((o) => o.aggregateid === r.aggregateid && o.seq < r.seq).at(-1);
    const excused = stuck.has(r.aggregateid) && previous?.sent === true && (previous.topic ?? '') !== (r.topic ?? '');
    if (!excused && !rows.some((o) => o.aggregateid === r.aggregateid && o.seq < r.seq && !o.sent)) {
      const when = world.insertedAt.get(r.seq) ? ` (committed at ${Math.round(world.insertedAt.get(r.seq)!)} ms)` : '';
      fail(world, `row ${r.seq} of ${r.aggregateid}${when} was never sent, though nothing held it back`);
    }
  }
  return { acks, stuck, firstForeign };
}

/**
 * What lingering must not change, and what it adds, after every linger-mode run (and at a crash):
 * - a batch starts only with the reserve ahead of it: no claim (other than a claim ahead, which
 *   is discarded when the budget check after its batch fails) begins within the smallest
 *   reserve (600 ms) of the deadline, lingering or not;
 * - a run that stopped for lack of rows waited until only a batch's reserve was left (it lingered);
 * - the LISTEN connection is closed when the run ends;
 * - wake-ups have causes: no periodic claim below RECLAIM_MS except the one after LISTEN is set
 *   up, no NOTIFY wake-up when polling, at most one wake-up per producer commit.
 */
function checkLinger(sc: Scenario, world: World, ending: Ending, deadlineAt: number): void {
  for (const c of world.claims) {
    // when the loop decided to claim: begin() is called in the same event-loop turn
    const { beganAt: at } = world.txs[c.tx - 1]!;
    if (c.ahead || deadlineAt - at >= MIN_RESERVE_MS - TIMING_TOL_MS) continue;
    fail(world, `tx${c.tx} began to claim ${Math.round(deadlineAt - at)} ms before the deadline, inside the smallest batch reserve (${MIN_RESERVE_MS} ms)`);
  }
  if (ending.kind === 'crashed' || ending.kind === 'hung') return;
  if (world.listeners.size > 0) fail(world, `the LISTEN connection is still open after the run (${ending.kind})`);
  if (ending.kind !== 'returned') return;
  const { summary } = ending;
  const { until } = lingerWindow(world, deadlineAt);
  const endedAt = deadlineAt - sc.deadlineMs + ending.elapsedMs;
  if (LINGERS_AFTER.has(summary.stoppedBecause) && endedAt < until - TIMING_TOL_MS) {
    fail(world, `stopped '${summary.stoppedBecause}' and returned ${Math.round(deadlineAt - endedAt)} ms before the deadline: it did not linger until only a batch's reserve (at most ${Math.round(deadlineAt - until)} ms) was left`);
  }
  const { notified, probe, reclaim } = summary.wakeups;
  // one claim right after each LISTEN set up before the wait's end, none after one set up inside
  // the smallest batch reserve (no batch starts there). `until` is the earliest the wait can end:
  // its reserve counts the run's slowest transaction, which may have come after the LISTEN and
  // so was unknown to the relay then (a send that hung after it, say); so a LISTEN past `until`
  // may still have been in time for the relay, and only one inside the smallest reserve is late
  // for certain
  const listenedInTime = world.listenedAt.filter((at) => at < until - TIMING_TOL_MS).length;
  const listenedLate = world.listenedAt.filter((at) => at > deadlineAt - MIN_RESERVE_MS + TIMING_TOL_MS).length;
  if (sc.deadlineMs < RECLAIM_MS && (reclaim < listenedInTime || reclaim > world.listenedAt.length - listenedLate)) {
    fail(world, `${reclaim} periodic claims (wakeups.reclaim) in a ${sc.deadlineMs} ms run, below RECLAIM_MS; expected one per LISTEN set up before the wait's end (${listenedInTime} in time, ${listenedLate} late, of ${world.listenedAt.length})`);
  }
  if (sc.linger?.wake === 'poll' && notified > 0) fail(world, `polling, yet ${notified} NOTIFY wake-ups`);
  if (notified + probe > world.lateCommits.length) fail(world, `${notified} NOTIFY and ${probe} probe wake-ups for ${world.lateCommits.length} producer commits`);
}

/** `until`: the earliest a wait can end (the deadline less the largest reserve the loop can have computed, from the slowest transaction) */
function lingerWindow(world: World, deadlineAt: number): { until: number } {
  const slowestTx = Math.max(0, ...world.txs.map((t) => (t.endedAt ?? world.now()) - t.beganAt));
  return { until: deadlineAt - (2 * Math.max(BATCH_FLOOR_MS, slowestTx + TIMING_TOL_MS) + MARK_RESERVE_MS) };
}

/**
 * Linger mode without faults (LISTEN may fail or be lost: it falls back to polling): every row
 * committed early enough was delivered and committed sent by the time the run returned. Early
 * enough, from idle.ts: the wait ends at `until` (the deadline less the batch reserve), and
 * - NOTIFY wakes it at once: a row committed while it waits is claimed right away; one committed
 *   while a batch is under way has a notification the next wait sees (a claim remembers the count
 *   it started at) or was seen by that batch's next claim. Owed: committed by `until` (less
 *   NOTIFY_SLACK_MS).
 * - polling sees a row at the first probe after its commit, at most OUTBOX_POLL_MS later; the
 *   probe must begin before `until`. Owed: committed by `until` - OUTBOX_POLL_MS (less
 *   POLL_SLACK_MS), or before a probe that began by `until` unless the loop then worked until
 *   its budget ran out (a row seen late may need more batches than the window has left).
 * RECLAIM_MS plays no part: the budgets are shorter. And the wake-ups say why: a row committed
 * while the invocation lingers after an empty claim wakes it by NOTIFY (notify mode) or by the
 * probe (poll mode, when that claim found nothing pending at all; see idle.ts on the first probe).
 */
function checkLingerLiveness(sc: Scenario, world: World, ending: Ending, deadlineAt: number): void {
  if (ending.kind !== 'returned') fail(world, `a linger run without faults ended ${ending.kind}`);
  const linger = sc.linger!;
  const { until } = lingerWindow(world, deadlineAt);
  const polled = linger.wake === 'poll' || world.fired.some((f) => f.startsWith('listen:'));
  const owedBy = polled ? until - linger.pollMs - POLL_SLACK_MS : until - NOTIFY_SLACK_MS;
  const probedAfter = (at: number) => polled && world.probes.some((p) => p.at > at && p.at <= until);
  // A probe just before `until` can reveal rows that need several batches in turn (batch size 1,
  // an aggregate's rows one after another), and only the batches that start before the window
  // closes run. So a row owed only through such a probe is excused when the loop was still
  // claiming when it ran out of time: it stopped for the budget, at the window's end, not before.
  const endedAt = deadlineAt - sc.deadlineMs + (ending.kind === 'returned' ? ending.elapsedMs : 0);
  const busyToTheEnd = ending.kind === 'returned' && ending.summary.stoppedBecause === 'budget' && endedAt >= until - TIMING_TOL_MS;
  const owed = (at: number) => at <= owedBy || (probedAfter(at) && !busyToTheEnd);
  checkDelivered(sc, world, (r) => owed(world.insertedAt.get(r.seq) ?? 0) && !takenForBaseline(world, r.seq));
  const { notified, probe } = ending.summary.wakeups;
  const after = (c: LateCommit) => world.steps[c.afterOp - 1]?.label;
  const lingering = world.lateCommits.filter((c) => c.how === 'timer' && c.at <= owedBy);
  if (linger.wake === 'notify' && !polled) {
    if (probe > 0) fail(world, `NOTIFY without a LISTEN fault, yet ${probe} probe wake-ups`);
    const heard = lingering.filter((c) => c.at > (world.listenedAt[0] ?? Infinity) && after(c) === 'nothingClaimable');
    if (heard.length > 0 && notified === 0) fail(world, `rows [${heard.flatMap((c) => c.seqs).join(',')}] were committed while the invocation waited, LISTENing, yet no NOTIFY woke it (wakeups.notified = 0)`);
  }
  if (linger.wake === 'poll') {
    const probed = lingering.filter((c) => world.whyEmpties.find((w) => w.op === c.afterOp)?.answer === 'empty');
    if (probed.length > 0 && probe === 0) fail(world, `rows [${probed.flatMap((c) => c.seqs).join(',')}] were committed while the invocation polled an empty table, yet no probe woke it (wakeups.probe = 0)`);
  }
}

// ---------------------------------------------------------------- a bound, not a promptness
//
// Polling (src/loop/idle.ts) learns of a row by seeing a seq above the newest one it saw when its
// wait began. A row committed after the last claim's snapshot and before that first probe is
// taken for an old one; the periodic claim (RECLAIM_MS) finds it. The liveness check excuses
// exactly that pattern, and the scenario "a row committed before the first probe" below checks
// the bound: the periodic claim delivers it.

/**
 * Polling: the first probe of a wait that began with rows pending but none news (since
 * 44d74a6: a stop 'behind-failed-rows', 'behind-foreign-locks' or 'topics-backed-off'; or a wait
 * whose LISTEN is lost) only learns where pending rows end. A row committed after the last
 * claim's snapshot and before that probe becomes the baseline: no probe ever sees it as new,
 * and it waits for the periodic claim (RECLAIM_MS) or a later commit. True of row `seq` if no
 * claim saw it and the first probe that saw it was the first of its wait.
 */
function takenForBaseline(world: World, seq: number): boolean {
  if (world.claims.some((c) => c.rowsSeen >= seq)) return false;
  const probe = world.probes.find((p) => p.rowsSeen >= seq);
  return probe !== undefined && world.steps[probe.op - 2]?.label !== 'newestPending';
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
    // a ROLLBACK's hang lasts its grace (ROLLBACK_GRACE_MS), not the deadline: in every fault run
    fc.record({ op: fc.constant('rollback'), call, kind: fc.constantFrom('fail', 'hang', 'slow') }),
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
    serverLatencies: latenciesArb,
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

/** a late row: like rowsArb's, on the same few aggregates, so it often waits behind an earlier row of its own */
function lateRowArb(illegalTopics: boolean): fc.Arbitrary<RowSpec> {
  const topic = fc.oneof(
    { weight: 6, arbitrary: fc.constant(null) },
    { weight: 2, arbitrary: fc.constant('outbox.audit') },
    ...(illegalTopics ? [{ weight: 1, arbitrary: fc.constant('not a topic!') }] : []),
  );
  return fc.record({ aggregate: fc.oneof(fc.nat(2), fc.nat(9)), topic, attempts: fc.nat(2) });
}

/**
 * Rows committed just before an operation: anywhere in the run, or right before one of the first
 * few ROLLBACKs, nothingClaimables, probes, LISTENs or begins (the windows between an empty
 * claim and the wait after it, and between a wait and the claim it wakes).
 */
function racingRowsArb(ops: number, rows: fc.Arbitrary<RowSpec[]>): fc.Arbitrary<RacingRows> {
  return fc.oneof(
    fc.record({ atOp: fc.integer({ min: 1, max: ops }), rows }),
    fc.record({ before: fc.oneof({ weight: 2, arbitrary: fc.constant('nothingClaimable') }, fc.constantFrom('ROLLBACK', 'newestPending', 'watchInserts', 'begin')), nth: fc.nat(3), rows }),
  );
}

/** LISTEN refused (a pooler), or lost just before one of the first inserts it would have reported */
const listenTroubleArb: fc.Arbitrary<StoreFault> = fc.oneof(
  { weight: 1, arbitrary: fc.record({ op: fc.constant('listen'), call: fc.constant(0), kind: fc.constant('fail') }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('listen'), call: fc.constant(0), kind: fc.constant('lost'), at: fc.nat(1) }) },
);

/** the faults of linger mode's own statements: the probe, and LISTEN (also slow, or hung) */
function lingerFaultArb(deadlineMs: number): fc.Arbitrary<StoreFault> {
  return fc.oneof(
    fc.record({ op: fc.constant('probe'), call: fc.oneof(fc.nat(2), fc.nat(40)), kind: fc.constantFrom('fail', 'hang') }),
    fc.record({ op: fc.constant('probe'), call: fc.oneof(fc.nat(2), fc.nat(40)), kind: fc.constant('slow'), ms: fc.integer({ min: 1, max: 300 }) }),
    listenTroubleArb,
    fc.record({ op: fc.constant('listen'), call: fc.constant(0), kind: fc.constant('hang') }),
    fc.record({ op: fc.constant('listen'), call: fc.constant(0), kind: fc.constant('slow'), ms: fc.integer({ min: 0, max: deadlineMs }) }),
  );
}

/**
 * Linger mode: a table (maybe empty) that the invocation drains first, then rows that producers
 * commit while it runs: mostly inside the wait, some within the reserve at its end (those wait
 * for the next invocation), some just before one of the loop's operations (between a claim and
 * the probe or LISTEN that follows it, where a timer rarely falls). NOTIFY or polling every
 * 10-30 ms. With faults, besides the usual ones (hangs included: a budget this short makes them
 * cheap), the probe and LISTEN fail, hang, or LISTEN is slow or lost, and backoffs are
 * sometimes short enough to end while the invocation waits.
 */
function lingerScenarioArb({ faults, crash, wake }: { faults: boolean; crash: boolean; wake?: 'notify' | 'poll' }): fc.Arbitrary<Scenario> {
  return fc
    .record({
      rows: rowsArb(faults),
      batchSize: fc.oneof(fc.integer({ min: 1, max: 5 }), fc.integer({ min: 1, max: 20 })),
      maxAttempts: fc.integer({ min: 1, max: 3 }),
      foreignLocked: foreignArb,
      latencies: latenciesArb,
      serverLatencies: latenciesArb,
      publishFaults: faults ? fc.array(publishFaultArb(true), { maxLength: 3 }) : fc.constant<PublishFault[]>([]),
      deadlineMs: fc.integer(LINGER_DEADLINE_MS),
      linger: fc.record({ wake: wake ? fc.constant(wake) : fc.constantFrom('notify', 'poll'), pollMs: fc.integer({ min: 10, max: 30 }) }),
      backoffBaseMs: faults ? fc.option(fc.constant(40), { nil: undefined }) : fc.constant(undefined),
    })
    .chain((sc) => {
      const late = fc.array(lateRowArb(faults), { minLength: 1, maxLength: 4 });
      const window = sc.deadlineMs - MIN_RESERVE_MS;
      const atMs = fc.oneof({ weight: 4, arbitrary: fc.integer({ min: 0, max: window - 50 }) }, { weight: 1, arbitrary: fc.integer({ min: window - 50, max: sc.deadlineMs }) });
      // about the operations of draining the table, and in poll mode the first probes
      const ops = sc.rows.length * 8 + 30;
      return fc.record({
        // without faults, runs are about liveness: rows always come
        lateRows: fc.array(fc.record({ atMs, rows: late }), { minLength: faults ? 0 : 1, maxLength: 5 }),
        racingRows: fc.oneof(
          { weight: 1, arbitrary: fc.constant<RacingRows[]>([]) },
          { weight: 2, arbitrary: fc.array(racingRowsArb(ops, late), { minLength: 1, maxLength: 2 }) },
        ),
        storeFaults: faults
          ? fc.array(fc.oneof({ weight: 3, arbitrary: storeFaultArb(true) }, { weight: 2, arbitrary: lingerFaultArb(sc.deadlineMs) }), { maxLength: 3 })
          : sc.linger.wake === 'notify'
            ? fc.oneof({ weight: 1, arbitrary: fc.constant<StoreFault[]>([]) }, { weight: 1, arbitrary: listenTroubleArb.map((f) => [f]) })
            : fc.constant<StoreFault[]>([]),
        crashAt: crash ? fc.nat(ops + 10) : fc.constant(undefined),
      }).map((more): Scenario => ({ ...sc, ...more }));
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

/** A shrink replays runs of about a second each: cut it short (fast-check reports what it has by then) rather than run for minutes. */
function lingerParams(numRuns: number): fc.Parameters<[Scenario]> {
  const p = params(numRuns);
  return { ...p, interruptAfterTimeLimit: (p.numRuns ?? numRuns) * 2 * LINGER_DEADLINE_MS.max + 30_000, markInterruptAsFailure: true };
}

// ---------------------------------------------------------------- properties

describe('invocation loop, model-based (in-memory store and broker, fast-check)', () => {
  const NO_FAULT_RUNS = 400;
  it(`without faults: every row is acked once and committed sent, except behind foreign locks; G1, G2, G4, G5, G7 (${NO_FAULT_RUNS} cases)`, async () => {
    await fc.assert(
      fc.asyncProperty(scenarioArb({ faults: false, crash: false, hangs: false }), async (sc) => {
        const { world, ending } = await run(sc);
        checkSafety(sc, world, ending);
        checkEnding(sc, world, ending);
        if (ending.kind !== 'returned') fail(world, `a run without faults ended ${ending.kind}`);
        const { acks, stuck, firstForeign } = checkDelivered(sc, world, () => true);
        assert.equal(ending.summary.published, acks.length);
        assert.equal(ending.summary.stoppedBecause, stuck.size > 0 ? 'behind-foreign-locks' : firstForeign.size > 0 ? 'locked' : 'empty');
      }),
      params(NO_FAULT_RUNS),
    );
  });

  const FAULT_RUNS = 1_500;
  it(`faults at every step (claim, sends, premark, COMMIT, its answer): G1, G2, G4, G5, G7, summary = committed state (${FAULT_RUNS} cases)`, async () => {
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
  it(`a database or broker that stops answering: settles by the deadline (G5), G1, G2, G4, G7 (${HANG_RUNS} cases, 60-120 ms budgets)`, async () => {
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

describe('a connection released inside its transaction (BatchTx.rollback on a poisoned client, before 3583737), model-based scenarios', () => {
  const row = (aggregate: number, topic: string | null = null): RowSpec => ({ aggregate, topic, attempts: 0 });
  // The first claim takes agg-9's second row, held behind its first (an application's lock): it
  // rolls back, its ROLLBACK answered after the grace (slow): the client is poisoned. The next
  // batch (agg-0's row 3, on the audit topic) is premarked and the topic refused as a whole:
  // nothing acked, so it rolls back, and the poisoned client does not send the ROLLBACK. Released
  // as it was (before 3583737), the connection is reserved by the claim ahead of the batch after
  // it, which goes on in the rolled-back transaction; its COMMIT commits the premark of row 3,
  // which the broker never acked (G1: lost).
  const sc: Scenario = {
    rows: [row(9), row(9), row(0, 'outbox.audit'), row(0, 'outbox.audit'), row(1), row(2), row(3)],
    foreignLocked: [0],
    batchSize: 1,
    maxAttempts: 3,
    latencies: [0],
    storeFaults: [{ op: 'rollback', call: 0, kind: 'slow' }],
    publishFaults: [{ op: 'publish', call: 0, at: 0, what: 'backoff' }],
    deadlineMs: ROOMY_DEADLINE_MS,
  };

  it('BatchTx ends the client instead (OutboxStore.abandon): nothing of the rolled-back transaction is committed, G1 and G7 hold', async () => {
    const { world, ending } = await run(sc, 'abandon');
    checkSafety(sc, world, ending);
    checkEnding(sc, world, ending);
    assert.equal(world.rows.get(3)?.sent, false, 'row 3 is still pending');
  });

  it('with the connection released (BatchTx before 3583737), the next transaction on it commits the premarks it held: the model sees it', async () => {
    const { world } = await run(sc, 'release');
    assert.ok(
      world.violations.some((v) => /yet its writes \[3\] were committed by tx\d+'s COMMIT/.test(v)),
      `the leftover premark of row 3 committed by the next transaction:\n  ${world.violations.join('\n  ')}\n  ${world.tail(40)}`,
    );
    assert.equal(world.rows.get(3)?.sent, true, 'row 3 committed as sent');
    assert.ok(!world.ackLog.some((a) => a.seq === '3'), 'though never acked (G1)');
  });
});

describe('linger mode (OUTBOX_IDLE=linger), model-based: rows committed while the invocation runs, NOTIFY or polling', { concurrency: true }, () => {
  // Each run lasts about its deadline (1-1.3 s) in real time and mostly waits: few runs, the
  // properties side by side.
  const LINGER_RUNS = 15;
  for (const wake of ['notify', 'poll'] as const) {
    const how = wake === 'notify' ? 'NOTIFY (LISTEN may fail, or be lost: then polling)' : 'polling';
    it(`without faults, woken by ${how}: every row committed before the wait's end is delivered, by the wake-ups it should cause; G1, G2, G4, G5, G7, the reserve kept (${LINGER_RUNS} cases)`, async () => {
      await fc.assert(
        fc.asyncProperty(lingerScenarioArb({ faults: false, crash: false, wake }), async (sc) => {
          const { world, ending, deadlineAt } = await run(sc);
          checkSafety(sc, world, ending);
          checkEnding(sc, world, ending, deadlineAt);
          checkLinger(sc, world, ending, deadlineAt);
          checkLingerLiveness(sc, world, ending, deadlineAt);
        }),
        lingerParams(LINGER_RUNS),
      );
    });
  }

  const LINGER_FAULT_RUNS = 15;
  it(`faults at every step, the probe's and LISTEN's too (failing, hung, slow, lost): G1, G2, G4, G5, G7, summary = committed state, the reserve kept (${LINGER_FAULT_RUNS} cases)`, async () => {
    await fc.assert(
      fc.asyncProperty(lingerScenarioArb({ faults: true, crash: false }), async (sc) => {
        const { world, ending, deadlineAt } = await run(sc);
        checkSafety(sc, world, ending);
        checkEnding(sc, world, ending, deadlineAt);
        checkLinger(sc, world, ending, deadlineAt);
      }),
      lingerParams(LINGER_FAULT_RUNS),
    );
  });

  const LINGER_CRASH_RUNS = 15;
  it(`a crash at any operation while rows keep coming: G1, G2 and G4 at the moment of death (${LINGER_CRASH_RUNS} cases)`, async () => {
    await fc.assert(
      fc.asyncProperty(lingerScenarioArb({ faults: true, crash: true }), async (sc) => {
        const { world, ending, deadlineAt } = await run(sc);
        checkSafety(sc, world, ending);
        checkEnding(sc, world, ending, deadlineAt);
        checkLinger(sc, world, ending, deadlineAt);
      }),
      lingerParams(LINGER_CRASH_RUNS),
    );
  });

  // Scenarios of what the properties found, each in one run: the fixes in idle.ts and relay.ts
  // (a 'locked' stop while polling, a LISTEN or a probe that answers past the wait's end), the
  // regression one of them first brought (claims again and again while a row is held), and
  // polling's RECLAIM_MS bound.
  const one: RowSpec[] = [{ aggregate: 0, topic: null, attempts: 0 }];
  const quiet = { batchSize: 5, maxAttempts: 3, foreignLocked: [], latencies: [0], publishFaults: [], deadlineMs: 1_000 };
  it('polling, a row committed between an empty claim and its nothingClaimable (which says \'locked\'): the next probe wakes the wait', async () => {
    const sc: Scenario = { ...quiet, rows: [], linger: { wake: 'poll', pollMs: 20 }, racingRows: [{ before: 'ROLLBACK', nth: 0, rows: one }], storeFaults: [] };
    const { world, ending, deadlineAt } = await run(sc);
    checkLingerLiveness(sc, world, ending, deadlineAt);
  });
  it('a LISTEN set up after the wait\'s end does not wake it: no batch claimed within the reserve', async () => {
    const sc: Scenario = { ...quiet, rows: [], linger: { wake: 'notify', pollMs: 20 }, lateRows: [{ atMs: 100, rows: one }], storeFaults: [{ op: 'listen', call: 0, kind: 'slow', ms: 700 }] };
    const { world, ending, deadlineAt } = await run(sc);
    checkLinger(sc, world, ending, deadlineAt);
  });
  it('polling while another transaction holds a row: no wake-up without a new row (the wait does not claim again and again)', async () => {
    const sc: Scenario = { ...quiet, rows: one, foreignLocked: [0], linger: { wake: 'poll', pollMs: 20 }, storeFaults: [] };
    const { world, ending, deadlineAt } = await run(sc);
    checkSafety(sc, world, ending);
    checkEnding(sc, world, ending, deadlineAt);
    checkLinger(sc, world, ending, deadlineAt);
  });

  it('polling after a stop other than \'empty\' or \'locked\' (an aggregate stuck behind a foreign lock): a row committed before the first probe is taken for an old one, and the periodic claim delivers it (the RECLAIM_MS bound)', async () => {
    // agg-0's first row is held by an application: its second waits, the aggregate is left out, the stop is 'behind-foreign-locks'
    const sc: Scenario = { ...quiet, deadlineMs: RECLAIM_MS + 1_200, rows: [one[0]!, one[0]!], foreignLocked: [0], linger: { wake: 'poll', pollMs: 20 }, racingRows: [{ before: 'newestPending', nth: 0, rows: [{ aggregate: 1, topic: null, attempts: 0 }] }], storeFaults: [] };
    const { world, ending } = await run(sc);
    assert.equal(ending.kind, 'returned', ending.kind);
    const racing = world.sortedRows().find((r) => r.aggregateid === 'agg-1');
    assert.ok(racing?.sent, `the row committed before the first probe was delivered: ${world.tail()}`);
    assert.ok((ending as { summary: Summary }).summary.wakeups.reclaim >= 1, 'by the periodic claim');
  });
  it('a probe that began before the wait\'s end and answers after it does not wake it: no batch claimed within the reserve', async () => {
    // the 11th probe (about 300 ms in; the wait ends about 400 ms in) sees a new row and answers 250 ms late
    const sc: Scenario = { ...quiet, rows: [], linger: { wake: 'poll', pollMs: 30 }, racingRows: [{ before: 'newestPending', nth: 10, rows: one }], storeFaults: [{ op: 'probe', call: 10, kind: 'slow', ms: 250 }] };
    const { world, ending, deadlineAt } = await run(sc);
    checkLinger(sc, world, ending, deadlineAt);
  });
});
