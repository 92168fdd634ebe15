import { payloadLeftOut, type OutboxRow, type RowRules } from '../domain.ts';
import { MessageRejectedError } from '../errors.ts';
import type { MessageFormat, OutboundMessage } from './ports.ts';
import { brokenRule } from './row-rules.ts';

export interface Plan {
  messages: OutboundMessage[];
  rejected: Array<{ seq: string; error: MessageRejectedError }>;
  waiting: string[];
  /** while any is listed, none of the plan's messages may be sent: plan again once they are read */
  unread: string[];
}

export interface PlanContext {
  format: MessageFormat;
  topicTemplate: string;
  rules: RowRules;
  limits: ReadonlyMap<string, number>;
  backedOff: ReadonlySet<string>;
}

/** A row that breaks a rule is left out, so that not even its topic's config is asked of the broker. */
export function topicsToSend(rows: OutboxRow[], ctx: Omit<PlanContext, 'limits'>): string[] {
  const topics = new Set<string>();
  for (const row of rows) {
    const m = messageOf(row, ctx);
    if (!(m instanceof MessageRejectedError) && !ctx.backedOff.has(m.topic)) topics.add(m.topic);
  }
  return [...topics];
}

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
    // for another topic could be acked while an earlier one fails: G4 broken. An aggregate's rows
    // are published only up to its first change of topic.
    const first = topicOf.get(row.aggregateid) ?? m.topic;
    topicOf.set(row.aggregateid, first);
    if (first !== m.topic || ctx.backedOff.has(m.topic)) {
      plan.waiting.push(row.seq);
      stopped.add(row.aggregateid);
      continue;
    }
    const limit = ctx.limits.get(m.topic);
    const unread = payloadLeftOut(row) ? row.payload_bytes : undefined;
    const tooLarge = limit === undefined ? undefined : ctx.format.tooLarge(m, limit, unread);
    if (tooLarge) {
      plan.rejected.push({ seq: row.seq, error: tooLarge });
      stopped.add(row.aggregateid);
      continue;
    }
    if (unread !== undefined) {
      // not a stop, so that every payload to read is found in one plan
      plan.unread.push(row.seq);
      continue;
    }
    plan.messages.push(m);
  }
  return plan;
}
