// The invocation loop (DESIGN §2): claim → publish → mark, one transaction per batch, until the
// budget or the rows run out. While a batch is on its way to the broker, the next batch is
// claimed and this batch's marks are written (uncommitted, behind a savepoint), so the database
// and Kafka work at the same time. The batch's COMMIT is written to the database before the next
// batch is published (its answer is read after), so a crash re-sends at most one batch (G2).
import { BatchTimer, type Deadline } from './budget.ts';
import { socketsFlushed } from './event-loop.ts';
import { backoffMs, shouldPark } from './backoff.ts';
import type { Config } from './config.ts';
import { DatabaseError, DeadlineExceededError, MessageRejectedError, RelayError, describe } from './errors.ts';
import type { Logger } from './log.ts';
import { encodedSize, toMessage, type OutboundMessage } from './kafka/message.ts';
import type { PublishOutcome, Publisher } from './kafka/publisher.ts';
import { classifySendError } from './kafka/classify.ts';
import type { BatchTx, ClaimedRow, Failure, OutboxStore } from './outbox/store.ts';

export type StopReason =
  | 'empty' // nothing pending and due
  | 'held-back' // everything claimable waits behind an earlier row of its aggregate
  | 'locked' // every due row is held by other invocations
  | 'topics-backed-off' // what is left is bound for topics the broker refused in this invocation
  | 'budget' // not enough time left for another batch
  | 'broker-unavailable'
  | 'database-error';

export interface Summary {
  claimed: number;
  published: number;
  retried: number;
  parked: number;
  heldBack: number;
  batches: number;
  pruned: number;
  /** topics the broker refused as a whole in this invocation (deleted, unknown, forbidden): their rows wait, uncharged */
  topicsBackedOff: string[];
  durationMs: number;
  /**
   * where the loop's time went, ms: waiting for claims (not hidden behind a publish), publishing
   * (encode, send, acks) and settling (the marks' COMMIT). For tuning; their sum is ~durationMs.
   */
  waitedMs: { claim: number; publish: number; settle: number };
  stoppedBecause: StopReason;
  error?: string;
}

/** time kept after a batch's sends for marking and committing what was acked */
const MARK_RESERVE_MS = 500;

export interface RelayDeps {
  store: OutboxStore;
  publisher: Publisher;
  config: Config['outbox'];
  logger: Logger;
  /** test-only: pause after the broker acked a batch, before its marks commit (crash window) */
  pauseAfterPublishMs?: number;
  random?: () => number;
}

interface Batch {
  tx: BatchTx;
  rows: ClaimedRow[];
  startedAt: number;
}

