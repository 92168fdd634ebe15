// The invocation loop (docs/DESIGN.md, "The invocation loop"); Invocation.relayBatch is that
// section's flowchart, step by step. The next claim, this batch's marks and its COMMIT's answer
// overlap the publish, so that neither the database nor Kafka waits for the other.
import { BatchBudget, type Deadline } from '../budget.ts';
import type { Config, PauseWindow } from '../config/types.ts';
import { DatabaseError, DeadlineExceededError, TransactionAbortedError, type RelayError } from '../errors.ts';
import { socketsFlushed } from './event-loop.ts';
import type { Logger } from '../log.ts';
import { commitBatch } from './commit-batch.ts';
import { CommitChain } from './commit-chain.ts';
import { Idle } from './idle.ts';
import { Lane, type LaneDeps } from './lane.ts';
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
  /** test-only (src/test-hooks.ts): the crash window between the broker's acks and the marks' commit */
  pauseAfterPublishMs?: number;
  /** test-only: where that pause is (Config.testPauseAt) */
  pauseAt?: PauseWindow;
  /** OUTBOX_DELIVERY=exactly-once: each batch in a Kafka transaction of a leased lane (docs/DESIGN.md, "Exactly-once delivery (opt-in)") */
  exactlyOnce?: LaneDeps;
  random?: () => number;
}

export async function runInvocation(deps: RelayDeps, deadline: Deadline): Promise<Summary> {
  const invocation = new Invocation(deps, deadline);
  await invocation.checkTables();
  if (!deps.exactlyOnce) return relay(deps, deadline, invocation);
  const lane = await invocation.leaseLane(deps.exactlyOnce);
  if (!lane) return invocation.finish(0);
  try {
    return await relay(deps, deadline, invocation);
  } finally {
    await lane.end(deadline);
  }
}

