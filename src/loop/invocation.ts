// The invocation loop (docs/DESIGN.md, "The invocation loop"): claim → publish → commit, one
// transaction per batch, until the budget or the rows run out. Read Invocation.relayBatch: it is
// that section's flowchart, step by step.
//
// Three things overlap so that neither the database nor Kafka waits for the other:
// - the next batch is claimed while this one is published (NextClaim);
// - this batch's marks are written, uncommitted, while it is on its way (BatchTransaction.premark);
// - this batch's COMMIT is written, and its answer read one batch later (CommitChain).
import { BatchBudget, type Deadline } from '../budget.ts';
import type { Config } from '../config/types.ts';
import { DatabaseError, DeadlineExceededError } from '../errors.ts';
import { socketsFlushed } from './event-loop.ts';
import type { Logger } from '../log.ts';
import { commitBatch } from './commit-batch.ts';
import { CommitChain } from './commit-chain.ts';
import { Idle } from './idle.ts';
import { NextClaim, type Batch } from './next-claim.ts';
import { publishBatch } from './publish-batch.ts';
import { maintainPartitions } from './partitions.ts';
import { Retention } from './retention.ts';
import type { BatchTransaction, ClaimedRow, PublishOutcome, Publisher, Store } from './ports.ts';
import { finish, newSummary, timed, type StopReason, type Summary } from './summary.ts';
import { clearStaleMarks, markWaiting } from './waiting-marks.ts';
import { TEST_HOOKS } from '../test-hooks.ts';

export type { StopReason, Summary };

export interface RelayDeps {
  store: Store;
  publisher: Publisher;
  config: Config['outbox'];
  logger: Logger;
  /** test-only: pause after the broker acked a batch, before its marks commit (crash window); src/test-hooks.ts */
  pauseAfterPublishMs?: number;
  random?: () => number;
}

export async function runInvocation(deps: RelayDeps, deadline: Deadline): Promise<Summary> {
  const invocation = new Invocation(deps, deadline);
  await invocation.checkTables();
  // a partitioned outbox made by migrate: its partitions made ahead, the old ones dropped, before
  // the first claim (never fails the invocation); its sent table is then not pruned by rows
  await maintainPartitions(deps.store, deps.config.retainSentMs, deps.logger, deadline);
  // retention runs alongside the loop for the whole invocation (see loop/retention.ts)
  const { retainSkippedMs } = deps.config;
  const retainSentMs = deps.store.partitionsMaintained ? 0 : deps.config.retainSentMs;
  const windows = { sentMs: retainSentMs, skippedMs: retainSkippedMs };
  const retains = retainSentMs > 0 || retainSkippedMs > 0;
  const retention = retains ? new Retention(deps.store, windows, deps.logger) : undefined;
  // the waiting marks: stale marks cleared before the first claim, new rows marked waiting
  // alongside the loop; neither fails the invocation
  const blocked = await clearStaleMarks(deps.store, deps.logger, deadline);
  const pruning = retention?.run(deadline) ?? Promise.resolve(0);
  const tidying = blocked ? markWaiting(deps.store, deps.logger, deadline) : Promise.resolve();
  try {
    await invocation.relayAll();
  } catch (err) {
    retention?.stop();
    await Promise.all([pruning, tidying]);
    throw err;
  }
  await tidying;
  return invocation.finish(await pruning);
}

class Invocation {
  private readonly summary = newSummary();
  private readonly startedAt = Date.now();
  /** the budget rule: whether a batch, or the claim ahead, still fits; when sends give up */
  private readonly budget: BatchBudget;
  private readonly commits = new CommitChain();
  /**
   * Aggregates held back behind an unclaimable row (ClaimedRow.behindUnclaimable): left out of this
   * invocation's later claims so they neither fill every batch nor are claimed again and again;
   * the next invocation looks at them again.
   */
  private readonly aggregatesBehindUnclaimable = new Set<string>();
  /** Topics the broker refused as a whole (deleted, unknown, forbidden): not claimed again in this invocation. */
  private readonly backedOffTopics = new Set<string>();
  private readonly heldBackRows = new Set<string>();
  /** clearStaleMarksOnce ran in this invocation */
  private staleMarksCleared = false;
  /** the batch whose transaction is open, rolled back if the invocation fails */
  private inHand: Batch | undefined;
  private ahead: NextClaim | undefined;
  /** linger mode only: waits for new rows once nothing is left to claim */
  private readonly idle: Idle | undefined;
  /** the latest claim: when it started, the notifications it had seen, whether a pending row is news (Idle.wait) */
  private lastClaim = { at: 0, seen: 0, anyRowWakes: false, claimOnceMore: false, recheck: false };

