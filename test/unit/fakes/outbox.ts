// In-memory fakes of the invocation loop's ports (src/loop/ports.ts: Store, Publisher) for
// the model-based tests (test/unit/loop.model.test.ts). One World holds the outbox table, the
// server's transactions and connections, the locks, the broker's acks and the fault plan;
// FakeStore/FakeTx copy the semantics of OutboxStore/BatchTx (their states, the connection's
// hand-over, release and rollback are copies of the code, not the code: see UnconfirmedEnd) and of
// claimStatement, FakePublisher those of ProducerPublisher.
//
// What the fakes model:
// - connections and the server: a pool of 3 (postgres.js, Runtime's max), reserved first-released
//   first; on each connection the server runs statements in the order they were sent, each some
//   generated turns later (serverLatencies), whatever happens to the process meanwhile. A server
//   transaction runs from a BEGIN to a COMMIT, a ROLLBACK, or the connection's close (then it is
//   rolled back). A connection released inside a transaction stays in it: the next transaction
//   that reserves it finds it open (a BEGIN inside a transaction is only a warning), goes on in it
//   and sees its writes as its own, and its COMMIT commits them all (World.commitServerTx reports
//   the leftover as a violation). A connection whose statement hangs answers nothing more.
// - the claim of claimStatement: pending, due rows in seq order; aggregates behind a backing-off or
//   parked row (hold policy) or a backed-off topic left out; per-aggregate advisory locks and
//   row locks (FOR UPDATE SKIP LOCKED) held until the server transaction ends; the gap check with
//   the `inFlight` fast path; the second statement (foreignGapsSql). The claim is a statement that
//   takes time: its snapshot is read when the server starts it, its locks are taken when it runs
//   (after the generated turns), and a row updated in between is re-checked on its latest version
//   (Postgres' EvalPlanQual under READ COMMITTED). That is what makes the loop's
//   "the claim ahead must have returned before this batch's locks go" observable.
// - premark (SAVEPOINT and the marks, uncommitted, in the server transaction), commitIfAllPremarked
//   (the COMMIT is applied when the server runs it, after the statements sent before it on its
//   connection; its answer comes after that, or fails, or is lost with the connection; a process
//   that dies once it was sent still has it committed), markAndCommit (ROLLBACK TO SAVEPOINT, the
//   marks, COMMIT, in one go), rollback (its ROLLBACK failing with the connection, hanging, or
//   answered after the grace), the client poisoned (OutboxStore.poisoned) and a closed connection
//   (connectionLost) as OutboxStore has them.
// - rows locked by a transaction that is not a relay's (an application's SELECT ... FOR UPDATE).
// - the broker: acks in the order given; a record refused (its key's later messages in the send
//   are neither acked nor refused, as ProducerPublisher's blockedKeys), a topic refused as a whole,
//   the broker unavailable after a prefix, a send that hangs until its deadline (the real
//   Deadline.race ends it, as in ProducerPublisher.sendOnce), max.message.bytes not readable.
// - a crash: from a chosen operation on, the process is dead: that operation and every later one
//   neither happens nor settles (promises that never settle, no timers that hold the process); the
//   server runs what it was sent, then sees the connections close (World.afterDeath).
// - a hung database statement: raced against the transaction's deadline like OutboxStore.bounded.
// - linger mode: producers committing rows while the invocation runs, by real timers (lateRows)
//   or just before a given operation (racingRows); each commit NOTIFYs every LISTENer at once
//   (the insert trigger, statement-level, one notification per commit); the probe
//   (newestPendingSql) on the table as it is; LISTEN on a connection of its own (watchInserts),
//   refused, hung, slow, or lost just before an insert, whose notification is lost with it.
//
// What they do not model: concurrent invocations (other relays), duplicates inside one publish
// (ProducerPublisher's one-by-one re-send after a record-level refusal), real sizes, partitions,
// OUTBOX_SENT_ROWS=delete, the `skip` parked policy, skipped_at, rollback's 2 s grace (10 ms
// here, ROLLBACK_GRACE_MS), retention's deletes (pruneChunk deletes nothing: every row is younger
// than the retention window), the waiting marks (clearStaleWaiting and markWaiting do nothing),
// the pool's statements outside a batch transaction (nothingClaimable, newestPending) running on a
// connection left inside a transaction, a connection lost other than under a COMMIT or a ROLLBACK,
// statement_timeout and idle_in_transaction_session_timeout, NOTIFY's delivery delay, a seq taken
// before a slower producer's (rows commit in seq order here).
import { Deadline } from '../../../src/budget.ts';
import { BrokerUnavailableError, DatabaseError, DeadlineExceededError, MessageRejectedError } from '../../../src/errors.ts';
import type { OutboxRow } from '../../../src/domain.ts';
import { classifySendError } from '../../../src/kafka/classify.ts';
import { toMessage, tooLarge } from '../../../src/kafka/message.ts';
import type { BatchTransaction, ClaimFilter, ClaimedRow, InsertWatch, NothingClaimable, OutboundMessage, PruneTarget, PublishOutcome, Publisher, Store } from '../../../src/loop/ports.ts';
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
   * fail: refused when the server runs it, nothing applied, the transaction ended. lost: applied,
   * then the connection closed before the answer reached us. hang-applied: applied, and the
   * connection answers nothing more. hang-unapplied: the server never runs it: the connection
   * answers nothing more, and the transaction stays open until the connection closes.
   */
  | { op: 'commit' | 'mark'; call: number; kind: 'fail' | 'lost' | 'hang-applied' | 'hang-unapplied' }
  /**
   * The `call`-th rollback() of an open transaction. fail: the connection breaks (the server rolls
   * the transaction back as it closes; the client hears of the close). hang: the connection answers
   * nothing more: the ROLLBACK never runs, the transaction stays open, holding its locks and its
   * writes, until the connection closes. slow: the server runs it, after the client's grace ran out.
   */
  | { op: 'rollback'; call: number; kind: 'fail' | 'hang' | 'slow' };

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
  /**
   * event-loop turns the server takes to run each statement, after those sent before it on its
   * connection (cycled): a COMMIT is applied that much after it was sent, and answered after that.
   * Default: `latencies`.
   */
  serverLatencies?: number[];
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
  /** the server's transactions (BEGIN to COMMIT, ROLLBACK or close), by id - 1 */
  readonly serverTxs: ServerTx[] = [];
  /** every connection the client opened */
  readonly conns: FakeConn[] = [];
  /** told when a connection closes under the client (postgres.js' onclose: Runtime calls OutboxStore.loseConnection) */
  onConnectionClosed: () => void = () => undefined;
  /** aggregate → server transaction id holding its advisory lock */
  readonly aggregateLocks = new Map<string, number>();
  /** seq → server transaction id holding its row lock (FOREIGN: not a relay's transaction) */
  readonly rowLocks = new Map<number, number>();
  /** faults that fired, by kind */
  readonly fired: string[] = [];
  ops = 0;
  dead = false;
  diedAt?: string;
  private latencyIndex = 0;
  private serverLatencyIndex = 0;
  private readonly death = Promise.withResolvers<void>();
  private readonly calls = new Map<string, number>();

  /** LISTENers (watchInserts): told of every insert, like the insert trigger at COMMIT */
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

  /** The server at work on a statement: the generated turns. The server does not die with the process. */
  async serverTurns(): Promise<void> {
    const latencies = this.plan.serverLatencies ?? this.plan.latencies;
    const turns = latencies.length ? (latencies[this.serverLatencyIndex++ % latencies.length] ?? 0) : 0;
    for (let i = 0; i < turns; i++) await new Promise<void>((resolve) => setImmediate(resolve));
  }

  /** An answer, as the process sees it: never, once the process died. */
  async alive<T>(answer: Promise<T>): Promise<T> {
    try {
      return await answer;
    } finally {
      if (this.dead) await NEVER;
    }
  }

  /** A new connection of the client (postgres.js opens one per slot, up to max). */
  connect(): FakeConn {
    const conn = new FakeConn(this.conns.length + 1, this);
    this.conns.push(conn);
    return conn;
  }

  /** BEGIN on `conn`: a new server transaction, or, when one is still open there, the same (Postgres: WARNING, there is already a transaction in progress). */
  begin(conn: FakeConn, member: FakeTx): ServerTx {
    let stx = conn.tx;
    if (!stx) {
      stx = new ServerTx(this.serverTxs.length + 1, conn);
      this.serverTxs.push(stx);
      conn.tx = stx;
    } else {
      this.trace.push(`   tx${member.id}'s BEGIN found transaction s${stx.id} still open on connection c${conn.id} (left by ${stx.members.map((m) => `tx${m.id}`).join(', ')}): it goes on in it`);
    }
    stx.members.push(member);
    return stx;
  }

  /** COMMIT of `stx`, sent by `by`: every write in it is applied, whichever batch transaction wrote it, and its locks go. */
  commitServerTx(stx: ServerTx, by: FakeTx): void {
    const marks = [...stx.sent, ...(stx.savepoint ?? [])];
    const writers = new Set([...marks.map(([, m]) => m), ...stx.failures.map((f) => f.by)]);
    for (const m of writers) {
      if (m === by) continue;
      // m's own COMMIT or ROLLBACK would have ended this transaction before `by` began in it
      const how = m.rolledBack ? `rolled back by the loop (its ROLLBACK ${m.rollbackSent ? 'sent, not answered' : 'never sent: the client was poisoned'})` : `ended by the loop without its COMMIT reaching the server`;
      this.violation(
        `tx${m.id} was ${how}, yet its writes [${marks.filter(([, x]) => x === m).map(([seq]) => seq).join(',')}] were committed by tx${by.id}'s COMMIT: its connection c${stx.conn.id} went back to the pool inside its transaction, and tx${by.id}'s BEGIN went on in it`,
      );
    }
    const now = Date.now();
    for (const [seq] of marks) {
      const row = this.rows.get(Number(seq));
      if (row && !row.sent) row.sent = true;
    }
    for (const { failure: f } of stx.failures) {
      const row = this.rows.get(Number(f.seq));
      if (!row) continue;
      row.attempts++;
      row.nextAttemptAt = now + Math.round(f.delayMs);
      row.parked = f.park;
      this.committedFailures.push({ seq: row.seq, park: f.park });
    }
    this.endServerTx(stx, 'committed');
  }

  /** ROLLBACK of `stx`, a COMMIT the server refused, or its connection closing: nothing of it stays. */
  endServerTx(stx: ServerTx, how: 'committed' | 'rolled back'): void {
    if (stx.state !== 'open') return;
    stx.state = how;
    if (stx.conn.tx === stx) stx.conn.tx = undefined;
    this.release(stx.id);
  }

  /** Server transactions still open on connections that are not closed (holding their locks and writes). */
  openServerTxs(): ServerTx[] {
    return this.serverTxs.filter((t) => t.state === 'open');
  }

  /**
   * After a crash: the server runs what the dead process had sent (a COMMIT written before the
   * death commits), then sees its connections close and rolls back what is still open.
   */
  async afterDeath(): Promise<void> {
    await this.serverIdle();
    for (const c of this.conns) c.closeNow();
  }

  /** Until the server has run every statement sent to it, except on connections that answer nothing more (a slow one may take ms). */
  async serverIdle(): Promise<void> {
    const until = performance.now() + 2_000;
    for (let i = 0; this.conns.some((c) => c.pending > 0 && !c.stuck) && performance.now() < until; i++) {
      await new Promise<void>((resolve) => (i < 1_000 ? setImmediate(resolve) : setTimeout(resolve, 1)));
    }
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

/** A delay that does not keep the process alive (a crashed run may leave one behind). */
function sleepMs(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

/**
 * Deadline.race, with a timer that does not keep the process alive: a statement of a crashed run
 * never answers, and its race must not hold the test for the rest of a roomy deadline.
 */
async function race<T>(deadline: Deadline, what: string, answer: Promise<T>, onTimeout: () => void): Promise<T> {
  answer.catch(() => undefined);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      onTimeout();
      reject(new DeadlineExceededError(what));
    }, deadline.remaining()).unref();
  });
  try {
    return await Promise.race([answer, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** what postgres.js rejects a statement with when its connection closed (Runtime's onclose has told the store) */
function connectionClosed(what: string): DatabaseError {
  return new DatabaseError(`database error while ${what}: write CONNECTION_CLOSED (CONNECTION_CLOSED)`);
}

/**
 * BatchTx.rollback's grace (deadlineFree: 2 000 ms in src/outbox/store.ts), shortened for the
 * model's many runs. It runs out only for a ROLLBACK that cannot answer in time (the fault, or a
 * connection that answers nothing more): 2 s are far above any answer's latency in production,
 * and a loaded test machine must not make the model's grace run out for a healthy one.
 */
export const ROLLBACK_GRACE_MS = 10;

/** postgres.js' max connections of the relay's client (Runtime.connect) */
const POOL_SIZE = 3;

/**
 * How BatchTx ends a transaction whose end the server has not confirmed: a ROLLBACK not sent (the
 * client is poisoned) or not answered in its grace, a COMMIT not answered on a poisoned client.
 * - 'abandon': BatchTx since 3583737 (src/outbox/store.ts, OutboxStore.abandon): the whole client
 *   is ended (sql.end({ timeout: 0 })), the server runs what it was sent and rolls back what is
 *   open as each connection closes, and nothing of the pool is used again (retention included).
 * - 'release': BatchTx before it, kept to show what the model sees of it: the connection goes back
 *   to the pool as it is, its transaction possibly still open on the server, holding its locks and
 *   writes; the next transaction that reserves it goes on in that transaction, and its COMMIT
 *   commits them.
 */
export type UnconfirmedEnd = 'release' | 'abandon';

export class FakeStore implements Store {
  /** OutboxStore.poisoned: a statement lost its race with the deadline, a rollback was not confirmed, or a connection closed */
  poisoned = false;
  /** abandon(): the client was ended */
  private ended = false;
  /** OutboxStore.connectionLost: a connection of the client closed under it */
  connectionLost = false;
  /** the pool (postgres.js): idle connections, first released first reused */
  private readonly idle: FakeConn[] = [];
  /** connections of the client that are not closed (at most POOL_SIZE) */
  private readonly live = new Set<FakeConn>();
  /** reserve() calls waiting for a connection */
  private readonly waiting: Array<{ give: (c: FakeConn) => void; fail: (err: Error) => void }> = [];

  constructor(
    readonly world: World,
    readonly unconfirmedEnd: UnconfirmedEnd = 'abandon',
  ) {
    world.onConnectionClosed = () => this.loseConnection();
  }

  /** OutboxStore.bounded: the answer raced against the deadline; losing poisons the client. A spent deadline rejects before anything is sent. */
  async bounded<T>(deadline: Deadline, what: string, send: () => Promise<T>): Promise<T> {
    if (deadline.expired()) {
      this.poisoned = true;
      throw new DeadlineExceededError(what);
    }
    return race(deadline, what, send(), () => (this.poisoned = true));
  }

  /** OutboxStore.unusable: the cause a poisoned client's refusals report */
  unusable(what: string): Error | undefined {
    if (!this.poisoned) return undefined;
    return this.connectionLost ? new DatabaseError(`a database connection closed before ${what}`) : new DeadlineExceededError(what);
  }

  /** OutboxStore.loseConnection (and what Runtime's onclose does before calling it) */
  loseConnection(): void {
    this.connectionLost = this.poisoned = true;
    if (this.unconfirmedEnd === 'abandon') this.abandon();
    for (const w of this.waiting.splice(0)) w.fail(connectionClosed('reserving a database connection'));
  }

  /** OutboxStore.abandon ('abandon' only): end the client; every connection closes once the server has what was sent on it */
  abandon(): void {
    this.poisoned = true;
    if (this.ended) return;
    this.ended = true;
    this.world.trace.push('   the client is ended (abandon): its connections close');
    for (const c of this.live) c.end();
    // Runtime's onclose, for each connection that closes
    this.connectionLost = true;
    for (const w of this.waiting.splice(0)) w.fail(connectionClosed('reserving a database connection'));
  }

  /** postgres.js reserve(): an idle connection, else a new one while below max, else wait for a release */
  private take(): Promise<FakeConn> {
    for (const c of [...this.live]) if (c.closed) this.live.delete(c);
    let idle = this.idle.shift();
    while (idle?.closed) idle = this.idle.shift();
    if (idle) return Promise.resolve(idle);
    if (this.live.size < POOL_SIZE) {
      const c = this.world.connect();
      this.live.add(c);
      return Promise.resolve(c);
    }
    return new Promise((give, fail) => this.waiting.push({ give, fail }));
  }

  /** postgres.js release(): back to the pool as it is, inside a transaction or not; to a waiting reserve() first */
  release(conn: FakeConn): void {
    if (conn.closed) {
      this.live.delete(conn);
      const next = this.waiting.shift();
      if (next) void this.take().then(next.give, next.fail);
      return;
    }
    const next = this.waiting.shift();
    if (next) next.give(conn);
    else this.idle.push(conn);
  }

  async begin(deadline: Deadline, after?: BatchTransaction): Promise<FakeTx> {
    const w = this.world;
    // OutboxStore.begin: the connection of the transaction whose COMMIT was just written, or a reserved one
    const handed = after instanceof FakeTx ? after.handOver() : undefined;
    const fault = handed ? undefined : w.storeFault('begin');
    if (!w.step(handed ? `begin (after tx${(after as FakeTx).id}'s COMMIT, on its connection)` : 'begin')) return NEVER;
    const op = w.ops;
    const at = w.now();
    let conn = handed;
    if (!conn) {
      if (this.connectionLost) throw connectionClosed('reserving a database connection');
      if (fault?.kind === 'fail') throw new DatabaseError('injected: could not reserve a connection');
      conn = await w.alive(this.bounded(deadline, 'reserving a database connection', () => (fault?.kind === 'hang' ? NEVER : this.take())));
    }
    await w.wire();
    const tx = new FakeTx(w.txs.length + 1, w, this, conn, deadline, op, at);
    w.txs.push(tx);
    // BEGIN and the timeouts go out now; the claim follows them down the connection
    tx.sendBegin();
    return tx;
  }

  async nothingClaimable(deadline: Deadline): Promise<NothingClaimable> {
    const w = this.world;
    const fault = w.storeFault('whyEmpty');
    if (!w.step('nothingClaimable')) return NEVER;
    const op = w.ops;
    return w.alive(
      this.bounded(deadline, 'checking why nothing was claimable', async () => {
        await w.wire();
        if (fault?.kind === 'fail') throw new DatabaseError('injected: whyEmpty failed');
        if (fault?.kind === 'hang') await NEVER;
        // whyEmptySql (hold policy)
        const now = Date.now();
        const rows = w.sortedRows();
        const blocked = firstBlocked(rows, now);
        const pending = rows.filter((r) => !r.sent && !r.parked);
        const claimable = pending.some((r) => r.nextAttemptAt <= now && !((blocked.get(r.aggregateid) ?? Infinity) < r.seq));
        const answer: NothingClaimable = claimable ? 'locked' : pending.length > 0 ? 'behind-failed-rows' : 'empty';
        w.whyEmpties.push({ op, at: w.now(), rowsSeen: w.rows.size, now, answer });
        return answer;
      }),
    );
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
    return w.alive(
      this.bounded(deadline, 'probing for new rows', async () => {
        await w.wire();
        if (fault?.kind === 'fail') throw new DatabaseError('injected: the probe for new rows failed');
        if (fault?.kind === 'hang') await NEVER;
        const pending = w.sortedRows().filter((r) => !r.sent && !r.parked);
        const newest = pending.length ? String(pending[pending.length - 1]!.seq) : null;
        w.probes.push({ op, at, rowsSeen: w.rows.size, newest });
        if (fault?.kind === 'slow') await sleepMs(fault.ms);
        if (w.dead) return NEVER;
        w.trace.push(`   newest pending: ${newest}`);
        return newest;
      }),
    );
  }

  /** LISTEN on a connection of its own; closing it ends the notifications */
  async watchInserts(deadline: Deadline, on: { insert(): void; lost(err: unknown): void }): Promise<InsertWatch> {
    const w = this.world;
    const fault = w.storeFault('listen');
    if (!w.step('watchInserts (LISTEN)')) return NEVER;
    // OutboxStore.watchInserts races LISTEN against the deadline (not bounded(): no other client is poisoned)
    if (deadline.expired()) throw new DeadlineExceededError('listening for new rows (LISTEN)');
    await w.wire();
    if (fault?.kind === 'fail') throw new DatabaseError('injected: LISTEN failed (a pooler in transaction mode?)');
    if (fault?.kind === 'hang') await deadline.race('listening for new rows (LISTEN)', NEVER);
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

  /**
   * Retention (loop/retention.ts, alongside the loop): `sql.begin` on a connection of the pool,
   * BEGIN, the DELETE (nothing old enough to delete in the model), COMMIT. A connection released
   * inside a transaction would have that transaction committed here.
   */
  async pruneChunk(column: PruneTarget, _retainMs: number, _limit: number, deadline: Deadline): Promise<number> {
    const w = this.world;
    const fault = w.storeFault('prune');
    if (!w.step(`pruneChunk(${column})`)) return NEVER;
    // OutboxStore.assertUsable: the pool's own transactions never run on a client known bad
    if (this.unconfirmedEnd === 'abandon' && this.poisoned) throw new DatabaseError('the database client was abandoned before pruning');
    return w.alive(
      this.bounded(deadline, 'pruning sent rows', async () => {
        await w.wire();
        if (fault?.kind === 'fail') throw new DatabaseError('injected: prune failed');
        if (fault?.kind === 'hang') await NEVER;
        const conn = await this.take();
        const tx = new FakeTx(w.txs.length + 1, w, this, conn, deadline, w.ops, w.now(), 'retention');
        w.txs.push(tx);
        tx.sendBegin();
        try {
          await conn.send(() => {
            const stx = tx.stx!;
            // COMMIT of an aborted transaction rolls it back
            if (stx.aborted) w.endServerTx(stx, 'rolled back');
            else w.commitServerTx(stx, tx);
          });
        } finally {
          tx.state = 'ended';
          tx.endedAt = w.now();
          this.release(conn);
        }
        return 0;
      }),
    );
  }
}

/** Per aggregate, the first row that failed and is backing off or parked (the claim's `blocked`, hold policy). */
export function firstBlocked(rows: RowState[], now: number): Map<string, number> {
  const blocked = new Map<string, number>();
  for (const r of rows) {
    if (r.sent || r.attempts === 0 || !(r.parked || r.nextAttemptAt > now)) continue;
    if (!blocked.has(r.aggregateid)) blocked.set(r.aggregateid, r.seq);
  }
  return blocked;
}

/**
 * A connection of the client, as the server sees it: statements run in the order they were sent,
 * each after the server's generated turns; the transaction open on it, if any.
 */
export class FakeConn {
  /** the transaction open on it, on the server */
  tx: ServerTx | undefined;
  closed = false;
  /** the server answers nothing more on it (a statement hung): nothing sent after runs, until it closes */
  stuck = false;
  /** statements sent and not yet run */
  pending = 0;
  /** the client ended it (end()): nothing more is sent, what was sent still reaches the server */
  private ending = false;
  private tail: Promise<void> = Promise.resolve();
  /** rejects once the client side is gone: answers still on their way never reach it */
  private readonly destroyed = Promise.withResolvers<never>();

  constructor(
    readonly id: number,
    private readonly w: World,
  ) {
    this.destroyed.promise.catch(() => undefined);
  }

  /** A statement sent on this connection; `run` is what the server does with it. Settles with its answer (never, if the connection hangs). */
  send<T>(run: () => T | Promise<T>): Promise<T> {
    if (this.closed || this.ending) return Promise.reject(connectionClosed('sending a statement'));
    this.pending++;
    const answer = this.tail.then(async () => {
      await this.w.serverTurns();
      if (this.closed) throw connectionClosed('waiting for an answer');
      return run();
    });
    this.tail = answer.then(
      () => void this.pending--,
      () => void this.pending--,
    );
    answer.catch(() => undefined);
    return Promise.race([answer, this.destroyed.promise]);
  }

  /** The statement being run hangs: the server answers nothing more on this connection. */
  hang(): Promise<never> {
    this.stuck = true;
    // a client that ends it does not wait for it
    if (this.ending) this.closeNow();
    return NEVER;
  }

  /** The client ends the connection (sql.end({ timeout: 0 })): its answers are lost now; the server runs what it received, then rolls back what is open. */
  end(): void {
    if (this.closed || this.ending) return;
    this.ending = true;
    this.destroyed.reject(new DatabaseError('database error: write CONNECTION_DESTROYED (CONNECTION_DESTROYED)'));
    if (this.stuck) this.closeNow();
    else void this.tail.then(() => this.closeNow());
  }

  /** The connection breaks under the statement being run: the server rolls back what is open, the client hears of the close. */
  die(what: string): never {
    this.closeNow();
    this.w.onConnectionClosed();
    throw connectionClosed(what);
  }

  /** Closed: the server rolls back the transaction open on it. */
  closeNow(): void {
    if (this.closed) return;
    this.closed = true;
    this.destroyed.reject(connectionClosed('waiting for an answer'));
    if (this.tx) this.w.endServerTx(this.tx, 'rolled back');
  }
}

/** A transaction on the server: from a BEGIN on a connection to its COMMIT, its ROLLBACK, or the connection's close. */
export class ServerTx {
  state: 'open' | 'committed' | 'rolled back' = 'open';
  /** the batch transactions whose BEGIN found it: more than one when a connection went back to the pool inside it and was reused */
  readonly members: FakeTx[] = [];
  /** rows marked sent in it before its latest SAVEPOINT (a ROLLBACK TO SAVEPOINT keeps them), and by whom */
  readonly sent = new Map<string, FakeTx>();
  /** rows marked sent since its latest SAVEPOINT premark, and by whom */
  savepoint: Map<string, FakeTx> | undefined;
  readonly failures: Array<{ failure: Failure; by: FakeTx }> = [];
  /** a statement failed: until ROLLBACK TO SAVEPOINT (recoverable), or until it ends (fatal) */
  aborted: 'recoverable' | 'fatal' | undefined;

  constructor(
    readonly id: number,
    readonly conn: FakeConn,
  ) {}

  /** SAVEPOINT premark: what was marked since the last one stays below it */
  savepointPremark(): void {
    for (const [seq, by] of this.savepoint ?? []) this.sent.set(seq, by);
    this.savepoint = new Map();
  }

  /** rows marked sent in this transaction, not committed yet: its own statements see them sent (keep mode moves them out) */
  marked(seq: number): boolean {
    const key = String(seq);
    return this.sent.has(key) || this.savepoint?.has(key) === true;
  }

  /** what a statement in an aborted transaction gets */
  refuse(): never {
    throw new DatabaseError('current transaction is aborted, commands ignored until end of transaction block (25P02)');
  }
}

type TxState = 'open' | 'committing' | 'ended';

/**
 * A batch transaction: the client side of BatchTx (src/outbox/store.ts), its states, who uses its
 * connection, hand-over, release and rollback copied from it; the statements run on a FakeConn.
 */
export class FakeTx implements BatchTransaction {
  state: TxState = 'open';
  /** who uses the connection: this transaction, or the next batch's (begin's `after`), once (BatchTx.connectionUser) */
  private connectionUser: 'this' | 'next' = 'this';
  /** when it ended or its COMMIT was sent (ms after the world began); with beganAt, the loop's batch times are within these */
  endedAt: number | undefined;
  /** every row this transaction claimed (G2: acked-but-unmarked rows must all be one batch's) */
  readonly claimed = new Set<string>();
  /** the server transaction its statements run in (set when its BEGIN runs) */
  stx: ServerTx | undefined;
  /** the loop ended it with rollback(); rollbackSent: the ROLLBACK went out (else the store was poisoned) */
  rolledBack = false;
  rollbackSent = false;
  private premarked: { seqs: Set<string>; written: boolean; aborting: boolean } | undefined;

  constructor(
    readonly id: number,
    private readonly w: World,
    private readonly store: FakeStore,
    private readonly conn: FakeConn,
    private readonly deadline: Deadline,
    /** the operation number of its begin() */
    readonly beginOp: number,
    /** when begin() was called (ms after the world began): in the same event-loop turn as the loop's decision to claim */
    readonly beganAt: number,
    /** a batch's, or retention's own (pruneChunk) */
    readonly kind: 'batch' | 'retention' = 'batch',
  ) {}

  /** BEGIN (and the timeouts) down the connection; nobody waits for its answer (OutboxStore.begin) */
  sendBegin(): void {
    this.conn.send(() => {
      this.stx = this.w.begin(this.conn, this);
      if (this.stx.aborted) this.stx.refuse();
    }).catch(() => undefined);
  }

  private expectOpen(what: string): void {
    if (this.state !== 'open') this.w.violation(`tx${this.id}: ${what} on a transaction that is ${this.state}`);
  }

  /** BatchTx.run: nothing is sent once a connection of the client closed; else bounded() */
  private run<T>(what: string, send: () => Promise<T>): Promise<T> {
    if (this.store.connectionLost) {
      return Promise.reject(new DatabaseError(`a database connection closed during the invocation (terminated by the server, failover or network) before ${what}; the batch is abandoned and its rows stay pending`));
    }
    return this.store.bounded(this.deadline, what, send);
  }

  async claim(limit: number, filter: ClaimFilter): Promise<ClaimedRow[]> {
    const w = this.w;
    const fault = w.storeFault('claim');
    if (!w.step(`tx${this.id}.claim(${limit}, inFlight=[${filter.inFlight.join(',')}])`)) return NEVER;
    const op = w.ops;
    this.expectOpen('claim');
    const rows = await w.alive(
      this.run('claiming a batch', () =>
        this.conn.send(async () => {
          const stx = this.stx!;
          if (stx.aborted) stx.refuse();
          // the statement's snapshot, then its locks, a few turns later (the statement takes time)
          const snapshot = w.sortedRows().map((r) => ({ ...r, sent: r.sent || stx.marked(r.seq) }));
          const at = w.now();
          await w.serverTurns();
          if (fault?.kind === 'fail') {
            stx.aborted = 'fatal';
            throw new DatabaseError('injected: claim failed');
          }
          if (fault?.kind === 'hang') return this.conn.hang();
          if (this.state !== 'open') {
            w.violation(`tx${this.id}: claim ran after its transaction ended`);
            return [];
          }
          w.claims.push({ tx: this.id, op, at, ahead: filter.inFlight.length > 0, rowsSeen: snapshot.length, now: Date.now() });
          const rows = this.runClaim(limit, filter, snapshot, stx);
          w.trace.push(`   tx${this.id} claimed [${rows.map((r) => `${r.seq}${r.publishable ? '' : '(held)'}`).join(',')}]`);
          return rows;
        }),
      ),
    );
    const waiting = rows.filter((r) => !r.publishable);
    if (waiting.length === 0) return rows;
    // foreignGapsSql: a statement of its own, with a fresh snapshot
    if (!w.step(`tx${this.id}.foreignGaps`)) return NEVER;
    const foreign = await w.alive(
      this.run('checking held-back rows', () =>
        this.conn.send(() => {
          const stx = this.stx!;
          if (stx.aborted) stx.refuse();
          const foreign = new Set<string>();
          for (const gap of new Set(waiting.map((r) => Number(r.first_gap)))) {
            const row = w.rows.get(gap);
            const holder = w.rowLocks.get(gap);
            if (holder !== undefined && holder !== stx.id) {
              if (row && !row.sent) foreign.add(String(gap));
            } else {
              w.rowLocks.set(gap, stx.id);
            }
          }
          return foreign;
        }),
      ),
    );
    for (const r of waiting) r.waitsOnForeignLock = foreign.has(r.first_gap ?? '');
    return rows;
  }

  /** claimStatement, hold policy: run now, on `snapshot` (the statement's), with live locks and EvalPlanQual. */
  private runClaim(limit: number, filter: ClaimFilter, snapshot: RowState[], stx: ServerTx): ClaimedRow[] {
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
      if (aggHolder !== undefined && aggHolder !== stx.id) continue;
      w.aggregateLocks.set(r.aggregateid, stx.id);
      // FOR UPDATE SKIP LOCKED
      const rowHolder = w.rowLocks.get(r.seq);
      if (rowHolder !== undefined && rowHolder !== stx.id) continue;
      // EvalPlanQual: a row updated since the snapshot is re-checked on its latest version
      const live = w.rows.get(r.seq)!;
      if (live.sent || stx.marked(live.seq) || live.parked || !(live.nextAttemptAt <= now)) continue;
      w.rowLocks.set(r.seq, stx.id);
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

  /** The fake's claim returns every payload (its rows carry no payload_bytes): asking for one left out is a bug of the loop. */
  readPayloads(rows: ClaimedRow[]): Promise<void> {
    if (rows.length > 0) this.w.violation(`tx${this.id}: readPayloads for [${rows.map((r) => r.seq).join(',')}], but the claim left no payload out`);
    return Promise.resolve();
  }

  premark(seqs: string[]): void {
    if (seqs.length === 0 || this.store.connectionLost) return;
    const w = this.w;
    const fault = w.storeFault('premark');
    if (!w.step(`tx${this.id}.premark([${seqs.join(',')}])`)) return;
    this.expectOpen('premark');
    this.premarked = { seqs: new Set(seqs), written: fault === undefined, aborting: fault?.kind === 'aborting' };
    // SAVEPOINT premark and the marks, uncommitted; nobody waits for them here (commitIfAllPremarked looks at `written`)
    this.run('marking rows sent', () =>
      this.conn.send(() => {
        const stx = this.stx!;
        if (stx.aborted) stx.refuse();
        if (fault?.kind === 'aborting') {
          stx.aborted = 'fatal';
          throw new DatabaseError('injected: SAVEPOINT failed');
        }
        stx.savepointPremark();
        if (fault?.kind === 'recoverable') {
          stx.aborted = 'recoverable';
          throw new DatabaseError('injected: marking rows failed');
        }
        for (const s of seqs) stx.savepoint!.set(s, this);
      }),
    ).catch(() => undefined);
  }

  async commitIfAllPremarked(sent: string[], failures: Failure[]): Promise<{ answer: Promise<void> } | undefined> {
    const pre = this.premarked;
    if (!pre || failures.length > 0 || sent.length !== pre.seqs.size || !sent.every((s) => pre.seqs.has(s))) return undefined;
    if (!pre.written) return undefined;
    const w = this.w;
    const fault = w.storeFault('commit');
    if (!w.step(`tx${this.id}.COMMIT [${sent.join(',')}]`)) return NEVER;
    this.expectOpen('COMMIT');
    this.premarked = undefined;
    let written = false;
    const answer = (async () => {
      let failure: Error | undefined;
      try {
        await this.run('committing the batch', () => {
          written = true;
          return this.conn.send(() => this.serverCommit(sent, fault));
        });
      } catch (err) {
        failure = err as Error;
        // never written (the deadline spent, a connection closed): nothing applied
        if (!written) for (const s of sent) w.failedCommitRows.add(s);
      }
      if (!w.step(`tx${this.id}.COMMIT answered${failure ? ` (${failure.message})` : ''}`)) return NEVER;
      // BatchTx: the COMMIT's answer (or its failure) ends the transaction; an unanswered one on
      // a poisoned client ends the client (endUnconfirmed; before 3583737: released as well)
      if (failure && this.store.unconfirmedEnd === 'abandon' && this.store.poisoned) this.endUnconfirmed();
      else this.end();
      if (failure) throw failure;
    })();
    answer.catch(() => undefined);
    this.state = 'committing';
    this.endedAt = w.now();
    // socketsFlushed: the COMMIT is on the wire when this resolves
    await w.wire();
    return { answer };
  }

  /** the server runs the COMMIT */
  private serverCommit(sent: string[], fault: FaultOf<StoreFault, 'commit'> | undefined): void | Promise<never> {
    const w = this.w;
    const stx = this.stx!;
    this.checkOwnRows('COMMIT', sent);
    if (fault?.kind === 'hang-unapplied') {
      for (const s of sent) w.failedCommitRows.add(s);
      return this.conn.hang();
    }
    if (fault?.kind === 'fail' || stx.aborted) {
      for (const s of sent) w.failedCommitRows.add(s);
      w.endServerTx(stx, 'rolled back');
      throw new DatabaseError(fault?.kind === 'fail' ? 'injected: COMMIT failed (serialization failure)' : 'current transaction is aborted: COMMIT rolled it back');
    }
    w.commitServerTx(stx, this);
    if (fault?.kind === 'lost') this.conn.die('committing the batch (injected: the connection closed before the COMMIT answered)');
    if (fault?.kind === 'hang-applied') return this.conn.hang();
  }

  /** BatchTx.handOver: the connection, for the next batch's transaction, while this one's COMMIT is on the wire; once. */
  handOver(): FakeConn | undefined {
    if (this.state !== 'committing' || this.connectionUser !== 'this' || this.store.connectionLost) return undefined;
    this.connectionUser = 'next';
    return this.conn;
  }

  /** BatchTx.end: the transaction is over: release the connection unless the next batch's transaction has it. */
  private end(): void {
    if (this.state === 'ended') return;
    this.state = 'ended';
    if (this.connectionUser === 'this') this.store.release(this.conn);
  }

  /** BatchTx.endUnconfirmed: never release the connection; end the client */
  private endUnconfirmed(): void {
    if (this.state === 'ended') return;
    this.state = 'ended';
    this.store.abandon();
  }

  async markAndCommit(sent: string[], failures: Failure[]): Promise<void> {
    const w = this.w;
    const fault = w.storeFault('mark');
    if (!w.step(`tx${this.id}.markAndCommit sent=[${sent.join(',')}] failed=[${failures.map((f) => `${f.seq}${f.park ? '(park)' : ''}`).join(',')}]`)) return NEVER;
    this.expectOpen('markAndCommit');
    const pre = this.premarked;
    this.premarked = undefined;
    this.endedAt = w.now();
    // ROLLBACK TO SAVEPOINT, the marks, the failures, COMMIT: sent at once (one round trip)
    let written = false;
    let failure: Error | undefined;
    try {
      await w.alive(
        this.run('committing the batch', () => {
          written = true;
          return this.conn.send(() => this.serverMarkAndCommit(pre !== undefined, sent, failures, fault));
        }),
      );
    } catch (err) {
      failure = err as Error;
      if (!written) for (const s of sent) w.failedCommitRows.add(s);
    }
    if (failure) {
      await this.rollback();
      throw failure;
    }
    this.end();
  }

  /** the server runs markAndCommit's statements */
  private serverMarkAndCommit(premarked: boolean, sent: string[], failures: Failure[], fault: FaultOf<StoreFault, 'mark'> | undefined): void | Promise<never> {
    const w = this.w;
    const stx = this.stx!;
    this.checkOwnRows('markAndCommit', [...sent, ...failures.map((f) => f.seq)]);
    if (fault?.kind === 'hang-unapplied') {
      for (const s of sent) w.failedCommitRows.add(s);
      return this.conn.hang();
    }
    if (premarked) {
      // ROLLBACK TO SAVEPOINT premark: fails when the SAVEPOINT itself did
      if (stx.aborted === 'fatal' || !stx.savepoint) stx.aborted = 'fatal';
      else {
        stx.savepoint = new Map();
        stx.aborted = undefined;
      }
    }
    if (stx.aborted || fault?.kind === 'fail') {
      // a statement failed: the transaction is aborted, and its COMMIT rolls it back
      for (const s of sent) w.failedCommitRows.add(s);
      w.endServerTx(stx, 'rolled back');
      throw new DatabaseError(fault?.kind === 'fail' ? 'injected: marking failed' : 'injected: the premark savepoint failed; current transaction is aborted');
    }
    for (const s of sent) stx.sent.set(s, this);
    for (const f of failures) stx.failures.push({ failure: f, by: this });
    w.commitServerTx(stx, this);
    if (fault?.kind === 'lost') this.conn.die('committing the batch (injected: the connection closed before the COMMIT answered)');
    if (fault?.kind === 'hang-applied') return this.conn.hang();
  }

  /** BatchTx.rollback: never throws; a no-op unless the transaction is open. */
  async rollback(): Promise<void> {
    if (this.state !== 'open') return;
    const w = this.w;
    const fault = w.storeFault('rollback');
    const poisoned = this.store.poisoned;
    if (!w.step(`tx${this.id}.ROLLBACK${poisoned ? ' (not sent: the client is poisoned)' : ''}`)) return NEVER;
    this.rolledBack = true;
    this.endedAt = w.now();
    if (this.store.unconfirmedEnd === 'abandon') return this.rollbackOrAbandon(poisoned, fault);
    // BatchTx.rollback before 3583737: the connection released whatever became of the ROLLBACK
    try {
      if (!poisoned) {
        this.rollbackSent = true;
        await this.deadlineFree(this.conn.send(() => this.serverRollback(fault)), fault?.kind === 'hang' || fault?.kind === 'slow');
      }
    } catch {
      this.store.poisoned = true;
    } finally {
      this.end();
    }
    if (w.dead) return NEVER;
  }

  /** BatchTx.rollback: the connection goes back to the pool only once the server answered the ROLLBACK; else the client is ended */
  private async rollbackOrAbandon(poisoned: boolean, fault: FaultOf<StoreFault, 'rollback'> | undefined): Promise<void> {
    this.state = 'ended';
    if (this.connectionUser !== 'this') return;
    if (!poisoned) {
      try {
        this.rollbackSent = true;
        await this.deadlineFree(this.conn.send(() => this.serverRollback(fault)), fault?.kind === 'hang' || fault?.kind === 'slow');
        if (this.w.dead) return NEVER;
        this.store.release(this.conn);
        return;
      } catch {
        // not confirmed: the transaction may still be open on the server
      }
    }
    if (this.w.dead) return NEVER;
    this.store.abandon();
  }

  /** the server runs the ROLLBACK */
  private async serverRollback(fault: FaultOf<StoreFault, 'rollback'> | undefined): Promise<void> {
    if (fault?.kind === 'hang') return this.conn.hang();
    if (fault?.kind === 'fail') this.conn.die('rolling back (injected: the connection broke)');
    if (fault?.kind === 'slow') await sleepMs(2 * ROLLBACK_GRACE_MS);
    // outside a transaction (a COMMIT ran first): a warning, nothing else
    if (this.conn.tx) this.w.endServerTx(this.conn.tx, 'rolled back');
  }

  /** BatchTx.deadlineFree: a grace of its own (ROLLBACK_GRACE_MS here), whatever the deadline; `late`: the answer will not come in time */
  private async deadlineFree<T>(p: Promise<T>, late: boolean): Promise<T> {
    p.catch(() => undefined);
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<never>((_, reject) => {
      const check = () => {
        if (late || this.conn.stuck) reject(new Error('rollback timed out'));
        else timer = setTimeout(check, ROLLBACK_GRACE_MS).unref();
      };
      timer = setTimeout(check, ROLLBACK_GRACE_MS).unref();
    });
    try {
      return await Promise.race([p, graceOver]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** when the server runs the statement: the rows it marks are locked by its transaction */
  private checkOwnRows(what: string, seqs: string[]): void {
    for (const s of seqs) if (lockHolder(this.w, s) !== this.stx?.id) this.w.violation(`tx${this.id}: ${what} of row ${s}, which this transaction does not hold`);
  }
}

function lockHolder(w: World, seq: string): number | undefined {
  return w.rowLocks.get(Number(seq));
}

export class FakePublisher implements Publisher {
  readonly connects = 1;

  constructor(
    private readonly w: World,
    /** the store, to tell a batch whose transaction a closed connection ended under the loop (it learns at its next statement) */
    private readonly store?: FakeStore,
  ) {}

  /** rows become messages as ProducerPublisher's do */
  toMessage(row: OutboxRow, topicTemplate: string): OutboundMessage {
    return toMessage(row, topicTemplate);
  }

  tooLarge(m: OutboundMessage, limitBytes: number, unreadValueBytes?: number): MessageRejectedError | undefined {
    return tooLarge(m, limitBytes, unreadValueBytes);
  }

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
      const stx = holder === undefined || holder === FOREIGN ? undefined : w.serverTxs[holder - 1];
      if (stx?.state !== 'open' || !stx.members.some((t) => t.state === 'open')) w.violation(`publish#${call}: row ${m.seq} is sent while no open transaction of the invocation holds it`);
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
