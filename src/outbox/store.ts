// Postgres side of the loop (the Store port): one transaction per batch on a reserved connection
// (batch-tx.ts), the store's own side transactions (side-tx.ts), LISTEN (listen.ts), on a client
// guarded against the driver's defects (connections.ts). Why it is built so: docs/DESIGN.md,
// "The store and postgres.js".
import type { ClaimColumn, ParkedPolicy } from '../domain.ts';
import type { Deadline } from '../budget.ts';
import type {
  BatchTransaction,
  ClaimFilter,
  InsertWatch,
  NothingClaimable,
  PruneTarget,
  Store,
} from '../loop/ports.ts';
import { BatchTx, type BatchStatements } from './batch-tx.ts';
import { Connections } from './connections.ts';
import { notifyChannel, qualified, sentTable, type TableName } from './identifier.ts';
import { watchInserts } from './listen.ts';
import { render, type PartitionMaintenance } from './migrate.ts';
import { assertSchema, schemaCheckSql, type SchemaFacts } from './schema-check.ts';
import { SideTransactions, type SideStatements } from './side-tx.ts';
import * as q from './sql.ts';
import { txSettings } from './tx-settings.ts';
import type { Sql } from 'postgres';

/** What happens to an acked row: OUTBOX_SENT_ROWS. */
export type SentRowsMode = 'keep' | 'delete';

export interface StoreOptions {
  /** named prepared statements (DATABASE_PREPARE) */
  prepare?: boolean;
  sentRows?: SentRowsMode;
  /** the claim's bounds in bytes (sql.ts ClaimBytes): OUTBOX_MAX_BATCH_BYTES, the largest payload read with it */
  claimBytes?: Partial<q.ClaimBytes>;
  /** the columns the claim reads beyond its usual ones (claimColumns: what the metadata need) */
  columns?: readonly ClaimColumn[];
  /** the outbox columns those read, by name (settingColumns): the schema check asks that the role may read them */
  columnNames?: readonly string[];
}

/**
 * The claim's bounds when not given: the configuration's defaults (src/config/load.ts). A payload over
 * 1 MiB (the broker's default message.max.bytes) is read by a second statement once its topic allows it.
 */
export const DEFAULT_CLAIM_BYTES: q.ClaimBytes = { batch: 64 * 1024 * 1024, payload: 1_048_576 };

export class OutboxStore implements Store, BatchStatements, SideStatements {
  readonly table: string;
  /** where `keep` moves sent rows (the sent table) */
  readonly sentTable: string;
  readonly markText: string;
  readonly payloadsText: string;
  readonly markWaitingText: string;
  readonly unwaitText: string;
  readonly waitingWorkText: string;
  readonly pruneText: Record<PruneTarget, string>;
  /** the insert trigger's channel for this table's inserts */
  readonly channel: string;
  /** named prepared statements for the per-batch queries, unless DATABASE_PREPARE=false (PgBouncer, RDS Proxy) */
  readonly prepared: { prepare: boolean };
  private readonly policy: ParkedPolicy;
  private readonly sentRows: SentRowsMode;
  private readonly claimBytes: q.ClaimBytes;
  private readonly claimColumns: readonly ClaimColumn[];
  private readonly settingColumns: readonly string[];
  private readonly whyEmptyText: string;
  private readonly newestText: string;
  /** checkTables() found the sent table writable (once per client) */
  private tablesChecked = false;
  /** the partition maintenance function's signature (partitioned.sql), as the schema check looks it up */
  private readonly partitionsFn: string;
  private readonly maintainText: string;
  /** checkTables() found migrate's partition maintenance function, and the role may call it (Store.partitionsMaintained) */
  partitionsMaintained = false;
  private readonly client: Connections;
  private readonly side: SideTransactions;

  constructor(
    readonly sql: Sql,
    table: TableName,
    policy: ParkedPolicy,
    { prepare = true, sentRows = 'keep', claimBytes = {}, columns = [], columnNames = [] }: StoreOptions = {},
  ) {
    this.prepared = { prepare };
    this.claimBytes = { ...DEFAULT_CLAIM_BYTES, ...claimBytes };
    this.claimColumns = columns;
    this.settingColumns = columnNames;
    this.table = qualified(table);
    this.policy = policy;
    this.sentTable = qualified(sentTable(table));
    this.sentRows = sentRows;
    this.markText =
      sentRows === 'delete' ? q.deleteSentSql(this.table) : q.moveSentSql(this.table, this.sentTable);
    this.whyEmptyText = q.whyEmptySql(this.table, policy);
    const prune = (what: PruneTarget) => q.pruneSql(this.table, this.sentTable, what);
    this.pruneText = { sent: prune('sent'), skipped: prune('skipped') };
    this.newestText = q.newestPendingSql(this.table);
    this.payloadsText = q.payloadsSql(this.table);
    this.markWaitingText = q.markWaitingSql(this.table, policy);
    this.unwaitText = q.unwaitSql(this.table, policy);
    this.waitingWorkText = q.waitingWorkSql(this.table, policy);
    this.channel = notifyChannel(table);
    this.partitionsFn = `${render('{{partitions_fn}}', table)}(bigint)`;
    this.maintainText = q.maintainPartitionsSql(render('{{partitions_fn}}', table));
    this.client = new Connections(sql);
    this.side = new SideTransactions(this.client, this);
  }