  constructor(
    private readonly deps: RelayDeps,
    private readonly deadline: Deadline,
  ) {
    this.budget = new BatchBudget(deadline);
    if (deps.config.idle === 'linger') this.idle = new Idle(deps.store, deps.config, deps.logger);
  }

  /** Fails the invocation, before anything is claimed or published, when the marks could not be written. */
  async checkTables(): Promise<void> {
    try {
      for (const warning of await this.deps.store.checkTables(this.deadline)) this.deps.logger.warn(warning);
    } catch (err) {
      throw await this.failed(err);
    }
  }

  async relayAll(): Promise<void> {
    try {
      let batch = this.budget.fits() ? await timed(this.summary, 'claim', this.claim()) : this.stop('budget');
      while (batch) {
        batch = await this.relayBatch(batch);
        batch ??= await this.linger();
      }
      await timed(this.summary, 'commit', this.commits.answered());
    } catch (err) {
      throw await this.failed(err);
    } finally {
      await this.idle?.close();
    }
  }

  /**
   * Linger mode, after a stop that means "nothing to claim now": wait for new rows (src/loop/idle.ts)
   * until only a batch's time is left, then claim. Undefined: the invocation ends, with the stop
   * reason of its last claim.
   */
  private async linger(): Promise<Batch | undefined> {
    if (!this.idle || !LINGERS_AFTER.has(this.summary.stoppedBecause)) return undefined;
    // the last COMMIT's answer first: a failed one fails the invocation now, not when it ends
    await timed(this.summary, 'commit', this.commits.answered());
    if (this.lastClaim.claimOnceMore && this.budget.fits()) {
      // see stopOnEmptyClaim: once, right away (like the loop's own claim once more, not a wake-up)
      const again = this.claim();
      this.lastClaim.recheck = true;
      return timed(this.summary, 'claim', again);
    }
    const waited = this.idle.wait(this.deadline, this.budget.lingerUntil(), this.lastClaim);
    const woke = await timed(this.summary, 'idle', waited);
    if (!woke) return undefined;
    this.summary.wakeups[woke]++;
    // aggregates behind unclaimable rows are looked at again now and then, not only by the next invocation
    if (woke === 'reclaim') this.aggregatesBehindUnclaimable.clear();
    return timed(this.summary, 'claim', this.claim());
  }

  /** One turn of the loop: publish `batch` and commit what was acked. Returns the next batch, or undefined to stop. */
  private async relayBatch(batch: Batch): Promise<Batch | undefined> {
    this.inHand = batch;
    const ready = this.publishableRows(batch);
    if (batch.rows.length === 0) return this.stopOnEmptyClaim(batch);
    if (ready.length === 0) return this.claimAgain(batch);
    this.summary.claimed += ready.length;
    this.summary.batches++;

    this.ahead = await this.claimAhead(batch);
    const outcome = await timed(this.summary, 'publish', this.publish(batch, ready));
    await this.testPause(outcome);
    // the previous batch's COMMIT went out before this publish began; it has answered by now
    const previousFailed = await timed(this.summary, 'commit', this.commits.failureOf());
    // the claim ahead relies on this batch's locks: it must have returned before they go
    await timed(this.summary, 'claim', this.ahead?.returned() ?? Promise.resolve());
    const { config, random, logger } = this.deps;
    const commit = { policy: config, random, commits: this.commits, summary: this.summary, logger };
    await timed(this.summary, 'commit', commitBatch(batch, outcome, commit));
    this.inHand = undefined;
    // a failed COMMIT fails the invocation only now, so this batch's acks were committed first
    if (previousFailed) throw previousFailed;
    this.budget.record(Date.now() - batch.startedAt);
    this.noteBackedOffTopics(outcome);
    return this.nextBatch(outcome);
  }

  /** Rows this batch can publish; the rest wait behind an earlier row of their aggregate (G4). */
  private publishableRows(batch: Batch): ClaimedRow[] {
    const ready: ClaimedRow[] = [];
    for (const r of batch.rows) {
      if (r.publishable) {
        ready.push(r);
        continue;
      }
      this.heldBackRows.add(r.seq);
      if (r.behindUnclaimable && !this.aggregatesBehindUnclaimable.has(r.aggregateid)) {
        const { aggregateid, seq, first_gap: waitsFor } = r;
        const message = 'aggregate held back behind an unclaimable row';
        this.deps.logger.debug(message, { aggregateid, seq, waitsFor });
        this.aggregatesBehindUnclaimable.add(r.aggregateid);
      }
    }
    this.summary.heldBack = this.heldBackRows.size;
    return ready;
  }

