// Why the store is built so: docs/DESIGN.md, "The store and postgres.js".
import type { ClaimColumn, ParkedPolicy } from '../domain.ts';
import type { Deadline } from '../budget.ts';
import type {
  BatchTransaction,
  ClaimFilter,
  InsertWatch,
  LaneStore,
  NothingClaimable,
  PruneTarget,
  Store,
} from '../loop/ports.ts';
import { BatchTx, type BatchStatements } from './batch-tx.ts';
import { Connections } from './connections.ts';
import { lanesTable, notifyChannel, qualified, sentTable, type TableName } from './identifier.ts';
import { laneStatements, LaneLeases } from './lanes.ts';
import { watchInserts } from './listen.ts';
import { render, type PartitionMaintenance } from './migrate.ts';
import { assertSchema, schemaCheckSql, type SchemaFacts } from './schema-check.ts';
import { SideTransactions, type SideStatements } from './side-tx.ts';
import * as q from './sql.ts';
import { txSettings } from './tx-settings.ts';
import type { Sql } from 'postgres';

export type SentRowsMode = 'keep' | 'delete';

export interface StoreOptions {
  prepare?: boolean;
  sentRows?: SentRowsMode;
  claimBytes?: Partial<q.ClaimBytes>;
  /** what the metadata need beyond the usual columns */
  columns?: readonly ClaimColumn[];
  /** the schema check asks that the role may read them */
  columnNames?: readonly string[];
  /** OUTBOX_DELIVERY=exactly-once: the lanes table's leases, and claims that leave the lanes' rows in flight out */
  lanes?: boolean;
}

/** A payload over 1 MiB (the broker's default message.max.bytes) is read by a second statement once its topic allows it. */
export const DEFAULT_CLAIM_BYTES: q.ClaimBytes = { batch: 64 * 1024 * 1024, payload: 1_048_576 };

export class OutboxStore implements Store, BatchStatements, SideStatements {
  readonly table: string;
  readonly sentTable: string;
  readonly markText: string;
  readonly payloadsText: string;
  readonly markWaitingText: string;
  readonly unwaitText: string;
  readonly waitingWorkText: string;
  readonly pruneText: Record<PruneTarget, string>;
  readonly inFlightPendingText: string;
  readonly markBySeqText: string;
  readonly lanesTable?: string;
  readonly lanes?: LaneStore;
  readonly channel: string;
  /** unless DATABASE_PREPARE=false (PgBouncer, RDS Proxy) */
  readonly prepared: { prepare: boolean };
  private readonly policy: ParkedPolicy;
  private readonly sentRows: SentRowsMode;
  private readonly claimBytes: q.ClaimBytes;
  private readonly claimColumns: readonly ClaimColumn[];
  private readonly settingColumns: readonly string[];
  private readonly whyEmptyText: string;
  private readonly newestText: string;
  private tablesChecked = false;
  private readonly partitionsFn: string;
  private readonly maintainText: string;
  partitionsMaintained = false;
  private readonly client: Connections;
  private readonly side: SideTransactions;

  constructor(
    readonly sql: Sql,
    table: TableName,
    policy: ParkedPolicy,
    { prepare = true, sentRows = 'keep', claimBytes = {}, columns = [], columnNames = [], lanes = false }: StoreOptions = {},
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
    this.inFlightPendingText = q.inFlightPendingSql(this.table);
    this.markBySeqText = sentRows === 'delete' ? q.deleteSentSql(this.table, 'seq') : q.moveSentSql(this.table, this.sentTable, 'seq');
    this.client = new Connections(sql);
    this.side = new SideTransactions(this.client, this);
    if (lanes) {
      this.lanesTable = qualified(lanesTable(table));
      const leases = new LaneLeases(this.client, laneStatements(this.lanesTable), this.prepared);
      const side = this.side;
      this.lanes = {
        lease: (holder, leaseMs, deadline) => leases.lease(holder, leaseMs, deadline),
        record: (lease, seqs, deadline) => leases.record(lease, seqs, deadline),
        settlement: (lease, batchNo) => leases.settlement(lease, batchNo),
        settleUnsettled: (lease, committed, deadline) => side.settleLane(lease, committed, leases.settlement(lease, lease.unsettled!.batchNo), deadline),
        release: (lease, deadline) => leases.release(lease, deadline),
      };
    }
  }

  get poisoned(): boolean {
    return this.client.poisoned;
  }

  get connectionLost(): boolean {
    return this.client.connectionLost;
  }

  loseConnection(): void {
    this.client.loseConnection();
  }

  /** The server rolls back what is open on it (Connections.abandon). */
  abandon(): void {
    this.client.abandon();
  }

  unusable(what: string): Error | undefined {
    return this.client.unusable(what);
  }

  claimStatement(limit: number, filter: ClaimFilter): q.Statement {
    return q.claimStatement(this.table, this.policy, limit, filter, this.table, this.claimBytes, this.claimColumns, this.lanesTable);
  }

  /** `after`: the new transaction runs behind that COMMIT on its connection, so its claim sees that batch sent. */
  async begin(deadline: Deadline, after?: BatchTransaction): Promise<BatchTx> {
    const handed = after instanceof BatchTx ? after.handOver() : undefined;
    const conn = handed ?? (await this.client.reserve(deadline));
    return BatchTx.open(this.client, this, conn, deadline, txSettings(deadline, { batch: true }));
  }

  async nothingClaimable(deadline: Deadline): Promise<NothingClaimable> {
    type Why = { claimable: boolean; pending: boolean };
    const [r] = await this.client.bounded(
      deadline,
      'checking why nothing was claimable',
      this.sql.unsafe<Why[]>(this.whyEmptyText),
    );
    return r?.claimable ? 'locked' : r?.pending ? 'behind-failed-rows' : 'empty';
  }

  /** Once per client; the warnings only on its first check. */
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
