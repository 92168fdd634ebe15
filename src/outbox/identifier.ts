// Table names come from configuration, and identifiers cannot be bound as query parameters.
// So a name is accepted only if it is a plain (optionally schema-qualified) identifier (the
// domain's parseTableName, handed on here for the database side), and it is always emitted
// double-quoted. Nothing else from the environment ever reaches SQL text.
import type { TableName } from '../domain.ts';

export { parseTableName, type TableName } from '../domain.ts';

export function quoteIdent(ident: string): string {
  return `"${ident.replaceAll('"', '""')}"`;
}

/** "schema"."name" or "name" */
export function qualified(t: TableName): string {
  return t.schema ? `${quoteIdent(t.schema)}.${quoteIdent(t.name)}` : quoteIdent(t.name);
}

/** a derived object name (index, constraint), quoted; truncated so it stays within 63 bytes */
export function derivedName(t: TableName, suffix: string): string {
  return quoteIdent(`${t.name.slice(0, 63 - suffix.length - 1)}_${suffix}`);
}

/**
 * A schema-wide object's name for this table (a trigger function): as derivedName(), but a name too
 * long keeps a hash of the whole table name, so two long outbox names never share the object (a
 * function of one table's overwritten by the other's).
 */
export function derivedUniqueName(t: TableName, suffix: string): string {
  return quoteIdent(withSuffix(t.name, suffix, 63 - suffix.length - 10));
}

/**
 * The table that keeps sent rows in `keep` mode (the sent table): the outbox table's name with
 * `_sent`, in the same schema. A name too long for that keeps its first 45 characters and a hash
 * of the whole, so two long outbox names never share a sent table.
 */
export function sentTable(t: TableName): TableName {
  return { schema: t.schema, name: withSuffix(t.name, 'sent', 45) };
}

/** `name_suffix`, or, when that passes 63 characters, the first `keep` of name, its hash and the suffix */
function withSuffix(name: string, suffix: string, keep: number): string {
  const full = `${name}_${suffix}`;
  return full.length <= 63 ? full : `${name.slice(0, keep)}_${fnv1a(name)}_${suffix}`;
}

/** FNV-1a, 32 bits, as 8 hex digits: a short stable hash for truncated names */
function fnv1a(s: string): string {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(s)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h.toString(16).padStart(8, '0');
}

export function displayName(t: TableName): string {
  return t.schema ? `${t.schema}.${t.name}` : t.name;
}

/**
 * The LISTEN/NOTIFY channel of a table's inserts (the insert trigger, linger mode): "outbox:" and the
 * table's name as configured. Channel names are identifiers, at most 63 bytes: a longer one keeps
 * its first 54 characters and a hash of the whole, so two long names never share a channel.
 */
export function notifyChannel(t: TableName): string {
  const full = `outbox:${displayName(t)}`;
  if (Buffer.byteLength(full) <= 63) return full;
  return `${full.slice(0, 54)}#${fnv1a(full)}`;
}

export function quoteLiteral(s: string): string {
  return `'${s.replaceAll("'", "''")}'`;
}