  private async stopOnEmptyClaim(batch: Batch): Promise<undefined> {
    await this.release(batch);
    if (this.aggregatesBehindUnclaimable.size > 0) return this.stop('behind-unclaimable-rows');
    if (this.backedOffTopics.size > 0) return this.stop('topics-backed-off');
    const why = await this.deps.store.nothingClaimable(this.deadline);
    this.lastClaim.anyRowWakes = why === 'empty';
    // 'locked': rows are claimable but this claim did not get them. Other transactions hold them,
    // or they committed after the claim's snapshot; a poll's first probe would take the latter for
    // old rows, and they would wait for RECLAIM_MS (a NOTIFY has no such gap: it comes after the
    // claim started). So a polling linger claims once more, right away, and then waits.
    this.lastClaim.claimOnceMore = why === 'locked' && !this.lastClaim.recheck && this.idle?.polling === true;
    return this.stop(why);
  }

  /**
   * Everything claimed is held back: behind rows that are next in line now (the next claim starts
   * with them), or behind unclaimable rows (those aggregates are now left out). Claim again, once the
   * last COMMIT has landed: rows may have waited behind that batch.
   */
  private async claimAgain(batch: Batch): Promise<Batch | undefined> {
    await this.release(batch);
    if (!this.budget.fits()) return this.stop('budget');
    await this.clearStaleMarksOnce(batch);
    await timed(this.summary, 'commit', this.commits.answered());
    return timed(this.summary, 'claim', this.claim());
  }

  /**
   * Rows held back only behind stale marks (their blocking row went in a way that did not
   * clear them: two removals at once, triggers disabled): clear every stale mark, once per
   * invocation, and let those aggregates be claimed again. Any mark still stale after that keeps
   * its aggregate out until the next invocation, so the loop cannot claim behind it again and again.
   */
  private async clearStaleMarksOnce(batch: Batch): Promise<void> {
    const stale = batch.rows.filter((r) => r.behindStaleMark).map((r) => r.aggregateid);
    if (stale.length === 0 || this.staleMarksCleared) return;
    this.staleMarksCleared = true;
    await clearStaleMarks(this.deps.store, this.deps.logger, this.deadline);
    for (const a of stale) this.aggregatesBehindUnclaimable.delete(a);
  }

  /**
   * Claim the next batch while this one is published, when this batch was full (more rows are
   * likely) and two batches fit the budget. It cannot take this batch's aggregates (their locks
   * are held until this batch commits), so the two never race; it is told this batch's rows are
   * in flight, which stays true because this batch commits only after it has returned.
   */
  private async claimAhead(batch: Batch): Promise<NextClaim | undefined> {
    const full = batch.rows.length >= this.deps.config.batchSize;
    if (!full || !this.budget.fitsClaimAhead()) return undefined;
    const ahead = new NextClaim(this.claim(this.commits.behind, batch.rows.map((r) => r.seq)));
    // let the claim reach the database before the publish holds the event loop for the tens of
    // milliseconds kafkajs takes to encode the batch; else the loop waits for it later
    await socketsFlushed();
    return ahead;
  }

  /** Plan the batch, premark what will be sent, send it (loop/publish-batch.ts). Never throws for Kafka's failures. */
  private publish(batch: Batch, ready: ClaimedRow[]): Promise<PublishOutcome> {
    const { publisher, store, config } = this.deps;
    const { topicTemplate, rowRules: rules } = config;
    const sendBy = this.budget.sendBy();
    const ctx = { publisher, store, topicTemplate, rules, backedOff: this.backedOffTopics, sendBy };
    return publishBatch(batch.tx, ready, ctx);
  }

  private async testPause(outcome: PublishOutcome): Promise<void> {
    const pauseMs = this.deps.pauseAfterPublishMs;
    // compiled out of every build (src/test-hooks.ts)
    if (TEST_HOOKS && pauseMs && outcome.acked.length > 0) {
      // the previous batch's COMMIT is on the wire, its answer not yet read: a kill here is the
      // crash that G2's second test needs
      // no declaration in this block: esbuild keeps an `if (false)` block that declares one
      this.deps.logger.warn('test hook: pausing after publish, before marks commit', { pauseMs, acked: outcome.acked.length });
      await new Promise((r) => setTimeout(r, pauseMs));
    }
  }

