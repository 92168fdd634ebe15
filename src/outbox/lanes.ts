// Exactly-once delivery's leases (docs/DESIGN.md, "Exactly-once delivery (opt-in)"): one row per lane in the lanes
// table (migrations/002_lanes.sql), each statement a transaction of its own, so that they work
// through PgBouncer in transaction mode and RDS Proxy. Every statement checks what it relies on
// (the holder, the batch number) and fails loudly when that does not hold.
import type { Deadline } from '../budget.ts';
import { LaneLostError } from '../errors.ts';
import type { LaneLease, LaneSettlement } from '../loop/ports.ts';
import type { Connections } from './connections.ts';
import { ROW_CHECK_FAILED } from './sql.ts';

/** At most this many invocations relay at once in the mode, so at most this many transactional ids. */
export const LANES = 8;

export interface LaneStatements {
  make: string;
  lease: string;
  record: string;
  settle: string;
  release: string;
  unsettled: string;
}

export function laneStatements(lanes: string): LaneStatements {
  return {
    // the lanes the relay may lease; a no-op once made (ON CONFLICT takes no row lock)
    make: `INSERT INTO ${lanes} (lane, transactional_id)
SELECT n, 'outbox-relay.lane-' || n || '.' || gen_random_uuid() FROM generate_series(0, $1::int - 1) n
ON CONFLICT (lane) DO NOTHING`,
    // A lane whose lease ran out: first one with a batch to settle (its rows wait for it), then
    // one its holder never released (a transaction it left open holds read_committed consumers
    // back until fenced). Under READ COMMITTED a row leased meanwhile is re-read once locked, and
    // fails lease_until.
    lease: `
WITH free AS (
  SELECT lane, holder FROM ${lanes}
  WHERE lane < $3::int AND lease_until < now()
  ORDER BY in_flight IS NULL, holder IS NULL, lease_until
  LIMIT 1
  FOR UPDATE SKIP LOCKED
)
UPDATE ${lanes} l SET holder = $1, lease_until = now() + $2::bigint * interval '1 millisecond'
FROM free WHERE l.lane = free.lane
RETURNING l.lane, l.transactional_id, l.batch_no::text AS batch_no, l.in_flight::text[] AS in_flight, free.holder IS NOT NULL AS abandoned`,
    // before the Kafka commit, committed: only the holder, within its lease, with nothing unsettled
    record: `
UPDATE ${lanes} SET batch_no = batch_no + 1, in_flight = $3::bigint[]
WHERE lane = $1 AND holder = $2 AND lease_until > now() AND in_flight IS NULL
RETURNING batch_no::text AS batch_no`,
    // in the batch's own transaction, before its COMMIT (or by the lane's next holder): exactly one
    // row, the batch recorded, or the transaction fails (someone else settled it)
    settle: `
WITH settled AS (
  UPDATE ${lanes} SET in_flight = NULL WHERE lane = $1 AND batch_no = $2::bigint AND in_flight IS NOT NULL RETURNING 1
)
SELECT CASE WHEN (SELECT count(*) FROM settled) = 1 THEN 1
  -- the count keeps the message from being a constant, which the planner would cast at once
  ELSE ('${ROW_CHECK_FAILED}: settling lane ' || $1 || ' batch ' || $2 || ' found ' || (SELECT count(*) FROM settled) || ' in flight (settled already)')::bigint END AS affected`,
    release: `UPDATE ${lanes} SET holder = NULL, lease_until = '-infinity' WHERE lane = $1 AND holder = $2`,
    // every lane's rows in flight: claims leave them out
    unsettled: `SELECT unnest(in_flight) AS seq FROM ${lanes} WHERE in_flight IS NOT NULL`,
  };
}

export class LaneLeases {
  constructor(
    private readonly client: Connections,
    private readonly statements: LaneStatements,
    private readonly prepared: { prepare: boolean },
  ) {}

  /** Undefined when every lane is leased. `leaseMs`: past the invocation's own end, so a lease outlives only a dead or paused holder. */
  async lease(holder: string, leaseMs: number, deadline: Deadline): Promise<LaneLease | undefined> {
    const { sql } = this.client;
    await this.client.bounded(deadline, 'making the exactly-once lanes', sql.unsafe(this.statements.make, [LANES], this.prepared));
    type Leased = { lane: number; transactional_id: string; batch_no: string; in_flight: string[] | null; abandoned: boolean };
    const [row] = await this.client.bounded(
      deadline,
      'leasing an exactly-once lane',
      sql.unsafe<Leased[]>(this.statements.lease, [holder, Math.ceil(leaseMs), LANES], this.prepared),
    );
    if (!row) return undefined;
    const lease: LaneLease = { lane: row.lane, holder, transactionalId: row.transactional_id, abandoned: row.abandoned };
    if (row.in_flight) lease.unsettled = { batchNo: row.batch_no, seqs: row.in_flight };
    return lease;
  }

  /** Committed before the Kafka transaction's commit; the batch's number is that transaction's offset. */
  async record(lease: LaneLease, seqs: string[], deadline: Deadline): Promise<string> {
    const [row] = await this.client.bounded(
      deadline,
      'recording the batch in flight',
      this.client.sql.unsafe<{ batch_no: string }[]>(this.statements.record, [lease.lane, lease.holder, seqs], this.prepared),
    );
    if (!row) {
      throw new LaneLostError(
        `lane ${lease.lane} is no longer this invocation's, or its last batch is still unsettled: nothing of this batch is committed; ` +
          'its rows stay pending for the lane\'s holder',
      );
    }
    return row.batch_no;
  }

  /** The statement that settles `batchNo` in a transaction of the caller's. */
  settlement(lease: Pick<LaneLease, 'lane'>, batchNo: string): LaneSettlement {
    return { text: this.statements.settle, params: [lease.lane, batchNo] };
  }

  async release(lease: LaneLease, deadline: Deadline): Promise<void> {
    await this.client.bounded(deadline, 'releasing the exactly-once lane', this.client.sql.unsafe(this.statements.release, [lease.lane, lease.holder], this.prepared));
  }
}
