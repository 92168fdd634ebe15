// Harness of the model-based test of the real claim/mark SQL on the real Postgres
// (test/model/model.test.ts says what it checks and why). A scenario is plain data (steps), so
// that fast-check can generate and shrink it and a regression test can replay a counterexample
// literally. Everything here is real except Kafka: the relay loop (runInvocation), OutboxStore on a
// postgres.js client per relay (built as src/lambda/runtime.ts builds its client, and replaced when the
// Runtime would replace it), the migrations, the operator functions of src/outbox/admin.ts. The
// publisher is a fake whose outcome per publish call the scenario chooses; it records every ack
// with the transaction of the batch it belongs to (G1) and checks every first publication against
// the order the rows committed in (G4). A test-only trigger on the sent table notes the transaction
// that moved each row there (World.addMarkLog); under OUTBOX_SENT_ROWS=delete another, on the
// outbox, notes the rows a relay deleted (World.createTable). Each run's table has the scenario's
// shape (plain, partitioned by range or hash, with or without the application's columns named like
// the statements' aliases) and its relays the scenario's settings (Shape, Settings).
import { randomBytes } from 'node:crypto';
import { appendFileSync } from 'node:fs';
import postgres, { type ReservedSql, type Sql } from 'postgres';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { type Config } from '../../src/config/types.ts';
import { claimColumns, CREATED_EPOCH, settingColumns, type ClaimColumn, type Metadata, type OutboxRow, type ParkedPolicy } from '../../src/domain.ts';
import { BrokerUnavailableError, DatabaseError, MessageRejectedError, RelayError } from '../../src/errors.ts';
import { toMessage, tooLarge } from '../../src/kafka/message.ts';
import { createLogger } from '../../src/log.ts';
import type { BatchTransaction, InsertWatch, NothingClaimable, OutboundMessage, PruneTarget, PublishOutcome, Publisher, Store } from '../../src/loop/ports.ts';
import { retryParked, skipParked } from '../../src/outbox/admin.ts';
import * as q from '../../src/outbox/sql.ts';
import { partitionByRange, repartition } from '../integration/helpers.ts';
import { parseTableName, qualified, sentTable, type TableName } from '../../src/outbox/identifier.ts';
import { dropOutbox, migrate } from '../../src/outbox/migrate.ts';
import { CLIENT_OPTIONS } from '../../src/outbox/client.ts';
import { isConnectionLost } from '../../src/outbox/db-errors.ts';
import { OutboxStore } from '../../src/outbox/store.ts';
import { runInvocation, type Summary } from '../../src/loop/invocation.ts';

export const DATABASE_URL = process.env.TEST_DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:5432/outbox';
/** the relays' OUTBOX_MAX_BATCH_BYTES: smaller than three of the model's payloads (insertInto) */
export const MODEL_BATCH_BYTES = 100;
/** superuser, for pg_terminate_backend */
export const ADMIN_DATABASE_URL = process.env.TEST_ADMIN_DATABASE_URL ?? 'postgres://postgres:postgres@127.0.0.1:5432/outbox';

// ---------------------------------------------------------------------------------------------
// Scenarios: plain data

export type Agg = 'a' | 'b' | 'c';
/** aggregatetype: routes the row to topic outbox.event.<type>; one aggregate may change topic */
export type AggType = 'order' | 'user';

/** What a producer or an operator does; these may also run while invocations run (InvokeStep.side). */
export type Action =
  /**
   * one producer transaction: insert n rows of the aggregate, commit. `old`: with an explicit
   * created_at a day back (the range shape's older partition, where ctids repeat the newer one's)
   */
  | { kind: 'insert'; agg: Agg; type: AggType; n: number; old?: true }
  /** insert n rows in producer transaction `tx` (opened if it is not), without committing; `old` as for insert */
  | { kind: 'open'; tx: 0 | 1; agg: Agg; type: AggType; n: number; old?: true }
  /** commit producer transaction `tx`, if open */
  | { kind: 'commit'; tx: 0 | 1 }
  /** the rows backing off (failed, not parked) become due now: time need not pass */
  | { kind: 'due' }
  /** by hand: UPDATE one pending, unparked row SET next_attempt_at = now() + 1 hour, attempts = 0 */
  | { kind: 'notDue'; pick: number }
  /** by hand: DELETE one unsent row */
  | { kind: 'delete'; pick: number }
  /** `parked skip` of one parked row (src/outbox/admin.ts skipParked) */
  | { kind: 'skip'; pick: number }
  /**
   * `n` rows sent two days ago appear in the sent table (of aggregatetype OLD_SENT, not the model's:
   * the checks leave them out), so that retention has chunks to delete while the loop runs, as
   * when it is behind
   */
  | { kind: 'oldSent'; n: number };

/**
 * Operator steps that run only between invocations: each can take a parked row's excuse back (a
 * row parked under `skip` may be passed; once retried or reset it may not), and the G4 check reads
 * the excuse when the later row is published, so they must not race a claim that saw the row parked.
 */
export type OperatorStep =
  /** `parked retry` of one parked row, or of all */
  | { kind: 'retry'; pick: number | 'all' }
  /** by hand: UPDATE one failed or parked row SET attempts = 0, next_attempt_at = '-infinity', parked_at = NULL */
  | { kind: 'reset'; pick: number }
  /** OUTBOX_PARKED_POLICY for the next invocations (a redeploy: the relays' stores are rebuilt) */
  | { kind: 'policy'; policy: ParkedPolicy };

/**
 * The fake publisher's answer to one publish call. `at` picks a message (modulo the call's count):
 * - ack: every message acked
 * - reject / rejectPermanent: that message refused for itself (charged an attempt; permanent: parked
 *   at once), the later messages of its key left pending as the real publisher does, the rest acked
 * - backoff: that message's topic refused as a whole (not charged), the other topics acked
 * - unavailable: the first `at` messages acked, then the broker is gone
 * `delayMs`: the call answers that much later (the broker appends at the call's start); an answer
 * later than the send deadline is lost, as ProducerPublisher gives up: unavailable, nothing acked
 */
export interface Outcome {
  kind: 'ack' | 'reject' | 'rejectPermanent' | 'backoff' | 'unavailable';
  at: number;
  delayMs: number;
}

export interface InvocationSpec {
  /** which relay (its own postgres.js client, warm across invocations) */
  relay: 0 | 1 | 2;
  deadlineMs: number;
  /** outcome of publish call k; calls past the list are acked */
  publishes: Outcome[];
}

/**
 * pg_terminate_backend of the relay client's backends (by application_name): of invocation `inv`'s
 * relay (modulo the step's invocations), `afterMs` after the step began or `waitMs` into its publish
 * call `publish` (the call waits until the client has seen the close; meanwhile the claim ahead,
 * sent just before the publish, reaches the database). Target: one backend
 * (`pick` modulo their count, by pid) among any, among those idle (not in a transaction), among
 * those in a transaction, or among those that hold no advisory lock (not a batch transaction: idle,
 * retention, the waiting marks); or the newest batch transaction (holding the aggregates' advisory
 * locks: while a batch is sent, the claim ahead); or all of them.
 */
export interface Fault {
  inv: number;
  at: { afterMs: number } | { publish: number; waitMs?: number };
  target: 'any' | 'idle' | 'intx' | 'all' | 'newestBatch' | 'notBatch';
  pick: number;
}

export interface InvokeStep {
  kind: 'invoke';
  /** run concurrently, each on its own relay */
  invocations: InvocationSpec[];
  faults: Fault[];
  /** producer and operator actions run `afterMs` after the step began, one after another, while the invocations run */
  side: Array<{ afterMs: number; action: Action }>;
}

export type Step = Action | OperatorStep | InvokeStep;

/**
 * The outbox's shape, made by migrate and then rebuilt (its columns, defaults, identity, checks,
 * non-unique indexes and triggers kept; no unique index, which a partitioned table's must include
 * the key):
 * - plain: as migrate makes it;
 * - range: PARTITION BY RANGE (created_at), split a minute before the run's start: the producers'
 *   rows land in the newer partition, those inserted `old` in the older, at the same ctids
 *   (partitionByRange, test/integration/helpers.ts);
 * - hash: PARTITION BY HASH (`column`) in `partitions` partitions (partitionByHash below): by
 *   aggregateid an aggregate's rows share a partition and a batch spans several; by seq an
 *   aggregate's rows are spread over them.
 * The sent table stays plain.
 */
export type Shape = { kind: 'plain' } | { kind: 'range' } | { kind: 'hash'; column: 'aggregateid' | 'seq'; partitions: 2 | 3 };

