// The side-by-side table of the relay and its Debezium peer, and the goals next to the
// measured values (met or not): P3 relay events/s ≥ Debezium's backlog rate in keep mode and
// ≥ 1.3× in delete mode; efficiency: the relay's total CPU per event ≤ Debezium's.
import type { CpuSample } from '../cpu.ts';
import type { PeerCleanup, PeerCpu } from './peer.ts';

interface Measured {
  name: string;
  events: number;
  ms: number;
  perSec: number;
  min?: number;
  max?: number;
  cpu?: CpuSample | PeerCpu;
  fromResume?: Measured;
  walBytes?: number;
  cleanup?: PeerCleanup;
}

/** CPU ms per 1,000 events of each party, and their total */
interface Parties {
  app: number;
  postgres: number;
  walsender?: number;
  broker: number;
  total: number;
}

function parties(r: Measured): Parties | undefined {
  if (!r.cpu) return undefined;
  const per = (s: number) => (s * 1e6) / r.events;
  if ('connect' in r.cpu) {
    const c = r.cpu;
    // the bench's own Node (polling the offsets) is the harness, not Debezium: not counted
    return { app: per(c.connect), postgres: per(c.postgres), walsender: per(c.walsender), broker: per(c.broker), total: per(c.connect + c.postgres + c.walsender + c.broker) };
  }
  const c = r.cpu;
  return { app: per(c.node), postgres: per(c.postgres), broker: per(c.broker), total: per(c.node + c.postgres + c.broker) };
}

const n = (x: number) => Math.round(x).toLocaleString('en-US');
const verdict = (ok: boolean) => (ok ? 'met' : 'NOT met');