  private noteBackedOffTopics(outcome: PublishOutcome): void {
    for (const { topic, error } of outcome.backedOff) {
      if (this.backedOffTopics.has(topic)) continue;
      this.backedOffTopics.add(topic);
      this.summary.topicsBackedOff.push(topic);
      const message =
        'topic refused by the broker; its rows stay pending, uncharged, and this invocation sends nothing more to it';
      this.deps.logger.warn(message, { topic, error });
    }
  }

  /** The stop rule after a batch, then the claim ahead, or a fresh claim when that found nothing. */
  private async nextBatch(outcome: PublishOutcome): Promise<Batch | undefined> {
    const ahead = this.ahead;
    this.ahead = undefined;
    if (outcome.unavailable) {
      await ahead?.discard();
      // A send that outlived the whole remaining budget (a hung or frozen broker) fails the
      // invocation like a broker that is down: both must show in Lambda's Errors metric.
      this.summary.error = outcome.unavailable.message;
      const error = outcome.unavailable;
      this.deps.logger.warn('broker unavailable; stopping this invocation, rows stay pending', { error });
      return this.stop('broker-unavailable');
    }
    if (!this.budget.fits()) {
      await ahead?.discard();
      return this.stop('budget');
    }
    const following = ahead ? await timed(this.summary, 'claim', ahead.take()) : undefined;
    if (following && following.rows.length > 0) return following;
    // No claim ahead (this batch was short), or it found nothing, possibly only because this
    // batch's transaction still held its aggregates or another invocation held rows it has
    // committed since. Claim once more; only an empty claim ends the invocation, so the last
    // invocation to commit always looks again (no rows are left behind).
    await following?.tx.rollback();
    await timed(this.summary, 'commit', this.commits.answered());
    return timed(this.summary, 'claim', this.claim());
  }

  /** Open a batch transaction and claim into it; `after`: follow that transaction's COMMIT on its connection. */
  private async claim(after?: BatchTransaction, inFlight: string[] = []): Promise<Batch> {
    const startedAt = Date.now();
    this.summary.claims++;
    const seen = this.idle?.seen() ?? 0;
    this.lastClaim = { at: startedAt, seen, anyRowWakes: false, claimOnceMore: false, recheck: false };
    const tx = await this.deps.store.begin(this.deadline, after);
    try {
      const rows = await tx.claim(this.deps.config.batchSize, {
        aggregates: [...this.aggregatesBehindUnclaimable],
        inFlight,
        topics: [...this.backedOffTopics],
        topicTemplate: this.deps.config.topicTemplate,
      });
      return { tx, rows, startedAt };
    } catch (err) {
      await tx.rollback();
      throw err;
    }
  }

  private async release(batch: Batch): Promise<void> {
    await batch.tx.rollback();
    if (this.inHand === batch) this.inHand = undefined;
  }

  private stop(reason: StopReason): undefined {
    this.summary.stoppedBecause = reason;
    return undefined;
  }

  /** Ends what is open and turns the error into the invocation's failure, with its summary if the database's. */
  private async failed(err: unknown): Promise<unknown> {
    await this.inHand?.tx.rollback();
    await this.ahead?.discard();
    await this.commits.answered().catch(() => undefined);
    // Only database statements can lose the race with the deadline here (sends report through
    // the outcome): a database that does not answer within the whole budget is hung, and fails
    // the invocation like a broker that is down, so it shows in Lambda's Errors metric.
    const hung = err instanceof DeadlineExceededError;
    const failure = hung
      ? new DatabaseError(`the database did not answer in time: ${err.message}`, { cause: err })
      : err;
    if (!(failure instanceof DatabaseError)) return failure;
    this.summary.error = failure.message;
    return Object.assign(failure, { summary: finish(this.summary, this.startedAt, 'database-error') });
  }

  finish(pruned: number): Summary {
    this.summary.pruned = pruned;
    return finish(this.summary, this.startedAt, this.summary.stoppedBecause);
  }
}

/** The stops that mean "nothing to claim now": linger mode waits for rows after them. */
const LINGERS_AFTER: ReadonlySet<StopReason> = new Set([
  'empty',
  'behind-failed-rows',
  'locked',
  'behind-unclaimable-rows',
  'topics-backed-off',
]);
