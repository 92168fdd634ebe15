// The relay's store with one statement of bench/sql.ts in place of its own, and a Runtime that
// builds such a store: the benches' comparisons (the unguarded claim, the in-place mark), and
// test/integration/relay.test.ts's unguarded relays. Subclasses, so nothing of them is in src/.
import type { Sql } from 'postgres';
import type { ClaimFilter } from '../src/loop/ports.ts';
import type { Statement } from '../src/outbox/sql.ts';
import { OutboxStore, type StoreOptions } from '../src/outbox/store.ts';
import { Runtime } from '../src/lambda/runtime.ts';
import type { Config } from '../src/config/types.ts';
import type { Logger } from '../src/log.ts';
import { claimUnguardedSql, markInPlaceSql } from './sql.ts';

/** Claims with SKIP LOCKED alone, no order guard: every claimed row is published. */
export class UnguardedStore extends OutboxStore {
  override claimStatement(limit: number, _filter: ClaimFilter): Statement {
    return { text: claimUnguardedSql(this.table), params: [limit] };
  }
}

/** Marks acked rows sent in place (an UPDATE of the outbox row), as pre-release versions did, instead of moving them. */
export class MarkInPlaceStore extends OutboxStore {
  override readonly markText = markInPlaceSql(this.table, 'address');
}

/** A Runtime whose store is `Store` (one of the above) in place of the relay's own; all else the same. */
export class RuntimeWith extends Runtime {
  constructor(
    private readonly Store: typeof OutboxStore,
    config: Config,
    logger: Logger,
  ) {
    super(config, logger);
  }

  protected override newStore(sql: Sql, options: StoreOptions): OutboxStore {
    return new this.Store(sql, this.config.outbox.table, this.config.outbox.parkedPolicy, options);
  }
}
