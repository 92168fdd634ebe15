// Planning a batch (pure): which claimed rows become messages now, which are rejected before any
// send (they can never be sent as they are), and which wait, uncharged, for a later batch. What a
// message is, and which the broker can never take, the publisher says (MessageFormat); what a row
// may choose (its topic's prefix, its headers), the relay's rules (row-rules.ts).
import { payloadLeftOut, type OutboxRow, type RowRules } from '../domain.ts';
import { MessageRejectedError } from '../errors.ts';
import type { MessageFormat, OutboundMessage } from './ports.ts';
import { brokenRule } from './row-rules.ts';

export interface Plan {
  /** in seq order; an aggregate's messages are a prefix of its rows in the batch */
  messages: OutboundMessage[];
  /** rows that can never be sent as they are (illegal topic, a broken row rule, too large): charged an attempt */
  rejected: Array<{ seq: string; error: MessageRejectedError }>;
  /** rows that wait, uncharged: behind a rejected row, a change of topic, or a backed-off topic */
  waiting: string[];
  /**
   * rows whose payload the claim left out (payloadLeftOut) and whose topic takes a message that
   * large: to read (BatchTransaction.readPayloads). While any is listed, the plan is incomplete and
   * none of its messages may be sent: plan again once they are read.
   */
  unread: string[];
}

export interface PlanContext {
  /** the publisher's: rows to messages, and the sizes it refuses */
  format: MessageFormat;
  topicTemplate: string;
  /** what a row may choose: checked before any send, and before its topic's limit is asked for */
  rules: RowRules;
  /** the largest message each topic takes (Publisher.maxMessageBytes; topicsToSend lists the topics to look up) */
  limits: ReadonlyMap<string, number>;
  /** topics the broker refused as a whole in this invocation */
  backedOff: ReadonlySet<string>;
}

/**
 * The topics whose size limit planBatch needs: those of rows that could be sent. A row that breaks
 * a rule is left out, so that not even its topic's config is asked of the broker.
 */
export function topicsToSend(rows: OutboxRow[], ctx: Omit<PlanContext, 'limits'>): string[] {
  const topics = new Set<string>();
  for (const row of rows) {
    const m = messageOf(row, ctx);
    if (!(m instanceof MessageRejectedError) && !ctx.backedOff.has(m.topic)) topics.add(m.topic);
  }
  return [...topics];
}

/** The row's message, or why it can never be sent: the broker's rules (an illegal topic name), then the relay's. */
function messageOf(row: OutboxRow, ctx: Omit<PlanContext, 'limits'>): OutboundMessage | MessageRejectedError {
  let m: OutboundMessage;
  try {
    m = ctx.format.toMessage(row, ctx.topicTemplate);
  } catch (err) {
    if (err instanceof MessageRejectedError) return err;
    throw err;
  }
  return brokenRule(m, ctx.rules) ?? m;
}

/** `rows` in seq order. Once a row of an aggregate is not sent now, none of its later rows is (G4). */
export function planBatch(rows: OutboxRow[], ctx: PlanContext): Plan {
  const plan: Plan = { messages: [], rejected: [], waiting: [], unread: [] };
  const stopped = new Set<string>();
  const topicOf = new Map<string, string>();
  for (const row of rows) {
    if (stopped.has(row.aggregateid)) {
      plan.waiting.push(row.seq);
      continue;
    }
    const m = messageOf(row, ctx);
    if (m instanceof MessageRejectedError) {
      plan.rejected.push({ seq: row.seq, error: m });
      stopped.add(row.aggregateid);
      continue;
    }
    // Topics are sent concurrently and fail independently, so a later row of an aggregate bound
    // for another topic (a per-row topic override) could be acked while an earlier one fails:
    // G4 broken. Publish an aggregate's rows only up to its first change of topic; the rest wait
    // for a later batch, which takes them once the earlier rows were acked. Rows claimed before
    // their topic was backed off (the claim ahead) wait too.
    const first = topicOf.get(row.aggregateid) ?? m.topic;
    topicOf.set(row.aggregateid, first);
    if (first !== m.topic || ctx.backedOff.has(m.topic)) {
      plan.waiting.push(row.seq);
      stopped.add(row.aggregateid);
      continue;
    }
    const limit = ctx.limits.get(m.topic);
    // a payload the claim left out is sized from payload_bytes: parked unread when too large
    const unread = payloadLeftOut(row) ? row.payload_bytes : undefined;
    const tooLarge = limit === undefined ? undefined : ctx.format.tooLarge(m, limit, unread);
    if (tooLarge) {
      plan.rejected.push({ seq: row.seq, error: tooLarge });
      stopped.add(row.aggregateid);
      continue;
    }
    if (unread !== undefined) {
      // not a stop: every payload to read is found at once (the plan is made again once they are)
      plan.unread.push(row.seq);
      continue;
    }
    plan.messages.push(m);
  }
  return plan;
}
