// In-memory fakes of the invocation loop's ports (src/loop/ports.ts, src/kafka/publisher.ts) for
// the model-based tests (test/unit/loop.model.test.ts). One World holds the outbox table, the
// locks, the broker's acks and the fault plan; FakeStore/FakeTx copy the semantics of OutboxStore/
// BatchTx and claimSql, FakePublisher those of ProducerPublisher.
//
// What the fakes model:
// - the claim of claimSql: pending, due rows in seq order; aggregates behind a backing-off or
//   parked row (hold policy) or a backed-off topic left out; per-aggregate advisory locks and
//   row locks (FOR UPDATE SKIP LOCKED) held until the transaction ends; the gap check with the
//   `inFlight` fast path; the second statement (foreignGapsSql). The claim is a statement that
//   takes time: its snapshot is read when it is sent, its locks are taken when it runs (after
//   the generated latency), and a row updated in between is re-checked on its latest version
//   (Postgres' EvalPlanQual under READ COMMITTED). That is what makes the loop's
//   "the claim ahead must have returned before this batch's locks go" observable.
// - premark (recorded, uncommitted), commitIfAllPremarked (the COMMIT is received, and applied,
//   the moment it is called; its answer arrives later, or fails, or is lost after the commit),
//   markAndCommit (applied atomically when called, or not at all), rollback.
// - rows locked by a transaction that is not a relay's (an application's SELECT ... FOR UPDATE).
// - the broker: acks in the order given; a record refused (its key's later messages in the send
//   are neither acked nor refused, as ProducerPublisher's blockedKeys), a topic refused as a whole,
//   the broker unavailable after a prefix, a send that hangs until its deadline (the real
//   Deadline.race ends it, as in ProducerPublisher.sendOnce), max.message.bytes not readable.
// - a crash: from a chosen operation on, the process is dead: that operation and every later one
//   neither happens nor settles (promises that never settle, no timers).
// - a hung database statement: raced against the transaction's deadline like OutboxStore.bounded.
// - linger mode: producers committing rows while the invocation runs, by real timers (lateRows)
//   or just before a given operation (racingRows); each commit NOTIFYs every LISTENer at once
//   (migration 003's statement-level trigger, one notification per commit); the probe
//   (newestPendingSql) on the table as it is; LISTEN on a connection of its own (watchInserts),
//   refused, hung, slow, or lost just before an insert, whose notification is lost with it.
//
// What they do not model: concurrent invocations (other relays), statements racing on separate
// connections (a COMMIT is applied the moment it is sent, so a claim can never run before a
// COMMIT that was sent earlier), duplicates inside one publish (ProducerPublisher's one-by-one
// re-send after a record-level refusal), real sizes, partitions, OUTBOX_SENT_ROWS=delete,
// the `skip` parked policy, skipped_at, rollback's own 2 s grace, retention's deletes
// (pruneChunk deletes nothing: every row is younger than the retention window), the waiting
// marks (clearStaleWaiting and markWaiting do nothing), NOTIFY's delivery delay, a seq taken
// before a slower producer's (rows commit in seq order here).
import { Deadline } from '../../../src/budget.ts';
import { BrokerUnavailableError, DatabaseError, DeadlineExceededError, MessageRejectedError } from '../../../src/errors.ts';
import { classifySendError } from '../../../src/kafka/classify.ts';
import type { OutboundMessage } from '../../../src/kafka/message.ts';
import type { PublishOutcome, Publisher } from '../../../src/kafka/publisher.ts';
import type { BatchTransaction, ClaimFilter, ClaimedRow, InsertWatch, NothingClaimable, PruneTarget, Store } from '../../../src/loop/ports.ts';
import type { Failure } from '../../../src/loop/settlement.ts';

/** A promise that never settles: what every operation of a dead process returns. Holds no handle. */
export const NEVER: Promise<never> = new Promise<never>(() => undefined);

export interface RowSpec {
  aggregate: number;
  /** per-row topic override; null: the template's topic */
  topic: string | null;
  attempts: number;
}