export async function runInvocation(deps: RelayDeps, deadline: Deadline): Promise<Summary> {
  const started = Date.now();
  const { store, config, logger } = deps;
  const timer = new BatchTimer();
  const summary: Summary = { claimed: 0, published: 0, retried: 0, parked: 0, heldBack: 0, batches: 0, pruned: 0, topicsBackedOff: [], durationMs: 0, waitedMs: { claim: 0, publish: 0, settle: 0 }, stoppedBecause: 'budget' };
  const waited = summary.waitedMs;
  /** awaits p, adding the time to waitedMs[what] */
  const timed = async <T>(what: keyof Summary['waitedMs'], p: Promise<T>): Promise<T> => {
    const t0 = performance.now();
    try {
      return await p;
    } finally {
      waited[what] += performance.now() - t0;
    }
  };

  let current: Batch | undefined;
  let next: Promise<Batch> | undefined;
  // the last batch's COMMIT, written to the database but not yet answered (see settle), and the
  // transaction whose connection the next claim follows it on (see OutboxStore.begin)
  let committing: Promise<void> | undefined;
  let committingTx: BatchTx | undefined;
  const previousCommit = (): Promise<void> => {
    const c = committing;
    committing = undefined;
    committingTx = undefined;
    return c ?? Promise.resolve();
  };
  // Aggregates found waiting behind a row this invocation cannot take (held by a transaction
  // that is not a relay's): left out of this invocation's later claims so their rows do not
  // crowd every batch; the next invocation looks at them again.
  const stuck = new Set<string>();
  // Topics the broker refused as a whole (see PublishOutcome.backedOff): not claimed again in this
  // invocation, so their rows neither fill the batches nor get charged; the next one tries again.
  const backedOff = new Set<string>();
  const avoid: Avoid = { aggregates: stuck, topics: backedOff, template: config.topicTemplate };
  try {
    if (!deadline.fits(timer.expected())) return finish(summary, started, 'budget');
    current = await timed('claim', claim(deps, deadline, avoid));
    while (current) {
      const batch: Batch = current;
      // still `current` for the catch below until its transaction has ended (settle or rollback)
      const publishable = batch.rows.filter((r) => r.publishable);
      for (const r of batch.rows) {
        if (r.publishable || !r.waitsOnForeignLock || stuck.has(r.aggregateid)) continue;
        logger.debug('aggregate held back behind a row another transaction holds', { aggregateid: r.aggregateid, seq: r.seq, waitsFor: r.first_gap });
        stuck.add(r.aggregateid);
      }
      summary.heldBack += batch.rows.length - publishable.length;

      if (batch.rows.length === 0) {
        await batch.tx.rollback();
        current = undefined;
        summary.stoppedBecause = stuck.size > 0 ? 'held-back' : backedOff.size > 0 ? 'topics-backed-off' : (await store.anyDue(deadline)) ? 'locked' : 'empty';
        break;
      }
      if (publishable.length === 0) {
        // Everything claimed waits: either behind rows now next in line (the next claim starts
        // with them) or behind foreign locks (those aggregates are now excluded). Claim again.
        await batch.tx.rollback();
        current = undefined;
        if (!deadline.fits(timer.expected())) break;
        // rows may wait behind the last batch: claim again once its COMMIT has landed
        await timed('settle', previousCommit());
        current = await timed('claim', claim(deps, deadline, avoid));
        continue;
      }
      summary.claimed += publishable.length;
      summary.batches++;

      // Claim the next batch while this one is published. It cannot contain this batch's
      // aggregates (their locks are held by this batch's transaction), so the two never race.
      const full = batch.rows.length >= config.batchSize;
      // It is told this batch's rows are in flight (they are no gaps for it: other aggregates),
      // which holds while this batch's transaction stays open: it is awaited before settle().
      next = full && deadline.fits(timer.expected() * 2) ? claim(deps, deadline, avoid, committingTx, batch.rows.map((r) => r.seq)) : undefined;
      // awaited below; this only keeps an early rejection from counting as unhandled meanwhile
      next?.catch(() => undefined);
      // let the claim reach the database before the publish below holds the event loop for the
      // tens of milliseconds kafkajs takes to encode the batch; else the loop waits for it later
      if (next) await socketsFlushed();

      // Sends give up a little before the deadline, so the acks that did arrive (other topics of
      // the batch) can still be committed instead of being re-sent by the next invocation.
      const outcome = await timed('publish', publishBatch(deps, publishable, backedOff, deadline.minus(Math.min(MARK_RESERVE_MS, deadline.remaining() / 4)), (seqs) => batch.tx.premark(seqs)));
      if (deps.pauseAfterPublishMs && outcome.acked.length) {
        // (the previous batch's COMMIT is on the wire, its answer not yet read: a kill here is
        // the crash that G2's second test needs)
        logger.warn('test hook: pausing after publish, before marks commit', { pauseMs: deps.pauseAfterPublishMs, acked: outcome.acked.length });
        await new Promise((r) => setTimeout(r, deps.pauseAfterPublishMs));
      }
      // The previous batch's COMMIT went out before this publish began; it has answered by now.
      // If it failed, this batch's acks are still committed before the invocation fails, so the
      // failure re-sends only the batch whose COMMIT failed.
      const previousFailed = await timed('settle', previousCommit()).then(
        () => undefined,
        (err: unknown) => (err instanceof Error ? err : new DatabaseError(describe(err))),
      );
      // the next claim relies on this batch's locks (see above): it must have finished first
      if (next) await timed('claim', next.then(noop, noop));
      committing = (await timed('settle', settle(deps, batch, outcome, summary)))?.committed;
      committingTx = committing ? batch.tx : undefined;
      current = undefined;
      committing?.catch(() => undefined);
      if (previousFailed !== undefined) {
        await timed('settle', previousCommit());
        throw previousFailed;
      }
      timer.record(Date.now() - batch.startedAt);

      const pending: Promise<Batch> | undefined = next;
      next = undefined;
      for (const { topic, error } of outcome.backedOff) {
        if (backedOff.has(topic)) continue;
        backedOff.add(topic);
        summary.topicsBackedOff.push(topic);
        logger.warn('topic refused by the broker; its rows stay pending, uncharged, and this invocation sends nothing more to it', { topic, error });
      }
      if (outcome.unavailable) {
        await discard(pending);
        // A send that outlived the whole remaining budget (a hung or frozen broker) fails the
        // invocation like a broker that is down: both must show in Lambda's Errors metric.
        summary.stoppedBecause = 'broker-unavailable';
        summary.error = outcome.unavailable.message;
        logger.warn('broker unavailable; stopping this invocation, rows stay pending', { error: outcome.unavailable });
        break;
      }
      if (!deadline.fits(timer.expected())) {
        await discard(pending);
        summary.stoppedBecause = 'budget';
        break;
      }
      let following = pending ? await timed('claim', pending) : undefined;
      if (!following || following.rows.length === 0) {
        // No early claim (this batch was short), or it found nothing, possibly only because
        // this batch's transaction still held its aggregates or another invocation held rows
        // it has committed since. Claim once more; only an empty claim ends the invocation, so
        // the last invocation to commit always looks again (no rows are left behind).
        await following?.tx.rollback();
        await timed('settle', previousCommit());
        following = await timed('claim', claim(deps, deadline, avoid));
      }
      current = following;
    }
    await timed('settle', previousCommit());
  } catch (err) {
    await current?.tx.rollback();
    await discard(next);
    await committing?.catch(() => undefined);
    // Only database statements can lose the race with the deadline here (sends report through
    // the outcome): a database that does not answer within the whole budget is hung, and fails
    // the invocation like a broker that is down, so it shows in Lambda's Errors metric.
    const failure =
      err instanceof DeadlineExceededError ? new DatabaseError(`the database did not answer in time: ${err.message}`, { cause: err }) : err;
    if (!(failure instanceof DatabaseError)) throw failure;
    summary.error = failure.message;
    throw Object.assign(failure, { summary: finish(summary, started, 'database-error') });
  }

  if (config.retainSentMs > 0 && deadline.fits(timer.expected()) && summary.stoppedBecause !== 'broker-unavailable') {
    try {
      summary.pruned = await store.prune(config.retainSentMs, 5_000, deadline);
    } catch (err) {
      logger.warn('pruning old sent rows failed; will try again next invocation', { error: err });
    }
  }
  return finish(summary, started, summary.stoppedBecause);
}