export function peerReport([relay, relayDelete, debezium]: [Measured | undefined, Measured | undefined, Measured | undefined], repeat: number): { text: string; json: Record<string, unknown> } {
  const lines: string[] = [];
  const json: Record<string, unknown> = {};
  lines.push('');
  lines.push(`relay and Debezium side by side (median of ${repeat}; CPU in ms per 1,000 events, from /proc)`);
  lines.push(`${'measurement'.padEnd(52)}${'events/s'.padStart(9)}   ${'range'.padEnd(13)}${'app'.padStart(5)}${'pg'.padStart(6)}${'walsnd'.padStart(8)}${'broker'.padStart(8)}${'total'.padStart(7)}${'WAL B/event'.padStart(13)}`);
  const wal = (bytes: number | undefined, events: number) => (bytes === undefined ? '' : n(bytes / events).padStart(13));
  const row = (label: string, r: Measured | undefined) => {
    if (!r) return;
    const p = parties(r);
    const cpu = p ? `${n(p.app).padStart(5)}${n(p.postgres).padStart(6)}${(p.walsender === undefined ? '-' : n(p.walsender)).padStart(8)}${n(p.broker).padStart(8)}${n(p.total).padStart(7)}` : '';
    const range = r.min === undefined || r.max === undefined ? '' : `${n(r.min)}-${n(r.max)}`;
    lines.push(`${label.padEnd(52)}${n(r.perSec).padStart(9)}   ${range.padEnd(13)}${cpu}${p ? wal(r.walBytes, r.events) : ''}`);
  };
  row('relay, one invocation, keep', relay);
  row('relay, one invocation, delete', relayDelete);
  row('Debezium backlog, from its first message', debezium);
  row('  the same (median) run, from the resume', debezium?.fromResume);
  const c = debezium?.cleanup;
  if (c) {
    const per = (x: number) => n((x * 1e6) / c.events);
    lines.push(`${"  + its cleanup: a job's DELETE and VACUUM".padEnd(52)}${''.padStart(9)}   ${''.padEnd(13)}${per(c.connect).padStart(5)}${per(c.postgres).padStart(6)}${per(c.walsender).padStart(8)}${'-'.padStart(8)}${per(c.connect + c.postgres + c.walsender).padStart(7)}${wal(c.walBytes, c.events)}`);
  }
  lines.push('app: the relay\'s Node process, or the Connect JVM; pg: Postgres backends (the relay\'s; for');
  lines.push('Debezium all but its walsender: its JDBC connection, the bench\'s own queries); walsnd: the');
  lines.push('walsender decoding the WAL for Debezium\'s slot (pgoutput). WAL: the server\'s, during the');
  lines.push('measurement. Debezium\'s cleanup: the rows it relayed pruned by one DELETE, then VACUUM, until');
  lines.push('its walsender has sent past them (its outbox docs: delete after insert, or prune by a job).');
  if (!debezium) return { text: lines.join('\n'), json };
  const dbz = parties(debezium);
  json.debeziumEventsPerSec = debezium.perSec;
  if (dbz) json.debeziumCpuMsPer1k = { connect: round(dbz.app), walsender: round(dbz.walsender!), postgres: round(dbz.postgres), broker: round(dbz.broker), total: round(dbz.total) };
  lines.push('goals (issues 13 and 28):');
  if (relay) {
    const x = relay.perSec / debezium.perSec;
    json.p3Keep = Number(x.toFixed(3));
    lines.push(`  P3, keep:    relay ${n(relay.perSec)} ≥ Debezium ${n(debezium.perSec)} events/s                 ${x.toFixed(2)}×   ${verdict(x >= 1)}`);
  } else lines.push('  P3, keep:    not measured (add relay to --only)');
  if (relayDelete) {
    const x = relayDelete.perSec / debezium.perSec;
    json.p3Delete = Number(x.toFixed(3));
    lines.push(`  P3, delete:  relay ${n(relayDelete.perSec)} ≥ 1.3 × Debezium = ${n(1.3 * debezium.perSec)} events/s      ${x.toFixed(2)}×   ${verdict(x >= 1.3)}`);
  } else lines.push('  P3, delete:  not measured (add relayDelete to --only)');
  const rk = relay && parties(relay);
  if (rk && dbz) {
    json.relayCpuMsPer1k = round(rk.total);
    lines.push(`  efficiency:  relay (keep) ${n(rk.total)} ≤ Debezium ${n(dbz.total)} ms of CPU per 1,000 events           ${verdict(rk.total <= dbz.total)}`);
    const rd = relayDelete && parties(relayDelete);
    if (rd) lines.push(`               (relay, delete: ${n(rd.total)}, ${verdict(rd.total <= dbz.total)})`);
  }
  // issue 28: the relay's Postgres CPU per event at most what Debezium's costs Postgres for the same
  // work: its walsender while streaming, and the cleanup (DELETE, VACUUM, the walsender decoding it)
  if (dbz && c) {
    const dbzPg = dbz.walsender! + ((c.postgres + c.walsender) * 1e6) / c.events;
    json.debeziumPostgresCpuMsPer1k = round(dbzPg);
    json.debeziumWalBytesPerEvent = Math.round(c.walBytes / c.events + (debezium.walBytes ?? 0) / debezium.events);
    for (const [label, r] of [['keep', relay], ['delete', relayDelete]] as const) {
      const p = r && parties(r);
      if (!p) continue;
      json[`relayPostgresCpuMsPer1k_${label}`] = round(p.postgres);
      if (r.walBytes !== undefined) json[`relayWalBytesPerEvent_${label}`] = Math.round(r.walBytes / r.events);
      lines.push(`  database:    relay (${label}) Postgres ${n(p.postgres)} ≤ Debezium's walsender + cleanup ${n(dbzPg)} ms of CPU per 1,000 events   ${(p.postgres / dbzPg).toFixed(2)}×   ${verdict(p.postgres <= dbzPg)}`);
    }
  }
  lines.push('  The broker is shared: anything else producing to it while the bench runs shows in its column.');
  return { text: lines.join('\n'), json };
}

const round = (x: number) => Math.round(x * 10) / 10;
