// The compat bench's comparer (pure): the relay's messages and Debezium's for the same rows,
// matched by row id, compared field by field (topic, partition, key bytes, value bytes, each
// header's bytes) and in their order per key; differences grouped by kind, one example each.
// bench/compat.ts reads the messages from Kafka and prints the table.

export interface CompatMessage {
  /** the row's id (its `id` header, decoded): what matches a relay message with Debezium's */
  rowId: string;
  /** the topic without its side's prefix */
  topic: string;
  partition: number;
  /** the position on its partition: the order per key */
  offset: number;
  key: Buffer | null;
  value: Buffer | null;
  headers: ReadonlyArray<readonly [string, Buffer | null]>;
}

export interface Difference {
  kind: string;
  rowId: string;
  detail: string;
}

/** A difference docs name as deliberate: kinds matching `kind` are listed, and do not fail the bench. */
export interface Deliberate {
  kind: RegExp;
  why: string;
}

export interface DifferenceGroup {
  kind: string;
  count: number;
  example: Difference;
  deliberate?: string;
}

const show = (b: Buffer | null, max = 60): string => {
  if (b === null) return 'null';
  const text = JSON.stringify(b.toString('utf8'));
  return text.length > max ? `${text.slice(0, max)}…(${b.length} bytes)` : text;
};

/** Where two values first differ: the byte offset, and the text around it on each side. */
function firstDifference(a: Buffer, b: Buffer, peerName: string): string {
  let at = 0;
  while (at < a.length && at < b.length && a[at] === b[at]) at++;
  const around = (x: Buffer) => show(x.subarray(Math.max(0, at - 12), at + 28), 80);
  return `from byte ${at}: relay ${around(a)}, ${peerName} ${around(b)} (${a.length} and ${b.length} bytes)`;
}

const same = (a: Buffer | null, b: Buffer | null): boolean => (a === null || b === null ? a === b : a.equals(b));

/** Every difference between the two sides' messages: `relay` and `peer` in the order they were read. */
export function compareMessages(relay: readonly CompatMessage[], peer: readonly CompatMessage[], peerName = 'debezium'): Difference[] {
  const diffs: Difference[] = [];
  const index = (side: readonly CompatMessage[], name: string) => {
    const byId = new Map<string, CompatMessage>();
    for (const m of side) {
      if (byId.has(m.rowId)) diffs.push({ kind: `duplicate in ${name}`, rowId: m.rowId, detail: `offsets ${byId.get(m.rowId)!.offset} and ${m.offset}` });
      else byId.set(m.rowId, m);
    }
    return byId;
  };
  const ours = index(relay, 'relay');
  const theirs = index(peer, peerName);
  for (const [id, m] of ours) if (!theirs.has(id)) diffs.push({ kind: `missing in ${peerName}`, rowId: id, detail: `relay: ${m.topic}/${m.partition}` });
  for (const [id, m] of theirs) if (!ours.has(id)) diffs.push({ kind: 'missing in relay', rowId: id, detail: `${peerName}: ${m.topic}/${m.partition}` });
  for (const [id, a] of ours) {
    const b = theirs.get(id);
    if (b) diffs.push(...compareOne(a, b, peerName));
  }
  diffs.push(...compareOrder(relay, peer, new Set([...ours.keys()].filter((id) => theirs.has(id))), peerName));
  return diffs;
}