export type StoreFault =
  /** probe: linger mode's newestPending (OUTBOX_WAKE=poll, or after LISTEN fell back) */
  | { op: 'begin' | 'claim' | 'whyEmpty' | 'prune' | 'probe'; call: number; kind: 'fail' | 'hang' }
  /** the probe answers `ms` late (a loaded database) */
  | { op: 'probe'; call: number; kind: 'slow'; ms: number }
  /**
   * LISTEN (watchInserts). fail: refused (a pooler, a missing grant); hang: the connection does not
   * answer before the deadline; slow: LISTEN is set up `ms` later (a new connection: TCP, TLS,
   * auth); lost: the connection closes just before the `at`-th insert after LISTEN (0-based), and
   * that insert's NOTIFY is lost with it (a dead connection is noticed late: rows committed in
   * between notify no one).
   */
  | { op: 'listen'; call: number; kind: 'fail' | 'hang' }
  | { op: 'listen'; call: number; kind: 'slow'; ms: number }
  | { op: 'listen'; call: number; kind: 'lost'; at: number }
  /** recoverable: the UPDATE failed behind the savepoint; aborting: the SAVEPOINT itself failed */
  | { op: 'premark'; call: number; kind: 'recoverable' | 'aborting' }
  /**
   * fail: refused at commit time, nothing applied. lost: applied, but the answer never reached us.
   * hang-applied / hang-unapplied: the answer does not come before the deadline.
   */
  | { op: 'commit' | 'mark'; call: number; kind: 'fail' | 'lost' | 'hang-applied' | 'hang-unapplied' };

export type PublishFault =
  /** at: position in the publish call's messages */
  | { op: 'publish'; call: number; at: number; what: 'reject' | 'reject-permanent' | 'backoff' | 'unavailable' | 'hang' }
  | { op: 'limits'; call: number };

/** the variants of fault union F that apply to operation K */
type FaultOf<F, K> = F extends { op: infer O } ? (K extends O ? F : never) : never;

export interface WorldPlan {
  rows: RowSpec[];
  /** row indexes locked by a transaction that is not a relay's, for the whole run */
  foreignLocked: number[];
  /** event-loop turns each operation takes, used in turn (cycled) */
  latencies: number[];
  storeFaults: StoreFault[];
  publishFaults: PublishFault[];
  /** the operation number at which the process dies */
  crashAt?: number;
  /** linger mode: rows that producers commit while the invocation runs, `atMs` after it starts */
  lateRows?: Array<{ atMs: number; rows: RowSpec[] }>;
  /**
   * rows committed just before an operation begins: a producer's COMMIT that lands between two of
   * the loop's statements (after a claim's snapshot, before the probe or the LISTEN that follows
   * it), where a timer rarely falls
   */
  racingRows?: RacingRows[];
}

/**
 * Rows committed just before an operation: the `atOp`-th of the run, or the `nth` (0-based) whose
 * label contains `before` (e.g. 'ROLLBACK', 'nothingClaimable', 'newestPending': the windows
 * between an empty claim's snapshot and the wait that follows it).
 */
export type RacingRows = { rows: RowSpec[] } & ({ atOp: number } | { before: string; nth: number });

/** A claim statement as it ran: when, whether it was a claim ahead, and what its snapshot held. */
export interface ClaimRecord {
  tx: number;
  /** its operation number */
  op: number;
  /** ms after the world began (World.now()) */
  at: number;
  /** a claim ahead (sent while the batch before it is published: inFlight is not empty) */
  ahead: boolean;
  /** rows in the table (their highest seq) when the statement's snapshot was taken */
  rowsSeen: number;
  /** Date.now() when the statement ran (backoffs are compared with it) */
  now: number;
}

/** Rows a producer committed while the invocation ran. */
export interface LateCommit {
  /** ms after the world began */
  at: number;
  seqs: number[];
  /** operations begun before it: the last one is steps[afterOp - 1] */
  afterOp: number;
  how: 'timer' | 'racing';
}

/** A nothingClaimable (whyEmptySql) as it ran: the table it saw, and its answer. */
export interface WhyEmptyRecord {
  /** its operation number */
  op: number;
  at: number;
  rowsSeen: number;
  now: number;
  answer: NothingClaimable;
}

export interface RowState {
  seq: number;
  id: string;
  aggregateid: string;
  topic: string | null;
  attempts: number;
  sent: boolean;
  parked: boolean;
  nextAttemptAt: number;
}

export interface Ack {
  seq: string;
  aggregateid: string;
  /** operation number of the ack */
  step: number;
  /** publish call it belongs to */
  publish: number;
}

export const AGGREGATE_TYPE = 'order';
export const EVENT_TYPE = 'T';
const FOREIGN = -1;

export class World {
  readonly rows = new Map<number, RowState>();
  readonly ackLog: Ack[] = [];
  /** failures recorded by committed markAndCommit calls */
  readonly committedFailures: Array<{ seq: number; park: boolean }> = [];
  /** rows of COMMITs that were refused (not applied): G2's bound does not count them (see the test) */
  readonly failedCommitRows = new Set<string>();
  /** misuse of the ports by the loop (a statement on an ended transaction, a publish of an unlocked row, ...) */
  readonly violations: string[] = [];
  readonly trace: string[] = [];
  readonly txs: FakeTx[] = [];
  /** aggregate → transaction id holding its advisory lock */
  readonly aggregateLocks = new Map<string, number>();
  /** seq → transaction id holding its row lock (FOREIGN: not a relay's transaction) */
  readonly rowLocks = new Map<number, number>();
  /** faults that fired, by kind */
  readonly fired: string[] = [];
  ops = 0;
  dead = false;
  diedAt?: string;
  private latencyIndex = 0;
  private readonly death = Promise.withResolvers<void>();
  private readonly calls = new Map<string, number>();

