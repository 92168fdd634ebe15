// Operator queries: status and parked rows. Same configuration as the handler.
import type { Sql } from 'postgres';
import { topicFor } from '../kafka/message.ts';
import { qualified, type TableName } from './identifier.ts';
import * as q from './sql.ts';

export interface TopicStatus {
  topic: string;
  pending: number;
  retrying: number;
  parked: number;
  oldestPendingMs: number | null;
}

export interface Status {
  table: string;
  pending: number;
  retrying: number;
  parked: number;
  oldestPendingMs: number | null;
  topics: TopicStatus[];
}

export async function status(sql: Sql, table: TableName, template: string): Promise<Status> {
  const rows = await sql.unsafe<{ topic_override: string; aggregatetype: string; pending: string; retrying: string; parked: string; oldest_pending_ms: string | null }[]>(q.statusSql(qualified(table)));
  const byTopic = new Map<string, TopicStatus>();
  for (const r of rows) {
    const topic = topicFor({ topic: r.topic_override || null, aggregatetype: r.aggregatetype, type: '{type}' }, template);
    const t = byTopic.get(topic) ?? { topic, pending: 0, retrying: 0, parked: 0, oldestPendingMs: null };
    t.pending += Number(r.pending);
    t.retrying += Number(r.retrying);
    t.parked += Number(r.parked);
    if (r.oldest_pending_ms !== null) t.oldestPendingMs = Math.max(t.oldestPendingMs ?? 0, Math.round(Number(r.oldest_pending_ms)));
    byTopic.set(topic, t);
  }
  const topics = [...byTopic.values()].sort((a, b) => a.topic.localeCompare(b.topic));
  const oldest = topics.map((t) => t.oldestPendingMs).filter((x): x is number => x !== null);
  return {
    table: qualified(table),
    pending: topics.reduce((n, t) => n + t.pending, 0),
    retrying: topics.reduce((n, t) => n + t.retrying, 0),
    parked: topics.reduce((n, t) => n + t.parked, 0),
    oldestPendingMs: oldest.length ? Math.max(...oldest) : null,
    topics,
  };
}

export interface ParkedRow {
  id: string;
  seq: string;
  aggregatetype: string;
  aggregateid: string;
  type: string;
  topic: string | null;
  attempts: number;
  last_error: string | null;
  parked_at: Date;
  created_at: Date;
}

export function listParked(sql: Sql, table: TableName, limit = 100): Promise<ParkedRow[]> {
  return sql.unsafe<ParkedRow[]>(q.parkedListSql(qualified(table)), [limit]);
}

/** ids = null: every parked row. Returns the ids put back to pending. */
export async function retryParked(sql: Sql, table: TableName, ids: string[] | null): Promise<string[]> {
  const rows = await sql.unsafe<{ id: string }[]>(q.parkedRetrySql(qualified(table)), [ids]);
  return rows.map((r) => r.id);
}

export async function skipParked(sql: Sql, table: TableName, ids: string[]): Promise<string[]> {
  const rows = await sql.unsafe<{ id: string }[]>(q.parkedSkipSql(qualified(table)), [ids]);
  return rows.map((r) => r.id);
}