function finish(summary: Summary, started: number, reason: StopReason): Summary {
  summary.stoppedBecause = reason;
  summary.durationMs = Date.now() - started;
  for (const k of Object.keys(summary.waitedMs) as (keyof Summary['waitedMs'])[]) summary.waitedMs[k] = Math.round(summary.waitedMs[k]);
  return summary;
}

/** What this invocation's claims leave out: aggregates stuck behind foreign locks, backed-off topics. */
interface Avoid {
  aggregates: Set<string>;
  topics: Set<string>;
  template: string;
}

async function claim(deps: RelayDeps, deadline: Deadline, avoid: Avoid, after?: BatchTx, inFlight: string[] = []): Promise<Batch> {
  const startedAt = Date.now();
  const tx = await deps.store.begin(deadline, after);
  try {
    const rows = await tx.claim(deps.config.batchSize, [...avoid.aggregates], inFlight, { template: avoid.template, topics: [...avoid.topics] });
    return { tx, rows, startedAt };
  } catch (err) {
    await tx.rollback();
    throw err;
  }
}

function noop(): void {}

async function discard(pending: Promise<Batch> | undefined): Promise<void> {
  if (!pending) return;
  try {
    const b = await pending;
    await b?.tx.rollback();
  } catch {
    // the claim itself failed; its transaction was already rolled back
  }
}