  /** LISTENers (watchInserts): told of every insert, like migration 003's trigger at COMMIT */
  readonly listeners = new Set<() => void>();
  /** when each row was committed (ms after the world began): the late rows' deadline check */
  readonly insertedAt = new Map<number, number>();
  /** every operation that began: when (ms after the world began) and what; operation #n is steps[n - 1] */
  readonly steps: Array<{ at: number; label: string }> = [];
  /** every late commit (lateRows, racingRows): when, its rows, and how many operations had begun before it */
  readonly lateCommits: LateCommit[] = [];
  /** every claim statement, in the order they ran */
  readonly claims: ClaimRecord[] = [];
  /** every nothingClaimable that answered, in order */
  readonly whyEmpties: WhyEmptyRecord[] = [];
  /** every probe (newestPending) that answered: its operation, when it began, and the table it saw */
  readonly probes: Array<{ op: number; at: number; rowsSeen: number; newest: string | null }> = [];
  /** when each LISTEN was set up (ms after the world began) */
  readonly listenedAt: number[] = [];
  private readonly startedAt = performance.now();
  private readonly lateTimers: NodeJS.Timeout[] = [];
  private readonly racing: RacingRows[];
  /** operations seen so far per `before` of racingRows */
  private readonly racingSeen = new Map<string, number>();

  constructor(readonly plan: WorldPlan) {
    this.insert(plan.rows);
    for (const i of plan.foreignLocked) if (i < plan.rows.length) this.rowLocks.set(i + 1, FOREIGN);
    for (const late of plan.lateRows ?? []) {
      this.lateTimers.push(
        setTimeout(() => {
          if (this.dead) return;
          this.commitLate(late.rows, 'timer');
        }, late.atMs),
      );
    }
    this.racing = plan.racingRows ?? [];
  }

  /** ms since the world began */
  now(): number {
    return performance.now() - this.startedAt;
  }

  private insert(rows: RowSpec[]): number[] {
    const atMs = this.now();
    const seqs: number[] = [];
    for (const r of rows) {
      const seq = this.rows.size + 1;
      this.rows.set(seq, { seq, id: `00000000-0000-4000-8000-${String(seq).padStart(12, '0')}`, aggregateid: `agg-${r.aggregate}`, topic: r.topic, attempts: r.attempts, sent: false, parked: false, nextAttemptAt: -Infinity });
      this.insertedAt.set(seq, atMs);
      seqs.push(seq);
    }
    return seqs;
  }

