// BEGIN and COMMIT by hand, on a reserved connection that may be handed to the next batch while
// the COMMIT is on the wire: docs/DESIGN.md, "The batch transaction's states".
import type { Deadline } from '../budget.ts';
import { socketsFlushed } from '../loop/event-loop.ts';
import type { BatchTransaction, ClaimFilter, ClaimedRow, LaneSettlement } from '../loop/ports.ts';
import type { Failure } from '../loop/settlement.ts';
import type { Connections } from './connections.ts';
import * as q from './sql.ts';
import type { TxSettings } from './tx-settings.ts';
import type { PendingQuery, ReservedSql, Row, RowList } from 'postgres';

// a long backlog is marked in short transactions
export const MARK_WAITING_CHUNK = 10_000;

/** A bench's store replaces some. */
export interface BatchStatements {
  readonly table: string;
  readonly markText: string;
  readonly unwaitText: string;
  readonly markWaitingText: string;
  readonly payloadsText: string;
  readonly prepared: { prepare: boolean };
  /** exactly-once delivery's lanes (lanes.ts): held-back rows may be in a lane's batch in flight */
  readonly lanesTable?: string;
  claimStatement(limit: number, filter: ClaimFilter): q.Statement;
}

type TxState = 'open' | 'committing' | 'ended';

type Address = { rel: string; tid: string };

const NO_FILTER: ClaimFilter = { aggregates: [], inFlight: [], topics: [], topicTemplate: '' };

export class BatchTx implements BatchTransaction {
  private state: TxState = 'open';
  /** this transaction, or the next batch's (OutboxStore.begin's `after`), once */
  private connectionUser: 'this' | 'next' = 'this';
  private premarked?: { seqs: Set<string>; written: Promise<boolean> };
  /** whether each had failed before: sending it may free its aggregate */
  private readonly claimed = new Map<string, { aggregateid: string; retried: boolean; rel: string; tid: string }>();
  private opened: Promise<void> = Promise.resolve();

  private constructor(
    private readonly client: Connections,
    private readonly statements: BatchStatements,
    private readonly conn: ReservedSql,
    private readonly deadline: Deadline,
  ) {}

  /** Sent without waiting for their answers (postgres.js pipelines), so a claim costs one round trip, not three. */
  static open(
    client: Connections,
    statements: BatchStatements,
    conn: ReservedSql,
    deadline: Deadline,
    settings: TxSettings,
  ): BatchTx {
    const tx = new BatchTx(client, statements, conn, deadline);
    const settingsSent = conn.unsafe(settings.text, settings.params, statements.prepared);
    const begun = [tx.run('BEGIN', conn`BEGIN`), tx.run('setting timeouts', settingsSent)];
    tx.opened = Promise.all(begun).then(() => undefined);
    // awaited by the first statement that needs the transaction; never an unhandled rejection
    tx.opened.catch(() => undefined);
    return tx;
  }

  private run<T>(what: string, query: Promise<T> | PendingQuery<Row[]>): Promise<T> {
    // A PendingQuery is sent only when awaited: rejecting here means it never reaches the socket.
    // On a client abandoned (ended) a reserved connection's statement would never be answered.
    const unusable = this.client.unusable(what);
    if (unusable) return Promise.reject(unusable);
    return this.client.bounded(this.deadline, what, query);
  }

  private send<T extends Row[]>(what: string, text: string, params: unknown[], named = true): Promise<RowList<T>> {
    const options = named ? this.statements.prepared : undefined;
    return this.run(what, this.conn.unsafe<T>(text, params as never[], options));
  }