async function relay(deps: RelayDeps, deadline: Deadline, invocation: Invocation): Promise<Summary> {
  await maintainPartitions(deps.store, deps.config.retainSentMs, deps.logger, deadline);
  const { retainSkippedMs } = deps.config;
  const retainSentMs = deps.store.partitionsMaintained ? 0 : deps.config.retainSentMs;
  const windows = { sentMs: retainSentMs, skippedMs: retainSkippedMs };
  const retains = retainSentMs > 0 || retainSkippedMs > 0;
  const retention = retains ? new Retention(deps.store, windows, deps.logger) : undefined;
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
  private readonly budget: BatchBudget;
  private readonly commits = new CommitChain();
  /** left out of later claims, so they neither fill every batch nor are claimed again and again */
  private readonly aggregatesBehindUnclaimable = new Set<string>();
  private readonly backedOffTopics = new Set<string>();
  private readonly heldBackRows = new Set<string>();
  private staleMarksCleared = false;
  private inHand: Batch | undefined;
  private ahead: NextClaim | undefined;
  private readonly idle: Idle | undefined;
  private lastClaim = { at: 0, seen: 0, anyRowWakes: false, claimOnceMore: false, recheck: false };
  private lane: Lane | undefined;

  constructor(
    private readonly deps: RelayDeps,
    private readonly deadline: Deadline,
  ) {
    this.budget = new BatchBudget(deadline);
    if (deps.config.idle === 'linger') this.idle = new Idle(deps.store, deps.config, deps.logger);
  }

  async checkTables(): Promise<void> {
    try {
      for (const warning of await this.deps.store.checkTables(this.deadline)) this.deps.logger.warn(warning);
    } catch (err) {
      throw await this.failed(err);
    }
  }

  /** Undefined when every lane is leased: the invocation stops at once ('no-lane'). */
  async leaseLane(deps: LaneDeps): Promise<Lane | undefined> {
    try {
      // the lease lasts until the Lambda's own timeout, and a little more
      this.lane = await Lane.lease(deps, this.deadline.remaining() + this.deps.config.safetyMarginMs, this.deadline);
    } catch (err) {
      throw await this.failed(err);
    }
    if (!this.lane) {
      this.stop('no-lane');
      this.deps.logger.info('every exactly-once lane is leased by another invocation; this one stops', {});
    }
    return this.lane;
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

  private async relayBatch(batch: Batch): Promise<Batch | undefined> {
    this.inHand = batch;
    const ready = this.publishableRows(batch);
    if (batch.rows.length === 0) return this.stopOnEmptyClaim(batch);
    if (ready.length === 0) return this.claimAgain(batch);
    this.summary.claimed += ready.length;
    this.summary.batches++;

    this.ahead = await this.claimAhead(batch);
    const published = await timed(this.summary, 'publish', this.publish(batch, ready));
    await this.testPause(published, 'publish');
    // the previous batch's COMMIT went out before this publish began; it has answered by now
    const previousFailed = await timed(this.summary, 'commit', this.commits.failureOf());
    // the claim ahead relies on this batch's locks: it must have returned before they go
    await timed(this.summary, 'claim', this.ahead?.returned() ?? Promise.resolve());
    const outcome = this.lane ? await timed(this.summary, 'commit', this.commitTransaction(this.lane, published, previousFailed)) : published;
    await this.testPause(outcome, 'kafka-commit');
    const { config, random, logger } = this.deps;
    const commit = { policy: config, random, commits: this.commits, summary: this.summary, logger };
    await timed(this.summary, 'commit', commitBatch(batch, outcome, commit));
    this.inHand = undefined;
    await this.testPause(outcome, 'committed');
    // a failed COMMIT fails the invocation only now, so this batch's acks were committed first
    if (previousFailed) throw previousFailed;
    this.budget.record(Date.now() - batch.startedAt);
    this.noteBackedOffTopics(outcome);
    return this.nextBatch(outcome);
  }

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

  /** After the last COMMIT has landed: rows may have waited behind that batch. */
  private async claimAgain(batch: Batch): Promise<Batch | undefined> {
    await this.release(batch);
    if (!this.budget.fits()) return this.stop('budget');
    await this.clearStaleMarksOnce(batch);
    await timed(this.summary, 'commit', this.commits.answered());
    return timed(this.summary, 'claim', this.claim());
  }

  /**
   * Once per invocation: a mark still stale after that (its blocking row went in a way that did not
   * clear it) keeps its aggregate out until the next one, so the loop cannot claim behind it again and again.
   */
  private async clearStaleMarksOnce(batch: Batch): Promise<void> {
    const stale = batch.rows.filter((r) => r.behindStaleMark).map((r) => r.aggregateid);
    if (stale.length === 0 || this.staleMarksCleared) return;
    this.staleMarksCleared = true;
    await clearStaleMarks(this.deps.store, this.deps.logger, this.deadline);
    for (const a of stale) this.aggregatesBehindUnclaimable.delete(a);
  }

  /**
   * Only after a full batch (more rows are likely). It cannot race this batch: their aggregates
   * stay locked until this batch commits, which is only after the claim has returned.
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

  /**
   * Exactly-once delivery: the batch on record in the lane (committed), then its Kafka transaction
   * committed, in that order; the marks settle the record. A commit that fails may still have
   * committed: its rows stay on record, for the lane's next holder, and this invocation stops.
   */
  private async commitTransaction(lane: Lane, outcome: PublishOutcome, previousFailed: Error | undefined): Promise<PublishOutcome> {
    // the previous batch's marks did not commit: its record still stands, and this batch waits behind it
    if (previousFailed || outcome.acked.length === 0) {
      await lane.publisher.abort();
      return { ...outcome, acked: [] };
    }
    let batchNo: string;
    try {
      batchNo = await lane.record(outcome.acked, this.deadline);
    } catch (err) {
      await lane.publisher.abort();
      throw err;
    }
    try {
      await lane.publisher.commit(batchNo, this.deadline);
    } catch (err) {
      // known not committed: the batch's own transaction settles the record, its rows stay pending
      if (err instanceof TransactionAbortedError) {
        const refused = err.refused ? { backedOff: [...outcome.backedOff, err.refused] } : { unavailable: err };
        return { ...outcome, acked: [], settle: lane.settlement(batchNo), ...refused };
      }
      const message = 'the Kafka transaction did not confirm its commit; its rows stay on record for the lane\'s next holder, which marks or frees them';
      this.deps.logger.warn(message, { lane: lane.lease.lane, batchNo, rows: outcome.acked.length, error: err });
      return { ...outcome, acked: [], unavailable: err as RelayError };
    }
    return { ...outcome, settle: lane.settlement(batchNo) };
  }

  private publish(batch: Batch, ready: ClaimedRow[]): Promise<PublishOutcome> {
    const { store, config } = this.deps;
    const publisher = this.lane?.publisher ?? this.deps.publisher;
    const { topicTemplate, rowRules: rules } = config;
    const sendBy = this.budget.sendBy();
    const ctx = { publisher, store, topicTemplate, rules, backedOff: this.backedOffTopics, sendBy };
    return publishBatch(batch.tx, ready, ctx);
  }

  private async testPause(outcome: PublishOutcome, at: PauseWindow): Promise<void> {
    const pauseMs = this.deps.pauseAfterPublishMs;
    // compiled out of every build (src/test-hooks.ts)
    if (TEST_HOOKS && pauseMs && outcome.acked.length > 0 && at === (this.deps.pauseAt ?? 'publish')) {
      // the previous batch's COMMIT is on the wire, its answer not yet read: a kill here is the
      // crash that G2's second test needs
      // no declaration in this block: esbuild keeps an `if (false)` block that declares one
      if (at === 'committed') await this.commits.answered();
      this.deps.logger.warn(`test hook: pausing after publish, before marks commit (at ${at})`, { pauseMs, acked: outcome.acked.length, at });
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

  private async failed(err: unknown): Promise<unknown> {
    // each its own transaction on its own connection: together they spend one rollback grace past
    // the deadline (Deadline.rollbackGrace), not one each
    await Promise.all([this.inHand?.tx.rollback(), this.ahead?.discard(), this.commits.answered().catch(() => undefined)]);
    // Only statements can lose the race with the deadline here (sends report through the outcome):
    // a database hung for the whole budget fails like a broker that is down (nextBatch).
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

const LINGERS_AFTER: ReadonlySet<StopReason> = new Set([
  'empty',
  'behind-failed-rows',
  'locked',
  'behind-unclaimable-rows',
  'topics-backed-off',
]);
