// Identifiers cannot be bound as query parameters: a configured name is accepted only as a plain
// (optionally schema-qualified) identifier and always emitted double-quoted.
import type { TableName } from '../domain.ts';

export { parseTableName, type TableName } from '../domain.ts';

export function quoteIdent(ident: string): string {
  return `"${ident.replaceAll('"', '""')}"`;
}

export function qualified(t: TableName): string {
  return t.schema ? `${quoteIdent(t.schema)}.${quoteIdent(t.name)}` : quoteIdent(t.name);
}

export function derivedName(t: TableName, suffix: string): string {
  return quoteIdent(`${t.name.slice(0, 63 - suffix.length - 1)}_${suffix}`);
}

// A schema-wide object (a trigger function): two long outbox names must never share one.
export function derivedUniqueName(t: TableName, suffix: string): string {
  return quoteIdent(withSuffix(t.name, suffix, 63 - suffix.length - 10));
}

export function sentTable(t: TableName): TableName {
  return { schema: t.schema, name: withSuffix(t.name, 'sent', 45) };
}

/** Exactly-once delivery's leases (migrations/002_lanes.sql). */
export function lanesTable(t: TableName): TableName {
  return { schema: t.schema, name: withSuffix(t.name, 'lanes', 44) };
}

// identifiers are at most 63 bytes: a hash of the whole keeps two long names apart
function withSuffix(name: string, suffix: string, keep: number): string {
  const full = `${name}_${suffix}`;
  return full.length <= 63 ? full : `${name.slice(0, keep)}_${fnv1a(name)}_${suffix}`;
}

function fnv1a(s: string): string {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(s)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h.toString(16).padStart(8, '0');
}

export function displayName(t: TableName): string {
  return t.schema ? `${t.schema}.${t.name}` : t.name;
}

export function notifyChannel(t: TableName): string {
  const full = `outbox:${displayName(t)}`;
  if (Buffer.byteLength(full) <= 63) return full;
  return `${full.slice(0, 54)}#${fnv1a(full)}`;
}

export function quoteLiteral(s: string): string {
  return `'${s.replaceAll("'", "''")}'`;
}