/**
 * The relay's settings that change its statements or its messages (each reaches the code under the
 * model: World.config's env, the store's options, the fake publisher's real toMessage):
 * - sentRows: OUTBOX_SENT_ROWS, the mark's statement (moveSentSql or deleteSentSql);
 * - key: OUTBOX_KEY_COLUMN, the message key toMessage makes (the claim and the marks do not change:
 *   the order guard, the fake publisher's refusals and G4 are per aggregateid whatever the key);
 * - placement: OUTBOX_ADDITIONAL_PLACEMENT: `default` (unset: type as a header), `none`, or one
 *   column placed as the header x_placed: type (a row column), created_at or tid (an application's
 *   column, with appColumns): the latter two are read by the claim (claimColumns' `placed`);
 * - metadata: OUTBOX_METADATA: none, timestamp,seq (the claim reads created_epoch, the message gets
 *   its timestamp and a seq header) or cloudevents (OUTBOX_CLOUDEVENTS_SOURCE=/model: created_epoch
 *   read, the ce_ headers).
 */
export interface Settings {
  sentRows: 'keep' | 'delete';
  key: 'aggregateid' | 'id' | 'type';
  placement: 'default' | 'none' | 'type' | 'created_at' | 'tid';
  metadata: 'none' | 'timestamp,seq' | 'cloudevents';
}

/** the regressions' shape and settings (written before either was drawn) */
export const PLAIN: Shape = { kind: 'plain' };
export const DEFAULT_SETTINGS: Settings = { sentRows: 'keep', key: 'aggregateid', placement: 'default', metadata: 'none' };

export interface Scenario {
  /** the outbox's shape (default plain) */
  shape?: Shape;
  /** the outbox has a text column named like every alias and CTE of the relay's statements (appColumnNames) */
  appColumns?: boolean;
  /** default DEFAULT_SETTINGS */
  settings?: Settings;
  /** the relay clients' pool size: the Runtime's 3 (two batch transactions and one for retention or the waiting marks), or 4 */
  poolMax: 3 | 4;
  batchSize: number;
  maxAttempts: number;
  backoffBaseMs: number;
  /** OUTBOX_PARKED_POLICY at the start */
  policy: ParkedPolicy;
  steps: Step[];
  /** the final phase's policy (it retries every parked row either way) */
  finalPolicy: ParkedPolicy;
}

// ---------------------------------------------------------------------------------------------
// Printing

function fmtOutcome(o: Outcome): string {
  const what = o.kind === 'ack' ? 'ack' : o.kind === 'unavailable' ? `unavailable after ${o.at} acks` : `${o.kind}@${o.at}`;
  return o.delayMs ? `${what} +${o.delayMs}ms` : what;
}

function fmtAction(a: Action | OperatorStep): string {
  switch (a.kind) {
    case 'insert':
      return `insert ${a.agg}×${a.n} (${a.type}${a.old ? ', created a day ago' : ''})`;
    case 'open':
      return `tx${a.tx}: insert ${a.agg}×${a.n} (${a.type}${a.old ? ', created a day ago' : ''}), uncommitted`;
    case 'commit':
      return `tx${a.tx}: commit`;
    case 'due':
      return 'make backing-off rows due';
    case 'notDue':
      return `by hand: not due for an hour, attempts 0 (pending row #${a.pick})`;
    case 'delete':
      return `by hand: DELETE unsent row #${a.pick}`;
    case 'skip':
      return `parked skip (parked row #${a.pick})`;
    case 'oldSent':
      return `${a.n} rows sent two days ago in the sent table (retention's work)`;
    case 'retry':
      return a.pick === 'all' ? 'parked retry --all' : `parked retry (parked row #${a.pick})`;
    case 'reset':
      return `by hand: reset attempts, due, unparked (failed row #${a.pick})`;
    case 'policy':
      return `OUTBOX_PARKED_POLICY=${a.policy}`;
  }
}