function compareOne(a: CompatMessage, b: CompatMessage, peerName: string): Difference[] {
  const diffs: Difference[] = [];
  const diff = (kind: string, detail: string) => diffs.push({ kind, rowId: a.rowId, detail });
  if (a.topic !== b.topic) diff('topic', `relay ${a.topic}, ${peerName} ${b.topic}`);
  if (a.partition !== b.partition) diff('partition', `relay ${a.partition}, ${peerName} ${b.partition}`);
  if (!same(a.key, b.key)) diff('key bytes', `relay ${show(a.key)}, ${peerName} ${show(b.key)}`);
  if (!same(a.value, b.value)) diff('value bytes', a.value && b.value ? firstDifference(a.value, b.value, peerName) : `relay ${show(a.value)}, ${peerName} ${show(b.value)}`);
  const theirs = new Map(b.headers);
  const ours = new Map(a.headers);
  for (const [name, v] of ours) {
    if (!theirs.has(name)) diff(`header ${JSON.stringify(name)} only in relay`, `${name}: ${show(v)}`);
    else if (!same(v, theirs.get(name)!)) diff(`header ${JSON.stringify(name)} bytes`, `relay ${show(v)}, ${peerName} ${show(theirs.get(name)!)}`);
  }
  // a header with a null value (Kafka allows one) is its own kind: a consumer may read it as absent
  for (const [name, v] of theirs) if (!ours.has(name)) diff(`header ${JSON.stringify(name)}${v === null ? ' with a null value' : ''} only in ${peerName}`, `${name}: ${show(v)}`);
  for (const side of [a, b]) {
    const names = side.headers.map(([n]) => n);
    const twice = names.find((n, i) => names.indexOf(n) !== i);
    if (twice !== undefined) diff(`header ${JSON.stringify(twice)} twice in ${side === a ? 'relay' : peerName}`, names.join(', '));
  }
  return diffs;
}

/**
 * Per key (and topic), the rows both sides have, in the order each side's partition holds them:
 * one difference per key whose order differs.
 */
function compareOrder(relay: readonly CompatMessage[], peer: readonly CompatMessage[], common: Set<string>, peerName: string): Difference[] {
  const sequences = (side: readonly CompatMessage[]) => {
    const byKey = new Map<string, string[]>();
    const sorted = [...side].filter((m) => common.has(m.rowId)).sort((x, y) => x.offset - y.offset);
    for (const m of sorted) {
      const k = `${m.topic}\u0000${m.key === null ? '\u0000null' : m.key.toString('latin1')}`;
      byKey.set(k, [...(byKey.get(k) ?? []), m.rowId]);
    }
    return byKey;
  };
  const ours = sequences(relay);
  const theirs = sequences(peer);
  const diffs: Difference[] = [];
  for (const [k, ids] of ours) {
    const other = theirs.get(k);
    // a row under another key or topic is reported as such; the order compares what both put here
    const here = new Set(other ?? []);
    const a = ids.filter((id) => here.has(id));
    const b = (other ?? []).filter((id) => ids.includes(id));
    const at = a.findIndex((id, i) => id !== b[i]);
    if (at >= 0) {
      const key = k.slice(k.indexOf('\u0000') + 1);
      diffs.push({ kind: 'order per key', rowId: a[at]!, detail: `key ${JSON.stringify(key)}: relay has row ${a[at]} at position ${at}, ${peerName} ${b[at]}` });
    }
  }
  return diffs;
}

/** The differences grouped by kind (most frequent first), each with one example and, if deliberate, why. */
export function groupDifferences(diffs: readonly Difference[], deliberate: readonly Deliberate[] = []): DifferenceGroup[] {
  const groups = new Map<string, DifferenceGroup>();
  for (const d of diffs) {
    const g = groups.get(d.kind);
    if (g) g.count++;
    else groups.set(d.kind, { kind: d.kind, count: 1, example: d, deliberate: deliberate.find((x) => x.kind.test(d.kind))?.why });
  }
  return [...groups.values()].sort((x, y) => y.count - x.count || x.kind.localeCompare(y.kind));
}

/** The table the bench prints: one line per kind; `(none)` when the two sides agree on every byte. */
export function differenceTable(groups: readonly DifferenceGroup[]): string {
  if (groups.length === 0) return '| difference | count | example |\n|---|---|---|\n| (none) | 0 | |';
  const cell = (s: string) => s.replaceAll('|', '\\|');
  const lines = groups.map((g) => `| ${cell(g.kind)}${g.deliberate ? ` (deliberate: ${cell(g.deliberate)})` : ''} | ${g.count} | row ${g.example.rowId}: ${cell(g.example.detail)} |`);
  return ['| difference | count | example |', '|---|---|---|', ...lines].join('\n');
}

/** The groups that are not deliberate: any fails the bench. */
export function undocumented(groups: readonly DifferenceGroup[]): DifferenceGroup[] {
  return groups.filter((g) => g.deliberate === undefined);
}