  async claim(limit: number, filter: ClaimFilter = NO_FILTER): Promise<ClaimedRow[]> {
    const { text, params } = this.statements.claimStatement(limit, filter);
    const claimed = this.send<Array<ClaimedRow & Address>>('claiming a batch', text, params);
    claimed.catch(() => undefined);
    await this.opened;
    const rows = await claimed;
    // the claim leaves seq order to us (claim.ts)
    rows.sort(bySeq);
    for (const r of rows) this.claimed.set(r.seq, { aggregateid: r.aggregateid, retried: r.attempts > 0, rel: r.rel, tid: r.tid });
    const heldBack = rows.filter((r) => !r.publishable);
    if (heldBack.length === 0) return rows;
    const gaps = [...new Set(heldBack.map((r) => r.first_gap!))];
    type Held = { seq: string; why: 'locked' | 'in-flight' | 'waiting' | 'parked' | 'not-due' | null };
    const heldSql = q.heldGapsSql(this.statements.table, this.statements.lanesTable);
    const held = await this.send<Held[]>('checking held-back rows', heldSql, [gaps], false);
    const why = new Map(held.map((g) => [g.seq, g.why]));
    for (const r of heldBack) {
      const because = why.get(r.first_gap!);
      r.behindUnclaimable = because != null;
      r.behindStaleMark = because === 'waiting';
    }
    return rows;
  }

  async readPayloads(rows: ClaimedRow[]): Promise<void> {
    if (rows.length === 0) return;
    type Read = { seq: string; payload: string | null };
    const seqs = rows.map((r) => r.seq);
    const read = await this.send<Read[]>('reading large payloads', this.statements.payloadsText, [seqs]);
    const bySeq = new Map(read.map((r) => [r.seq, r.payload]));
    for (const r of rows) r.payload = bySeq.get(r.seq) ?? null;
  }

  /** So that after the acks only the COMMIT is left (docs/DESIGN.md, "The commit chain and the claim ahead"). */
  premark(seqs: string[]): void {
    if (seqs.length === 0 || this.client.poisoned) return;
    const { markText, unwaitText } = this.statements;
    const statements = [
      this.run('opening the premark savepoint', this.conn`SAVEPOINT premark`),
      this.send('marking rows sent', markText, this.addressesOf(seqs, true)),
    ];
    // a row that had failed, once sent, may free the rows waiting behind it (the waiting marks)
    const freed = this.aggregatesOf(seqs, true);
    if (freed.length) statements.push(this.send('clearing waiting marks', unwaitText, [freed]));
    // settled here so a failure is never unhandled; the commit methods look at the outcome
    const written = Promise.all([this.opened, ...statements]).then(
      () => true,
      () => false,
    );
    this.premarked = { seqs: new Set(seqs), written };
  }

  /** Resolved once written to the socket, with a promise of its answer. */
  async commitIfAllPremarked(sent: string[], failures: Failure[], settle?: LaneSettlement): Promise<{ answer: Promise<void> } | undefined> {
    const pre = this.premarked;
    if (!pre || failures.length > 0 || sent.length !== pre.seqs.size || !sent.every((s) => pre.seqs.has(s)))
      return undefined;
    if (!(await pre.written)) return undefined;
    this.premarked = undefined;
    // a failed statement before it turns the COMMIT into a ROLLBACK, which answers without an error
    const settled = settle ? this.send('settling the lane', settle.text, settle.params) : undefined;
    const committed = this.run('committing the batch', this.conn`COMMIT`);
    const answer = this.endWith(settled ? Promise.all([settled, committed]) : committed);
    answer.catch(() => undefined);
    this.state = 'committing';
    // on the wire before the next batch reaches the broker (G2)
    await socketsFlushed();
    return { answer };
  }

  async query<T extends Row[]>(what: string, text: string, params: unknown[]): Promise<RowList<T>> {
    await this.opened;
    return this.send<T>(what, text, params);
  }

  commit(what: string): Promise<void> {
    return this.endWith(this.run(what, this.conn`COMMIT`));
  }

  private endWith(commit: Promise<unknown>): Promise<void> {
    return commit.then(
      () => this.end(),
      (err: unknown) => {
        // an answered COMMIT has ended the transaction on the server, failed or not; an unanswered
        // one may not have (a lost race with the deadline, a closed connection): see endUnconfirmed
        if (this.client.poisoned) this.endUnconfirmed();
        else this.end();
        throw err;
      },
    );
  }

  handOver(): ReservedSql | undefined {
    if (this.state !== 'committing' || this.connectionUser !== 'this' || this.client.poisoned) return undefined;
    this.connectionUser = 'next';
    return this.conn;
  }

  private end(): void {
    if (this.state === 'ended') return;
    this.state = 'ended';
    if (this.connectionUser === 'this') this.conn.release();
  }