export function fmtStep(s: Step): string {
  if (s.kind !== 'invoke') return fmtAction(s);
  const invs = s.invocations.map((i) => `relay${i.relay} ${i.deadlineMs}ms [${i.publishes.map(fmtOutcome).join(', ') || 'ack all'}]`).join(' ‖ ');
  const faults = s.faults.map((f) => `kill ${f.target === 'all' ? 'all' : `${f.target}#${f.pick}`} of inv${f.inv % s.invocations.length} ${'afterMs' in f.at ? `at +${f.at.afterMs}ms` : `at publish#${f.at.publish}${f.at.waitMs ? ` +${f.at.waitMs}ms` : ''}`}`);
  const side = s.side.map((x) => `+${x.afterMs}ms ${fmtAction(x.action)}`);
  return `invoke ${invs}${faults.length ? `; faults: ${faults.join(', ')}` : ''}${side.length ? `; meanwhile: ${side.join(', ')}` : ''}`;
}

export function fmtShape(shape: Shape = PLAIN, appColumns = false): string {
  const what = shape.kind === 'plain' ? 'plain' : shape.kind === 'range' ? 'partitioned by range (created_at), 2 partitions' : `partitioned by hash (${shape.column}), ${shape.partitions} partitions`;
  return `${what}${appColumns ? ', with application columns named like the statements\' aliases' : ''}`;
}

export function fmtSettings(s: Settings = DEFAULT_SETTINGS): string {
  return `OUTBOX_SENT_ROWS=${s.sentRows}, OUTBOX_KEY_COLUMN=${s.key}, placement ${s.placement === 'default' || s.placement === 'none' ? s.placement : `${s.placement}:header:x_placed`}, OUTBOX_METADATA=${s.metadata}`;
}

export function fmtScenario(sc: Scenario): string {
  const table = `table ${fmtShape(sc.shape, sc.appColumns)}; ${fmtSettings(sc.settings)}`;
  const head = `pool ${sc.poolMax}, batch ${sc.batchSize}, max attempts ${sc.maxAttempts}, backoff ${sc.backoffBaseMs}ms, policy ${sc.policy}, final policy ${sc.finalPolicy}`;
  return [table, head, ...sc.steps.map((s, i) => `  ${i + 1}. ${fmtStep(s)}`)].join('\n');
}

// ---------------------------------------------------------------------------------------------
// The world: what the model knows

interface RowInfo {
  id: string;
  seq: number;
  agg: string;
  label: string;
  /** producer transaction that inserted it */
  tx: number;
  /** its place in commit order, once its transaction's COMMIT has returned */
  commit?: number;
}

export class Violation extends Error {}

/**
 * What nobody could catch: an uncaught exception (postgres.js 3.4.9 throws one from its nextWrite
 * when a statement is written to a connection whose socket has closed, porsager/postgres#1208) or
 * an unhandled rejection (its fetchArrayTypes() on a new connection is not awaited by anyone). In
 * Lambda either ends the process. The test file routes them here (process
 * .setUncaughtExceptionCaptureCallback, an 'unhandledRejection' listener) so that the run that
 * caused one fails, with its trace, and shrinks.
 */
const running: { world?: World } = {};
export function uncaught(err: unknown, kind = 'an uncaught exception'): void {
  const query = (err as { query?: unknown } | undefined)?.query;
  const what = `crash: ${kind} would have killed the process: ${describeError(err)}${typeof query === 'string' ? `\n  (the statement: ${query.trim().slice(0, 300)})` : ''}`;
  if (running.world) running.world.crashed(what);
  else process.stderr.write(`${what} (between runs)\n`);
}

function describeError(err: unknown): string {
  if (err instanceof Error) return err.stack ?? err.message;
  return typeof err === 'string' ? err : JSON.stringify(err);
}

/** An invocation claimed past the hard cap: it spins. Thrown from the store's begin() to end it early. */
class SpinError extends Error {}

const logger = createLogger('error', {}, () => undefined);
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** r1 comes before r2 in the order G4 promises: it committed no later (or in the same transaction) and has the smaller seq */
function precedes(r1: RowInfo, r2: { seq: number; tx?: number; commit?: number }): boolean {
  if (r1.seq >= r2.seq) return false;
  if (r1.tx === r2.tx) return true;
  return r1.commit !== undefined && (r2.commit === undefined || r1.commit < r2.commit);
}

class ProducerTx {
  readonly rows: RowInfo[] = [];
  constructor(
    readonly id: number,
    readonly conn: ReservedSql,
  ) {}
}

/** the application_name of every relay client this process created (terminateLeftovers) */
const relayApps = new Set<string>();

/**
 * After the tests: end every backend still open for a relay client this process created. A client
 * that postgres.js reopens a connection for after it was ended (see World.checkNoLeftovers) would
 * otherwise keep the test process alive.
 */
export async function terminateLeftovers(admin: Sql): Promise<number> {
  if (relayApps.size === 0) return 0;
  const rows = await admin<{ ok: boolean }[]>`SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE application_name = ANY(${[...relayApps]})`;
  return rows.length;
}

/** One relay: a postgres.js client built as src/lambda/runtime.ts builds it, warm across invocations. */
class RelaySlot {
  sql: Sql | undefined;
  store: OutboxStore | undefined;
  app = '';
  /** a connection of the client closed (Runtime.connectionLost) */
  lost = false;
  private policy: ParkedPolicy | undefined;
  private generation = 0;

  constructor(
    readonly index: number,
    private readonly world: World,
  ) {}

  /** The Runtime's rule: the client is replaced after a connection closed or once its store is poisoned; a new policy is a redeploy. */
  async ready(policy: ParkedPolicy): Promise<OutboxStore> {
    if (this.sql && this.store && !this.lost && !this.store.poisoned && this.policy === policy) return this.store;
    await this.close();
    const app = `${this.world.tableName.name}_r${this.index}_${this.generation++}`;
    relayApps.add(app);
    const client: Sql = postgres(DATABASE_URL, {
      ...CLIENT_OPTIONS,
      max: this.world.poolMax,
      prepare: true,
      connect_timeout: 5,
      idle_timeout: 0,
      max_lifetime: null,
      onclose: () => {
        if (this.sql !== client) return;
        this.lost = true;
        this.store?.loseConnection();
      },
      // The model checks the SQL's logic under concurrency, with invocations of 1-2.5 s: a COMMIT
      // waiting on the disk is not part of it. Beside the suite's other files (hundreds of MB of
      // WAL from batch-bytes.test.ts), the server's log showed COMMITs of 1 to 7 s, all
      // WAL flush, and a batch failed its 2 s deadline in CI. Without the flush wait a COMMIT is
      // as visible to every other session as with it; only a crash of the server could undo it,
      // and the model never crashes the server.
      connection: { application_name: app, synchronous_commit: 'off' },
      onnotice: () => undefined,
    });
    this.sql = client;
    this.app = app;
    this.lost = false;
    this.policy = policy;
    // a batch bound of 100 bytes against payloads of 19, 39 and 59 (insertInto): a claim of three
    // rows from one insert is cut to two, so the cut is checked with every other mechanism
    // and the settings' statements: the mark of OUTBOX_SENT_ROWS, the columns the metadata and the
    // placement make the claim read (as src/lambda/runtime.ts builds its store)
    const metadata = this.world.metadata;
    this.store = new OutboxStore(client, this.world.tableName, policy, {
      prepare: true,
      sentRows: this.world.settings.sentRows,
      claimBytes: { batch: MODEL_BATCH_BYTES },
      columns: claimColumns(metadata),
      columnNames: settingColumns(metadata),
    });
    return this.store;
  }

  /** after an invocation: a client the Runtime would replace is closed now (its connections' transactions end) */
  get broken(): boolean {
    return this.sql !== undefined && (this.lost || this.store?.poisoned === true);
  }

  /**
   * As Runtime.closeDatabase: the idle connections closed first (postgres.js's close(), not in its
   * types: a connection that came back to an abandoned client after its end() is not seen by end()),
   * then end() with a second for the rest.
   */
  async close(): Promise<void> {
    const sql = this.sql;
    this.sql = undefined;
    this.store = undefined;
    if (!sql) return;
    const close = (sql as unknown as { close?: () => Promise<void> }).close;
    if (typeof close === 'function') {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([close.call(sql).catch(() => undefined), new Promise((r) => (timer = setTimeout(r, 1_000)))]);
      clearTimeout(timer);
    }
    await sql.end({ timeout: 1 }).catch(() => undefined);
  }
}

/**
 * The store the loop gets: the real one, with its claims counted (one begin() per claim) and capped,
 * and each claim's transaction noted (World.noteClaim: G1 links an ack to the batch that got it).
 */
class CountingStore implements Store {
  claims = 0;
  constructor(
    /** replaced when the Runtime would reconnect within the invocation (see invokeLikeRuntime) */
    public inner: OutboxStore,
    private readonly cap: number,
    private readonly world: World,
  ) {}

  /** the client can no longer commit a batch, and why (read by the loop in versions whose Store port has it) */
  unusable(what: string): Error | undefined {
    return this.inner.unusable(what);
  }

  begin(deadline: Deadline, after?: BatchTransaction): Promise<BatchTransaction> {
    this.claims++;
    if (this.claims > this.cap) return Promise.reject(new SpinError(`more than ${this.cap} claims in one invocation`));
    return this.inner.begin(deadline, after).then((tx) => {
      // the same object, its claim observed: begin(after) takes a connection over only from a BatchTx
      const claim = tx.claim.bind(tx);
      tx.claim = async (limit, filter) => {
        const rows = await claim(limit, filter);
        await this.world.noteClaim(rows.map((r) => r.seq));
        return rows;
      };
      return tx;
    });
  }
  nothingClaimable(deadline: Deadline): Promise<NothingClaimable> {
    return this.inner.nothingClaimable(deadline);
  }
  clearStaleMarks(deadline: Deadline): Promise<{ cleared: number; blocked: boolean }> {
    return this.inner.clearStaleMarks(deadline);
  }
  markWaiting(deadline: Deadline): Promise<number> {
    return this.inner.markWaiting(deadline);
  }
  newestPending(deadline: Deadline): Promise<string | null> {
    return this.inner.newestPending(deadline);
  }
  watchInserts(deadline: Deadline, on: { insert(): void; lost(err: unknown): void }): Promise<InsertWatch> {
    return this.inner.watchInserts(deadline, on);
  }
  checkTables(deadline: Deadline): Promise<readonly string[]> {
    return this.inner.checkTables(deadline);
  }
  pruneChunk(what: PruneTarget, retainMs: number, limit: number, deadline: Deadline): Promise<number> {
    return this.inner.pruneChunk(what, retainMs, limit, deadline);
  }
}

interface InvocationResult {
  index: number;
  spec: InvocationSpec;
  claims: number;
  summary?: Summary;
  error?: unknown;
  /** a fault targeted its relay, or a side action took row locks beside it: it may fail (a DatabaseError) */
  mayFail: boolean;
  /** a fault targeted its relay: its time may have gone to a lost connection (and a reconnect: Runtime.closeDatabase waits up to 1 s) */
  faulted: boolean;
}

const ACK: Outcome = { kind: 'ack', at: 0, delayMs: 0 };
/** the aggregatetype of the rows `oldSent` puts in the sent table for retention (not the model's rows) */
const OLD_SENT = 'model-old-sent';

/** The fake publisher of one invocation. */
class ModelPublisher implements Publisher {
  readonly connects = 1;
  private calls = 0;
  constructor(
    private readonly world: World,
    private readonly inv: number,
    private readonly spec: InvocationSpec,
    private readonly policy: ParkedPolicy,
    private readonly atPublish: (call: number) => Promise<void>,
  ) {}

  /** the real message of the row, under the run's settings (key, placement, metadata), as ProducerPublisher makes it */
  toMessage(row: OutboxRow, topicTemplate: string): OutboundMessage {
    return toMessage(row, topicTemplate, this.world.metadata);
  }

  tooLarge(m: OutboundMessage, limitBytes: number): MessageRejectedError | undefined {
    return tooLarge(m, limitBytes);
  }

  maxMessageBytes(): Promise<number> {
    return Promise.resolve(1_000_000);
  }

  async publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome> {
    const call = this.calls++;
    this.world.checkBatchBytes(this.inv, call, messages);
    await this.atPublish(call);
    const o = this.spec.publishes[call] ?? ACK;
    const outcome: PublishOutcome = { acked: [], rejected: [], backedOff: [] };
    const appended: OutboundMessage[] = [];
    const n = messages.length;
    if (n === 0) {
      // planBatch may leave nothing to send (every row waits); nothing reaches the broker
    } else if (o.kind === 'unavailable') {
      appended.push(...messages.slice(0, Math.min(o.at, n)));
      outcome.unavailable = new BrokerUnavailableError('model: broker unavailable (connection refused)');
    } else if (o.kind === 'reject' || o.kind === 'rejectPermanent') {
      const bad = o.at % n;
      const agg = messages[bad]!.aggregateid;
      for (const [j, m] of messages.entries()) {
        if (j === bad) outcome.rejected.push({ seq: m.seq, error: new MessageRejectedError('model: INVALID_RECORD', o.kind === 'rejectPermanent') });
        // the later messages of its aggregate, whatever their keys, stay pending, uncharged, as
        // ProducerPublisher leaves them (its `blocked`; with the default key, the key's messages)
        else if (!(j > bad && m.aggregateid === agg)) appended.push(m);
      }
    } else if (o.kind === 'backoff') {
      const topic = messages[o.at % n]!.topic;
      outcome.backedOff.push({ topic, error: new MessageRejectedError(`model: UNKNOWN_TOPIC_OR_PARTITION (${topic})`) });
      appended.push(...messages.filter((m) => m.topic !== topic));
    } else {
      appended.push(...messages);
    }
    outcome.acked = appended.map((m) => m.seq);
    const rejected = outcome.rejected.map((r) => this.world.labelOfSeq(r.seq));
    const labels = (ms: OutboundMessage[]) => ms.map((m) => this.world.label(m.headers.id!)).join(',');
    this.world.log(
      `inv${this.inv} publish#${call} [${labels(messages)}] → ${fmtOutcome(o)}: appended [${labels(appended)}]${rejected.length ? ` rejected [${rejected.join(',')}]` : ''}${outcome.backedOff.length ? ` topic backed off ${outcome.backedOff[0]!.topic}` : ''}`,
    );
    // the broker appends at once (G4 counts these copies); the answer comes delayMs later
    await this.world.published(this.inv, appended, this.policy);
    if (o.delayMs) {
      const left = deadline.remaining();
      if (o.delayMs >= left) {
        // as ProducerPublisher: a send that outlasts its deadline is given up; the broker appended
        // what it appended, the relay never hears of it (a lost answer: nothing may be marked)
        await sleep(left);
        this.world.log(`inv${this.inv} publish#${call}: no answer before the send deadline, the acks are lost`);
        return { acked: [], rejected: [], backedOff: [], unavailable: new BrokerUnavailableError('model: the send did not finish before the deadline') };
      }
      await sleep(o.delayMs);
    }
    this.world.acknowledged(this.inv, appended);
    return outcome;
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}

/** The settings as the relay's environment. */
export function settingsEnv(s: Settings): Record<string, string> {
  return {
    OUTBOX_SENT_ROWS: s.sentRows,
    ...(s.key === 'aggregateid' ? {} : { OUTBOX_KEY_COLUMN: s.key }),
    ...(s.placement === 'default' ? {} : { OUTBOX_ADDITIONAL_PLACEMENT: s.placement === 'none' ? 'none' : `${s.placement}:header:x_placed` }),
    ...(s.metadata === 'none' ? {} : { OUTBOX_METADATA: s.metadata }),
    ...(s.metadata === 'cloudevents' ? { OUTBOX_CLOUDEVENTS_SOURCE: '/model' } : {}),
  };
}

/**
 * Rebuilds `table` (made by migrate) as a table partitioned by HASH (`key`) in `partitions`
 * partitions (`${table}_h0`...), through repartition (test/integration/helpers.ts), as partitionByRange does by range:
 * the same columns, defaults, identity and checks, the relay's non-unique indexes and triggers; no
 * unique index (a partitioned table's must include the partition key).
 */
export function partitionByHash(db: Sql, table: string, key: string, partitions: number): Promise<string[]> {
  const parts = Array.from({ length: partitions }, (_, i): [string, string] => [`${table}_h${i}`, `WITH (MODULUS ${partitions}, REMAINDER ${i})`]);
  return repartition(db, table, `HASH (${key})`, parts);
}

/**
 * Every alias and CTE name of the relay's statements (each statement of src/outbox/sql.ts, the
 * claim with every fragment and every claim column, both marks), as test/integration/table-shapes
 * .test.ts reads them from the texts: the application columns of the appColumns shapes, less the
 * outbox's own columns.
 */
export function statementAliases(sql: Sql): string[] {
  const name = parseTableName('mdl_aliases');
  const t = qualified(name);
  const columns: ClaimColumn[] = [CREATED_EPOCH, `json_build_object('created_at', left("created_at"::text, 1025)) AS placed`];
  const store = (policy: ParkedPolicy, sentRows: 'keep' | 'delete') => new OutboxStore(sql, name, policy, { sentRows, columns });
  const texts: string[] = [];
  for (const policy of ['hold', 'skip'] as const) {
    for (const sentRows of ['keep', 'delete'] as const) {
      const st = store(policy, sentRows);
      texts.push(st.claimStatement(10, { aggregates: ['x'], inFlight: ['1'], topics: ['y'], topicTemplate: 'z' }).text, st.markText,
        st.unwaitText, st.markWaitingText, st.waitingWorkText, st.payloadsText, ...Object.values(st.pruneText));
    }
    texts.push(q.whyEmptySql(t, policy));
  }
  texts.push(q.recordFailuresSql(t), q.heldGapsSql(t), q.newestPendingSql(t), q.backlogSql(t), q.statusSql(t), q.parkedListSql(t),
    q.operatorLookupSql(t, 'all-parked', true), q.operatorLookupSql(t, 'ids', false), q.parkedRetrySql(t), q.parkedSkipSql(t));
  const names = new Set<string>();
  const all = texts.join('\n');
  for (const m of all.matchAll(/\b(?:AS|AS NOT MATERIALIZED|AS MATERIALIZED)\s+\(?"?([a-z_][a-z0-9_]*)"?/gi)) names.add(m[1]!.toLowerCase());
  for (const m of all.matchAll(/\b([a-z_][a-z0-9_]*)\s+AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(/gi)) names.add(m[1]!.toLowerCase());
  for (const m of all.matchAll(/\bAS\s+[a-z_]+\(([a-z_, ]+)\)/gi)) for (const c of m[1]!.split(',')) names.add(c.trim());
  for (const n of ['materialized', 'not']) names.delete(n);
  return [...names].sort();
}

export interface WorldOptions {
  sql: Sql;
  admin: Sql;
  /** keep the table after the run (to look at it) */
  keepTable?: boolean;
  /** every run's scenario and trace are appended here (FC_TRACE=<file>) */
  traceFile?: string;
}

export class World {
  readonly tableName: TableName;
  readonly poolMax: number;
  readonly t: string;
  readonly sentT: string;
  private readonly rows = new Map<string, RowInfo>();
  private readonly labelsBySeq = new Map<number, string>();
  private readonly perAgg = new Map<string, number>();
  /**
   * every id the fake publisher reported acked to the relay, with the transactions (xids) of the
   * batches whose publish acked it (G1: the transaction that moves a row to the sent table is one)
   */
  private readonly acked = new Map<string, Set<string>>();
  /** the transaction (xid) that holds each claimed row, by seq, as of its latest claim */
  private readonly claimedBy = new Map<string, string>();
  /** ids acked to each invocation (G2 at a normal return) */
  private readonly ackedTo = new Map<number, Set<string>>();
  /** the test-only table where a trigger notes which transaction moved each row to the sent table */
  readonly markLog: string;
  /** OUTBOX_SENT_ROWS=delete: the test-only table where a trigger notes each row a relay deleted from the outbox, and the transaction */
  readonly deleteLog: string;
  readonly settings: Settings;
  /** the configuration's, from the settings (loadConfig): the store's claim columns and the publisher's messages */
  readonly metadata: Metadata;
  /** ids by their first publication, the first time the broker appended them (G4) */
  private readonly firstAck = new Map<string, number>();
  private readonly deleted = new Set<string>();
  private readonly skipped = new Set<string>();
  private readonly producers: Array<ProducerTx | undefined> = [undefined, undefined];
  private readonly slots: RelaySlot[];
  private commits = 0;
  private txs = 0;
  /** backends terminated so far */
  private faults = 0;
  private invocations = 0;
  private policy: ParkedPolicy;
  private readonly config: (policy: ParkedPolicy) => Config['outbox'];
  private readonly violations: string[] = [];
  private readonly trace: string[] = [];
  private readonly started = Date.now();
  private readonly sql: Sql;
  private readonly admin: Sql;

  constructor(
    private readonly sc: Scenario,
    private readonly opts: WorldOptions,
  ) {
    this.sql = opts.sql;
    this.admin = opts.admin;
    this.tableName = parseTableName(`mdl_${randomBytes(5).toString('hex')}`);
    this.poolMax = sc.poolMax;
    this.t = qualified(this.tableName);
    this.sentT = qualified(sentTable(this.tableName));
    this.markLog = qualified(parseTableName(`${this.tableName.name}_marks`));
    this.deleteLog = qualified(parseTableName(`${this.tableName.name}_deletes`));
    this.settings = sc.settings ?? DEFAULT_SETTINGS;
    this.policy = sc.policy;
    this.slots = [0, 1, 2].map((i) => new RelaySlot(i, this));
    this.config = (policy) =>
      loadConfig({
        DATABASE_URL,
        KAFKA_BROKERS: '127.0.0.1:1',
        OUTBOX_TABLE: this.tableName.name,
        OUTBOX_BATCH_SIZE: String(sc.batchSize),
        OUTBOX_MAX_ATTEMPTS: String(sc.maxAttempts),
        OUTBOX_BACKOFF_BASE_MS: String(sc.backoffBaseMs),
        OUTBOX_BACKOFF_MAX_MS: String(sc.backoffBaseMs * 4),
        OUTBOX_PARKED_POLICY: policy,
        ...settingsEnv(this.settings),
      }).outbox;
    this.metadata = this.config(sc.policy).metadata;
  }

  // --- bookkeeping --------------------------------------------------------------------------

  log(line: string): void {
    this.trace.push(`[+${Date.now() - this.started}ms] ${line}`);
  }

  label(id: string): string {
    const r = this.rows.get(id);
    return r ? r.label : `?${id.slice(0, 8)}`;
  }

  labelOfSeq(seq: string): string {
    return this.labelsBySeq.get(Number(seq)) ?? `?seq${seq}`;
  }

  crashed(what: string): void {
    this.fail(what);
  }

  private fail(what: string): void {
    this.violations.push(what);
    this.log(`VIOLATION ${what}`);
  }

  private throwIfViolated(): void {
    if (this.violations.length === 0) return;
    throw new Violation(`${this.violations.join('\n')}\n\nscenario:\n${fmtScenario(this.sc)}\n\ntrace (last 150 lines):\n${this.trace.slice(-150).join('\n')}`);
  }

  /** the publisher answered invocation `inv`: these were acked (G1: only these may be marked, by their batch) */
  acknowledged(inv: number, acked: OutboundMessage[]): void {
    const to = this.ackedTo.get(inv) ?? new Set<string>();
    this.ackedTo.set(inv, to);
    for (const m of acked) {
      const id = m.headers.id!;
      const by = this.acked.get(id) ?? new Set<string>();
      by.add(this.claimedBy.get(m.seq) ?? '?');
      this.acked.set(id, by);
      to.add(id);
    }
  }

  /**
   * A claim returned these rows, locked FOR UPDATE by its transaction (no savepoint yet): a row's
   * xmax is that transaction's id, read before the loop sees the rows (and publishes them).
   */
  async noteClaim(seqs: string[]): Promise<void> {
    if (seqs.length === 0) return;
    const rows = await this.sql.unsafe<{ seq: string; xid: string }[]>(`SELECT seq::text, xmax::text AS xid FROM ${this.t} WHERE seq = ANY($1::bigint[])`, [seqs]);
    for (const r of rows) this.claimedBy.set(r.seq, r.xid);
  }

  /**
   * A trigger on the sent table notes, per row moved there, the (top-level) transaction that moved
   * it: txid_current() inside the premark's savepoint is the batch's own, as xmax at its claim was.
   */
  private async addMarkLog(): Promise<void> {
    const fn = qualified(parseTableName(`${this.tableName.name}_note_mark`));
    await this.sql.unsafe(`CREATE TABLE ${this.markLog} (seq bigint NOT NULL, xid text NOT NULL)`);
    await this.sql.unsafe(`CREATE FUNCTION ${fn}() RETURNS trigger LANGUAGE plpgsql AS $f$
      BEGIN INSERT INTO ${this.markLog} VALUES (NEW.seq, (txid_current() % 4294967296)::text); RETURN NEW; END $f$`);
    await this.sql.unsafe(`CREATE TRIGGER note_mark AFTER INSERT ON ${this.sentT} FOR EACH ROW EXECUTE FUNCTION ${fn}()`);
  }

  private async dropMarkLog(): Promise<void> {
    await this.sql.unsafe(`DROP TABLE IF EXISTS ${this.markLog}`);
    await this.sql.unsafe(`DROP FUNCTION IF EXISTS ${qualified(parseTableName(`${this.tableName.name}_note_mark`))}()`);
    await this.sql.unsafe(`DROP TABLE IF EXISTS ${this.deleteLog}`);
    await this.sql.unsafe(`DROP FUNCTION IF EXISTS ${qualified(parseTableName(`${this.tableName.name}_note_delete`))}()`);
  }

  /**
   * The run's outbox: migrate's, with the application's columns (appColumns) and rebuilt in its
   * shape. Under OUTBOX_SENT_ROWS=delete, a test-only trigger notes every row a relay client
   * (its application_name) deletes from the outbox, unless skipped (retention's), with its
   * transaction: the rows sent, for G1 and G2 as the mark log is under keep.
   */
  private async createTable(): Promise<void> {
    await migrate(this.sql, this.tableName);
    const shape = this.sc.shape ?? PLAIN;
    if (this.sc.appColumns) {
      const own = new Set((await this.sql.unsafe<{ attname: string }[]>(`SELECT attname::text FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0`, [this.t])).map((c) => c.attname));
      const added = statementAliases(this.sql).filter((c) => !own.has(c));
      for (const required of ['tid', 'rel', 'first_gap', 'publishable', 'created_epoch', 'placed']) if (!added.includes(required)) throw new Error(`the alias ${required} not among ${added.join(', ')}`);
      await this.sql.unsafe(`ALTER TABLE ${this.t} ${added.map((c) => `ADD COLUMN "${c}" text DEFAULT 'the application''s'`).join(', ')}`);
      this.log(`application columns: ${added.join(', ')}`);
    }
    if (shape.kind === 'range') {
      const [row] = await this.sql<{ split: string }[]>`SELECT (now() - interval '1 minute')::text AS split`;
      await partitionByRange(this.sql, this.tableName.name, 'created_at', row!.split);
    } else if (shape.kind === 'hash') {
      await partitionByHash(this.sql, this.tableName.name, shape.column, shape.partitions);
    }
    if (this.settings.sentRows === 'delete') {
      const fn = qualified(parseTableName(`${this.tableName.name}_note_delete`));
      await this.sql.unsafe(`CREATE TABLE ${this.deleteLog} (id uuid NOT NULL, seq bigint NOT NULL, xid text NOT NULL)`);
      await this.sql.unsafe(`CREATE FUNCTION ${fn}() RETURNS trigger LANGUAGE plpgsql AS $f$
        BEGIN
          IF current_setting('application_name') LIKE '${this.tableName.name}\\_r%' AND OLD.skipped_at IS NULL THEN
            INSERT INTO ${this.deleteLog} VALUES (OLD.id, OLD.seq, (txid_current() % 4294967296)::text);
          END IF;
          RETURN OLD;
        END $f$`);
      await this.sql.unsafe(`CREATE TRIGGER note_delete AFTER DELETE ON ${this.t} FOR EACH ROW EXECUTE FUNCTION ${fn}()`);
    }
  }

  /** The rows sent (a relay marked them), with the transaction that marked each: the sent table's (keep), the delete log's (delete). */
  private sentRowsSql(): string {
    return this.settings.sentRows === 'delete'
      ? `SELECT d.id::text AS id, d.xid FROM ${this.deleteLog} d`
      : `SELECT s.id::text AS id, (SELECT max(m.xid) FROM ${this.markLog} m WHERE m.seq = s.seq) AS xid FROM ${this.sentT} s WHERE s.aggregatetype <> '${OLD_SENT}'`;
  }

  /** A batch of more than one row holds at most MODEL_BATCH_BYTES of payload (the claim's byte cut). */
  checkBatchBytes(inv: number, call: number, messages: OutboundMessage[]): void {
    const bytes = messages.reduce((sum, m) => sum + (m.value === null ? 0 : Buffer.byteLength(m.value)), 0);
    if (messages.length > 1 && bytes > MODEL_BATCH_BYTES) this.fail(`inv${inv} publish#${call} sent ${messages.length} rows of ${bytes} payload bytes, over the batch bound of ${MODEL_BATCH_BYTES}`);
  }

  /**
   * G4, at the moment of a first publication: every row of the aggregate before it in commit order
   * (precedes) was published already, or is excused: deleted or skipped by an operator, or parked
   * while the invocation's policy is `skip`. The excuse is read from the database now, after the
   * claim that took the row: nothing that runs beside an invocation takes an excuse back.
   */
  async published(inv: number, appended: OutboundMessage[], policy: ParkedPolicy): Promise<void> {
    const suspects: Array<{ row: { label: string; seq: number }; before: RowInfo[] }> = [];
    for (const m of appended) {
      const id = m.headers.id!;
      if (this.firstAck.has(id)) continue;
      const known = this.rows.get(id);
      const row = known ?? { label: `?${id.slice(0, 8)}`, seq: Number(m.seq), agg: m.aggregateid };
      if (!known) this.fail(`inv${inv} published ${row.label} (seq ${m.seq}), a row the model never inserted`);
      const before = [...this.rows.values()].filter((r1) => r1.agg === m.aggregateid && r1.id !== id && !this.firstAck.has(r1.id) && precedes(r1, known ?? { seq: Number(m.seq) }));
      this.firstAck.set(id, this.firstAck.size);
      if (before.length) suspects.push({ row, before });
    }
    if (suspects.length === 0) return;
    const ids = [...new Set(suspects.flatMap((s) => s.before.map((r) => r.id)))];
    const inOutbox = new Map(
      (
        await this.sql.unsafe<{ id: string; parked: boolean; skipped: boolean; attempts: number; not_due: boolean; waiting: boolean }[]>(
          `SELECT id::text, parked_at IS NOT NULL AS parked, skipped_at IS NOT NULL AS skipped, attempts, next_attempt_at > now() AS not_due, waiting FROM ${this.t} WHERE id = ANY($1::uuid[])`,
          [ids],
        )
      ).map((r) => [r.id, r]),
    );
    const inSent = new Set((await this.sql.unsafe<{ id: string }[]>(`SELECT id FROM (${this.sentRowsSql()}) s WHERE id = ANY($1::text[])`, [ids])).map((r) => r.id));
    for (const { row, before } of suspects) {
      for (const r1 of before) {
        const s = inOutbox.get(r1.id);
        if (inSent.has(r1.id)) {
          this.fail(`G4: inv${inv} first published ${row.label} before ${r1.label}, which committed before it with a smaller seq and is in the sent table without ever being acked (G1)`);
          continue;
        }
        if (!s) continue; // deleted by hand: may be passed
        if (s.skipped) continue; // skipped by an operator: may be passed
        if (s.parked && policy === 'skip') continue; // parked under skip: later rows pass it
        const state = [s.parked ? 'parked' : 'pending', `attempts ${s.attempts}`, s.not_due ? 'not due' : 'due', s.waiting ? 'waiting' : 'not waiting'].join(', ');
        this.fail(`G4: inv${inv} (policy ${policy}) first published ${row.label} (seq ${row.seq}) before ${r1.label} (seq ${r1.seq}), which committed before it and was never published: ${state}`);
      }
    }
  }

  // --- producers ----------------------------------------------------------------------------

  private async producer(slot: number | undefined): Promise<ProducerTx> {
    const existing = slot === undefined ? undefined : this.producers[slot];
    if (existing) return existing;
    const conn = await this.sql.reserve();
    await conn`BEGIN`;
    const tx = new ProducerTx(++this.txs, conn);
    if (slot !== undefined) this.producers[slot] = tx;
    return tx;
  }

  private async insertInto(tx: ProducerTx, agg: Agg, type: AggType, n: number, old = false): Promise<RowInfo[]> {
    // `old`: created a day ago (the range shape's older partition); else created_at's default, now()
    const rows = await tx.conn.unsafe<{ id: string; seq: string }[]>(
      `INSERT INTO ${this.t} (aggregatetype, aggregateid, type, payload, created_at)
       SELECT $1, $2, 'Happened', jsonb_build_object('n', g, 'pad', repeat('x', (g % 3) * 20)), CASE WHEN $4::boolean THEN now() - interval '1 day' ELSE now() END
       FROM generate_series(1, $3::int) g ORDER BY g
       RETURNING id::text, seq::text`,
      [type, agg, n, old],
    );
    const out: RowInfo[] = [];
    for (const r of [...rows].sort((x, y) => Number(x.seq) - Number(y.seq))) {
      const k = (this.perAgg.get(agg) ?? 0) + 1;
      this.perAgg.set(agg, k);
      const info: RowInfo = { id: r.id, seq: Number(r.seq), agg, label: `${agg}${k}`, tx: tx.id };
      this.rows.set(r.id, info);
      this.labelsBySeq.set(info.seq, info.label);
      tx.rows.push(info);
      out.push(info);
    }
    return out;
  }

  private async commit(tx: ProducerTx): Promise<void> {
    await tx.conn`COMMIT`;
    const at = ++this.commits;
    for (const r of tx.rows) r.commit = at;
    tx.conn.release();
  }

  // --- operator actions -----------------------------------------------------------------------

  /** unsent rows of the outbox matching `where`, by seq; one of them by `pick` */
  private async pickRow(where: string, pick: number): Promise<string | undefined> {
    const rows = await this.sql.unsafe<{ id: string }[]>(`SELECT id::text FROM ${this.t} WHERE sent_at IS NULL AND skipped_at IS NULL AND (${where}) ORDER BY seq`);
    return rows.length ? rows[pick % rows.length]!.id : undefined;
  }

  async act(a: Action | OperatorStep): Promise<void> {
    switch (a.kind) {
      case 'insert': {
        const tx = await this.producer(undefined);
        const rows = await this.insertInto(tx, a.agg, a.type, a.n, a.old);
        await this.commit(tx);
        this.log(`inserted ${rows.map((r) => `${r.label}#${r.seq}`).join(',')} (${a.type}), committed`);
        return;
      }
      case 'open': {
        const tx = await this.producer(a.tx);
        const rows = await this.insertInto(tx, a.agg, a.type, a.n, a.old);
        this.log(`tx${a.tx} inserted ${rows.map((r) => `${r.label}#${r.seq}`).join(',')} (${a.type}), not committed`);
        return;
      }
      case 'commit': {
        const tx = this.producers[a.tx];
        if (!tx) return;
        this.producers[a.tx] = undefined;
        await this.commit(tx);
        this.log(`tx${a.tx} committed ${tx.rows.map((r) => r.label).join(',')}`);
        return;
      }
      case 'due': {
        const n = (await this.sql.unsafe(`UPDATE ${this.t} SET next_attempt_at = now() - interval '1 second' WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND attempts > 0 AND next_attempt_at > now()`)).count;
        this.log(`made ${n} backing-off rows due`);
        return;
      }
      case 'notDue': {
        const id = await this.pickRow('parked_at IS NULL', a.pick);
        if (!id) return;
        await this.sql.unsafe(`UPDATE ${this.t} SET next_attempt_at = now() + interval '1 hour', attempts = 0 WHERE id = $1`, [id]);
        this.log(`by hand: ${this.label(id)} not due for an hour, attempts 0`);
        return;
      }
      case 'delete': {
        const id = await this.pickRow('true', a.pick);
        if (!id) return;
        const gone = await this.sql.unsafe(`DELETE FROM ${this.t} WHERE id = $1 AND sent_at IS NULL RETURNING id`, [id]);
        if (gone.count) this.deleted.add(id);
        this.log(`by hand: DELETE ${this.label(id)}${gone.count ? '' : ' (gone already)'}`);
        return;
      }
      case 'oldSent': {
        await this.sql.unsafe(
          `INSERT INTO ${this.sentT} (id, aggregatetype, aggregateid, type, payload, topic, headers, seq, created_at, sent_at, attempts)
           SELECT gen_random_uuid(), $1, 'old-' || g, 'Old', '{}', NULL, NULL, -g, now() - interval '2 days', now() - interval '2 days', 0
           FROM generate_series(1, $2::int) g`,
          [OLD_SENT, a.n],
        );
        this.log(`${a.n} old sent rows for retention`);
        return;
      }
      case 'skip': {
        const id = await this.pickRow('parked_at IS NOT NULL', a.pick);
        if (!id) return;
        const ids = (await skipParked(this.sql, this.tableName, { ids: [id], reason: 'model', operator: 'model', dryRun: false, policy: this.policy })).actedOn;
        for (const s of ids) this.skipped.add(s);
        this.log(`parked skip ${this.label(id)}: ${ids.length} skipped`);
        return;
      }
      case 'retry': {
        const id = a.pick === 'all' ? undefined : await this.pickRow('parked_at IS NOT NULL', a.pick);
        if (a.pick !== 'all' && !id) return;
        const ids = (await retryParked(this.sql, this.tableName, { ids: id ? [id] : null, reason: 'model', operator: 'model', dryRun: false, policy: this.policy })).actedOn;
        this.log(`parked retry ${a.pick === 'all' ? '--all' : this.label(id!)}: ${ids.map((x) => this.label(x)).join(',') || 'none'}`);
        return;
      }
      case 'reset': {
        const id = await this.pickRow('attempts > 0 OR parked_at IS NOT NULL', a.pick);
        if (!id) return;
        await this.sql.unsafe(`UPDATE ${this.t} SET attempts = 0, next_attempt_at = '-infinity', parked_at = NULL, last_error = NULL WHERE id = $1`, [id]);
        this.log(`by hand: reset ${this.label(id)}`);
        return;
      }
      case 'policy':
        this.policy = a.policy;
        this.log(`policy ${a.policy}`);
        return;
    }
  }

  // --- faults ---------------------------------------------------------------------------------

  private async kill(slot: RelaySlot, target: Fault['target'], pick: number): Promise<void> {
    if (!slot.sql) return;
    const backends = await this.admin<{ pid: number; intx: boolean; batch: boolean; xact_start: Date | null }[]>`
      SELECT a.pid, a.xact_start IS NOT NULL AS intx, a.xact_start,
             EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted) AS batch
      FROM pg_stat_activity a WHERE a.application_name = ${slot.app} ORDER BY a.pid`;
    const newestBatch = backends.filter((b) => b.batch).sort((x, y) => (y.xact_start?.getTime() ?? 0) - (x.xact_start?.getTime() ?? 0))[0];
    const pool =
      target === 'idle' ? backends.filter((b) => !b.intx)
      : target === 'intx' ? backends.filter((b) => b.intx)
      : target === 'notBatch' ? backends.filter((b) => !b.batch)
      : target === 'newestBatch' ? (newestBatch ? [newestBatch] : [])
      : backends;
    const victims = target === 'all' ? pool : pool.length ? [pool[pick % pool.length]!] : [];
    if (victims.length === 0) {
      this.log(`kill ${target} of relay${slot.index}: no such backend (of ${backends.length})`);
      return;
    }
    this.faults++;
    for (const v of victims) await this.admin`SELECT pg_terminate_backend(${v.pid})`;
    this.log(`killed ${victims.map((v) => `${v.pid}${v.batch ? ' (a batch transaction)' : v.intx ? ' (in a transaction)' : ' (idle)'}`).join(', ')} of relay${slot.index}'s ${backends.length} backends`);
    // let the client see the close (onclose → OutboxStore.loseConnection), as it would before its next statement
    for (let i = 0; i < 40 && !slot.lost && slot.sql; i++) await sleep(5);
  }

  // --- invocations ----------------------------------------------------------------------------

  /** the hard cap on claims per invocation: far above what the work can need (see InvocationResult checks) */
  private claimCap(): number {
    return 100 + 6 * this.rows.size;
  }

  async invoke(step: InvokeStep, strict = false): Promise<InvocationResult[]> {
    const t0 = Date.now();
    const n = step.invocations.length;
    const lockingSide = step.side.some((s) => !['insert', 'open', 'commit', 'oldSent'].includes(s.action.kind));
    const runs = await Promise.all(
      step.invocations.map(async (spec, index) => {
        const slot = this.slots[spec.relay]!;
        const store = new CountingStore(await slot.ready(this.policy), this.claimCap(), this);
        const faults = step.faults.filter((f) => f.inv % n === index);
        const atPublish = async (call: number) => {
          for (const f of faults) {
            if (!('publish' in f.at) || f.at.publish !== call) continue;
            if (f.at.waitMs) await sleep(f.at.waitMs);
            await this.kill(slot, f.target, f.pick);
          }
        };
        return { spec, index, slot, store, faulted: faults.length > 0, mayFail: faults.length > 0 || lockingSide, publisher: new ModelPublisher(this, this.invocations + index, spec, this.policy, atPublish) };
      }),
    );
    const first = this.invocations;
    this.invocations += n;
    const sentBefore = await this.sentIds();
    const config = this.config(this.policy);
    this.log(`step: ${fmtStep(step)}`);
    const results = runs.map(async (r): Promise<InvocationResult> => {
      const deadline = new Deadline(Date.now() + r.spec.deadlineMs);
      let reconnected = false;
      for (;;) {
        try {
          const summary = await runInvocation({ store: r.store, publisher: r.publisher, config, logger, random: () => 0.5 }, deadline);
          return { index: r.index, spec: r.spec, claims: r.store.claims, summary, mayFail: r.mayFail, faulted: r.faulted };
        } catch (error) {
          const summary = (error as { summary?: Summary }).summary;
          // src/lambda/runtime.ts (Runtime.invoke): a connection found closed before anything was claimed
          // or published is reconnected once, with a new client, within the same deadline
          if (!reconnected && error instanceof DatabaseError && (isConnectionLost(error.cause) || r.slot.lost) && summary?.batches === 0 && summary.published === 0) {
            this.log(`inv${first + r.index} (relay${r.spec.relay}): ${error.message}; reconnecting once, as the Runtime does`);
            reconnected = true;
            await r.slot.close();
            r.store.inner = await r.slot.ready(this.policy);
            continue;
          }
          return { index: r.index, spec: r.spec, claims: r.store.claims, error, summary, mayFail: r.mayFail, faulted: r.faulted };
        }
      }
    });
    const side = (async () => {
      for (const s of step.side) {
        const wait = t0 + s.afterMs - Date.now();
        if (wait > 0) await sleep(wait);
        try {
          await this.act(s.action);
        } catch (err) {
          // beside the relay an operator's statement may deadlock with a batch or time out: that is theirs to retry
          this.log(`side action ${fmtAction(s.action)} failed: ${(err as Error).message}`);
        }
      }
    })();
    const timed = step.faults
      .filter((f) => 'afterMs' in f.at)
      .map(async (f) => {
        await sleep((f.at as { afterMs: number }).afterMs);
        await this.kill(runs[f.inv % n]!.slot, f.target, f.pick);
      });
    const done = await Promise.all(results);
    await side;
    await Promise.all(timed);
    for (const r of done) {
      const s = r.summary;
      const what = s ? `published ${s.published}, retried ${s.retried}, parked ${s.parked}, batches ${s.batches}, heldBack ${s.heldBack}, stopped ${s.stoppedBecause}, ${s.durationMs}ms` : 'no summary';
      this.log(`inv${first + r.index} (relay${r.spec.relay}) ${r.error ? `FAILED (${(r.error as Error).message}); ` : ''}${what}; claims ${r.claims}`);
    }
    this.checkInvocations(done, first, strict);
    await this.checkReturned(done, first, step, sentBefore);
    // the Runtime replaces a broken client before its next invocation; close it now, so that its
    // abandoned transactions end before the operator's next statement (nothing else uses it)
    for (const slot of this.slots) if (slot.broken) await slot.close();
    await this.checkNoOpenTransactions(done.filter((r) => !this.slots[r.spec.relay]!.broken && this.slots[r.spec.relay]!.sql));
    return done;
  }

  /**
   * Per invocation:
   * - it fails only with the relay's own typed errors, and only when a fault hit its relay or an
   *   operator's statement ran beside it (strict: never);
   * - it does not spin: no more claims than its work explains (2 per batch: the claim ahead that
   *   came back empty, then a fresh one; 2 per row held back; 3 for the start and the empty claim
   *   at the end; and 2 per batch of the invocations beside it, whose commits can make a held
   *   row claimable again one batch later), and, unless a fault hit its relay, it never ends
   *   for want of budget without having sent a single batch.
   */
  private checkInvocations(done: InvocationResult[], first: number, strict: boolean): void {
    for (const r of done) {
      const name = `inv${first + r.index} (relay${r.spec.relay}, ${r.spec.deadlineMs}ms)`;
      if (r.error instanceof SpinError) {
        this.fail(`spin: ${name} claimed more than ${this.claimCap()} times (batches ${r.summary?.batches ?? '?'}, heldBack ${r.summary?.heldBack ?? '?'}) and was stopped`);
        continue;
      }
      if (r.error !== undefined) {
        if (!(r.error instanceof RelayError)) this.fail(`${name} failed with an untyped error: ${describeError(r.error)}`);
        else if (strict || !r.mayFail) this.fail(`${name} failed without a fault or a concurrent operator statement: ${r.error.message}`);
      }
      const s = r.summary;
      if (!s) continue;
      const peers = done.filter((o) => o !== r).reduce((sum, o) => sum + (o.summary?.batches ?? 0), 0);
      const bound = 2 * (s.batches + s.heldBack) + 3 + 2 * peers;
      if (r.claims > bound) this.fail(`spin: ${name} claimed ${r.claims} times for ${s.batches} batches and ${s.heldBack} rows held back (bound ${bound}), stopped ${s.stoppedBecause}`);
      if (s.batches === 0 && s.stoppedBecause === 'budget' && !r.faulted) this.fail(`spin: ${name} sent no batch and stopped for want of budget (claims ${r.claims}, heldBack ${s.heldBack})`);
    }
  }

  private async sentIds(): Promise<Set<string>> {
    return new Set((await this.sql.unsafe<{ id: string }[]>(`SELECT id FROM (${this.sentRowsSql()}) s`)).map((r) => r.id));
  }

  /**
   * G2 at a normal return: an invocation that returned (did not fail) left no acked row unmarked,
   * unless an operator removed it meanwhile. And when every invocation of the step returned and no
   * operator removed a row beside them, their summaries' `published` add up to the rows they moved
   * to the sent table.
   */
  private async checkReturned(done: InvocationResult[], first: number, step: InvokeStep, sentBefore: Set<string>): Promise<void> {
    const sent = await this.sentIds();
    for (const r of done) {
      if (r.error !== undefined) continue;
      const name = `inv${first + r.index} (relay${r.spec.relay})`;
      const unmarked = [...(this.ackedTo.get(first + r.index) ?? [])].filter((id) => !sent.has(id) && !this.deleted.has(id) && !this.skipped.has(id));
      if (unmarked.length) this.fail(`G2: ${name} returned normally, but rows it had acked are not in the sent table: ${unmarked.map((id) => this.label(id)).join(',')}`);
    }
    const removals = step.side.some((s) => s.action.kind === 'delete' || s.action.kind === 'skip');
    if (removals || done.some((r) => r.error !== undefined)) return;
    const published = done.reduce((sum, r) => sum + (r.summary?.published ?? 0), 0);
    const moved = [...sent].filter((id) => !sentBefore.has(id)).length;
    if (published !== moved) this.fail(`summary: the step's invocations report ${published} published, but ${moved} rows entered the sent table`);
  }

  /**
   * G7: once an invocation has returned, a client that was not abandoned holds no transaction open
   * between statements (a statement still running, such as postgres.js's own fetch of the array
   * types on a connection it opened late, is not a transaction left behind).
   */
  private async checkNoOpenTransactions(done: InvocationResult[]): Promise<void> {
    const apps = [...new Set(done.map((r) => this.slots[r.spec.relay]!.app))];
    if (apps.length === 0) return;
    const open = await this.admin<{ app: string; pid: number; state: string; query: string }[]>`
      SELECT application_name AS app, pid, state, left(query, 120) AS query FROM pg_stat_activity WHERE application_name = ANY(${apps}) AND state LIKE 'idle in transaction%'`;
    for (const o of open) this.fail(`G7: after its invocations returned, ${o.app} (not abandoned) still has backend ${o.pid} in a transaction (${o.state}: ${o.query.replace(/\s+/g, ' ')})`);
  }

  // --- checks after every step ----------------------------------------------------------------

  /**
   * G1: every row in the sent table was acked by the publish of the batch that moved it there (the
   * same transaction), once; no row is both sent and unsent. Nothing vanished: every committed row
   * is in the outbox, in the sent table, or was deleted by hand.
   */
  async checkTables(): Promise<void> {
    const sent = await this.sql.unsafe<{ id: string; xid: string | null }[]>(this.sentRowsSql());
    const outbox = new Set((await this.sql.unsafe<{ id: string }[]>(`SELECT id::text FROM ${this.t}`)).map((r) => r.id));
    const sentIds = new Set<string>();
    for (const { id, xid } of sent) {
      const ackedBy = this.acked.get(id);
      const del = this.settings.sentRows === 'delete';
      if (!ackedBy) this.fail(`G1: ${this.label(id)} ${del ? 'was deleted as sent by a relay' : 'is in the sent table'} but was never acked`);
      else if (xid === null || !ackedBy.has(xid)) {
        const by = [...ackedBy].map((x) => `tx ${x}`).join(', ');
        this.fail(`G1: ${this.label(id)} was ${del ? 'deleted as sent' : 'moved to the sent table'} by tx ${xid ?? '?'}, whose batch's publish never acked it (acked only in the batches of ${by})`);
      }
      if (sentIds.has(id)) this.fail(`G1: ${this.label(id)} is in the sent table twice`);
      if (outbox.has(id)) this.fail(`G1: ${this.label(id)} is in the sent table and still in the outbox`);
      sentIds.add(id);
    }
    for (const r of this.rows.values()) {
      if (r.commit === undefined) continue;
      if (!outbox.has(r.id) && !sentIds.has(r.id) && !this.deleted.has(r.id)) this.fail(`lost: ${r.label} (seq ${r.seq}) is neither in the outbox nor in the sent table, and nobody deleted it`);
    }
    this.throwIfViolated();
  }

  // --- a whole run ----------------------------------------------------------------------------

  async run(): Promise<void> {
    await this.createTable();
    await this.addMarkLog();
    running.world = this;
    try {
      for (const step of this.sc.steps) {
        if (step.kind === 'invoke') await this.invoke(step);
        else {
          this.log(`step: ${fmtStep(step)}`);
          await this.act(step);
        }
        await this.checkTables();
      }
      await this.finalPhase();
    } finally {
      await this.cleanup();
      running.world = undefined;
      if (this.opts.traceFile) appendFileSync(this.opts.traceFile, `\n=== ${this.tableName.name}\n${fmtScenario(this.sc)}\n${this.trace.join('\n')}\n`);
    }
    // a crash while the last clients closed
    this.throwIfViolated();
  }

  /**
   * After the faults stop: producers commit, every parked row is retried, every row is made due,
   * the publisher acks everything, one relay runs invocations one after another. Every committed
   * row that nobody deleted or skipped by hand must be in the sent table within rows + 5
   * invocations, each of which must not fail or spin.
   */
  private async finalPhase(): Promise<void> {
    this.log('final phase');
    for (const tx of [0, 1] as const) await this.act({ kind: 'commit', tx });
    await this.act({ kind: 'policy', policy: this.sc.finalPolicy });
    await this.act({ kind: 'retry', pick: 'all' });
    const live = [...this.rows.values()].filter((r) => r.commit !== undefined && !this.deleted.has(r.id) && !this.skipped.has(r.id));
    const budget = live.length + 5;
    for (let k = 0; k < budget; k++) {
      const due = await this.sql.unsafe(`UPDATE ${this.t} SET next_attempt_at = now() - interval '1 second' WHERE sent_at IS NULL AND skipped_at IS NULL AND next_attempt_at > now()`);
      if (due.count) this.log(`made ${due.count} rows due`);
      await this.invoke({ kind: 'invoke', invocations: [{ relay: 0, deadlineMs: 2_000, publishes: [] }], faults: [], side: [] }, true);
      await this.checkTables();
      const sent = await this.sentIds();
      if (live.every((r) => sent.has(r.id))) return;
    }
    const left = await this.sql.unsafe<{ id: string; attempts: number; parked: boolean; not_due: boolean; waiting: boolean }[]>(
      `SELECT id::text, attempts, parked_at IS NOT NULL AS parked, next_attempt_at > now() AS not_due, waiting FROM ${this.t} WHERE sent_at IS NULL AND skipped_at IS NULL ORDER BY seq`,
    );
    this.fail(`liveness: after ${budget} invocations without faults, these rows are still not sent: ${left.map((r) => `${this.label(r.id)} (attempts ${r.attempts}${r.parked ? ', parked' : ''}${r.not_due ? ', not due' : ''}${r.waiting ? ', waiting' : ''})`).join('; ')}`);
    this.throwIfViolated();
  }

  private async cleanup(): Promise<void> {
    for (const tx of this.producers) {
      if (!tx) continue;
      await tx.conn`ROLLBACK`.catch(() => undefined);
      tx.conn.release();
    }
    for (const slot of this.slots) await slot.close();
    if (!this.opts.keepTable) {
      await dropOutbox(this.sql, this.tableName).catch(() => undefined);
      await this.dropMarkLog().catch(() => undefined);
    }
    await this.checkNoLeftovers();
  }

  /**
   * Every relay client of the run has been ended (by the Runtime's rule, by the store abandoning it,
   * or at the run's end): none of them may still have a backend. postgres.js can open a connection
   * for a client after its end() (a reconnect it had scheduled for a queued statement), which then
   * stays open, idle, for good: a backend leaked per abandoned client. Found ones are terminated.
   */
  private async checkNoLeftovers(): Promise<void> {
    const apps = [...relayApps].filter((a) => a.startsWith(`${this.tableName.name}_r`));
    if (apps.length === 0) return;
    // a reconnect postgres.js had scheduled runs within a few event-loop turns after a kill
    if (this.faults > 0) await sleep(150);
    const left = await this.admin<{ pid: number; app: string; state: string }[]>`
      SELECT pid, application_name AS app, state FROM pg_stat_activity WHERE application_name = ANY(${apps})`;
    if (left.length === 0) return;
    this.fail(`leak: ${left.length} backend(s) of relay clients that were ended are still open: ${left.map((l) => `${l.app} pid ${l.pid} (${l.state})`).join(', ')}`);
    for (const l of left) await this.admin`SELECT pg_terminate_backend(${l.pid})`;
  }
}

/** Run one scenario against a fresh table; throws a Violation that prints the scenario and the trace. */
export async function runScenario(sc: Scenario, opts: WorldOptions): Promise<void> {
  await new World(sc, opts).run();
}