/** Map rows to messages, park what can never be sent, publish the rest. */
async function publishBatch(
  deps: RelayDeps,
  rows: ClaimedRow[],
  backedOff: ReadonlySet<string>,
  deadline: Deadline,
  beforeSend: (seqs: string[]) => void,
): Promise<PublishOutcome & { seqToRow: Map<string, ClaimedRow> }> {
  const seqToRow = new Map(rows.map((r) => [r.seq, r]));
  const rejected: PublishOutcome['rejected'] = [];
  const messages: OutboundMessage[] = [];
  const blocked = new Set<string>();
  const limits = new Map<string, number>();
  const topicOf = new Map<string, string>();
  for (const row of rows) {
    // once a row of an aggregate is rejected, its later rows in this batch wait (order, G4)
    if (blocked.has(row.aggregateid)) continue;
    try {
      const m = toMessage(row, deps.config.topicTemplate);
      // claimed before its topic was backed off (the claim ahead): it waits, and so do its successors
      if (backedOff.has(m.topic)) {
        blocked.add(row.aggregateid);
        continue;
      }
      // Topics are sent concurrently and fail independently, so a later row of an aggregate
      // bound for another topic (a per-row topic override) could be acked while an earlier one
      // fails and backs off: G4 broken, the hold policy bypassed. Publish an aggregate's rows
      // only up to its first change of topic; the rest stay pending, uncharged, and a later
      // claim takes them once the earlier rows were acked (or holds them if they failed).
      const first = topicOf.get(row.aggregateid);
      if (first === undefined) topicOf.set(row.aggregateid, m.topic);
      else if (first !== m.topic) {
        blocked.add(row.aggregateid);
        continue;
      }
      const size = encodedSize(m);
      let limit = limits.get(m.topic);
      if (limit === undefined) {
        try {
          limit = await deps.publisher.maxMessageBytes(m.topic, deadline);
        } catch (err) {
          // the broker cannot even be asked: the whole batch waits, no row is charged
          return { acked: [], rejected, backedOff: [], unavailable: classifySendError(err, m.topic).error, seqToRow };
        }
        limits.set(m.topic, limit);
      }
      if (size > limit) {
        throw new MessageRejectedError(`message is ${size} bytes, over the ${limit}-byte limit of topic ${m.topic}: shrink the payload or raise max.message.bytes / OUTBOX_MAX_MESSAGE_BYTES`, true);
      }
      messages.push(m);
    } catch (err) {
      if (!(err instanceof MessageRejectedError)) throw err;
      rejected.push({ seq: row.seq, error: err });
      blocked.add(row.aggregateid);
    }
  }
  beforeSend(messages.map((m) => m.seq));
  const outcome = await deps.publisher.publish(messages, deadline);
  return { ...outcome, rejected: [...rejected, ...outcome.rejected], seqToRow };
}

/**
 * Mark acked rows sent, charge rejected rows an attempt (or park them), commit.
 *
 * Usually every row of the batch was acked and its marks were written during the send (premark),
 * so only the COMMIT is left: it is written to the database and the loop goes on without waiting
 * for the answer, which comes back while the next batch is published. That keeps G2: the COMMIT
 * is on the wire before the next batch's first byte goes to Kafka, so a crash re-sends at most the
 * batch in flight; the database commits what it received even if we died just after sending it.
 * Returns the pending COMMIT's outcome in that case (a failure rejects it), else undefined.
 */
async function settle(
  deps: RelayDeps,
  batch: Batch,
  outcome: PublishOutcome & { seqToRow: Map<string, ClaimedRow> },
  summary: Summary,
): Promise<{ committed: Promise<void> } | undefined> {
  const random = deps.random ?? Math.random;
  const failures: Failure[] = outcome.rejected.map(({ seq, error }) => {
    const attempt = (outcome.seqToRow.get(seq)?.attempts ?? 0) + 1;
    const park = shouldPark(attempt, deps.config.maxAttempts, error.permanent);
    return { seq, error: error.message, park, delayMs: park ? 0 : backoffMs(attempt, deps.config.backoffBaseMs, deps.config.backoffMaxMs, random) };
  });
  if (outcome.acked.length === 0 && failures.length === 0) {
    // Nothing to write (e.g. the broker hung and the send lost the race with the deadline): roll
    // back. A COMMIT here would find the deadline spent and fail, and the invocation would then
    // blame "committing the batch" instead of the broker.
    await batch.tx.rollback();
    return undefined;
  }
  const failed = (err: unknown): Error => {
    // acked but not marked: these rows will be sent again (at-least-once), with the same ids
    deps.logger.error('could not commit the batch marks; its rows will be re-sent', { acked: outcome.acked.length, error: err });
    return err instanceof RelayError ? err : new DatabaseError(`committing marks failed: ${describe(err)}`, { cause: err });
  };
  const recorded = (): void => {
    summary.published += outcome.acked.length;
    for (const f of failures) {
      if (f.park) summary.parked++;
      else summary.retried++;
      deps.logger.warn(f.park ? 'row parked' : 'row will be retried', { seq: f.seq, error: f.error, delayMs: f.delayMs });
    }
  };
  try {
    const fast = await batch.tx.commitPremarked(outcome.acked, failures);
    if (fast) {
      const committed = fast.committed.then(recorded, (err: unknown) => {
        throw failed(err);
      });
      return { committed };
    }
    await batch.tx.settle(outcome.acked, failures);
  } catch (err) {
    await batch.tx.rollback();
    throw failed(err);
  }
  recorded();
  return undefined;
}
