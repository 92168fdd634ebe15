import type { Deadline } from '../budget.ts';
import { DatabaseError, type RelayError } from '../errors.ts';
import { planBatch, topicsToSend, type PlanContext } from './plan.ts';
import type { BatchTransaction, ClaimedRow, PublishOutcome, Publisher, Store } from './ports.ts';

export interface PublishContext extends Omit<PlanContext, 'format' | 'limits'> {
  publisher: Publisher;
  store: Pick<Store, 'unusable'>;
  sendBy: Deadline;
}

export async function publishBatch(
  tx: BatchTransaction,
  ready: ClaimedRow[],
  ctx: PublishContext,
): Promise<PublishOutcome> {
  const { publisher, store, sendBy } = ctx;
  const plan = { format: publisher, topicTemplate: ctx.topicTemplate, rules: ctx.rules, backedOff: ctx.backedOff };
  const limits = new Map<string, number>();
  for (const topic of topicsToSend(ready, plan)) {
    try {
      limits.set(topic, await publisher.maxMessageBytes(topic, sendBy));
    } catch (err) {
      // the broker cannot even be asked: the whole batch waits, no row is charged
      return { acked: [], rejected: [], backedOff: [], unavailable: err as RelayError };
    }
  }
  let planned = planBatch(ready, { ...plan, limits });
  if (planned.unread.length > 0) {
      // their topics' limits were not known at the claim, which left out the large payloads
    const unread = new Set(planned.unread);
    await tx.readPayloads(ready.filter((r) => unread.has(r.seq)));
    planned = planBatch(ready, { ...plan, limits });
    // rows locked by this batch cannot lose their payloads: a second miss is a bug, never a send out of order
    if (planned.unread.length > 0) {
      throw new DatabaseError(
        `the payloads of rows ${planned.unread.join(', ')} could not be read; nothing of this batch was sent`,
      );
    }
  }
  tx.premark(planned.messages.map((m) => m.seq));
  // The client was abandoned since this batch was claimed (the claim ahead, while the batch
  // before it was committed): the server has rolled its transaction back, so its rows are no
  // longer ours, and a publish would be a second batch sent again by the next invocation (G2).
  const unusable = store.unusable('publishing a batch claimed ahead');
  if (unusable) throw unusable;
  const sent = await publisher.publish(planned.messages, sendBy);
  return { ...sent, rejected: [...planned.rejected, ...sent.rejected] };
}