  /** set when a statement was abandoned mid-flight, or a connection closed: the client must be replaced */
  get poisoned(): boolean {
    return this.client.poisoned;
  }

  /** one of the client's connections closed under us (Connections.connectionLost) */
  get connectionLost(): boolean {
    return this.client.connectionLost;
  }

  /** A connection of the client closed (its onclose): see Connections.loseConnection. */
  loseConnection(): void {
    this.client.loseConnection();
  }

  /** End the client: the server rolls back what is open on it (Connections.abandon). */
  abandon(): void {
    this.client.abandon();
  }

  unusable(what: string): Error | undefined {
    return this.client.unusable(what);
  }

  /** The claim for `filter` (its shape: src/outbox/sql.ts claimStatement). */
  claimStatement(limit: number, filter: ClaimFilter): q.Statement {
    return q.claimStatement(this.table, this.policy, limit, filter, this.table, this.claimBytes, this.claimColumns);
  }

  /**
   * Open a batch transaction. `after`: a batch whose COMMIT was just sent; the new transaction runs
   * behind it on its connection, so its claim sees that batch sent (docs/DESIGN.md, "The commit chain").
   */
  async begin(deadline: Deadline, after?: BatchTransaction): Promise<BatchTx> {
    const handed = after instanceof BatchTx ? after.handOver() : undefined;
    const conn = handed ?? (await this.client.reserve(deadline));
    return BatchTx.open(this.client, this, conn, deadline, txSettings(deadline, { batch: true }));
  }

  /** After an empty claim: are rows there for others to take, only waiting behind failed rows, or none at all? */
  async nothingClaimable(deadline: Deadline): Promise<NothingClaimable> {
    type Why = { claimable: boolean; pending: boolean };
    const [r] = await this.client.bounded(
      deadline,
      'checking why nothing was claimable',
      this.sql.unsafe<Why[]>(this.whyEmptyText),
    );
    return r?.claimable ? 'locked' : r?.pending ? 'behind-failed-rows' : 'empty';
  }

  /**
   * Once per client, before the first claim: the outbox has every migration and the role the grants
   * the marks need, or the invocation fails saying what to run or GRANT (src/outbox/schema-check.ts).
   * Resolves to the warnings to log (schemaWarnings): on the client's first check only.
   */
  async checkTables(deadline: Deadline): Promise<string[]> {
    if (this.tablesChecked) return [];
    const what = "checking the schema and the role's privileges";
    const [facts] = await this.client.bounded(
      deadline,
      what,
      this.sql.unsafe<SchemaFacts[]>(schemaCheckSql(), [this.table, this.sentTable, [...this.settingColumns], this.partitionsFn]),
    );
    const warnings = assertSchema(facts, { table: this.table, sentTable: this.sentTable, sentRows: this.sentRows, partitionsFn: this.partitionsFn });
    this.partitionsMaintained = facts!.partitions_fn === true && facts!.partitions_fn_execute === true;
    this.tablesChecked = true;
    return warnings;
  }

  pruneChunk(what: PruneTarget, retainMs: number, limit: number, deadline: Deadline): Promise<number> {
    return this.side.pruneChunk(what, retainMs, limit, deadline);
  }

  /** One call of the partition maintenance function (partitioned.sql); only once checkTables() set partitionsMaintained. */
  maintainPartitions(retainSentMs: number | null, deadline: Deadline): Promise<PartitionMaintenance> {
    return this.side.maintainPartitions(this.maintainText, retainSentMs, deadline);
  }

  clearStaleMarks(deadline: Deadline): Promise<{ cleared: number; blocked: boolean }> {
    return this.side.clearStaleMarks(deadline);
  }

  markWaiting(deadline: Deadline): Promise<number> {
    return this.side.markWaiting(deadline);
  }

  async newestPending(deadline: Deadline): Promise<string | null> {
    type Newest = { newest: string | null };
    const [row] = await this.client.bounded(
      deadline,
      'probing for new rows',
      this.sql.unsafe<Newest[]>(this.newestText, [], this.prepared),
    );
    return row?.newest ?? null;
  }

  watchInserts(deadline: Deadline, on: { insert(): void; lost(err: unknown): void }): Promise<InsertWatch> {
    return watchInserts(this.sql, this.channel, deadline, on);
  }
}