  /** A producer's transaction commits `rows`; the trigger notifies every LISTENer (one NOTIFY per statement). */
  private commitLate(rows: RowSpec[], how: LateCommit['how']): void {
    const seqs = this.insert(rows);
    this.lateCommits.push({ at: this.now(), seqs, afterOp: this.ops, how });
    this.trace.push(`   a producer committed rows [${seqs.join(',')}] (${how === 'timer' ? `timer, at ${Math.round(this.now())} ms` : `before #${this.ops + 1}`})`);
    for (const l of [...this.listeners]) l();
  }

  /** racingRows due before operation #ops + 1, `label` */
  private commitRacing(label: string): void {
    const seen = new Map<string, number>();
    for (const r of this.racing) {
      if (!('before' in r) || !label.includes(r.before) || seen.has(r.before)) continue;
      seen.set(r.before, this.racingSeen.get(r.before) ?? 0);
      this.racingSeen.set(r.before, seen.get(r.before)! + 1);
    }
    const due = this.racing.filter((r) => ('atOp' in r ? r.atOp === this.ops + 1 : seen.get(r.before) === r.nth));
    if (due.length > 0) this.commitLate(due.flatMap((r) => r.rows), 'racing');
  }

  /** No more late rows (the run is over). */
  stopInserting(): void {
    for (const t of this.lateTimers) clearTimeout(t);
  }

  /** Resolves when the process dies (never, without a crash). */
  get died(): Promise<void> {
    return this.death.promise;
  }

  /** An operation begins: false when the process is dead (then it neither happens nor settles). */
  step(label: string): boolean {
    if (this.dead) return false;
    if (this.plan.crashAt !== undefined && this.ops >= this.plan.crashAt) {
      this.dead = true;
      this.diedAt = label;
      this.trace.push(`#${this.ops}: ✝ died before ${label}`);
      this.death.resolve();
      return false;
    }
    this.commitRacing(label);
    this.ops++;
    this.steps.push({ at: this.now(), label });
    this.trace.push(`#${this.ops}: ${label}`);
    return true;
  }

  /** The generated latency of one operation; never returns once the process died meanwhile. */
  async wire(): Promise<void> {
    const { latencies } = this.plan;
    const turns = latencies.length ? (latencies[this.latencyIndex++ % latencies.length] ?? 0) : 0;
    for (let i = 0; i < turns; i++) await new Promise<void>((resolve) => setImmediate(resolve));
    if (this.dead) await NEVER;
  }

  /** The n-th call (0-based) of `op`. */
  nextCall(op: string): number {
    const n = this.calls.get(op) ?? 0;
    this.calls.set(op, n + 1);
    return n;
  }

  storeFault<K extends StoreFault['op']>(op: K): FaultOf<StoreFault, K> | undefined {
    const call = this.nextCall(op);
    const f = this.plan.storeFaults.find((x) => x.op === op && x.call === call) as FaultOf<StoreFault, K> | undefined;
    if (f) this.fired.push(`${op}:${f.kind}`);
    return f;
  }

  violation(msg: string): void {
    this.violations.push(msg);
  }

  sortedRows(): RowState[] {
    return [...this.rows.values()].sort((a, b) => a.seq - b.seq);
  }

  release(txId: number): void {
    for (const [agg, holder] of this.aggregateLocks) if (holder === txId) this.aggregateLocks.delete(agg);
    for (const [seq, holder] of this.rowLocks) if (holder === txId) this.rowLocks.delete(seq);
  }

  openTransactions(): FakeTx[] {
    return this.txs.filter((t) => t.state === 'open');
  }

  /** The last `n` lines of the trace; a lingering invocation's runs of identical probes as one line each. */
  tail(n = 30): string {
    const lines: string[] = [];
    let run: { first: string; last: string; count: number; answer: string } | undefined;
    const flush = () => {
      if (run) lines.push(run.count === 1 ? `#${run.first}: newestPending\n     newest pending: ${run.answer}` : `#${run.first}..#${run.last}: newestPending ×${run.count}, each: newest pending: ${run.answer}`);
      run = undefined;
    };
    for (let i = 0; i < this.trace.length; i++) {
      const probe = /^#(\d+): newestPending$/.exec(this.trace[i]!);
      const answer = /^ {3}newest pending: (.*)$/.exec(this.trace[i + 1] ?? '')?.[1];
      if (probe && answer !== undefined) {
        if (run?.answer === answer) {
          run.last = probe[1]!;
          run.count++;
        } else {
          flush();
          run = { first: probe[1]!, last: probe[1]!, count: 1, answer };
        }
        i++;
        continue;
      }
      flush();
      lines.push(this.trace[i]!);
    }
    flush();
    return lines.slice(-n).join('\n  ');
  }
}

export function topicOf(row: Pick<RowState, 'topic'>, template: string): string {
  return row.topic || template.replaceAll('{aggregatetype}', AGGREGATE_TYPE).replaceAll('{type}', EVENT_TYPE);
}

/** A statement that does not answer: OutboxStore.bounded races it against the deadline. */
function hang(deadline: Deadline, what: string): Promise<never> {
  return deadline.race(what, NEVER);
}

/** A delay that does not keep the process alive (a crashed run may leave one behind). */
function sleepMs(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

/** OutboxStore.bounded's race rejects at once once the deadline is spent. */
function checkDeadline(deadline: Deadline, what: string): void {
  if (deadline.expired()) throw new DeadlineExceededError(what);
}

export class FakeStore implements Store {
  constructor(readonly world: World) {}

  async begin(deadline: Deadline, _after?: BatchTransaction): Promise<FakeTx> {
    const w = this.world;
    const fault = w.storeFault('begin');
    if (!w.step('begin')) return NEVER;
    const op = w.ops;
    const at = w.now();
    checkDeadline(deadline, 'reserving a database connection');
    await w.wire();
    if (fault?.kind === 'fail') throw new DatabaseError('injected: could not reserve a connection');
    if (fault?.kind === 'hang') await hang(deadline, 'reserving a database connection');
    const tx = new FakeTx(w.txs.length + 1, w, deadline, op, at);
    w.txs.push(tx);
    return tx;
  }

  async nothingClaimable(deadline: Deadline): Promise<NothingClaimable> {
    const w = this.world;
    const fault = w.storeFault('whyEmpty');
    if (!w.step('nothingClaimable')) return NEVER;
    const op = w.ops;
    checkDeadline(deadline, 'checking why nothing was claimable');
    await w.wire();
    if (fault?.kind === 'fail') throw new DatabaseError('injected: whyEmpty failed');
    if (fault?.kind === 'hang') await hang(deadline, 'checking why nothing was claimable');
    // whyEmptySql (hold policy)
    const now = Date.now();
    const rows = w.sortedRows();
    const blocked = firstBlocked(rows, now);
    const pending = rows.filter((r) => !r.sent && !r.parked);
    const claimable = pending.some((r) => r.nextAttemptAt <= now && !((blocked.get(r.aggregateid) ?? Infinity) < r.seq));
    const answer = claimable ? 'locked' : pending.length > 0 ? 'behind-failed-rows' : 'empty';
    w.whyEmpties.push({ op, at: w.now(), rowsSeen: w.rows.size, now, answer });
    return answer;
  }

  /** the waiting marks are the SQL store's own optimization: nothing to model */
  async checkTables(_deadline: Deadline): Promise<void> {}

  clearStaleWaiting(_deadline: Deadline): Promise<{ cleared: number; blocked: boolean }> {
    return Promise.resolve({ cleared: 0, blocked: false });
  }

  markWaiting(_deadline: Deadline): Promise<number> {
    return Promise.resolve(0);
  }

  /** newestPendingSql */
  async newestPending(deadline: Deadline): Promise<string | null> {
    const w = this.world;
    const fault = w.storeFault('probe');
    if (!w.step('newestPending')) return NEVER;
    const op = w.ops;
    const at = w.now();
    checkDeadline(deadline, 'probing for new rows');
    await w.wire();
    if (fault?.kind === 'fail') throw new DatabaseError('injected: the probe for new rows failed');
    if (fault?.kind === 'hang') await hang(deadline, 'probing for new rows');
    const pending = w.sortedRows().filter((r) => !r.sent && !r.parked);
    const newest = pending.length ? String(pending[pending.length - 1]!.seq) : null;
    w.probes.push({ op, at, rowsSeen: w.rows.size, newest });
    if (fault?.kind === 'slow') await deadline.race('probing for new rows', sleepMs(fault.ms));
    if (w.dead) return NEVER;
    w.trace.push(`   newest pending: ${newest}`);
    return newest;
  }

  /** LISTEN on a connection of its own; closing it ends the notifications */
  async watchInserts(deadline: Deadline, on: { insert(): void; lost(err: unknown): void }): Promise<InsertWatch> {
    const w = this.world;
    const fault = w.storeFault('listen');
    if (!w.step('watchInserts (LISTEN)')) return NEVER;
    checkDeadline(deadline, 'listening for new rows (LISTEN)');
    await w.wire();
    // OutboxStore.watchInserts races LISTEN against the deadline (not bounded(): no other client is poisoned)
    if (fault?.kind === 'fail') throw new DatabaseError('injected: LISTEN failed (a pooler in transaction mode?)');
    if (fault?.kind === 'hang') await hang(deadline, 'listening for new rows (LISTEN)');
    if (fault?.kind === 'slow') await deadline.race('listening for new rows (LISTEN)', sleepMs(fault.ms));
    if (w.dead) return NEVER;
    let inserts = 0;
    const listener = () => {
      if (fault?.kind === 'lost' && inserts++ === fault.at) {
        w.listeners.delete(listener);
        w.trace.push('   the LISTEN connection closed (its NOTIFY lost)');
        on.lost(new Error('injected: the LISTEN connection closed'));
        return;
      }
      on.insert();
    };
    w.listeners.add(listener);
    w.listenedAt.push(w.now());
    w.trace.push('   listening');
    return {
      close: () => {
        w.listeners.delete(listener);
        return Promise.resolve();
      },
    };
  }

  /** Retention (loop/retention.ts, alongside the loop): nothing old enough to delete in the model. */
  async pruneChunk(column: PruneTarget, _retainMs: number, _limit: number, deadline: Deadline): Promise<number> {
    const w = this.world;
    const fault = w.storeFault('prune');
    if (!w.step(`pruneChunk(${column})`)) return NEVER;
    checkDeadline(deadline, 'pruning sent rows');
    await w.wire();
    if (fault?.kind === 'fail') throw new DatabaseError('injected: prune failed');
    if (fault?.kind === 'hang') await hang(deadline, 'pruning sent rows');
    return 0;
  }
}

/** Per aggregate, the first row that failed and is backing off or parked (claimSql's `blocked`, hold policy). */
export function firstBlocked(rows: RowState[], now: number): Map<string, number> {
  const blocked = new Map<string, number>();
  for (const r of rows) {
    if (r.sent || r.attempts === 0 || !(r.parked || r.nextAttemptAt > now)) continue;
    if (!blocked.has(r.aggregateid)) blocked.set(r.aggregateid, r.seq);
  }
  return blocked;
}

type TxState = 'open' | 'committing' | 'ended';

export class FakeTx implements BatchTransaction {
  state: TxState = 'open';
  /** when it ended or its COMMIT was sent (ms after the world began); with beganAt, the loop's batch times are within these */
  endedAt: number | undefined;
  /** every row this transaction claimed (G2: acked-but-unmarked rows must all be one batch's) */
  readonly claimed = new Set<string>();
  private premarked: { seqs: Set<string>; written: boolean; aborting: boolean } | undefined;

  constructor(
    readonly id: number,
    private readonly w: World,
    private readonly deadline: Deadline,
    /** the operation number of its begin() */
    readonly beginOp: number,
    /** when begin() was called (ms after the world began): in the same event-loop turn as the loop's decision to claim */
    readonly beganAt: number,
  ) {}

  private expectOpen(what: string): void {
    if (this.state !== 'open') this.w.violation(`tx${this.id}: ${what} on a transaction that is ${this.state}`);
  }

  async claim(limit: number, filter: ClaimFilter): Promise<ClaimedRow[]> {
    const w = this.w;
    const fault = w.storeFault('claim');
    if (!w.step(`tx${this.id}.claim(${limit}, inFlight=[${filter.inFlight.join(',')}])`)) return NEVER;
    const op = w.ops;
    this.expectOpen('claim');
    checkDeadline(this.deadline, 'claiming a batch');
    // the statement's snapshot: what the table looked like when the claim was sent
    const snapshot = w.sortedRows().map((r) => ({ ...r }));
    const sentAt = w.now();
    await w.wire();
    if (fault?.kind === 'fail') throw new DatabaseError('injected: claim failed');
    if (fault?.kind === 'hang') await hang(this.deadline, 'claiming a batch');
    if (this.state !== 'open') {
      w.violation(`tx${this.id}: claim ran after its transaction ended`);
      return [];
    }
    w.claims.push({ tx: this.id, op, at: sentAt, ahead: filter.inFlight.length > 0, rowsSeen: snapshot.length, now: Date.now() });
    const rows = this.runClaim(limit, filter, snapshot);
    w.trace.push(`   tx${this.id} claimed [${rows.map((r) => `${r.seq}${r.publishable ? '' : '(held)'}`).join(',')}]`);
    const waiting = rows.filter((r) => !r.publishable);
    if (waiting.length === 0) return rows;
    // foreignGapsSql: a statement of its own, with a fresh snapshot
    if (!w.step(`tx${this.id}.foreignGaps`)) return NEVER;
    await w.wire();
    const foreign = new Set<string>();
    for (const gap of new Set(waiting.map((r) => Number(r.first_gap)))) {
      const row = w.rows.get(gap);
      const holder = w.rowLocks.get(gap);
      if (holder !== undefined && holder !== this.id) {
        if (row && !row.sent) foreign.add(String(gap));
      } else {
        w.rowLocks.set(gap, this.id);
      }
    }
    for (const r of waiting) r.waitsOnForeignLock = foreign.has(r.first_gap ?? '');
    return rows;
  }

  /** claimSql, hold policy: run now, on `snapshot` (the statement's), with live locks and EvalPlanQual. */
  private runClaim(limit: number, filter: ClaimFilter, snapshot: RowState[]): ClaimedRow[] {
    const w = this.w;
    const now = Date.now();
    const blocked = firstBlocked(snapshot, now);
    const held = new Map<string, number>();
    if (filter.topics.length > 0) {
      for (const r of snapshot) {
        if (r.sent || r.parked || !filter.topics.includes(topicOf(r, filter.topicTemplate))) continue;
        if (!held.has(r.aggregateid)) held.set(r.aggregateid, r.seq);
      }
    }
    const cand: RowState[] = [];
    for (const r of snapshot) {
      if (cand.length >= limit) break;
      if (r.sent || r.parked) continue;
      if ((blocked.get(r.aggregateid) ?? Infinity) < r.seq) continue;
      if ((held.get(r.aggregateid) ?? Infinity) <= r.seq) continue;
      if (filter.aggregates.includes(r.aggregateid)) continue;
      if (!(r.nextAttemptAt <= now)) continue;
      // pg_try_advisory_xact_lock: re-entrant for its holder; kept even if the row is then skipped
      const aggHolder = w.aggregateLocks.get(r.aggregateid);
      if (aggHolder !== undefined && aggHolder !== this.id) continue;
      w.aggregateLocks.set(r.aggregateid, this.id);
      // FOR UPDATE SKIP LOCKED
      const rowHolder = w.rowLocks.get(r.seq);
      if (rowHolder !== undefined && rowHolder !== this.id) continue;
      // EvalPlanQual: a row updated since the snapshot is re-checked on its latest version
      const live = w.rows.get(r.seq)!;
      if (live.sent || live.parked || !(live.nextAttemptAt <= now)) continue;
      w.rowLocks.set(r.seq, this.id);
      cand.push(live);
    }
    if (cand.length === 0) return [];
    // the gap check, on the statement's snapshot
    const candSeqs = new Set(cand.map((r) => r.seq));
    const inFlight = new Set(filter.inFlight.map(Number));
    const maxSeq = Math.max(...candSeqs);
    const maybe = snapshot.some((o) => !o.sent && !o.parked && o.seq < maxSeq && !candSeqs.has(o.seq) && !inFlight.has(o.seq));
    const gaps = new Map<string, number>();
    if (maybe) {
      for (const agg of new Set(cand.map((r) => r.aggregateid))) {
        const aggMax = Math.max(...cand.filter((r) => r.aggregateid === agg).map((r) => r.seq));
        // hold policy: a parked row is a gap too
        const gap = snapshot.find((o) => o.aggregateid === agg && !o.sent && o.seq < aggMax && !candSeqs.has(o.seq));
        if (gap) gaps.set(agg, gap.seq);
      }
    }
    return cand.map((r) => {
      this.claimed.add(String(r.seq));
      const gap = gaps.get(r.aggregateid);
      return {
        seq: String(r.seq),
        id: r.id,
        aggregatetype: AGGREGATE_TYPE,
        aggregateid: r.aggregateid,
        type: EVENT_TYPE,
        payload: '{}',
        topic: r.topic,
        headers: null,
        attempts: r.attempts,
        first_gap: gap === undefined ? null : String(gap),
        publishable: gap === undefined || r.seq < gap,
      };
    });
  }

  premark(seqs: string[]): void {
    if (seqs.length === 0) return;
    const w = this.w;
    const fault = w.storeFault('premark');
    if (!w.step(`tx${this.id}.premark([${seqs.join(',')}])`)) return;
    this.expectOpen('premark');
    this.premarked = { seqs: new Set(seqs), written: fault === undefined, aborting: fault?.kind === 'aborting' };
  }

  async commitIfAllPremarked(sent: string[], failures: Failure[]): Promise<{ answer: Promise<void> } | undefined> {
    const pre = this.premarked;
    if (!pre || failures.length > 0 || sent.length !== pre.seqs.size || !sent.every((s) => pre.seqs.has(s))) return undefined;
    if (!pre.written) return undefined;
    const w = this.w;
    const fault = w.storeFault('commit');
    if (!w.step(`tx${this.id}.COMMIT [${sent.join(',')}]`)) return NEVER;
    this.expectOpen('COMMIT');
    this.checkOwnRows('COMMIT', sent);
    this.premarked = undefined;
    // BatchTx.run's race rejects at once when the deadline is spent: the COMMIT is never sent
    const expired = this.deadline.expired();
    // received by the database now: Postgres commits it even if we die before its answer
    const applied = !expired && fault?.kind !== 'fail' && fault?.kind !== 'hang-unapplied';
    if (applied) this.apply(sent, []);
    else for (const s of sent) w.failedCommitRows.add(s);
    w.release(this.id);
    this.state = 'committing';
    this.endedAt = w.now();
    const answer = (async () => {
      if (expired) throw new DeadlineExceededError('committing the batch');
      await w.wire();
      if (!w.step(`tx${this.id}.COMMIT answered${fault ? ` (${fault.kind})` : ''}`)) return NEVER;
      this.state = 'ended';
      if (fault?.kind === 'fail') throw new DatabaseError('injected: COMMIT failed (serialization failure)');
      if (fault?.kind === 'lost') throw new DatabaseError('injected: connection lost before the COMMIT answered');
      if (fault) await hang(this.deadline, 'committing the batch');
    })();
    answer.catch(() => undefined);
    // socketsFlushed: the COMMIT is on the wire when this resolves
    await w.wire();
    return { answer };
  }

  async markAndCommit(sent: string[], failures: Failure[]): Promise<void> {
    const w = this.w;
    const fault = w.storeFault('mark');
    if (!w.step(`tx${this.id}.markAndCommit sent=[${sent.join(',')}] failed=[${failures.map((f) => `${f.seq}${f.park ? '(park)' : ''}`).join(',')}]`)) return NEVER;
    this.expectOpen('markAndCommit');
    this.checkOwnRows('markAndCommit', [...sent, ...failures.map((f) => f.seq)]);
    const pre = this.premarked;
    this.premarked = undefined;
    const expired = this.deadline.expired();
    // the premark's SAVEPOINT failed: ROLLBACK TO SAVEPOINT fails, and with it the whole batch
    const refused = expired || pre?.aborting === true || fault?.kind === 'fail' || fault?.kind === 'hang-unapplied';
    if (!refused) this.apply(sent, failures);
    else for (const s of sent) w.failedCommitRows.add(s);
    w.release(this.id);
    this.state = 'ended';
    this.endedAt = w.now();
    if (expired) throw new DeadlineExceededError('committing the batch');
    await w.wire();
    if (pre?.aborting) throw new DatabaseError('injected: the premark savepoint failed; current transaction is aborted');
    if (fault?.kind === 'fail') throw new DatabaseError('injected: marking failed');
    if (fault?.kind === 'lost') throw new DatabaseError('injected: connection lost before the COMMIT answered');
    if (fault) await hang(this.deadline, 'committing the batch');
  }

  async rollback(): Promise<void> {
    if (this.state !== 'open') return;
    const w = this.w;
    if (!w.step(`tx${this.id}.ROLLBACK`)) return NEVER;
    w.release(this.id);
    this.state = 'ended';
    this.endedAt = w.now();
    await w.wire();
  }

  private checkOwnRows(what: string, seqs: string[]): void {
    for (const s of seqs) if (lockHolder(this.w, s) !== this.id) this.w.violation(`tx${this.id}: ${what} of row ${s}, which this transaction does not hold`);
  }

  private apply(sent: string[], failures: Failure[]): void {
    const now = Date.now();
    for (const s of sent) {
      const row = this.w.rows.get(Number(s));
      if (row && !row.sent) row.sent = true;
    }
    for (const f of failures) {
      const row = this.w.rows.get(Number(f.seq));
      if (!row) continue;
      row.attempts++;
      row.nextAttemptAt = now + Math.round(f.delayMs);
      row.parked = f.park;
      this.w.committedFailures.push({ seq: row.seq, park: f.park });
    }
  }
}

function lockHolder(w: World, seq: string): number | undefined {
  return w.rowLocks.get(Number(seq));
}

export class FakePublisher implements Publisher {
  readonly connects = 1;

  constructor(private readonly w: World) {}

  async maxMessageBytes(topic: string, _deadline: Deadline): Promise<number> {
    const w = this.w;
    const call = w.nextCall('limits');
    const fault = w.plan.publishFaults.find((f) => f.op === 'limits' && f.call === call);
    if (!w.step(`maxMessageBytes(${topic})`)) return NEVER;
    await w.wire();
    if (fault) {
      w.fired.push('limits');
      throw new BrokerUnavailableError('injected: could not read the topic config: connection refused');
    }
    return 1_000_000;
  }

  async publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome> {
    const w = this.w;
    const call = w.nextCall('publish');
    if (!w.step(`publish#${call} [${messages.map((m) => m.seq).join(',')}]`)) return NEVER;
    for (const m of messages) {
      // the batch's transaction must hold every row it sends (no other relay can take it meanwhile)
      const holder = lockHolder(w, m.seq);
      if (holder === undefined || holder === FOREIGN || w.txs[holder - 1]?.state !== 'open') w.violation(`publish#${call}: row ${m.seq} is sent while no open transaction of the invocation holds it`);
    }
    const events = new Map<number, Extract<PublishFault, { op: 'publish' }>['what']>();
    for (const f of w.plan.publishFaults) if (f.op === 'publish' && f.call === call && !events.has(f.at)) events.set(f.at, f.what);
    const outcome: PublishOutcome = { acked: [], rejected: [], backedOff: [] };
    const stoppedTopics = new Set<string>();
    const blockedKeys = new Set<string>();
    await w.wire();
    for (const [i, m] of messages.entries()) {
      const what = events.get(i);
      if (what === 'unavailable') {
        w.fired.push('unavailable');
        outcome.unavailable = new BrokerUnavailableError('injected: broker unavailable: connection reset');
        break;
      }
      if (what === 'hang') {
        w.fired.push('publish-hang');
        try {
          await deadline.race(`publishing to ${m.topic}`, NEVER);
        } catch (err) {
          outcome.unavailable = classifySendError(err, m.topic).error;
        }
        if (w.dead) return NEVER;
        break;
      }
      if (stoppedTopics.has(m.topic) || blockedKeys.has(m.key)) continue;
      if (what === 'backoff') {
        w.fired.push('backoff');
        stoppedTopics.add(m.topic);
        outcome.backedOff.push({ topic: m.topic, error: new MessageRejectedError(`injected: cannot publish to topic ${m.topic} (UNKNOWN_TOPIC_OR_PARTITION)`) });
        continue;
      }
      if (what === 'reject' || what === 'reject-permanent') {
        w.fired.push(what);
        outcome.rejected.push({ seq: m.seq, error: new MessageRejectedError('injected: broker rejected the message (INVALID_RECORD)', what === 'reject-permanent') });
        blockedKeys.add(m.key);
        continue;
      }
      await w.wire();
      if (!w.step(`ack ${m.seq} (${m.aggregateid})`)) return NEVER;
      w.ackLog.push({ seq: m.seq, aggregateid: m.aggregateid, step: w.ops, publish: call });
      outcome.acked.push(m.seq);
    }
    await w.wire();
    if (!w.step(`publish#${call} returned acked=[${outcome.acked.join(',')}]${outcome.unavailable ? ' unavailable' : ''}`)) return NEVER;
    return outcome;
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}