  /** Never release the connection: the transaction may still be open on the server. */
  private endUnconfirmed(): void {
    if (this.state === 'ended') return;
    this.state = 'ended';
    this.client.abandon();
  }

  /** Sent at once (one round trip): any failure aborts the transaction, so nothing of the batch is recorded. */
  async markAndCommit(sent: string[], failures: Failure[], settle?: LaneSettlement): Promise<void> {
    await this.opened;
    const { markText, unwaitText, markWaitingText, table } = this.statements;
    const statements: Promise<unknown>[] = [];
    const pre = this.premarked;
    this.premarked = undefined;
    if (pre) {
      // Not every premarked row was acked, or the premark failed and left the transaction aborted:
      // back to the savepoint, then mark exactly the acked.
      await pre.written;
      statements.push(this.run('undoing the premarks', this.conn`ROLLBACK TO SAVEPOINT premark`));
    }
    if (sent.length) statements.push(this.send('marking rows sent', markText, this.addressesOf(sent, true)));
    if (failures.length) {
      const params = [
        failures.map((f) => f.seq),
        failures.map((f) => f.error.slice(0, 2_000)),
        failures.map((f) => Math.round(f.delayMs)),
        failures.map((f) => (f.park ? 1 : 0)),
        ...this.addressesOf(failures.map((f) => f.seq)),
      ];
      statements.push(this.send('recording failed attempts', q.recordFailuresSql(table), params, false));
    }
    // The waiting marks follow the blocking rows just changed: rows that failed before and were
    // sent now, or failed again, may free their aggregates; rows that failed now block theirs.
    const blocking = this.aggregatesOf(
      failures.map((f) => f.seq),
      false,
    );
    const freed = [...new Set([...this.aggregatesOf(sent, true), ...blocking])];
    if (freed.length) statements.push(this.send('clearing waiting marks', unwaitText, [freed]));
    // a chunk at most, to keep this batch short; the next invocation's markWaiting marks any more
    if (blocking.length)
      statements.push(this.send('marking waiting rows', markWaitingText, [blocking, MARK_WAITING_CHUNK]));
    if (settle) statements.push(this.send('settling the lane', settle.text, settle.params));
    statements.push(this.run('committing the batch', this.conn`COMMIT`));
    const results = await Promise.allSettled(statements);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await this.rollback();
      throw failed.reason;
    }
    this.end();
  }

  /** Only rows this transaction claimed. `oneRel`: one tableoid when they are all the same (sql.ts markedBy). */
  private addressesOf(seqs: string[], oneRel = false): [rels: string[], tids: string[]] {
    const rels: string[] = [];
    const tids: string[] = [];
    for (const seq of seqs) {
      const row = this.claimed.get(seq);
      if (!row) throw new Error(`row ${seq} is marked but was not claimed by this batch: a bug in the relay, report it`);
      rels.push(row.rel);
      tids.push(row.tid);
    }
    return [oneRel && rels.every((r) => r === rels[0]) ? rels.slice(0, 1) : rels, tids];
  }

  private aggregatesOf(seqs: string[], retriedOnly: boolean): string[] {
    const out = new Set<string>();
    for (const seq of seqs) {
      const row = this.claimed.get(seq);
      if (row && (!retriedOnly || row.retried)) out.add(row.aggregateid);
    }
    return [...out];
  }

  /** Never throws. The connection goes back to the pool only once the server answered the ROLLBACK within its grace. */
  async rollback(): Promise<void> {
    if (this.state !== 'open') return;
    this.state = 'ended';
    if (this.connectionUser !== 'this') return;
    if (!this.client.poisoned) {
      try {
        await this.deadline.rollbackGrace().race('rolling back', this.conn`ROLLBACK`);
        this.conn.release();
        return;
      } catch {
        // not confirmed: the transaction may still be open on the server, so the client is ended
      }
    }
    this.client.abandon();
  }
}

// int8 as decimal strings without sign or leading zeros: shorter is smaller
export function bySeq(a: { seq: string }, b: { seq: string }): number {
  return a.seq.length - b.seq.length || (a.seq < b.seq ? -1 : a.seq > b.seq ? 1 : 0);
}
